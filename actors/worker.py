"""Worker: one data-parallel replica that trains in lockstep with the others.

Consumes: `ScheduleKnown` (the schedule, the server's epoch, the step this
node joins at), `Tick` (compute: this step's gradient is due),
`TensorReceived` (the server's word on each step and its snapshots, read
off its screen), `AveragedGradient` and `Snapshot` (the same, when the
server is on this node), `ScheduleDone`.
Emits: `LocalGradient` when the server is on this node, otherwise
`SendTensor` (the gradient, an acknowledged transfer to the server).

Each step, from its compute tick and once the server's word on the step
before has arrived (an average, applied at once, or "skipped": the state
stays), the worker computes its gradient (a word that came late, after
later compute ticks, still has the next step computed, unless the server
stopped waiting for it: wccl.runtime.schedule.DEADLINE_STEPS; the worker catches
up step by step), encodes it with the run's codec
through its own error feedback (`[training] codec`, wccl.training.exchange)
and sends it; the compute is charged to the node's clock at the CPU time it
took (times `compute_scale`). A training loss that turns non-finite or
climbs above where it started is logged once (`training_diverging`, with
the reason; wccl.training.divergence).

The replica's state is numbered by the updates it has seen (`applied`) and
the server's epoch. A gradient says which state it was computed on (`base`),
and an average which state it applies to: an average is applied only to the
state it was made for. A word that has not come by the compute tick
DEADLINE_STEPS + 2 steps later is counted
(`average_missing`), never guessed; the replica is then
behind, and the server's next snapshot (`snapshot_adopted`) brings it back.
A worker that joins late, or sees a new server epoch (the server resumed
from a checkpoint), computes nothing until it has a snapshot; it then
applies the averages it kept since, and trains in lockstep again.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import structlog

from protocols import snapshot as snap
from protocols.messages import (AveragedGradient, LocalGradient, ScheduleChanged, ScheduleDone, ScheduleKnown,
                                SendTensor, Snapshot, TensorReceived, Tick)
from wccl.compression import Codec, CodecError, ErrorFeedback, get_codec
from wccl.runtime.actor import Actor, ActorContext
from protocols.registry import REGISTRY
from wccl.training.divergence import HINT, DivergenceWatch
from wccl.runtime.schedule import DEADLINE_STEPS, Schedule

KEEP_AVERAGES = 256  # averages kept for catching up after a snapshot
KEEP_DIGESTS = 64  # digests of own states kept, to check snapshots against


class Worker(Actor):
    consumes = (ScheduleKnown, ScheduleChanged, Tick, TensorReceived, AveragedGradient, Snapshot, ScheduleDone)
    on_schedule = True

    def __init__(self, ctx: ActorContext, replica: Any, server: str, eval_every: int = 1,
                 codec: Codec | None = None, compute_scale: float = 1.0) -> None:
        super().__init__(ctx)
        self.watch = DivergenceWatch()
        self.replica = replica
        self.codec = codec or get_codec("bf16")
        self.encoder = ErrorFeedback(self.codec)  # this worker's error feedback (local: replicas never need it)
        self.server = server
        self.local_server = server == ctx.node
        self.eval_every = eval_every
        self.compute_scale = compute_scale
        self.numel = replica.numel
        self._due: int | None = None  # the latest step whose compute tick came
        self._next = 0  # the first step this worker has not computed (or passed over)
        self._open: tuple[int, int, int] | None = None  # (step, epoch, base) of the gradient sent, word not yet in
        self._server_at = (0, 0)  # the latest (epoch, update count) of the server's this worker has heard of
        self._done = False  # the schedule ran its last step
        self.schedule: Schedule | None = None
        self.epoch = 0
        self.applied = 0
        self.has_state = False
        self._averages: dict[tuple[int, int], tuple[int, bytes]] = {}  # (epoch, base) -> (step, average)
        self._digests: dict[int, str] = {}
        self._losses: dict[int, float] = {}
        self.results = ctx.results.setdefault("worker", {"applied": 0, "average_missing": 0, "snapshots_adopted": 0,
                                                         "steps_without_state": 0, "average_undecodable": 0,
                                                         "bytes_sent": 0, "skipped": 0, "steps_behind": 0})

    async def handle(self, msg: Any) -> None:
        if isinstance(msg, ScheduleKnown):
            self._schedule_known(msg)
        elif isinstance(msg, ScheduleChanged):
            if self.schedule is not None:
                self.schedule = self.schedule.then(msg.first_step, msg.t0, msg.phases)
        elif isinstance(msg, Tick):
            if msg.phase == "compute":
                structlog.contextvars.bind_contextvars(step=msg.step)
                if self._open is not None and self._open[0] < msg.step - DEADLINE_STEPS - 1:
                    self._word_missing()  # (a step's word is due by its deadline, and its way here)
                self._due = msg.step
        elif isinstance(msg, AveragedGradient):
            self._word(msg.step, msg.epoch, msg.base, msg.payload)
        elif isinstance(msg, Snapshot):
            self._snapshot(msg.payload, "local")
        elif isinstance(msg, TensorReceived):
            if msg.origin != self.server:
                return
            if msg.stream == "avg":
                self._word(msg.step, msg.epoch, msg.base, msg.payload)
            elif msg.stream == "params":
                self._snapshot(msg.payload, "light")
        elif isinstance(msg, ScheduleDone):
            self._done = True  # (words still on their way are applied until the node ends: see finish)
            return
        await self._maybe_compute()

    def _schedule_known(self, msg: ScheduleKnown) -> None:
        self.schedule = Schedule(t0=msg.t0, phases=msg.phases, first_step=msg.first_step)
        self._next = max(self._next, msg.join_step)
        if self.has_state and msg.epoch == self.epoch:
            return
        self.epoch = msg.epoch
        self._open = None  # (a word on a step of another epoch will not come)
        # A fresh run: every replica starts from the same seed, the state of 0 updates. Otherwise wait
        # for the server's snapshot.
        self.has_state = msg.join_step == 0 and msg.applied == 0
        self.applied = 0
        if self.has_state:
            self._digests[0] = snap.state_digest(self.replica.export_state())
        else:
            self.log.info("waiting_for_snapshot", epoch=msg.epoch, server_applied=msg.applied,
                          join_step=msg.join_step)

    def _keep_average(self, step: int, epoch: int, base: int, payload: bytes) -> None:
        self._averages[(epoch, base)] = (step, payload)
        if len(self._averages) > KEEP_AVERAGES:
            del self._averages[min(self._averages, key=lambda k: (k[0], k[1]))]

    def _word(self, step: int, epoch: int, base: int, payload: bytes) -> None:
        """The server's word on a step: apply it if it is for this replica's state, else keep it."""
        if self._open is not None and epoch == self._open[1] and step >= self._open[0]:
            # The word on the step in flight, or on a later one: the server is done with it. (Not a word on an
            # earlier step: the words on skipped steps all name the same state.)
            self._open = None
        self._server_at = max(self._server_at, (epoch, base + 1 if payload else base))
        if not self.has_state or (epoch, base) != (self.epoch, self.applied):
            if payload:
                self._keep_average(step, epoch, base, payload)
            return
        if not payload:
            self.results["skipped"] += 1
            self.log.info("step_skipped_by_server", applied=self.applied)
            return
        avg = self._decode(payload)
        if avg is None:
            return
        self._apply_one(avg)
        loss = self._losses.pop(step, float("nan"))
        for old in [s for s in self._losses if s < step]:
            del self._losses[old]
        fields: dict[str, Any] = {"loss": round(loss, 4), "applied": self.applied}
        if self.eval_every and (step + 1) % self.eval_every == 0:
            acc, test_loss = self.replica.evaluate()  # for the logs: not charged
            fields.update(test_accuracy=round(acc, 4), test_loss=round(test_loss, 4))
        self.log.info("step_applied", step=step, **fields)

    def _word_missing(self) -> None:
        step = self._open[0]
        self._open = None
        self.results["average_missing"] += 1
        self.log.warning("average_missing", step=step, applied=self.applied)

    async def _maybe_compute(self) -> None:
        """Compute the due step's gradient once the word on the last one is in."""
        if self._due is None or self._open is not None or self.schedule is None:
            return
        if self._next > self._due:
            self._due = None  # (computed already)
            return
        # The first step not computed yet whose deadline has not passed (the server waits no longer for it).
        now, step = self.clock.now(), self._next
        while step < self._due and self.schedule.deadline(step) <= now:
            step += 1
        self._next = step + 1
        if step == self._due:
            self._due = None
        if not self.has_state:
            self.results["steps_without_state"] += 1
            return
        if (self.epoch, self.applied) < self._server_at:
            # Behind the server (words it has not applied yet are on their way, or a snapshot is): a gradient
            # of this state would be stale.
            self.results["steps_behind"] += 1
            return
        start, cpu0 = self.clock.now(), time.thread_time()
        grad, loss = self.replica.compute_gradient(step, raw=True)
        payload, _ = self.encoder.encode(grad)
        await self.clock.sleep_until(start + (time.thread_time() - cpu0) * self.compute_scale)
        self.results["bytes_sent"] += len(payload)
        self._losses[step] = loss
        why = self.watch.observe(loss)
        if why is not None:
            self.results["diverging"] = why
            self.log.warning("training_diverging", reason=why, hint=HINT, codec=self.codec.describe())
        fields = self.message_fields(step)
        self._open = (step, self.epoch, self.applied)
        if self.local_server:
            await self.emit(LocalGradient(**fields, payload=payload, loss=loss, epoch=self.epoch, base=self.applied))
        else:
            await self.emit(SendTensor(**fields, stream="grad", to=(self.server,), payload=payload,
                                       epoch=self.epoch, base=self.applied))
        self.log.debug("gradient_computed", loss=round(loss, 4), bytes=len(payload), base=self.applied)

    def _decode(self, payload: bytes):
        """The average's values, or None if they are not `numel` values of this run's codec (a server that
        runs another codec: a config error of the room, said once per step, never applied)."""
        try:
            return self.codec.decode(payload, self.numel)
        except CodecError as e:
            self.results["average_undecodable"] += 1
            self.log.error("average_undecodable", error=str(e), codec=self.codec.describe())
            return None

    def _apply_one(self, avg) -> None:
        self.replica.apply(avg)
        self.applied += 1
        self.results["applied"] += 1
        # (the room's true time of each update: what a lab measures step times by; the event loop's clock)
        self.results.setdefault("applied_at", []).append(round(asyncio.get_running_loop().time(), 3))
        self._digests[self.applied] = snap.state_digest(self.replica.export_state())
        for old in [a for a in self._digests if a < self.applied - KEEP_DIGESTS]:
            del self._digests[old]

    def _snapshot(self, payload: bytes, via: str) -> None:
        try:
            s = snap.decode_snapshot(payload)
        except snap.SnapshotError as e:
            self.log.warning("snapshot_rejected", error=str(e))
            return
        if self.has_state and s.epoch == self.epoch:
            mine = self._digests.get(s.applied)
            if s.applied <= self.applied and mine == s.digest():
                return  # the state it shows is one this replica went through: in lockstep
            if s.applied > self.applied or mine is not None:
                reason = "behind" if s.applied > self.applied else "state_mismatch"
            else:
                return  # too old to check
        else:
            reason = "no_state" if not self.has_state else "new_epoch"
        if s.epoch < self.epoch:
            return
        self.replica.import_state(s.arrays)
        self.epoch, self.applied, self.has_state = s.epoch, s.applied, True
        self._server_at = max(self._server_at, (s.epoch, s.applied))
        self._digests = {s.applied: s.digest()}
        self.encoder.reset()  # its residual belonged to the state just replaced
        caught_up = 0
        while (kept := self._averages.pop((self.epoch, self.applied), None)) is not None:
            avg = self._decode(kept[1])
            if avg is None:
                break
            self._apply_one(avg)
            caught_up += 1
        self.results["snapshots_adopted"] += 1
        self.log.info("snapshot_adopted", reason=reason, via=via, snapshot_applied=s.applied, epoch=s.epoch,
                      caught_up=caught_up, applied=self.applied)

    async def finish(self) -> None:
        """The node ends (once its last transfers are acknowledged): the replica as it is now."""
        if not self._done:
            return  # (stopped, or restarted after a failure: no final figures)
        if self._open is not None:
            self._word_missing()
        self._final()

    def _final(self) -> None:
        acc, test_loss = self.replica.evaluate()
        params = self.replica.parameters_flat()
        self.results.update(test_accuracy=acc, test_loss=test_loss, state_applied=self.applied, epoch=self.epoch,
                            params_sha256=hashlib.sha256(params.numpy().tobytes()).hexdigest())
        self.log.info("worker_finished", test_accuracy=round(acc, 4), applied=self.results["applied"],
                      average_missing=self.results["average_missing"], state_applied=self.applied)


REGISTRY.register("actor.worker", "standard", Worker)
