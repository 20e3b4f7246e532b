"""A real screen: frames shown in an OpenCV window, fullscreen on a laptop or placed on a desktop.

Consumes: images (`show(image)`, H x W x 3 uint8 BGR, the screen's size) and
instruction lines (`set_overlay(lines)`, during start-up). Emits: light; and
from `show()` the node-clock time at which the frame was presented (after
`imshow` and one turn of the GUI's event loop returned), which the
ScreenWriter uses to measure and compensate the screen's lag. Esc (or closing
the window) calls `on_quit` once: the node stops cleanly.

Why OpenCV's highgui (opencv-python): it is already a dependency (the
reader uses OpenCV), it shows a numpy image with one call, and it does
fullscreen and window placement on Linux (Qt), macOS (Cocoa) and Windows
(Win32). Its limits, and what we do about them:
- Without a reachable X server its Qt backend aborts the process, so the
  display is probed first (wccl.media.display) and a missing one raises
  NoDisplay: a message and exit status 3, never an abort.
- It has no vsync or presentation feedback: `show()` returns when the frame
  has been handed to the window system. A compositor may add a refresh or
  two (8-33 ms) that we cannot see; the clock sync measures the whole path
  end to end anyway (the frames' timestamps against the captures').
  Frames are not timed to the refresh: the times `show()` returns carry no
  vblank phase to predict from (the frame goes up at a later refresh we
  never see), so sleeping to "align" would only add latency. What is
  measured instead: the display's refresh rate (`refresh_hz`, logged in
  `window_opened`), and in `window_closed` (and `stats()`) how long `show()`
  took (`show_jitter_ms` percentiles) and how locked the presentation times
  are to the refresh's phase (`refresh_phase_locking`, 0 spread evenly ..
  1 all at one phase; a backend that blocks on vsync would show near 1).
- On macOS (Cocoa) a window may only be opened on the process's main
  thread; anywhere else it aborts the process. WindowScreen raises
  RuntimeError instead, and wccl.media.hardware.window_screen gives a
  ProcessWindowScreen there (wccl.media.window_process: this same window,
  run by a helper process's main thread).
- On a loaded machine (seen under Xvfb) Qt sometimes maps a new window where
  asked but never paints into it. On X11 the window first shows a test grey
  and reads it back off the display (Xlib's XGetImage); a window that does
  not show it is closed and opened again (`window_not_painted`).
- Its event loop only runs inside `waitKey`/`pollKey`: `show()` turns it once,
  and a timer on the asyncio loop polls it every 50 ms between frames, so the
  window repaints and Esc is seen even while nothing new is shown.

Fullscreen, the mouse cursor is hidden (`CursorHider`: XFixes or, failing
that, a pointer warped to the monitor's corner with xdotool on X11;
user32.ShowCursor on Windows; CGDisplayHideCursor on macOS), logged as
`cursor_hidden` with the method, or `cursor_not_hidden` with a hint; it is
shown again when the window closes.

Fullscreen, frames are padded with black to the monitor's shape before the
window scales them up, so no toolkit-coloured bars appear beside the code
(a bright bar would pull a camera's exposure).

The instructions overlay is drawn in the black band above and below the
code's locator ring (the grid is centred on a black screen), a few pixels
clear of the ring and in a dim colour, so the reader's locator never merges
the text with the ring and no cell is covered. With too little room for
legible text it is left out (and logged once).
"""

from __future__ import annotations

import asyncio
import ctypes
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

import numpy as np
import structlog

from wccl.media import display as _display
from wccl.media.display import (
    DisplayInfo,
    monitor_at,
    probe_display,
    read_pixels,
    refresh_hz,
)

