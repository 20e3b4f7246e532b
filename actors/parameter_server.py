"""ParameterServer: averages the workers' gradients each step and shows the result.

Consumes: `LocalGradient` (from the worker on this node), `TensorReceived`
(workers' gradients read off their screens), `Tick` (reduce: average what
arrived), `ScheduleDone`.
Emits: `AveragedGradient` for the worker on this node (if any) and `Show`
(the average, on this node's screen during the downlink phase).

A worker whose gradient missed the reduce deadline is logged
(`gradient_missing`); the server averages what arrived if at least `quorum`
workers made it, otherwise skips the step (`step_skipped`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
import torch

from protocols.messages import AveragedGradient, LocalGradient, ScheduleDone, Show, TensorReceived, Tick
from protocols.tensors import bf16_to_bytes, bytes_to_bf16
from wccl.actor import Actor, ActorContext
from wccl.schedule import Schedule


class ParameterServer(Actor):
    consumes = (Tick, LocalGradient, TensorReceived, ScheduleDone)

    def __init__(self, ctx: ActorContext, workers: list[str], quorum: int, schedule: Schedule,
                 numel: int, average: Callable[[dict[str, torch.Tensor]], torch.Tensor]) -> None:
        super().__init__(ctx)
        if not 1 <= quorum <= len(workers):
            raise ValueError(f"quorum must be between 1 and {len(workers)}")
        self.workers = workers
        self.quorum = quorum
        self.schedule = schedule
        self.numel = numel
        self.average = average
        self.local_worker = ctx.node in workers
        self._grads: dict[int, dict[str, bytes]] = {}
        self.results = ctx.results.setdefault("server", {"reduced": 0, "gradient_missing": 0, "skipped": 0})

    async def handle(self, msg: Any) -> None:
        if isinstance(msg, LocalGradient):
            self._grads.setdefault(msg.step, {})[self.ctx.node] = msg.payload
        elif isinstance(msg, TensorReceived):
            if msg.stream == "grad" and msg.origin in self.workers:
                self._grads.setdefault(msg.step, {})[msg.origin] = msg.payload
        elif isinstance(msg, Tick) and msg.phase == "reduce":
            structlog.contextvars.bind_contextvars(step=msg.step)
            await self._reduce(msg.step)

    async def _reduce(self, step: int) -> None:
        got = self._grads.pop(step, {})
        for old in [s for s in self._grads if s < step]:
            del self._grads[old]
        missing = [w for w in self.workers if w not in got]
        if missing:
            self.results["gradient_missing"] += len(missing)
            self.log.warning("gradient_missing", missing=missing, arrived=sorted(got))
        if len(got) < self.quorum:
            self.results["skipped"] += 1
            self.log.warning("step_skipped", arrived=len(got), quorum=self.quorum)
            return
        avg = self.average({w: bytes_to_bf16(p, self.numel) for w, p in got.items()})
        payload = bf16_to_bytes(avg)
        fields = self.message_fields(step)
        contributors = tuple(sorted(got))
        if self.local_worker:
            await self.emit(AveragedGradient(**fields, payload=payload, contributors=contributors))
        w = self.schedule.window(step, "downlink")
        await self.emit(Show(**fields, stream="avg", payload=payload, start=w.start, end=w.end))
        self.results["reduced"] += 1
        self.log.info("gradients_averaged", contributors=list(contributors))
