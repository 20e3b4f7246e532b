"""What `python -m wccl.launch` says on its terminal, and how it ends a run a rank failed.

The launcher names each rank as it starts, joins the room and syncs (the layout it picked), shows a
live line of the collectives on a terminal, names a failed rank with its status and its stderr's last
lines, stops the others at once, and ends with a summary; nothing is printed after it. Without the
launcher, `init_process_group("wccl")` says how to start the script. The runs use small `exact` rooms
(a perfect camera) with no [logging] table: the launcher's default level applies.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from wccl.launch import json_objects

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "dist_scripts"
EXAMPLES = ROOT / "examples"
NOT_LAUNCHED = ("wccl: this script needs its ranks started by the launcher: python -m wccl.launch --config "
                "ROOM.toml script.py (or pass init_method='wccl://ROOM.toml?node=NAME')")


def exact_room(tmp_path: Path) -> Path:
    path = tmp_path / "room.toml"
    path.write_text('[room]\nprofile = "exact"\nsession = 31\n'
                    '[[room.nodes]]\nname = "alice"\nroles = ["server", "worker"]\n'
                    '[[room.nodes]]\nname = "bob"\nroles = ["worker"]\n')
    return path


def launcher(config: Path, script: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "wccl.launch", "--config", str(config), str(script), *args]


def summary_at_the_end(stderr: str) -> list[str]:
    """The summary: the launcher's last lines (its head, then one line per rank); nothing after it."""
    lines = stderr.rstrip("\n").splitlines()
    assert len(lines) >= 3, stderr
    head, *ranks = lines[-3:]
    assert re.match(r"wccl\.launch: .* after [\d.]+ s:$", head), stderr[-3000:]
    assert [r.split(":")[1].strip() for r in ranks] == ["rank 0 (alice)", "rank 1 (bob)"], stderr[-3000:]
    return ranks


