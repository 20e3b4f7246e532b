"""ScreenWriter: shows tensors on the node's screen as frames of coloured cells.

Consumes: `Show` (payload bytes, stream, step, and the window to show it in).
Emits: nothing; it drives the injected screen. The payload is fountain coded
(protocols.link): the window holds `floor(window / hold_s)` frames, and every
one of them is a distinct packet (the source packets first, then repair
packets), so the receiver rebuilds the tensor from any sufficient subset of
the frames it caught. Consecutive frames alternate their parity marks, so a
capture that mixes two of them is recognised. Between windows the screen
shows its idle pattern (the ring around an even grey of the same mean light
as a frame), so that the cameras' auto-exposure never sees the light change;
when the node stops, the screen goes black.
"""

from __future__ import annotations

import structlog

from protocols import layout
from protocols.link import LinkCodec
from protocols.messages import Show
from wccl.actor import Actor, ActorContext
from wccl.media import Screen


class ScreenWriter(Actor):
    consumes = (Show,)

    def __init__(self, ctx: ActorContext, screen: Screen, codec: LinkCodec, screen_w: int, screen_h: int,
                 hold_s: float, session: int, sender_id: int) -> None:
        super().__init__(ctx)
        self.screen = screen
        self.codec = codec
        self.screen_w, self.screen_h = screen_w, screen_h
        self.hold_s = hold_s
        self.session = session
        self.sender_id = sender_id
        self._blank = layout.blank(screen_w, screen_h)
        self._idle = layout.render_idle(codec.layout, screen_w, screen_h)

    async def run(self) -> None:
        self.screen.show(self._idle)
        await super().run()

    async def handle(self, msg: Show) -> None:
        structlog.contextvars.bind_contextvars(step=msg.step)
        slots = int((msg.end - msg.start) / self.hold_s + 1e-9)
        needed = self.codec.frames_needed(len(msg.payload))
        if slots < needed:
            self.log.warning("show_window_too_short", stream=msg.stream, frames_needed=needed, slots=slots,
                             hold_s=self.hold_s, window_s=round(msg.end - msg.start, 3))
        count = max(slots, needed)
        frames = self.codec.encode(msg.payload, count=count, session=self.session, sender=self.sender_id,
                                   stream=msg.stream, step=msg.step)
        shown = 0
        for i, frame in enumerate(frames):
            t = msg.start + i * self.hold_s
            if t >= msg.end:
                break
            image = layout.render(frame, self.codec.layout, self.screen_w, self.screen_h, sender=self.sender_id,
                                  parity=i & 1)
            await self.clock.sleep_until(t)
            self.screen.show(image)
            shown += 1
        await self.clock.sleep_until(msg.end)
        self.screen.show(self._idle)
        self.ctx.results.setdefault("screen", {"frames_shown": 0})["frames_shown"] += shown
        self.log.debug("tensor_shown", stream=msg.stream, bytes=len(msg.payload), frames=shown, needed=needed)

    async def finish(self) -> None:
        self.screen.show(self._blank)
