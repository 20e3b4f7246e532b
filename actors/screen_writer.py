"""ScreenWriter: a node's screen: shows its transfers until they are acknowledged.

Consumes: `PostTransfer` (a tensor's bytes to show, with the collective it
belongs to and the ranks that must read it), `AcksChanged` (this node's own
acknowledgements, shown in every frame from then on), `PeerAcks` (what each
peer has rebuilt of this node's transfers), `HoldsKnown` (how many collectives
each rank is known to hold, shown in every frame: relayed; a rank that holds a
collective has its parts, whether or not this camera reads its acknowledgements),
`VoidCollectives` (the group regrouped: the parts of the collectives before
it leave the screen at once, since every rank voids them; a part still on
the screen would hold back the regroup's own transfers behind it).
Emits: nothing; it drives the injected screen.

Every `hold_s` (on the node's clock) the pure screen planner
(protocols.planner) says which transfer and packet goes up next; each frame
is framed just before it is shown (protocols.transfer: header, packet, this
node's acknowledgements, its run nonce; checked with the room key's MAC, the
tensor bytes sealed with its AEAD) and drawn with alternating parity marks, so a
capture that mixes two frames is recognised. A transfer stays booked until
every reader acknowledges it; when nothing is left to show but this node's
acknowledgements changed, it shows a few status frames (acknowledgements
only), and again whenever a peer still shows a transfer this node already
has (that peer missed them). A transfer that nodes overhear
(`PostTransfer.overheard`: the parameter server's words, read by observers)
lingers: once its readers have it, it goes up OVERHEARD_FRAMES frames a
source packet more, when nothing else is to be shown or taking turns with
repairs that wait for acknowledgements (protocols.planner). While the run
handshake is not complete (a peer does not trust this node's run nonce yet, or this node not theirs, or the
ranks do not yet agree on which camera reads which screen), and until every
rank is complete, every other frame is a status frame: it carries the echo
and the discovery table the others need, relayed camera to camera. When
what only status frames carry changes later (this node's handshake or table:
`AcksChanged.news`), or a peer that reads this node shows an older row of it,
STATUS_REPEATS status frames take turns with the transfers, so the news
does not wait for the screen to be idle. Otherwise the last frame stays up:
readers skip an unchanged frame cheaply. Every status frame also says this node's floor
(protocols.transfer): its transfers up to it are acknowledged by every rank
they were meant for and gone from the screen.

A peer's acknowledgement replaces the one before: a transfer still booked
counts as acknowledged by a peer only while the peer's latest
acknowledgement covers it. A peer's acknowledgements only grow, but for a
peer that started again (a new incarnation, protocols.receiver), which knows
nothing of this node's transfers: the transfers still booked for it are
shown again until it acknowledges them (those every reader already
acknowledged are gone, below the floor).

With a start-up ladder of layouts (`ladder`, densest first), the status frames
go up in the layouts of the probe schedule (`probe`: the layout a frame shown
at a time goes up in and until when, protocols.discovery.ProbeSchedule.at;
without one, each layout in turn, each held for its own hold) until discovery
says which layout the room's cameras read (`LayoutChosen`, the same on
every rank); from then on frames go up in that layout, until readers ask for
others (`LayoutAsked`, protocols.adapt): a transfer goes up in the most
robust layout its readers asked for, a status frame in the most robust any
reader asked for. A transfer whose readers ask for a more robust layout is
cut again for the new frame size (the same sealed bytes: its readers start
it afresh) and shown from its first packet; one whose readers ask for a
denser layout stays as it is (they still read its layout). A reader may ask
for its layout on part of the screen (the rest out of its view,
protocols.adapt): a transfer for it goes up there, a status frame too (any
camera that sees the whole screen reads a part of it), and a transfer cut
for another part is cut again. Every frame says
which layouts the screen shows frames in now (`showing`), so cameras try those. The layouts this node's own camera asks of each peer
(`LayoutAsks`) go up in every frame.
"""

from __future__ import annotations

import asyncio
from collections import deque

from protocols import adapt, discovery, frames, layout, transfer
from protocols.link import LinkCodec, in_ladder
from protocols.messages import (AcksChanged, FrameTiming, HoldsKnown, LayoutAsked, LayoutAsks, LayoutChosen,
                                PeerAcks, PostTransfer, VoidCollectives)
from protocols.planner import ScreenPlan
from protocols.security import NO_KEY, RoomKey
from wccl.runtime.actor import Actor, ActorContext, Overflow
from protocols.registry import REGISTRY
from wccl.media import Screen
from wccl.keys import new_run_nonce

