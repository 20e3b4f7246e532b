"""Mailboxes, virtual time, node clocks and the schedule's deadlines."""

from __future__ import annotations

import asyncio
import time

import pytest

from actors.clock import Clock
from protocols import sync
from protocols.messages import Capture, Drain, ScheduleDone, SendTensor, Tick
from wccl.runtime.actor import Mailbox, MailboxClosed, Overflow
from wccl.runtime.harness import ActorHarness
from wccl.runtime.schedule import Schedule
from wccl.runtime.timebase import NodeClock, VirtualTimeLoop, new_loop

from conftest import run_virtual


def _cap(i: int):
    import numpy as np

    return Capture(sender="n", time=0.0, image=np.zeros((2, 2, 3), np.uint8), seq=i)


def _tick(step: int):
    return Tick(sender="n", step=step, time=0.0, phase="compute", start=0.0, end=1.0)


def test_mailbox_drop_oldest_counts_and_keeps_newest():
    async def go():
        box = Mailbox("m", 2, Overflow.DROP_OLDEST)
        for i in range(5):
            await box.put(_cap(i))
        await box.close()
        return box.dropped, [m.seq async for m in box]

    dropped, seqs = run_virtual(go)
    assert dropped == 3 and seqs == [3, 4]


def test_mailbox_drop_newest_and_control_priority():
    async def go():
        box = Mailbox("m", 1, Overflow.DROP_NEWEST)
        await box.put(_cap(0))
        await box.put(_cap(1))  # dropped
        await box.put(_tick(7))  # control: never waits behind data, never dropped
        await box.close()
        return box.dropped, [type(m).__name__ async for m in box]

    dropped, kinds = run_virtual(go)
    assert dropped == 1 and kinds == ["Tick", "Capture"]


def test_mailbox_block_waits_for_room_and_close_ends_readers_and_writers():
    async def go():
        box = Mailbox("m", 1, Overflow.BLOCK)
        await box.put(_cap(0))
        writer = asyncio.create_task(box.put(_cap(1)))
        await asyncio.sleep(0.1)
        assert not writer.done()  # back-pressure
        first = await box.get()
        await writer
        second = await box.get()
        late = asyncio.create_task(box.get())
        await asyncio.sleep(0)
        await box.close()
        with pytest.raises(MailboxClosed):
            await late
        with pytest.raises(MailboxClosed):
            await box.put(_cap(2))
        return first.seq, second.seq

    assert run_virtual(go) == (0, 1)


def test_virtual_time_jumps_and_costs_no_wall_time():
    async def go():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.sleep(3600)
        return loop.time() - t0

    wall = time.perf_counter()
    assert run_virtual(go) == pytest.approx(3600)
    assert time.perf_counter() - wall < 5


def test_virtual_time_waits_for_executor_jobs():
    async def go():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        timer = asyncio.create_task(asyncio.sleep(100))
        await asyncio.to_thread(time.sleep, 0.2)  # real work in a thread must not be skipped over
        advanced = loop.time() - t0
        await timer
        return advanced

    assert run_virtual(go) < 1.0


def test_new_loop_modes():
    assert isinstance(new_loop("virtual"), VirtualTimeLoop)
    loop = new_loop("realtime")
    assert not isinstance(loop, VirtualTimeLoop)
    loop.close()
    with pytest.raises(ValueError):
        new_loop("sundial")


def test_node_clock_offset_drift_and_absolute_deadlines():
    async def go():
        clock = NodeClock(offset=5.0, drift_ppm=100.0, origin=0.0)
        assert clock.now() == pytest.approx(5.0)
        await clock.sleep_until(15.0)
        loop_t = asyncio.get_running_loop().time()
        return clock.now(), loop_t

    now, loop_t = run_virtual(go)
    assert now == pytest.approx(15.0, abs=1e-9)
    assert loop_t == pytest.approx(10.0 / 1.0001)


