"""Agreement: every rank ends every collective with the same result, or every rank fails it.

Three ranks in one virtual-time loop share nothing but a simulated room; a hand covers carol's camera
in the middle of a collective (SimulatedRoom.cover). Shorter than the timeout: every rank waits and ends
with the same bytes. Longer: every rank fails the collective, none applies it (alice and bob have every
part, but never learn that carol has hers), and every later collective fails at once.
"""

from __future__ import annotations

import asyncio

import pytest
from conftest import make_config, run_virtual

from protocols.messages import CollectiveRequest, Drain, VoidCollectives
from wccl.distributed.rank_node import CollectiveNode
from wccl.room import SimulatedRoom

NAMES = ("alice", "bob", "carol")
ROOM3 = {"nodes": [{"name": n, "roles": ["server", "worker"] if i == 0 else ["worker"]} for i, n in enumerate(NAMES)],
         "session": 5}
BIG = 24_000  # bytes per rank: about a second of frames in the exact room, so the hand comes midway


def _req(node, seq, data: bytes):
    return CollectiveRequest(sender=node.node, time=0.0, seq=seq, op="allreduce", dtype="uint8", numel=len(data),
                             inputs=(data,), root=0, ready_at=node.local_clock.now(), handle=seq)


def _run(cover_s: float, timeout_s: float):
    """seq 0: a small all_reduce; seq 1: a big one, carol's camera covered from 0.3 s into it for
    `cover_s`; seq 2: a small one after it. Returns each rank's CollectiveDone by seq and how long (its
    own clock) seq 1 took."""
    cfg = make_config(room=dict(ROOM3, profile="exact"), link={"choose": "pinned"},
                      collectives={"algorithm": "all_see_all"})

    async def go():
        room = SimulatedRoom.from_config(cfg)
        done: dict[str, list] = {n: [] for n in NAMES}
        nodes = {n: CollectiveNode(cfg.model_copy(deep=True), n, room, timeout_s=timeout_s, on_done=done[n].append)
                 for n in NAMES}
        took = {}

        async def until(seq):
            while not all(any(m.seq == seq for m in done[n]) for n in NAMES):
                await asyncio.sleep(0.01)

        async def script():
            for n in NAMES:
                await nodes[n].submit(_req(nodes[n], 0, bytes([NAMES.index(n) + 1]) * 8))
            await until(0)
            t1 = {n: nodes[n].local_clock.now() for n in NAMES}
            for n in NAMES:
                await nodes[n].submit(_req(nodes[n], 1, bytes([7 * NAMES.index(n) + 3]) * BIG))
            start = room.now() - room.cameras_started_at + 0.3
            room.cover("carol", start, start + cover_s)
            await until(1)
            for n in NAMES:
                took[n] = next(m.time for m in done[n] if m.seq == 1) - t1[n]
            for n in NAMES:
                await nodes[n].submit(_req(nodes[n], 2, bytes([9]) * 8))
            await until(2)

        for n in NAMES:
            nodes[n].build()
        async with asyncio.TaskGroup() as tg:
            for s in nodes.values():
                tg.create_task(s.run())
            await script()
            for n, s in nodes.items():
                await s.submit(Drain(sender=n, time=0.0, timeout_s=5.0))
        return {n: {m.seq: m for m in done[n]} for n in NAMES}, took

    return run_virtual(go)


@pytest.mark.slow
def test_a_camera_covered_midway_for_less_than_the_timeout_delays_every_rank_alike():
    done, took = _run(cover_s=2.5, timeout_s=30.0)
    want = tuple((bytes([7 * i + 3]) * BIG,) for i in range(3))
    for n in NAMES:
        assert [done[n][s].error for s in (0, 1, 2)] == [None, None, None], n
        assert done[n][1].parts == want
    # Every rank waited for carol's camera, not only carol: alice and bob had every part long before.
    assert min(took.values()) > 2.5, took


