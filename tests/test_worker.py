"""The Worker actor alone, on a virtual clock: a word that comes late costs time, not the step."""

from __future__ import annotations

import torch

from conftest import run_virtual
from wccl.compression import get_codec
from protocols.messages import AveragedGradient, LocalGradient, ScheduleKnown, Tick
from wccl.runtime.actor import ActorContext, Mailbox
from wccl.runtime.schedule import Schedule
from wccl.runtime.timebase import NodeClock
from actors.worker import Worker

PHASES = (("compute", 0.1), ("uplink", 0.3), ("reduce", 0.1), ("downlink", 0.3), ("apply", 0.2))  # 1 s steps


class Replica:
    """What a worker needs of its model: gradients (their step's number in every value), an update count."""

    numel = 4

    def __init__(self) -> None:
        self.updates = 0

    def compute_gradient(self, step: int, raw: bool = True):
        return torch.full((self.numel,), float(step)), 1.0

    def apply(self, avg) -> None:
        self.updates += 1

    def export_state(self):
        return {"w": torch.full((self.numel,), float(self.updates)).numpy()}

    def evaluate(self):
        return 0.5, 1.0


async def _worker():
    """A worker beside its server (alice), on a virtual clock with 1 s steps from 0: the clock, the worker, the
    gradients it sends, and the compute tick of a step."""
    clock = NodeClock()
    sent: list[LocalGradient] = []

    async def emit(msg):
        if isinstance(msg, LocalGradient):
            sent.append(msg)

    ctx = ActorContext("alice", "worker", clock, Mailbox("worker", 64, "block"), emit)
    w = Worker(ctx, Replica(), server="alice", eval_every=0, codec=get_codec("fp32"))
    schedule = Schedule(0.0, PHASES)
    await w.handle(ScheduleKnown(sender="alice", step=0, time=0.0, t0=0.0, phases=PHASES, steps=10, epoch=0,
                                 applied=0, join_step=0))

    async def tick(step: int) -> None:
        win = schedule.window(step, "compute")
        await clock.sleep_until(win.start)
        await w.handle(Tick(sender="alice", step=step, time=clock.now(), phase="compute", start=win.start,
                            end=win.end))

    return clock, w, sent, tick


def test_a_late_word_has_the_next_step_computed_when_it_comes_until_the_server_stops_waiting():
    async def go():
        clock, w, sent, tick = await _worker()

        async def word(step: int) -> None:
            payload = get_codec("fp32").encode(torch.zeros(4))
            await w.handle(AveragedGradient(sender="alice", step=step, time=clock.now(), payload=payload,
                                            contributors=("alice",), epoch=0, base=w.applied))

        await tick(0)
        assert [g.step for g in sent] == [0]
        await tick(1)  # the word on step 0 is late: nothing computed yet
        await tick(2)
        assert [g.step for g in sent] == [0]
        await word(0)  # it comes before step 1's deadline: step 1 is computed now, then step 2 once its word is in
        assert [g.step for g in sent] == [0, 1]
        await word(1)
        assert [g.step for g in sent] == [0, 1, 2]
        await word(2)
        await tick(3)
        assert [g.step for g in sent] == [0, 1, 2, 3]
        # A word that comes after the next step's deadline: that step is passed over (the server has given
        # up on it), and the first step it still waits for is computed.
        for s in (4, 5, 6):
            await tick(s)
        await clock.sleep_until(Schedule(0.0, PHASES).deadline(4) + 0.01)
        await word(3)
        assert [g.step for g in sent][-1] == 5 and 4 not in [g.step for g in sent], [g.step for g in sent]

    run_virtual(go)


def test_a_late_word_on_an_earlier_step_does_not_stand_for_the_word_on_the_open_one():
    """The server's word on a skipped step leaves the state where it was, so the words on several skipped steps
    name the same state. One that comes late, after the worker sent its gradient on a later step, is not the
    word on that step: the worker still waits for it (and computes no second gradient on the same state,
    which the server would average into a later state)."""
    async def go():
        clock, w, sent, tick = await _worker()

        async def skipped(step: int) -> None:  # the server's word: step skipped, the state stays
            await w.handle(AveragedGradient(sender="alice", step=step, time=clock.now(), payload=b"",
                                            contributors=(), epoch=0, base=0))

        await tick(0)
        await tick(1)
        await skipped(0)  # step 1 is computed now, on the state of 0 updates
        assert [(g.step, g.base) for g in sent] == [(0, 0), (1, 0)]
        await tick(2)
        await skipped(0)  # the word on step 0 again (read late): not the word on step 1
        assert [g.step for g in sent] == [0, 1]
        await skipped(1)
        assert [(g.step, g.base) for g in sent] == [(0, 0), (1, 0), (2, 0)]

    run_virtual(go)
