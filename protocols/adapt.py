"""Which layout a reader asks each screen it reads to show its frames to it in, while the run goes.

Start-up chooses one layout of the ladder for the room (protocols.discovery). Then every reader keeps its
own choice per sender (`LayoutAdapter`), the way Wi-Fi rate control keeps one per link (Minstrel): from what
its camera made of the sender's screen, capture by capture (`outcome`: the sender's code was read, or found
and not read in any layout tried; an idle screen judges nothing). It asks for the next more robust layout of
the ladder when reads fall (under DOWN_BELOW of the captures over the last WINDOW_S, or under 60 % of the
share its first window read where that is lower, once SETTLE_S has passed since its last ask: the sender
needs that long to hear the ask and switch), and for the next denser one that carries more (`rates`) when
reads have been good (at least UP_ABOVE) for `up_after` seconds; a denser layout that then reads under
TRY_BELOW within PROBE_S is asked back down and not tried again for twice as long (up to UP_AFTER_MAX_S). A
screen the camera does not find at all (a hand over it, the screen out of view) changes nothing: no layout
reads a screen that is not there. A screen captured again after LOST_S without a capture of it (a lid turned
away and back), or read again after LOST_S without a read, not just after an ask (a screen partly out of
view put back): what fell on the way is no measure of the room now, so it is asked for the last layout it
read well in, on the whole screen, at once, and captures of a screen coming back into view judge nothing
for SETTLE_S. The asks travel in every frame this reader shows (protocols.transfer `asks`), and the sender
shows what each reader needs in the most robust layout any of its readers asked for
(actors/screen_writer.py); a reader tries the layout it last read a screen in first, then the one it asked
for, so a change needs no agreement on when it takes effect.

A screen partly out of the camera's view (a lid nudged, a laptop turned: its code runs out of the image on
one side) is read in no layout of the ladder, however robust: its outline is cut. The reader then asks for its
layout drawn on the part of the screen in view (`part`: protocols.layout.PARTS, the largest share that fits
what it sees, against the side in view), and for the whole screen again once that part is read with room for
the whole grid beside it. An ask is one byte: the ladder layout in its low bits, the part above (`ask`).

Pure: no clocks (times are passed in), no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW_S = 1.5  # the captures of a sender's screen that judge its layout: the latest this many seconds
MIN_OUTCOMES = 8  # fewer captures in the window judge nothing
DOWN_BELOW = 0.6  # read in fewer than this share of the window's captures: ask the next more robust layout
UP_ABOVE = 0.85  # read in at least this share since the last ask for `up_after` seconds: ask the next denser
# A denser layout on trial must read at least this share to stay: one that reads a capture in two carries
# less than the layout before it (fewer frames whole, each transfer waiting for repairs)
TRY_BELOW = 0.75
SETTLE_S = 1.0  # after an ask, the window judges only captures from this long on (the sender switches)
UP_AFTER_S = 10.0  # good reads this long before the first try of a denser layout
UP_AFTER_MAX_S = 120.0  # the longest a sender's denser layout waits for another try
PROBE_S = 15.0  # a denser layout that reads badly this soon after it was asked for failed its try
LOST_S = 1.0  # a screen not captured (or not read) this long, then again, gets its last good layout
PART_SHIFT = 3  # an ask byte: the ladder layout (up to 8) in its low bits, the part of the screen above


def ask(layout: int, part: int = 0) -> int:
    """An ask's byte: ladder layout `layout` drawn on part `part` of the screen (protocols.layout.PARTS)."""
    return layout | part << PART_SHIFT


def split(code: int) -> tuple[int, int]:
    """An ask's byte -> (ladder layout, part of the screen)."""
    return code & (1 << PART_SHIFT) - 1, code >> PART_SHIFT


def shared(asks: list[int], default: int) -> int:
    """The ask a screen's frames for several readers meet (`asks`, in the readers' order; `default` when
    empty): the most robust layout any asked for, on the part of the screen the first that asks for a part
    asked for (a camera that sees the whole screen reads any part of it)."""
    parts = [split(a) for a in asks]
    return ask(max((k for k, _ in parts), default=default), next((p for _, p in parts if p), 0))


