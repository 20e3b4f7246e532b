"""Is there a display a window can go on? Asked before any GUI library is touched.

Consumes: the environment (`DISPLAY`, `WAYLAND_DISPLAY`) and, on Linux and
the BSDs, the X server itself. Emits: a `DisplayInfo` (name, screen sizes),
or `NoDisplay` with a message a person can act on.

Why ask first: OpenCV's windows (opencv-python's Qt xcb backend) abort the
whole process (SIGABRT, no Python exception) when the X server cannot be
reached. So the X display is opened here through Xlib (`XOpenDisplay` from
libX11, via ctypes; no window is created) and only then is highgui used.
On macOS and Windows there is always a desktop while a user is logged in,
and their backends raise instead of aborting: there is nothing to ask.

Also here: the display's refresh rate (`refresh_hz`: xrandr on X11,
EnumDisplaySettingsW on Windows, CoreGraphics on macOS), and the errors of
real devices (`DeviceError`: `NoDisplay`,
`NoCamera`), each with the exit status `python -m wccl.node` ends with.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from dataclasses import dataclass

EXIT_NO_DISPLAY = 3
EXIT_NO_CAMERA = 4


class DeviceError(RuntimeError):
    """A real device (display, camera) this node needs is not there. The message says what to do."""

    exit_status = 1


class NoDisplay(DeviceError):
    exit_status = EXIT_NO_DISPLAY


class NoCamera(DeviceError):
    exit_status = EXIT_NO_CAMERA


@dataclass(frozen=True)
class DisplayInfo:
    name: str  # e.g. ":0", or "desktop" where there is no X display to name (macOS, Windows)
    screens: tuple[tuple[int, int], ...]  # (width, height) of each X screen, in pixels

    @property
    def size(self) -> tuple[int, int]:
        """The default screen's size (0, 0 when unknown)."""
        return self.screens[0] if self.screens else (0, 0)


def _uses_x11() -> bool:
    return sys.platform.startswith(("linux", "freebsd", "openbsd", "netbsd"))


def _libx11():
    """libX11 through ctypes, with XOpenDisplay typed; None if it is not there."""
    path = ctypes.util.find_library("X11")
    if path is None:
        return None
    try:
        x11 = ctypes.CDLL(path)
    except OSError:
        return None
    x11.XOpenDisplay.restype = ctypes.c_void_p
    x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
    return x11


def _open_x(name: str) -> tuple[tuple[int, int], ...] | None:
    """Screen sizes of X display `name`, or None if it cannot be opened (or libX11 is missing)."""
    x11 = _libx11()
    if x11 is None:
        return None
    for fn in ("XScreenCount",):
        getattr(x11, fn).argtypes = [ctypes.c_void_p]
    for fn in ("XDisplayWidth", "XDisplayHeight"):
        getattr(x11, fn).argtypes = [ctypes.c_void_p, ctypes.c_int]
    x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    dpy = x11.XOpenDisplay(name.encode())
    if not dpy:
        return None
    try:
        n = x11.XScreenCount(dpy)
        return tuple((int(x11.XDisplayWidth(dpy, i)), int(x11.XDisplayHeight(dpy, i))) for i in range(n))
    finally:
        x11.XCloseDisplay(dpy)


def read_pixels(name: str, points: list[tuple[int, int]]) -> list[tuple[int, int, int]] | None:
    """(B, G, R) of these points of X display `name`'s root window (what is on screen), or None if
    they cannot be read (not X11, no libX11, a point off the screen, a display depth other than 24/32)."""
    if not _uses_x11() or not points:
        return None
    x11 = _libx11()
    if x11 is None:
        return None
    x11.XDefaultRootWindow.restype = ctypes.c_ulong
    x11.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
    x11.XDefaultDepth.argtypes = [ctypes.c_void_p, ctypes.c_int]
    x11.XGetImage.restype = ctypes.c_void_p
    x11.XGetImage.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_int, ctypes.c_uint,
                              ctypes.c_uint, ctypes.c_ulong, ctypes.c_int]
    x11.XGetPixel.restype = ctypes.c_ulong
    x11.XGetPixel.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    x11.XDestroyImage.argtypes = [ctypes.c_void_p]
    x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    dpy = x11.XOpenDisplay(name.encode())
    if not dpy:
        return None
    try:
        if x11.XDefaultDepth(dpy, 0) not in (24, 32):
            return None
        # A rectangle off the screen is an X error, and Xlib's default handler ends the process: clip first.
        x11.XDisplayWidth.argtypes = x11.XDisplayHeight.argtypes = [ctypes.c_void_p, ctypes.c_int]
        sw, sh = x11.XDisplayWidth(dpy, 0), x11.XDisplayHeight(dpy, 0)
        if not all(0 <= px < sw and 0 <= py < sh for px, py in points):
            return None
        root = x11.XDefaultRootWindow(dpy)
        x0, y0 = min(p[0] for p in points), min(p[1] for p in points)
        w, h = max(p[0] for p in points) - x0 + 1, max(p[1] for p in points) - y0 + 1
        ZPIXMAP, ALL_PLANES = 2, 0xFFFFFFFF
        image = x11.XGetImage(dpy, root, x0, y0, w, h, ALL_PLANES, ZPIXMAP)
        if not image:
            return None
        try:
            out = []
            for px, py in points:
                v = x11.XGetPixel(image, px - x0, py - y0)
                out.append((v & 0xFF, (v >> 8) & 0xFF, (v >> 16) & 0xFF))
            return out
        finally:
            x11.XDestroyImage(image)
    finally:
        x11.XCloseDisplay(dpy)