STATUS_REPEATS = 3  # status frames shown after the acknowledgements change
# A transfer nodes overhear (observers) is shown this many frames per source packet more, once its readers
# have it (protocols.planner: when the screen is idle or waits for acknowledgements): an observer that reads
# half the frames then still gets it.
OVERHEARD_FRAMES = 2
REPAIR_SHARE = 0.25  # repair packets made up front, as a share of the source packets (then they repeat)
ECHO_QUEUE = 16  # echoes kept per peer until shown (oldest dropped)
STARTUP_OVERLAY = [
    "WCCL is starting: the laptops are greeting each other over the light.",
    "Point every camera at the other screens; keep this screen fully visible and bright.",
]


class ScreenWriter(Actor):
    consumes = (PostTransfer, AcksChanged, PeerAcks, HoldsKnown, LayoutChosen, LayoutAsks, LayoutAsked, FrameTiming,
                VoidCollectives)
    mailbox = (256, Overflow.BLOCK)

    def __init__(self, ctx: ActorContext, screen: Screen, codec: LinkCodec, screen_w: int, screen_h: int,
                 hold_s: float, session: int, rank: int, world: int, loss: float = 0.1,
                 margin_frames: int = 1, key: RoomKey = NO_KEY, run_nonce: int | None = None,
                 ladder: list[tuple[LinkCodec, float]] | None = None, probe=None,
                 names: list[str] | None = None) -> None:
        """`names`: the ranks in rank order (FrameTiming names its origin)."""
        super().__init__(ctx)
        self.names = names or []
        self.screen = screen
        self.codec = codec
        self.screen_w, self.screen_h = screen_w, screen_h
        self.hold_s = hold_s
        # The layouts status frames cycle through until discovery picks one (one layout: no probing).
        self.ladder = list(ladder) if ladder and len(ladder) > 1 and world > 1 else None
        self._layouts = len(self.ladder) if self.ladder else 1  # the layouts the status frames' table measures
        # Once discovery picked one: the ladder still, for the layouts readers ask for (None: one layout).
        self.layouts = self.ladder
        self._room = 0  # the room's layout (LayoutChosen)
        self._asked: dict[int, int] = {}  # reader rank -> what it asks this screen for (an ask's byte, adapt.ask)
        self._asks: tuple[int, ...] = ()  # what this node's camera asks of each rank, shown in every frame
        self._made: dict[int, tuple[transfer.TransferHeader, bytes, int]] = {}  # tid -> header, payload, ask byte
        self._probe = 0  # the ladder layout the next status frame goes up in, while probing (without `probe`)
        self.probe = probe
        self.session = session
        self.rank, self.world = rank, world
        self.plan = ScreenPlan(loss=loss, margin=margin_frames)
        self._out: dict[int, transfer.Outgoing] = {}
        self._last_tid = 0  # the latest transfer booked
        self._acks: tuple[transfer.Ack, ...] = transfer.NO_ACKS[:world]
        self._holds: tuple[int, ...] = (0,) * world
        self.key = key
        self.run_nonce = run_nonce if run_nonce is not None else new_run_nonce()
        self._echo: tuple[int, ...] = tuple(self.run_nonce if r == rank else 0 for r in range(world))
        self._trusts = 0
        self._greeting = world > 1
        self._greet_turn = False
        self._status_due = 0
        self._news = 0  # status frames still to take turns with transfers (AcksChanged.news)
        self._rows: tuple = ()  # the discovery table (protocols.discovery), a row per rank, shown in status frames
        self._pages = transfer.StatusPages()  # where each frame size's next page of the table starts
        self._wake = asyncio.Event()
        self._parity = 0
        self._blank = layout.blank(screen_w, screen_h)
        self._clock_echoes: dict[int, deque[tuple[float, float]]] = {}  # peer -> (shown, captured) of frames read
        self._last_echo: dict[int, tuple[float, float]] = {}
        self._echo_turn = 0
        self._lag = 0.0  # how long a frame takes from being made to being up (real screens)
        self._overlay: list[str] | None = None
        self.results = ctx.results.setdefault("screen", {"frames_shown": 0, "status_frames": 0,
                                                         "transfers_acked": 0, "transfers_voided": 0})

    def _log_layout(self, measured: bool) -> None:
        """`layout_used`: the layout this screen shows its transfers in, from now on (the dashboard and the
        launcher say it in words): `measured` at start-up by discovery, or else the room file's."""
        lay = self.codec.layout
        self.log.info("layout_used", rows=lay.rows, cols=lay.cols, colours=lay.colours, cell_px=lay.cell_px,
                      hold_s=self.hold_s, measured=measured)

    async def run(self) -> None:
        if self.ladder is None and self.world > 1:
            self._log_layout(measured=False)
        self.screen.show(layout.render_idle(self.codec.layout, self.screen_w, self.screen_h))
        await self.run_beside(self._present())

    async def handle(self, msg: PostTransfer | AcksChanged | PeerAcks | HoldsKnown | LayoutChosen | LayoutAsks
                     | LayoutAsked | FrameTiming | VoidCollectives) -> None:
        if isinstance(msg, VoidCollectives):
            gone = self.plan.void(msg.first_seq)
            for b in gone:
                self._drop(b.tid)
            self.results["transfers_voided"] += len(gone)
            return
        if isinstance(msg, FrameTiming):
            if msg.origin in self.names:
                peer = self.names.index(msg.origin)
                self._clock_echoes.setdefault(peer, deque(maxlen=ECHO_QUEUE)).append((msg.shown, msg.captured))
            return
        if isinstance(msg, LayoutChosen):
            if self.ladder is not None:
                self._room = msg.layout
                self.codec, self.hold_s = self.ladder[msg.layout]
                self.ladder = None
                self._log_layout(measured=True)
            return
        if isinstance(msg, LayoutAsks):
            self._asks = msg.asks[:self.world]
            self._status_due = STATUS_REPEATS  # the readers it asks hear it even when the screen is idle
        elif isinstance(msg, LayoutAsked):
            k, part = adapt.split(msg.layout)
            if (self.layouts is None or self.ladder is not None or not 0 <= k < len(self.layouts)
                    or part >= len(layout.PARTS)):
                return  # one layout (pinned), or still probing: nothing to choose
            was = self._layout_for(1 << msg.origin)
            self._asked[msg.origin] = msg.layout
            if (now := self._layout_for(1 << msg.origin)) != was:
                (codec, hold_s), (before, before_s) = self._codec(now), self._codec(was)
                self.log.info("layout_used", rows=codec.layout.rows, cols=codec.layout.cols,
                              colours=codec.layout.colours, cell_px=codec.layout.cell_px, hold_s=hold_s,
                              part=codec.layout.part, measured=True,
                              reader=self.names[msg.origin] if msg.origin < len(self.names) else msg.origin,
                              was=before.layout.words(before_s))
            self._relayout()
        elif isinstance(msg, HoldsKnown):
            holds = tuple(max(a, b) for a, b in zip(self._holds, msg.holds))
            if holds == self._holds:
                return
            self._holds = holds
            self._status_due = STATUS_REPEATS  # a rank waits for this news: show it even when idle
            for r, count in enumerate(holds):
                self._forget(self.plan.held(r, count))
        elif isinstance(msg, AcksChanged):
            self._acks = tuple(transfer.Ack(c, m) for c, m in msg.acks)
            if msg.echo:
                self._echo, self._trusts, self._greeting = msg.echo, msg.trusts, msg.greeting
            if msg.rows:
                self._rows = discovery.unpack_table(msg.rows)[:self.world]
            self._status_due = STATUS_REPEATS
            if msg.news:
                self._news = STATUS_REPEATS
        elif isinstance(msg, PeerAcks):
            ack, bit = transfer.Ack(*msg.ack), 1 << msg.origin
            for b in self.plan.bookings:
                if b.acked & bit and not ack.has(b.tid):
                    b.acked &= ~bit  # a new incarnation of the peer: it has not got this one (yet)
            self._forget(self.plan.acknowledge(msg.origin, ack))
        else:
            # A transfer for no rank (only nodes that overhear it) names this rank as its reader: every rank
            # skips it (protocols.receiver), and a listener takes it like any other.
            header = transfer.TransferHeader(self.session, self.rank, msg.tid, msg.seq, msg.op, msg.dtype,
                                             msg.numel, 0, b"", msg.part, msg.dest or 1 << self.rank)
            out = self._make(header, msg.payload, self._layout_for(msg.dest))
            k = out.source
            self.plan.book(msg.tid, msg.dest, k, background=msg.background, priority=msg.priority,
                           collective=msg.seq if msg.op in transfer.COLLECTIVE_OPS else -1,
                           linger=OVERHEARD_FRAMES * k + 2 if msg.overheard else 0)
            self._last_tid = msg.tid
        self._wake.set()

    def _layout_for(self, dest: int) -> int:
        """The layout (an ask's byte) a frame for the readers in `dest` goes up in: the most robust any of them
        asked for (0 for every reader: a status frame's), else the room's; on the part of the screen the first
        of them that asks for one asked for (protocols.adapt.shared)."""
        return adapt.shared([a for r, a in sorted(self._asked.items()) if dest >> r & 1 or not dest], self._room)

    def _showing(self) -> int:
        """The layouts this screen shows frames in now, one bit each (its booked transfers' and its status
        frames'), said in every frame so that cameras try them; 0 with one layout, or while probing."""
        if self.layouts is None or self.ladder is not None:
            return 0
        mask = 1 << adapt.split(self._layout_for(0))[0]
        for b in self.plan.bookings:
            made = self._made.get(b.tid)
            if made is not None:
                mask |= 1 << adapt.split(made[2])[0]
        return mask

    def _codec(self, ask: int) -> tuple[LinkCodec, float]:
        """The layout an ask's byte names (codec and hold: protocols.link.in_ladder); the one layout when there
        is no ladder."""
        return (self.codec, self.hold_s) if self.layouts is None or self.ladder is not None else in_ladder(
            self.layouts, ask)

    def _make(self, header: transfer.TransferHeader, payload: bytes, k: int) -> transfer.Outgoing:
        """The transfer cut for frames of layout k (kept with its payload: a new layout cuts it again)."""
        out = self._out[header.tid] = transfer.outgoing(
            header, payload, message_bytes=self._codec(k)[0].message_bytes, ranks=self.world,
            present=self._entries_present(), key=self.key,
            run_nonce=self.run_nonce, repair=lambda n: max(4, int(n * REPAIR_SHARE)))
        self._made[header.tid] = (header, payload, k)
        return out

    def _entries_present(self) -> int | None:
        """How many ranks this screen's frames give an entry now (protocols.transfer.present_mask), what a
        transfer's packets are sized beside: once this camera asks each screen it reads for a layout (every
        rank it acknowledges is one of them), those and any other it acknowledges; before, or with no
        asks at all (one layout), the most (None), so that no acknowledgement waits for a turn."""
        if all(k == transfer.NO_ASK for k in self._asks):
            return None
        return transfer.present_mask(self._acks, self._asks).bit_count()

    def _relayout(self) -> None:
        """Cut again each booked transfer whose readers now want a more robust layout or another part of the
        screen, shown from its start (one a reader reads in a denser layout now still reads in its own: it
        keeps what went up of it)."""
        for b in self.plan.bookings:
            made = self._made.get(b.tid)
            if made is None:
                continue
            want = self._layout_for(b.dest)
            (k, part), (want_k, want_part) = adapt.split(made[2]), adapt.split(want)
            if k >= want_k and part == want_part:
                continue
            out = self._make(made[0], made[1], want)
            self.plan.recut(b.tid, out.source)
            self.results["transfers_recut"] = self.results.get("transfers_recut", 0) + 1

    def _drop(self, tid: int) -> None:
        self._out.pop(tid, None)
        self._made.pop(tid, None)

    def _timing(self, shown_local: float) -> frames.Timing:
        """A frame's clock-sync fields: when it goes up (this node's own clock), and the next echo of a
        frame read from a peer (peers take turns; with nothing new, the last echo again)."""
        peers = sorted(set(self._clock_echoes) | set(self._last_echo))
        echo_peer, echo = frames.NO_PEER, (0.0, 0.0)
        for k in range(len(peers)):
            p = peers[(self._echo_turn + k) % len(peers)]
            q = self._clock_echoes.get(p)
            if q:
                echo_peer, echo = p, q.popleft()
                self._last_echo[p] = echo
                self._echo_turn = (peers.index(p) + 1) % len(peers)
                break
        else:
            if peers:
                p = peers[self._echo_turn % len(peers)]
                self._echo_turn += 1
                echo_peer, echo = p, self._last_echo[p]
        return frames.Timing(round(shown_local * 1e6), echo_peer, round(echo[0] * 1e6), round(echo[1] * 1e6))

    def _next_message(self, shown_local: float) -> tuple[bytes, LinkCodec, float] | None:
        """The next frame's message, and the layout (codec, hold) it goes up in."""
        tm = self._timing(shown_local)
        shown_us, clock_echo = tm.shown_us, (tm.echo_peer, tm.echo_shown_us, tm.echo_captured_us)
        greet = (self._greeting or self._news > 0) and self._greet_turn
        self._greet_turn = not self._greet_turn
        nxt = None if greet else self.plan.next()
        if nxt is None and not self._wants_status:
            nxt = self.plan.next_lingering()  # (the screen is idle otherwise)
        if nxt is not None:
            tid, index = nxt
            codec, hold_s = self._codec(self._made[tid][2])
            message = self._out[tid].message(index, message_bytes=codec.message_bytes, acks=self._acks,
                                             shown_us=shown_us, run_nonce=self.run_nonce, trusts=self._trusts,
                                             holds=self._holds, asks=self._asks, showing=self._showing(),
                                             clock_echo=clock_echo, key=self.key)
            for done in self.plan.lingered:  # (done lingering: off the screen for good)
                self._drop(done)
            self.plan.lingered.clear()
            return message, codec, hold_s
        if self._wants_status:
            self._status_due = max(0, self._status_due - 1)
            self._news = max(0, self._news - 1)
            self.results["status_frames"] += 1
            codec, hold_s = self._codec(self._layout_for(0))
            if self.ladder is not None and self.probe is not None:  # probing: the layout of its time slot
                k, until = self.probe(shown_us / 1e6)
                codec, hold_s = self.ladder[k][0], until - shown_us / 1e6
            elif self.ladder is not None:  # probing: each status frame in the next layout of the ladder
                codec, hold_s = self.ladder[self._probe]
                self._probe = (self._probe + 1) % len(self.ladder)
            showing = self._showing()
            first = self._pages.first(codec.message_bytes, len(self._rows), len(self._acks), self._layouts,
                                      adapt=bool(self._asks or showing),
                                      present=transfer.present_mask(self._acks, self._asks).bit_count())
            message = transfer.status_message(session=self.session, sender=self.rank, acks=self._acks,
                                              message_bytes=codec.message_bytes, shown_us=shown_us,
                                              run_nonce=self.run_nonce, trusts=self._trusts, echo=self._echo,
                                              rows=self._rows, first=first, holds=self._holds,
                                              asks=self._asks, showing=showing, layouts=self._layouts, clock_echo=clock_echo, floor=self._floor(),
                                              key=self.key)
            return message, codec, hold_s
        return None

    @property
    def _wants_status(self) -> bool:
        """Status frames are due: acknowledgements changed, news to take turns with transfers, or greeting."""
        return self._status_due > 0 or self._news > 0 or self._greeting

    def _forget(self, finished) -> None:
        """Bookings every reader has: off the screen for good (once done lingering, if they linger)."""
        for b in finished:
            if b.linger <= 0:
                self._drop(b.tid)
            self.results["transfers_acked"] += 1

    def _floor(self) -> int:
        """The latest transfer up to which every one is acknowledged by all its readers (not shown again)."""
        return self.plan.bookings[0].tid - 1 if self.plan.bookings else self._last_tid

    async def _present(self) -> None:
        t_next: float | None = None
        while True:
            if self.plan.pending == 0 and not self._wants_status and not self.plan.lingering:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = self.clock.now()
            if t_next is None or t_next < now - self.hold_s:
                t_next = now  # the screen was quiet: the next frame goes up at once
            await self.clock.sleep_until(t_next - self._lag)
            t_frame = self.clock.now()  # the node's own clock: frames carry its time
            nxt = self._next_message(t_frame + self._lag)
            if nxt is None:
                t_next = None
                continue
            message, codec, hold_s = nxt
            self._set_overlay(STARTUP_OVERLAY if self._greeting else None)
            image = layout.render(codec.encode_message(message), codec.layout, self.screen_w, self.screen_h,
                                  sender=self.rank, parity=self._parity)
            self._parity ^= 1
            presented = self.screen.show(image)
            # Framing and drawing take time too: the lag is from t_frame to the frame being up.
            actual = presented if isinstance(presented, float) else self.clock.now()
            self._lag += 0.2 * ((actual - t_frame) - self._lag)
            self.results["frames_shown"] += 1
            t_next += hold_s

    def _set_overlay(self, want: list[str] | None) -> None:
        """Instructions on a screen that can show them (a real window), while this node greets."""
        set_overlay = getattr(self.screen, "set_overlay", None)
        if set_overlay is not None and want != self._overlay:
            self._overlay = want
            set_overlay(want)

    async def finish(self) -> None:
        self.screen.show(self._blank)


REGISTRY.register("actor.screen_writer", "standard", ScreenWriter)
