"""FrameDecoder: turns camera captures back into tensors.

Consumes: `Capture` (its mailbox drops the oldest when decoding falls
behind), `Tick` and `ScheduleDone` (to report and reset the link figures
each step).
Emits: `TensorReceived` for every tensor whose frames all arrived with good
CRCs and whose whole-tensor CRC matches. Frames from another session, from
this node itself or from an unknown sender are ignored and counted; frames
that fail their checks are counted by reason, never delivered.
"""

from __future__ import annotations

from collections import Counter

import structlog

from protocols import frames
from protocols.layout import GridLayout
from protocols.messages import Capture, ScheduleDone, TensorReceived, Tick
from wccl.actor import Actor, ActorContext
from wccl.imaging import reader


class FrameDecoder(Actor):
    consumes = (Capture, Tick, ScheduleDone)

    def __init__(self, ctx: ActorContext, grid: GridLayout, session: int, node_names: list[str],
                 reassembler: frames.Reassembler) -> None:
        super().__init__(ctx)
        self.grid = grid
        self.session = session
        self.node_names = node_names
        self.me = node_names.index(ctx.node)
        self.reassembler = reassembler
        self.stats: Counter = Counter()
        self.totals: Counter = Counter()

    async def handle(self, msg: Capture | Tick | ScheduleDone) -> None:
        if isinstance(msg, ScheduleDone):
            self._report(msg.steps - 1)
            return
        if isinstance(msg, Tick):
            if msg.phase == "compute":
                self._report(msg.step - 1)
                self.reassembler.forget_before(msg.step - 1)
            return
        self.stats["captures"] += 1
        for region in reader.locate(msg.image, self.grid):
            self.stats["codes_seen"] += 1
            delivered = self._accept(msg.image, region)
            if delivered is not None:
                await self.emit(delivered)

    def _accept(self, image, region: reader.Region) -> TensorReceived | None:
        try:
            # The header first: a frame already seen is not read again (the screen holds each for many captures).
            head = reader.read_region(image, region, self.grid, frames.HEADER_BYTES).frame
            fields = frames.parse_header(head)
            sender, stream_id, step, seq = fields[3], fields[4], fields[5], fields[6]
            stream = frames.STREAM_NAMES.get(stream_id)
            if stream is not None and self.reassembler.seen(sender, stream, step, seq):
                self.stats["frames_repeated"] += 1
                return None
            packet = frames.parse_frame(reader.read_region(image, region, self.grid).frame)
        except frames.FrameError as e:
            self.stats[f"frames_rejected_{e.reason}"] += 1
            return None
        if packet.session != self.session:
            self.stats["frames_foreign_session"] += 1
            return None
        if packet.sender >= len(self.node_names) or packet.sender == self.me:
            self.stats["frames_unknown_sender"] += 1
            return None
        self.stats["frames_ok"] += 1
        data = self.reassembler.add(packet)
        if data is None:
            return None
        self.stats["tensors"] += 1
        self.stats["tensor_bytes"] += len(data)
        return TensorReceived(sender=self.ctx.node, step=packet.step, time=self.clock.now(),
                              origin=self.node_names[packet.sender], stream=packet.stream,
                              payload=data, frames=packet.count)

    def _report(self, step: int) -> None:
        if step < 0:
            return
        losses = dict(self.reassembler.losses)
        self.reassembler.losses.clear()
        structlog.contextvars.bind_contextvars(step=step)
        self.log.info("link_step", reasons={k: v for k, v in self.stats.items() if k.startswith("frames_rejected")}, captures=self.stats["captures"], codes_seen=self.stats["codes_seen"],
                      frames_ok=self.stats["frames_ok"], frames_repeated=self.stats["frames_repeated"],
                      frames_rejected=sum(v for k, v in self.stats.items() if k.startswith("frames_rejected")),
                      tensors=self.stats["tensors"], tensor_bytes=self.stats["tensor_bytes"],
                      captures_dropped=self.ctx.inbox.dropped - self.totals["captures_dropped"],
                      losses=losses)
        self.totals.update(self.stats)
        self.totals["captures_dropped"] = self.ctx.inbox.dropped
        for k, v in losses.items():
            self.totals[f"loss_{k}"] += v
        self.stats.clear()

    async def finish(self) -> None:
        self.totals.update(self.stats)
        self.stats.clear()
        self.ctx.results["link"] = dict(self.totals)