ESC = 27
POLL_S = 0.05
OVERLAY_COLOUR = (60, 120, 135)  # BGR: dim amber, far below the ring's white (the locator's threshold)
MIN_TEXT_PX = 9  # a band lower than this (plus gaps) gets no text
RING_GAP_PX = 6  # clear space between the text and the ring
PROBE_GREY = 24  # shown once at start and read back off the display: is the window really painted?
PAINT_TRIES = 8  # new windows tried (seen in CI: five were not always enough on the loaded machine)
PAINT_WAIT_S = 1.0  # the first try's wait for the test grey; each further try waits longer (up to 3 s)
SHOW_STATS = 4096  # the last this many show() calls are kept for the timing statistics
MIN_PHASE_SAMPLES = 20  # fewer presentations say nothing about their phase against the refresh


def require_main_thread(what: str = "an OpenCV window") -> None:
    """Raise RuntimeError on macOS off the process's main thread: Cocoa aborts the process when a window
    is opened anywhere else."""
    if sys.platform == "darwin" and threading.current_thread() is not threading.main_thread():
        raise RuntimeError(f"{what} must be opened on the process's main thread on macOS (Cocoa aborts the "
                           f"process otherwise), and this is thread {threading.current_thread().name!r}: "
                           "use wccl.media.window_process.ProcessWindowScreen (hardware.window_screen "
                           "chooses it off the main thread)")


class CursorHider:
    """Keeps the mouse cursor off a fullscreen window's code, with what the platform has (no new dependency).

    X11: XFixesHideCursor through libXfixes (hidden while this connection stays open), else the pointer is
    warped to the monitor's bottom-right corner with xdotool. Windows: user32.ShowCursor(False), on the
    thread that owns the window (call `hide()` there). macOS: CoreGraphics' CGDisplayHideCursor on the main
    display. `hide()` returns the method used, or None (nothing available); `restore()` undoes it.
    """

    def __init__(self, display_name: str | None, monitor: tuple[int, int, int, int] | None, log) -> None:
        self.display_name = display_name
        self.monitor = monitor
        self.log = log
        self.method: str | None = None
        self._undo: Callable[[], None] | None = None

    def hide(self) -> str | None:
        if sys.platform.startswith(("linux", "freebsd", "openbsd", "netbsd")):
            tries = (self._xfixes, self._xdotool_corner)
            hint = ("install libXfixes (Debian/Ubuntu: apt-get install libxfixes3) or xdotool, "
                    "or move the mouse off the screen by hand")
        elif sys.platform == "win32":
            tries, hint = (self._user32,), "move the mouse off the screen by hand"
        elif sys.platform == "darwin":
            tries, hint = (self._coregraphics,), "move the mouse off the screen by hand"
        else:
            tries, hint = (), "move the mouse off the screen by hand"
        for attempt in tries:
            try:
                method = attempt()
            except (OSError, AttributeError, ValueError, subprocess.SubprocessError):
                method = None
            if method:
                self.method = method
                self.log.info("cursor_hidden", method=method)
                return method
        self.log.warning("cursor_not_hidden", platform=sys.platform, hint=hint)
        return None

    def restore(self) -> None:
        undo, self._undo = self._undo, None
        if undo is not None:
            try:
                undo()
            except (OSError, AttributeError, ValueError):
                pass

    # -- per platform ----------------------------------------------------------------------------
    def _xfixes(self) -> str | None:
        if not self.display_name:
            return None
        x11, xfixes = _display._libx11(), _display._load("Xfixes")
        if x11 is None or xfixes is None:
            return None
        x11.XDefaultRootWindow.restype = ctypes.c_ulong
        x11.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
        x11.XQueryExtension.argtypes = [ctypes.c_void_p, ctypes.c_char_p] + [ctypes.c_void_p] * 3
        x11.XFlush.argtypes = x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
        xfixes.XFixesQueryVersion.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        xfixes.XFixesHideCursor.argtypes = xfixes.XFixesShowCursor.argtypes = [ctypes.c_void_p, ctypes.c_ulong]
        dpy = x11.XOpenDisplay(self.display_name.encode())
        if not dpy:
            return None
        op, ev, err, major, minor = (ctypes.c_int() for _ in range(5))
        # A request of a missing extension is an X error, and Xlib's default handler ends the process: ask first.
        if (not x11.XQueryExtension(dpy, b"XFIXES", ctypes.byref(op), ctypes.byref(ev), ctypes.byref(err))
                or not xfixes.XFixesQueryVersion(dpy, ctypes.byref(major), ctypes.byref(minor))
                or major.value < 4):  # HideCursor came with XFIXES 4
            x11.XCloseDisplay(dpy)
            return None
        root = x11.XDefaultRootWindow(dpy)
        xfixes.XFixesHideCursor(dpy, root)
        x11.XFlush(dpy)

        def undo() -> None:  # the server shows the cursor again when this connection closes anyway
            xfixes.XFixesShowCursor(dpy, root)
            x11.XFlush(dpy)
            x11.XCloseDisplay(dpy)

        self._undo = undo
        return "xfixes"

    def _xdotool_corner(self) -> str | None:
        exe = shutil.which("xdotool")
        if exe is None or self.monitor is None:
            return None
        mx, my, mw, mh = self.monitor
        env = dict(os.environ)
        if self.display_name:
            env["DISPLAY"] = self.display_name
        r = subprocess.run([exe, "mousemove", str(mx + mw - 1), str(my + mh - 1)], check=False, env=env,
                           capture_output=True, timeout=5)
        return "xdotool_corner" if r.returncode == 0 else None

    def _user32(self) -> str | None:
        user32 = _display._load("user32")
        if user32 is None:
            return None
        user32.ShowCursor.argtypes = [ctypes.c_int]
        user32.ShowCursor.restype = ctypes.c_int
        user32.ShowCursor(0)  # a display counter: hidden while below 0
        self._undo = lambda: user32.ShowCursor(1)
        return "user32_showcursor"

    def _coregraphics(self) -> str | None:
        cg = _display._load(_display.COREGRAPHICS)
        if cg is None:
            return None
        cg.CGMainDisplayID.restype = ctypes.c_uint32
        cg.CGDisplayHideCursor.argtypes = cg.CGDisplayShowCursor.argtypes = [ctypes.c_uint32]
        main = cg.CGMainDisplayID()
        if cg.CGDisplayHideCursor(main) != 0:  # a CGError
            return None
        self._undo = lambda: cg.CGDisplayShowCursor(main)
        return "coregraphics"