def monitors(name: str | None = None) -> list[tuple[int, int, int, int]]:
    """The monitors of X display `name` (x, y, width, height) from `xrandr --listmonitors`; [] if unknown."""
    import re
    import shutil
    import subprocess

    if not _uses_x11() or not shutil.which("xrandr"):
        return []
    env = dict(os.environ)
    if name:
        env["DISPLAY"] = name
    try:
        text = subprocess.run(["xrandr", "--listmonitors"], check=False, capture_output=True, text=True, timeout=5,
                              env=env).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    out = []
    for m in re.finditer(r"^\s*\d+:\s+\S+\s+(\d+)/\d+x(\d+)/\d+\+(\d+)\+(\d+)", text, re.MULTILINE):
        w, h, x, y = (int(v) for v in m.groups())
        out.append((x, y, w, h))
    return out


def monitor_at(info: DisplayInfo, x: int, y: int) -> tuple[int, int, int, int] | None:
    """The monitor (x, y, width, height) containing the point, else the X screen; None where unknown."""
    mons = monitors(info.name) if info.screens else []
    for mx, my, mw, mh in mons:
        if mx <= x < mx + mw and my <= y < my + mh:
            return mx, my, mw, mh
    if mons:
        return mons[0]
    if info.screens:
        return 0, 0, *info.size
    return None


def probe_display(name: str | None = None) -> DisplayInfo:
    """The display windows would open on (`name`, default `$DISPLAY`); raises NoDisplay if there is none."""
    if not _uses_x11():
        return DisplayInfo("desktop", ())
    name = name or os.environ.get("DISPLAY") or ""
    if not name:
        if os.environ.get("WAYLAND_DISPLAY"):
            raise NoDisplay("no X display: this is a Wayland session without XWayland (DISPLAY is not set); "
                            "OpenCV's window needs X11: log in to an X11 session or enable XWayland")
        raise NoDisplay("no display: DISPLAY is not set: the run's window needs the laptop's desktop, so start "
                        "it from a terminal of the desktop session (not over ssh); to try WCCL without screens, "
                        "run a room whose medium is \"simulated\" (config.toml)")
    if ctypes.util.find_library("X11") is None:
        raise NoDisplay(f"display {name}: libX11 is not installed, so the X server cannot be reached "
                        "(Debian/Ubuntu: apt-get install libx11-6)")
    screens = _open_x(name)
    if screens is None:
        raise NoDisplay(f"display {name}: cannot connect to the X server (is it running, and may this user "
                        "use it? try: xdpyinfo -display " + name + ")")
    return DisplayInfo(name, screens)


def _load(name: str):
    """A system library through ctypes (`name` as ctypes.util.find_library takes it, or a path); None if absent."""
    path = name if os.sep in name else ctypes.util.find_library(name)
    if path is None:
        return None
    try:
        return ctypes.WinDLL(path) if sys.platform == "win32" and hasattr(ctypes, "WinDLL") else ctypes.CDLL(path)
    except OSError:
        return None


COREGRAPHICS = "/System/Library/Frameworks/CoreGraphics.framework/CoreGraphics"


def parse_xrandr_rate(text: str) -> float | None:
    """The current mode's refresh rate (Hz) in `xrandr --current` output: the rate marked '*'; None if there
    is none, or it is 0 (a virtual display such as Xvfb has no refresh)."""
    import re

    m = re.search(r"(\d+(?:\.\d+)?)\s*\*", text)
    if m is None:
        return None
    hz = float(m.group(1))
    return hz if hz > 0 else None


