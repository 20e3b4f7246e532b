"""CameraReader: turns a camera source into a stream of `Capture` messages.

Consumes: `CodeSeen` (the FrameDecoder found a code in a capture). Emits:
`Capture`, one per image, timestamped with the node-clock time of the
capture. The camera (room, webcam, fake, replay) is injected; the supervisor
owns its lifetime. The FrameDecoder's mailbox drops the oldest capture when
decoding falls behind.

A camera that adjusts to the code it films (WebcamCamera.code_seen: its
exposure locks wait for the other screen's code, then meter on it) is told of
each code found; only the latest matters (the mailbox keeps one).
"""

from __future__ import annotations

from protocols.messages import Capture, CodeSeen
from wccl.runtime.actor import Actor, ActorContext, Overflow
from protocols.registry import REGISTRY
from wccl.media import Camera


class CameraReader(Actor):
    consumes = (CodeSeen,)
    mailbox = (1, Overflow.DROP_OLDEST)
    source = True

    def __init__(self, ctx: ActorContext, camera: Camera) -> None:
        super().__init__(ctx)
        self.camera = camera
        self.seq = 0

    async def run(self) -> None:
        await self.run_beside(self._capture())

    async def _capture(self) -> None:
        while True:
            image, t = await self.camera.recv()
            await self.emit(Capture(sender=self.ctx.node, step=-1, time=t, image=image, seq=self.seq))
            self.seq += 1

    async def handle(self, msg: CodeSeen) -> None:
        code_seen = getattr(self.camera, "code_seen", None)
        if code_seen is not None:
            code_seen(msg.bbox, msg.image)


REGISTRY.register("actor.camera_reader", "standard", CameraReader)
