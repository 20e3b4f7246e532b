"""The observer: a third laptop that rebuilds the model from what its camera reads off the server's screen."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from conftest import (
    deep_update,
    make_config,
    run_room,
    run_virtual,
    shipped_config_dict,
)

from actors.observer import Observer
from protocols import snapshot as snap
from wccl.compression import get_codec
from protocols.messages import TensorReceived
from wccl.config import ConfigError, parse_config
from wccl.runtime.harness import ActorHarness
from wccl.training.data import load_dataset
from wccl.training.exchange import mean_of
from wccl.training.replica import Replica

TRIO = [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"]},
        {"name": "carol", "roles": ["observer"]}]
# A short room: the dense layout and 1.3 s steps, so a test run costs seconds.
FAST = {
    "room": {"profile": "exact", "nodes": TRIO},
    "link": {"rows": 60, "cols": 110, "cell_px": 10, "hold_s": 0.1},
    "schedule": {"preset": "custom", "phases": [{"name": "compute", "seconds": 0.1}, {"name": "uplink", "seconds": 0.5},
                                             {"name": "reduce", "seconds": 0.1}, {"name": "downlink", "seconds": 0.5},
                                             {"name": "apply", "seconds": 0.1}]},
}


def _events(buf, name: str) -> list[dict]:
    return [e for e in map(json.loads, buf.getvalue().splitlines()) if e["event"] == name]


@pytest.mark.slow
def test_observer_rebuilds_the_servers_model_bit_for_bit_from_light(_quiet_logs):
    cfg = make_config(**FAST, training={"steps": 4})
    result = run_room(cfg)
    nodes, link = result["nodes"], result["link"]
    # No frame the observer needed was lost: every tensor it saw was rebuilt, none went missing.
    assert link["carol"]["tensors_avg"] == 4 and link["carol"]["tensors_grad"] == 4  # both screens in its view
    assert not [k for k in link["carol"] if k.startswith("loss_")], link["carol"]
    assert result["applied"] == 4 and result["observer_identical"] is True
    assert nodes["carol"]["observer"]["params_sha256"] == nodes["alice"]["worker"]["params_sha256"]
    assert nodes["carol"]["observer"]["applied"] == 4 and nodes["carol"]["observer"]["missed"] == 0
    # It evaluated every step, on its own copy of the held-out digits, and saw what the server's replica saw.
    seen = {e["step"]: e["test_accuracy"] for e in _events(_quiet_logs, "observer_step")}
    server = {e["step"]: e["test_accuracy"] for e in _events(_quiet_logs, "step_applied") if e["node"] == "alice"}
    assert sorted(seen) == [0, 1, 2, 3] and seen == server
    assert not _events(_quiet_logs, "observer_missed_step")
    # The observer showed nothing: a laptop that only watches has no screen writer and no schedule.
    assert "screen" not in nodes["carol"] and "worker" not in nodes["carol"]


@pytest.mark.slow
def test_an_observer_rebuilds_the_ranks_model_when_every_node_is_a_rank(_quiet_logs):
    """exchange = "collectives": no parameter server, so the rank with the server role shows each step's
    average (and a snapshot every `snapshot_every` steps, in the screen time the collectives leave) for
    observers only: no rank reads them. The observer applies every average: the ranks' model, bit for bit."""
    cfg = make_config(room={"profile": "exact", "nodes": TRIO}, link=FAST["link"], recovery={"snapshot_every": 4},
                      training={"steps": 9, "exchange": "collectives"})
    result = run_room(cfg)
    nodes = result["nodes"]
    assert result["applied"] == 9 and result["replicas_identical"] and result["observer_identical"] is True
    assert nodes["carol"]["observer"]["applied"] == 9 and nodes["carol"]["observer"]["missed"] == 0
    assert nodes["alice"]["worker"]["shown_to_observers"] == 9 and nodes["bob"]["worker"]["shown_to_observers"] == 0
    seen = {e["step"]: e["test_accuracy"] for e in _events(_quiet_logs, "observer_step")}
    ranks = {e["step"]: e["test_accuracy"] for e in _events(_quiet_logs, "step_applied") if e["node"] == "alice"}
    assert sorted(seen) == list(range(9)) and seen == ranks
    # every 4 steps, and the end state after the last (observers only: a word missed near the end)
    assert [(e["applied"], e["reason"]) for e in _events(_quiet_logs, "snapshot_shown")] == \
        [(4, "periodic"), (8, "periodic"), (9, "final")]
    # bob rebuilt none of alice's words for observers: they name alice as their reader
    assert "tensors_avg" not in result["link"]["bob"] and result["link"]["carol"]["tensors_avg"] == 9