@pytest.mark.slow
def test_a_camera_covered_midway_for_longer_than_the_timeout_fails_the_collective_on_every_rank():
    done, _ = _run(cover_s=30.0, timeout_s=4.0)
    for n in NAMES:
        assert done[n][0].error is None
        m = done[n][1]
        assert m.parts == () and m.reduced is None and m.error, n  # nobody applies it
        assert "timed out after 4 s" in m.error
    # alice and bob hold every part (carol's screen is fine); they fail because carol never says she does
    for n in ("alice", "bob"):
        assert "this rank has every part, but rank 2 (carol) never showed that it has them" in done[n][1].error
    assert "waiting for rank 0 (alice)" in done["carol"][1].error
    for n in NAMES:  # the group is broken: the next collective fails at once, saying why
        assert "not run: collective #1 (allreduce) failed" in done[n][2].error


PAIR = ("alice", "bob")


def _pair_config():
    return make_config(room=dict(ROOM3, nodes=ROOM3["nodes"][:2], profile="exact"), link={"choose": "pinned"},
                       collectives={"algorithm": "all_see_all"})


def _pair(cfg, room):
    """alice's and bob's nodes in `room` (collectives time out after 20 s), what each has done, and a wait
    until both have done collective `seq` (with `first`: their collective #0, issued first)."""
    done: dict[str, list] = {n: [] for n in PAIR}
    nodes = {n: CollectiveNode(cfg.model_copy(deep=True), n, room, timeout_s=20.0, on_done=done[n].append)
             for n in PAIR}

    async def until(seq, first=False):
        if first:  # (collective #0: a small all_reduce, each rank's byte its rank + 1)
            for i, n in enumerate(PAIR):
                await nodes[n].submit(_req(nodes[n], 0, bytes([i + 1]) * 8))
        while not all(any(m.seq == seq for m in done[n]) for n in PAIR):
            await asyncio.sleep(0.01)

    return nodes, done, until


def test_a_collective_no_algorithm_can_carry_fails_alike_and_the_next_one_runs():
    """all_see_all pinned, and a sight graph where alice's camera does not read bob's screen: an all_reduce
    cannot run (every rank refuses it alike, from the same graph); the broadcast from alice after it must
    still run, not wait for agreement on the refused one."""
    from protocols.algorithms import Sight

    names, cfg = PAIR, _pair_config()

    async def go():
        nodes, done, until = _pair(cfg, SimulatedRoom.from_config(cfg))
        for s in nodes.values():
            s.build()
            s.deps["collectives"]["sight"] = Sight(2, {(1, 0): 20_000.0}, 0.3)  # bob reads alice, not back

        async with asyncio.TaskGroup() as tg:
            for s in nodes.values():
                tg.create_task(s.run())
            await until(0, first=True)
            for i, n in enumerate(names):
                await nodes[n].submit(CollectiveRequest(sender=n, time=0.0, seq=1, op="broadcast", dtype="uint8",
                                                        numel=8, inputs=(bytes([5 + i]) * 8,), root=0,
                                                        ready_at=nodes[n].local_clock.now(), handle=1))
            await until(1)
            for n, s in nodes.items():
                await s.submit(Drain(sender=n, time=0.0, timeout_s=5.0))
        return {n: {m.seq: m for m in done[n]} for n in names}

    done = run_virtual(go)
    for n in names:
        assert "cannot carry allreduce" in (done[n][0].error or ""), done[n][0]
        assert done[n][1].error is None, done[n][1].error
        assert done[n][1].parts[0] == (bytes([5]) * 8,)


