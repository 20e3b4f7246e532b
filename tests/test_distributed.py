"""The `wccl` torch.distributed backend, end to end: `python -m wccl.launch` starts one process per rank
and the room as one more; the ranks share nothing but the room's pixels.

Fast tests use a small `exact` room (a perfect camera); the slow ones the `webcam` room of
rooms/two-laptops-sim.toml and gloo (over localhost, as torchrun runs it) as the reference.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from wccl.launch import json_objects

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "dist_scripts"
EXAMPLES = ROOT / "examples"


def room_file(tmp_path: Path, n: int = 2, profile: str = "exact", extra: str = "") -> Path:
    names = ["alice", "bob", "carol", "dave"][:n]
    nodes = "".join(f'\n[[room.nodes]]\nname = "{m}"\nroles = {json.dumps(["server", "worker"] if i == 0 else ["worker"])}\n'
                    for i, m in enumerate(names))
    path = tmp_path / f"room{n}-{profile}.toml"
    path.write_text(f'[room]\nprofile = "{profile}"\nsession = 31\n{nodes}\n[logging]\nlevel = "warning"\n{extra}')
    return path


def launch(config: Path, script: Path, *args: str, timeout: float = 300, env: dict | None = None,
           launcher_args: tuple[str, ...] = ()):
    cmd = [sys.executable, "-m", "wccl.launch", "--config", str(config), *launcher_args, str(script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=dict(os.environ, **(env or {})))
    lines = [d for d in json_objects(proc.stdout) if "rank" in d]
    return proc, sorted(lines, key=lambda d: d["rank"])


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_once(script: Path, n: int, args: tuple[str, ...], timeout: float) -> tuple[int, str, str]:
    """`script --backend gloo ARGS` on `n` ranks over localhost, as torchrun's env:// rendezvous has them
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), each rank forked as the launcher forks its
    own (wccl.runtime.forkserver: torch imported once). Returns the first failing exit status (or 0), and
    the ranks' stdout and stderr, each rank's whole."""
    from wccl.runtime.forkserver import RankForker

    base = dict(os.environ, WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(_free_port()))
    forker = RankForker(base)
    try:
        procs, pipes = [], []
        for r in range(n):
            out, err = os.pipe(), os.pipe()
            procs.append(forker.spawn([str(script), "--backend", "gloo", *args],
                                      dict(base, RANK=str(r), LOCAL_RANK=str(r)), str(ROOT), out[1], err[1]))
            os.close(out[1])
            os.close(err[1])
            pipes.append((out[0], err[0]))
        texts = _read_all([fd for pair in pipes for fd in pair], timeout)
        deadline = time.monotonic() + timeout
        codes = [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            p.kill()
        forker.close()
    stdout = "".join(texts[out] for out, _ in pipes)
    stderr = "".join(texts[err] for _, err in pipes)
    return next((c for c in codes if c != 0), 0), stdout, stderr


def _read_all(fds: list[int], timeout: float) -> dict[int, str]:
    """Everything written to the pipes `fds` until their writers close them."""
    import selectors

    sel = selectors.DefaultSelector()
    for fd in fds:
        sel.register(fd, selectors.EVENT_READ)
    chunks: dict[int, list[bytes]] = {fd: [] for fd in fds}
    deadline = time.monotonic() + timeout
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the gloo reference did not end within {timeout:g} s")
            for key, _ in sel.select(left):
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fd].append(data)
                else:
                    sel.unregister(key.fd)
                    os.close(key.fd)
    finally:
        for key in list(sel.get_map().values()):
            os.close(key.fd)
        sel.close()
    return {fd: b"".join(c).decode(errors="replace") for fd, c in chunks.items()}


# What torch 2.13's gloo prints when it aborts a process at exit (a C++ thread still joinable at static
# destruction): a reference run that ends so is run again (gloo_reference below, tests/test_lab.py).
GLOO_EXIT_ABORT = "terminate called without an active exception"


def gloo_reference(script: Path, n: int, *args: str, timeout: float = 300, tries: int = 3):
    """The gloo reference: `script` on `n` gloo ranks over localhost (as torchrun runs it: `_gloo_once`), its
    JSON lines sorted by rank.

    torch 2.13's gloo aborts now and then at a process's exit, after the script has finished and printed
    ("terminate called without an active exception": a C++ thread still joinable at static destruction;
    see tests/dist_scripts/compressed.py). A reference whose every rank printed as many lines is whole and
    taken; one cut short is run again, up to `tries` times, as is one whose free port another process took
    before rank 0 listened on it. Any other failure fails the test at once."""
    for _ in range(tries):
        code, stdout, stderr = _gloo_once(script, n, args, timeout)
        lines = sorted((d for d in json_objects(stdout) if "rank" in d), key=lambda d: d["rank"])
        if code == 0:
            return lines
        if "address already in use" in stderr.lower():
            continue
        if GLOO_EXIT_ABORT not in stderr:
            break
        counts = Counter(d["rank"] for d in lines)
        if sorted(counts) == list(range(n)) and len(set(counts.values())) == 1:
            return lines
    raise AssertionError(f"the gloo reference failed (exit {code}):\n{stderr[-3000:]}")


# ---- every collective, dtype, op and async use; scatter, all_to_all, point to point, subgroups -----

API_PARTS = ("spread", "p2p", "groups")  # parts of tests/dist_scripts/parts.py checked against gloo


def by_part(lines: list[dict], part: str) -> list[dict]:
    return [d for d in lines if d["part"] == part]


def check_matrix(lines: list[dict], world: int) -> None:
    """Every collective, dtype and op of the matrix part right on every rank, and the same bits on each."""
    assert [d["rank"] for d in lines] == list(range(world))
    cases = lines[0]["cases"]
    assert len(cases) > 60  # 6 dtypes x (all_reduce ops, broadcast, 2 gathers, 2 reduce-scatters) + more
    for d in lines:
        wrong = [k for k, ok in d["cases"].items() if not ok]
        assert not wrong, f"rank {d['rank']}: {wrong}"
        assert d["cases"].keys() == cases.keys()
    for must in ("all_reduce/float32/sum/sync", "all_reduce/bfloat16/avg/async", "all_reduce/uint8/product/sync",
                 f"broadcast/int64/root{world - 1}", "reduce_scatter_tensor/float16/max", "all_reduce/zero_elements",
                 "all_reduce/in_flight_5", "barrier", "future_value"):
        assert must in cases
    assert len({d["digest"] for d in lines}) == 1


def equal_to_gloo(ours: list[dict], theirs: list[dict]) -> None:
    assert [d["rank"] for d in ours] == [d["rank"] for d in theirs] == [0, 1, 2]
    for mine, ref in zip(ours, theirs):
        assert mine["cases"] and all(mine["cases"].values()), mine["cases"]
        assert mine["cases"].keys() == ref["cases"].keys()  # (a rank outside a subgroup has none of its cases)
        assert mine["digest"] == ref["digest"]  # every result bit for bit as gloo's


@pytest.mark.slow
def test_the_ddp_example_says_when_each_step_ended_when_asked():
    """examples/ddp_mnist.py --step-times (over gloo: its clock is the wall's): a line a step on each rank,
    each later than the one before, then the rank's result."""
    lines = gloo_reference(EXAMPLES / "ddp_mnist.py", 2, "--steps", "3", "--step-times")
    for rank in (0, 1):
        mine = [d for d in lines if d["rank"] == rank]
        assert [d.get("step") for d in mine[:3]] == [0, 1, 2] and "params_sha256" in mine[3], mine
        seconds = [d["seconds"] for d in mine[:3]] + [mine[3]["sim_seconds"]]
        assert seconds == sorted(seconds) and seconds[0] > 0, mine


@pytest.mark.slow
def test_every_collective_dtype_and_op_is_right_on_two_ranks(tmp_path):
    proc, lines = launch(room_file(tmp_path, 2), SCRIPTS / "parts.py", "matrix")
    assert proc.returncode == 0, proc.stderr[-4000:]
    check_matrix(lines, 2)


@pytest.mark.slow
def test_three_ranks_collectives_scatter_all_to_all_point_to_point_and_subgroups_equal_gloo(tmp_path):
    """One 3-rank launch of tests/dist_scripts/parts.py, against gloo's run of the parts it shares:
    - the collectives matrix (every collective, dtype, op and async use);
    - scatter, all_to_all (even, uneven) and broadcasts of bytes every rank holds (digests only cross);
    - send, recv, tags, recv from any source, isend/irecv and batches;
    - subgroups interleaved with the world's collectives, an enumerated pair, a group destroyed."""
    proc, lines = launch(room_file(tmp_path, 3), SCRIPTS / "parts.py", "matrix", *API_PARTS, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ref = gloo_reference(SCRIPTS / "parts.py", 3, *API_PARTS)
    check_matrix(by_part(lines, "matrix"), 3)
    for part in API_PARTS:
        equal_to_gloo(by_part(lines, part), by_part(ref, part))
    spread = by_part(lines, "spread")
    for d in spread:
        assert d["big_equal_posted"] <= 64  # a 256 KB broadcast every rank holds: digests only
    assert spread[2]["big_differ_posted"] >= 256 * 1024  # one only the root holds: its bytes
    assert spread[0]["big_differ_posted"] <= 64
    assert sorted(by_part(lines, "p2p")[0]["sources"]) == [1, 2]


# ---- DDP, comm hooks, against gloo -----------------------------------------------------------------

@pytest.mark.slow
def test_powersgd_and_compression_hooks_run_unchanged_and_equal_gloo(tmp_path):
    """torch's PowerSGD, fp16 and bf16 comm hooks, each training a fresh DDP model in one launch. PowerSGD
    all-reduces inside future callbacks and waits there: no deadlock. (Plain DDP against gloo, in the webcam
    room: tests/test_readme.py.)"""
    args = ("--steps", "5", "--start-iter", "2", "--hook", "powersgd,fp16,bf16")
    proc, lines = launch(room_file(tmp_path), EXAMPLES / "powersgd.py", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = gloo_reference(EXAMPLES / "powersgd.py", 2, *args)
    ours = {(d["hook"], d["rank"]): d["params_sha256"] for d in lines}
    theirs = {(d["hook"], d["rank"]): d["params_sha256"] for d in ref}
    assert len(ours) == 6 and ours == theirs
    assert len(set(ours.values())) == 3  # the hooks train differently; the ranks alike


@pytest.mark.slow
def test_ddp_with_three_ranks_is_identical_and_close_to_gloo(tmp_path):
    import numpy as np

    proc, lines = launch(room_file(tmp_path, 3), EXAMPLES / "ddp_mnist.py", "--steps", "4",
                         "--save-params", str(tmp_path / "wccl-{rank}.npy"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len({d["params_sha256"] for d in lines}) == 1
    gloo_reference(EXAMPLES / "ddp_mnist.py", 3, "--steps", "4", "--save-params", str(tmp_path / "gloo-{rank}.npy"))
    ours, ref = np.load(tmp_path / "wccl-0.npy"), np.load(tmp_path / "gloo-0.npy")
    assert np.allclose(ours, ref, rtol=1e-5, atol=1e-7), np.abs(ours - ref).max()


# ---- broadcasts of bytes every rank holds, point to point ------------------------------------------

@pytest.mark.slow
def test_a_20_mb_ddp_model_seeded_alike_starts_in_seconds(tmp_path):
    # One launch, two DDP models one after the other (`--both`): the 20 MB one seeded alike, then a small one
    # rank 1 seeds otherwise, whose bytes cross (each measured from its own DDP constructor's start)
    proc, both = launch(room_file(tmp_path), SCRIPTS / "big_ddp.py", "--both")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [(d["rank"], d["phase"]) for d in both] == [(0, "alike"), (0, "differ"), (1, "alike"), (1, "differ")]
    lines = [d for d in both if d["phase"] == "alike"]
    assert len({d["params_sha256"] for d in lines}) == 1 and lines[0]["model_bytes"] >= 20e6
    assert all(d["start_s"] < 10 and d["posted"] < 1000 for d in lines), lines
    lines = [d for d in both if d["phase"] == "differ"]  # rank 1 seeded otherwise: the bytes cross
    assert len({d["params_sha256"] for d in lines}) == 1 and lines[0]["model_bytes"] < 1e6
    assert lines[0]["posted"] >= lines[0]["model_bytes"]


@pytest.mark.slow
def test_a_two_stage_pipeline_over_send_and_recv_equals_gloo(tmp_path):
    proc, lines = launch(room_file(tmp_path), EXAMPLES / "pipeline.py", "--steps", "3")
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the launcher's summary counts the sends and receives (the program calls no collective)
    for rank in ("rank 0 (alice)", "rank 1 (bob)"):
        assert re.search(rf"{re.escape(rank)}: exit 0; 0 collectives, 6 messages sent or received, [\d.]+ K?B,",
                         proc.stderr), proc.stderr[-2000:]
    ref = gloo_reference(EXAMPLES / "pipeline.py", 2, "--steps", "3")
    assert [d["params_sha256"] for d in lines] == [d["params_sha256"] for d in ref]
    assert lines[1]["loss"] == ref[1]["loss"]


@pytest.mark.slow
def test_a_mixture_of_experts_over_all_to_all_equals_gloo(tmp_path):
    """examples/moe.py: digits routed to the experts of both ranks and back with all_to_all_single (uneven,
    one rank's expert may get none), the gradients back the same way; every parameter as gloo's."""
    proc, lines = launch(room_file(tmp_path), EXAMPLES / "moe.py", "--steps", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    ref = gloo_reference(EXAMPLES / "moe.py", 2, "--steps", "2")
    keys = ("expert_sha256", "shared_sha256", "loss", "expert_share")
    assert [{k: d[k] for k in keys} for d in lines] == [{k: d[k] for k in keys} for d in ref]
    assert lines[0]["shared_sha256"] == lines[1]["shared_sha256"] != ""


@pytest.mark.slow
def test_hybrid_sharding_over_subgroups_equals_gloo(tmp_path):
    """examples/hsdp.py on four ranks: shard groups from new_subgroups, replica groups across them from
    new_subgroups_by_enumeration, their collectives interleaved; every rank ends on gloo's parameters, and
    the launcher counts the subgroups' collectives."""
    proc, lines = launch(room_file(tmp_path, 4), EXAMPLES / "hsdp.py", "--steps", "3", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ref = gloo_reference(EXAMPLES / "hsdp.py", 4, "--steps", "3")
    keys = ("params_sha256", "loss", "shard_group", "replica_group")
    assert [{k: d[k] for k in keys} for d in lines] == [{k: d[k] for k in keys} for d in ref]
    assert len({d["params_sha256"] for d in lines}) == 1
    assert lines[0]["shard_group"] == [0, 1] and lines[0]["replica_group"] == [0, 2]
    # 3 a step and the last gather, each on a subgroup (new_subgroups' own barriers may add to them)
    counts = [int(n) for n in re.findall(r"exit 0; (\d+) collectives", proc.stderr)]
    assert len(counts) == 4 and min(counts) >= 10, proc.stderr[-2000:]


# ---- failures: a dead rank, bad arguments, Ctrl-C ----------------------------------------------------

@pytest.mark.slow
def test_a_dead_rank_fails_the_others_clearly_after_the_timeout(tmp_path):
    # The launcher stops the survivors at once when a rank fails, or `--grace-s` wall seconds later: here alice
    # is given the time to see her own collective fail (5 simulated seconds, her timeout), as a user may ask.
    proc, lines = launch(room_file(tmp_path), SCRIPTS / "dead_rank.py", timeout=240, launcher_args=("--grace-s", "150"))
    assert proc.returncode == 3, proc.stderr[-3000:]  # the first failing rank's status: bob's
    (alice,) = [d for d in lines if d["rank"] == 0]
    assert alice["type"] == "WcclError"
    assert "timed out after 5 s" in alice["error"] and "rank 1 (bob)" in alice["error"]
    assert alice["y"] == [7.0] * 4  # the tensor was left as it was: nothing partial written


@pytest.mark.parametrize("argv, message", [
    (["--node", "zed"], "--node zed: not a training node of the room (alice, bob)"),
    (["--node", "bob"], "--node runs one laptop's rank on real devices"),
    (["--config", "/nonexistent.toml"], "config file not found"),
])
def test_bad_launcher_arguments_get_one_line(tmp_path, argv, message):
    cfg = room_file(tmp_path)
    args = ["--config", str(cfg), *argv] if argv[0] != "--config" else argv
    proc = subprocess.run([sys.executable, "-m", "wccl.launch", *args, str(EXAMPLES / "collectives_hello.py")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_missing_script_and_a_bad_room_file(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "wccl.launch", "--config", str(room_file(tmp_path)), "nope.py"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "nope.py: no such script" in proc.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text('[room]\nprofile = "exact"\n[[room.nodes]]\nname = "alice"\nroles = ["server"]\n')
    proc = subprocess.run([sys.executable, "-m", "wccl.launch", "--config", str(bad), "x.py"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2 and "room.nodes" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("url_tail, rank, world, message", [
    ("?node=zed", 0, 2, "node 'zed' is not a training node of the room (alice, bob)"),
    ("?node=alice", 0, 3, "world size 3 does not match the room's 2 training nodes"),
    ("?node=bob", 0, 2, "rank 0 does not match node 'bob', which is rank 1"),
    ("", -1, 2, "name this laptop's node"),  # no node and no rank (a rank alone picks the room's node)
])
def test_init_method_errors_name_what_is_wrong(tmp_path, url_tail, rank, world, message):
    cfg = room_file(tmp_path)
    code = ("import torch.distributed as dist, wccl.distributed\n"
            f"dist.init_process_group('wccl', init_method='wccl://{cfg}{url_tail}', rank={rank}, world_size={world})\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WCCL_")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert proc.returncode != 0 and message in proc.stderr


@pytest.mark.slow
def test_init_method_wccl_without_the_launcher(tmp_path):
    """Two processes started by hand: `init_method='wccl://ROOM?node=NAME'` and a room started by hand."""
    cfg = room_file(tmp_path)
    sock = Path("/tmp") / f"wccl-test-{os.getpid()}.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WCCL_")}
    env.update(WCCL_ROOM=str(sock), WCCL_ROOM_AUTHKEY="k")
    room = subprocess.Popen([sys.executable, "-m", "wccl.room.serve", "--config", str(cfg), "--socket", str(sock),
                             "--authkey-env", "WCCL_ROOM_AUTHKEY"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not sock.exists():
            assert room.poll() is None
            time.sleep(0.05)
        code = ("import sys, torch, torch.distributed as dist, wccl.distributed\n"
                f"node = sys.argv[1]\ndist.init_process_group('wccl', init_method=f'wccl://{cfg}?node={{node}}')\n"
                "x = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(x); print(dist.get_rank(), x.item())\n"
                "dist.destroy_process_group()\n")
        procs = [subprocess.Popen([sys.executable, "-c", code, n], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for n in ("bob", "alice")]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:]
        assert sorted(o[0].strip() for o in outs) == ["0 3.0", "1 3.0"]
    finally:
        room.terminate()
        room.wait(timeout=30)


def _in_session(sid: int) -> list[int]:
    """Live processes of session `sid` (read from /proc: no procps needed)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
def test_ctrl_c_stops_every_process_the_launcher_started(tmp_path):
    cmd = [sys.executable, "-m", "wccl.launch", "--config", str(room_file(tmp_path)), str(SCRIPTS / "forever.py")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    try:
        assert "started" in proc.stdout.readline()  # (both ranks' lines may arrive as one)
        time.sleep(1.0)
        assert len(_in_session(proc.pid)) >= 4  # the launcher, the room, two ranks
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        time.sleep(0.5)
        left = _in_session(proc.pid)
        assert left == [], f"still running: {left}"
        assert "every process it started has stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


CHARGE_PHASES = "inline:0.4,callback:0.4,callback:0"  # tests/dist_scripts/charge.py: one launch, three measurements


@pytest.fixture(scope="module")
def charged(tmp_path_factory):
    """tests/dist_scripts/charge.py's three phases in one launch with compute_scale 1: each rank's
    [inline 0.4 s, in a callback 0.4 s, in a callback 0 s], in simulated seconds (a list a rank)."""
    cfg = room_file(tmp_path_factory.mktemp("charged"), extra="[collectives]\ncompute_scale = 1.0\n")
    proc, lines = launch(cfg, SCRIPTS / "charge.py", env={"PHASES": CHARGE_PHASES})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [d["rank"] for d in lines] == [0, 1] and all(len(d["took_s"]) == 3 for d in lines), lines
    return [d["took_s"] for d in lines]


@pytest.mark.slow
@pytest.mark.parametrize("scale", [1.0, 0.0])
def test_a_ranks_compute_is_charged_to_the_room_time(tmp_path, scale, request):
    """Rank 0 computes 0.4 s of CPU between two all-reduces: with compute_scale 1 its second all-reduce
    ends at least 0.4 simulated seconds after the first, and rank 1's nearly so (it waits for rank 0's
    part, shown 0.4 s after rank 0 had the first result, which rank 1 may have had a frame or two later);
    with compute_scale 0 the compute is free. (compute_scale 1: the first phase of the `charged` launch.)"""
    if scale:
        took = [t[0] for t in request.getfixturevalue("charged")]
        assert 0.4 <= took[0] < 0.4 + 1.0 and 0.3 <= took[1] < 0.4 + 1.0, took
    else:
        cfg = room_file(tmp_path, extra=f"[collectives]\ncompute_scale = {scale}\n")
        proc, lines = launch(cfg, SCRIPTS / "charge.py", env={"PHASES": "inline:0.4"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        took = [d["took_s"][0] for d in lines]
        assert len(took) == 2 and all(t < 0.4 for t in took), took


@pytest.mark.slow
def test_a_callbacks_compute_is_charged_too(charged):
    """The same 0.4 s of CPU inside a callback on the first all-reduce's future (where a comm hook such as
    PowerSGD computes), with the second all-reduce issued from the callback: it goes up 0.4 s later, so
    rank 0's second all-reduce ends 0.4 s later than with no compute, and rank 1's nearly so (each rank
    counts from its own first result, which rank 1 may have had a frame later). (The second and third
    phases of the `charged` launch: each begins with an all-reduce that brings the ranks together.)"""
    took = {"0.4": [t[1] for t in charged], "0": [t[2] for t in charged]}
    assert 0.35 <= took["0.4"][0] - took["0"][0] < 0.4 + 0.5, took
    assert 0.2 <= took["0.4"][1] - took["0"][1] < 0.4 + 0.5, took


# ---- compression: codec comm hooks and local steps --------------------------------------------------

def _check_compressed(lines: list[dict], world: int) -> None:
    assert [d["rank"] for d in lines] == list(range(world))
    for name, h in lines[0]["hooks"].items():
        assert {d["hooks"][name]["sha"] for d in lines} == {h["sha"]}, f"{name}: replicas differ"
        assert h["bytes"] == h["expected_bytes"] > 0, name
    assert len({d["local"]["sha"] for d in lines} | {d["local"]["global_sha"] for d in lines}) == 1
    assert len({d["local"]["averaged_sha"] for d in lines}) == 1
    assert lines[0]["local"]["bytes"] == lines[0]["local"]["expected_bytes"] > 0
    # overlapped local steps: every replica ends the same after finish(); the first sync applies nothing,
    # each later one the round before's exchange (its extras: that round's last step), finish() the rest
    ov = lines[0]["overlap"]
    assert len({d["overlap"]["sha"] for d in lines} | {d["overlap"]["global_sha"] for d in lines}) == 1
    syncs = [r for r in ov["results"] if r is not None]
    assert ov["results"][1] is None and syncs == [float(s) for s in range(1, len(ov["results"]) - 3, 2)], ov
    assert ov["syncs"] == len(syncs) + 2 and ov["sha"] != lines[0]["local"]["sha"]


@pytest.fixture(scope="module")
def compressed_gloo():
    """tests/dist_scripts/compressed.py over gloo with every codec, 3 steps (each codec's hook trains a model of
    its own, from the same seed and batches: int8's and topk_ef's are those of a run of those two alone)."""
    return gloo_reference(SCRIPTS / "compressed.py", 2)


@pytest.fixture(scope="module")
def compressed_light(tmp_path_factory):
    """compressed.py over the light with the int8 and topk_ef hooks, all in one launch: the run of 3 steps,
    then the same of 5 (its "more"), then the local steps with rank 1 started apart (its "error")."""
    proc, lines = launch(room_file(tmp_path_factory.mktemp("compressed"), 2), SCRIPTS / "compressed.py",
                         "--codecs", "int8,topk_ef", "--steps", "3,5", "--then-mismatch")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return lines


@pytest.mark.slow
def test_codec_hooks_and_local_steps_over_gloo(compressed_gloo):
    _check_compressed(compressed_gloo, 2)


@pytest.mark.slow
def test_codec_hooks_and_local_steps_over_light_frame_exactly_the_codec_bytes(compressed_light, compressed_gloo):
    lines = compressed_light
    _check_compressed(lines, 2)
    # the same bits as under gloo: the hooks' models, the local steps' and the overlapped local steps'
    gloo = compressed_gloo[0]
    d = lines[0]
    assert set(d["hooks"]) == {"int8", "topk_ef"}
    assert {k: h["sha"] for k, h in d["hooks"].items()} == {k: gloo["hooks"][k]["sha"] for k in d["hooks"]}
    assert (d["local"]["sha"], d["overlap"]["sha"]) == (gloo["local"]["sha"], gloo["overlap"]["sha"])
    # what the node framed = DDP's constructor collectives + the codec bytes + the start checks (32 B each)
    # + the local-steps extras (8 B a sync); the constructor's share is the same for both runs below (each
    # run's `bytes_posted` counts from its own start: the 5-step run follows the 3-step one in the launch)
    def codec_bytes_of(d):
        return (sum(h["bytes"] for h in d["hooks"].values()) + sum(d[k]["bytes"] + 32 + 8 * d[k]["syncs"]
                                                                   for k in ("local", "overlap")))

    codec_bytes = codec_bytes_of(d)
    assert d["bytes_posted"] > codec_bytes
    (d2,) = d["more"]
    assert d2["steps"] == 5 and all(h["bytes"] == h["expected_bytes"] > 0 for h in d2["hooks"].values()), d2
    assert d2["bytes_posted"] - d["bytes_posted"] == codec_bytes_of(d2) - codec_bytes > 0


@pytest.mark.slow
def test_local_steps_refuse_ranks_that_start_apart(compressed_light):
    # (the last part of the `compressed_light` launch: LocalSteps around a model rank 1 built from another seed)
    assert [d["rank"] for d in compressed_light] == [0, 1]
    assert all("rank(s) [1] start from other parameters" in d["error"] for d in compressed_light)
