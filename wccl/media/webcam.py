"""A real webcam, read with OpenCV's VideoCapture in a thread.

Consumes: a camera device (an index, a path such as /dev/video2 or a video
file, or part of the camera's name, matched by `find_camera` on
Linux) and its options (NodeSpec.webcam: resolution, fps, MJPEG, the
driver's buffer count, exposure, white balance and focus locks); and, from
the FrameDecoder (through the CameraReader, `code_seen()`), where the other screen's code is in
the image. Emits: through `async recv()` (ThreadedCamera), each image (BGR)
and the node-clock time it was captured; images are dropped oldest-first
and counted when the decoder falls behind. `lock_state` says where the locks
are, for an aim screen.

Why OpenCV's VideoCapture and not PyAV's device input: VideoCapture reaches
the camera controls the link depends on (auto-exposure, exposure, auto white
balance, colour temperature, focus, the driver's buffer count) through one
API on V4L2 (Linux), AVFoundation (macOS) and DirectShow (Windows), and says
which settings the driver accepted. PyAV's v4l2/avfoundation/dshow demuxers
only choose the format (size, rate, MJPEG); exposure and white balance would
need a second, per-platform tool. OpenCV is already a dependency.

What the camera gives is checked against what was asked: a size it does
not have is logged at once (`webcam_size_mismatch`), and the frame rate,
measured over the first RATE_WINDOW_S seconds of captures, is logged
(`webcam_rate`) and, below RATE_SHORT of the rate asked, warned about with
the likely cause (`webcam_rate_mismatch`: uncompressed video over USB 2, a
dark room, AVFoundation keeping the camera's active format). The driver
keeps `driver_buffers` images (one buffer drops frames while the thread
takes it back); the thread reads them as they come and the ring keeps the
freshest for the decoder.

Locking the exposure (the worst enemy of a link made of light is
auto-exposure drift): exposure, white balance and focus stay on auto until
the other screen's code is in view (the first `code_seen()`), so that auto
meters the scene with the code in it; `settle_s` later the values auto
chose are fixed (manual exposure at that value, white balance at that
temperature, autofocus off with the focus where it is), or `exposure` /
`white_balance_k` when given. Then the code's region is metered in the
next captures: while more than CLIPPED_SHARE of its pixels are clipped the
exposure goes down a step (x EXPOSURE_STEP, at most EXPOSURE_STEPS times;
`webcam_metered`). The outcome is `webcam_locked` (the values read back) or
`webcam_lock_ignored` (a warning naming what the driver refused or left
unchanged: the camera keeps adjusting it, and a change of light during the
run may cost frames). Many laptop cameras ignore some of these, and V4L2,
DirectShow and AVFoundation spell manual exposure differently; OpenCV's
AVFoundation backend sets none of them (macOS: not tried, logged as
ignored). With no code in view after `lock_wait_s`, `webcam_lock_waiting`
says to aim the camera. `lock_exposure = false` (and the others) never
lock. Every setting is logged with what the driver reports afterwards
(`webcam_setting`).

Capture times: `time.monotonic()` when `grab()` returns (the driver has the
image), minus nothing: on V4L2 the buffer's own timestamp (the same clock,
taken when the frame arrived from the camera) is used when it is plausible.
The clock sync measures the remaining latency end to end.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from wccl.media.capture import ThreadedCamera
from wccl.media.display import NoCamera

RATE_WINDOW_S = 2.5  # the frame rate is measured over the first captures of this long
RATE_SHORT = 0.8  # a measured rate below this share of the rate asked is warned about
CLIPPED_LEVEL = 250  # a pixel is clipped when any channel reaches this
CLIPPED_SHARE = 0.02  # the code's region may have this share of clipped pixels
EXPOSURE_STEP = 0.8  # one step down of a locked exposure (in the driver's units)
EXPOSURE_STEPS = 4  # at most this many steps
METER_DELAY_S = 0.3  # an exposure change shows in the captures this much later
METER_WAIT_S = 1.0  # then the decoder has this long to report the code in one of them
UNCOMPRESSED = ("YUYV", "YUY2", "UYVY", "NV12", "I420", "YV12", "RGB3", "BGR3", "GREY", "Y800")
AVFOUNDATION = "OpenCV's AVFoundation backend sets only size and frame rate"
IGNORED_MEANS = ("the camera keeps adjusting it: changes of light during the run may cost frames; "
                 "keep the light steady")


# ----------------------------------------------------------------------------- cameras by name (Linux)
SYS_V4L = Path("/sys/class/video4linux")  # the kernel's list of V4L2 devices and their names
DEV = Path("/dev")


def v4l2_name(dev: str) -> str:
    """The kernel's name of a V4L2 device node ("" when it has none)."""
    p = SYS_V4L / Path(dev).name / "name"
    try:
        return p.read_text().strip()
    except OSError:
        return ""