@pytest.mark.slow
def test_a_blind_observer_applies_nothing_and_ends_with_the_room():
    # Lens cap on: nothing reaches the observer any other way, and the run still ends when the trainers do.
    nodes = [dict(n) for n in TRIO]
    nodes[2]["camera"] = "fake"
    result = run_room(make_config(**deep_update(FAST, {"room": {"nodes": nodes}}), training={"steps": 2}))
    carol = result["nodes"]["carol"]["observer"]
    assert carol["applied"] == 0 and result["observer_identical"] is False
    assert result["applied"] == 2 and not result["stopped"]


# ---------------------------------------------------------------------------------- the actor alone

def _trained(cfg, steps: int) -> tuple[list[bytes], Replica]:
    """The averages of a reference run (two workers), and the server's replica after them."""
    tr = cfg.training
    ds = load_dataset(tr.dataset, seed=tr.data_seed, test_size=tr.test_size)
    reps = [Replica(tr.model, tr.init, tr.seed, tr.optimizer, tr.lr, tr.momentum, ds, r, 2, tr.batch_size,
                    tr.data_seed) for r in range(2)]
    avgs = []
    for step in range(steps):
        avg = mean_of({w: r.compute_gradient(step)[0] for w, r in zip("ab", reps)})[0].to(torch.bfloat16)
        for r in reps:
            r.apply(avg)
        avgs.append(get_codec("bf16").encode(avg))
    return avgs, reps[0]


def _fresh(cfg) -> Replica:
    tr = cfg.training
    ds = load_dataset(tr.dataset, seed=tr.data_seed, test_size=tr.test_size)
    return Replica(tr.model, tr.init, tr.seed, tr.optimizer, tr.lr, tr.momentum, ds, 0, 2, tr.batch_size, tr.data_seed)


def _avg(step: int, payload: bytes, base: int | None = None, origin: str = "alice") -> TensorReceived:
    return TensorReceived(sender="carol", step=step, time=0.0, origin=origin, stream="avg", payload=payload,
                          frames=2, epoch=0, base=step if base is None else base)


def _params(applied: int, replica: Replica) -> TensorReceived:
    data = snap.encode_snapshot(snap.Snapshot(applied=applied, epoch=0, arrays=replica.export_state()))
    return TensorReceived(sender="carol", step=applied - 1, time=0.0, origin="alice", stream="params", payload=data,
                          frames=3, epoch=0, base=applied)


def test_a_missed_step_stops_the_observer_until_a_snapshot_brings_it_back(_quiet_logs):
    cfg = make_config(training={"steps": 6})
    avgs, server = _trained(cfg, 6)
    _, at4 = _trained(cfg, 4)
    observer = _fresh(cfg)

    async def go():
        async with ActorHarness(Observer, node="carol", replica=observer, server="alice", steps=6) as h:
            await h.send(_avg(0, avgs[0]))
            await h.send(_avg(1, avgs[1], origin="bob"))  # a worker's tensor on the avg stream: not an update
            await h.send(_avg(2, avgs[2]))  # step 1's average never arrived
            await h.send(_avg(3, avgs[3]))
            await h.settle()
            stalled = dict(h.results["observer"])
            await h.send(_params(4, at4))  # the server's state after 4 updates
            await h.send(_avg(4, avgs[4]))
            await h.send(_avg(5, avgs[5]))
            await asyncio.wait_for(h.task, 5)  # the last step applied: its run ends by itself
            return stalled, h.results["observer"]

    stalled, final = run_virtual(go)
    assert stalled["applied"] == 1 and stalled["stalled"] and stalled["missed"] == 1
    missed = _events(_quiet_logs, "observer_missed_step")
    assert len(missed) == 1 and missed[0]["step"] == 2 and missed[0]["missing"] == 1
    # Recovered from the snapshot, then applied the rest: the same parameters as the server, bit for bit.
    assert final["recovered"] == 1 and not final["stalled"] and final["applied"] == 6
    assert torch.equal(observer.parameters_flat(), server.parameters_flat())
    assert final["params_sha256"] and [e["step"] for e in _events(_quiet_logs, "observer_step")] == [0, 4, 5]


