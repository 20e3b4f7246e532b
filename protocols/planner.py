"""Screen time: which transfer a node shows in its next frame.

Consumes: the transfers a node has to show (their number, the ranks that
must read them, how many packets rebuild them), the acknowledgements its
peers show back, and how many frames the cameras lose. Emits: for each frame
slot, which transfer and which of its packets goes up (or nothing).

Collectives are booked on demand: a transfer is booked when its collective is
issued, with a budget of `ceil(K / (1 - loss)) + margin` frames (K source
packets; `loss` the share of frames the cameras lost, measured from how many
frames earlier transfers took until they were acknowledged). Transfers are
shown each up to its budget, the one whose bytes still go farthest beyond its
readers first (`priority`: a part a tree relays to ranks that relay it on
before one whose readers are its last), the oldest first among equals; a transfer that used its budget
and is still unacknowledged a few slots later (the acknowledgement's usual
delay) gets a fresh repair packet, taking turns with the oldest transfer not
yet shown in full; once every transfer has used its budget, the ones still
unacknowledged take turns with fresh repair packets until their readers
acknowledge them, or until their collective is void (`void`: the group
regrouped, and every rank drops it). A reader whose frames this node's camera does not read
acknowledges a collective's parts by holding the collective: its holdings
travel camera to camera (`held`). So a small tensor goes up at once
(its first frame in the next slot), a large one streams at the link's full
rate, and a lost frame costs one more frame, not a missed schedule.

A background transfer (a training-state snapshot) goes by the same rules but
only in the slots no other transfer wants, and at least one slot in
`BACKGROUND_EVERY` while others keep the screen busy: a large snapshot fills
the screen's idle time between the steps' words instead of holding them back.

A transfer that nodes overhear (an observer reads the parameter server's
words, acknowledging nothing) may *linger*: once its readers have it, it is
shown `linger` frames more (fresh repair packets; the transfer shown the
fewest times per packet first, the oldest of those: an observer applies the
words in order, so each word's second chance comes soon), when the screen
would otherwise be idle (`next_lingering`) and, while every open transfer has used
its budget and waits for its acknowledgements, taking turns with their
repair packets: a screen kept busy by acknowledgements on their way still
gives observers a second chance. A transfer for no rank (`dest` 0: shown for
observers only) is had once its source packets have each gone up once, in
its turn like any other; then it lingers.

Pure: no clocks, no I/O. The ScreenWriter (actors/screen_writer.py) asks
`next()` once per frame slot, every `hold_s` on its clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from protocols.transfer import Ack

ACK_LATENCY_FRAMES = 2  # frames a transfer is typically shown after its reader has it, until the ack is seen
BACKGROUND_EVERY = 8  # a waiting background transfer gets at least one frame slot in this many


@dataclass
class Booking:
    tid: int
    dest: int  # bitmask of the ranks that must acknowledge it
    source: int  # K: packets that rebuild it
    budget: int  # frames booked for it
    shown: int = 0
    acked: int = 0  # bitmask of the ranks that acknowledged it
    last_slot: int = 0  # the frame slot it was last shown in (booked in, until shown)
    background: bool = False  # shown only in slots the others leave (and one in BACKGROUND_EVERY)
    collective: int = -1  # the collective (its seq) whose part it is; -1: not a collective's
    linger: int = 0  # frames still to show once its readers have it, for nodes that overhear it
    priority: int = 0  # hops its bytes still go beyond its readers: of the transfers not shown in full, the most first

    @property
    def done(self) -> bool:
        if not self.dest:  # for nodes that overhear it only: had once shown in full
            return self.shown >= self.source
        return self.acked & self.dest == self.dest


@dataclass
class ScreenPlan:
    """One node's screen: its booked transfers, in the order they were booked."""

    loss: float = 0.1  # share of frames lost on the way (estimate; updated from acknowledgements)
    margin: int = 1  # spare frames booked per transfer
    alpha: float = 0.25  # weight of a new loss sample
    bookings: list[Booking] = field(default_factory=list)
    repair_after: int = ACK_LATENCY_FRAMES + 2  # frame slots an unacknowledged transfer waits for a repair
    _turn: int = 0
    _repair_turn: bool = False
    _last_tid: int = 0
    _slot: int = 0
    lingered: list[int] = field(default_factory=list)  # transfers done lingering since the caller last took them

    def book(self, tid: int, dest: int, source: int, background: bool = False, collective: int = -1,
             linger: int = 0, priority: int = 0) -> Booking:
        """Book a transfer of `source` packets for the ranks in `dest` (`background`: behind every other
        transfer; `collective`: the seq of the collective it is part of; `linger`: frames to show once they
        have it; with `dest` 0, for nodes that overhear it only: once shown in full; `priority`: the hops
        its bytes still go beyond `dest`, the most shown first). Returns its booking."""
        if dest < 0 or dest == 0 and linger <= 0:
            raise ValueError("a transfer needs at least one reader (a rank, or nodes that overhear it: `linger`)")
        if tid <= self._last_tid:
            raise ValueError(f"transfer {tid} booked after {self._last_tid}")
        self._last_tid = tid
        b = Booking(tid, dest, source, self._budget(source), last_slot=self._slot, background=background, collective=collective,
                    linger=max(0, linger), priority=priority)
        self.bookings.append(b)
        return b

    def recut(self, tid: int, source: int) -> None:
        """Transfer `tid` was cut again into `source` packets (its frames' layout changed): shown from its
        first packet, with a new budget."""
        for b in self.bookings:
            if b.tid == tid:
                b.source, b.shown, b.budget = source, 0, self._budget(source)
                return
        raise KeyError(f"transfer {tid} is not booked")

    def _budget(self, source: int) -> int:
        """The frames booked for a transfer of `source` packets: enough for the loss measured, and `margin`."""
        return math.ceil(source / max(0.05, 1.0 - self.loss)) + self.margin

    def next(self) -> tuple[int, int] | None:
        """(tid, packet index) of the next frame to show, or None when every transfer is acknowledged."""
        open_ = [b for b in self.bookings if not b.done]
        if not open_:
            return None
        self._slot += 1
        fore = [b for b in open_ if not b.background]
        back = [b for b in open_ if b.background]
        behind = back and (not fore or self._slot - max(b.last_slot for b in back) >= BACKGROUND_EVERY)
        b = self._pick(back if behind else fore)
        return self._linger(b) if b.done else self._show(b)

    def next_lingering(self) -> tuple[int, int] | None:
        """(tid, packet index) of a frame of a transfer that every reader has and that still lingers
        (`_lingerer`), or None; a transfer done lingering is forgotten (its tid put in `lingered`)."""
        b = self._lingerer()
        if b is None:
            return None
        self._slot += 1
        return self._linger(b)

    def _lingerer(self) -> Booking | None:
        """The lingering transfer shown the fewest times per source packet, the oldest of those: each new one
        gets its second chance before older ones get a third."""
        return min((b for b in self.bookings if b.done and b.linger > 0), key=lambda b: b.shown / b.source,
                   default=None)

    def _linger(self, b: Booking) -> tuple[int, int]:
        b.linger -= 1
        if b.linger == 0:
            self.bookings.remove(b)
            self.lingered.append(b.tid)
        return self._show(b)

    @property
    def lingering(self) -> bool:
        return any(b.done and b.linger > 0 for b in self.bookings)

    def _pick(self, open_: list[Booking]) -> Booking:
        # (the transfer not yet shown in full whose bytes go farthest, the oldest of those: `open_` is in
        # booking order)
        fresh = max((b for b in open_ if b.shown < b.budget), key=lambda b: b.priority, default=None)
        # Used its budget and still not acknowledged after the acknowledgement's usual delay: a fresh repair
        # packet now, before younger transfers go on (a small tensor queued behind a large one is never
        # starved of repairs) ...
        due = next((b for b in open_ if b.shown >= b.budget and self._slot - b.last_slot > self.repair_after), None)
        if due is not None and fresh is not None:
            # ... but taking turns with the next transfer not yet shown in full: transfers whose readers'
            # acknowledgements this camera cannot see (they come as holdings, `held`) never hold the rest up.
            self._repair_turn = not self._repair_turn
            return due if self._repair_turn else fresh
        if due is not None or fresh is not None:
            return due or fresh
        # Every booking used its budget: the unacknowledged ones take turns with fresh repair packets, and
        # with a lingering transfer (`_lingerer`; returned done: the caller lingers it).
        lingerer = self._lingerer()
        turns = open_ + ([lingerer] if lingerer is not None else [])
        self._turn = (self._turn + 1) % len(turns)
        return turns[self._turn]

    def _show(self, b: Booking) -> tuple[int, int]:
        b.shown += 1
        b.last_slot = self._slot
        return b.tid, b.shown - 1

    def acknowledge(self, rank: int, ack: Ack) -> list[Booking]:
        """Rank `rank` shows `ack`: returns the bookings this completes (and forgets those that do not
        linger)."""
        finished = self._had(rank, lambda b: ack.has(b.tid))
        for b in finished:
            self._learn(b)
        return finished

    def held(self, rank: int, count: int) -> list[Booking]:
        """Rank `rank` is known to hold every collective before `count` (its holdings, relayed camera to
        camera, reach cameras its acknowledgements do not): the parts of those collectives meant for it
        are had. Returns the bookings this completes (and forgets them)."""
        return self._had(rank, lambda b: 0 <= b.collective < count)

    def void(self, first_seq: int) -> list[Booking]:
        """The collectives before `first_seq` are void (the group regrouped: every rank voids them, so no
        reader wants their parts any more): forget their bookings, lingering or not, and return them."""
        gone = [b for b in self.bookings if 0 <= b.collective < first_seq]
        if gone:
            self.bookings = [b for b in self.bookings if not 0 <= b.collective < first_seq]
        return gone

    def _had(self, rank: int, has) -> list[Booking]:
        """Mark the bookings meant for `rank` that `has(booking)` says it has; forget and return those
        this completes."""
        bit = 1 << rank
        finished = []
        for b in self.bookings:
            if b.dest & bit and not b.acked & bit and has(b):
                b.acked |= bit
                if b.done:
                    finished.append(b)
        if finished:
            self.bookings = [b for b in self.bookings if not b.done or b.linger > 0]
        return finished

    def _learn(self, b: Booking) -> None:
        took = max(b.source, b.shown - ACK_LATENCY_FRAMES)
        sample = 1.0 - b.source / took
        self.loss = min(0.9, max(0.0, (1 - self.alpha) * self.loss + self.alpha * sample))

    @property
    def pending(self) -> int:
        return sum(1 for b in self.bookings if not b.done)