def _refresh_x11(name: str | None) -> float | None:
    import shutil
    import subprocess

    if not shutil.which("xrandr"):
        return None
    env = dict(os.environ)
    if name:
        env["DISPLAY"] = name
    try:
        r = subprocess.run(["xrandr", "--current"], check=False, capture_output=True, text=True, timeout=5, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_xrandr_rate(r.stdout) if r.returncode == 0 else None


class _DEVMODEW(ctypes.Structure):
    """Win32 DEVMODEW (220 bytes; the printer/display union as its display variant; names as UTF-16 units)."""

    _fields_ = [("dmDeviceName", ctypes.c_uint16 * 32), ("dmSpecVersion", ctypes.c_uint16),
                ("dmDriverVersion", ctypes.c_uint16), ("dmSize", ctypes.c_uint16),
                ("dmDriverExtra", ctypes.c_uint16), ("dmFields", ctypes.c_uint32),
                ("dmPositionX", ctypes.c_int32), ("dmPositionY", ctypes.c_int32),
                ("dmDisplayOrientation", ctypes.c_uint32), ("dmDisplayFixedOutput", ctypes.c_uint32),
                ("dmColor", ctypes.c_int16), ("dmDuplex", ctypes.c_int16), ("dmYResolution", ctypes.c_int16),
                ("dmTTOption", ctypes.c_int16), ("dmCollate", ctypes.c_int16),
                ("dmFormName", ctypes.c_uint16 * 32), ("dmLogPixels", ctypes.c_uint16),
                ("dmBitsPerPel", ctypes.c_uint32), ("dmPelsWidth", ctypes.c_uint32),
                ("dmPelsHeight", ctypes.c_uint32), ("dmDisplayFlags", ctypes.c_uint32),
                ("dmDisplayFrequency", ctypes.c_uint32), ("dmICMMethod", ctypes.c_uint32),
                ("dmICMIntent", ctypes.c_uint32), ("dmMediaType", ctypes.c_uint32),
                ("dmDitherType", ctypes.c_uint32), ("dmReserved1", ctypes.c_uint32),
                ("dmReserved2", ctypes.c_uint32), ("dmPanningWidth", ctypes.c_uint32),
                ("dmPanningHeight", ctypes.c_uint32)]


def _refresh_windows() -> float | None:
    user32 = _load("user32")
    if user32 is None:
        return None
    ENUM_CURRENT_SETTINGS = -1
    mode = _DEVMODEW()
    mode.dmSize = ctypes.sizeof(_DEVMODEW)
    if not user32.EnumDisplaySettingsW(None, ENUM_CURRENT_SETTINGS, ctypes.byref(mode)):
        return None
    hz = int(mode.dmDisplayFrequency)
    return float(hz) if hz > 1 else None  # 0 and 1 mean "the hardware's default": unknown


def _refresh_macos() -> float | None:
    cg = _load(COREGRAPHICS)
    if cg is None:
        return None
    cg.CGMainDisplayID.restype = ctypes.c_uint32
    cg.CGDisplayCopyDisplayMode.restype = ctypes.c_void_p
    cg.CGDisplayCopyDisplayMode.argtypes = [ctypes.c_uint32]
    cg.CGDisplayModeGetRefreshRate.restype = ctypes.c_double
    cg.CGDisplayModeGetRefreshRate.argtypes = [ctypes.c_void_p]
    cg.CGDisplayModeRelease.argtypes = [ctypes.c_void_p]
    mode = cg.CGDisplayCopyDisplayMode(cg.CGMainDisplayID())
    if not mode:
        return None
    try:
        hz = float(cg.CGDisplayModeGetRefreshRate(mode))
    finally:
        cg.CGDisplayModeRelease(mode)
    return hz if hz > 0 else 60.0  # built-in panels report 0: they run at 60 Hz


def refresh_hz(name: str | None = None) -> float | None:
    """The refresh rate (Hz) of the display windows open on (X11: display `name`, default `$DISPLAY`; elsewhere
    the main display); None where it cannot be known. X11: the current mode in `xrandr --current`; Windows:
    EnumDisplaySettingsW's dmDisplayFrequency; macOS: CoreGraphics' CGDisplayModeGetRefreshRate."""
    try:
        if _uses_x11():
            return _refresh_x11(name)
        if sys.platform == "win32":
            return _refresh_windows()
        if sys.platform == "darwin":
            return _refresh_macos()
    except (OSError, AttributeError, ValueError):
        return None
    return None
