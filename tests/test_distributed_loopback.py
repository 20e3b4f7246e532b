"""The `wccl` torch.distributed backend over the desktop loopback: real windows on a virtual X display.

`python -m wccl.launch --config rooms/loopback.toml SCRIPT` starts both ranks on this machine, as two
OS processes that share nothing but the display (no network, no shared memory): each rank's node,
on its own thread, shows a real OpenCV window and films the other rank's window with x11grab.
Each test starts its own Xvfb. Without Xvfb these tests fail (VirtualDisplay raises XvfbMissing)
rather than skip: they are the proof that the backend runs on real windows and real captures.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from conftest import ROOT, needs_tools, press_escape_until_exit
from wccl.launch import json_objects

EXAMPLES = ROOT / "examples"
ROOM = ROOT / "rooms/loopback.toml"
# Real windows on a loaded 2-core machine: a run over a window Qt left unpainted runs once more before it
# counts as failed (see tests/test_loopback.py).
pytestmark = [pytest.mark.slow, pytest.mark.flaky(reruns=1)]


def _display(width: int = 1400, height: int = 480):
    from wccl.media.xvfb import VirtualDisplay

    return VirtualDisplay(width, height)


def _launch(tmp_path, script: str, *args: str, timeout: float = 240) -> tuple[list[dict], list[dict]]:
    """Both ranks of the loopback room under a fresh Xvfb; returns (the ranks' results by rank, log events)."""
    out, err = tmp_path / "launch.out", tmp_path / "launch.err"
    with _display() as d, open(out, "w") as fo, open(err, "w") as fe:  # files: a full pipe would stall a rank
        p = subprocess.Popen([sys.executable, "-m", "wccl.launch", "--config", str(ROOM), str(EXAMPLES / script),
                              *args], cwd=ROOT, env=d.env(), stdout=fo, stderr=fe)
        try:
            p.wait(timeout=timeout)
        finally:
            if p.poll() is None:
                p.terminate()  # the launcher stops every process it started
                p.wait(timeout=30)
    stdout, stderr = out.read_text(), err.read_text()
    assert p.returncode == 0, (p.returncode, stderr[-4000:], stdout[-2000:])
    ranks = sorted((e for e in json_objects(stdout) if "rank" in e), key=lambda e: e["rank"])
    assert [e["rank"] for e in ranks] == [0, 1], stdout
    events = [e for e in json_objects(stderr) if "event" in e]
    # Real windows and real captures, one each per rank's node.
    for event in ("window_opened", "x11grab_started"):
        assert sorted(e["node"] for e in events if e["event"] == event) == ["alice", "bob"], (event, stderr[-4000:])
    assert "Traceback" not in stderr, stderr[-4000:]
    return ranks, events


def test_collectives_over_the_loopback(tmp_path):
    ranks, _ = _launch(tmp_path, "collectives_hello.py")
    for r in ranks:
        assert r["all_reduce"] == [10.0, 12.0, 14.0, 16.0], ranks
        assert r["broadcast"] == [42, 7], ranks
        assert r["all_gather"] == [[0, 0, 0], [1, 1, 1]], ranks


def test_ddp_over_the_loopback_equals_gloo(tmp_path):
    ranks, _ = _launch(tmp_path, "ddp_mnist.py", "--steps", "3")
    ours = {r["params_sha256"] for r in ranks}
    assert len(ours) == 1, ranks  # both replicas end with the same bits
    assert all(r["backend"] == "wccl" and r["world"] == 2 and r["steps"] == 3 for r in ranks)
    ref = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          str(EXAMPLES / "ddp_mnist.py"), "--backend", "gloo", "--steps", "3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    gloo = [e["params_sha256"] for e in json_objects(ref.stdout) if "params_sha256" in e]
    assert len(gloo) == 2 and set(gloo) == ours, (ranks, ref.stdout)  # the same bits as gloo


@needs_tools("xdotool")
def test_escape_in_a_ranks_window_fails_its_collectives(tmp_path):
    """Esc in alice's window stops her node: her program's collectives fail with a clear error (no hang)."""
    log = tmp_path / "alice.err"
    with _display() as d, open(log, "w") as fe:
        # alice alone: her first collective waits for bob, who never comes.
        p = subprocess.Popen([sys.executable, "-m", "wccl.launch", "--config", str(ROOM), "--node", "alice",
                              str(EXAMPLES / "collectives_hello.py")], cwd=ROOT, env=d.env(),
                             stdout=subprocess.DEVNULL, stderr=fe)
        try:
            deadline = time.monotonic() + 60
            while '"node_started"' not in log.read_text() and time.monotonic() < deadline and p.poll() is None:
                time.sleep(0.2)  # the window is up (and painted) once the node has started
            press_escape_until_exit("wccl alice", d.env(), p, presses=30, wait_s=2.0)
            p.wait(timeout=60)
        finally:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=30)
    err = log.read_text()
    assert p.returncode == 1, err[-3000:]
    events = [e.get("event") for e in json_objects(err)]
    assert "quit_requested" in events and "rank_node_stopped" in events, err[-3000:]
    assert "its window was closed (Esc)" in err, err[-3000:]
