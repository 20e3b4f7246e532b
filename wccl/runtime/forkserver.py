"""Rank processes forked from one that has already imported torch: each rank starts in milliseconds.

A rank process started afresh spends about two CPU seconds importing torch, torch.distributed and
wccl before its script's first line; a simulated room's launch starts every rank at once on one
machine, so a room of three pays that three times over, and a classroom sixteen. `RankForker`
starts one helper process (`python -m wccl.runtime.forkserver`) that imports PRELOAD once and then
forks a child for each rank asked for: the child takes the rank's argv, environment, working folder
and stdout/stderr/status pipes (its stdin is the launcher's, as for a process it started: a rank that
pairs asks its question on the console), and runs the script as `python script.py` would (`__main__`,
an absolute `__file__`, the script's folder first on sys.path, an uncaught exception through `sys.excepthook`; numpy's and torch's global
generators and multiprocessing's authkey drawn afresh, Python's `random` reseeding itself at fork;
the hash seed of str stays the helper's). Nothing else is shared: the helper has run no tensor
operation, opened no camera or window and started no thread of its own before it forks (numpy's BLAS
pool is fork-safe). A module of PRELOAD that does not import is left for the rank to import itself.

The launcher holds a `ForkedProcess` per rank, which answers as `subprocess.Popen` does (`pid`,
`returncode`, `poll`, `wait`, `send_signal`, `terminate`, `kill`): the helper reaps its children and
reports each exit status (negative: killed by that signal) over their socket, with a pidfd of each
child, through which the launcher's signals reach the rank and never a process that took a reused
pid. The ranks are in the launcher's process group (Ctrl-C reaches them as it would reach processes it
started itself); they get SIGTERM when the helper dies, and the helper ends its ranks when the
launcher closes the socket or dies. Should the helper die first, a rank's end is seen on its pidfd
(exit status 1: its own is not known).

Linux only (`available()`): macOS forks badly once system frameworks are loaded and Windows does not
fork; there the launcher starts each rank with `subprocess.Popen`.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Mapping

from wccl.runtime.hostos import end_with_parent

# What a rank imports before its first step: torch, its backend, wccl's; DDP's constructor imports
# torch._dynamo (and FSDP with it), 1.6 CPU s of its own. The backend's process group and node, the
# media (the room's client) and scipy.optimize (a camera's lens fit) are imported when the rank's
# script calls init_process_group: about 0.8 CPU s more per rank.
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "wccl.distributed",
           "wccl.distributed.backend", "wccl.distributed.rank_node", "wccl.media.parts", "scipy.optimize")
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
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "wccl.runtime.forkserver", str(theirs.fileno()),
                                          str(os.getpid())], env=dict(env), stdout=subprocess.DEVNULL,
                                         stderr=stderr, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        self.sock = ours
        self.codes: dict[int, int] = {}  # pid -> exit status, once the helper has reaped it
        self.pidfds: dict[int, int] = {}  # pid -> a pidfd of the rank (signals reach it, never a reused pid)
        self.gone = False  # the helper died (or the launcher closed it): no exit status comes any more

    def spawn(self, argv: list[str], env: Mapping[str, str], cwd: str, stdout: int, stderr: int,
              fd_env: Mapping[str, int] | None = None) -> ForkedProcess:
        """A rank: `argv` is [script, *args]; `fd_env` names further pipes by the variable that tells the
        rank their number (WCCL_STATUS_FD)."""
        names = ["stdout", "stderr", *(fd_env or {})]
        fds = [stdout, stderr, *(fd_env or {}).values()]
        request = json.dumps({"argv": argv, "env": dict(env), "cwd": cwd, "fds": names}).encode()
        if self.gone:
            raise ForkServerError(f"the rank forker is gone (exit status {self.proc.poll()})")
        try:
            socket.send_fds(self.sock, [request], fds)
        except OSError as e:
            raise ForkServerError(f"the rank forker is gone ({e})") from None
        deadline = time.monotonic() + START_S
        while True:
            msg = self._read(max(0.0, deadline - time.monotonic()))
            if msg is None and self.gone:
                raise ForkServerError(f"the rank forker is gone (exit status {self.proc.wait()})")
            if msg is None:
                raise ForkServerError(f"the rank forker did not fork within {START_S:g} s")
            if "pid" in msg:
                return ForkedProcess(self, msg["pid"], argv)

    def collect(self, timeout: float) -> None:
        """Take in the exit statuses the helper has sent, waiting up to `timeout` s for the first."""
        msg = self._read(timeout)
        while msg is not None:
            msg = self._read(0.0)

    def _read(self, timeout: float) -> dict | None:
        """One message from the helper (filed on the way: a rank forked, a rank ended), or None if none came
        in time or the helper is gone. Ctrl-C waits while a message is taken in and filed, so none is lost."""
        if self.gone:
            return None
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return None
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 4096, 1)
            except OSError:
                data, fds = b"", []
            if not data:  # the helper died; its ranks got SIGTERM (PR_SET_PDEATHSIG): poll() watches their pidfds
                self.gone = True
                self.sock.close()
                return None
            msg = json.loads(data)
            if "pid" in msg:
                self.codes.pop(msg["pid"], None)
                self.pidfds[msg["pid"]] = fds[0]
            elif "exited" in msg:
                self.codes[msg["exited"]] = msg["code"]
            return msg
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def close(self) -> None:
        """End the helper (it stops any rank still running) and wait for it."""
        if not self.gone:
            self.gone = True
            self.sock.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in self.pidfds.values():
            os.close(fd)
        self.pidfds.clear()


class ForkedProcess:
    """A forked rank, as the launcher sees it: what `subprocess.Popen` offers, through its `RankForker`.
    Signals go through the rank's pidfd. If the helper dies first, a rank that has ended (its pidfd says so)
    has exit status 1: nobody learnt its own."""

    def __init__(self, forker: RankForker, pid: int, args: list[str]) -> None:
        self.forker, self.pid, self.args = forker, pid, args

    @property
    def returncode(self) -> int | None:
        return self.forker.codes.get(self.pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.forker.collect(0.0)
        if self.returncode is None and self.forker.gone and self._ended(0.0):
            self.forker.codes[self.pid] = 1
        return self.returncode

    def _ended(self, timeout: float) -> bool:
        fd = self.forker.pidfds.get(self.pid)
        return fd is None or bool(select.select([fd], [], [], timeout)[0])

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            if self.forker.gone:
                self._ended(min(left, 1.0))
            else:
                self.forker.collect(min(left, 1.0))
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        fd = self.forker.pidfds.get(self.pid)
        if self.poll() is None and fd is not None:
            try:
                signal.pidfd_send_signal(fd, sig)
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
            with contextlib.suppress(OSError):  # (the launcher gone: the loop sees the socket closed)
                sock.send(json.dumps({"exited": pid, "code": os.waitstatus_to_exitcode(status)}).encode())

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
        pidfd = os.pidfd_open(pid)  # (before this helper can reap it: the pidfd is of this very process)
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):  # (the launcher gone: the loop sees the socket closed)
            socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [pidfd])
        os.close(pidfd)
    for pid in children:  # the launcher is gone: so are its ranks
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    while children:
        pid, _ = os.waitpid(-1, 0)
        children.discard(pid)
    return None


def _become(request: dict, fds: list[int]) -> str:
    """This forked child takes the rank's pipes, environment, folder, argv and seeds; returns the script's
    absolute path."""
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
    # stdout as a new process has it (a pipe: block-buffered unless PYTHONUNBUFFERED; the encoding and error
    # handler Python chose for this helper, started with the same environment); stderr line-buffered
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    out, err = sys.__stdout__, sys.__stderr__
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.open(1, "wb", closefd=False, buffering=0 if unbuffered else -1),
                                                   encoding=out.encoding, errors=out.errors, write_through=unbuffered)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.open(2, "wb", closefd=False, buffering=0),
                                                   encoding=err.encoding, errors=err.errors,
                                                   line_buffering=True, write_through=True)
    script = os.path.abspath(request["argv"][0])
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(script)
    # Seeds a new process draws for itself (Python's `random` reseeds at fork on its own; the hash seed of
    # str and bytes cannot change after start-up and stays the helper's, as PYTHONHASHSEED would make it).
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    if "multiprocessing" in sys.modules:
        sys.modules["multiprocessing"].current_process().authkey = os.urandom(32)
    return script


def main(argv: list[str]) -> int:
    """`python -m wccl.runtime.forkserver FD LAUNCHER_PID`: serve the launcher on socket FD."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the ranks' and the launcher's to answer
    end_with_parent()
    if os.getppid() != int(argv[1]):
        return 1  # the launcher died before this helper could ask to end with it
    sock = socket.socket(fileno=int(argv[0]))
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as e:  # a rank that needs it imports it itself, and fails with its own error
            print(f"wccl.runtime.forkserver: {name} not preloaded ({type(e).__name__}: {e})", file=sys.stderr)
    child = _serve(sock)
    if child is None:
        return 0
    script = _become(*child)
    import runpy

    try:
        runpy.run_path(script, run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:  # as `python script.py` shows it: the script's frames, through its excepthook
        tb = e.__traceback__
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
            tb = tb.tb_next
        if tb is not None:
            e.__traceback__ = tb  # (the hook shows the exception's own traceback)
        sys.excepthook(type(e), e, e.__traceback__)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
