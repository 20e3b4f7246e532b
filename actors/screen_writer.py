"""ScreenWriter: shows tensors on the node's screen as frames of coloured cells.

Consumes: `Show` (payload bytes, stream, step, and the window to show it in).
Emits: nothing; it drives the injected screen. The payload is cut into
frames (protocols.frames), each drawn as a cell grid (protocols.layout); the
frames are shown in turn, each held `hold_s`, cycling until the window ends,
then the screen goes black.
"""

from __future__ import annotations

import structlog

from protocols import frames, layout
from protocols.messages import Show
from wccl.actor import Actor, ActorContext
from wccl.media import Screen


class ScreenWriter(Actor):
    consumes = (Show,)

    def __init__(self, ctx: ActorContext, screen: Screen, grid: layout.GridLayout, screen_w: int,
                 screen_h: int, hold_s: float, session: int, sender_id: int) -> None:
        super().__init__(ctx)
        self.screen = screen
        self.grid = grid
        self.screen_w, self.screen_h = screen_w, screen_h
        self.hold_s = hold_s
        self.session = session
        self.sender_id = sender_id
        self._blank = layout.blank(screen_w, screen_h)

    async def handle(self, msg: Show) -> None:
        structlog.contextvars.bind_contextvars(step=msg.step)
        packets = frames.packetize(msg.payload, frame_bytes=self.grid.frame_bytes, session=self.session,
                                   sender=self.sender_id, stream=msg.stream, step=msg.step)
        images = [layout.render(p, self.grid, self.screen_w, self.screen_h) for p in packets]
        if len(images) * self.hold_s > msg.end - msg.start:
            self.log.warning("show_window_too_short", stream=msg.stream, frames=len(images),
                             hold_s=self.hold_s, window_s=round(msg.end - msg.start, 3))
        await self.clock.sleep_until(msg.start)
        shown, i = 0, 0
        while True:
            t = msg.start + i * self.hold_s
            if t >= msg.end:
                break
            await self.clock.sleep_until(t)
            self.screen.show(images[i % len(images)])
            shown += 1
            i += 1
        await self.clock.sleep_until(msg.end)
        self.screen.show(self._blank)
        self.log.debug("tensor_shown", stream=msg.stream, bytes=len(msg.payload), frames=len(images),
                       shown=shown)

    async def finish(self) -> None:
        self.screen.show(self._blank)
