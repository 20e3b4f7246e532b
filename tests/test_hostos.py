"""wccl.runtime.hostos: Ctrl-C on loops without add_signal_handler, and keeping the laptop awake on each OS (with fakes)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from wccl.runtime.hostos import (
    ES_CONTINUOUS,
    ES_DISPLAY_REQUIRED,
    ES_SYSTEM_REQUIRED,
    STOP_SIGNALS,
    KeepAwake,
    _while_alive,
    stop_on_signals,
)

PID = 4242


# ------------------------------------------------------------------------------------------- signals
class NoSignalHandlersLoop:
    """A loop like Windows' asyncio loops: add_signal_handler raises NotImplementedError."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def add_signal_handler(self, sig, callback, *args):
        raise NotImplementedError

    def remove_signal_handler(self, sig):
        raise AssertionError("nothing was added")

    def call_soon_threadsafe(self, callback, *args):
        return self.loop.call_soon_threadsafe(callback, *args)


class RecordingLoop:
    """A loop with add_signal_handler for some signals only (the others raise NotImplementedError)."""

    def __init__(self, supported) -> None:
        self.supported = set(supported)
        self.handlers: dict[int, object] = {}
        self.removed: list[int] = []

    def add_signal_handler(self, sig, callback, *args):
        if sig not in self.supported:
            raise NotImplementedError
        self.handlers[sig] = callback

    def remove_signal_handler(self, sig):
        self.removed.append(sig)
        return self.handlers.pop(sig, None) is not None

    def call_soon_threadsafe(self, callback, *args):
        callback(*args)


@pytest.fixture
def saved_handlers():
    saved = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    yield saved
    for s, h in saved.items():
        signal.signal(s, h if h is not None else signal.SIG_DFL)


def test_a_real_sigint_sets_the_stop_event_on_a_loop_without_signal_handlers(saved_handlers):
    async def go():
        stop = asyncio.Event()
        with stop_on_signals(NoSignalHandlersLoop(asyncio.get_running_loop()), stop.set):
            assert signal.getsignal(signal.SIGINT) is not saved_handlers[signal.SIGINT]
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.wait_for(stop.wait(), 5)
        return stop.is_set()

    assert asyncio.run(go())
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == saved_handlers


def test_the_fallback_covers_every_stop_signal_and_restores_the_previous_handlers(saved_handlers):
    calls = []
    loop = RecordingLoop(supported=())
    with stop_on_signals(loop, lambda: calls.append("stop")):
        for s in STOP_SIGNALS:
            handler = signal.getsignal(s)
            assert callable(handler) and handler is not saved_handlers[s]
            handler(s, None)
    assert calls == ["stop"] * len(STOP_SIGNALS)
    assert signal.SIGINT in STOP_SIGNALS and signal.SIGTERM in STOP_SIGNALS
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == saved_handlers
    assert loop.removed == []


def test_loops_with_signal_handlers_use_them_and_remove_them():
    def stop():
        pass

    loop = RecordingLoop(supported=STOP_SIGNALS)
    before = signal.getsignal(signal.SIGINT)
    with stop_on_signals(loop, stop):
        assert loop.handlers == {s: stop for s in STOP_SIGNALS}
        assert signal.getsignal(signal.SIGINT) is before
    assert loop.handlers == {} and sorted(loop.removed) == sorted(STOP_SIGNALS)


def test_a_loop_that_takes_some_signals_only_falls_back_for_all(saved_handlers):
    loop = RecordingLoop(supported=(signal.SIGINT,))
    with stop_on_signals(loop, lambda: None, signals=(signal.SIGINT, signal.SIGTERM)):
        assert loop.handlers == {} and loop.removed == [signal.SIGINT]
        assert signal.getsignal(signal.SIGTERM) is not saved_handlers[signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is saved_handlers[signal.SIGTERM]


# ---------------------------------------------------------------------------------------- keep awake
class FakeProc:
    def __init__(self, argv, returncode):
        self.argv = argv
        self.pid = 9000
        self.returncode = returncode  # None: it keeps running
        self.terminated = False

    def wait(self, timeout=None):
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.argv, timeout)
        return self.returncode

    def terminate(self):
        self.terminated = True
        self.returncode = -signal.SIGTERM

    def kill(self):
        raise AssertionError("a terminated fake ends at once")