def test_schedule_windows_are_absolute():
    s = Schedule(t0=1.0, phases=(("compute", 0.5), ("uplink", 3.0), ("reduce", 0.5), ("downlink", 3.0), ("apply", 1.0)))
    assert s.period == 8.0
    w = s.window(1000, "downlink")
    assert (w.start, w.end) == (1.0 + 8000 + 4.0, 1.0 + 8000 + 7.0)
    assert s.step_at(9.0) == 1 and s.step_at(0.5) == -1
    with pytest.raises(ValueError):
        Schedule(t0=0, phases=(("a", 0.0),))


def clock_deps(schedule: Schedule, steps: int, **over):
    """A parameter server's Clock with a fixed schedule starting at `schedule.t0` (the room greeted at 0)."""
    from wccl.config import SyncConfig

    greeted = asyncio.Event()
    greeted.set()
    deps = dict(server="alice", ranks=["alice", "bob"], steps=steps, phases=list(schedule.phases),
                start_s=schedule.t0, work_s=0.1, margin_frames=0, sync_cfg=SyncConfig(), greeted=greeted,
                greet_problem=lambda: "", greet_timeout_s=60.0, ladder=[], tensor_bytes=0)
    deps.update(over)
    return deps


def test_clock_actor_ticks_on_deadlines_under_virtual_time():
    schedule = Schedule(t0=1.0, phases=(("compute", 0.5), ("uplink", 3.0), ("reduce", 0.5), ("downlink", 3.0), ("apply", 1.0)))

    async def go():
        async with ActorHarness(Clock, node="alice", **clock_deps(schedule, steps=3)) as h:
            await h.task  # the clock ends by itself
            loop_end = asyncio.get_running_loop().time()
        return h.outputs, loop_end

    outs, loop_end = run_virtual(go)
    ticks = [m for m in outs if isinstance(m, Tick)]
    # 3 steps of 5 phases, then the reduce ticks of steps 3 and 4: the deadlines of steps 1 and 2
    assert len(ticks) == 17 and [(m.step, m.phase) for m in ticks[15:]] == [(3, "reduce"), (4, "reduce")]
    for m in ticks:
        w = schedule.window(m.step, m.phase)
        assert m.time == pytest.approx(w.start, abs=1e-9) and (m.start, m.end) == (w.start, w.end)
    assert [m.phase for m in ticks[:5]] == ["compute", "uplink", "reduce", "downlink", "apply"]
    assert isinstance(outs[-2], ScheduleDone) and outs[-2].steps == 3 and isinstance(outs[-1], Drain)
    # Once the room has greeted the server sends its announcement of the schedule to every node.
    sent = [m for m in outs if isinstance(m, SendTensor) and m.stream == "sync"]
    assert len(sent) == 1 and sent[0].to == ("bob",) and sent[0].time == pytest.approx(0.0)
    assert sync.decode(sent[0].payload).t0_us == 1_000_000
    # The schedule ends at its last step's deadline (the reduce tick DEADLINE_STEPS steps later), not at
    # the end of its last step (25 s): the last steps' gradients are awaited as long as every other's.
    assert loop_end == pytest.approx(schedule.deadline(2)) and schedule.deadline(2) == pytest.approx(1 + 4 * 8 + 3.5)
    assert outs[-2].time == pytest.approx(loop_end)