@dataclass(frozen=True)
class Change:
    """A reader asks `sender` for `layout` (was `was`), its screen read in `share` of the window's
    captures; `why`: "worse" (reads fell), "better" (good for a while), "back" (a denser try failed)."""

    sender: int
    layout: int
    was: int
    share: float
    why: str  # (and "found again": back in view after LOST_S, asked for its last good layout; "part in view":
    # drawn on part of the screen, `part`, from `was_part`, the rest being out of view, or the whole again)
    part: int = 0
    was_part: int = 0


@dataclass
class _Sender:
    asked: int
    since: float
    best: int  # the densest layout this reader may ask of the sender (start-up read it there)
    outcomes: deque = field(default_factory=deque)  # (time, read) of its screen's captures since the last ask
    base: float | None = None  # the share its first full window read (what this room gives that layout)
    up_after: float = UP_AFTER_S
    trying: int | None = None  # the layout a try of a denser one came from, until it holds PROBE_S
    good: int | None = None  # the last layout asked whose window read at least TRY_BELOW (at first: the start's)
    last_seen: float | None = None  # the latest capture of its screen
    last_read: float | None = None  # the latest capture of its screen that read
    back_at: float = -1e9  # when its screen was last captured again after LOST_S without
    found_again: bool = False  # captured, or read, again after LOST_S without (not after an ask)
    part: int = 0  # the part of the screen its layout is asked on (protocols.layout.PARTS; 0: the whole)
    wants_part: int | None = None  # a part to ask for at the next decision

    def share(self, now: float) -> tuple[int, float]:
        while self.outcomes and self.outcomes[0][0] < now - WINDOW_S:
            self.outcomes.popleft()
        n = len(self.outcomes)
        return n, (sum(ok for _, ok in self.outcomes) / n if n else 1.0)


