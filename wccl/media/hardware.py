"""The real-hardware medium: each laptop's screen is a fullscreen window, its camera a webcam.

Consumes: the room config (room.medium = "hardware"; per node `window` and
`webcam` options). Emits: the parts a node needs, through the registry:
screen "window" (wccl.media.window) and camera "webcam" (wccl.media.webcam).
Light travels through the air; this process only runs the nodes given with
`--node`, usually one per laptop.

Where a window runs: on macOS only a process's main thread may open one
(Cocoa aborts otherwise), and the launcher runs a rank's node on a worker
thread; there, and wherever WCCL_WINDOW_PROCESS=1, `window_screen` gives a
ProcessWindowScreen (wccl.media.window_process: the window lives in a helper
process whose main thread owns it); otherwise an in-process WindowScreen.

The medium also carries the node's stop hook: a window's Esc calls
`request_stop()`, which sets the run's stop event (`bind_stop`), so the
node ends as it does on Ctrl-C. And it keeps the windows it made: `close()`
closes them, on the thread that calls it, which must be the thread that made
them (a rank of the `wccl` backend runs its node, windows included, on a
thread of its own, and closes the medium there when the node ends).
While it is open, the laptop neither sleeps nor blanks its screen
(wccl.runtime.hostos.KeepAwake, started by the medium, ended by `close()` or when
the process ends).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

from wccl.config import ConfigError
from wccl.runtime.hostos import KeepAwake
from wccl.media.display import probe_display


class StopHook:
    """What a window calls on Esc: every bound callback (RoomRun binds its stop event); and the windows."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], None]] = []
        self.windows: list = []  # windows made for this medium (window_screen), closed by close()

    def bind_stop(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def request_stop(self) -> None:
        for cb in self._callbacks:
            cb()

    def close(self) -> None:
        """Close the windows made for this medium (idempotent). Call it on the thread that made them:
        OpenCV's highgui is not thread-safe."""
        while self.windows:
            self.windows.pop().close()


def require_realtime(config, medium: str) -> None:
    if config.room.clock != "realtime":
        raise ConfigError(f"room.clock: medium {medium!r} runs real devices on the wall clock: "
                          f"set clock = \"realtime\" (it is {config.room.clock!r})")


class HardwareMedium(StopHook):
    def __init__(self, config, keep_awake: KeepAwake | None = None) -> None:
        super().__init__()
        require_realtime(config, "hardware")
        self.config = config
        self.display = None
        if any(n.screen == "window" for n in config.room.nodes):
            self.display = probe_display()  # NoDisplay (exit 3) before anything else is built
        self.keep_awake = (keep_awake or KeepAwake()).start()

    def close(self) -> None:
        """Close the windows and let the laptop sleep again (idempotent; on the thread that made the medium)."""
        super().close()
        self.keep_awake.close()

    @classmethod
    def from_config(cls, *, config) -> HardwareMedium:
        return cls(config)


WINDOW_PROCESS_ENV = "WCCL_WINDOW_PROCESS"


def use_window_process() -> bool:
    """Should this thread's window live in a helper process? On macOS off the main thread (Cocoa's rule),
    and anywhere when WCCL_WINDOW_PROCESS=1."""
    if os.environ.get(WINDOW_PROCESS_ENV) == "1":
        return True
    return sys.platform == "darwin" and threading.current_thread() is not threading.main_thread()


def window_screen(*, medium, node, clock, config):
    """Screen "window": fullscreen (or placed) per the node's `window` options; on the desktop medium, placed.

    A WindowScreen, or a ProcessWindowScreen where `use_window_process()` says so (same interface)."""
    if use_window_process():
        from wccl.media.window_process import ProcessWindowScreen as WindowScreen
    else:
        from wccl.media.window import WindowScreen

    on_quit = getattr(medium, "request_stop", None)
    place = getattr(medium, "window_rect", None)
    if place is not None:  # the desktop loopback: windows side by side on one display
        x, y, _, _ = place(node)
        screen = WindowScreen(clock, f"wccl {node}", config.screen.width, config.screen.height, fullscreen=False,
                              x=x, y=y, on_quit=on_quit, display=medium.display_name, node=node)
    else:
        opts = config.room.node(node).window
        fullscreen, x, y = (opts.fullscreen, opts.x, opts.y) if opts is not None else (True, 0, 0)
        screen = WindowScreen(clock, f"wccl {node}", config.screen.width, config.screen.height,
                              fullscreen=fullscreen, x=x, y=y, on_quit=on_quit, node=node)
    windows = getattr(medium, "windows", None)
    if windows is not None:
        windows.append(screen)
    return screen


def webcam_camera(*, medium, node, clock, config):
    """Camera "webcam": the node's `webcam` options (defaults: device 0, 1280x720, MJPEG, locks on)."""
    from wccl.config import WebcamOptions
    from wccl.media.webcam import WebcamCamera

    opts = config.room.node(node).webcam or WebcamOptions()
    return WebcamCamera(clock, opts, fps=config.camera.fps, node=node)
