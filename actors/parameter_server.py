"""ParameterServer: averages the workers' gradients each step, shows the result, keeps the state.

Consumes: `ScheduleKnown`, `LocalGradient` (from the worker on this node),
`TensorReceived` (workers' gradients read off their screens; hello frames
asking for a snapshot), `Tick` (uplink: show a snapshot when one is due;
reduce: average what arrived), `ScheduleDone`.
Emits: `AveragedGradient` for the worker on this node (if any), `Show` (the
average, on this node's screen during the downlink phase; snapshots during
uplink phases, when this screen is otherwise dark), `Snapshot` for the
worker on this node.

Only gradients computed on the server's current state (same epoch, `base`
equal to its update count) are averaged; others are counted
(`gradient_stale`). A worker whose gradient missed the reduce deadline is
logged (`gradient_missing`); a gradient with a NaN or an Inf is left out
and counted (`gradient_nonfinite`); the server averages what arrived if at least
`quorum` workers made it, otherwise skips the step (`step_skipped`) and the
state stays where it was. The server keeps its own copy of the training
state (it applies each average), shows it as a snapshot every
`snapshot_every` steps, when a node asks, and after resuming, and writes a
checkpoint every `checkpoint_every` updates.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import structlog
import torch

from protocols import snapshot as snap
from protocols import sync
from protocols.messages import (AveragedGradient, LocalGradient, ScheduleDone, ScheduleKnown, Show, Snapshot,
                                TensorReceived, Tick)
from protocols.security import NO_KEY, RoomKey
from protocols.codecs import Codec, ErrorFeedback, get_codec
from wccl.actor import Actor, ActorContext
from wccl.recovery import save_checkpoint
from wccl.training.exchange import reduce
from wccl.schedule import Schedule

ANNOUNCE_FRAMES = 2  # the Clock's announcement takes the first frames of every uplink window


class ParameterServer(Actor):
    consumes = (ScheduleKnown, Tick, LocalGradient, TensorReceived, ScheduleDone)

    def __init__(self, ctx: ActorContext, workers: list[str], quorum: int, numel: int, replica: Any, hold_s: float,
                 snapshot_frames: int, snapshot_every: int = 10, checkpoint_every: int = 0,
                 checkpoint: Path | None = None, session: int = 0, key: RoomKey = NO_KEY,
                 resume: tuple[dict, snap.Snapshot, bytes] | None = None,
                 ladder: list[tuple[float, int]] | None = None, codec: Codec | None = None) -> None:
        super().__init__(ctx)
        if not 1 <= quorum <= len(workers):
            raise ValueError(f"quorum must be between 1 and {len(workers)}")
        self.workers = workers
        self.quorum = quorum
        self.numel = numel
        self.codec = codec or get_codec("bf16")  # the run's gradient codec (wccl.training.exchange)
        self.downlink = ErrorFeedback(self.codec)  # the average's error feedback (the server's own)
        self.replica = replica  # the server's own copy of the training state
        self.hold_s = hold_s
        self.snapshot_frames = snapshot_frames
        # per layout of the ladder: (hold_s, frames a snapshot needs); the schedule says which is in use
        self.ladder = ladder or [(hold_s, snapshot_frames)]
        self.layout = 0
        self.snapshot_every = snapshot_every
        self.checkpoint_every = checkpoint_every
        self.checkpoint = checkpoint
        self.session = session
        self.key = key
        self.resume = resume
        self.local_worker = ctx.node in workers
        self.schedule: Schedule | None = None
        self.phases: tuple = ()
        self.epoch = 0
        self.applied = 0
        self._grads: dict[int, dict[str, bytes]] = {}
        self._snapshot_due: str | None = None
        # The snapshot being shown: (payload, its update count, its epoch, packets shown so far, windows left).
        self._showing: tuple[bytes, int, int, int, int] | None = None
        self.results = ctx.results.setdefault("server", {"reduced": 0, "gradient_missing": 0, "gradient_nonfinite": 0,
                                                         "skipped": 0, "gradient_undecodable": 0, "bytes_sent": 0,
                                                         "gradient_stale": 0, "snapshots_shown": 0,
                                                         "checkpoints": 0})

    async def handle(self, msg: Any) -> None:
        if isinstance(msg, ScheduleKnown):
            await self._schedule_known(msg)
        elif isinstance(msg, LocalGradient):
            self._gradient(self.ctx.node, msg.step, msg.epoch, msg.base, msg.payload)
        elif isinstance(msg, TensorReceived):
            if msg.stream == "grad" and msg.origin in self.workers:
                self._gradient(msg.origin, msg.step, msg.epoch, msg.base, msg.payload)
            elif msg.stream == "sync":
                self._hello(msg)
        elif isinstance(msg, Tick):
            structlog.contextvars.bind_contextvars(step=msg.step)
            if msg.phase == "uplink":
                await self._uplink(msg.step)
            elif msg.phase == "reduce":
                await self._reduce(msg.step)

    async def _schedule_known(self, msg: ScheduleKnown) -> None:
        self.schedule = Schedule(t0=msg.t0, phases=msg.phases)
        self.phases = msg.phases
        self.epoch = msg.epoch
        self.layout = msg.layout
        self.hold_s, self.snapshot_frames = self.ladder[msg.layout]
        if self.resume is not None:
            meta, state, rng = self.resume
            self.resume = None
            self.replica.import_state(state.arrays)
            self.applied = state.applied
            torch.set_rng_state(torch.frombuffer(bytearray(rng), dtype=torch.uint8))
            self._snapshot_due = "resumed"
            self.log.info("server_resumed", applied=self.applied, epoch=self.epoch, checkpoint=str(self.checkpoint))
            if self.local_worker:
                await self.emit(Snapshot(**self.message_fields(msg.step), payload=self._state_bytes()))
        else:
            self.applied = msg.applied

    def _gradient(self, origin: str, step: int, epoch: int, base: int, payload: bytes) -> None:
        if epoch != self.epoch or base != self.applied:
            self.results["gradient_stale"] += 1
            self.log.info("gradient_stale", origin=origin, epoch=epoch, base=base, server_epoch=self.epoch,
                          server_applied=self.applied)
            return
        self._grads.setdefault(step, {})[origin] = payload

    def _hello(self, msg: TensorReceived) -> None:
        try:
            payload = sync.decode(msg.payload)
        except sync.SyncError:
            return
        if isinstance(payload, sync.Hello) and payload.wants_snapshot and self._snapshot_due is None:
            self._snapshot_due = f"asked_by_{msg.origin}"

    def _state_bytes(self) -> bytes:
        return snap.encode_snapshot(snap.Snapshot(self.applied, self.epoch, self.replica.export_state()))

    async def _uplink(self, step: int) -> None:
        """This screen is free while the workers show their gradients: show a snapshot when one is due."""
        if self.schedule is None:
            return
        if self._snapshot_due is None and step % self.snapshot_every == 0 and step > 0:
            self._snapshot_due = "periodic"
        w = self.schedule.window(step, "uplink")
        start = w.start + ANNOUNCE_FRAMES * self.hold_s
        slots = int((w.end - start) / self.hold_s + 1e-9)
        if self._snapshot_due is not None and slots > 0:
            payload = self._state_bytes()
            # Show it over enough windows for about twice the frames it needs (frames get lost).
            windows = max(1, math.ceil(2 * (self.snapshot_frames + 1) / slots))
            self._showing = (payload, self.applied, self.epoch, 0, windows)
            self.results["snapshots_shown"] += 1
            self.log.info("snapshot_shown", reason=self._snapshot_due, applied=self.applied, epoch=self.epoch,
                          bytes=len(payload), windows=windows)
            self._snapshot_due = None
            if self.local_worker:
                await self.emit(Snapshot(**self.message_fields(step), payload=payload))
        if self._showing is None or slots <= 0:
            return
        payload, applied, epoch, offset, left = self._showing
        await self.emit(Show(**self.message_fields(applied), stream="params", payload=payload, start=start,
                             end=w.end, epoch=epoch, base=applied, packet_offset=offset))
        self._showing = (payload, applied, epoch, offset + slots, left - 1) if left > 1 else None

    async def _reduce(self, step: int) -> None:
        got = self._grads.pop(step, {})
        for old in [s for s in self._grads if s < step]:
            del self._grads[old]
        missing = [w for w in self.workers if w not in got]
        if missing:
            self.results["gradient_missing"] += len(missing)
            self.log.warning("gradient_missing", missing=missing, arrived=sorted(got))
        r = reduce(self.codec, got, self.numel, self.downlink, self.quorum)
        if r.undecodable:
            # Not this run's codec or size (a worker configured otherwise): never averaged in.
            self.results["gradient_undecodable"] += len(r.undecodable)
            self.log.error("gradient_undecodable", workers=r.undecodable, codec=self.codec.describe())
        if r.nonfinite:
            # NaN or Inf (a bad batch, a bad peer): never averaged in; the step goes on without them.
            self.results["gradient_nonfinite"] += len(r.nonfinite)
            self.log.warning("gradient_nonfinite", workers=r.nonfinite, step=step)
        if r.payload is None:
            self.results["skipped"] += 1
            self.log.warning("step_skipped", arrived=len(got), usable=len(r.used), quorum=self.quorum)
            return
        payload, avg = r.payload, r.average
        fields = self.message_fields(step)
        contributors = tuple(r.used)
        base = self.applied
        if self.local_worker:
            await self.emit(AveragedGradient(**fields, payload=payload, contributors=contributors, epoch=self.epoch,
                                             base=base))
        w = self.schedule.window(step, "downlink")
        await self.emit(Show(**fields, stream="avg", payload=payload, start=w.start, end=w.end, epoch=self.epoch,
                             base=base))
        self.replica.apply(avg)
        self.applied += 1
        self.results["reduced"] += 1
        self.results["bytes_sent"] += len(payload)
        self.log.info("gradients_averaged", contributors=list(contributors), applied=self.applied, bytes=len(payload))
        if self.checkpoint is not None and self.checkpoint_every and self.applied % self.checkpoint_every == 0:
            meta = dict(session=self.session, node=self.ctx.node, t0_us=round(self.schedule.t0 * 1e6),
                        phases=[list(p) for p in self.phases], layout=self.layout)
            state = snap.Snapshot(self.applied, self.epoch, self.replica.export_state())
            save_checkpoint(self.checkpoint, meta, state, bytes(torch.get_rng_state().numpy()), self.key)
            self.results["checkpoints"] += 1
            self.log.info("checkpoint_written", applied=self.applied, path=str(self.checkpoint))

    async def finish(self) -> None:
        self.results.update(applied=self.applied, epoch=self.epoch,
                            state_digest=snap.state_digest(self.replica.export_state()))