def _v4l2_index(dev: str) -> int:
    """The node's index within its device (0: the first node, the capture node of a USB camera; a camera's
    metadata node has the same name and index 1)."""
    try:
        return int((SYS_V4L / Path(dev).name / "index").read_text().strip())
    except (OSError, ValueError):
        return 0


def video_nodes() -> list[Path]:
    """Every /dev/videoN, in number order (a camera may have several: capture, metadata)."""
    return sorted((p for p in DEV.glob("video*") if re.fullmatch(r"video\d+", p.name)), key=lambda p: int(p.name[5:]))


def camera_names() -> list[tuple[str, str]]:
    """(device path, name) of each camera's first node, without opening any (Linux only)."""
    return [(str(p), v4l2_name(str(p))) for p in video_nodes() if _v4l2_index(str(p)) == 0]


def find_camera(name: str) -> str:
    """The device path of the camera whose name contains `name` (case-insensitive; an exact name wins).

    NoCamera when no camera or more than one matches, listing the cameras; and where names cannot be
    read without opening the cameras (macOS, Windows: OpenCV gives no names), saying to use an index."""
    if not sys.platform.startswith("linux"):
        raise NoCamera(f"camera {name!r}: cameras cannot be chosen by name here (OpenCV gives no camera names "
                       f"on {sys.platform}): give an index, webcam = {{device = 0}} for the first; "
                       "`python -m wccl.devices` lists the cameras with their indices")
    cams = camera_names()
    want = name.strip().lower()
    found = [(d, n) for d, n in cams if n.lower() == want] or [(d, n) for d, n in cams if want in n.lower()]
    if len(found) == 1:
        return found[0][0]
    listed = ", ".join(f"{d} {n!r}" for d, n in cams) or "none (no /dev/video* device)"
    if not found:
        raise NoCamera(f"camera {name!r}: no camera has that name (cameras: {listed}); "
                       "`python -m wccl.devices` lists the cameras")
    raise NoCamera(f"camera {name!r}: {len(found)} cameras match ({', '.join(f'{d} {n!r}' for d, n in found)}): "
                   "give more of the name, or the device path")


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


def resolve_device(device: int | str) -> int | str:
    """`device` as OpenCV opens it: an index (an int, or a string of digits), a path (a string with a
    slash or a file extension, or an existing file), else a camera's name, or "name:" and part of one
    (`find_camera`: NoCamera when none or several match)."""
    if isinstance(device, int):
        return device
    text = device.strip()
    if text.lower().startswith("name:"):
        return find_camera(text[5:])
    if text.isdigit():
        return int(text)
    if "/" in text or "\\" in text or re.search(r"\.\w{2,4}$", text) or os.path.exists(text):
        return text
    return find_camera(text)


def _cannot_open(device: int | str, backend: str) -> str:
    if sys.platform == "darwin":
        return (f"camera {device}: cannot be opened (backend {backend}). macOS may not have allowed this program "
                "to use the camera: in System Settings > Privacy & Security > Camera, allow the terminal (or "
                "Python) running WCCL, then start again (the first open shows the permission dialog and fails "
                "until it is answered). Or another program is using it. A phone nearby (Continuity Camera) can "
                "take index 0: `python -m wccl.devices` lists the cameras")
    return (f"camera {device}: cannot be opened (backend {backend}); is another program using it? "
            "`python -m wccl.devices` lists the cameras")


def open_capture(device: int | str, backend: str = "auto"):
    """An opened cv2.VideoCapture for `device` (an index, a path, or a name: resolve_device), or NoCamera
    saying why not."""
    import cv2

    _quiet_opencv()
    device = resolve_device(device)
    why = _device_missing(device, backend)
    if why is not None:
        raise NoCamera(f"camera {device}: {why}; `python -m wccl.devices` lists the cameras")
    cap = cv2.VideoCapture(device, backend_id(backend))
    if not cap.isOpened():
        cap.release()
        raise NoCamera(_cannot_open(device, backend))
    return cap


