"""ParameterServer: averages the workers' gradients each step, sends its word, keeps the state.

Consumes: `ScheduleKnown`, `LocalGradient` (from the worker on this node),
`TensorReceived` (workers' gradients read off their screens; hellos asking
for a snapshot), `Tick` (compute: a snapshot when one is due; reduce: a
step's deadline), `ScheduleDone`.
Emits: `AveragedGradient` for the worker on this node (if any), `SendTensor`
(its word on every step to the other workers: the average, or empty when
the step was skipped; snapshots), `Snapshot` for the worker on this node,
`StepSkipped` for its Clock (which makes the step up at the run's end).

A step is reduced as soon as every worker's gradient for it arrived (of
the workers in the room: one the room started without counts from the
hello it says once it has joined), or at
its deadline (the reduce tick wccl.runtime.schedule.DEADLINE_STEPS steps later; the
schedule ends at the last step's) with what arrived; steps are reduced in
order. Only gradients computed on
the server's current state (same epoch, `base` equal to its update count)
are averaged, whether they come early or late (a step reduced since they came
moved the state on); others are counted (`gradient_stale`). A worker whose gradient
missed the deadline is logged (`gradient_missing`); a gradient with a NaN or
an Inf is left out and counted (`gradient_nonfinite`); the server averages
what arrived if at least `quorum` workers made it, otherwise skips the step
(`step_skipped`: the state stays where it was, and its Clock makes the step
up at the run's end). The reduce is charged to
the node's clock at its CPU time (times `compute_scale`). The server keeps
its own copy of the training state (it applies each average), sends it as a
snapshot every `snapshot_every` steps and when a node asks (in the screen time
the steps leave), at once after resuming (ahead of the steps' words), and,
when the room has observers, once more after the last step (`final`, its
step one past the last: the run's end state, for an observer that missed a
word near the end), and writes a checkpoint every `checkpoint_every` updates.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import structlog
import torch

from protocols import snapshot as snap
from protocols import sync
from protocols.messages import (AveragedGradient, LocalGradient, ScheduleChanged, ScheduleDone, ScheduleKnown,
                                SendTensor, Snapshot, StepSkipped, TensorReceived, Tick)
from protocols.security import NO_KEY, RoomKey
from wccl.compression import Codec, ErrorFeedback, get_codec
from wccl.runtime.actor import Actor, ActorContext, Overflow
from protocols.registry import REGISTRY
from wccl.runtime.recovery import save_checkpoint
from wccl.training.exchange import reduce
from wccl.runtime.schedule import DEADLINE_STEPS, Schedule


class ParameterServer(Actor):
    consumes = (ScheduleKnown, ScheduleChanged, Tick, LocalGradient, TensorReceived, ScheduleDone)
    on_schedule = True
    mailbox = (256, Overflow.BLOCK)

    def __init__(self, ctx: ActorContext, workers: list[str], quorum: int, numel: int, replica: Any,
                 snapshot_every: int = 10, checkpoint_every: int = 0, checkpoint: Path | None = None,
                 session: int = 0, key: RoomKey = NO_KEY, resume: tuple[dict, snap.Snapshot, bytes] | None = None,
                 codec: Codec | None = None, compute_scale: float = 1.0, observed: bool = False) -> None:
        """`observed`: the room has observers, which overhear its words and snapshots (they linger on its
        screen once the workers have them: protocols.planner)."""
        super().__init__(ctx)
        if not 1 <= quorum <= len(workers):
            raise ValueError(f"quorum must be between 1 and {len(workers)}")
        self.roster = tuple(workers)  # every worker of the room file
        self.workers = workers  # those whose gradients a step waits for: in the room
        self.others = tuple(w for w in workers if w != ctx.node)  # the workers its word goes to over the light
        self.quorum = quorum
        self.numel = numel
        self.codec = codec or get_codec("bf16")  # the run's gradient codec (wccl.training.exchange)
        self.downlink = ErrorFeedback(self.codec)  # the average's error feedback (the server's own)
        self.replica = replica  # the server's own copy of the training state
        self.snapshot_every = snapshot_every
        self.checkpoint_every = checkpoint_every
        self.checkpoint = checkpoint
        self.session = session
        self.key = key
        self.resume = resume
        self.compute_scale = compute_scale
        self.observed = observed
        self.local_worker = ctx.node in workers
        self.schedule: Schedule | None = None
        self.epoch = 0
        self.applied = 0
        self._grads: dict[int, dict[str, tuple[int, bytes]]] = {}  # step -> worker -> (base, gradient)
        self._step = -1  # the step whose gradients are being collected
        self._reduced = -1  # the last step reduced (or skipped)
        self._snapshot_due: tuple[str, tuple[str, ...]] | None = None  # (why, to whom)
        self.results = ctx.results.setdefault("server", {"reduced": 0, "gradient_missing": 0, "gradient_nonfinite": 0,
                                                         "skipped": 0, "gradient_undecodable": 0, "bytes_sent": 0,
                                                         "gradient_stale": 0, "snapshots_shown": 0,
                                                         "checkpoints": 0})

    async def handle(self, msg: Any) -> None:
        if isinstance(msg, ScheduleKnown):
            await self._schedule_known(msg)
        elif isinstance(msg, ScheduleChanged):
            if self.schedule is not None:
                self.schedule = self.schedule.then(msg.first_step, msg.t0, msg.phases)
        elif isinstance(msg, LocalGradient):
            await self._gradient(self.ctx.node, msg.step, msg.epoch, msg.base, msg.payload)
        elif isinstance(msg, TensorReceived):
            if msg.stream == "grad" and msg.origin in self.workers:
                await self._gradient(msg.origin, msg.step, msg.epoch, msg.base, msg.payload)
            elif msg.stream == "sync":
                await self._hello(msg)
        elif isinstance(msg, Tick):
            structlog.contextvars.bind_contextvars(step=msg.step)
            if msg.phase == "compute":
                self._step = msg.step
                if self._snapshot_due is None and msg.step % self.snapshot_every == 0 and msg.step > 0:
                    self._snapshot_due = ("periodic", self.others)
                await self._send_snapshot(msg.step)
                await self._reduce_complete()
            elif msg.phase == "reduce":
                # A step's deadline is the reduce tick DEADLINE_STEPS steps later: a slow round costs time,
                # not the step.
                for step in range(self._reduced + 1, msg.step - DEADLINE_STEPS + 1):
                    await self._reduce(step)
                await self._reduce_complete()
        elif isinstance(msg, ScheduleDone):
            for step in range(self._reduced + 1, msg.steps):  # the schedule ends at the last step's deadline
                await self._reduce(step)
            if self.observed:  # (shown while the node drains; one still due to a node goes as this one)
                self._snapshot_due = ("final", self._snapshot_due[1] if self._snapshot_due else ())
                await self._send_snapshot(msg.steps)

    async def _schedule_known(self, msg: ScheduleKnown) -> None:
        self.schedule = Schedule(t0=msg.t0, phases=msg.phases, first_step=msg.first_step)
        if msg.absent:  # (the room started without them: no step waits for them until they join)
            self.workers = [w for w in self.workers if w not in msg.absent]
        self.epoch = msg.epoch
        self._reduced = max(self._reduced, msg.join_step - 1)  # (steps before this node's first are not its)
        if self.resume is not None:
            meta, state, rng = self.resume
            self.resume = None
            self.replica.import_state(state.arrays)
            self.applied = state.applied
            torch.set_rng_state(torch.frombuffer(bytearray(rng), dtype=torch.uint8))
            self._snapshot_due = ("resumed", self.others)
            self.log.info("server_resumed", applied=self.applied, epoch=self.epoch, checkpoint=str(self.checkpoint))
            if self.local_worker:
                await self.emit(Snapshot(**self.message_fields(msg.step), payload=self._state_bytes()))
            await self._send_snapshot(msg.step)  # (at once: no worker's gradient counts until it has it)
        else:
            self.applied = msg.applied

    async def _gradient(self, origin: str, step: int, epoch: int, base: int, payload: bytes) -> None:
        if epoch != self.epoch or base != self.applied or step <= self._reduced:
            self.results["gradient_stale"] += 1
            self.log.info("gradient_stale", origin=origin, epoch=epoch, base=base, server_epoch=self.epoch,
                          server_applied=self.applied)
            return
        self._grads.setdefault(step, {})[origin] = (base, payload)
        await self._reduce_complete()

    async def _reduce_complete(self) -> None:
        """Reduce, in order, the steps whose every gradient is in (up to the step the schedule is at)."""
        while (step := self._reduced + 1) <= self._step and len(self._grads.get(step, {})) == len(self.workers):
            await self._reduce(step)

    async def _hello(self, msg: TensorReceived) -> None:
        try:
            payload = sync.decode(msg.payload)
        except sync.SyncError:
            return
        if isinstance(payload, sync.Hello) and msg.origin in self.roster and msg.origin not in self.workers:
            # A worker the room started without has joined: its gradients count from now on.
            self.workers = [w for w in self.roster if w in self.workers or w == msg.origin]
            self.log.info("worker_joined", worker=msg.origin, workers=list(self.workers))
        if isinstance(payload, sync.Hello) and payload.wants_snapshot:
            why, to = self._snapshot_due or (f"asked_by_{msg.origin}", ())
            self._snapshot_due = (why, tuple(sorted(set(to) | {msg.origin})))
            await self._send_snapshot(self._step)

    def _state_bytes(self) -> bytes:
        return snap.encode_snapshot(snap.Snapshot(self.applied, self.epoch, self.replica.export_state()))

    async def _send_snapshot(self, step: int) -> None:
        """The training state, to the nodes it is due to (observers overhear it). In the screen time the
        steps' words leave (a snapshot never holds a step back), except after the server resumed: then no
        worker's gradient counts until it has the snapshot, and it goes first."""
        if self._snapshot_due is None or self.schedule is None:
            return
        why, to = self._snapshot_due
        self._snapshot_due = None
        payload = self._state_bytes()
        self.results["snapshots_shown"] += 1
        self.log.info("snapshot_shown", reason=why, applied=self.applied, epoch=self.epoch, bytes=len(payload),
                      to=list(to))
        await self.emit(SendTensor(**self.message_fields(max(0, step)), stream="params", to=to, payload=payload,
                                   epoch=self.epoch, base=self.applied, background=why != "resumed",
                                   overheard=self.observed))

    async def _reduce(self, step: int) -> None:
        """Average what arrived for `step` (the quorum's rule) and send the word on it."""
        if step <= self._reduced:
            return
        self._reduced = step
        got = {}
        for origin, (base, payload) in self._grads.pop(step, {}).items():
            if base == self.applied:
                got[origin] = payload
                continue
            # Current when it came, but an earlier step was reduced since: never averaged into a later state.
            self.results["gradient_stale"] += 1
            self.log.info("gradient_stale", origin=origin, epoch=self.epoch, base=base, server_epoch=self.epoch,
                          server_applied=self.applied)
        for old in [s for s in self._grads if s < step]:
            del self._grads[old]
        missing = [w for w in self.workers if w not in got]
        if missing:
            self.results["gradient_missing"] += len(missing)
            self.log.warning("gradient_missing", step=step, missing=missing, arrived=sorted(got))
        start, cpu0 = self.clock.now(), time.thread_time()
        r = reduce(self.codec, got, self.numel, self.downlink, self.quorum)
        if r.undecodable:
            # Not this run's codec or size (a worker configured otherwise): never averaged in.
            self.results["gradient_undecodable"] += len(r.undecodable)
            self.log.error("gradient_undecodable", workers=r.undecodable, codec=self.codec.describe())
        if r.nonfinite:
            # NaN or Inf (a bad batch, a bad peer): never averaged in; the step goes on without them.
            self.results["gradient_nonfinite"] += len(r.nonfinite)
            self.log.warning("gradient_nonfinite", workers=r.nonfinite, step=step)
        payload = r.payload if r.payload is not None else b""
        base = self.applied
        if r.payload is not None:
            self.replica.apply(r.average)
            self.applied += 1
            self.results["reduced"] += 1
        await self.clock.sleep_until(start + (time.thread_time() - cpu0) * self.compute_scale)
        fields = self.message_fields(step)
        if self.local_worker:
            await self.emit(AveragedGradient(**fields, payload=payload, contributors=tuple(r.used), epoch=self.epoch,
                                             base=base))
        await self.emit(SendTensor(**fields, stream="avg", to=self.others, payload=payload, epoch=self.epoch,
                                   base=base, overheard=self.observed))
        if r.payload is None:
            self.results["skipped"] += 1
            self.log.warning("step_skipped", step=step, arrived=len(got), usable=len(r.used), quorum=self.quorum)
            await self.emit(StepSkipped(**fields))
            return
        self.results["bytes_sent"] += len(payload)
        self.log.info("gradients_averaged", step=step, contributors=list(r.used), applied=self.applied,
                      bytes=len(payload))
        if self.checkpoint is not None and self.checkpoint_every and self.applied % self.checkpoint_every == 0:
            meta = dict(session=self.session, node=self.ctx.node, t0_us=round(self.schedule.t0 * 1e6),
                        first_step=self.schedule.first_step, phases=[list(p) for p in self.schedule.phases])
            state = snap.Snapshot(self.applied, self.epoch, self.replica.export_state())
            save_checkpoint(self.checkpoint, meta, state, bytes(torch.get_rng_state().numpy()), self.key)
            self.results["checkpoints"] += 1
            self.log.info("checkpoint_written", applied=self.applied, path=str(self.checkpoint))

    async def finish(self) -> None:
        self.results.update(applied=self.applied, epoch=self.epoch,
                            state_digest=snap.state_digest(self.replica.export_state()))


REGISTRY.register("actor.parameter_server", "standard", ParameterServer)