# ---- a failed rank ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fail_at", ["start", pytest.param("collective", marks=pytest.mark.slow)])
def test_a_failed_rank_is_named_and_the_others_are_stopped_at_once(tmp_path, fail_at):
    """Bob raises (before init_process_group, or after a first all_reduce); alice waits for him (in
    init_process_group, or in her next all_reduce, with a 600 s timeout): the launcher names bob with his
    status and his traceback's last lines, stops alice and the room at once and ends with a summary."""
    proc = subprocess.Popen(launcher(exact_room(tmp_path), SCRIPTS / "fail_rank.py"), cwd=ROOT,
                            env=dict(os.environ, FAIL_AT=fail_at), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stderr:
            lines.append((time.monotonic(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    ended = time.monotonic()
    reader.join(10)
    stderr = "".join(line for _, line in lines)
    assert proc.returncode == 1, stderr[-3000:]
    named = [(t, line) for t, line in lines if line.startswith("wccl.launch: rank 1 (bob) exited with status 1; "
                                                              "its last")]
    assert len(named) == 1, stderr[-3000:]
    # promptly: no grace for alice (her collective would wait 600 s), a short SIGTERM and the last output
    assert ended - named[0][0] < 10, stderr[-3000:]
    after = stderr[stderr.index(named[0][1]):]
    message = f"rank 1 fails {'before init_process_group' if fail_at == 'start' else 'after its first all_reduce'}"
    assert re.search(rf"wccl\.launch:   bob\| .*RuntimeError: {message}", after), after  # the tail of his stderr
    assert "wccl.launch: stopping rank 0 (alice) and the room" in after
    alice, bob = summary_at_the_end(stderr)
    assert "stopped by the launcher" in alice and "exit 1" in bob
    if fail_at == "collective":
        assert "1 collective," in bob and "in init_process_group" not in alice
    else:
        assert "before init_process_group" in bob and "in init_process_group (greeting its peers)" in alice
    pid = int(re.search(r"rank 0 \(alice\) started \(pid (\d+)\)", stderr).group(1))
    assert not Path(f"/proc/{pid}").exists()  # stopped and reaped
    assert "room_client_left" not in stderr and "Broken pipe" not in stderr
    assert "\x1b[K" not in stderr  # not a terminal: no live line


# ---- what it says on the way -------------------------------------------------------------------------

def _on_a_terminal(cmd: list[str], timeout: float) -> tuple[subprocess.CompletedProcess, str]:
    """Run `cmd` with its stderr on a pseudo-terminal (its stdout a pipe); the stderr as written."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed it
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    os.close(master)
    err = b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), err


@pytest.mark.slow
def test_the_launcher_says_each_ranks_start_sync_and_collectives(tmp_path):
    """On a terminal: a line per rank started, in init_process_group and synced (with its layout), the live
    line of the collectives, redrawn in place, and the summary with each rank's count; the ranks' logs
    at the default level (warnings) say nothing in a run that goes well."""
    proc, err = _on_a_terminal(launcher(exact_room(tmp_path), EXAMPLES / "collectives_hello.py"), timeout=300)
    assert proc.returncode == 0, err[-3000:]
    got = sorted((d for d in json_objects(proc.stdout) if "rank" in d), key=lambda d: d["rank"])
    assert [d["all_reduce"] for d in got] == [[10.0, 12.0, 14.0, 16.0]] * 2
    lines = [line.split("\r")[-1].replace("\x1b[K", "") for line in err.splitlines()]  # as a terminal shows them
    for rank, node, peer in ((0, "alice", "bob"), (1, "bob", "alice")):
        name = f"wccl.launch: rank {rank} ({node})"
        assert [x for x in lines if re.match(rf"{re.escape(name)} started \(pid \d+\)$", x)], err
        assert [x for x in lines if x.startswith(f"{name} in init_process_group at ")
                and x.endswith("greeting its peers, measuring which camera reads which screen")], err
        synced = [x for x in lines if x.startswith(f"{name} synced at ")]
        assert len(synced) == 1, err
        assert re.search(rf"\([\d.]+ s simulated\): layout \d+x\d+ cells of \d+ px, \d+ colours, frames held \d+ ms; "
                         rf"its camera reads {peer} \d+% of their frames$", synced[0]), synced
    # the live line: drawn, then cleared and redrawn in place, showing the collectives
    assert "\r\x1b[K" in err and re.search(r"wccl\.launch [\d.]+ s \| \d+ collectives? \| \d+ B \| [\d.]+ s simulated",
                                           err), err[-3000:]
    alice, bob = summary_at_the_end("\n".join(lines))
    for line in (alice, bob):
        assert re.search(r": exit 0; 5 collectives, 53 B, [\d.]+ s simulated$", line), line
    assert lines[-3].startswith("wccl.launch: all 2 ranks exited 0 after ")
    assert "\x1b" not in err[err.index("all 2 ranks exited 0"):]  # the live line is gone before the summary
    assert '"level"' not in err and "[info" not in err  # no rank or room log line at the default level


# ---- without the launcher ----------------------------------------------------------------------------

def _bare_env() -> dict:
    gone = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    return {k: v for k, v in os.environ.items() if not k.startswith("WCCL_") and k not in gone}


def test_init_process_group_outside_the_launcher_says_how_to_start_the_script():
    code = 'import torch.distributed as dist, wccl.distributed; dist.init_process_group("wccl")'
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=_bare_env())
    assert proc.returncode != 0
    assert proc.stderr.rstrip().splitlines()[-1] == f"wccl.config.ConfigError: {NOT_LAUNCHED}", proc.stderr
    assert "environment variable RANK expected" not in proc.stderr


def test_torchs_own_backends_keep_torchs_env_error():
    """The message is the wccl backend's: gloo's init_process_group, wccl.distributed imported, is torch's."""
    code = 'import torch.distributed as dist, wccl.distributed; dist.init_process_group("gloo")'
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=_bare_env())
    assert proc.returncode != 0
    assert "environment variable RANK expected" in proc.stderr and "wccl.launch" not in proc.stderr


def test_the_progress_line_names_a_few_waiting_ranks_counts_a_classroom_and_a_pipelines_messages():
    from types import SimpleNamespace

    from wccl.launch import _Launch

    def rank(node, phase, messages=0):
        return SimpleNamespace(node=node, phase=phase, exit=None, count=0, messages=messages, nbytes=0, t=0.0)

    few = SimpleNamespace(elapsed=lambda: "5 s", ranks=[rank("alice", "ready"), rank("bob", "starting"),
                                                        rank("carol", "greeting")])
    assert _Launch.progress_text(few) == ("5 s | 0 collectives | 0 B | 0.0 s simulated | bob starting | "
                                          "carol greeting its peers")
    many = SimpleNamespace(elapsed=lambda: "1 min 00 s",
                           ranks=[rank("alice", "starting")] + [rank(f"n{i}", "greeting") for i in range(15)])
    assert _Launch.progress_text(many) == "1 min 00 s | alice starting | 15 ranks greeting their peers"
    # a pipeline's ranks send and receive and may call no collective: the line counts their messages
    p2p = SimpleNamespace(elapsed=lambda: "9 s", ranks=[rank("alice", "ready", 4), rank("bob", "ready", 3)])
    assert _Launch.progress_text(p2p) == "9 s | 0 collectives | 4 messages | 0 B | 0.0 s simulated"
