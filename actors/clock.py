"""Clock: publishes the step schedule as `Tick`s off the node's clock.

Consumes: nothing yet (optical clock sync comes with the sync issue).
Emits: `Tick` at the absolute start of every phase of every step, then
`ScheduleDone` once the last step's last phase has ended. Restarted, it
resumes with the first phase that has not started yet.
"""

from __future__ import annotations

import structlog

from protocols.messages import ScheduleDone, Tick
from wccl.actor import Actor, ActorContext
from wccl.schedule import Schedule


class Clock(Actor):
    consumes = ()

    def __init__(self, ctx: ActorContext, schedule: Schedule, steps: int) -> None:
        super().__init__(ctx)
        self.schedule = schedule
        self.steps = steps

    async def run(self) -> None:
        now = self.clock.now()
        first = max(0, self.schedule.step_at(now))
        for step in range(first, self.steps):
            for w in self.schedule.windows(step):
                if w.start < now:
                    continue  # already past (a restart mid-step)
                await self.clock.sleep_until(w.start)
                structlog.contextvars.bind_contextvars(step=step)
                await self.emit(Tick(sender=self.ctx.node, step=step, time=self.clock.now(),
                                     phase=w.phase, start=w.start, end=w.end))
        end = self.schedule.t0 + self.steps * self.schedule.period
        await self.clock.sleep_until(end)
        await self.emit(ScheduleDone(sender=self.ctx.node, step=self.steps - 1, time=self.clock.now(),
                                     steps=self.steps))
        self.log.info("schedule_done", steps=self.steps)