def clipped_share(image: np.ndarray, bbox: tuple[int, int, int, int]) -> float:
    """The share of the pixels in `bbox` (x, y, w, h) with any channel at CLIPPED_LEVEL or above."""
    x, y, w, h = bbox
    x0, y0 = max(0, x), max(0, y)
    region = image[y0 : max(y0, y + h), x0 : max(x0, x + w)]
    if region.size == 0:
        return 0.0
    hot = region >= CLIPPED_LEVEL
    return float((hot.any(axis=2) if hot.ndim == 3 else hot).mean())


class WebcamCamera(ThreadedCamera):
    name = "webcam"
    rate_window_s = RATE_WINDOW_S

    def __init__(self, clock, options: Any, fps: float, node: str | None = None) -> None:
        """`options`: a config.WebcamOptions (device, backend, size, fps, mjpeg, buffers, locks, settle_s,
        lock_wait_s). Opens the camera, asks for the format, reads one image (NoCamera if it gives none)
        and starts the capture thread."""
        import cv2

        super().__init__(clock, buffer=options.buffer, node=node)
        self._cv2 = cv2
        self.options = options
        self.device = resolve_device(options.device)
        self.fps = options.fps or fps
        self._cap = open_capture(self.device, options.backend)
        self.backend = self._cap.getBackendName()
        self.settings: dict[str, Any] = {}
        cap = self._cap
        if options.mjpeg:
            self._set("fourcc", cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*"MJPG"))
        self._set("width", cv2.CAP_PROP_FRAME_WIDTH, options.width)
        self._set("height", cv2.CAP_PROP_FRAME_HEIGHT, options.height)
        self._set("fps", cv2.CAP_PROP_FPS, self.fps)
        self._set("buffersize", cv2.CAP_PROP_BUFFERSIZE, options.driver_buffers)
        ok, image = cap.read()
        if not ok or image is None:
            cap.release()
            raise NoCamera(f"camera {self.device}: opened, but it delivers no images "
                           f"(backend {self.backend}); try another device or resolution")
        self.size = (image.shape[1], image.shape[0])
        self.log.info("webcam_opened", device=str(self.device), backend=self.backend, width=self.size[0],
                      height=self.size[1], fps=cap.get(cv2.CAP_PROP_FPS), fourcc=self._fourcc(),
                      driver_buffers=options.driver_buffers, settle_s=options.settle_s,
                      lock_exposure=options.lock_exposure, lock_white_balance=options.lock_white_balance,
                      lock_focus=options.lock_focus)
        if self.size != (options.width, options.height):
            self.log.warning("webcam_size_mismatch", device=str(self.device), asked=f"{options.width}x{options.height}",
                             got=f"{self.size[0]}x{self.size[1]}", fourcc=self._fourcc(),
                             hint="the camera has no such mode in this format; the code is read at the size it "
                                  "gives (`python -m wccl.devices` lists its modes: choose one with width and "
                                  "height)")
        self._t_open = time.monotonic()
        # The capture rate over the first rate_window_s (capture thread).
        self._rate_t0: float | None = None
        self._rate_n = 0
        self._rate_done = False
        # The locks: state, and what code_seen() reported (written by the event loop, read by the thread).
        self._lock_asked = [n for n, on in (("exposure", options.lock_exposure),
                                            ("white balance", options.lock_white_balance),
                                            ("focus", options.lock_focus)) if on]
        self._state = "waiting" if self._lock_asked else "off"
        self._ignored: list[str] = []
        self._metering = False
        self._meter_steps = 0
        self._t_changed = 0.0  # when the exposure was last set (its effect shows METER_DELAY_S later)
        self._waiting_logged = False
        self._seen = threading.Lock()
        self._t_seen: float | None = None  # the first code_seen()
        self._code: tuple[tuple[int, int, int, int], np.ndarray | None, float] | None = None  # the latest
        self._start()

    # -- what the event loop calls ---------------------------------------------------------------
    def code_seen(self, bbox: tuple[int, int, int, int], image: np.ndarray | None = None) -> None:
        """The other screen's code is at `bbox` (x, y, w, h, camera pixels) of `image` (the capture it was
        found in, if given: the metering after the lock reads the code's region there; without one, in
        the capture thread's own newest image). Cheap and thread-safe: the capture thread acts on it."""
        now = time.monotonic()
        box = (int(bbox[0]), int(bbox[1]), int(bbox[2]), int(bbox[3]))
        with self._seen:
            if self._t_seen is None:
                self._t_seen = now
            self._code = (box, image, now)

    @property
    def lock_state(self) -> str:
        """Where the exposure, white balance and focus locks are, in words (for an aim screen)."""
        state = self._state
        if state == "off":
            return "off (auto exposure, white balance and focus, as configured)"
        if state == "waiting":
            return "waiting for the other screen's code"
        if state == "settling":
            return "settling"
        if state == "locked":
            return "locked, metering the code" if self._metering else "locked"
        if state == "unsupported":
            return f"not locked: {AVFOUNDATION}"
        return f"ignored by the driver ({', '.join(self._ignored)})"

    # -- the capture thread ----------------------------------------------------------------------
    def _fourcc(self) -> str:
        v = int(self._cap.get(self._cv2.CAP_PROP_FOURCC))
        return "".join(chr((v >> (8 * i)) & 0xFF) for i in range(4)).strip("\x00") or "?"

    def _set(self, name: str, prop: int, value: float) -> bool:
        """Set a property; True if the driver took it (set said yes, and it reads back as asked or at
        least changed)."""
        before = self._cap.get(prop)
        said = bool(self._cap.set(prop, value))
        now = self._cap.get(prop)
        took = said and (math.isclose(now, value, rel_tol=0.02, abs_tol=1e-6) or now != before)
        self.settings[name] = {"asked": value, "accepted": said, "reads": now, "took": took}
        self.log.info("webcam_setting", setting=name, asked=value, accepted=said, reads=now, took=took)
        return took

    def _manual_exposure_values(self) -> list[float]:
        # V4L2 passes the menu value through (1 = manual); DirectShow and others use 0.25 = manual.
        return [1] if self.backend == "V4L2" else [0.25, 1]

    def _apply_locks(self) -> None:
        """Fix exposure, white balance and focus at what auto chose (or at the configured values), and log
        which ones the driver took (`webcam_locked`) or not (`webcam_lock_ignored`)."""
        cv2, o = self._cv2, self.options
        if self.backend.upper() == "AVFOUNDATION" or sys.platform == "darwin":
            self._state, self._ignored = "unsupported", list(self._lock_asked)
            self.log.warning("webcam_lock_ignored", ignored=self._ignored, reason=AVFOUNDATION, means=IGNORED_MEANS)
            return
        ignored = []
        if o.lock_exposure:
            value = o.exposure if o.exposure is not None else self._cap.get(cv2.CAP_PROP_EXPOSURE)
            manual = any(self._set("auto_exposure", cv2.CAP_PROP_AUTO_EXPOSURE, m)
                         for m in self._manual_exposure_values())
            fixed = self._set("exposure", cv2.CAP_PROP_EXPOSURE, value)
            if not (manual and fixed):
                ignored.append("exposure")
        if o.lock_white_balance:
            kelvin = o.white_balance_k or self._cap.get(cv2.CAP_PROP_WB_TEMPERATURE)
            fixed = self._set("auto_white_balance", cv2.CAP_PROP_AUTO_WB, 0)
            if kelvin and kelvin > 0:
                fixed = self._set("white_balance_k", cv2.CAP_PROP_WB_TEMPERATURE, kelvin) and fixed
            if not fixed:
                ignored.append("white balance")
        if o.lock_focus and not self._set("autofocus", cv2.CAP_PROP_AUTOFOCUS, 0):
            ignored.append("focus")
        values = {k: v["reads"] for k, v in self.settings.items()
                  if k in ("auto_exposure", "exposure", "auto_white_balance", "white_balance_k", "autofocus")}
        self._ignored = ignored
        if ignored:
            self._state = "ignored"
            self.log.warning("webcam_lock_ignored", ignored=ignored,
                             locked=[n for n in self._lock_asked if n not in ignored],
                             reason="the driver refused the setting, or it reads back unchanged",
                             means=IGNORED_MEANS, **values)
        else:
            self._state = "locked"
            self.log.info("webcam_locked", **values)
        if o.lock_exposure and "exposure" not in ignored:
            self._metering, self._meter_steps, self._t_changed = True, 0, time.monotonic()

    def _meter(self, image: np.ndarray, now: float) -> None:
        """One look at the code's region after the lock: a step down of the exposure while it is clipped."""
        if now - self._t_changed < METER_DELAY_S:
            return
        with self._seen:
            bbox, seen_image, t_seen = self._code
        if seen_image is not None:  # the decoder hands over the captures it found the code in
            if t_seen >= self._t_changed + METER_DELAY_S:
                image = seen_image
            elif now - self._t_changed < METER_DELAY_S + METER_WAIT_S:
                return  # wait for one taken after the change; if none comes, the thread's own will do
        clipped = clipped_share(image, bbox)
        exposure_prop = self._cv2.CAP_PROP_EXPOSURE
        if clipped > CLIPPED_SHARE and self._meter_steps < EXPOSURE_STEPS:
            if self._set("exposure", exposure_prop, self._cap.get(exposure_prop) * EXPOSURE_STEP):
                self._meter_steps += 1
                self._t_changed = now
                return
            outcome = "the driver refused a lower exposure: the code stays partly clipped"
        elif clipped > CLIPPED_SHARE:
            outcome = f"still clipped after {EXPOSURE_STEPS} steps down: dim the other screen"
        else:
            outcome = "the code is not clipped"
        self._metering = False
        (self.log.info if clipped <= CLIPPED_SHARE else self.log.warning)(
            "webcam_metered", clipped=round(clipped, 4), steps=self._meter_steps,
            exposure=self._cap.get(exposure_prop), outcome=outcome)

    def _steer(self, image: np.ndarray, now: float) -> None:
        """The locks' progress, between two captures: wait for the code, settle, lock, meter."""
        if self._state == "waiting":
            with self._seen:
                t_seen = self._t_seen
            if t_seen is None:
                if not self._waiting_logged and now - self._t_open >= self.options.lock_wait_s:
                    self._waiting_logged = True
                    self.log.warning("webcam_lock_waiting", waited_s=round(now - self._t_open, 1),
                                     hint="no code in view yet: aim the camera at the other screen "
                                          "(exposure, white balance and focus stay on auto until then)")
                return
            self._state = "settling"
        if self._state == "settling":
            if now - self._t_seen >= self.options.settle_s:
                self._apply_locks()
            return
        if self._metering:
            self._meter(image, now)

    def _rate_hint(self, fourcc: str) -> str:
        hints = []
        if fourcc.upper() in UNCOMPRESSED:
            hints.append(f"uncompressed video ({fourcc}) at 720p is limited by USB 2 to about 10 fps: "
                         + ("set mjpeg = true" if not self.options.mjpeg
                            else "the camera did not take MJPEG at this size (`python -m wccl.devices` lists "
                                 "its modes)"))
        hints.append("a dark room lengthens the exposure, which slows the camera: light the room")
        if self.backend.upper() == "AVFOUNDATION" or sys.platform == "darwin":
            hints.append("macOS AVFoundation follows the camera's active format, whatever rate is asked")
        return "; or ".join(hints)

    def _measure_rate(self, t: float) -> None:
        """The capture rate over the first rate_window_s: `webcam_rate`, and a warning when it is short."""
        if self._rate_t0 is None:
            self._rate_t0 = t
            return
        self._rate_n += 1
        span = t - self._rate_t0
        if span < self.rate_window_s:
            return
        self._rate_done = True
        measured = self._rate_n / span
        fourcc = self._fourcc()
        self.log.info("webcam_rate", asked=self.fps, measured=round(measured, 2), fourcc=fourcc,
                      seconds=round(span, 2))
        if measured < RATE_SHORT * self.fps:
            self.log.warning("webcam_rate_mismatch", asked=self.fps, measured=round(measured, 2), fourcc=fourcc,
                             size=f"{self.size[0]}x{self.size[1]}", hint=self._rate_hint(fourcc))

    def _read(self) -> tuple[np.ndarray, float] | None:
        if not self._cap.grab():
            raise RuntimeError(f"camera {self.device}: grab failed (unplugged?)")
        t = t_grab = time.monotonic()
        if self.backend == "V4L2":
            # The V4L2 buffer timestamp (ms, CLOCK_MONOTONIC): when the driver got the frame.
            ms = self._cap.get(self._cv2.CAP_PROP_POS_MSEC)
            if 0.0 <= t - ms / 1000.0 < 0.5:
                t = ms / 1000.0
        ok, image = self._cap.retrieve()
        if not ok or image is None:
            raise RuntimeError(f"camera {self.device}: could not decode an image")
        if not self._rate_done:
            self._measure_rate(t_grab)
        if self._state != "off":
            self._steer(image, t_grab)
        return image, t

    def _release(self) -> None:
        self._cap.release()