class FakePopen:
    """Starts fake processes; `exits` maps argv[0] to the status it exits with at once (absent: it runs)."""

    def __init__(self, exits=None):
        self.exits = exits or {}
        self.started: list[FakeProc] = []
        self.kwargs: list[dict] = []

    def __call__(self, argv, **kwargs):
        proc = FakeProc(argv, self.exits.get(argv[0]))
        self.started.append(proc)
        self.kwargs.append(kwargs)
        return proc


class Installed:
    def __init__(self, *programs):
        self.programs = programs

    def __call__(self, name):
        return f"/usr/bin/{name}" if name in self.programs else None


class RecordingLog:
    def __init__(self):
        self.events: list[tuple[str, str, dict]] = []

    def info(self, event, **kw):
        self.events.append(("info", event, kw))

    def warning(self, event, **kw):
        self.events.append(("warning", event, kw))

    def names(self):
        return [e[1] for e in self.events]


class FakeKernel32:
    def __init__(self, result=1):
        self.result = result
        self.calls: list[int] = []

    def SetThreadExecutionState(self, flags):  # the Windows name
        self.calls.append(flags)
        return self.result


class FakeWindll:
    def __init__(self, kernel32):
        self.kernel32 = kernel32


def keep_awake(platform, which=None, popen=None, windll=None):
    log = RecordingLog()
    awake = KeepAwake(platform=platform, which=which or Installed(), popen=popen or FakePopen(), pid=PID, log=log,
                      windll=windll or (lambda: (_ for _ in ()).throw(AttributeError("no windll here"))))
    return awake, log


def test_macos_runs_caffeinate_on_this_pid_and_stops_it_on_close():
    popen = FakePopen()
    awake, log = keep_awake("darwin", Installed("caffeinate", "systemd-inhibit"), popen)
    awake.start()
    (proc,) = popen.started
    assert proc.argv == ["caffeinate", "-dimsu", "-w", str(PID)]
    assert popen.kwargs[0]["stdout"] == subprocess.DEVNULL and popen.kwargs[0]["stderr"] == subprocess.DEVNULL
    assert log.events == [("info", "keep_awake", {"method": "caffeinate", "pid": 9000})]
    assert awake.method == "caffeinate" and not proc.terminated
    awake.close()
    assert proc.terminated and awake.method is None
    awake.close()  # idempotent
    assert len(popen.started) == 1 and log.names() == ["keep_awake"]


def test_macos_without_caffeinate_says_what_to_do():
    popen = FakePopen()
    awake, log = keep_awake("darwin", Installed(), popen)
    awake.start()
    assert popen.started == [] and awake.method is None
    ((level, event, kw),) = log.events
    assert (level, event) == ("warning", "keep_awake_unavailable") and "sleep" in kw["hint"]
    awake.close()


def test_windows_sets_the_thread_execution_state_and_resets_it_on_close():
    kernel32 = FakeKernel32()
    popen = FakePopen()
    awake, log = keep_awake("win32", Installed("caffeinate", "systemd-inhibit"), popen, lambda: FakeWindll(kernel32))
    awake.start()
    assert kernel32.calls == [0x80000003] == [ES_CONTINUOUS | ES_SYSTEM_REQUIRED | ES_DISPLAY_REQUIRED]
    assert log.events == [("info", "keep_awake", {"method": "SetThreadExecutionState"})]
    awake.close()
    awake.close()
    assert kernel32.calls == [0x80000003, 0x80000000] and popen.started == []


def test_windows_when_the_call_fails_says_what_to_do():
    kernel32 = FakeKernel32(result=0)
    awake, log = keep_awake("win32", windll=lambda: FakeWindll(kernel32))
    awake.start()
    awake.close()
    assert kernel32.calls == [0x80000003]  # nothing to reset
    assert log.names() == ["keep_awake_failed", "keep_awake_unavailable"]


def test_linux_holds_a_systemd_inhibit_lock_while_this_pid_lives():
    popen = FakePopen()
    awake, log = keep_awake("linux", Installed("systemd-inhibit", "dbus-send"), popen)
    awake.start()
    (proc,) = popen.started
    assert proc.argv[:5] == ["systemd-inhibit", "--what=idle:sleep", "--who=wccl", proc.argv[3], "--mode=block"]
    assert proc.argv[3].startswith("--why=") and len(proc.argv[3]) > len("--why=")
    assert proc.argv[5:7] == ["sh", "-c"] and f"kill -0 {PID}" in proc.argv[7]
    assert log.events == [("info", "keep_awake", {"method": "systemd-inhibit", "pid": 9000})]
    awake.close()
    assert proc.terminated