def test_a_terminal_gets_one_live_progress_line_under_the_log():
    import io
    import json

    import structlog

    from wccl.runtime.logs import configure_logging

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    configure_logging("console", "info", stream=term, progress=True)
    try:
        log = structlog.get_logger("wccl")
        log.info("run_started", steps=30)
        log.info("schedule_fixed", period_s=1.35)
        log.info("step_applied", step=4, test_accuracy=0.8125)
        log.info("link_report", frames_ok=18, frames_rejected={"uncorrectable": 2})
        log.info("clock_synced", err_ms=0.4)
        out = term.getvalue()
        *_, last = out.split("\n")
        assert last.rsplit("\r\x1b[K", 1)[-1] == ("wccl | step 5/30 | training | accuracy 0.812 | "
                                                  "link 90% of frames read | ~34 s left (room time)")
        assert out.count("\r\x1b[K") >= 2  # the line is cleared before each new log line, then redrawn
        assert "clock_synced" in out.split("\n")[-2]
        # At level info a terminal shows the headlines only; per-step detail at debug.
        assert "step_applied" not in out and "link_report" not in out
        debug = Terminal()
        configure_logging("console", "debug", stream=debug)
        structlog.get_logger("wccl").info("link_report", frames_ok=18)
        assert "link_report" in debug.getvalue()
    finally:
        pipe = io.StringIO()  # JSON lines elsewhere: no progress line, no control characters
        configure_logging("json", "info", stream=pipe)
        structlog.get_logger("wccl").info("step_applied", step=1)
        assert json.loads(pipe.getvalue())["event"] == "step_applied" and "\x1b" not in pipe.getvalue()


def test_the_schedule_sizes_a_way_of_several_hops_for_its_chunks_passed_on_as_they_arrive():
    """The Clock's phases (auto): a worker one hop from the server books its tensor's frames on that hop, as
    before; a line of laptops, whose tensors go in chunks each passed on as it arrives, books the first
    chunk on every hop and the rest at the slowest hop's pace: less than each hop's whole tensor one after
    another, more than the slowest hop's alone."""
    from actors.clock import Clock
    from protocols.algorithms import Sight
    from protocols.messages import SightKnown
    from wccl.runtime.actor import ActorContext, Mailbox
    from wccl.config import SyncConfig
    from wccl.distributed.rank_node import collective_ladder
    from conftest import make_config

    # the eight-laptop table's layout (tests/test_many_laptops.py): a frame carries about 200 bytes
    table = dict(choose="pinned", rows=28, cols=50, colours=8, cell_px=22, hold_s=0.083, code_rate=0.8)
    codec, hold = collective_ladder(make_config(link=table))[0]

    def phases(names, edges, nbytes):
        return run_virtual(lambda: _phases(names, edges, nbytes))

    async def _phases(names, edges, nbytes):
        ctx = ActorContext(node=names[0], actor="clock", clock=NodeClock(), inbox=Mailbox("c", 8, "block"),
                           emit=None)
        c = Clock(ctx, server=names[0], ranks=names, steps=1, phases=None, start_s=1.0, work_s=0.0, margin_frames=1,
                  sync_cfg=SyncConfig(), greeted=asyncio.Event(), greet_problem=lambda t: "", greet_timeout_s=1.0,
                  ladder=[(codec, hold)], tensor_bytes=nbytes)
        both = [(r, s, 1.0) for a, b in edges for r, s in ((a, b), (b, a))]
        c.sight = SightKnown(sender=names[0], time=0.0, edges=tuple(both))
        c.graph = Sight(len(names), {(r, s): q for r, s, q in both}, 0.0)
        c.others = names[1:]
        return dict(c._phases())

    nbytes = 8000
    whole = codec.frames_needed(nbytes, 2)
    pair = phases(["a", "b"], [(0, 1)], nbytes)
    assert pair["uplink"] == pytest.approx((whole + 1) * hold + hold)  # one hop: the whole tensor, its flight
    line = phases(["a", "b", "c", "d"], [(0, 1), (1, 2), (2, 3)], nbytes)
    whole = codec.frames_needed(nbytes, 4)
    # the downlink: the server's word, shown once to b, who passes it on to c, who passes it on to d
    one_by_one = 3 * ((whole + 1) * hold + hold)
    assert (whole + 1) * hold + 3 * hold < line["downlink"] < one_by_one


