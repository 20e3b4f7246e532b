"""The node runtime end to end: exactness, swapped parts, restarts, light-only, shutdown."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from actors.camera_reader import CameraReader
from actors.frame_decoder import FrameDecoder

from protocols.layout import render
from protocols.messages import Capture, TensorReceived
from protocols.transfer import TransferAssembler
from wccl.runtime.harness import ActorHarness
from wccl.media.fake import FakeCamera
from protocols.registry import REGISTRY
from wccl.runtime.supervisor import NodeFailed
from wccl.runtime.timebase import NodeClock
from wccl.keys import new_run_nonce

from conftest import ROOT, make_config, run_room, run_virtual


def _reference_sha(cfg, absent: tuple[str, ...] = ()) -> str:
    from wccl.training.data import load_dataset
    from wccl.training.replica import reference_run

    from wccl.training.exchange import codec_from_config

    tr = cfg.training
    params, _ = reference_run(model_name=tr.model, init=tr.init, seed=tr.seed, optimizer=tr.optimizer, lr=tr.lr,
                              momentum=tr.momentum,
                              dataset=load_dataset(tr.dataset, seed=tr.data_seed, test_size=tr.test_size),
                              batch_size=tr.batch_size, data_seed=tr.data_seed, workers=cfg.room.workers,
                              steps=tr.steps, eval_every=tr.steps,
                              codec=None if tr.codec == "bf16" else codec_from_config(tr), split=tr.split,
                              absent=absent)
    return hashlib.sha256(params.numpy().tobytes()).hexdigest()


@pytest.mark.slow
def test_optical_run_is_bit_exact_with_in_process_reference():
    cfg = make_config(training={"steps": 6, "eval_every": 0})
    result = run_room(cfg)
    shas = {n: (r.get("worker") or r["observer"])["params_sha256"] for n, r in result["nodes"].items()}
    assert len(shas) == 3 and result["applied"] == 6 and result["replicas_identical"]  # and carol, the observer
    assert set(shas.values()) == {_reference_sha(cfg)}
    # Everything that crossed between the nodes came through the cameras: bob's gradients, alice's averages,
    # and their clocks (bob's clock is off by seconds, and runs at its own rate).
    assert result["link"]["alice"]["tensors_grad"] == 6 and result["link"]["bob"]["tensors_avg"] == 6
    assert result["link"]["bob"]["tensors_sync"] > 0 and result["link"]["alice"]["tensors_sync"] > 0
    bob_clock = result["nodes"]["bob"]["clock"]
    assert abs(bob_clock["offset_s"]) > 1.0 and bob_clock["residual_max_ms"] < 15


@pytest.mark.slow
def test_a_built_in_run_with_a_codec_and_a_by_class_split_is_bit_exact_with_its_reference():
    from wccl.compression import get_codec

    # The `exact` room: what is tested is the codec's exchange (the webcam's: the optical run above)
    cfg = make_config(training={"steps": 6, "eval_every": 0, "codec": "topk_ef", "topk_ratio": 0.25,
                                "split": "by_class"}, room={"profile": "exact"})
    result = run_room(cfg)
    shas = {n: (r.get("worker") or r["observer"])["params_sha256"] for n, r in result["nodes"].items()}
    assert len(shas) == 3 and result["applied"] == 6 and result["replicas_identical"]
    # the same bits as the in-process run of the same exchange (each side's error feedback included) ...
    assert set(shas.values()) == {_reference_sha(cfg)}
    # ... which is not the bf16 run's, and what each side framed is the codec's size
    assert _reference_sha(cfg) != _reference_sha(make_config(training={"steps": 6, "eval_every": 0,
                                                                       "split": "by_class"}, room={"profile": "exact"}))
    size = get_codec("topk_ef", ratio=0.25).encoded_size(670)
    assert size < 2 * 670 / 2
    assert result["nodes"]["bob"]["worker"]["bytes_sent"] == 6 * size
    assert result["nodes"]["alice"]["server"]["bytes_sent"] == 6 * size


@pytest.mark.slow
def test_a_laptop_facing_away_is_named_within_start_up_with_what_each_camera_saw(_quiet_logs):
    # carol's lid faces away from the table: no camera reads her screen and hers films the wall. At the end
    # of start-up's budget every rank says, as an error, whom it never heard of and what its own camera saw,
    # so that a person knows which laptop to turn; then it waits until its timeout (a laptop may be moved).
    # (On a loaded machine alice once read no frame of bob's in those 11.7 s: then she names both and says
    # that her camera found bob's code but read no frame of it.)
    from protocols.discovery import startup_budget_s

    nodes = [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"]},
             {"name": "carol", "roles": ["worker"], "channel": {"yaw_deg": 180.0}}]
    cfg = make_config(training={"steps": 3, "eval_every": 0}, sync={"timeout_s": 12.5},
                      collectives={"timeout_s": 12.5}, room={"profile": "webcam", "nodes": nodes})
    with pytest.raises(BaseExceptionGroup) as eg:
        run_room(cfg)
    events = [json.loads(line) for line in _quiet_logs.getvalue().splitlines()]
    said = {e["node"]: e for e in events if e["event"] == "room_not_connected"}
    assert set(said) == {"alice", "bob", "carol"}, said
    assert all(e["t"] <= startup_budget_s(3) + 0.1 for e in said.values()), said
    for seeing, other in (("alice", "bob"), ("bob", "alice")):
        problem = said[seeing]["problem"]
        if problem.startswith("never heard of carol in 11.7 s"):
            assert f"its camera reads the screens of {other} and found no other code" in problem, problem
            assert "out of its view, faces away, or is too small or slanted to find" in problem, problem
        else:  # it read no frame of the other's either: its camera saw their code and could not read it
            assert problem.startswith(f"never heard of {', '.join(sorted([other, 'carol']))} in 11.7 s"), problem
            assert "its camera found codes in" in problem and "but read no frame of them" in problem, problem
    assert said["carol"]["problem"].startswith("never heard of alice, bob"), said["carol"]
    assert "its camera found no code" in said["carol"]["problem"], said["carol"]
    failed = {str(e).split(":")[0]: str(e) for e in eg.value.subgroup(NodeFailed).exceptions}
    for node in ("alice", "bob"):
        assert "carol in 12.5 s" in failed[f"node {node}"] and "what this rank saw: its camera" in failed[f"node {node}"]


def test_a_cameras_view_names_the_screens_it_reads_and_a_code_away_from_them_that_it_cannot():
    import numpy as np

    from actors.frame_decoder import CameraView

    view = CameraView(captures=50, with_code=50, frames_ok=40, image=(1280, 720), cells=(126, 52))
    view.read_from.add(1)
    view.read_code(np.array([300.0, 360.0]), 400)
    view.unread_code(np.array([320.0, 350.0]), 400, 220)  # a failed read of the screen it reads: not another
    assert "reads the screens of bob and found no other code" in view.seen(["alice", "bob", "carol"])
    view.unread_code(np.array([1000.0, 380.0]), 104, 60)
    seen = view.seen(["alice", "bob", "carol"])
    assert seen.startswith("its camera reads the screens of bob; it also found, away from those, a code it could "
                           "not read, the largest 104x60 camera px, 8 % of the image's width (0.8 to 2.0 camera px"), seen
    assert CameraView(captures=5).seen(["a"]).startswith("its camera found no code in 5 captures")


@pytest.mark.slow
def test_laptops_too_far_apart_say_what_their_cameras_saw(_quiet_logs):
    # 1.6 m apart: each camera finds the other's code but its cells are under 3 camera px. Nothing moves: at
    # the end of start-up's budget (10 s, before the 11 s timeout) a node gives up, saying what its camera saw
    # (with the sizes) and what each camera read, and stops the run.
    nodes = [{"name": "alice", "roles": ["server", "worker"], "channel": {"position_m": [0.0, 0.0, 0.0]}},
             {"name": "bob", "roles": ["worker"], "channel": {"position_m": [0.0, 0.0, 1.6]}}]
    # (one layout, pinned: the cameras try it alone on every capture, as they would try each of the ladder)
    cfg = make_config(training={"steps": 3, "eval_every": 0}, sync={"timeout_s": 11.0},
                      room={"profile": "webcam", "nodes": nodes},
                      link={"choose": "pinned", "rows": 48, "cols": 88, "cell_px": 14, "hold_s": 0.1})
    with pytest.raises(BaseExceptionGroup) as eg:
        run_room(cfg)
    failed = [str(e) for e in eg.value.subgroup(NodeFailed).exceptions]
    assert failed
    for msg in failed:
        assert "in 10 s" in msg and "found codes in" in msg and "read no frame of them" in msg, msg
        assert "camera px a cell" in msg and "bring the laptops closer" in msg, msg
        assert "What each camera read: " in msg and "-> alice: " in msg and "-> bob: " in msg, msg
    events = [json.loads(line) for line in _quiet_logs.getvalue().splitlines()]
    gave_up = [e for e in events if e["event"] == "startup_gave_up"]
    assert gave_up and all(e["t"] <= 10.5 and len(e["directions"]) == 2 for e in gave_up), gave_up


@pytest.mark.slow
@pytest.mark.parametrize("blind", ["bob", "alice"])
def test_camera_swapped_for_a_fake_through_the_registry(blind, _quiet_logs):
    # One camera has its lens cap on. That node reads no screen, and the other is never greeted back (no
    # frame of the blind one echoes its run nonce): both say so and stop, instead of training out of step.
    # No other path exists between them.
    nodes = [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"]}]
    nodes[0 if blind == "alice" else 1]["camera"] = "fake"
    # (a restart cannot fix that: the node fails at once, whatever its restart policy)
    # The `exact` room: what is tested is what each node makes of a camera that reads nothing, and the seeing
    # camera reads every frame there; a webcam that reads some screens and not others: the facing-away test above.
    cfg = make_config(training={"steps": 3, "eval_every": 0}, sync={"timeout_s": 4.0},
                      room={"nodes": nodes, "profile": "exact"})
    with pytest.raises(BaseExceptionGroup) as eg:
        run_room(cfg)
    failed = {str(e).split(":")[0]: str(e) for e in eg.value.subgroup(NodeFailed).exceptions}
    seeing = "alice" if blind == "bob" else "bob"
    assert f"never heard of {seeing}" in failed[f"node {blind}"], failed
    assert "its camera found no code" in failed[f"node {blind}"], failed  # (what it saw: nothing)
    assert "was never greeted back" in failed[f"node {seeing}"], failed
    events = [json.loads(line) for line in _quiet_logs.getvalue().splitlines()]
    assert not any(e["event"] == "actor_restarted" for e in events)
    assert not any(e["event"] == "step_applied" for e in events)


def test_fake_camera_frames_decode_to_the_tensor_they_show():
    cfg = make_config()
    codec = cfg.link.codec()
    payload = bytes(range(256)) * 6
    packets = codec.encode(payload, count=3, session=1, sender=0, stream="avg", step=4)
    images = [render(p, codec.layout, 1280, 720, sender=0, parity=i & 1) for i, p in enumerate(packets)]

    async def go():
        clock = NodeClock(origin=0.0)
        camera = FakeCamera(clock, fps=30, images=images)
        async with ActorHarness(CameraReader, node="bob", clock=clock, camera=camera) as cam:
            while len(cam.outputs) < 5:
                await __import__("asyncio").sleep(0.05)
            await cam.stop()
            caps = cam.of_type(Capture)
        async with ActorHarness(FrameDecoder, node="bob", clock=clock, codec=codec, session=1,
                                node_names=["alice", "bob"], transfers=TransferAssembler(), listen=True) as dec:
            for c in caps:
                await dec.send(c)
            await dec.settle()
        return dec.of_type(TensorReceived)

    got = run_virtual(go)
    assert len(got) == 1
    assert (got[0].origin, got[0].stream, got[0].step, got[0].payload) == ("alice", "avg", 4, payload)


def _crashing_camera_reader(crashes: int | None):
    count = {"n": 0}

    class Crashing(CameraReader):
        async def run(self) -> None:
            if crashes is None or count["n"] < crashes:
                count["n"] += 1
                raise RuntimeError("camera cable pulled")
            await super().run()

    return Crashing


@pytest.mark.slow
def test_crashing_actor_is_restarted_by_policy_and_the_run_stays_exact():
    REGISTRY.register("actor.camera_reader", "crash_twice", _crashing_camera_reader(2), replace=True)
    # The `exact` room: what is tested is the supervisor's restart of bob's camera reader (the actor every
    # profile's camera is read through) and a run that stays exact after it, not the webcam's picture
    cfg = make_config(training={"steps": 4, "eval_every": 0},
                      room={"profile": "exact",
                            "nodes": [{"name": "alice", "roles": ["server", "worker"]},
                                      {"name": "bob", "roles": ["worker"], "actors": {"camera_reader": "crash_twice"}}]})
    result = run_room(cfg)
    assert result["restarts"] == {"bob": {"camera_reader": 2}}
    assert result["replicas_identical"] and result["applied"] == 4


def test_node_fails_cleanly_once_the_restart_policy_is_exhausted(_quiet_logs):
    REGISTRY.register("actor.camera_reader", "crash_always", _crashing_camera_reader(None), replace=True)
    cfg = make_config(training={"steps": 4},
                      supervision={"actors": {"camera_reader": {"max_restarts": 2, "window_s": 10.0}}},
                      room={"nodes": [{"name": "alice", "roles": ["server", "worker"]},
                                      {"name": "bob", "roles": ["worker"], "actors": {"camera_reader": "crash_always"}}]})
    with pytest.raises(BaseExceptionGroup) as eg:
        run_room(cfg)
    assert eg.group_contains(NodeFailed)
    events = [json.loads(line) for line in _quiet_logs.getvalue().splitlines()]
    restarted = [e for e in events if e["event"] == "actor_restarted"]
    failed = [e for e in events if e["event"] == "actor_failed"]
    assert len(restarted) == 2 and len(failed) == 1 and failed[0]["node"] == "bob"
    assert any(e["event"] == "node_failed" and e["node"] == "bob" for e in events)


def test_nodes_share_no_state_but_the_room():
    """Walk each built node's object graph: the only objects both reach are the room and immutable values."""
    import asyncio
    import dataclasses
    import enum
    import gc
    import types

    import numpy as np
    import torch

    from wccl.node import RoomRun

    async def go():
        run = RoomRun(make_config(training={"steps": 1}, dashboard={"enabled": True, "port": 0}))
        for sup in run.supervisors:
            sup.build()
        return run

    run = run_virtual(go)
    medium = run.medium
    stop_types = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodWrapperType,
                  types.CodeType, asyncio.AbstractEventLoop, asyncio.Event)
    immutable = (str, bytes, int, float, bool, type(None), tuple, frozenset, range)

    def reachable(root, stop: dict[int, object] | None = None) -> dict[int, object]:
        seen: dict[int, object] = {}
        todo = [root]
        while todo:
            obj = todo.pop()
            if id(obj) in seen or isinstance(obj, stop_types + (enum.Enum,)):
                continue
            if stop is not None and (obj is medium or id(obj) in stop):
                continue
            if obj is run.stop or obj is run:  # the room run's stop button is the laptop's power switch
                continue
            if obj is run.monitor:  # the dashboard's tap: every node writes to it, it never answers one
                continue
            seen[id(obj)] = obj
            todo.extend(gc.get_referents(obj))
            if isinstance(obj, torch.Tensor):
                todo.append(obj.untyped_storage()) if obj.device.type == "cpu" else None
        return seen

    room = reachable(medium)  # the room and everything in it: the light between the laptops
    assert len(run.supervisors) == 3 and run.monitor is not None  # trainers, the observer, the dashboard
    graphs = [reachable(s, room) for s in run.supervisors]
    for i, a in enumerate(graphs):
        for b in graphs[i + 1:]:
            shared = [a[k] for k in a.keys() & b.keys()]
            mutable = [o for o in shared
                       if not isinstance(o, immutable + (enum.Enum, np.dtype, torch.dtype, torch.device))
                       and not (dataclasses.is_dataclass(o) and o.__dataclass_params__.frozen)]
            # Room parts (screens/cameras) are views of the medium: each node has its own.
            assert not mutable, [type(o).__name__ for o in mutable][:20]
        assert [o for o in a.values() if isinstance(o, (np.ndarray, torch.Tensor))]  # it went through data, models
    # ...and it would see a back channel: a queue both nodes hold.
    back_channel = asyncio.Queue()
    for sup in run.supervisors[:2]:  # alice and bob, the workers
        sup.deps["worker"]["side_door"] = back_channel
    a, b = (reachable(s, room) for s in run.supervisors[:2])
    assert id(back_channel) in a.keys() & b.keys()


