"""Ranks forked from a process that has already imported torch (wccl.runtime.forkserver): each child runs
its script as `python script.py` would, with its own argv, environment, folder, pipes and random seed, and
the launcher learns its exit status (a signal's as Popen gives it)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from wccl.runtime.forkserver import RankForker, available

pytestmark = pytest.mark.skipif(not available(), reason="ranks are forked on Linux only")

SCRIPT = textwrap.dedent("""\
    import json, os, sys, time
    import numpy as np
    import torch
    mode = sys.argv[1]
    if mode == "report":
        print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "rank": os.environ.get("RANK"),
                          "path0": sys.path[0], "main": __name__, "draw": float(np.random.random()),
                          "torch": torch.ones(2).sum().item(), "torch_draw": torch.rand(1).item(),
                          "file": __file__}))
        os.write(int(os.environ["STATUS_FD"]), b"status line\\n")
    elif mode == "fail":
        if len(sys.argv) > 2:
            sys.excepthook = lambda t, e, tb: print("its own hook:", e, file=sys.stderr)
        def inner():
            raise ValueError("the script's own error")
        inner()
    elif mode == "exit":
        sys.exit(int(sys.argv[2]))
    elif mode == "echo":
        print("read:", sys.stdin.readline().strip())
    elif mode == "stubborn":
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("sleeping", flush=True)
        time.sleep(60)
    elif mode == "sleep":
        print("sleeping", flush=True)
        time.sleep(60)
""")


def _read(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode()


@pytest.fixture(scope="module")
def forker():
    f = RankForker(dict(os.environ))
    yield f
    f.close()


def _spawn(forker, tmp_path, *args, env=None):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    pipes = [os.pipe() for _ in range(3)]
    proc = forker.spawn([str(script), *args], dict(os.environ, **(env or {})), str(tmp_path),
                        pipes[0][1], pipes[1][1], {"STATUS_FD": pipes[2][1]})
    for _, w in pipes:
        os.close(w)
    return proc, [r for r, _ in pipes]


def test_a_forked_rank_runs_its_script_as_python_would_with_its_own_seed(forker, tmp_path):
    runs = []
    for rank in ("0", "1"):
        proc, (out, err, status) = _spawn(forker, tmp_path, "report", env={"RANK": rank})
        assert proc.wait(timeout=60) == 0, _read(err)
        runs.append((json.loads(_read(out)), _read(status)))
    for rank, (seen, status) in enumerate(runs):
        assert seen["argv"][1:] == ["report"] and seen["rank"] == str(rank) and seen["main"] == "__main__"
        assert seen["cwd"] == str(tmp_path) and seen["path0"] == str(tmp_path) and seen["torch"] == 2.0
        assert seen["file"] == str(tmp_path / "script.py")  # absolute, as python makes it
        assert status == "status line\n"
    assert runs[0][0]["draw"] != runs[1][0]["draw"]  # numpy's global generator seeded afresh in each
    assert runs[0][0]["torch_draw"] != runs[1][0]["torch_draw"]  # and torch's


def test_a_forked_ranks_exit_status_and_traceback_are_those_of_its_script(forker, tmp_path):
    proc, (out, err, _) = _spawn(forker, tmp_path, "exit", "3")
    assert proc.wait(timeout=60) == 3
    proc, (out, err, _) = _spawn(forker, tmp_path, "fail")
    assert proc.wait(timeout=60) == 1
    text = _read(err)
    assert "ValueError: the script's own error" in text and "forkserver" not in text and "runpy" not in text
    assert text.startswith("Traceback") and 'script.py", line' in text
    proc, (out, err, _) = _spawn(forker, tmp_path, "fail", "hooked")
    assert proc.wait(timeout=60) == 1 and _read(err) == "its own hook: the script's own error\n"


def test_a_forked_rank_stops_on_a_signal_and_with_the_forker(tmp_path):
    forker = RankForker(dict(os.environ))
    try:
        proc, (out, err, _) = _spawn(forker, tmp_path, "sleep")
        assert os.read(out, 100).startswith(b"sleeping")
        assert proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == -signal.SIGTERM
        second, _ = _spawn(forker, tmp_path, "sleep")
    finally:
        forker.close()  # the launcher gone: the forker ends the ranks it started
    with pytest.raises(ProcessLookupError):  # ended and reaped before close() returned
        os.kill(second.pid, 0)


def test_the_forker_is_gone_and_says_so(tmp_path):
    forker = RankForker(dict(os.environ))
    forker.proc.kill()
    forker.proc.wait()
    from wccl.runtime.forkserver import ForkServerError

    with pytest.raises(ForkServerError, match="the rank forker is gone"):
        _spawn(forker, tmp_path, "report")
    forker.close()


def test_a_forked_rank_reads_the_launchers_stdin(tmp_path):
    """As a process the launcher started would: a rank that pairs asks its question on the console."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    code = textwrap.dedent(f"""\
        import os, sys
        from wccl.runtime.forkserver import RankForker
        forker = RankForker(dict(os.environ))
        proc = forker.spawn([{str(script)!r}, "echo"], dict(os.environ), {str(tmp_path)!r}, 1, 2)
        code = proc.wait(timeout=60)
        forker.close()
        sys.exit(code)
    """)
    r = subprocess.run([sys.executable, "-c", code], input="yes\n", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "read: yes\n", r.stderr[-2000:]


def test_a_rank_outlives_a_dead_forker_until_the_launcher_stops_it(tmp_path):
    """The helper killed: its rank (which ignores SIGTERM) still runs and poll() says so; the launcher's
    SIGKILL reaches it through its pidfd, and it ends with status 1 (its own is not known)."""
    forker = RankForker(dict(os.environ))
    try:
        proc, (out, err, _) = _spawn(forker, tmp_path, "stubborn")
        assert os.read(out, 100).startswith(b"sleeping")
        forker.proc.kill()
        forker.proc.wait()
        assert proc.poll() is None and forker.gone
        os.kill(proc.pid, 0)  # alive
        proc.kill()
        assert proc.wait(timeout=30) == 1
    finally:
        forker.close()
