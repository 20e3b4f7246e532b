"""Worker: one data-parallel replica that trains in lockstep with the others.

Consumes: `Tick` (compute: make this step's gradient; apply: apply the
averaged gradient), `TensorReceived` (the server's averaged gradient, read
off its screen), `AveragedGradient` (the same, when the server is on this
node), `ScheduleDone`.
Emits: `LocalGradient` when the server is on this node, otherwise `Show`
(the gradient, on this node's screen during the uplink phase).

A step whose average never arrived is skipped on this replica and counted
(`average_missing`); it is never applied from a guess.
"""

from __future__ import annotations

import hashlib
from typing import Any

import structlog

from protocols.messages import AveragedGradient, LocalGradient, ScheduleDone, Show, TensorReceived, Tick
from protocols.tensors import bf16_to_bytes, bytes_to_bf16
from wccl.actor import Actor, ActorContext
from wccl.schedule import Schedule


class Worker(Actor):
    consumes = (Tick, TensorReceived, AveragedGradient, ScheduleDone)

    def __init__(self, ctx: ActorContext, replica: Any, schedule: Schedule, server: str,
                 eval_every: int = 1) -> None:
        super().__init__(ctx)
        self.replica = replica
        self.schedule = schedule
        self.server = server
        self.local_server = server == ctx.node
        self.eval_every = eval_every
        self.numel = replica.numel
        self._averages: dict[int, bytes] = {}
        self._losses: dict[int, float] = {}
        self.results = ctx.results.setdefault("worker", {"applied": 0, "average_missing": 0})

    async def handle(self, msg: Any) -> None:
        if isinstance(msg, Tick):
            structlog.contextvars.bind_contextvars(step=msg.step)
            if msg.phase == "compute":
                await self._compute(msg.step)
            elif msg.phase == "apply":
                self._apply(msg.step)
        elif isinstance(msg, AveragedGradient):
            self._averages[msg.step] = msg.payload
        elif isinstance(msg, TensorReceived):
            if msg.stream == "avg" and msg.origin == self.server:
                self._averages[msg.step] = msg.payload
        elif isinstance(msg, ScheduleDone):
            self._final()

    async def _compute(self, step: int) -> None:
        grad, loss = self.replica.compute_gradient(step)
        payload = bf16_to_bytes(grad)
        self._losses[step] = loss
        fields = self.message_fields(step)
        if self.local_server:
            await self.emit(LocalGradient(**fields, payload=payload, loss=loss))
        else:
            w = self.schedule.window(step, "uplink")
            await self.emit(Show(**fields, stream="grad", payload=payload, start=w.start, end=w.end))
        self.log.debug("gradient_computed", loss=round(loss, 4), bytes=len(payload))

    def _apply(self, step: int) -> None:
        payload = self._averages.pop(step, None)
        for old in [s for s in self._averages if s < step]:
            del self._averages[old]
        loss = self._losses.pop(step, float("nan"))
        if payload is None:
            self.results["average_missing"] += 1
            self.log.warning("average_missing", loss=round(loss, 4))
            return
        self.replica.apply(bytes_to_bf16(payload, self.numel))
        self.results["applied"] += 1
        fields: dict[str, Any] = {"loss": round(loss, 4)}
        if self.eval_every and (step + 1) % self.eval_every == 0:
            acc, test_loss = self.replica.evaluate()
            fields.update(test_accuracy=round(acc, 4), test_loss=round(test_loss, 4))
        self.log.info("step_applied", **fields)

    def _final(self) -> None:
        acc, test_loss = self.replica.evaluate()
        params = self.replica.parameters_flat()
        self.results.update(test_accuracy=acc, test_loss=test_loss,
                            params_sha256=hashlib.sha256(params.numpy().tobytes()).hexdigest())
        self.log.info("worker_finished", test_accuracy=round(acc, 4), applied=self.results["applied"],
                      average_missing=self.results["average_missing"])