@pytest.mark.slow
def test_sigint_shuts_down_cleanly():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "wccl.node", "--config", "config.toml", "--clock", "realtime",
                          "--log-format", "json"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    try:
        deadline = time.monotonic() + 90
        lines = []
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            lines.append(line)
            if '"gradient_computed"' in line or '"gradients_averaged"' in line or '"node_started"' in line and len(lines) > 2:
                break
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    events = [json.loads(x)["event"] for x in (lines + out.splitlines()) if x.startswith("{")]
    assert p.returncode == 130, err
    assert "Traceback" not in err
    assert events.count("node_finished") == 3 and "run_interrupted" in events  # alice, bob, carol (observer)
    assert "run_finished" not in events


@pytest.mark.slow
def test_a_room_file_that_names_only_its_nodes_runs_as_well_as_the_shipped_one(tmp_path):
    """Defaults in code are the best we know (issue 16): the start-up ladder and the auto schedule."""
    room = tmp_path / "nodes-only.toml"
    room.write_text('[room]\nprofile = "webcam"\n\n[[room.nodes]]\nname = "alice"\nroles = ["server", "worker"]\n\n'
                    '[[room.nodes]]\nname = "bob"\nroles = ["worker"]\n')
    p = subprocess.run([sys.executable, "-m", "wccl.node", "--config", str(room), "--log-format", "json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    events = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    (fixed,) = [e for e in events if e["event"] == "schedule_fixed" and e.get("node") == "alice"]
    (f,) = [e for e in events if e["event"] == "run_finished"]
    assert fixed["period_s"] <= 2.0, fixed
    assert f["applied"] == 30 and f["replicas_identical"] is True and f["test_accuracy"] >= 0.84, f
    print(f"nodes-only room: step {fixed['period_s']} s, {f}")


@pytest.mark.slow
def test_a_dim_room_whose_webcams_take_15_frames_a_second_applies_every_step():
    """rooms/pairs/dim.toml (15 fps, 33 ms exposure and readout): the 67 ms layouts beat with these cameras
    (reads for seconds, then none) and are not chosen (an 83 ms hold, a quarter period off, reads steadily);
    the windows hold the frames' measured flight: each of 8 steps is applied."""
    p = subprocess.run([sys.executable, "-m", "wccl.node", "--config", "rooms/pairs/dim.toml", "--steps", "8",
                        "--log-format", "json", "--log-level", "info"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    events = [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]
    (used,) = [e for e in events if e["event"] == "layout_used" and e.get("node") == "alice"]
    (sized,) = [e for e in events if e["event"] == "schedule_sized"]
    (f,) = [e for e in events if e["event"] == "run_finished"]
    from protocols.discovery import steady_hold

    assert steady_hold(used["hold_s"], 1 / 15), used
    assert sized["round_trip_s"] > 0.15, sized  # (two camera periods and more: measured, not assumed)
    assert f["applied"] == 8 and f["replicas_identical"] is True, f


def test_two_reads_that_cannot_be_corrected_alone_are_combined_cell_by_cell():
    import dataclasses

    import numpy as np
    import pytest as _pytest

    from protocols import fec, transfer
    from wccl.imaging.reader import ReadCode

    cfg = make_config()
    codec = cfg.link.codec()
    packets = codec.encode(bytes(range(256)) * 4, count=2, session=1, sender=0, stream="avg", step=4)  # frames
    rng = np.random.default_rng(0)

    def read(packet, bad, parity=0):
        """A read of `packet` whose cells `bad` are wrong, and doubted a little (but not erased)."""
        raw = cells_of(packet)
        sym = raw.copy()
        sym[bad] = (sym[bad] + 1 + rng.integers(0, codec.layout.colours - 1, len(bad))) % codec.layout.colours
        conf = np.ones(len(sym), np.float32)
        conf[bad] = 0.3
        return ReadCode(None, 0, parity, False, sym.astype(np.uint8), conf, 10.0)

    def cells_of(packet):
        from protocols import cells

        return cells.bytes_to_symbols(packet, codec.layout.colours, codec.layout.n_data)  # what the screen shows

    n = codec.layout.n_data
    half = n // 2
    # each read has a fifth of its cells wrong: far beyond what the code corrects; but never the same cells
    a_bad = rng.choice(np.arange(half), n // 5, replace=False)
    b_bad = rng.choice(np.arange(half, n), n // 5, replace=False)
    a, b = read(packets[0], a_bad), read(packets[0], b_bad)
    for r in (a, b):
        with _pytest.raises(fec.UncorrectableFrame):
            codec.decode_message(r.symbols, r.confidence)

    async def go():
        clock = NodeClock(origin=0.0)
        async with ActorHarness(FrameDecoder, node="bob", clock=clock, codec=codec, session=1,
                                node_names=["alice", "bob"], transfers=TransferAssembler(), listen=True) as dec:
            d = dec.actor
            with _pytest.raises(fec.UncorrectableFrame):
                d._decode(a, 1.00)
            message, _, used = d._decode(b, 1.03)  # the same screen 33 ms later: combined
            assert d.stats["captures_combined"] == 1
            assert transfer.parse_message(message).header is not None and message == codec.decode_message(
                cells_of(packets[0]))[0]
            # a read of another frame, or too late, or of the other parity, is not combined (and a combination
            # of two frames would fail the check anyway)
            other = read(packets[1], b_bad)
            for first, second, t in ((a, other, 0.03), (a, b, 0.5), (a, dataclasses.replace(b, parity=1), 0.03)):
                d._failed.clear()
                with _pytest.raises(fec.UncorrectableFrame):
                    d._decode(first, 2.0)
                with _pytest.raises(fec.UncorrectableFrame):
                    d._decode(second, 2.0 + t)
            assert d.stats["captures_combined"] == 1

    run_virtual(go)


def test_the_decoder_measures_its_cameras_period_by_the_cameras_own_count():
    # A 30 fps camera whose decoder had time for every other capture (the rest dropped from its mailbox):
    # the camera's period is still 1/30 s, so discovery keeps the 50 ms layouts; a 15 fps camera's is 1/15.
    import numpy as np

    from protocols.discovery import SightTable
    from protocols.security import Handshake

    def period(fps: float, every: int) -> float:
        cfg = make_config()
        sight = SightTable(0, 2, (0.05, 0.1))

        async def go():
            clock = NodeClock(origin=0.0)
            async with ActorHarness(FrameDecoder, node="alice", clock=clock, codec=cfg.link.codec(), session=1,
                                    node_names=["alice", "bob"], transfers=TransferAssembler(),
                                    handshake=Handshake(0, 2, new_run_nonce(), sight=sight)) as dec:
                for seq in range(0, 40, every):
                    await dec.send(Capture(sender="alice", time=seq / fps, image=np.zeros((72, 128, 3), np.uint8),
                                           seq=seq))
                await dec.settle()

        run_virtual(go)
        return sight.camera_period_s

    assert period(30.0, 2) == pytest.approx(1 / 30)
    assert period(15.0, 1) == pytest.approx(1 / 15)


def test_a_new_camera_is_one_file_and_one_registration_line(tmp_path, monkeypatch):
    """A camera kind of its own, written as a user would: one module whose last line registers it. The room
    file names it; the registry imports its module when the kind is first looked up; the run reads through
    it (here: the room's camera, counting what it hands over)."""
    (tmp_path / "counting_camera.py").write_text(
        "from protocols.registry import REGISTRY\n"
        "CAPTURES = []\n\n\n"
        "class Counting:\n"
        "    def __init__(self, inner):\n"
        "        self.inner = inner\n\n"
        "    async def recv(self):\n"
        "        got = await self.inner.recv()\n"
        "        CAPTURES.append(got[1])\n"
        "        return got\n\n"
        "    def __getattr__(self, name):\n"
        "        return getattr(self.inner, name)\n\n\n"
        "def counting(*, medium, node, clock, config):\n"
        "    return Counting(medium.camera(node, clock))\n\n\n"
        "REGISTRY.register('camera', 'counting', counting)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    REGISTRY.sources("camera", "counting_camera")  # the registration line: among the kind's sources
    try:
        # The `exact` room: what is tested is the registry (the room file names the kind, its module is
        # imported, the run reads through it), not the picture the wrapped camera sees
        cfg = make_config(training={"steps": 2, "eval_every": 0},
                          room={"profile": "exact",
                                "nodes": [{"name": "alice", "roles": ["server", "worker"]},
                                          {"name": "bob", "roles": ["worker"], "camera": "counting"}]})
        result = run_room(cfg)
    finally:
        REGISTRY.unregister("camera", "counting")
    import counting_camera

    assert result["applied"] == 2 and result["replicas_identical"]
    assert len(counting_camera.CAPTURES) > 10  # bob read every capture through it