def test_an_average_read_late_lets_the_observer_catch_up_without_a_snapshot(_quiet_logs):
    """Step 1's average is read after steps 2 and 3's (frames come in any order; the server's words linger
    for observers): the observer stalls at step 2's, keeps the later ones, and once step 1's comes applies
    all three in order, ending on the server's parameters bit for bit with no snapshot."""
    cfg = make_config(training={"steps": 4})
    avgs, server = _trained(cfg, 4)
    observer = _fresh(cfg)

    async def go():
        async with ActorHarness(Observer, node="carol", replica=observer, server="alice", steps=4) as h:
            await h.send(_avg(0, avgs[0]))
            await h.send(_avg(2, avgs[2]))
            await h.send(_avg(3, avgs[3]))
            await h.settle()
            stalled = dict(h.results["observer"])
            await h.send(_avg(1, avgs[1]))
            await asyncio.wait_for(h.task, 5)
            return stalled, h.results["observer"]

    stalled, final = run_virtual(go)
    assert stalled["applied"] == 1 and stalled["stalled"] and stalled["missed"] == 1
    assert final["applied"] == 4 and not final["stalled"] and final["recovered"] == 1
    assert torch.equal(observer.parameters_flat(), server.parameters_flat())
    assert [e["step"] for e in _events(_quiet_logs, "observer_step")] == [0, 1, 2, 3]
    assert len(_events(_quiet_logs, "observer_caught_up")) == 1 and not _events(_quiet_logs, "observer_incomplete")


def test_an_observer_follows_the_run_past_its_configured_steps_when_the_server_makes_one_up(_quiet_logs):
    """Step 1 skipped (its word empty) and made up: the server's announcement says the run has 4 steps, not
    the 3 of the room file, and the observer goes on to step 3's word, ending on the server's parameters."""
    from protocols import sync

    cfg = make_config(training={"steps": 3})
    avgs, server = _trained(cfg, 3)
    observer = _fresh(cfg)
    made_up = sync.Announce(1_000_000, (("compute", 0.5), ("reduce", 0.5)), 4, 0, 0, 0, 1)

    async def go():
        async with ActorHarness(Observer, node="carol", replica=observer, server="alice", steps=3) as h:
            await h.send(_avg(0, avgs[0]))
            await h.send(_avg(1, b"", base=1))
            await h.send(TensorReceived(sender="carol", time=0.0, origin="alice", stream="sync",
                                        payload=made_up.encode(), frames=1))
            await h.send(_avg(2, avgs[1], base=1))
            await h.settle()
            at_2 = dict(h.results["observer"])
            await h.send(_avg(3, avgs[2], base=2))
            await asyncio.wait_for(h.task, 5)
            return at_2, h.results["observer"]

    at_2, final = run_virtual(go)
    assert at_2["applied"] == 2 and at_2["last_step"] == 2  # (the room file's last step: not the run's)
    assert final["applied"] == 3 and final["last_step"] == 3
    assert torch.equal(observer.parameters_flat(), server.parameters_flat())


def test_the_final_snapshot_ends_an_observer_that_missed_the_last_words(_quiet_logs):
    """Steps 2 and 3's averages never read (the run is over for the server once its ranks have them): the
    snapshot the server shows after the last step (its step one past the last) brings the observer to the
    run's end state, and its run ends there, on the server's parameters bit for bit; a periodic snapshot of
    the same state would not have ended it."""
    cfg = make_config(training={"steps": 4})
    avgs, server = _trained(cfg, 4)
    observer = _fresh(cfg)

    async def go():
        async with ActorHarness(Observer, node="carol", replica=observer, server="alice", steps=4) as h:
            for s in range(2):
                await h.send(_avg(s, avgs[s]))
            await h.send(_params(4, server))  # (as a periodic snapshot: step 3)
            await h.settle()
            periodic = dict(h.results["observer"])
            final = _params(4, server).model_copy(update={"step": 4})
            await h.send(final)
            await asyncio.wait_for(h.task, 5)
            return periodic, h.results["observer"]

    periodic, final = run_virtual(go)
    assert periodic["applied"] == 4 and periodic["last_step"] == 1  # taken, but the run's end not known
    assert final["applied"] == 4 and final["last_step"] == 3 and not final["stalled"]
    assert torch.equal(observer.parameters_flat(), server.parameters_flat())
    assert not _events(_quiet_logs, "observer_incomplete")