def test_a_schedule_changed_from_a_step_on_keeps_every_earlier_step_where_it_was():
    s = Schedule(t0=1.0, phases=(("compute", 0.5), ("reduce", 0.5)))  # a step a second
    later = s.then(5, s.start(5), (("compute", 1.0), ("reduce", 1.0)))  # two seconds a step from step 5 on
    assert [later.start(k) for k in (0, 4, 5, 6)] == [1.0, 5.0, 6.0, 8.0]
    assert later.window(4, "reduce").end == 6.0 and later.window(6, "reduce").start == 9.0
    assert [later.step_at(t) for t in (0.5, 5.9, 6.0, 7.9, 8.0)] == [-1, 4, 5, 5, 6]
    assert later.deadline(3) == later.window(5, "reduce").start == 7.0  # across the change
    assert later.deadline(0) == s.deadline(0) and later.period == 2.0
    # a change announced again from an earlier step replaces the one after it
    again = later.then(3, later.start(3), (("compute", 0.25), ("reduce", 0.25)))
    assert again.start(5) == 4.0 + 2 * 0.5 and again.before is s
    with pytest.raises(ValueError):
        Schedule(t0=0, phases=(("a", 1.0),), first_step=2, before=again)


def test_the_server_sizes_the_schedule_again_when_a_reader_asks_for_a_more_robust_layout():
    """A reader asks a screen for a layout that carries less mid-run (protocols.adapt): the server books the
    steps from two steps on at the period that layout needs, tells every node (an announcement of the next
    revision), and ticks them there; the steps before keep theirs. Asked back, it shortens them again."""
    from protocols.algorithms import Sight  # noqa: F401
    from protocols.messages import LayoutAsks, ScheduleChanged, ScheduleKnown, SightKnown
    from protocols.transfer import NO_ASK
    from wccl.distributed.rank_node import collective_ladder
    from conftest import make_config

    dense = dict(choose="pinned", rows=28, cols=50, colours=8, cell_px=22, hold_s=0.083, code_rate=0.8)
    robust = dict(choose="pinned", rows=20, cols=37, colours=8, cell_px=32, hold_s=0.1, code_rate=0.8)
    ladder = [collective_ladder(make_config(link=lay))[0] for lay in (dense, robust)]
    deps = clock_deps(Schedule(1.0, (("compute", 0.1),)), steps=12, phases=None, ladder=ladder,
                      tensor_bytes=1346, margin_frames=1)

    async def go():
        async with ActorHarness(Clock, node="alice", **deps) as h:
            await h.send(SightKnown(sender="alice", time=0.0, edges=((0, 1, 1.0), (1, 0, 1.0)), layout=0))
            await h.send(LayoutAsks(sender="alice", time=0.0, asks=(NO_ASK, 0)))  # (start-up: the room's)
            known = None
            while known is None:
                await asyncio.sleep(0.05)
                known = next(iter(h.of_type(ScheduleKnown)), None)
            first = Schedule(known.t0, known.phases)
            await h.clock.sleep_until(first.start(3) + 0.01)  # step 3 runs: bob's screen reads badly
            await h.send(LayoutAsks(sender="alice", time=h.clock.now(), asks=(NO_ASK, 1)))
            await h.settle()
            change = h.of_type(ScheduleChanged)[0]
            now = first.then(change.first_step, change.t0, change.phases)
            await h.clock.sleep_until(now.start(6) + 0.01)  # step 6 runs: reads are good again
            await h.send(LayoutAsks(sender="alice", time=h.clock.now(), asks=(NO_ASK, 0)))
            await h.task
        return h.outputs, first

    outs, first = run_virtual(go)
    changes = [m for m in outs if isinstance(m, ScheduleChanged)]
    assert [c.first_step for c in changes] == [5, 8]
    slow, back = (sum(s for _, s in c.phases) for c in changes)
    assert slow > 2 * first.period and back == pytest.approx(first.period)
    # 15 frames of 32 px cells against 5 of 22 px: the uplink books three times the frames, each held longer
    assert dict(changes[0].phases)["uplink"] > 3 * dict(first.phases)["uplink"]
    announced = [sync.decode(m.payload) for m in outs if isinstance(m, SendTensor) and m.stream == "sync"]
    assert [(a.first_step, a.revision) for a in announced] == [(0, 0), (5, 1), (8, 2)]
    assert announced[1].t0_us == round(first.start(5) * 1e6)
    ticks = {(m.step, m.phase): m.time for m in outs if isinstance(m, Tick)}
    assert ticks[(4, "compute")] == pytest.approx(first.start(4))  # before the change: where it was
    assert ticks[(6, "compute")] - ticks[(5, "compute")] == pytest.approx(slow)
    assert ticks[(9, "compute")] - ticks[(8, "compute")] == pytest.approx(first.period)


