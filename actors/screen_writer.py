"""ScreenWriter: shows tensors on the node's screen as frames of coloured cells.

Consumes: `Show` (payload bytes, stream, step, and the window to show it in,
on the schedule's clock), `FrameTiming` (frames this node read from others:
their timestamps are echoed back in this node's frames for the clock sync).
Emits: nothing; it drives the injected screen.

The payload is sealed and numbered as a transfer (protocols.steps: frame
version 9, the collectives' format) and fountain coded (protocols.link): the window holds
`floor(window / hold_s)` frames, and every one of them is a distinct packet
(the source packets first, then repair packets), so the receiver rebuilds
the tensor from any sufficient subset of the frames it caught. Each frame is
framed just before it goes up, so its header carries the time it is shown
(this node's own clock) and an echo of a frame read from a peer
(the transfer frame's `shown_us` and echo fields). Windows are shown one after the other in the
order they start; a frame whose time has passed by more than half a hold is
skipped, never shown late. Frames alternate their parity marks, so a capture
that mixes two of them is recognised. Between windows the screen shows its
idle pattern (the ring around an even grey of the same mean light as a
frame), so that the cameras' auto-exposure never sees the light change; when
the node stops, the screen goes black.

With an `auto` layout (config `link.choose`), start-up windows are probes:
their frames cycle through the ladder of candidate layouts, each held for
its own time, so every receiver measures which layouts get through; the
layout the server picks comes with `ScheduleKnown`, and every frame uses it
from then on.

A screen whose `show` returns the time the frame was actually presented
(a real window) lets the writer measure its lag and show frames that much
earlier; a screen with `set_overlay` gets instructions during start-up.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

import structlog

from protocols import frames, layout, transfer
from protocols.link import LinkCodec
from protocols.steps import StepSender
from protocols.messages import AcksChanged, FrameTiming, ScheduleKnown, Show
from protocols.security import NO_KEY, RoomKey
from wccl.actor import Actor, ActorContext
from wccl.media import Screen

ECHO_QUEUE = 16  # echoes kept per peer until shown (oldest dropped)
STARTUP_OVERLAY = [
    "WCCL is starting: clocks are syncing over the light.",
    "Point every camera at the other screens; keep this screen fully visible and bright.",
]


@dataclass
class _Window:
    msg: Show
    transfers: list[tuple[transfer.TransferHeader, frames.Transfer]]  # per layout it is shown in (a probe: every one)
    t_next: float  # when its next frame goes up
    next: int = 0  # frames of it shown or skipped so far
    shown: int = 0


class ScreenWriter(Actor):
    consumes = (Show, FrameTiming, ScheduleKnown, AcksChanged)

    def __init__(self, ctx: ActorContext, screen: Screen, codec: LinkCodec, screen_w: int, screen_h: int,
                 hold_s: float, session: int, sender_id: int, node_names: list[str] | None = None,
                 ladder: list[tuple[LinkCodec, float]] | None = None, key: RoomKey = NO_KEY,
                 steps: StepSender | None = None) -> None:
        super().__init__(ctx)
        self.screen = screen
        self.key = key
        # The node's numbering and sealing of its transfers (the supervisor's: it outlives a restart).
        self.steps = steps or StepSender(session, sender_id, key)
        self.codec = codec
        self.ladder = ladder or [(codec, hold_s)]  # the layouts start-up probes; the chosen one is announced
        self.screen_w, self.screen_h = screen_w, screen_h
        self.hold_s = hold_s
        self.session = session
        self.sender_id = sender_id
        self.node_names = node_names or []
        self._ranks = len(self.node_names)  # every frame echoes a run nonce for each node
        self._blank = layout.blank(screen_w, screen_h)
        self._idle = layout.render_idle(codec.layout, screen_w, screen_h)
        self._variant = 0  # the layout of the ladder in use (a transfer per layout: packets differ in size)
        self._plan: deque[_Window] = deque()
        self._wake = asyncio.Event()
        self._echo: dict[int, deque[tuple[float, float]]] = {}
        self._last_echo: dict[int, tuple[float, float]] = {}
        self._echo_turn = 0
        self._parity = 0
        self._lag = 0.0  # measured presentation lag of the screen (seconds)
        self._overlay: list[str] | None = None
        self.results = ctx.results.setdefault("screen", {"frames_shown": 0, "frames_skipped_late": 0})

    async def run(self) -> None:
        self.screen.show(self._idle)
        await self.run_beside(self._present())

    async def handle(self, msg: Show | FrameTiming | ScheduleKnown | AcksChanged) -> None:
        if isinstance(msg, AcksChanged):
            # The handshake's news (protocols.steps): the run nonces every frame echoes from now on.
            self.steps.echo, self.steps.trusts = tuple(msg.echo), msg.trusts
            return
        if isinstance(msg, FrameTiming):
            if msg.origin in self.node_names:
                peer = self.node_names.index(msg.origin)
                self._echo.setdefault(peer, deque(maxlen=ECHO_QUEUE)).append((msg.shown, msg.captured))
            return
        if isinstance(msg, ScheduleKnown):
            codec, hold = self.ladder[msg.layout]
            self._variant = msg.layout
            if codec is not self.codec:
                self.codec, self.hold_s = codec, hold
                self._idle = layout.render_idle(codec.layout, self.screen_w, self.screen_h)
                self.log.info("layout_switched", layout=msg.layout, rows=codec.layout.rows, cols=codec.layout.cols,
                              colours=codec.layout.colours, cell_px=codec.layout.cell_px, hold_s=hold)
            return
        if msg.probe and len(self.ladder) > 1:
            cycle = sum(h for _, h in self.ladder)
            rounds = int((msg.end - msg.start) / cycle) + 1
            transfers = []
            for i, (c, _) in enumerate(self.ladder):
                head, sealed = self._transfer(msg, variant=i)
                needed = c.frames_needed(len(sealed), self._ranks, echoes=True)
                transfers.append((head, c.fountain(sealed, max(rounds, needed), self._ranks, echoes=True)))
            self._plan.append(_Window(msg, transfers, t_next=msg.start))
            self._wake.set()
            return
        slots = int((msg.end - msg.start) / self.hold_s + 1e-9)
        head, sealed = self._transfer(msg, variant=self._variant)
        needed = self.codec.frames_needed(len(sealed), self._ranks, echoes=True)
        if slots < needed and msg.packet_offset == 0 and msg.stream in ("grad", "avg"):
            # (a snapshot is spread over several windows on purpose)
            self.log.warning("show_window_too_short", stream=msg.stream, step=msg.step, frames_needed=needed,
                             slots=slots, hold_s=self.hold_s, window_s=round(msg.end - msg.start, 3))
        fountain = self.codec.fountain(sealed, msg.packet_offset + max(slots, needed), self._ranks, echoes=True)
        self._plan.append(_Window(msg, [(head, fountain)], t_next=msg.start))
        self._wake.set()

    def _transfer(self, msg: Show, variant: int) -> tuple[transfer.TransferHeader, bytes]:
        return self.steps.transfer(msg.stream, msg.step, msg.payload, msg.epoch, msg.base, variant)

    def _frame_of(self, w: _Window) -> tuple[LinkCodec, float, tuple, int] | None:
        """The codec, hold, (header, fountain) and packet of window `w`'s next frame (None: it is done)."""
        if len(w.transfers) == 1:
            k = w.msg.packet_offset + w.next
            if k >= len(w.transfers[0][1].packets):
                return None
            return self.codec, self.hold_s, w.transfers[0], k
        n = len(self.ladder)
        i, k = w.next % n, w.next // n  # probing: each frame in the next layout of the ladder
        if k >= len(w.transfers[i][1].packets):
            return None
        codec, hold = self.ladder[i]
        return codec, hold, w.transfers[i], k

    def _timing(self, shown_local: float) -> frames.Timing:
        """This frame's timing fields: when it goes up, and the next echo (peers take turns)."""
        peers = sorted(set(self._echo) | set(self._last_echo))
        echo_peer, echo = frames.NO_PEER, (0.0, 0.0)
        for k in range(len(peers)):
            p = peers[(self._echo_turn + k) % len(peers)]
            q = self._echo.get(p)
            if q:
                echo_peer, echo = p, q.popleft()
                self._last_echo[p] = echo
                self._echo_turn = (peers.index(p) + 1) % len(peers)
                break
        else:
            if peers:  # nothing new: repeat the last echo (the peer drops repeats), in case it was missed
                p = peers[self._echo_turn % len(peers)]
                self._echo_turn += 1
                echo_peer, echo = p, self._last_echo[p]
        return frames.Timing(round(shown_local * 1e6), echo_peer, round(echo[0] * 1e6), round(echo[1] * 1e6))

    def _set_overlay(self, stream: str) -> None:
        set_overlay = getattr(self.screen, "set_overlay", None)
        if set_overlay is None:
            return
        want = STARTUP_OVERLAY if stream == "sync" else None
        if want != self._overlay:
            self._overlay = want
            set_overlay(want)

    async def _present(self) -> None:
        local = getattr(self.clock, "local", self.clock)
        while True:
            if not self._plan:
                self._wake.clear()
                await self._wake.wait()
                continue
            w = self._plan[0]
            msg = w.msg
            # Windows before this node's clock is synced are on its own clock.
            clock = local if msg.local else self.clock
            t = w.t_next
            this = self._frame_of(w)
            if t >= msg.end - 1e-9 or this is None:
                self._plan.popleft()
                self.results["frames_shown"] += w.shown
                structlog.contextvars.bind_contextvars(step=msg.step)
                self.log.debug("tensor_shown", stream=msg.stream, bytes=len(msg.payload), frames=w.shown)
                if not self._plan or self._plan[0].msg.start > msg.end + 1e-9:
                    await clock.sleep_until(msg.end)
                    nxt = self._plan[0].msg if self._plan else None
                    if nxt is None or nxt.start > (local if nxt.local else self.clock).now():
                        self.screen.show(self._idle)
                continue
            codec, hold, transfer_, packet = this
            w.next += 1
            w.t_next = t + hold
            if clock.now() > t + hold / 2:  # too late for this frame: never show one late
                self.results["frames_skipped_late"] += 1
                continue
            await clock.sleep_until(t - self._lag)
            self._set_overlay(msg.stream)
            t_frame = local.now()
            shown_local = t_frame + self._lag
            tm = self._timing(shown_local)
            head, fountain = transfer_
            echo = tuple(self.steps.echo[:self._ranks]) + (0,) * (self._ranks - len(self.steps.echo))
            frame = codec.frame(head, fountain, packet, shown_us=tm.shown_us,
                                clock_echo=(tm.echo_peer, tm.echo_shown_us, tm.echo_captured_us),
                                run_nonce=self.steps.run_nonce, trusts=self.steps.trusts, nonce_echo=echo,
                                key=self.key)
            image = layout.render(frame, codec.layout, self.screen_w, self.screen_h, sender=self.sender_id,
                                  parity=self._parity)
            self._parity ^= 1
            presented = self.screen.show(image)
            # Framing and drawing take time too: the lag is from t_frame to the frame being up.
            actual = presented if isinstance(presented, float) else local.now()
            self._lag += 0.2 * ((actual - t_frame) - self._lag)
            w.shown += 1

    async def finish(self) -> None:
        self.screen.show(self._blank)