class LayoutAdapter:
    """One reader's asks: per sender, the layout (an index into the ladder of `layouts`, densest first)."""

    def __init__(self, layouts: int, rates: tuple[float, ...] | None = None) -> None:
        """`rates`: what each layout carries (bytes a second of frames read whole; default: each more than the
        next). A denser layout is asked for only where it carries more: in a big room's frames, whose entries
        take much of a small frame, a layout of finer cells held longer can carry less than the one after it."""
        self.layouts = layouts
        self.rates = tuple(rates) if rates is not None else tuple(float(layouts - k) for k in range(layouts))
        if len(self.rates) != layouts:
            raise ValueError(f"{len(self.rates)} rates for a ladder of {layouts}")
        self._senders: dict[int, _Sender] = {}

    def _denser(self, k: int) -> int | None:
        """The next layout before k in the ladder that carries more than k (None: none)."""
        return next((j for j in range(k - 1, -1, -1) if self.rates[j] > self.rates[k]), None)

    def start(self, sender: int, layout: int, now: float, best: int | None = None) -> None:
        """Ask `sender` for `layout` from `now` on (the room's, at start-up); `best`: the densest this reader
        may ever ask of it (default: any)."""
        if not 0 <= layout < self.layouts:
            raise ValueError(f"layout {layout} not in a ladder of {self.layouts}")
        self._senders[sender] = _Sender(layout, now, min(layout, 0 if best is None else best), good=layout)

    def asked(self, sender: int) -> int | None:
        """What this reader asks `sender` for (an ask's byte: layout and part), None if nothing."""
        s = self._senders.get(sender)
        return None if s is None else ask(s.asked, s.part)

    def asks(self, world: int, none: int) -> tuple[int, ...]:
        """Each rank's ask (its byte), `none` for a rank not asked."""
        return tuple(ask(self._senders[r].asked, self._senders[r].part) if r in self._senders else none
                     for r in range(world))

    def unread_for(self, sender: int, now: float) -> float:
        """How long `sender`'s screen has gone unread (0 for a sender not asked, or never read)."""
        s = self._senders.get(sender)
        return 0.0 if s is None or s.last_read is None else now - s.last_read

    def in_view(self, sender: int, part: int) -> None:
        """The reader sees that `sender`'s grid fits its view only on part `part` of the screen (0: the whole
        fits again): asked at the next decision, if it is not what is asked."""
        s = self._senders.get(sender)
        if s is not None:
            s.wants_part = None if part == s.part else part

    def outcome(self, sender: int, read: bool | None, now: float) -> None:
        """One capture of `sender`'s screen: its code read (a frame or a repeat), found and not read, or
        (None) an idle screen: in view and read as one, but no measure of whether its frames read (a layout
        that reads none of them would otherwise be judged by the captures between its transfers)."""
        s = self._senders.get(sender)
        if s is None:
            return
        if s.last_seen is not None and now - s.last_seen >= LOST_S:
            s.found_again, s.back_at = True, now
            s.outcomes.clear()
        s.last_seen = now
        if read is not False:
            if s.last_read is not None and now - s.last_read >= LOST_S and now - s.since >= SETTLE_S + LOST_S:
                s.found_again = True
            s.last_read = now
        if read is not None and now >= max(s.since, s.back_at) + SETTLE_S:
            s.outcomes.append((now, read))

    def decide(self, now: float) -> list[Change]:
        """The asks that change now."""
        out = []
        for sender, s in self._senders.items():
            if s.wants_part is not None:
                change = Change(sender, s.asked, s.asked, s.share(now)[1], "part in view", s.wants_part, s.part)
                s.part, s.wants_part = s.wants_part, None
                s.since, s.trying = now, None
                s.outcomes.clear()
                out.append(change)
                continue
            if s.found_again:
                s.found_again = False
                if s.good is not None and s.good < s.asked or s.part:
                    # (and on the whole screen: the reader asks for a part again if it still sees only one)
                    s.trying = None
                    out.append(self._ask(sender, s, min(s.asked, s.good if s.good is not None else s.asked),
                                         s.share(now)[1], "found again", now, part=0))
                    continue
            n, share = s.share(now)
            if n < MIN_OUTCOMES:
                continue
            full = now - s.outcomes[0][0] >= WINDOW_S * 0.9
            if s.base is None and full:
                s.base = share
            if share >= TRY_BELOW and full:
                s.good = s.asked
            trial = s.trying is not None and now - s.since <= SETTLE_S + PROBE_S
            # (a room whose cameras read this screen in fewer captures from the start, a slow or harsh one,
            # falls from where it was: under 60 % of its first share, or DOWN_BELOW, whichever is lower)
            down = min(DOWN_BELOW, 0.6 * (s.base if s.base is not None else 1.0))
            if (share < down or trial and share < TRY_BELOW) and s.asked < self.layouts - 1:
                back = trial
                if back:
                    s.up_after = min(UP_AFTER_MAX_S, s.up_after * 2)
                out.append(self._ask(sender, s, (s.trying if back else s.asked + 1), share, "back" if back else "worse",
                                     now))
            elif (share >= UP_ABOVE and (denser := self._denser(s.asked)) is not None and denser >= s.best
                  and now - s.since >= SETTLE_S + s.up_after and now - s.outcomes[0][0] >= WINDOW_S * 0.9):
                came = s.asked
                out.append(self._ask(sender, s, denser, share, "better", now))
                s.trying = came
            elif s.trying is not None and now - s.since > SETTLE_S + PROBE_S:
                s.trying = None  # the denser layout held
        return out

    def _ask(self, sender: int, s: _Sender, layout: int, share: float, why: str, now: float,
             part: int | None = None) -> Change:
        part = s.part if part is None else part
        change = Change(sender, layout, s.asked, share, why, part, s.part)
        s.asked, s.since, s.part = layout, now, part
        s.outcomes.clear()
        if why != "better":
            s.trying = None
        return change


__all__ = ["LayoutAdapter", "Change", "ask", "split", "shared", "WINDOW_S", "DOWN_BELOW", "UP_ABOVE", "TRY_BELOW", "SETTLE_S", "UP_AFTER_S",
           "PROBE_S", "LOST_S"]
