"""CameraReader: turns a camera source into a stream of `Capture` messages.

Consumes: nothing (its camera is its input). Emits: `Capture`, one per image,
timestamped with the node-clock time of the capture. The camera (room,
webcam, fake, replay) is injected; the supervisor owns its lifetime. The
FrameDecoder's mailbox drops the oldest capture when decoding falls behind.
"""

from __future__ import annotations

from protocols.messages import Capture
from wccl.actor import Actor, ActorContext, Overflow
from wccl.media import Camera


class CameraReader(Actor):
    consumes = ()
    mailbox = (1, Overflow.BLOCK)
    source = True

    def __init__(self, ctx: ActorContext, camera: Camera) -> None:
        super().__init__(ctx)
        self.camera = camera
        self.seq = 0

    async def run(self) -> None:
        while True:
            image, t = await self.camera.recv()
            await self.emit(Capture(sender=self.ctx.node, step=-1, time=t, image=image, seq=self.seq))
            self.seq += 1