def test_snapshots_of_states_the_observer_went_through_are_checked_not_adopted(_quiet_logs):
    cfg = make_config(training={"steps": 4})
    avgs, server = _trained(cfg, 2)
    _, at1 = _trained(cfg, 1)
    observer = _fresh(cfg)

    async def go():
        async with ActorHarness(Observer, node="carol", replica=observer, server="alice", steps=4) as h:
            for s in range(2):
                await h.send(_avg(s, avgs[s]))
            await h.send(_params(1, at1))  # a snapshot takes longer to show than an average: it comes late
            await h.send(_params(2, server))
            await h.settle()
            checked = dict(h.results["observer"])
            await h.send(_params(1, server))  # the state after 2 updates, claiming to be the one after 1
            await h.settle()
            return checked, dict(h.results["observer"])

    checked, drifted = run_virtual(go)
    events = _events(_quiet_logs, "observer_snapshot_checked")
    assert [(c["applied"], c["identical"]) for c in events] == [(1, True), (2, True), (1, False)]
    assert checked["recovered"] == 0 and checked["applied"] == 2 and not checked["stalled"]
    assert drifted["stalled"]  # a mismatch: it stops applying until a newer snapshot


# ---------------------------------------------------------------------------------- config

@pytest.mark.parametrize("roles", [["observer", "worker"], ["server", "observer"]])
def test_an_observer_only_watches(roles):
    data = shipped_config_dict()
    data["room"]["nodes"] = [{"name": "alice", "roles": ["server", "worker"]}, {"name": "carol", "roles": roles}]
    with pytest.raises(ConfigError) as e:
        parse_config(data, "room.toml")
    msg = str(e.value)
    assert "room.toml" in msg and "room.nodes[1]" in msg and "an observer only watches" in msg


def test_the_shipped_room_has_an_observer_and_a_dashboard():
    cfg = parse_config(shipped_config_dict(), "config.toml")
    assert cfg.room.observers == ["carol"] and cfg.room.workers == ["alice", "bob"]
    assert cfg.dashboard.enabled and cfg.dashboard.port > 0


@pytest.mark.parametrize("stopped", [True, False])
def test_an_observer_ended_by_a_stopped_run_says_so_and_gives_no_aiming_hint(stopped, _quiet_logs):
    # Ctrl-C after step 0: the observer's model is the server's after one step, and nothing was wrong with
    # its camera; a run that ended on its own before the observer had the last step is another matter.
    cfg = make_config(training={"steps": 4})
    avgs, _ = _trained(cfg, 1)
    observer = _fresh(cfg)

    async def go():
        async with ActorHarness(Observer, node="carol", replica=observer, server="alice", steps=4,
                                stopped=lambda: stopped) as h:
            await h.send(_avg(0, avgs[0]))
            await h.settle()
            await h.close()  # (the run's end: the node closes the mailboxes)

    run_virtual(go)
    interrupted, incomplete = _events(_quiet_logs, "observer_interrupted"), _events(_quiet_logs, "observer_incomplete")
    if stopped:
        assert len(interrupted) == 1 and interrupted[0]["applied"] == 1 and not incomplete
    else:
        assert not interrupted and len(incomplete) == 1 and "aim it" in incomplete[0]["hint"]


def test_the_end_of_a_run_stopped_before_its_first_evaluation_says_so_without_a_nan():
    from wccl.node import summary_table

    result = dict(test_accuracy=float("nan"), stopped=True, applied=2, steps=30, replicas_identical=True,
                  observer_identical=None, sim_seconds=3.0, wall_seconds=9.0, restarts={}, nodes={}, link={})
    first = summary_table(result).splitlines()[0]
    assert first == "run interrupted: 2 of 30 steps applied, no test accuracy yet", first
    result.update(test_accuracy=0.8731, stopped=False, applied=30)
    assert summary_table(result).splitlines()[0] == "run finished: 30 of 30 steps applied, test accuracy 0.873"