def test_linux_falls_back_to_the_screensaver_over_dbus_when_systemd_inhibit_fails():
    popen = FakePopen(exits={"systemd-inhibit": 1})  # e.g. no logind to talk to
    awake, log = keep_awake("linux", Installed("systemd-inhibit", "dbus-send"), popen)
    awake.start()
    first, second = popen.started
    assert first.argv[0] == "systemd-inhibit"
    assert second.argv[:2] == ["sh", "-c"]
    assert f"kill -0 {PID}" in second.argv[2] and "dbus-send --session" in second.argv[2]
    assert "org.freedesktop.ScreenSaver.SimulateUserActivity" in second.argv[2]
    assert log.names() == ["keep_awake_failed", "keep_awake"]
    assert log.events[0][2] == {"method": "systemd-inhibit", "returncode": 1}
    assert log.events[1][2]["method"] == "dbus-send" and awake.method == "dbus-send"
    awake.close()
    assert second.terminated and not first.terminated


def test_linux_without_systemd_inhibit_goes_to_dbus_directly():
    popen = FakePopen()
    awake, log = keep_awake("linux", Installed("dbus-send"), popen)
    awake.start()
    assert [p.argv[0] for p in popen.started] == ["sh"] and log.names() == ["keep_awake"]
    awake.close()


def test_linux_with_nothing_that_works_says_what_to_do():
    popen = FakePopen(exits={"systemd-inhibit": 1, "sh": 1})
    awake, log = keep_awake("linux", Installed("systemd-inhibit", "dbus-send"), popen)
    awake.start()
    assert log.names() == ["keep_awake_failed", "keep_awake_failed", "keep_awake_unavailable"]
    awake.close()

    popen = FakePopen()
    awake, log = keep_awake("linux", Installed(), popen)
    awake.start()
    assert popen.started == [] and log.names() == ["keep_awake_unavailable"]
    assert "screensaver" in log.events[0][2]["hint"]


def test_the_watch_loop_ends_with_the_process_it_watches():
    """The shell loops the helpers run: they go on while the pid lives and stop when it is gone (real `sh`)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert subprocess.run(["sh", "-c", _while_alive(gone.pid)], timeout=5, check=False).returncode == 0
    assert subprocess.run(["sh", "-c", _while_alive(os.getpid(), "false")], timeout=5, check=False).returncode == 1
    for body in ("", "true"):
        alive = subprocess.Popen(["sh", "-c", _while_alive(os.getpid(), body)])
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                alive.wait(timeout=0.3)
        finally:
            alive.terminate()
            alive.wait()


def test_the_hardware_medium_keeps_the_laptop_awake_while_it_is_open():
    from conftest import make_config

    from wccl.media.hardware import HardwareMedium

    cfg = make_config(room={"medium": "hardware", "clock": "realtime",
                            "nodes": [{"name": "alice", "roles": ["server", "worker"], "camera": "webcam",
                                       "screen": "recording"},
                                      {"name": "bob", "roles": ["worker"], "camera": "webcam",
                                       "screen": "recording"}]})
    popen = FakePopen()
    awake, _ = keep_awake("darwin", Installed("caffeinate"), popen)
    medium = HardwareMedium(cfg, keep_awake=awake)
    (proc,) = popen.started
    assert awake.method == "caffeinate" and not proc.terminated
    medium.close()
    assert proc.terminated and awake.method is None


@pytest.mark.skipif(sys.platform != "linux", reason="the real default on Linux")
def test_the_defaults_are_the_real_ones():
    awake = KeepAwake()
    assert awake.platform == sys.platform and awake.pid == os.getpid()
    assert awake.popen is subprocess.Popen


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_started_to_end_with_its_parent_ends_when_the_parent_is_killed(tmp_path):
    # The parent starts a child that would sleep a minute, writes its pid, and waits; killing the parent
    # (SIGKILL: nothing of it runs) must end the child too.
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time\n"
        "from wccl.runtime.hostos import end_with_parent\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], preexec_fn=end_with_parent)\n"
        f"open({str(pid_file)!r}, 'w').write(str(c.pid))\n"
        "time.sleep(60)\n")], cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        time.sleep(0.05)
    child = int(pid_file.read_text())
    parent.kill()
    parent.wait()
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if open(f"/proc/{child}/stat").read().split()[2] == "Z":  # (ended, not yet reaped by init)
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived its parent")
