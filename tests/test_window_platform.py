"""Windows and the platform: the main-thread rule (macOS), the window helper process, the hidden cursor,
the refresh rate, and the presentation-time statistics.

The per-platform branches run here on Linux with fakes (sys.platform monkeypatched, fake ctypes libraries
and programs); the window helper process runs for real under Xvfb.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import shutil
import subprocess
import sys
import threading
import time
import types
from typing import ClassVar

import numpy as np
import pytest
from conftest import make_config, needs_tools

from wccl.media import display as display_mod
from wccl.media import hardware, window_process
from wccl.media import window as window_mod


def _events(buf) -> list[dict]:
    out = []
    for line in buf.getvalue().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _in_thread(fn):
    """Run fn() on a new (non-main) thread; return its result or raise its exception."""
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 (re-raised on the caller's thread)
            box["error"] = e

    t = threading.Thread(target=run, name="rank-worker")
    t.start()
    t.join(60)
    assert not t.is_alive()
    if "error" in box:
        raise box["error"]
    return box["result"]


# ----------------------------------------------------------------------------------- fakes
class FakeCv2(types.ModuleType):
    """Just enough of cv2's highgui for WindowScreen; records the thread each window was opened on."""

    WINDOW_NORMAL, WINDOW_KEEPRATIO, WINDOW_GUI_NORMAL = 0, 0, 0
    WND_PROP_FULLSCREEN, WINDOW_FULLSCREEN, WND_PROP_VISIBLE = 0, 1, 4

    class error(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("cv2")
        self.opened_on: list[threading.Thread] = []
        self.shown = 0

    def namedWindow(self, title, flags):
        self.opened_on.append(threading.current_thread())

    def imshow(self, title, image):
        self.shown += 1

    def waitKey(self, ms):
        return -1

    pollKey = lambda self: -1
    getWindowProperty = lambda self, title, prop: 1.0
    getWindowImageRect = lambda self, title: (0, 0, 0, 0)
    moveWindow = resizeWindow = setWindowProperty = destroyWindow = lambda self, *a: None


class FakeProcessWindow:
    """Stands in for ProcessWindowScreen: records the thread it was made on."""

    made: ClassVar[list[threading.Thread]] = []

    def __init__(self, clock, title, width, height, **kw) -> None:
        FakeProcessWindow.made.append(threading.current_thread())
        self.title = title

    def close(self) -> None:
        pass


class FakeFn:
    """A ctypes function stand-in: takes argtypes/restype, records calls, answers with `result(*args)`."""

    def __init__(self, log: list, name: str, result) -> None:
        self.log, self.name, self.result = log, name, result

    def __call__(self, *args):
        self.log.append((self.name, args))
        return self.result(*args) if callable(self.result) else self.result


class FakeLib:
    def __init__(self, **results) -> None:
        self.calls: list = []
        self._results = results

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        fn = FakeFn(self.calls, name, self._results.get(name, 0))
        setattr(self, name, fn)
        return fn

    def called(self, name) -> list:
        return [args for n, args in self.calls if n == name]


def _medium(on_quit=None):
    return types.SimpleNamespace(request_stop=on_quit or (lambda: None), windows=[])


# ------------------------------------------------------------------------- the main-thread rule
def test_window_process_rule(monkeypatch):
    monkeypatch.delenv("WCCL_WINDOW_PROCESS", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    assert not hardware.use_window_process()
    assert not _in_thread(hardware.use_window_process)  # Linux: a worker thread may open a window
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not hardware.use_window_process()  # the main thread may
    assert _in_thread(hardware.use_window_process)  # a worker thread may not
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("WCCL_WINDOW_PROCESS", "1")
    assert hardware.use_window_process()


def test_window_screen_refuses_to_open_off_the_main_thread_on_macos(monkeypatch):
    cv2 = FakeCv2()
    monkeypatch.setitem(sys.modules, "cv2", cv2)
    monkeypatch.setattr(sys, "platform", "darwin")

    def make():
        async def go():
            return window_mod.WindowScreen(object(), "wccl t", 64, 48)
        return asyncio.run(go())

    with pytest.raises(RuntimeError, match="main thread on macOS"):
        _in_thread(make)
    assert cv2.opened_on == []  # refused before highgui was touched


def test_on_macos_a_window_is_only_ever_opened_on_the_main_thread(monkeypatch):
    """window_screen from a rank's worker thread gives the process window; from the main thread, WindowScreen,
    whose window opens there. No window is opened off the main thread either way."""
    cv2 = FakeCv2()
    monkeypatch.setitem(sys.modules, "cv2", cv2)
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.delenv("WCCL_WINDOW_PROCESS", raising=False)
    monkeypatch.setattr(window_process, "ProcessWindowScreen", FakeProcessWindow)
    monkeypatch.setattr(display_mod, "_load", lambda name: None)  # no CoreGraphics here
    FakeProcessWindow.made.clear()
    cfg = make_config()
    node = cfg.room.nodes[0].name
    from wccl.runtime.timebase import NodeClock

    def from_worker():
        async def go():
            return hardware.window_screen(medium=_medium(), node=node, clock=NodeClock(), config=cfg)
        return asyncio.run(go())

    screen = _in_thread(from_worker)
    assert isinstance(screen, FakeProcessWindow)
    assert [t.name for t in FakeProcessWindow.made] == ["rank-worker"]
    assert cv2.opened_on == []

    async def from_main():
        s = hardware.window_screen(medium=_medium(), node=node, clock=NodeClock(), config=cfg)
        s.close()
        return s

    screen = asyncio.run(from_main())
    assert isinstance(screen, window_mod.WindowScreen)
    assert cv2.opened_on and all(t is threading.main_thread() for t in cv2.opened_on)
    assert cv2.shown >= 1


# --------------------------------------------------------------------------------- the cursor
class _Log:
    def __init__(self) -> None:
        self.events: list = []

    def info(self, event, **kw):
        self.events.append((event, kw))

    warning = info


def test_cursor_x11_xfixes(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")

    def query_version(dpy, major, minor):
        major._obj.value = 6
        return 1

    x11 = FakeLib(XOpenDisplay=0xD15, XDefaultRootWindow=0x1A, XQueryExtension=1)
    xfixes = FakeLib(XFixesQueryVersion=query_version)
    monkeypatch.setattr(display_mod, "_libx11", lambda: x11)
    monkeypatch.setattr(display_mod, "_load", lambda name: xfixes if name == "Xfixes" else None)
    monkeypatch.setattr(shutil, "which", lambda exe: pytest.fail("xdotool asked although XFixes worked"))
    log = _Log()
    hider = window_mod.CursorHider(":5", (0, 0, 800, 600), log)
    assert hider.hide() == "xfixes"
    assert x11.called("XOpenDisplay") == [(b":5",)]
    assert xfixes.called("XFixesHideCursor") == [(0xD15, 0x1A)]
    assert log.events == [("cursor_hidden", {"method": "xfixes"})]
    assert x11.called("XCloseDisplay") == []  # the connection stays open: the cursor stays hidden
    hider.restore()
    assert xfixes.called("XFixesShowCursor") == [(0xD15, 0x1A)] and x11.called("XCloseDisplay") == [(0xD15,)]


def test_cursor_x11_without_the_extension_warps_the_pointer_with_xdotool(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    x11 = FakeLib(XOpenDisplay=0xD15, XQueryExtension=0)  # the server has no XFIXES
    monkeypatch.setattr(display_mod, "_libx11", lambda: x11)
    monkeypatch.setattr(display_mod, "_load", lambda name: FakeLib())
    monkeypatch.setattr(shutil, "which", lambda exe: "/usr/bin/xdotool" if exe == "xdotool" else None)
    runs = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: runs.append((cmd, kw["env"]["DISPLAY"]))
                        or subprocess.CompletedProcess(cmd, 0))
    log = _Log()
    hider = window_mod.CursorHider(":5", (1920, 0, 1280, 720), log)
    assert hider.hide() == "xdotool_corner"
    assert x11.called("XCloseDisplay") == [(0xD15,)]  # the probe's connection was closed
    assert runs == [(["/usr/bin/xdotool", "mousemove", "3199", "719"], ":5")]  # the monitor's far corner
    assert log.events == [("cursor_hidden", {"method": "xdotool_corner"})]


def test_cursor_x11_with_nothing_available_is_logged_with_a_hint(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(display_mod, "_libx11", lambda: None)
    monkeypatch.setattr(display_mod, "_load", lambda name: None)
    monkeypatch.setattr(shutil, "which", lambda exe: None)
    log = _Log()
    assert window_mod.CursorHider(":5", (0, 0, 800, 600), log).hide() is None
    [(event, kw)] = log.events
    assert event == "cursor_not_hidden" and "xdotool" in kw["hint"]


def test_cursor_windows_user32(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    user32 = FakeLib(ShowCursor=-1)
    monkeypatch.setattr(display_mod, "_load", lambda name: user32 if name == "user32" else None)
    hider = window_mod.CursorHider(None, None, _Log())
    assert hider.hide() == "user32_showcursor"
    assert user32.called("ShowCursor") == [(0,)]
    hider.restore()
    assert user32.called("ShowCursor") == [(0,), (1,)]


@pytest.mark.parametrize("cg_error", [0, 1001])
def test_cursor_macos_coregraphics(monkeypatch, cg_error):
    monkeypatch.setattr(sys, "platform", "darwin")
    cg = FakeLib(CGMainDisplayID=7, CGDisplayHideCursor=cg_error)
    monkeypatch.setattr(display_mod, "_load", lambda name: cg if name == display_mod.COREGRAPHICS else None)
    log = _Log()
    hider = window_mod.CursorHider(None, None, log)
    assert cg.called("CGDisplayHideCursor") == []
    if cg_error:
        assert hider.hide() is None and log.events[0][0] == "cursor_not_hidden"
    else:
        assert hider.hide() == "coregraphics"
        assert cg.called("CGDisplayHideCursor") == [(7,)]
        hider.restore()
        assert cg.called("CGDisplayShowCursor") == [(7,)]


# ---------------------------------------------------------------------------- the refresh rate
XRANDR = """\
Screen 0: minimum 320 x 200, current 3840 x 1080, maximum 16384 x 16384
eDP-1 connected primary 1920x1080+0+0 (normal left inverted right x axis y axis) 344mm x 194mm
   1920x1080     60.01 +  59.97    59.96    47.98
   1680x1050     59.95    59.88
HDMI-1 connected 1920x1080+1920+0 (normal left inverted right x axis y axis) 527mm x 296mm
   1920x1080     60.00 +  143.98*   119.88    50.00
   1280x720      60.00    50.00
DP-1 disconnected (normal left inverted right x axis y axis)
"""


def test_xrandr_rate_is_the_starred_mode():
    assert display_mod.parse_xrandr_rate(XRANDR) == 143.98
    assert display_mod.parse_xrandr_rate("   1920x1080     60.00*+  50.00\n") == 60.0
    assert display_mod.parse_xrandr_rate("   800x600        0.00* \n") is None  # Xvfb: no refresh
    assert display_mod.parse_xrandr_rate(XRANDR.replace("*", "")) is None


def test_refresh_hz_linux_asks_xrandr_on_the_display(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(shutil, "which", lambda exe: "/usr/bin/xrandr")
    runs = []

    def run(cmd, **kw):
        runs.append((cmd, kw["env"].get("DISPLAY")))
        return subprocess.CompletedProcess(cmd, 0, XRANDR, "")

    monkeypatch.setattr(subprocess, "run", run)
    assert display_mod.refresh_hz(":7") == 143.98
    assert runs == [(["xrandr", "--current"], ":7")]


@pytest.mark.parametrize(("hz", "want"), [(144, 144.0), (1, None)])
def test_refresh_hz_windows(monkeypatch, hz, want):
    assert ctypes.sizeof(display_mod._DEVMODEW) == 220  # Win32's DEVMODEW, field for field
    assert display_mod._DEVMODEW.dmDisplayFrequency.offset == 184
    monkeypatch.setattr(sys, "platform", "win32")

    def enum(device, mode_num, devmode):
        mode = devmode._obj
        assert device is None and mode_num == -1 and mode.dmSize == 220
        mode.dmDisplayFrequency = hz
        return 1

    user32 = FakeLib(EnumDisplaySettingsW=enum)
    monkeypatch.setattr(display_mod, "_load", lambda name: user32 if name == "user32" else None)
    assert display_mod.refresh_hz() == want


@pytest.mark.parametrize(("rate", "want"), [(120.0, 120.0), (0.0, 60.0)])  # 0: a built-in panel, 60 Hz
def test_refresh_hz_macos(monkeypatch, rate, want):
    monkeypatch.setattr(sys, "platform", "darwin")
    cg = FakeLib(CGMainDisplayID=3, CGDisplayCopyDisplayMode=0xBEEF, CGDisplayModeGetRefreshRate=rate)
    monkeypatch.setattr(display_mod, "_load", lambda name: cg if name == display_mod.COREGRAPHICS else None)
    assert display_mod.refresh_hz() == want
    assert cg.called("CGDisplayCopyDisplayMode") == [(3,)]
    assert cg.called("CGDisplayModeRelease") == [(0xBEEF,)]


def test_refresh_hz_unknown_without_the_library(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(display_mod, "_load", lambda name: None)
    assert display_mod.refresh_hz() is None


# -------------------------------------------------------------------------- presentation times
def test_show_stats_jitter_and_phase_locking():
    period = 1 / 60
    locked = [100.0 + k * 3 * period + 0.003 for k in range(100)]  # every frame at the same phase
    stats = window_mod.show_stats([0.004] * 99 + [0.020], locked, 60.0)
    assert stats["shows"] == 100
    assert stats["show_jitter_ms"]["p50"] == pytest.approx(4.0) and stats["show_jitter_ms"]["max"] == pytest.approx(20)
    assert stats["refresh_phase_locking"] > 0.99
    spread = np.random.default_rng(1).uniform(0, 100, 2000)  # phases all over the refresh period
    assert window_mod.show_stats([0.001] * 2000, list(spread), 60.0)["refresh_phase_locking"] < 0.1
    assert "refresh_phase_locking" not in window_mod.show_stats([0.001] * 5, locked[:5], 60.0)  # too few
    assert "refresh_phase_locking" not in window_mod.show_stats([0.001] * 100, locked, None)  # rate unknown


# ------------------------------------------------------------------- the window helper, under Xvfb
def _solid(w, h, bgr):
    image = np.zeros((h, w, 3), np.uint8)
    image[:] = bgr
    return image


@needs_tools("Xvfb", "xdotool")
def test_process_window_from_a_worker_thread_shows_frames_and_hears_escape(monkeypatch, _quiet_logs):
    from wccl.media.display import read_pixels
    from wccl.media.xvfb import VirtualDisplay
    from wccl.runtime.timebase import NodeClock

    cfg = make_config()
    node = cfg.room.nodes[0].name
    w, h = cfg.screen.width, cfg.screen.height
    colours = [(0, 200, 60), (180, 30, 200), (250, 250, 10)]
    with VirtualDisplay(w, h) as d:
        monkeypatch.setenv("DISPLAY", d.name)
        monkeypatch.setenv("WCCL_WINDOW_PROCESS", "1")
        centre = [(w // 2 + dx, h // 2 + dy) for dx in (-40, 0, 40) for dy in (-30, 0, 30)]

        def rank():
            async def go():
                clock = NodeClock()
                quit_ = asyncio.Event()
                medium = _medium(quit_.set)
                screen = hardware.window_screen(medium=medium, node=node, clock=clock, config=cfg)
                assert isinstance(screen, window_process.ProcessWindowScreen) and medium.windows == [screen]
                seen, times = [], []
                for bgr in colours:
                    image = _solid(w, h, bgr)
                    for _ in range(3):
                        before = clock.now()
                        t = screen.show(image)
                        times.append((before, t, clock.now()))
                        await asyncio.sleep(0.03)
                    deadline = time.monotonic() + 5
                    while (px := read_pixels(d.name, centre)) != [bgr] * len(centre) and time.monotonic() < deadline:
                        screen.show(image)
                        await asyncio.sleep(0.05)
                    seen.append(px)
                for _ in range(20):  # a key sent while the window is still taking focus can be lost
                    await asyncio.to_thread(subprocess.run, ["xdotool", "search", "--name", screen.title,
                                            "windowfocus", "--sync", "key", "Escape"], check=False, env=d.env(),
                                            capture_output=True, timeout=10)
                    try:
                        await asyncio.wait_for(quit_.wait(), 1.0)
                        break
                    except TimeoutError:
                        continue
                quit_seen = quit_.is_set()
                screen.close()
                return screen, seen, times, quit_seen

            return asyncio.run(go())

        screen, seen, times, quit_seen = _in_thread(rank)
    assert seen == [[c] * len(centre) for c in colours]  # each frame really went up, fullscreen
    for before, t, after in times:
        assert t is not None and before - 0.001 <= t <= after + 0.001  # presented between call and return
    assert quit_seen and screen.quit_requested  # Esc in the helper's window reached the node's on_quit
    assert screen._proc.returncode == 0  # closed cleanly
    assert screen.stats()["shows"] >= 9
    events = _events(_quiet_logs)
    names = [e["event"] for e in events]
    for want in ("window_opened", "window_process_started", "quit_requested", "window_closed"):
        assert want in names, names
    opened = next(e for e in events if e["event"] == "window_opened")
    assert opened["node"] == node and opened["fullscreen"] is True and "refresh_hz" in opened
    assert "cursor_hidden" in names or "cursor_not_hidden" in names
    assert "window_process_died" not in names


@needs_tools("Xvfb")
def test_window_helper_ends_when_the_node_goes_and_the_node_hears_of_a_dead_helper(monkeypatch, _quiet_logs):
    from wccl.media.xvfb import VirtualDisplay
    from wccl.runtime.timebase import NodeClock

    with VirtualDisplay(640, 480) as d:
        async def go():
            quit_ = asyncio.Event()
            screen = window_process.ProcessWindowScreen(NodeClock(), "wccl orphan", 320, 200, fullscreen=False,
                                                        x=10, y=10, on_quit=quit_.set, display=d.name, node="n")
            assert screen.show(_solid(320, 200, (9, 9, 9))) is not None
            screen._proc.stdin.close()  # what the helper sees when the node's process ends
            code = await asyncio.to_thread(screen._proc.wait, 10)
            await asyncio.wait_for(quit_.wait(), 5)  # a helper gone on its own: the window counts as closed
            shown = screen.show(_solid(320, 200, (9, 9, 9)))
            screen.close()
            return code, shown

        code, shown = asyncio.run(go())
    assert code == 0 and shown is None
    names = [e["event"] for e in _events(_quiet_logs)]
    assert "window_process_died" in names and "window_closed" in names


def test_process_window_reports_no_display_before_starting_a_helper():
    from wccl.media.display import NoDisplay
    from wccl.runtime.timebase import NodeClock

    if not sys.platform.startswith("linux"):
        pytest.skip("the X display probe is for Linux")

    async def go():
        window_process.ProcessWindowScreen(NodeClock(), "never", 320, 200, display=":20095")

    with pytest.raises(NoDisplay, match=":20095"):
        asyncio.run(go())
