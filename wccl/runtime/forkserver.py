"""Rank processes forked from one that has already imported torch: each rank starts in milliseconds.

A rank process started afresh spends about two CPU seconds importing torch, torch.distributed and
wccl before its script's first line; a simulated room's launch starts every rank at once on one
machine, so a room of three pays that three times over, and a classroom sixteen. `RankForker`
starts one helper process (`python -m wccl.runtime.forkserver`) that imports PRELOAD once and then
forks a child for each rank asked for: the child takes the rank's argv, environment, working folder
and stdout/stderr/status pipes (its stdin is the launcher's, as for a process it started: a rank that
pairs asks its question on the console), and runs the script as `python script.py` would (`__main__`, the
script's folder first on sys.path, numpy's global generator seeded afresh; Python's `random`
reseeds itself at fork). Nothing else is shared: the helper has run no tensor operation, opened no
camera or window and started no thread of its own before it forks (numpy's BLAS pool is fork-safe).

The launcher holds a `ForkedProcess` per rank, which answers as `subprocess.Popen` does (`pid`,
`returncode`, `poll`, `wait`, `send_signal`, `terminate`, `kill`): the helper reaps its children and
reports each exit status (negative: killed by that signal) over their socket. The ranks are in the
launcher's process group (Ctrl-C reaches them as it would reach processes it started itself); they
end (SIGTERM) when the helper dies, and the helper ends its ranks when the launcher closes the
socket or dies.

Linux only (`available()`): macOS forks badly once system frameworks are loaded and Windows does not
fork; there the launcher starts each rank with `subprocess.Popen`.
"""

from __future__ import annotations

import importlib
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping

# What a rank imports before its first step: torch, its backend, wccl's; DDP's constructor imports
# torch._dynamo (and FSDP with it), 1.6 CPU s of its own.
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "wccl.distributed")
REAP_EVERY_S = 0.05  # how often the helper looks for children that ended (an exit is seen this late at most)
START_S = 120.0  # the helper's imports and the first fork, at most (a loaded machine)
MAX_FDS = 8


def available() -> bool:
    """Whether ranks are forked here (Linux) rather than started afresh."""
    return sys.platform.startswith("linux")


class ForkServerError(RuntimeError):
    """The helper process is gone or did not answer: no rank can be forked."""


