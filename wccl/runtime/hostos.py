"""What differs between Linux, macOS and Windows: stopping on Ctrl-C, and keeping the laptop awake.

`stop_on_signals(loop, stop)`: while inside, SIGINT and SIGTERM (and Ctrl-Break
on Windows) call `stop` on the loop's thread. It uses `loop.add_signal_handler`
where the loop has it (Unix) and plain `signal.signal` handlers that hand the
call to the loop with `call_soon_threadsafe` where it raises
NotImplementedError (Windows); the previous handlers come back on exit.

`KeepAwake`: while started, the laptop neither sleeps nor blanks its screen
(a node on real devices must go on showing and filming for the whole run).
macOS: a `caffeinate -dimsu -w <pid>` process. Windows: the calling thread's
`SetThreadExecutionState(ES_CONTINUOUS | ES_SYSTEM_REQUIRED |
ES_DISPLAY_REQUIRED)`, reset to ES_CONTINUOUS by `close()`. Linux: a
`systemd-inhibit --what=idle:sleep` lock; without one (no systemd-inhibit, or
it cannot reach logind), a process that pokes the screensaver over D-Bus
(`dbus-send ... SimulateUserActivity`) every 30 s; without either, it logs
`keep_awake_unavailable` with what to switch off by hand. The processes it
starts watch this process's pid and end with it, even if it is killed.

`end_with_parent`: a child process that ends when the process that started it
dies (Linux; for the tools that start launchers).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import structlog

ES_CONTINUOUS = 0x80000000
ES_SYSTEM_REQUIRED = 0x00000001
ES_DISPLAY_REQUIRED = 0x00000002

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGBREAK") if hasattr(signal, name))


@contextlib.contextmanager
def stop_on_signals(loop: Any, stop: Callable[[], None],
                    signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Inside, each of `signals` calls `stop()` on `loop`'s thread; on exit the previous handlers are back."""
    added: list[int] = []
    try:
        for s in signals:
            loop.add_signal_handler(s, stop)
            added.append(s)
    except NotImplementedError:
        for s in added:
            loop.remove_signal_handler(s)
        added = []
    if added:
        try:
            yield
        finally:
            for s in added:
                loop.remove_signal_handler(s)
        return

    def _handler(signum: int, frame: Any) -> None:
        loop.call_soon_threadsafe(stop)

    previous = {s: signal.signal(s, _handler) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)


WHY = "WCCL is training over screens and webcams"
HINT = ("switch off sleep, screen blanking and the screensaver by hand for the run "
        "(a laptop that sleeps or blanks its screen stops the room)")
STARTUP_S = 0.5  # a keep-awake process still running this long after its start is holding the lock
POKE_S = 30


def _while_alive(pid: int, body: str = "") -> str:
    """A shell loop that runs `body` every few seconds while process `pid` lives; if `body` fails, it exits with 1."""
    if body:
        return f"while kill -0 {pid} 2>/dev/null; do {body} >/dev/null 2>&1 || exit 1; sleep {POKE_S}; done"
    return f"while kill -0 {pid} 2>/dev/null; do sleep 5; done"


# libc's prctl, looked up here, in the parent: a forked child only calls it (no dynamic loading after fork)
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def end_with_parent() -> None:
    """For `subprocess.Popen(preexec_fn=...)`: on Linux the child is sent SIGTERM when the process that
    started it dies (`prctl(PR_SET_PDEATHSIG)`), so a killed tool does not leave a launcher and its ranks
    running; elsewhere nothing."""
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGTERM))  # 1: PR_SET_PDEATHSIG


def _windll() -> Any:
    return ctypes.windll  # type: ignore[attr-defined]  # Windows only


class KeepAwake:
    """Keeps this laptop from sleeping and blanking its screen between `start()` and `close()`.

    Its dependencies are arguments so that every platform's branch runs anywhere: `platform`
    (sys.platform), `which` (finds a program), `popen` (starts one, as subprocess.Popen),
    `windll` (returns ctypes.windll), `pid` (the process the helpers watch)."""

    def __init__(self, *, platform: str = sys.platform, which: Callable[[str], str | None] = shutil.which,
                 popen: Callable[..., Any] = subprocess.Popen, windll: Callable[[], Any] = _windll,
                 pid: int | None = None, log: Any = None) -> None:
        self.platform = platform
        self.which = which
        self.popen = popen
        self.windll = windll
        self.pid = os.getpid() if pid is None else pid
        self.log = log or structlog.get_logger("wccl")
        self.method: str | None = None  # what holds the laptop awake now, if anything
        self.proc: Any = None
        self._kernel32: Any = None

    def start(self) -> KeepAwake:
        if self.platform == "darwin":
            self._run("caffeinate", ["caffeinate", "-dimsu", "-w", str(self.pid)])
        elif self.platform == "win32":
            self._windows()
        elif self.platform.startswith("linux"):
            self._run("systemd-inhibit", ["systemd-inhibit", "--what=idle:sleep", "--who=wccl", f"--why={WHY}",
                                          "--mode=block", "sh", "-c", _while_alive(self.pid)]) or \
                self._run("dbus-send", ["sh", "-c", _while_alive(self.pid, (
                    "dbus-send --session --print-reply --dest=org.freedesktop.ScreenSaver /org/freedesktop/ScreenSaver "
                    "org.freedesktop.ScreenSaver.SimulateUserActivity"))])
        if self.method is None:
            self.log.warning("keep_awake_unavailable", platform=self.platform, hint=HINT)
        else:
            atexit.register(self.close)
        return self

    def _run(self, program: str, argv: list[str]) -> bool:
        """Start `argv` if `program` is installed; it holds the laptop awake if it is still running shortly after."""
        if self.which(program) is None:
            return False
        try:
            proc = self.popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError as e:
            self.log.info("keep_awake_failed", method=program, error=str(e))
            return False
        try:
            rc = proc.wait(timeout=STARTUP_S)
        except subprocess.TimeoutExpired:
            self.proc, self.method = proc, program
            self.log.info("keep_awake", method=program, pid=proc.pid)
            return True
        self.log.info("keep_awake_failed", method=program, returncode=rc)
        return False

    def _windows(self) -> None:
        try:
            kernel32 = self.windll().kernel32
            ok = kernel32.SetThreadExecutionState(ES_CONTINUOUS | ES_SYSTEM_REQUIRED | ES_DISPLAY_REQUIRED)
        except (AttributeError, OSError) as e:
            self.log.info("keep_awake_failed", method="SetThreadExecutionState", error=str(e))
            return
        if not ok:
            self.log.info("keep_awake_failed", method="SetThreadExecutionState", returncode=0)
            return
        self._kernel32, self.method = kernel32, "SetThreadExecutionState"
        self.log.info("keep_awake", method=self.method)

    def close(self) -> None:
        """Let the laptop sleep again (idempotent). On Windows, call it on the thread that called start()."""
        atexit.unregister(self.close)
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None
        if self._kernel32 is not None:
            self._kernel32.SetThreadExecutionState(ES_CONTINUOUS)
            self._kernel32 = None
        self.method = None