def test_voided_collectives_end_unapplied_and_the_next_one_is_agreed():
    """alice starts collective #1; bob never does (his laptop restarted and knows nothing of it). Both void the
    collectives before #8 (a regroup, actors.rank_worker): alice's #1 ends with no outcome at all, and #8 runs
    and is agreed as usual: each counts #1..#7 as held, so none of them holds it back."""
    names, cfg = PAIR, _pair_config()

    async def go():
        nodes, done, until = _pair(cfg, SimulatedRoom.from_config(cfg))

        for s in nodes.values():
            s.build()
        async with asyncio.TaskGroup() as tg:
            for s in nodes.values():
                tg.create_task(s.run())
            await until(0, first=True)
            alice = nodes["alice"]
            await alice.submit(_req(alice, 1, bytes([3]) * 8))
            await asyncio.sleep(2.0)  # alice's #1 waits for bob's part, which never comes
            for i, n in enumerate(names):
                await nodes[n].mailboxes["collectives"].put(VoidCollectives(sender=n, time=0.0, first_seq=8, group=0b11))
                await nodes[n].submit(_req(nodes[n], 8, bytes([10 + i]) * 8))
            await until(8)
            await asyncio.sleep(1.0)
            for n, s in nodes.items():
                await s.submit(Drain(sender=n, time=0.0, timeout_s=5.0))
        return {n: {m.seq: m for m in done[n]} for n in names}, {n: s.results["collectives"] for n, s in nodes.items()}

    done, results = run_virtual(go)
    for n in names:
        assert sorted(done[n]) == [0, 8], (n, sorted(done[n]))  # #1 ended with no outcome on alice
        assert done[n][8].error is None and done[n][8].parts == ((bytes([10]) * 8,), (bytes([11]) * 8,)), done[n][8]
        assert results[n]["failed"] == 0


def test_collectives_run_over_the_group_a_void_names_and_leave_out_the_ranks_outside_it():
    """Three ranks do collective #0 together; then alice and carol void the collectives before #8 naming the
    group {alice, carol} (a regroup without bob: actors.rank_worker). Their #8 (all_reduce) and #9 (all_gather)
    run between the two of them: bob, who issues neither, holds nothing back; #8 reduces their inputs alone,
    and #9 has their parts in rank order and none for bob."""
    cfg = make_config(room=dict(ROOM3, profile="exact"), link={"choose": "pinned"})
    group = ("alice", "carol")

    async def go():
        room = SimulatedRoom.from_config(cfg)
        done: dict[str, list] = {n: [] for n in NAMES}
        nodes = {n: CollectiveNode(cfg.model_copy(deep=True), n, room, timeout_s=20.0, on_done=done[n].append)
                 for n in NAMES}

        async def until(seq, who):
            while not all(any(m.seq == seq for m in done[n]) for n in who):
                await asyncio.sleep(0.01)

        for n in NAMES:
            nodes[n].build()
        async with asyncio.TaskGroup() as tg:
            for s in nodes.values():
                tg.create_task(s.run())
            for i, n in enumerate(NAMES):
                await nodes[n].submit(_req(nodes[n], 0, bytes([i + 1]) * 8))
            await until(0, NAMES)
            for n in group:
                await nodes[n].mailboxes["collectives"].put(VoidCollectives(sender=n, time=0.0, first_seq=8,
                                                                            group=0b101))
                i = NAMES.index(n)
                await nodes[n].submit(_req(nodes[n], 8, bytes([10 * i + 1]) * 8))
                await nodes[n].submit(CollectiveRequest(sender=n, time=0.0, seq=9, op="allgather", dtype="uint8",
                                                        numel=4, inputs=(bytes([i]) * 4,), root=0,
                                                        ready_at=nodes[n].local_clock.now(), handle=9))
            await until(9, group)
            for n, s in nodes.items():
                await s.submit(Drain(sender=n, time=0.0, timeout_s=5.0))
        return {n: {m.seq: m for m in done[n]} for n in NAMES}

    done = run_virtual(go)
    assert sorted(done["bob"]) == [0]
    for n in group:
        assert sorted(done[n]) == [0, 8, 9], (n, sorted(done[n]))
        eight, nine = done[n][8], done[n][9]
        assert eight.error is None and nine.error is None, (eight.error, nine.error)
        got = eight.reduced if eight.reduced is not None else bytes(sum(p[0][k] for p in eight.parts if p)
                                                                     for k in range(8))
        assert got == bytes([1 + 21]) * 8, eight
        assert nine.parts == ((bytes([0]) * 4,), (), (bytes([2]) * 4,)), nine.parts