class RankForker:
    """The launcher's end: starts the helper, asks it for ranks, and learns how they ended."""

    def __init__(self, env: Mapping[str, str], stderr: int | None = None) -> None:
        from wccl.runtime.hostos import end_with_parent

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "wccl.runtime.forkserver", str(theirs.fileno())],
                                         env=dict(env), stdout=subprocess.DEVNULL,
                                         stderr=stderr, pass_fds=(theirs.fileno(),), preexec_fn=end_with_parent)
        finally:
            theirs.close()
        self.sock = ours
        self.codes: dict[int, int] = {}  # pid -> exit status, once the helper has reaped it
        self.pids: list[int] = []

    def spawn(self, argv: list[str], env: Mapping[str, str], cwd: str, stdout: int, stderr: int,
              fd_env: Mapping[str, int] | None = None) -> ForkedProcess:
        """A rank: `argv` is [script, *args]; `fd_env` names further pipes by the variable that tells the
        rank their number (WCCL_STATUS_FD)."""
        names = ["stdout", "stderr", *(fd_env or {})]
        fds = [stdout, stderr, *(fd_env or {}).values()]
        request = json.dumps({"argv": argv, "env": dict(env), "cwd": cwd, "fds": names}).encode()
        if self.sock.fileno() < 0:
            raise ForkServerError(f"the rank forker is gone (exit status {self.proc.returncode})")
        try:
            socket.send_fds(self.sock, [request], fds)
        except OSError as e:
            raise ForkServerError(f"the rank forker is gone ({e})") from None
        deadline = time.monotonic() + START_S
        while True:
            msg = self._read(max(0.0, deadline - time.monotonic()))
            if msg is None and self.sock.fileno() < 0:
                raise ForkServerError(f"the rank forker is gone (exit status {self.proc.returncode})")
            if msg is None:
                raise ForkServerError(f"the rank forker did not fork within {START_S:g} s")
            if "pid" in msg:
                self.pids.append(msg["pid"])
                return ForkedProcess(self, msg["pid"], argv)

    def collect(self, timeout: float) -> None:
        """Take in the exit statuses the helper has sent, waiting up to `timeout` s for the first."""
        msg = self._read(timeout)
        while msg is not None:
            msg = self._read(0.0)

    def _read(self, timeout: float) -> dict | None:
        """One message from the helper (its exits are filed on the way), or None if none came in time."""
        if self.sock.fileno() < 0:
            return None
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return None
        data = self.sock.recv(4096)
        if not data:  # the helper died: its ranks got SIGTERM (PR_SET_PDEATHSIG) and nobody will reap them
            code = self.proc.wait()
            for pid in self.pids:
                self.codes.setdefault(pid, code if code > 0 else 1)
            self.sock.close()
            return None
        msg = json.loads(data)
        if "exited" in msg:
            self.codes[msg["exited"]] = msg["code"]
        return msg

    def close(self) -> None:
        """End the helper (it stops any rank still running) and wait for it."""
        if self.sock.fileno() >= 0:
            self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ForkedProcess:
    """A forked rank, as the launcher sees it: what `subprocess.Popen` offers, through its `RankForker`."""

    def __init__(self, forker: RankForker, pid: int, args: list[str]) -> None:
        self.forker, self.pid, self.args = forker, pid, args

    @property
    def returncode(self) -> int | None:
        return self.forker.codes.get(self.pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.forker.collect(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self.forker.collect(min(left, 1.0))
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


# ---- the helper process --------------------------------------------------------------------------

def _serve(sock: socket.socket) -> tuple[dict, list[int]] | None:
    """Fork a child for each request until the launcher closes the socket. In a child: its request and
    pipes; in the helper, once the launcher is gone and its ranks have ended: None."""
    children: set[int] = set()

    def reap() -> None:
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            children.discard(pid)
            try:
                sock.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
            except OSError:
                pass  # the launcher is gone

    while True:
        reap()
        ready, _, _ = select.select([sock], [], [], REAP_EVERY_S)
        if not ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, MAX_FDS)
        except OSError:
            data, fds = b"", []
        if not data:
            break
        request = json.loads(data)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            sock.close()
            return request, fds
        children.add(pid)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
    for pid in children:  # the launcher is gone: so are its ranks
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    while children:
        pid, _ = os.waitpid(-1, 0)
        children.discard(pid)
    return None


def _become(request: dict, fds: list[int]) -> None:
    """This forked child takes the rank's pipes, environment, folder and argv."""
    from wccl.runtime.hostos import end_with_parent

    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    end_with_parent()
    env = dict(request["env"])
    for name, fd in zip(request["fds"], fds, strict=True):
        if name in ("stdout", "stderr"):
            os.dup2(fd, 1 if name == "stdout" else 2)
            os.close(fd)
        else:
            os.set_inheritable(fd, True)
            env[name] = str(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(request["cwd"])
    # stdout as a new process has it (a pipe: block-buffered unless PYTHONUNBUFFERED); stderr line-buffered
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.open(1, "wb", closefd=False, buffering=0 if unbuffered else -1),
                                                   write_through=unbuffered)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.open(2, "wb", closefd=False, buffering=0),
                                                   line_buffering=True, write_through=True,
                                                   errors="backslashreplace")
    script = os.path.abspath(request["argv"][0])
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(script)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the ranks' and the launcher's to answer
    sock = socket.socket(fileno=int(argv[0]))
    for name in PRELOAD:
        importlib.import_module(name)
    child = _serve(sock)
    if child is None:
        return 0
    _become(*child)
    import runpy

    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:  # as `python script.py` would show it: the script's frames only
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != sys.argv[0] and \
                os.path.abspath(tb.tb_frame.f_code.co_filename) != os.path.abspath(sys.argv[0]):
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb or e.__traceback__)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
