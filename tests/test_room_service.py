"""The room as its own process (wccl/room/serve.py), node processes around it (wccl/room/remote.py) and
virtual time shared across them (wccl/room/vtime.py).

Every test starts `python -m wccl.room.serve` on a socket in a fresh temp folder; node processes run this
file as a script (`python tests/test_room_service.py SPEC`), each one connection, and write what they saw.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
W, H = 320, 192  # small screens: fast shows and exact captures (a webcam's camera stays 1280x720)

ROOM_TOML = """
[room]
profile = "{profile}"
seed = {seed}

[[room.nodes]]
name = "alice"
roles = ["server", "worker"]

[[room.nodes]]
name = "bob"
roles = ["worker"]

[screen]
width = {w}
height = {h}

[link]
choose = "pinned"
rows = 20
cols = 36
cell_px = 6

[dashboard]
enabled = false

[logging]
format = "json"
level = "debug"
"""


def pattern(seed: int, w: int = W, h: int = H, cell: int = 8) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = (rng.integers(0, 2, (h // cell, w // cell, 3)) * 255).astype(np.uint8)
    return np.repeat(np.repeat(g, cell, 0), cell, 1)


# ---- the node process (this file run as a script) ---------------------------------------------------

async def _node_main(spec: dict, room, loop) -> dict:
    """Shows `spec["shows"]` ([t, pattern seed] on the room's time), takes `spec["captures"]` captures,
    and runs the scenario's extras; returns what it saw (images go to the .npz)."""
    node = spec["node"]
    out: dict = {"caps": [], "images": []}
    clock = room.clock_for(node, room.origin)
    screen = room.screen(node)

    async def shows():
        for t, seed in spec.get("shows", []):
            delay = t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            screen.show(pattern(seed, room.screen_w, room.screen_h))

    async def captures():
        if not spec.get("captures"):
            return
        cam = room.camera(node, clock)
        for _ in range(spec["captures"]):
            img, t_node = await cam.recv()
            out["caps"].append([loop.time(), t_node, cam.missed, cam.dropped])
            out["images"].append(img)
            if spec.get("gap"):
                await asyncio.sleep(spec["gap"])  # a slow reader: the camera's slots go by (missed)
            if "until_seed" in spec and np.array_equal(img, pattern(spec["until_seed"], *img.shape[1::-1])):
                break
        cam.close()

    async def extras():
        if "busy_s" in spec:  # busy for a while of real time: the room's time must not move meanwhile
            await asyncio.sleep(0.001)  # time moves: every node has joined
            flag = {"busy": True}
            room_busy[0] = lambda: flag["busy"]
            out["busy_start"] = time.monotonic()
            out["busy_t"] = loop.time()

            def later():
                time.sleep(spec["busy_s"])
                out["busy_end"] = time.monotonic()
                flag["busy"] = False

            threading.Thread(target=later, daemon=True).start()
            await asyncio.sleep(0.05)
            out["after_busy_t"] = loop.time()
        if "thread_wake_s" in spec:  # a thread wakes the loop while it waits in the room
            fut = loop.create_future()
            threading.Thread(target=lambda: (time.sleep(spec["thread_wake_s"]),
                                             loop.call_soon_threadsafe(fut.set_result, time.monotonic())),
                             daemon=True).start()
            out["woken_wall"] = await fut
            out["woken_t"] = loop.time()
        if "sleeps" in spec:  # [count, seconds]: record (wall, room time) after each
            out["ticks"] = []
            for _ in range(spec["sleeps"][0]):
                await asyncio.sleep(spec["sleeps"][1])
                out["ticks"].append([time.monotonic(), loop.time()])
        if "die_at" in spec:
            await asyncio.sleep(spec["die_at"])
            os._exit(3)  # no bye: the room sees the connection close
        if spec.get("wait_forever"):
            await loop.create_future()

    await asyncio.gather(shows(), captures(), extras())
    out["end_t"] = loop.time()
    return out


room_busy: list = [None]


def _client(spec: dict) -> int:
    from wccl.room.remote import RoomClosedError, connect

    room, loop = connect(spec["socket"], spec["node"], spec.get("mode", "virtual"),
                         busy=lambda: room_busy[0] is not None and room_busy[0]())
    try:
        out = loop.run_until_complete(_node_main(spec, room, loop))
    except RoomClosedError as e:
        Path(spec["out"] + ".json").write_text(json.dumps({"error": str(e)}))
        return 4
    finally:
        room.close()
        loop.close()
    images = out.pop("images")
    np.savez(spec["out"] + ".npz", *images)
    Path(spec["out"] + ".json").write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(_client(json.loads(sys.argv[1])))


# ---- the tests ---------------------------------------------------------------------------------------

import pytest  # noqa: E402  (the node processes above need no pytest)

from wccl.config import load_config  # noqa: E402
from wccl.room import SimulatedRoom  # noqa: E402
from wccl.room.remote import RoomClient, RoomClosedError, connect  # noqa: E402
from wccl.runtime.timebase import VirtualTimeLoop  # noqa: E402


@pytest.fixture
def where():
    """A short temp folder (Unix socket paths must stay under ~100 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="wr", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def write_room(where: Path, profile: str = "exact", seed: int = 1, w: int = W, h: int = H, channel: str = "") -> Path:
    path = where / f"room-{profile}.toml"
    text = ROOM_TOML.format(profile=profile, seed=seed, w=w, h=h)
    if channel:
        text = text.replace("[[room.nodes]]", f"channel = {{ {channel} }}\n\n[[room.nodes]]", 1)
    path.write_text(text)
    return path


class Server:
    def __init__(self, config: Path, sock: Path, *extra: str, env: dict | None = None) -> None:
        self.sock = sock
        self.proc = subprocess.Popen([sys.executable, "-m", "wccl.room.serve", "--config", str(config),
                                      "--socket", str(sock), *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 30
        while not sock.exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"room exited {self.proc.returncode}: {self.proc.stderr.read()}")
            if time.monotonic() > deadline:
                raise AssertionError("room did not create its socket")
            time.sleep(0.01)

    def wait(self, timeout: float = 30) -> tuple[int, list[dict], str]:
        out, err = self.proc.communicate(timeout=timeout)
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return self.proc.returncode, events, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def servers():
    started: list[Server] = []
    yield started
    for s in started:
        s.kill()


def start(servers, *args, **kw) -> Server:
    s = Server(*args, **kw)
    servers.append(s)
    return s


def run_nodes(where: Path, sock: Path, specs: dict[str, dict], timeout: float = 60) -> dict[str, dict]:
    """Run one node process per spec; their results (with images as a list under "images")."""
    procs = {}
    for node, spec in specs.items():
        full = {"socket": str(sock), "node": node, "out": str(where / f"out-{node}"), **spec}
        procs[node] = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), json.dumps(full)],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    for node, p in procs.items():
        out, err = p.communicate(timeout=timeout)
        res_path = where / f"out-{node}.json"
        res = json.loads(res_path.read_text()) if res_path.exists() else {}
        res["rc"], res["stderr"] = p.returncode, err
        npz = where / f"out-{node}.npz"
        if npz.exists():
            with np.load(npz) as z:
                res["images"] = [z[f"arr_{i}"] for i in range(len(z.files))]
            npz.unlink()
        res_path.unlink(missing_ok=True)
        results[node] = res
    return results


def in_process(config: Path, specs: dict[str, dict]) -> dict[str, dict]:
    """The same shows and captures with the room in this process, on one VirtualTimeLoop."""
    room = SimulatedRoom.from_config(load_config(config))

    async def go():
        loop = asyncio.get_running_loop()
        res = {}

        async def node(name, spec):
            out = {"caps": [], "images": []}
            clock = room.clock_for(name, 0.0)
            screen = room.screen(name)

            async def shows():
                for t, seed in spec.get("shows", []):
                    delay = t - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    screen.show(pattern(seed, room.screen_w, room.screen_h))

            async def captures():
                if not spec.get("captures"):
                    return
                cam = room.camera(name, clock)
                for _ in range(spec["captures"]):
                    img, t_node = await cam.recv()
                    out["caps"].append([loop.time(), t_node, cam.missed, cam.dropped])
                    out["images"].append(img)
                    if spec.get("gap"):
                        await asyncio.sleep(spec["gap"])

            await asyncio.gather(shows(), captures())
            res[name] = out

        await asyncio.gather(*(node(n, s) for n, s in specs.items()))
        return res

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(go())


def ok(res: dict) -> dict:
    assert res["rc"] == 0, res.get("stderr") or res
    return res


# (a) two node processes see each other's screens on virtual time, the same way every run
@pytest.mark.slow
def test_two_processes_swap_images_deterministically(where, servers):
    config = write_room(where, "exact")
    specs = {"alice": {"shows": [[0.0, 11], [0.05, 12]], "captures": 3},
             "bob": {"shows": [[0.0, 21], [0.05, 22]], "captures": 3}}
    runs = []
    for i in range(2):
        sock = where / f"r{i}.sock"
        server = start(servers, config, sock)
        res = run_nodes(where, sock, specs)
        rc, events, err = server.wait()
        assert rc == 0, err
        names = [e["event"] for e in events]
        assert names[0] == "room_ready" and "room_time_started" in names and names[-1] == "room_empty"
        assert {e["node"] for e in events if e["event"] == "room_client_left"} == {"alice", "bob"}
        assert not sock.exists()
        runs.append({n: ok(r) for n, r in res.items()})
    first, second = runs
    for me, other in (("alice", "bob"), ("bob", "alice")):
        got = first[me]
        # The capture times: the camera's phase plus k periods, on the room's time.
        times = [c[0] for c in got["caps"]]
        assert all(0 < t1 - t0 == pytest.approx(1 / 30) for t0, t1 in zip(times, times[1:]))
        for (t, _, missed, dropped), img in zip(got["caps"], got["images"]):
            want = pattern(specs[other]["shows"][0 if t < 0.05 else 1][1])
            assert np.array_equal(img, want)
            assert missed == dropped == 0
        assert {t < 0.05 for t in times} == {True, False}  # both of the other's pictures were seen
        # Determinism: the same times (room and node clock) and the same bytes in the second run.
        assert got["caps"] == second[me]["caps"]
        assert all(np.array_equal(x, y) for x, y in zip(got["images"], second[me]["images"]))


# (b) the service's captures are the in-process room's, byte for byte (webcam: jitter, exposure, noise, JPEG)
@pytest.mark.slow
def test_service_captures_match_in_process_room(where, servers):
    # Many drops and stalls, and bob reads slowly (missed slots): every path of the camera's schedule.
    config = write_room(where, "webcam", seed=5, channel="drop_prob = 0.3, stall_rate_hz = 3.0")
    specs = {"alice": {"shows": [[0.0, 1], [0.07, 2], [0.15, 3]], "captures": 4},
             "bob": {"shows": [[0.0, 4], [0.1, 5]], "captures": 4, "gap": 0.09}}
    sock = where / "r.sock"
    server = start(servers, config, sock)
    res = run_nodes(where, sock, specs)
    assert server.wait()[0] == 0
    ref = in_process(config, specs)
    assert ref["bob"]["caps"][-1][2] > 0 and ref["alice"]["caps"][-1][3] + ref["bob"]["caps"][-1][3] > 0
    for n in specs:
        got = ok(res[n])
        assert got["caps"] == ref[n]["caps"]
        assert len(got["images"]) == 4
        for x, y in zip(got["images"], ref[n]["images"]):
            assert x.shape == y.shape == (720, 1280, 3)
            assert x.tobytes() == y.tobytes()


# (c) the room's time stands still while a node is busy, and a thread can wake a node waiting in the room
@pytest.mark.slow
def test_time_waits_for_a_busy_node(where, servers):
    config = write_room(where, "exact")
    sock = where / "r.sock"
    server = start(servers, config, sock)
    res = run_nodes(where, sock, {"alice": {"busy_s": 0.3},
                                  "bob": {"thread_wake_s": 0.1, "sleeps": [5, 0.01]}})
    assert server.wait()[0] == 0
    a, b = ok(res["alice"]), ok(res["bob"])
    assert a["busy_t"] == 0.001 and a["after_busy_t"] == pytest.approx(0.051)
    assert a["busy_end"] - a["busy_start"] >= 0.3
    # Bob's thread woke his loop while he waited in the room: it ran at once, at the room's time then.
    assert b["woken_t"] <= 0.001 and b["woken_wall"] < a["busy_end"]
    # Bob's first sleep could end only once alice was no longer busy; then time moved on.
    wall, t = zip(*b["ticks"])
    assert wall[0] >= a["busy_end"]
    assert t == pytest.approx([b["woken_t"] + 0.01 * i for i in range(1, 6)])


# (d) a node process that dies is dropped; the other goes on; (e) the room leaves when everyone has
@pytest.mark.slow
def test_dead_node_is_dropped_and_the_other_goes_on(where, servers):
    config = write_room(where, "exact")
    sock = where / "r.sock"
    server = start(servers, config, sock)
    res = run_nodes(where, sock, {"alice": {"die_at": 0.25}, "bob": {"sleeps": [10, 0.1]}})
    rc, events, err = server.wait()
    assert rc == 0, err
    assert res["alice"]["rc"] == 3
    b = ok(res["bob"])
    assert [t for _, t in b["ticks"]] == pytest.approx([0.1 * i for i in range(1, 11)])
    left = {e["node"]: e for e in events if e["event"] == "room_client_left"}
    assert left["alice"]["reason"] == "closed" and left["alice"]["t"] == pytest.approx(0.25)
    assert left["bob"]["reason"] == "bye"
    assert events[-1]["event"] == "room_empty"


@pytest.mark.slow
def test_deadlock_ends_the_room_and_the_nodes_say_so(where, servers):
    config = write_room(where, "exact")
    sock = where / "r.sock"
    server = start(servers, config, sock, "--deadlock-grace-s", "0.1")
    res = run_nodes(where, sock, {"alice": {"wait_forever": True}, "bob": {"sleeps": [2, 0.5], "wait_forever": True}})
    rc, events, err = server.wait()
    assert rc == 1
    dead = [e for e in events if e["event"] == "room_deadlock"]
    assert dead and dead[0]["t"] == pytest.approx(1.0)
    for n in ("alice", "bob"):
        assert res[n]["rc"] == 4 and "the room closed" in res[n]["error"]


@pytest.mark.slow
def test_realtime_room(where, servers):
    config = write_room(where, "exact")
    sock = where / "r.sock"
    server = start(servers, config, sock, "--clock", "realtime")
    res = run_nodes(where, sock, {"alice": {"mode": "realtime", "shows": [[0.0, 7]], "sleeps": [1, 1.0]},
                                  "bob": {"mode": "realtime", "captures": 300, "until_seed": 7}})
    assert server.wait()[0] == 0
    b = ok(res["bob"])
    ok(res["alice"])
    # Real time: no one waits for alice, so bob's first captures may be black; he sees her once she shows.
    assert np.array_equal(b["images"][-1], pattern(7))
    times = [c[0] for c in b["caps"]]
    assert all(t1 - t0 > 1 / 30 * 0.5 for t0, t1 in zip(times, times[1:]))  # one capture per slot at most
    assert abs(times[-1] - time.monotonic()) < 60  # the room's time is the machine's monotonic clock


# (f) a bad config stops the room with one line; an unknown node gets a clear error
def test_bad_config_exits_2_with_one_line(where):
    bad = where / "bad.toml"
    bad.write_text(ROOM_TOML.format(profile="exact", seed=0, w=W, h=H) + "\n[room.extra]\nx = 1\n")
    p = subprocess.run([sys.executable, "-m", "wccl.room.serve", "--config", str(bad), "--socket",
                        str(where / "s.sock")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wccl.room.serve: ") and "room.extra" in lines[0]
    assert not (where / "s.sock").exists()
    p = subprocess.run([sys.executable, "-m", "wccl.room.serve", "--config", str(write_room(where, "nonesuch")),
                        "--socket", str(where / "s.sock")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "nonesuch" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_unknown_node_wrong_mode_bad_key_and_sigterm(where, servers):
    config = write_room(where, "exact")
    sock = where / "r.sock"
    server = start(servers, config, sock, "--authkey-env", "ROOM_KEY", env={"ROOM_KEY": "sesame"})
    keeper = RoomClient(str(sock), "bob", authkey="sesame")  # the room stays up until every node has left
    with pytest.raises(KeyError, match="'zed' is not in the room \\(alice, bob\\)"):
        RoomClient(str(sock), "zed", authkey="sesame")
    with pytest.raises(PermissionError, match="authkey"):
        RoomClient(str(sock), "alice", authkey="wrong")
    with pytest.raises(ValueError, match="virtual time but this node asked for realtime"):
        connect(str(sock), "alice", "realtime", authkey="sesame")
    client = RoomClient(str(sock), "alice", authkey="sesame")
    with pytest.raises(ValueError, match="already connected"):
        RoomClient(str(sock), "alice", authkey="sesame")
    assert client.info["camera_fps"] == 30.0 and client.info["screen"] == [W, H] and client.now == 0.0
    # An idle whose wait was interrupted (Ctrl-C in the selector) is withdrawn before the next request:
    client.send_idle(1.0)
    assert client.settle() == 0.0  # bob runs (he has not said idle): time has not moved
    server.proc.send_signal(signal.SIGTERM)
    rc, events, _ = server.wait()
    assert rc == 0 and events[-1]["event"] == "room_stopped" and not sock.exists()
    client.close()
    keeper.close()


def test_room_closed_is_a_clear_error(where, servers):
    config = write_room(where, "exact")
    sock = where / "r.sock"
    server = start(servers, config, sock)
    room, loop = connect(str(sock), "alice", "virtual")
    server.proc.send_signal(signal.SIGTERM)
    server.wait()

    async def go():
        await asyncio.sleep(1.0)

    with pytest.raises(RoomClosedError, match="the room closed"):
        loop.run_until_complete(go())
    room.close()
    loop.close()
    with pytest.raises(RoomClosedError, match="no room is serving"):
        RoomClient(str(sock), "alice", connect_timeout_s=0.1)
