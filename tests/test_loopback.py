"""The desktop loopback (issue 8): real windows on a virtual X display (Xvfb), filmed by x11grab.

Each test starts its own Xvfb. The two-process test is the issue's proof: alice and bob run as two
separate OS processes (`python -m wccl.node --config rooms/loopback.toml --node NAME`), share no
clock (they sync theirs over the light), each shows a real window and films the other's, and they
train with bit-exact gradients.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from conftest import ROOT, needs_tools, press_escape_until_exit

pytestmark = needs_tools("Xvfb")


def _display(width: int = 1400, height: int = 480):
    from wccl.media.xvfb import VirtualDisplay

    return VirtualDisplay(width, height)


# Real windows on a loaded 2-core machine: now and then Qt leaves a new window unpainted however often it
# is reopened (wccl/media/window.py), and a realtime run over it fails. Such a test runs once more before
# it counts as failed; it still fails when the second run fails too.
REAL_WINDOWS_RERUN = pytest.mark.flaky(reruns=1)


def _events(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _room(tmp_path, steps: int) -> str:
    text = (ROOT / "rooms/loopback.toml").read_text()
    assert "\nsteps = 5\n" in text
    path = tmp_path / "loopback.toml"
    path.write_text(text.replace("\nsteps = 5\n", f"\nsteps = {steps}\n"))
    return str(path)


@REAL_WINDOWS_RERUN
def test_loopback_capture_decodes_both_ways():
    """Every window shows a frame; every camera films the others and decodes them to the same bytes."""
    with _display() as d:
        r = subprocess.run([sys.executable, "-m", "wccl.media.desktop", "--config", "rooms/loopback.toml",
                            "--seconds", "2"], cwd=ROOT, env=d.env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["ok"], report
    for name, peer in (("alice", "bob"), ("bob", "alice")):
        node = report["nodes"][name]
        assert node["peers_intact"] == {peer: True}
        assert node["decoded"] >= 0.9 * node["captures"] > 0  # every capture of a still frame decodes
        assert node["camera_fps"] >= 10  # asked for 20


@pytest.mark.slow
@REAL_WINDOWS_RERUN
def test_two_processes_train_over_the_loopback(tmp_path):
    """Two processes, a window each on one display: they pair over the light (the test, who sees both windows,
    confirms the code both show: WCCL_PAIR_TABLE), then train under the key, bit-exact."""
    from wccl.keys import PAIR_TABLE_ENV

    config = _room(tmp_path, steps=3)
    logs = {name: (tmp_path / f"{name}.log", tmp_path / f"{name}.err") for name in ("alice", "bob")}
    (tmp_path / "people").mkdir()
    with _display() as d:
        procs = {}
        try:
            for name, (out, err) in logs.items():  # files, not pipes: a full pipe would stall a node
                with open(out, "w") as fo, open(err, "w") as fe:
                    procs[name] = subprocess.Popen([sys.executable, "-m", "wccl.node", "--config", config, "--node",
                                                    name, "--log-format", "json"], cwd=ROOT,
                                                   env=dict(d.env(), **{PAIR_TABLE_ENV: str(tmp_path / "people")}),
                                                   stdout=fo, stderr=fe)
            for p in procs.values():
                p.wait(timeout=240)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
    outs = {name: (out.read_text(), err.read_text()) for name, (out, err) in logs.items()}
    for name, p in procs.items():
        assert p.returncode == 0, (name, outs[name][1][-3000:], outs[name][0][-3000:])
    alice, bob = (_events(outs[n][0]) for n in ("alice", "bob"))
    averaged = [e for e in alice if e["event"] == "gradients_averaged"]
    assert any(sorted(e["contributors"]) == ["alice", "bob"] for e in averaged), averaged
    assert any(e["event"] == "clock_synced" for e in bob)  # bob's clock, synced to alice's over the light
    finished = {n: next(e for e in evs if e["event"] == "run_finished") for n, evs in (("alice", alice), ("bob", bob))}
    assert finished["alice"]["applied"] >= 1 and finished["bob"]["applied"] == finished["alice"]["applied"]
    # Bit-exact: both replicas end with the same parameters, bit for bit.
    assert finished["alice"]["params_sha256"] == finished["bob"]["params_sha256"]
    # Paired: both showed one code and ran under one key, each with one window
    codes = {e["code"] for evs in (alice, bob) for e in evs if e["event"] == "pairing_code"}
    keys = {e["fingerprint"] for evs in (alice, bob) for e in evs if e["event"] == "room_key"}
    assert len(codes) == 1 and len(keys) == 1 and "none" not in keys, (codes, keys)
    assert [e["event"] for evs in (alice, bob) for e in evs].count("window_opened") == 2
    # Real captures were decoded both ways.
    for evs in (alice, bob):
        assert sum(e.get("frames_ok", 0) for e in evs if e["event"] == "link_report") > 0


@needs_tools("xdotool")
def test_escape_in_the_window_stops_the_node(tmp_path):
    config = _room(tmp_path, steps=3)
    with _display() as d:
        p = subprocess.Popen([sys.executable, "-m", "wccl.node", "--config", config, "--node", "alice",
                              "--log-format", "json"], cwd=ROOT, env=d.env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # wait for the window (alice then waits for bob: start-up)
                found = subprocess.run(["xdotool", "search", "--name", "wccl alice"], env=d.env(),
                                       capture_output=True, text=True)
                if found.returncode == 0 and found.stdout.strip():
                    break
                time.sleep(0.2)
            time.sleep(0.5)
            press_escape_until_exit("wccl alice", d.env(), p, presses=20, wait_s=1.0)
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert p.returncode == 130, err[-2000:]
    events = [e["event"] for e in _events(out)]
    assert "quit_requested" in events and "run_interrupted" in events
    assert "Traceback" not in err


def test_windows_that_do_not_fit_the_display_are_a_config_error():
    with _display(800, 480) as d:
        r = subprocess.run([sys.executable, "-m", "wccl.node", "--config", "rooms/loopback.toml", "--node", "bob"],
                           cwd=ROOT, env=d.env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "room.desktop: the windows need 1312x400 px" in r.stderr and "800x480" in r.stderr
    assert "Traceback" not in r.stderr