def show_stats(took_s: list[float], presented: list[float], hz: float | None) -> dict:
    """What the presentation times say: how long show() took (ms percentiles: the jitter of handing a frame
    to the window system), and, with a known refresh rate, how locked the presentations are to its phase:
    |mean of exp(2 pi i t / period)|, 1 when every frame went up at the same phase of the refresh, near 0
    when the phases are spread evenly (what a backend without vsync gives)."""
    out: dict = {"shows": len(took_s)}
    if took_s:
        ms = np.asarray(took_s) * 1000.0
        out["show_jitter_ms"] = {k: round(float(np.percentile(ms, q)), 3)
                                 for k, q in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))}
    if hz and len(presented) >= MIN_PHASE_SAMPLES:
        period = 1.0 / hz
        t = np.asarray(presented)
        phase = 2 * math.pi * np.mod(t - t[0], period) / period
        out["refresh_phase_locking"] = round(float(abs(np.exp(1j * phase).mean())), 3)
    return out


def _prepare_qt() -> None:
    """Quiet Qt's complaint that opencv-python ships no fonts (point it at the system's, if any)."""
    if "QT_QPA_FONTDIR" not in os.environ:
        for d in ("/usr/share/fonts/truetype/dejavu", "/usr/share/fonts/truetype", "/usr/share/fonts"):
            if os.path.isdir(d):
                os.environ["QT_QPA_FONTDIR"] = d
                break


def free_bands(image: np.ndarray) -> tuple[int, int]:
    """Heights of the all-black bands above and below what is drawn on `image`."""
    lit = np.flatnonzero(image.reshape(image.shape[0], -1).any(axis=1))
    if len(lit) == 0:
        return image.shape[0] // 2, image.shape[0] - image.shape[0] // 2
    return int(lit[0]), int(image.shape[0] - 1 - lit[-1])


