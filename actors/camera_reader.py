"""CameraReader: turns a camera source into a stream of `Capture` messages.

Consumes: nothing (its camera is its input). Emits: `Capture`, one per image,
timestamped with the node-clock time of the capture. The camera (room,
webcam, fake, replay) is injected; the supervisor owns its lifetime. The
FrameDecoder's mailbox drops the oldest capture when decoding falls behind.

A camera that adjusts to the code it films (WebcamCamera.code_seen: its
exposure locks wait for the other screen's code) is listed in
wccl.media.webcam.CODE_SEEN under its node while the reader runs; the
node's FrameDecoder calls it with each code it finds.
"""

from __future__ import annotations

from protocols.messages import Capture
from wccl.actor import Actor, ActorContext, Overflow
from wccl.media import Camera
from wccl.media.webcam import CODE_SEEN


class CameraReader(Actor):
    consumes = ()
    mailbox = (1, Overflow.BLOCK)
    source = True

    def __init__(self, ctx: ActorContext, camera: Camera) -> None:
        super().__init__(ctx)
        self.camera = camera
        self.seq = 0

    async def run(self) -> None:
        hook = getattr(self.camera, "code_seen", None)
        if hook is not None:
            CODE_SEEN[self.ctx.node] = hook
        try:
            while True:
                image, t = await self.camera.recv()
                await self.emit(Capture(sender=self.ctx.node, step=-1, time=t, image=image, seq=self.seq))
                self.seq += 1
        finally:
            if hook is not None and CODE_SEEN.get(self.ctx.node) is hook:
                del CODE_SEEN[self.ctx.node]