def test_a_node_follows_the_servers_changed_schedule_and_ignores_an_overtaken_one():
    from protocols.messages import ScheduleChanged, ScheduleKnown, TensorReceived

    phases = (("compute", 0.5), ("reduce", 0.5))
    a0 = sync.Announce(1_000_000, phases, 8, 0, 0)
    a1 = sync.Announce(5_000_000, (("compute", 1.0), ("reduce", 1.0)), 8, 0, 0, 4, 1)
    deps = clock_deps(Schedule(1.0, phases), steps=8)

    def word(a):
        return TensorReceived(sender="bob", time=0.0, origin="alice", stream="sync", payload=a.encode(), frames=1)

    async def go():
        async with ActorHarness(Clock, node="bob", **deps) as h:
            h.actor.estimator.estimate = lambda t: None  # (clock sync is not what this test is about)
            h.actor._synced.set()
            await h.send(word(a0))
            await h.clock.sleep_until(2.2)
            await h.send(word(a1))
            await h.send(word(a0))  # (an older word that took longer: overtaken)
            await h.task
        return h.outputs

    outs = run_virtual(go)
    assert len(outs_of := [m for m in outs if isinstance(m, ScheduleKnown)]) == 1 and outs_of[0].first_step == 0
    assert [(m.first_step, m.t0) for m in outs if isinstance(m, ScheduleChanged)] == [(4, 5.0)]
    computes = [m.time for m in outs if isinstance(m, Tick) and m.phase == "compute"]
    assert computes == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 9.0, 11.0])


