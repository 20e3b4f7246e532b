"""Aim mode (wccl.aim): from searching to aim_ok in the simulated room and over real windows (Xvfb)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, needs_tools, run_virtual, shipped_config_dict
from wccl.aim import PeerView, aim, aim_layout, hint_for, layouts_line, targets
from wccl.config import ConfigError, load_config, parse_config


def _events(buf) -> list[dict]:
    return [json.loads(x) for x in buf.getvalue().splitlines() if x.startswith("{")]


def _two_laptops(**bob) -> dict:
    data = shipped_config_dict()
    nodes = [n for n in data["room"]["nodes"] if n["name"] in ("alice", "bob")]
    for n in nodes:
        n.pop("channel", None)  # the plain two-laptop room: face to face
    nodes[1].update(bob)
    data["room"]["nodes"] = nodes
    return data


def test_the_default_room_aims_from_searching_to_aim_ok(_quiet_logs):
    cfg = parse_config(shipped_config_dict(), "config.toml")
    result = run_virtual(lambda: aim(cfg, seconds=20))
    assert not result["stopped"]
    for name, r in result["nodes"].items():
        assert r["ok"], (name, r)
        assert r["frames_refused"] == 0
    # the observer only reads the server; the others read each other, both ways
    assert result["nodes"]["carol"]["peers"] == {"alice": result["nodes"]["carol"]["peers"]["alice"]}
    assert result["nodes"]["alice"]["peers"]["bob"]["state"] == "both"
    events = _events(_quiet_logs)
    states = [e["state"] for e in events if e.get("event") == "aim_state" and e["node"] == "alice"]
    assert states[-1] == "both"
    assert [e["was"] for e in events if e.get("event") == "aim_state" and e["node"] == "alice"][0] == "searching"
    ok = [e for e in events if e.get("event") == "aim_ok"]
    assert sorted(e["node"] for e in ok) == ["alice", "bob", "carol"]
    for e in ok:  # every camera measured the aim code's cells and its frame rate
        assert all(v > 2 for v in e["camera_px_per_aim_cell"].values()) and e["fps"] > 20


def test_a_covered_camera_is_named_and_the_run_is_not_aimed(_quiet_logs):
    cfg = parse_config(_two_laptops(covered_s=[[0.0, 1000.0]]), "covered")
    result = run_virtual(lambda: aim(cfg, seconds=6))
    alice, bob = result["nodes"]["alice"], result["nodes"]["bob"]
    assert not alice["ok"] and not bob["ok"]
    # alice reads bob, but bob (whose camera is covered) never reads alice: alice's screen says so
    assert alice["peers"]["bob"]["state"] == "reading"
    assert "bob's camera does not read this screen" in alice["peers"]["bob"]["hint"]
    assert bob["peers"]["alice"]["state"] == "searching"
    assert "no code of alice in view" in bob["peers"]["alice"]["hint"]
    assert not [e for e in _events(_quiet_logs) if e.get("event") == "aim_ok"]


def test_the_cli_names_the_direction_that_does_not_read(tmp_path):
    room = tmp_path / "covered.toml"
    room.write_text((ROOT / "config.toml").read_text().replace(
        'name = "bob"', 'name = "bob"\ncovered_s = [[0.0, 1000.0]]', 1))
    r = subprocess.run([sys.executable, "-m", "wccl.aim", "--config", str(room), "--seconds", "4", "--log-format",
                        "json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "bob <-> alice: searching: no code of alice in view" in r.stdout
    assert "aim not done" in r.stdout


def _peer(corners, cell_px=8.0, state="found") -> PeerView:
    p = PeerView("bob", 1, corners=np.array(corners, np.float32), cell_px=cell_px, found_at=0.0)
    p.state = state
    return p


@pytest.mark.parametrize("corners, words", [
    ([[900, 300], [1200, 300], [1200, 500], [900, 500]], "turn right"),
    ([[20, 300], [300, 300], [300, 500], [20, 500]], "turn left"),
    ([[500, 10], [800, 10], [800, 200], [500, 200]], "tilt the lid back"),
    ([[500, 550], [800, 550], [800, 700], [500, 700]], "tilt the lid forward"),
    ([[0, 0], [1279, 0], [1279, 719], [0, 719]], "move further away"),
])
def test_hints_say_which_way_to_move(corners, words):
    assert words in hint_for(_peer(corners), (1280, 720), [10, 16], 16, now=0.5)


def test_hints_ask_to_come_closer_when_cells_are_too_small_for_the_densest_layout():
    centred = [[540, 300], [740, 300], [740, 420], [540, 420]]
    # 5 camera px per 16 px aim cell: 10 px cells get 3.1 camera px, under the 4 the reader needs
    assert "move closer (3.1 camera px" in hint_for(_peer(centred, cell_px=5.0), (1280, 720), [10, 16], 16, now=0.5)
    assert "hold still" in hint_for(_peer(centred, cell_px=8.0), (1280, 720), [10, 16], 16, now=0.5)
    assert "no code of bob in view" in hint_for(_peer(centred, state="searching"), (1280, 720), [10], 16, now=5.0)
    assert layouts_line(8.0, [10, 16], 16) == "cells 10px:5.0 16px:8.0"
    assert layouts_line(6.0, [10, 16], 16) == "cells 10px:3.8! 16px:6.0"


def test_aim_layout_fits_small_screens_and_refuses_tiny_ones():
    assert aim_layout(1280, 720).cell_px == 16
    small = aim_layout(640, 400)
    assert small.size_px[1] + 2 * small.cell_px <= 0.65 * 640 and small.size_px[0] <= 400
    with pytest.raises(ConfigError, match="too small"):
        aim_layout(120, 80)


def test_targets_follow_the_roles_and_refuse_strangers():
    cfg = parse_config(shipped_config_dict(), "config.toml")
    assert targets(cfg, "alice", None) == ["bob"]  # carol observes: she shows nothing anyone must read
    assert targets(cfg, "carol", None) == ["alice"]  # an observer reads the server
    assert targets(cfg, "bob", ["alice", "carol"]) == ["alice", "carol"]
    with pytest.raises(ConfigError, match="not a node"):
        targets(cfg, "alice", ["mallory"])
    with pytest.raises(ConfigError, match="itself"):
        targets(cfg, "alice", ["alice"])


@pytest.mark.flaky(reruns=1)  # real windows on the loaded machine: see tests/test_loopback.py
@needs_tools("Xvfb")
def test_two_processes_aim_over_the_loopback(tmp_path):
    from wccl.media.xvfb import VirtualDisplay

    with VirtualDisplay(1400, 480) as d:
        procs = {}
        for name in ("alice", "bob"):
            with open(tmp_path / f"{name}.log", "w") as out, open(tmp_path / f"{name}.err", "w") as err:
                procs[name] = subprocess.Popen([sys.executable, "-m", "wccl.aim", "--config", "rooms/loopback.toml",
                                                "--node", name, "--seconds", "60", "--log-format", "json"],
                                               cwd=ROOT, env=d.env(), stdout=out, stderr=err, text=True)
        codes = {name: p.wait(timeout=180) for name, p in procs.items()}
    for name in procs:
        text = (tmp_path / f"{name}.log").read_text()
        assert codes[name] == 0, (name, text[-3000:], (tmp_path / f"{name}.err").read_text()[-3000:])
        events = [json.loads(x) for x in text.splitlines() if x.startswith("{")]
        states = [e["state"] for e in events if e.get("event") == "aim_state"]
        assert states[-1] == "both", states
        assert [e for e in events if e.get("event") == "aim_ok"]


def _fake_aim(calls, result):
    async def fake(cfg, nodes=None, peers=None, seconds=60.0):
        calls.append((cfg.room.medium, nodes, seconds))
        return result
    return fake


def test_a_run_on_real_devices_aims_first(monkeypatch):
    """`python -m wccl.node` on medium "hardware" aims before it starts (here stopped by Esc: exit 130)."""
    import wccl.aim
    from wccl.node import main

    calls = []
    monkeypatch.setattr(wccl.aim, "aim", _fake_aim(calls, {"stopped": True, "nodes": {}}))
    assert main(["--config", str(ROOT / "rooms/two-laptops.toml"), "--node", "bob", "--aim-seconds", "30"]) == 130
    assert calls == [("hardware", ["bob"], 30.0)]


def test_a_run_not_aimed_in_time_warns_and_starts(monkeypatch, _quiet_logs):
    import wccl.aim
    from wccl.aim import aim_first

    not_aimed = {"stopped": False, "nodes": {"bob": {"ok": False, "ok_at": None, "fps": 30.0, "peers": {
        "alice": {"state": "searching", "aimed": False, "hint": "no code of alice in view", "camera_px_per_aim_cell": 0}}}}}
    monkeypatch.setattr(wccl.aim, "aim", _fake_aim([], not_aimed))
    cfg = load_config(ROOT / "rooms/two-laptops.toml")
    assert aim_first(cfg, "bob", 5.0) is None
    warned = [e for e in _events(_quiet_logs) if e.get("event") == "aim_not_done"]
    assert warned and "bob <-> alice: searching: no code of alice in view" in warned[0]["directions"]


def test_a_simulated_run_does_not_aim(monkeypatch):
    import wccl.aim
    import wccl.node

    calls = []
    monkeypatch.setattr(wccl.aim, "aim", _fake_aim(calls, {"stopped": True, "nodes": {}}))
    monkeypatch.setattr(wccl.node, "_main_async", _fake_main)
    assert wccl.node.main(["--config", str(ROOT / "config.toml")]) == 0
    assert calls == []


async def _fake_main(cfg, only, summary=False, faults=()):
    return 0


def test_the_launcher_on_real_devices_aims_first(monkeypatch, tmp_path):
    import wccl.aim
    from wccl.launch import main

    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('the script must not start when aiming was stopped')\n")
    calls = []
    monkeypatch.setattr(wccl.aim, "aim", _fake_aim(calls, {"stopped": True, "nodes": {}}))
    assert main(["--config", str(ROOT / "rooms/two-laptops.toml"), "--node", "alice", "--aim-seconds", "9",
                 str(script)]) == 130
    assert calls == [("hardware", ["alice"], 9.0)]


def test_a_peer_not_in_the_room_is_said_in_one_line_before_anything_else_runs():
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "wccl.aim", "--config", "config.toml", "--peers", "dave"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    said = (p.stdout + p.stderr).strip().splitlines()
    assert p.returncode == 2 and len(said) == 1, said
    assert said[0].endswith("--peers dave: not a node of the room (alice, bob, carol)"), said



def test_a_laptop_without_a_camera_says_so_before_its_window_opens():
    # Parts swapped through the registry: a camera that is not there, and a screen that notes it was made.
    from wccl.config import parse_config
    from wccl.media.display import NoCamera
    from protocols.registry import REGISTRY
    from wccl.runtime.timebase import NodeClock

    made = []

    def missing_camera(**kw):
        raise NoCamera("camera 0: no such device")

    REGISTRY.register("camera", "test-missing", missing_camera)
    REGISTRY.register("screen", "test-noted", lambda **kw: made.append(kw["node"]))
    try:
        data = shipped_config_dict()
        data["room"]["nodes"][0].update(camera="test-missing", screen="test-noted")
        data["dashboard"] = {"enabled": False}
        cfg = parse_config(data, "test", ROOT)
        from wccl.aim import Aimer

        async def make():
            Aimer(cfg, "alice", None, None, ["bob"], NodeClock(origin=0.0))

        with pytest.raises(NoCamera):
            run_virtual(make)
        assert made == []
    finally:
        REGISTRY.unregister("camera", "test-missing")
        REGISTRY.unregister("screen", "test-noted")
