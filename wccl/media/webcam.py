"""A real webcam, read with OpenCV's VideoCapture in a thread.

Consumes: a camera device (an index, or a path such as /dev/video2) and its
options (NodeSpec.webcam: resolution, fps, MJPEG, exposure and white balance
locks). Emits: through `async recv()` (ThreadedCamera), each image (BGR) and
the node-clock time it was captured; images are dropped oldest-first and
counted when the decoder falls behind.

Why OpenCV's VideoCapture and not PyAV's device input: VideoCapture reaches
the camera controls the link depends on (auto-exposure, exposure, auto white
balance, colour temperature, focus, the driver's buffer count) through one
API on V4L2 (Linux), AVFoundation (macOS) and DirectShow (Windows), and says
which settings the driver accepted. PyAV's v4l2/avfoundation/dshow demuxers
only choose the format (size, rate, MJPEG); exposure and white balance would
need a second, per-platform tool. OpenCV is already a dependency.

Locking the exposure (the hackathon's worst enemy was auto-exposure drift):
the camera first runs on auto for `settle_s` while the screens show their
start-up frames (an even light, like a transfer's), then the values auto
chose are read back and fixed (manual exposure at that value, white balance
at that temperature, focus where it is). Or give `exposure` /
`white_balance_k` to set them yourself. Every setting is logged with what
the driver reports afterwards (`webcam_setting`): many laptop cameras ignore
some of them, and V4L2, DirectShow and AVFoundation spell manual exposure
differently.

Capture times: `time.monotonic()` when `grab()` returns (the driver has the
image), minus nothing: on V4L2 the buffer's own timestamp (the same clock,
taken when the frame arrived from the camera) is used when it is plausible.
The clock sync measures the remaining latency end to end.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

from wccl.media.capture import ThreadedCamera
from wccl.media.display import NoCamera

BACKENDS = ("auto", "v4l2", "avfoundation", "dshow", "msmf", "any")


def backend_id(name: str) -> int:
    import cv2

    if name == "auto":
        if sys.platform.startswith("linux"):
            return cv2.CAP_V4L2
        if sys.platform == "darwin":
            return cv2.CAP_AVFOUNDATION
        if sys.platform == "win32":
            return cv2.CAP_DSHOW  # DirectShow exposes exposure and white balance; Media Foundation mostly not
        return cv2.CAP_ANY
    return {"v4l2": cv2.CAP_V4L2, "avfoundation": cv2.CAP_AVFOUNDATION, "dshow": cv2.CAP_DSHOW,
            "msmf": cv2.CAP_MSMF, "any": cv2.CAP_ANY}[name]


def _quiet_opencv() -> None:
    """OpenCV prints a WARN line of its own for every device it cannot open: we say it better."""
    try:
        import cv2

        cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)
    except AttributeError:
        pass


def _device_missing(device: int | str, backend: str) -> str | None:
    """Why `device` surely cannot be opened (Linux, V4L2), without touching the driver; None if it may exist."""
    if not sys.platform.startswith("linux") or backend not in ("auto", "v4l2"):
        return None
    path = f"/dev/video{device}" if isinstance(device, int) else device
    if not path.startswith("/dev/"):
        return None
    if not os.path.exists(path):
        present = sorted(p for p in os.listdir("/dev") if p.startswith("video"))
        return (f"{path} does not exist (cameras here: {', '.join('/dev/' + p for p in present)})" if present
                else f"{path} does not exist: no camera is connected (no /dev/video* device)")
    if not os.access(path, os.R_OK | os.W_OK):
        return f"{path}: permission denied (add this user to the 'video' group, then log in again)"
    return None


def open_capture(device: int | str, backend: str = "auto"):
    """An opened cv2.VideoCapture, or NoCamera saying why not."""
    import cv2

    _quiet_opencv()
    why = _device_missing(device, backend)
    if why is not None:
        raise NoCamera(f"camera {device}: {why}; `python -m wccl.devices` lists the cameras")
    cap = cv2.VideoCapture(device, backend_id(backend))
    if not cap.isOpened():
        cap.release()
        raise NoCamera(f"camera {device}: cannot be opened (backend {backend}); is another program using it? "
                       "`python -m wccl.devices` lists the cameras")
    return cap


class WebcamCamera(ThreadedCamera):
    name = "webcam"

    def __init__(self, clock, options: Any, fps: float, node: str | None = None) -> None:
        """`options`: a config.WebcamOptions (device, backend, width, height, fps, mjpeg, locks, buffer)."""
        import cv2

        super().__init__(clock, buffer=options.buffer, node=node)
        self._cv2 = cv2
        self.options = options
        self.device = options.device
        self.fps = options.fps or fps
        self._cap = open_capture(options.device, options.backend)
        self.backend = self._cap.getBackendName()
        self.settings: dict[str, Any] = {}
        cap = self._cap
        if options.mjpeg:
            self._set("fourcc", cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*"MJPG"))
        self._set("width", cv2.CAP_PROP_FRAME_WIDTH, options.width)
        self._set("height", cv2.CAP_PROP_FRAME_HEIGHT, options.height)
        self._set("fps", cv2.CAP_PROP_FPS, self.fps)
        self._set("buffersize", cv2.CAP_PROP_BUFFERSIZE, 1)  # the freshest image, not the driver's queue
        if options.lock_focus:
            self._set("autofocus", cv2.CAP_PROP_AUTOFOCUS, 0)
        ok, image = cap.read()
        if not ok or image is None:
            cap.release()
            raise NoCamera(f"camera {self.device}: opened, but it delivers no images "
                           f"(backend {self.backend}); try another device or resolution")
        self.size = (image.shape[1], image.shape[0])
        self.log.info("webcam_opened", device=str(self.device), backend=self.backend, width=self.size[0],
                      height=self.size[1], fps=cap.get(cv2.CAP_PROP_FPS), fourcc=self._fourcc(),
                      settle_s=options.settle_s, lock_exposure=options.lock_exposure,
                      lock_white_balance=options.lock_white_balance)
        self._t_open = time.monotonic()
        self._locked = not (options.lock_exposure or options.lock_white_balance)
        self._start()

    def _fourcc(self) -> str:
        v = int(self._cap.get(self._cv2.CAP_PROP_FOURCC))
        return "".join(chr((v >> (8 * i)) & 0xFF) for i in range(4)).strip("\x00") or "?"

    def _set(self, name: str, prop: int, value: float) -> bool:
        accepted = bool(self._cap.set(prop, value))
        now = self._cap.get(prop)
        self.settings[name] = dict(asked=value, accepted=accepted, reads=now)
        self.log.info("webcam_setting", setting=name, asked=value, accepted=accepted, reads=now)
        return accepted

    def _manual_exposure_values(self) -> list[float]:
        # V4L2 passes the menu value through (1 = manual); DirectShow and others use 0.25 = manual.
        return [1] if self.backend == "V4L2" else [0.25, 1]

    def _lock(self) -> None:
        """Fix exposure and white balance at what auto chose (or at the configured values)."""
        cv2, o = self._cv2, self.options
        if o.lock_exposure:
            value = o.exposure if o.exposure is not None else self._cap.get(cv2.CAP_PROP_EXPOSURE)
            for manual in self._manual_exposure_values():
                if self._set("auto_exposure", cv2.CAP_PROP_AUTO_EXPOSURE, manual):
                    break
            self._set("exposure", cv2.CAP_PROP_EXPOSURE, value)
        if o.lock_white_balance:
            kelvin = o.white_balance_k or self._cap.get(cv2.CAP_PROP_WB_TEMPERATURE)
            self._set("auto_white_balance", cv2.CAP_PROP_AUTO_WB, 0)
            if kelvin and kelvin > 0:
                self._set("white_balance_k", cv2.CAP_PROP_WB_TEMPERATURE, kelvin)
        self.log.info("webcam_locked", **{k: v["reads"] for k, v in self.settings.items()})

    def _read(self) -> tuple[np.ndarray, float] | None:
        if not self._locked and time.monotonic() - self._t_open >= self.options.settle_s:
            self._locked = True
            self._lock()
        if not self._cap.grab():
            raise RuntimeError(f"camera {self.device}: grab failed (unplugged?)")
        t = time.monotonic()
        if self.backend == "V4L2":
            # The V4L2 buffer timestamp (ms, CLOCK_MONOTONIC): when the driver got the frame.
            ms = self._cap.get(self._cv2.CAP_PROP_POS_MSEC)
            if 0.0 <= t - ms / 1000.0 < 0.5:
                t = ms / 1000.0
        ok, image = self._cap.retrieve()
        if not ok or image is None:
            raise RuntimeError(f"camera {self.device}: could not decode an image")
        return image, t

    def _release(self) -> None:
        self._cap.release()