def draw_overlay(image: np.ndarray, lines: list[str]) -> tuple[np.ndarray, bool]:
    """`image` with `lines` written in its black bands: the first line above the code, the rest below.

    Returns (image, drawn); `drawn` is False when a band is too small for legible text (nothing drawn).
    """
    import cv2

    if not lines:
        return image, True
    h, w = image.shape[:2]
    top, bottom = free_bands(image)
    groups = [(lines[:1], 0, top), (lines[1:], h - bottom, bottom)]
    out = image.copy()
    drawn = True
    font = cv2.FONT_HERSHEY_SIMPLEX
    for group, y0, band in groups:
        if not group:
            continue
        room = band - 2 * RING_GAP_PX
        line_h = room // len(group)
        if line_h < MIN_TEXT_PX:
            drawn = False
            continue
        (tw, th), base = cv2.getTextSize(max(group, key=len), font, 1.0, 1)
        scale = min((line_h * 0.8) / (th + base), 1.2)
        thick = 2 if scale >= 0.9 else 1
        while scale > 0.2:  # shrink until the widest line fits (text size is not linear in the scale)
            widest = max(cv2.getTextSize(t, font, scale, thick)[0][0] for t in group)
            if widest <= w - 2 * RING_GAP_PX:
                break
            scale *= 0.95
            thick = 2 if scale >= 0.9 else 1
        for i, text in enumerate(group):
            (tw, th), base = cv2.getTextSize(text, font, scale, thick)
            x = max(RING_GAP_PX, (w - tw) // 2)
            # centre the line in its slot
            slot_top = y0 + RING_GAP_PX + i * line_h
            y = slot_top + (line_h + th) // 2 - base // 2
            cv2.putText(out, text, (x, y), font, scale, OVERLAY_COLOUR, thick, cv2.LINE_AA)
    # Text must stay inside the bands: nothing of the code is covered.
    out[top : h - bottom] = image[top : h - bottom]
    return out, drawn


def _canvas_for(w: int, h: int, mw: int, mh: int) -> tuple[int, int]:
    """The smallest canvas around a w x h frame with the monitor's shape (mw x mh)."""
    if mw * h >= mh * w:
        return max(w, round(h * mw / mh)), h
    return w, max(h, round(w * mh / mw))


def _pad(image: np.ndarray, cw: int, ch: int) -> np.ndarray:
    """`image` centred on a black cw x ch canvas."""
    h, w = image.shape[:2]
    out = np.zeros((ch, cw, 3), np.uint8)
    y0, x0 = (ch - h) // 2, (cw - w) // 2
    out[y0 : y0 + h, x0 : x0 + w] = image
    return out


class WindowScreen:
    """A window showing frames. Create it on the event loop's thread (highgui is not thread-safe); on macOS
    that must be the process's main thread (RuntimeError otherwise)."""

    def __init__(self, clock, title: str, width: int, height: int, *, fullscreen: bool = True, x: int = 0,
                 y: int = 0, on_quit: Callable[[], None] | None = None, display: str | None = None,
                 node: str | None = None) -> None:
        require_main_thread("WindowScreen")
        self.info: DisplayInfo = probe_display(display)  # raises NoDisplay before highgui is touched
        if display:
            os.environ["DISPLAY"] = display
        _prepare_qt()
        import cv2

        self._cv2 = cv2
        self._clock = clock
        self.title = title
        self.width, self.height = width, height
        self.fullscreen = fullscreen
        self.on_quit = on_quit
        self.quit_requested = False
        self.closed = False
        self._overlay: list[str] | None = None
        self._overlay_warned = False
        self._last: np.ndarray | None = None
        self.shown = 0
        self.log = structlog.get_logger("wccl").bind(**({"node": node} if node else {}), actor="screen")
        self._canvas: tuple[int, int] | None = None  # (w, h): frames padded with black to the monitor's shape
        self._x, self._y = x, y
        self._took: deque[float] = deque(maxlen=SHOW_STATS)  # how long each show() took (s)
        self._presented: deque[float] = deque(maxlen=SHOW_STATS)  # node-clock times show() returned
        self.refresh_hz = refresh_hz(self.info.name if self.info.screens else None)
        self._cursor: CursorHider | None = None
        rect = None
        for attempt in range(1, PAINT_TRIES + 1):
            want = self._create()
            rect = self._settle(want) if want is not None else None
            painted = self._paint_check(attempt)
            if painted is not False:
                break
            # Seen under Xvfb on a loaded machine: the window is mapped where it should be but the
            # toolkit never paints into it, whatever is shown later. A new window cures it.
            self.log.warning("window_not_painted", attempt=attempt, image_rect=list(rect) if rect else None)
            cv2.destroyWindow(title)
            cv2.waitKey(20)
        else:
            self.log.error("window_not_painted_giving_up", tries=PAINT_TRIES)
        self.show(np.zeros((height, width, 3), np.uint8))
        self.log.info("window_opened", display=self.info.name, display_size=list(self.info.size), title=title,
                      fullscreen=fullscreen, x=x, y=y, width=width, height=height,
                      image_rect=list(rect) if rect else None, painted=painted, refresh_hz=self.refresh_hz)
        if fullscreen:
            monitor = monitor_at(self.info, x, y)
            self._cursor = CursorHider(self.info.name if self.info.screens else None, monitor, self.log)
            self._cursor.hide()
        self._loop = asyncio.get_running_loop()
        self._poll_handle = self._loop.call_later(POLL_S, self._poll)

    def _create(self) -> tuple[int, int, int, int] | None:
        """Open the window; return where its image must end up (x, y, w, h), if known."""
        cv2, title = self._cv2, self.title
        if self.fullscreen:
            cv2.namedWindow(title, cv2.WINDOW_NORMAL | cv2.WINDOW_KEEPRATIO | cv2.WINDOW_GUI_NORMAL)
            monitor = monitor_at(self.info, self._x, self._y)
            want = None
            if monitor is not None:
                # Placed and sized by hand too: without a window manager (a kiosk session, Xvfb) the
                # fullscreen request alone leaves a small window.
                mx, my, mw, mh = monitor
                cv2.moveWindow(title, mx, my)
                cv2.resizeWindow(title, mw, mh)
                self._canvas = _canvas_for(self.width, self.height, mw, mh)
                want = monitor
            else:
                cv2.moveWindow(title, self._x, self._y)  # fullscreen on the monitor this point is on
            cv2.setWindowProperty(title, cv2.WND_PROP_FULLSCREEN, cv2.WINDOW_FULLSCREEN)
            return want
        # 1:1 pixels, no toolbar: what is captured is exactly what was drawn.
        cv2.namedWindow(title, cv2.WINDOW_NORMAL | cv2.WINDOW_GUI_NORMAL | cv2.WINDOW_KEEPRATIO)
        cv2.moveWindow(title, self._x, self._y)
        cv2.resizeWindow(title, self.width, self.height)
        return self._x, self._y, self.width, self.height

    def _paint_check(self, attempt: int = 1) -> bool | None:
        """Show a test grey and read it back off the X display: is the window really painted?

        None where it cannot be checked (not X11, or the window's place is unknown).
        """
        if not self.info.screens:
            return None
        probe = np.full((self.height, self.width, 3), PROBE_GREY, np.uint8)
        deadline = time.monotonic() + min(3.0, PAINT_WAIT_S * attempt)
        while True:  # a new window may take a moment to be mapped and painted
            self._present(probe)
            self._cv2.waitKey(20)
            x, y, w, h = (int(v) for v in self._cv2.getWindowImageRect(self.title))
            if w < 4 or h < 4:
                return None
            points = [(x + w * i // 4, y + h * j // 4) for i in (1, 2, 3) for j in (1, 2, 3)]
            pixels = read_pixels(self.info.name, points)
            if pixels is None:
                return None
            if all(max(abs(int(c) - PROBE_GREY) for c in px) <= 2 for px in pixels):
                return True
            if time.monotonic() > deadline:
                return False

    def _settle(self, want: tuple[int, int, int, int], timeout_s: float = 3.0) -> tuple[int, ...]:
        """Place and size the window until its image sits at `want` (x, y, w, h) on the display.

        A busy machine can leave a new window at the toolkit's default size, so this checks and asks again.
        """
        cv2 = self._cv2
        x, y, w, h = want
        probe = np.full((self.height, self.width, 3), PROBE_GREY, np.uint8)
        self._present(probe)
        deadline = time.monotonic() + timeout_s
        rect = tuple(cv2.getWindowImageRect(self.title))
        while rect != want and time.monotonic() < deadline:
            cv2.moveWindow(self.title, x, y)
            cv2.resizeWindow(self.title, w, h)
            self._present(probe)
            cv2.waitKey(20)
            rect = tuple(cv2.getWindowImageRect(self.title))
        if rect != want:
            self.log.warning("window_misplaced", want=list(want), image_rect=list(rect),
                             hint="the window manager moved or resized the window")
        return rect

    # -- keys and window events ------------------------------------------------------------------
    def _key(self, key: int) -> None:
        if key & 0xFF == ESC and key != -1:
            self._quit("escape_pressed")
            return
        try:
            visible = self._cv2.getWindowProperty(self.title, self._cv2.WND_PROP_VISIBLE)
        except self._cv2.error:
            visible = 0
        if visible < 1:
            self._quit("window_closed")

    def _quit(self, why: str) -> None:
        if self.quit_requested:
            return
        self.quit_requested = True
        self.log.warning("quit_requested", reason=why)
        if self.on_quit is not None:
            self.on_quit()

    def _poll(self) -> None:
        if self.closed:
            return
        self._key(self._cv2.pollKey())
        self._poll_handle = self._loop.call_later(POLL_S, self._poll)

    # -- the screen interface --------------------------------------------------------------------
    def set_overlay(self, lines: list[str] | None) -> None:
        """Show these instruction lines around the code (None: no overlay) from the next frame on."""
        self._overlay = list(lines) if lines else None
        if self._last is not None and not self.closed:
            self._present(self._last)

    def show(self, image: np.ndarray) -> float | None:
        if self.closed:
            return None
        if image.shape[:2] != (self.height, self.width):
            raise ValueError(f"window is {self.width}x{self.height}, image is {image.shape[1]}x{image.shape[0]}")
        self._last = image
        t0 = self._clock.now()
        presented = self._present(image)
        self._took.append(presented - t0)
        self._presented.append(presented)
        return presented

    def stats(self) -> dict:
        """Frames shown, and the timing of show() (`show_stats`: jitter in ms, phase against the refresh)."""
        return {"shown": self.shown, "refresh_hz": self.refresh_hz,
                **show_stats(list(self._took), list(self._presented), self.refresh_hz)}

    def _present(self, image: np.ndarray) -> float:
        if self._canvas is not None and self._canvas != (image.shape[1], image.shape[0]):
            image = _pad(image, *self._canvas)
        if self._overlay:
            image, drawn = draw_overlay(image, self._overlay)
            if not drawn and not self._overlay_warned:
                self._overlay_warned = True
                self.log.warning("overlay_no_room", lines=self._overlay,
                                 hint="the code leaves too little black band for text; instructions only here")
        self._cv2.imshow(self.title, image)
        key = self._cv2.waitKey(1)  # runs the GUI's event loop once: the frame is painted and flushed
        presented = self._clock.now()
        self.shown += 1
        self._key(key)
        return presented

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._poll_handle.cancel()
        if self._cursor is not None:
            self._cursor.restore()
        try:
            self._cv2.destroyWindow(self.title)
            self._cv2.waitKey(1)
        except self._cv2.error:
            pass
        self.log.info("window_closed", title=self.title, **self.stats())
