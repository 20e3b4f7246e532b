"""FrameDecoder: turns camera captures back into tensors.

Consumes: `Capture` (its mailbox drops the oldest when decoding falls
behind), `Tick` and `ScheduleDone` (to report and reset the link figures
each step).
Emits: `TensorReceived` for every tensor rebuilt from frames whose checks
passed and whose bytes match the tensor's digest.

Per capture: find every code (wccl.imaging.reader; tracked near where it
was, the whole image searched again when one is lost), reject captures that mix
two frames (parity marks), skip frames identical to one already decoded from
the same screen, then error-correct, check and reassemble (protocols.link,
protocols.frames). Frames from another session, from this node itself or
from an unknown sender are ignored and counted; frames that fail are counted
by reason, never delivered.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import structlog

from protocols import fec, frames
from protocols.link import LinkCodec
from protocols.messages import Capture, ScheduleDone, TensorReceived, Tick
from wccl.actor import Actor, ActorContext
from wccl.imaging import reader

SAME_FRAME = 0.97  # share of identical data cells above which a read is the frame already decoded


class FrameDecoder(Actor):
    consumes = (Capture, Tick, ScheduleDone)

    def __init__(self, ctx: ActorContext, codec: LinkCodec, session: int, node_names: list[str],
                 reassembler: frames.Reassembler) -> None:
        super().__init__(ctx)
        self.codec = codec
        self.grid = codec.layout
        self.model = reader.ColourModel(codec.layout)
        self.tracker = reader.QuadTracker(codec.layout)
        self.session = session
        self.node_names = node_names
        self.me = node_names.index(ctx.node)
        self.reassembler = reassembler
        self.last: dict[int | None, np.ndarray] = {}  # per sender strip: symbols of the last decoded frame
        self.previous: list[tuple[np.ndarray, np.ndarray]] = []  # (quad centre, cell samples) of the last capture
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
        previous, self.previous = self.previous, []
        for quad in self.tracker(msg.image):
            self.stats["codes_seen"] += 1
            sampled = reader.sample(msg.image, quad, self.grid)
            if reader.is_idle(sampled[0], self.grid):
                self.stats["idle_screens"] += 1
                continue
            centre = quad.corners.mean(axis=0)
            # A screen holds each frame for several captures: once a frame was decoded, an unchanged
            # sampling of the same screen is not read again (a failed read is retried on the next capture).
            if any(np.abs(c - centre).max() < 8 and reader.same_frame(v, sampled[0]) for c, v in previous):
                self.stats["frames_repeated"] += 1
                self.previous.append((centre, sampled[0]))
                continue
            code = reader.read_quad(msg.image, quad, self.grid, self.model, sampled=sampled)
            if code is None:
                self.stats["frames_rejected_unreadable"] += 1
                continue
            if code.mixed:
                self.stats["captures_mixed"] += 1
                continue
            delivered = self._accept(code)
            if delivered is not False:
                self.previous.append((centre, sampled[0]))
            if delivered:
                await self.emit(delivered)

    def _accept(self, code: reader.ReadCode) -> TensorReceived | None | bool:
        """The tensor this frame completes, None if none (frame used or ignored), False if it failed."""
        last = self.last.get(code.sender)
        if last is not None and np.count_nonzero(last == code.symbols) >= SAME_FRAME * last.size:
            self.stats["frames_repeated"] += 1
            return None
        try:
            packet, corrected = self.codec.decode(code.symbols, code.confidence)
        except fec.UncorrectableFrame:
            self.stats["frames_rejected_uncorrectable"] += 1
            return False
        except frames.FrameError as e:
            self.stats[f"frames_rejected_{e.reason}"] += 1
            return False
        self.stats["cells_wrong"] += corrected
        self.stats["cells_doubtful"] += int((code.confidence < 0.15).sum())
        self.stats["cells_read"] += code.symbols.size
        self.last[code.sender] = code.symbols
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
                              payload=data, frames=self.reassembler.last_packets)

    def _report(self, step: int) -> None:
        if step < 0:
            return
        losses = dict(self.reassembler.losses)
        self.reassembler.losses.clear()
        structlog.contextvars.bind_contextvars(step=step)
        rejected = {k.removeprefix("frames_rejected_"): v for k, v in self.stats.items()
                    if k.startswith("frames_rejected_")}
        self.log.info("link_step", captures=self.stats["captures"], codes_seen=self.stats["codes_seen"],
                      idle_screens=self.stats["idle_screens"],
                      captures_mixed=self.stats["captures_mixed"], frames_ok=self.stats["frames_ok"],
                      frames_repeated=self.stats["frames_repeated"], frames_rejected=rejected,
                      cells_wrong=self.stats["cells_wrong"], cells_read=self.stats["cells_read"], tensors=self.stats["tensors"],
                      tensor_bytes=self.stats["tensor_bytes"],
                      captures_dropped=self.ctx.inbox.dropped - self.totals["captures_dropped"], losses=losses)
        self.totals.update(self.stats)
        self.totals["captures_dropped"] = self.ctx.inbox.dropped
        for k, v in losses.items():
            self.totals[f"loss_{k}"] += v
        self.stats.clear()

    async def finish(self) -> None:
        self.totals.update(self.stats)
        self.stats.clear()
        self.ctx.results["link"] = dict(self.totals)
