"""Clocks synced over the light, the auto schedule, and training through lost frames and lost nodes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.worker import Worker
from protocols import snapshot as snap
from protocols import sync
from wccl.runtime.clocksync import FlightTimes, OffsetEstimator
from wccl.node import Fault, RoomRun
from protocols.registry import REGISTRY

from conftest import ROOT, make_config, run_virtual
from test_node import _reference_sha

TWO = [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"]}]


def _events(buf) -> list[dict]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def _run(cfg, faults=()):
    async def go():
        return await RoomRun(cfg, faults=faults).run()

    return run_virtual(go)


# ---------------------------------------------------------------------------------- pure parts


@pytest.mark.slow
@given(offset=st.floats(-10, 10), drift_ppm=st.floats(-400, 400), lat_a=st.floats(0.03, 0.12),
       seed=st.integers(0, 2**16))
@settings(max_examples=40, deadline=None)
def test_estimator_recovers_injected_offset_and_drift(offset, drift_ppm, lat_a, seed):
    """Two clocks apart by up to 10 s and 400 ppm (both laptops' +-200 ppm), frames both ways through
    a camera that catches each one somewhere within its 33 ms period: the estimate tracks the truth."""
    rng = np.random.default_rng(seed)
    est = OffsetEstimator(window_s=90, bin_s=3, min_samples=6)
    theta = lambda t: offset + drift_ppm * 1e-6 * t  # noqa: E731  reference - local, at local time t
    errors = []
    for k in range(600):
        t = k * 0.2  # local time
        # a reference frame shown at local time t, caught by this camera after its latency + phase
        est.add_down(t + theta(t), t + lat_a + rng.uniform(0, 1 / 30))
        # one of this node's frames shown at t, caught by the reference's camera (its clock)
        tc = t + lat_a + rng.uniform(0, 1 / 30)
        est.add_up(t, tc + theta(tc))
        if k >= 60:
            e = est.estimate(t)
            errors.append(e.offset - theta(t))
    assert np.percentile(np.abs(errors), 95) < 0.005


@given(offset=st.floats(-10, 10), there=st.floats(0.03, 0.2), back=st.floats(0.03, 0.2), seed=st.integers(0, 2**16))
@settings(max_examples=30, deadline=None)
def test_the_round_trip_of_a_frame_does_not_depend_on_the_clocks_offset(offset, there, back, seed):
    """The server's frames take `there` (plus the wait for a capture) to the peer's camera and the peer's
    `back`; the peer's clock is `offset` ahead: the round trip comes out as their sum, whatever the offset."""
    rng = np.random.default_rng(seed)
    flights = FlightTimes()
    assert flights.round_trip() is None
    for k in range(250):
        t = k * 0.1  # this node's time
        flights.add_out(t, t + there + rng.uniform(0, 1 / 30) + offset)  # an echo: caught on the peer's clock
        flights.add_out(t, t + 99.0)  # (the same frame echoed again counts once)
        flights.add_in(t + offset, t + back + rng.uniform(0, 1 / 30))  # the peer's frame, shown on its clock
    assert flights.round_trip() == pytest.approx(there + back + 1 / 30, abs=0.006)


@given(t0=st.integers(-2**62, 2**62), steps=st.integers(0, 2**32 - 1), epoch=st.integers(0, 0xFFFF),
       applied=st.integers(0, 2**32 - 1), first=st.integers(0, 2**32 - 1), revision=st.integers(0, 0xFFFF),
       phases=st.lists(st.tuples(st.sampled_from(sync.PHASES), st.integers(1, 2**32 - 1)), max_size=6))
def test_announce_round_trips(t0, steps, epoch, applied, first, revision, phases):
    a = sync.Announce(t0, tuple((n, us / 1e6) for n, us in phases), steps, epoch, applied, first, revision)
    assert sync.decode(a.encode()) == a


@given(wants=st.booleans(), applied=st.integers(-1, 2**31 - 1), epoch=st.integers(0, 0xFFFF),
       err=st.integers(0, 2**32 - 1))
def test_hello_round_trips(wants, applied, epoch, err):
    h = sync.Hello(wants, applied, epoch, err)
    assert sync.decode(h.encode()) == h


@given(first_seq=st.integers(0, 2**32 - 1), step=st.integers(0, 2**32 - 1), size=st.integers(0, 2**32 - 1),
       group=st.integers(1, 2**16 - 1))
def test_regroup_round_trips(first_seq, step, size, group):
    r = sync.Regroup(first_seq, step, size, group)
    assert sync.decode(r.encode()) == r


@given(offset=st.floats(-1e6, 1e6), skew=st.floats(-1e-3, 1e-3), pivot=st.floats(-1e9, 1e9),
       err=st.integers(0, 2**32 - 1))
def test_clock_map_round_trips(offset, skew, pivot, err):
    m = sync.ClockMap(offset, skew, pivot, err)
    assert sync.decode(m.encode()) == m


@given(o1=st.floats(-20, 20), s1=st.floats(-4e-4, 4e-4), p1=st.floats(-1e4, 1e4), o2=st.floats(-20, 20),
       s2=st.floats(-4e-4, 4e-4), p2=st.floats(-1e4, 1e4), t=st.floats(-1e4, 1e4))
def test_a_clock_map_composed_with_an_estimate_against_its_node_maps_to_the_servers_clock(o1, s1, p1, o2, s2, p2,
                                                                                         t):
    """carol's estimate of bob's clock, then bob's of the server's: the composed map is carol's of the
    server's at every moment, not only at the pivot."""
    bob = t + o1 + s1 * (t - p1)
    server = bob + o2 + s2 * (bob - p2)
    offset, skew = sync.ClockMap(o2, s2, p2).compose(o1, s1, p1)
    assert t + offset + skew * (t - p1) == pytest.approx(server, abs=1e-6)


def test_malformed_sync_and_snapshot_payloads_are_errors_not_values():
    good = sync.Announce(1, (("compute", 0.1),), 3, 0, 0).encode()
    regroup = sync.Regroup(1, 2, 3, 5).encode()
    clock = sync.ClockMap(1.0, 1e-5, 2.0, 3).encode()
    wild = sync.ClockMap(1.0, 0.5, 2.0, 3).encode()  # a clock running half again as fast: no laptop's
    nan = sync.ClockMap(float("nan"), 0.0, 2.0, 3).encode()
    for bad in (b"", b"\x09", good[:-1], good + b"\x00", regroup[:-1], regroup + b"\x00", clock[:-1], wild, nan):
        with pytest.raises(sync.SyncError):
            sync.decode(bad)
    blob = snap.encode_snapshot(snap.Snapshot(5, 1, {"params": np.arange(7, dtype=np.float32)}))
    assert snap.decode_snapshot(blob).arrays["params"].tolist() == list(range(7))
    for bad in (blob[:-1], blob + b"\x00", b"XXXX" + blob[4:], blob[:10]):
        with pytest.raises(snap.SnapshotError):
            snap.decode_snapshot(bad)


# ------------------------------------------------------------------------------ in the room


class _SilentOnce(Worker):
    """A worker whose gradient for step 3 never leaves it (a hand over its screen for that step)."""

    async def _maybe_compute(self) -> None:
        if self._due == 3 and self._open is None and self.has_state:
            self._due, self._next = None, 4  # (computed, never sent: step 3 is passed over, not caught up)
            self.replica.compute_gradient(3)
            return
        await super()._maybe_compute()


@pytest.mark.slow
def test_a_worker_silent_for_one_step_misses_it_and_the_room_goes_on(_quiet_logs):
    REGISTRY.register("actor.worker", "silent_once", _SilentOnce, replace=True)
    try:  # (registered for this test only: another test in this process lists the worker implementations)
        # The `exact` room: what is tested is the server's deadline going on without a word that never
        # came, not the camera (the default room's webcam carries the same exchange: test_node.py's optical run)
        nodes = [TWO[0], dict(TWO[1], actors={"worker": "silent_once"})]
        cfg = make_config(training={"steps": 6, "eval_every": 0, "quorum": 1}, room={"nodes": nodes, "profile": "exact"})
        result = _run(cfg)
    finally:
        REGISTRY.unregister("actor.worker", "silent_once")
    server = result["nodes"]["alice"]["server"]
    assert server["reduced"] == 6 and server["skipped"] == 0
    # Step 3 went on at its deadline without bob; waiting for its word, bob may be late for the next one too.
    missing = [(e["step"], e["missing"]) for e in _events(_quiet_logs) if e["event"] == "gradient_missing"]
    assert missing[0] == (3, ["bob"]) and all(m == ["bob"] and s > 3 for s, m in missing[1:]), missing
    # The average of what arrived went on; bob applied it too, so the replicas stay identical.
    assert result["nodes"]["bob"]["worker"]["applied"] == 6 and result["replicas_identical"]


@pytest.mark.slow
def test_clocks_far_apart_sync_straight_and_through_a_laptop_between_and_stay_in_lockstep(_quiet_logs):
    """Clocks up to 19.6 s and 400 ppm apart. bob reads alice's screen (the server's) and she his: he syncs
    against her frames. carol's camera does not see alice's screen: she syncs against bob's, whom she reads
    both ways, and composes that with bob's estimate of alice's clock (a ClockMap he sends her). Her
    gradients and alice's words go through bob; the schedule gives every hop its time, and the run is the
    in-process reference's, bit for bit."""
    steps = 4
    nodes = [dict(TWO[0], clock_offset_s=9.7, clock_drift_ppm=-195.0),
             dict(TWO[1], clock_offset_s=-9.9, clock_drift_ppm=198.0),
             {"name": "carol", "roles": ["worker"], "clock_offset_s": 4.0, "clock_drift_ppm": 180.0}]
    cfg = make_config(training={"steps": steps, "eval_every": 0}, room={"nodes": nodes, "profile": "exact"})

    async def go():
        run = RoomRun(cfg)
        run.medium.hide("carol", "alice")
        return await run.run()

    result = run_virtual(go)
    events = _events(_quiet_logs)
    assert [(e["node"], e["via"]) for e in events if e["event"] == "clock_sync_via"] == [("carol", "bob")]
    synced = {n: [e for e in events if e["event"] == "clock_synced" and e["node"] == n] for n in ("bob", "carol")}
    assert synced["bob"] and all("via" not in e and abs(e["residual_ms"]) < 15 for e in synced["bob"]), synced
    assert synced["carol"] and all(e["via"] == "bob" and abs(e["residual_ms"]) < 15 for e in synced["carol"]), synced
    # bob's clock reads 19.6 s behind alice's, carol's 5.7 s: found over the light, to within milliseconds
    clocks = {n: result["nodes"][n]["clock"] for n in ("bob", "carol")}
    assert clocks["bob"]["offset_s"] == pytest.approx(19.6, abs=0.05)
    assert clocks["carol"]["offset_s"] == pytest.approx(5.7, abs=0.05)
    assert all(c["residual_max_ms"] < 15 for c in clocks.values()), clocks
    sized = [e for e in events if e["event"] == "schedule_sized"]
    assert len(sized) == 1 and sized[0]["hops"] == 2
    assert result["applied"] == steps and result["replicas_identical"]
    assert result["nodes"]["carol"]["worker"]["params_sha256"] == _reference_sha(cfg)


@pytest.mark.slow
def test_worker_killed_and_restarted_rejoins_and_ends_identical(_quiet_logs):
    # The `exact` room (what is tested is the rejoin, not the camera: the default room's webcam carries the
    # same exchange in test_node.py's optical run). bob is down from 4 s to 5.5 s, a few steps into 20.
    cfg = make_config(training={"steps": 20, "eval_every": 0, "quorum": 1}, room={"nodes": TWO, "profile": "exact"})
    result = _run(cfg, faults=(Fault("bob", at_s=4.0, down_s=1.5),))
    events = _events(_quiet_logs)
    assert any(e["event"] == "node_killed" and e["node"] == "bob" for e in events)
    # alice greets bob's new run (a new run nonce) and forgets what she had of the old one
    assert any(e["event"] == "peer_restarted" and e["node"] == "alice" and e["peer"] == "bob" for e in events)
    assert any(e["event"] == "joining_late" and e["node"] == "bob" for e in events)
    adopted = [e for e in events if e["event"] == "snapshot_adopted" and e["node"] == "bob"]
    assert adopted and adopted[0]["reason"] == "no_state" and adopted[0]["via"] == "light"
    # Every step was averaged (quorum 1: alice's alone while bob was down); bob applied every word after the
    # snapshot and ends with alice's parameters, bit for bit.
    assert result["nodes"]["alice"]["server"]["reduced"] == 20
    assert result["replicas_identical"]
    assert result["nodes"]["bob"]["worker"]["state_applied"] == 20


@pytest.mark.slow
def test_the_steps_a_killed_worker_misses_are_made_up_at_the_end(_quiet_logs):
    """The same kill with the default quorum (every worker): the steps bob misses are skipped, owed and added
    at the end, so the run still applies its 20 steps, and bob ends on alice's state."""
    cfg = make_config(training={"steps": 20, "eval_every": 0}, room={"nodes": TWO, "profile": "exact"})
    result = _run(cfg, faults=(Fault("bob", at_s=4.0, down_s=1.5),))
    events = _events(_quiet_logs)
    skipped = [e for e in events if e["event"] == "step_skipped"]
    made_up = [e for e in events if e["event"] == "steps_made_up"]
    # (20 steps of 0.29 s: the end is always within 8 steps, so each skip is announced as it comes, the
    # later ones together)
    assert skipped and made_up and made_up[-1]["made_up"] == len(skipped) == result["made_up"]
    assert result["applied"] == 20 and result["nodes"]["alice"]["server"]["reduced"] == 20
    assert result["replicas_identical"] and result["nodes"]["bob"]["worker"]["state_applied"] == 20
    # bob's clock, started again, learnt the run's new last step from the server's announcement
    done = [e for e in events if e["event"] == "schedule_done"]
    assert {e["node"]: e["steps"] for e in done} == {"alice": 20 + len(skipped), "bob": 20 + len(skipped)}


@pytest.mark.slow
def test_a_room_whose_quorum_allows_starts_without_a_worker_that_never_came_and_one_who_comes_later_joins(_quiet_logs):
    """carol never starts; the server waits `wait_for_nodes_s` (5 s) for her, then starts the room without
    her (its quorum, 2, is alice and bob): every step is the reference's with carol's gradient left out.
    dave comes 4 s after that wait, more than ten steps into the run: the room started without him too,
    he asks to join, is admitted, takes a snapshot, and the steps after it average his gradient too."""
    steps = 6
    nodes = [*TWO, {"name": "carol", "roles": ["worker"]}]
    cfg = make_config(training={"steps": steps, "eval_every": 0, "quorum": 2},
                      room={"nodes": nodes, "profile": "exact", "wait_for_nodes_s": 5.0})
    result = _run(cfg, faults=(Fault("carol", at_s=0.0),))
    events = _events(_quiet_logs)
    known = {e["node"]: e for e in events if e["event"] == "sight_known"}
    assert sorted(known) == ["alice", "bob"] and all(e["started_without"] == ["carol"] for e in known.values())
    assert all(set(e["edges"]) == {"alice<-bob", "bob<-alice"} for e in known.values())
    assert result["applied"] == steps and result["replicas_identical"]
    assert result["nodes"]["alice"]["server"]["reduced"] == steps
    assert result["nodes"]["bob"]["worker"]["params_sha256"] == _reference_sha(cfg, absent=("carol",))

    nodes.append({"name": "dave", "roles": ["worker"]})
    cfg = make_config(training={"steps": 22, "eval_every": 0, "quorum": 2, "exchange": "server"},
                      room={"nodes": nodes, "profile": "exact", "wait_for_nodes_s": 5.0})
    _quiet_logs.seek(0)
    _quiet_logs.truncate()
    result = _run(cfg, faults=(Fault("carol", at_s=0.0), Fault("dave", at_s=0.0, down_s=9.0)))
    events = _events(_quiet_logs)
    joined = [e for e in events if e["event"] == "rank_joined"]
    assert {e["node"] for e in joined} == {"alice", "bob"} and all(e["joined"] == ["dave"] for e in joined)
    assert any(e["event"] == "joining_room" and e["node"] == "dave" for e in events)
    late = [e for e in events if e["event"] == "joining_late" and e["node"] == "dave"]
    assert len(late) == 1 and late[0]["join_step"] >= 10, late
    assert any(e["event"] == "snapshot_adopted" and e["node"] == "dave" for e in events)
    averaged = [e for e in events if e["event"] == "gradients_averaged"]
    assert {e["step"] for e in averaged} == set(range(22))
    assert averaged[-1]["contributors"] == ["alice", "bob", "dave"], averaged[-1]
    assert result["applied"] == 22 and result["replicas_identical"]
    assert result["nodes"]["dave"]["worker"]["state_applied"] == 22


@pytest.mark.slow
def test_server_killed_resumes_from_its_checkpoint(_quiet_logs, tmp_path):
    # The `exact` room (what is tested is the resume, not the camera). alice, down from 5 s to 6.5 s, resumes
    # from her latest checkpoint (every 5 steps) and applies the rest of the 22 steps: 12 or so in all (the
    # in-process reference is over 0.8 from its 9th step).
    steps = 22
    cfg = make_config(training={"steps": steps}, recovery={"checkpoint_every": 5, "checkpoint_dir": str(tmp_path)},
                      room={"nodes": TWO, "profile": "exact"})
    result = _run(cfg, faults=(Fault("alice", at_s=5.0, down_s=1.5),))
    events = _events(_quiet_logs)
    resumed = [e for e in events if e["event"] == "server_resumed"]
    assert len(resumed) == 1 and resumed[0]["applied"] % 5 == 0 and resumed[0]["epoch"] == 1
    # the resumed server keeps its checkpoint's schedule: bob, who kept ticking it, goes on in step
    fixed = [e for e in events if e["event"] == "schedule_fixed"]
    assert len(fixed) == 2 and fixed[0]["t0"] == fixed[1]["t0"] and fixed[1]["join_step"] > 0
    adopted = [e for e in events if e["event"] == "snapshot_adopted" and e["node"] == "bob"]
    assert adopted and adopted[0]["reason"] == "new_epoch" and adopted[0]["snapshot_applied"] == resumed[0]["applied"]
    assert result["replicas_identical"]
    server = result["nodes"]["alice"]["server"]
    assert server["epoch"] == 1 and server["applied"] > resumed[0]["applied"]
    assert result["test_accuracy"] >= 0.75


@pytest.mark.slow
def test_ranks_resume_from_the_latest_checkpoint_they_all_hold_when_every_node_is_a_rank(_quiet_logs, tmp_path):
    """exchange = "collectives": every rank writes its checkpoints (the latest and the one before). bob lost
    his latest (killed before writing it): resuming, the ranks agree on the step both hold with one state
    and train on from it to the bits of a run never stopped."""
    # a key of its own: a simulated room that names none draws one a run, and a checkpoint must outlive its run
    exact = {"profile": "exact", "nodes": TWO, "key_file": str(ROOT / "rooms" / "demo-room.key")}
    link = {"rows": 60, "cols": 110, "cell_px": 10, "hold_s": 0.1}
    steps = dict(exchange="collectives", steps=6)
    whole = _run(make_config(room=exact, link=link, training=steps, recovery={"checkpoint_every": 0}))
    rec = {"checkpoint_every": 2, "checkpoint_dir": str(tmp_path)}
    first = _run(make_config(room=exact, link=link, training=dict(steps, steps=4), recovery=rec))
    assert first["applied"] == 4 and first["nodes"]["bob"]["worker"]["checkpoints"] == 2
    latest = {p.name for p in tmp_path.iterdir()}
    assert latest == {f"session1-{n}.ckpt{k}" for n in ("alice", "bob") for k in ("", ".1")}, latest
    (tmp_path / "session1-bob.ckpt").unlink()
    (tmp_path / "session1-bob.ckpt.1").rename(tmp_path / "session1-bob.ckpt")  # bob's step 2 only
    again = _run(make_config(room=exact, link=link, training=steps, recovery=dict(rec, resume=True)))
    resumed = [e for e in _events(_quiet_logs) if e["event"] == "rank_resumed"]
    assert [(e["node"], e["step"], e["applied"]) for e in sorted(resumed, key=lambda e: e["node"])] == \
        [("alice", 2, 2), ("bob", 2, 2)]
    assert again["replicas_identical"] and again["applied"] == 6
    assert again["nodes"]["alice"]["worker"]["params_sha256"] == whole["nodes"]["alice"]["worker"]["params_sha256"]
    # with bob's checkpoints gone there is no state in common: the run stops on every rank, saying what each holds
    for p in tmp_path.glob("session1-bob.ckpt*"):
        p.unlink()
    with pytest.raises(BaseException):  # noqa: B017 - the room's TaskGroup raises the nodes' failures as a group
        _run(make_config(room=exact, link=link, training=steps, recovery=dict(rec, resume=True)))
    gave_up = [e["error"] for e in _events(_quiet_logs) if e["event"] == "actor_gave_up"]
    assert gave_up and all("hold no checkpoint of one state in common (alice: step 4, step 6; bob: none)" in g
                           for g in gave_up), gave_up


RANKS = [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"]},
         {"name": "carol", "roles": ["worker"]}]
DENSE = {"rows": 60, "cols": 110, "cell_px": 10, "hold_s": 0.1}


@pytest.mark.slow
def test_a_rank_killed_and_restarted_rejoins_when_every_node_is_a_rank(_quiet_logs):
    """exchange = "collectives": carol's laptop crashes mid-run and starts again knowing nothing. alice and bob
    wait in the step's collective for her part; her fresh node takes its row of the sight from their frames and
    asks alice (the server role) to rejoin; alice voids the collectives so far and shows bob and carol her state
    and the step to go on from. (Where a camera does not read alice's screen, these go through other ranks:
    tests/test_relay.py.) Every rank applies all 12 steps (carol is down from 3 s to 4.5 s: the group regroups
    near step 6) and they end identical, and so does the observer, which watched alice throughout (alice's state
    did not change when the group regrouped)."""
    nodes = [*RANKS, {"name": "dave", "roles": ["observer"]}]
    cfg = make_config(room={"profile": "exact", "nodes": nodes}, link=DENSE,
                      training={"steps": 12, "eval_every": 0, "exchange": "collectives"})
    result = _run(cfg, faults=(Fault("carol", at_s=3.0, down_s=1.5, resume=False),))
    events = _events(_quiet_logs)
    regrouped = [e for e in events if e["event"] == "group_regrouped"]
    assert [(e["node"], e["joined"]) for e in regrouped] == [("alice", ["carol"])], regrouped
    step, applied = regrouped[0]["step"], regrouped[0]["applied"]
    assert 0 < step < 12 and applied == step  # (no step was skipped: every step before it applied)
    adopted = {e["node"]: e for e in events if e["event"] == "snapshot_adopted"}
    assert set(adopted) == {"bob", "carol"} and all(e["reason"] == "regroup" and e["step"] == step
                                                   and e["snapshot_applied"] == applied for e in adopted.values())
    assert adopted["carol"]["applied_before"] == 0  # she came back with nothing
    assert {e["node"] for e in events if e["event"] == "collectives_voided"} == {"alice", "bob", "carol"}
    nodes = result["nodes"]
    # the collectives went on after the void: every rank applied each of the 12 steps once after it
    assert result["applied"] == 12 and result["replicas_identical"]
    for n in ("alice", "bob", "carol"):
        w = nodes[n]["worker"]
        assert w["applied"] == 12 and w["regroups"] == 1 and w["skipped"] == 0, (n, w)
    dave = nodes["dave"]["observer"]
    assert result["observer_identical"] is True and dave["applied"] == 12 and not dave["stalled"]


@pytest.mark.slow
def test_when_every_node_is_a_rank_the_room_starts_without_one_that_never_came_and_one_who_comes_later_joins(
        _quiet_logs):
    """exchange = "collectives", quorum 2: carol never starts, so after `wait_for_nodes_s` alice (the server
    role) starts the room with alice and bob, whose collectives run over the two of them. dave starts more than
    ten steps later: he is let into the room, asks alice to join, and she regroups: the collectives from then on
    run over the three, every rank going on from her state. Every rank applies every step, and they end
    identical, as does the observer, which watched alice throughout. (28 steps of about 0.2 s from 5.3 s:
    dave, up at 6.5 s, is in the group from near step 19.)"""
    nodes = [*RANKS, {"name": "dave", "roles": ["worker"]}, {"name": "eve", "roles": ["observer"]}]
    cfg = make_config(room={"profile": "exact", "nodes": nodes, "wait_for_nodes_s": 5.0}, link=DENSE,
                      training={"steps": 28, "eval_every": 0, "exchange": "collectives", "quorum": 2})
    result = _run(cfg, faults=(Fault("carol", at_s=0.0), Fault("dave", at_s=0.0, down_s=6.5)))
    events = _events(_quiet_logs)
    ready = {e["node"]: e.get("started_without") for e in events if e["event"] == "rank_ready"}
    assert ready == {"alice": ["carol", "dave"], "bob": ["carol", "dave"], "dave": ["carol", "dave"]}, ready
    first = [e for e in events if e["event"] == "step_applied" and e["node"] == "alice"]
    regrouped = [e for e in events if e["event"] == "group_regrouped"]
    assert [(e["node"], e["joined"], e["group"]) for e in regrouped] == [("alice", ["dave"], ["alice", "bob", "dave"])]
    step = regrouped[0]["step"]
    assert step >= 10 and all(e["averaged"] == 2 for e in first if e["step"] < step), regrouped
    assert all(e["averaged"] == 3 for e in first if e["step"] >= step)
    adopted = {e["node"]: e for e in events if e["event"] == "snapshot_adopted"}
    assert set(adopted) == {"bob", "dave"} and adopted["dave"]["applied_before"] == 0
    # dave has no part in the step running when he says hello: alice lets it finish and regroups before the next,
    # so no step's work is thrown away at hers (bob may still be agreeing on it: he takes it with her state)
    voided = {e["node"]: e["running"] for e in events if e["event"] == "collectives_voided"}
    assert voided["alice"] == [] and regrouped[0]["applied"] == step, (voided, regrouped)
    nodes = result["nodes"]
    assert result["applied"] == 28 and result["replicas_identical"]
    assert all(nodes[n]["worker"]["applied"] == 28 and nodes[n]["worker"]["skipped"] == 0 for n in ("alice", "bob", "dave"))
    assert result["observer_identical"] is True and nodes["eve"]["observer"]["applied"] == 28


@pytest.mark.slow
def test_the_lead_rank_killed_and_restarted_stops_saying_to_resume_from_checkpoints(_quiet_logs):
    cfg = make_config(room={"profile": "exact", "nodes": RANKS[:2]}, link=DENSE,
                      training={"steps": 20, "eval_every": 0, "exchange": "collectives"},
                      collectives={"timeout_s": 10.0})
    with pytest.raises(BaseException):  # noqa: B017 - the room's TaskGroup raises the nodes' failures as a group
        _run(cfg, faults=(Fault("alice", at_s=3.0, down_s=1.5, resume=False),))
    gave_up = [(e["node"], e["error"]) for e in _events(_quiet_logs) if e["event"] == "actor_gave_up"]
    assert any(n == "alice" and "leads the group" in err and "--resume" in err for n, err in gave_up), gave_up