def test_the_server_makes_up_a_skipped_step_at_the_end_and_every_node_ticks_it():
    """A step the server skipped (its quorum's gradients did not come) is made up: once the run's end is 8
    steps away, its clock announces the steps owed in one word (the next revision, the phases unchanged) and
    ticks them; a node told of it ticks them too. Not when the added step would come before the nodes hear
    of it, and never past twice the steps the run started with."""
    from protocols.messages import ScheduleChanged, StepSkipped, TensorReceived

    schedule = Schedule(t0=1.0, phases=(("compute", 0.5), ("reduce", 0.5)))

    async def server():
        async with ActorHarness(Clock, node="alice", **clock_deps(schedule, steps=3)) as h:
            await h.clock.sleep_until(schedule.start(0) + 0.1)
            await h.send(StepSkipped(sender="alice", step=0, time=h.clock.now()))  # (3 steps, each made up once)
            await h.send(StepSkipped(sender="alice", step=0, time=h.clock.now()))
            await h.send(StepSkipped(sender="alice", step=0, time=h.clock.now()))
            await h.send(StepSkipped(sender="alice", step=0, time=h.clock.now()))  # (a fourth: past twice 3)
            await h.task
        return h.outputs

    async def late():
        async with ActorHarness(Clock, node="alice", **clock_deps(schedule, steps=4)) as h:
            await h.clock.sleep_until(schedule.start(1) + 0.1)
            await h.send(StepSkipped(sender="alice", step=0, time=h.clock.now()))  # (step 4 comes in 2.9 s)
            await h.clock.sleep_until(schedule.start(3) + 0.1)
            await h.send(StepSkipped(sender="alice", step=1, time=h.clock.now()))  # (step 5 in 1.9 s: too soon)
            await h.task
        return h.outputs

    outs = run_virtual(late)
    assert [m.steps for m in outs if isinstance(m, ScheduleChanged)] == [5]

    async def early():
        async with ActorHarness(Clock, node="alice", **clock_deps(schedule, steps=20)) as h:
            for k in (1, 2):
                await h.clock.sleep_until(schedule.start(k) + 0.1)
                await h.send(StepSkipped(sender="alice", step=k - 1, time=h.clock.now()))
            await h.task
        return h.outputs

    outs = run_virtual(early)  # (two steps owed, announced in one word once the end is 8 steps away)
    announced = [(m.time, sync.decode(m.payload).steps) for m in outs if isinstance(m, SendTensor)]
    assert announced == [(0.0, 20), (pytest.approx(schedule.start(12)), 22)]
    assert [m.step for m in outs if isinstance(m, Tick) and m.phase == "compute"] == list(range(22))
    outs = run_virtual(server)
    announced = [sync.decode(m.payload) for m in outs if isinstance(m, SendTensor) and m.stream == "sync"]
    assert [(a.steps, a.revision, a.first_step, a.phases) for a in announced] == [
        (3, 0, 0, schedule.phases), (4, 1, 0, schedule.phases), (5, 2, 0, schedule.phases),
        (6, 3, 0, schedule.phases)]
    assert [m.steps for m in outs if isinstance(m, ScheduleChanged)] == [4, 5, 6]
    computes = [(m.step, m.time) for m in outs if isinstance(m, Tick) and m.phase == "compute"]
    assert computes == [(k, pytest.approx(schedule.start(k))) for k in range(6)]
    done = next(m for m in outs if isinstance(m, ScheduleDone))
    assert done.steps == 6 and done.time == pytest.approx(schedule.deadline(5))

    async def node():
        async with ActorHarness(Clock, node="bob", **clock_deps(schedule, steps=3)) as h:
            h.actor.estimator.estimate = lambda t: None  # (clock sync is not what this test is about)
            h.actor._synced.set()
            for a in announced[:1] + announced[2:3]:  # (the first and the second made-up step in one word)
                await h.send(TensorReceived(sender="bob", time=h.clock.now(), origin="alice", stream="sync",
                                            payload=a.encode(), frames=1))
                await h.clock.sleep_until(schedule.start(1) + 0.1)
            await h.task
        return h.outputs

    outs = run_virtual(node)
    assert [m.step for m in outs if isinstance(m, Tick) and m.phase == "compute"] == [0, 1, 2, 3, 4]
    assert next(m for m in outs if isinstance(m, ScheduleDone)).steps == 5


def test_a_node_told_the_schedule_after_a_change_ticks_each_step_where_the_server_does():
    from protocols.messages import ScheduleKnown, TensorReceived

    phases = (("compute", 0.5), ("reduce", 0.5))
    a1 = sync.Announce(5_000_000, (("compute", 1.0), ("reduce", 1.0)), 8, 0, 0, 4, 1)  # step 4 at 5 s, 2 s a step
    deps = clock_deps(Schedule(1.0, phases), steps=8)

    async def go():
        async with ActorHarness(Clock, node="bob", **deps) as h:
            h.actor.estimator.estimate = lambda t: None  # (clock sync is not what this test is about)
            h.actor._synced.set()
            await h.clock.sleep_until(6.5)  # (it joins late: step 4 runs)
            await h.send(TensorReceived(sender="bob", time=6.5, origin="alice", stream="sync", payload=a1.encode(),
                                        frames=1))
            await h.task
        return h.outputs

    outs = run_virtual(go)
    known = [m for m in outs if isinstance(m, ScheduleKnown)]
    assert [(m.first_step, m.t0, m.join_step) for m in known] == [(4, 5.0, 5)]
    computes = [(m.step, m.time) for m in outs if isinstance(m, Tick) and m.phase == "compute"]
    assert computes == [(5, 7.0), (6, 9.0), (7, 11.0)]
