"""The real-webcam reader (wccl/media/webcam.py) against cameras as users have them.

A fake cv2.VideoCapture stands in for the device: it can refuse to open, give another size or pixel format
or rate than asked, ignore exposure / white balance / focus, and film a scene whose brightness follows the
exposure. A recorded video goes through the real OpenCV reader. No camera is needed.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time

import cv2
import numpy as np
import pytest
from structlog.testing import capture_logs

from wccl.config import WebcamOptions
from wccl.media import webcam
from wccl.media.display import NoCamera
from wccl.media.webcam import WebcamCamera
from wccl.runtime.timebase import NodeClock

LOCKS = {cv2.CAP_PROP_AUTO_EXPOSURE: "exposure", cv2.CAP_PROP_EXPOSURE: "exposure",
         cv2.CAP_PROP_AUTO_WB: "white balance", cv2.CAP_PROP_WB_TEMPERATURE: "white balance",
         cv2.CAP_PROP_AUTOFOCUS: "focus", cv2.CAP_PROP_FOCUS: "focus"}
CODE = (40, 30, 80, 60)  # where the fake scene's bright code is (x, y, w, h)


def fourcc_value(text: str) -> float:
    return float(cv2.VideoWriter_fourcc(*text))


class FakeCapture:
    """A cv2.VideoCapture as a laptop's camera behaves.

    `ignore`: the lock groups ("exposure", "white balance", "focus") whose sets do nothing; `pretend`: they
    say yes all the same. `size`: the only size it gives; `fourcc`: the only pixel format; `rate`: the
    frames per second it delivers. `gain`: the code's brightness per unit of exposure (255 caps it)."""

    def __init__(self, device, api=None, *, opens=True, ignore=(), pretend=False, size=None, fourcc=None,
                 rate=60.0, gain=0.5, backend="V4L2"):
        self.device, self.api, self.opens = device, api, opens
        self.ignore, self.pretend, self.fixed_size, self.fixed_fourcc = set(ignore), pretend, size, fourcc
        self.rate, self.gain, self.backend = rate, gain, backend
        self.props = {cv2.CAP_PROP_FOURCC: fourcc_value(fourcc or "YUYV"), cv2.CAP_PROP_FRAME_WIDTH: 640.0,
                      cv2.CAP_PROP_FRAME_HEIGHT: 480.0, cv2.CAP_PROP_FPS: 30.0, cv2.CAP_PROP_BUFFERSIZE: 4.0,
                      cv2.CAP_PROP_AUTO_EXPOSURE: 3.0, cv2.CAP_PROP_EXPOSURE: 300.0, cv2.CAP_PROP_AUTO_WB: 1.0,
                      cv2.CAP_PROP_WB_TEMPERATURE: 4600.0, cv2.CAP_PROP_AUTOFOCUS: 1.0, cv2.CAP_PROP_FOCUS: 30.0,
                      cv2.CAP_PROP_POS_MSEC: 0.0}
        if size:
            self.props[cv2.CAP_PROP_FRAME_WIDTH], self.props[cv2.CAP_PROP_FRAME_HEIGHT] = map(float, size)
        self.sets: list[tuple[float, int, float]] = []  # (time.monotonic(), prop, value) of every set
        self.released = False
        self._next = 0.0

    def isOpened(self):  # OpenCV's names
        return self.opens

    def getBackendName(self):
        return self.backend

    def get(self, prop):
        return self.props.get(prop, 0.0)

    def set(self, prop, value):
        self.sets.append((time.monotonic(), prop, float(value)))
        if LOCKS.get(prop) in self.ignore:
            return self.pretend
        if prop in (cv2.CAP_PROP_FRAME_WIDTH, cv2.CAP_PROP_FRAME_HEIGHT) and self.fixed_size:
            return True
        if prop == cv2.CAP_PROP_FOURCC and self.fixed_fourcc:
            return True
        self.props[prop] = float(value)
        return True

    def grab(self):
        now = time.monotonic()
        self._next = max(self._next + 1.0 / self.rate, now)
        time.sleep(max(0.0, self._next - now))
        return True

    def retrieve(self):
        w, h = int(self.props[cv2.CAP_PROP_FRAME_WIDTH]), int(self.props[cv2.CAP_PROP_FRAME_HEIGHT])
        image = np.full((h, w, 3), 90, np.uint8)
        x, y, cw, ch = CODE
        image[y : y + ch, x : x + cw] = min(255, int(self.props[cv2.CAP_PROP_EXPOSURE] * self.gain))
        return True, image

    def read(self):
        return self.grab() and self.retrieve()

    def release(self):
        self.released = True


@pytest.fixture
def fake(monkeypatch):
    """fake(**behaviour) makes cv2.VideoCapture open FakeCaptures; returns the list of those opened."""
    made: list[FakeCapture] = []

    def install(**behaviour):
        def open_(device, api=None):
            made.append(FakeCapture(device, api, **behaviour))
            return made[-1]

        monkeypatch.setattr(cv2, "VideoCapture", open_)
        monkeypatch.setattr(webcam, "_device_missing", lambda device, backend: None)
        return made

    return install


def run_camera(options: WebcamOptions, body, fps: float = 30.0):
    """Open a WebcamCamera in a running loop, run `await body(cam)`, close it; (body's result, logs)."""
    async def go():
        cam = WebcamCamera(NodeClock(), options, fps=fps)
        try:
            return await body(cam)
        finally:
            cam.close()

    with capture_logs() as logs:
        result = asyncio.run(go())
    return result, logs


async def until(cond, timeout: float = 5.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        await asyncio.sleep(0.02)


def events(logs, name):
    return [e for e in logs if e["event"] == name]


# ------------------------------------------------------------------------------------------ opening
def test_driver_buffers_and_the_asked_format(fake):
    made = fake()

    async def body(cam):
        return await cam.recv()

    (image, _), logs = run_camera(WebcamOptions(device=0, driver_buffers=5, lock_exposure=False,
                                                lock_white_balance=False, lock_focus=False), body)
    cap = made[0]
    assert cap.props[cv2.CAP_PROP_BUFFERSIZE] == 5
    assert cap.props[cv2.CAP_PROP_FOURCC] == fourcc_value("MJPG")
    assert image.shape == (720, 1280, 3) and not events(logs, "webcam_size_mismatch")
    assert cap.released
    _, logs = run_camera(WebcamOptions(device=0), body)
    assert made[1].props[cv2.CAP_PROP_BUFFERSIZE] == 3  # the default


def test_a_size_the_camera_does_not_have_is_warned_about_at_once(fake):
    fake(size=(640, 480))

    async def body(cam):
        return cam.size

    size, logs = run_camera(WebcamOptions(device=0), body)
    assert size == (640, 480)
    (warn,) = events(logs, "webcam_size_mismatch")
    assert warn["log_level"] == "warning" and warn["asked"] == "1280x720" and warn["got"] == "640x480"
    assert "python -m wccl.devices" in warn["hint"]


@pytest.mark.parametrize("mjpeg", [True, False])
def test_a_slow_uncompressed_camera_is_warned_about_early(fake, monkeypatch, mjpeg):
    fake(fourcc="YUYV", rate=10.0)  # asked MJPEG 720p at 30 fps; gives YUYV at 10
    monkeypatch.setattr(WebcamCamera, "rate_window_s", 0.6)

    async def body(cam):
        t0 = time.monotonic()
        while not cam._rate_done:
            await cam.recv()
        return time.monotonic() - t0

    took, logs = run_camera(WebcamOptions(device=0, mjpeg=mjpeg), body, fps=30.0)
    assert took < 5.0
    (rate,) = events(logs, "webcam_rate")
    assert 7.0 < rate["measured"] < 12.0 and rate["asked"] == 30.0 and rate["fourcc"] == "YUYV"
    (warn,) = events(logs, "webcam_rate_mismatch")
    assert warn["log_level"] == "warning" and warn["fourcc"] == "YUYV" and 7.0 < warn["measured"] < 12.0
    assert "USB 2" in warn["hint"] and "dark room" in warn["hint"]
    assert ("set mjpeg = true" in warn["hint"]) == (not mjpeg)


def test_a_camera_at_the_asked_rate_is_not_warned_about(fake, monkeypatch):
    fake(fourcc="MJPG", rate=30.0)
    monkeypatch.setattr(WebcamCamera, "rate_window_s", 0.6)

    async def body(cam):
        while not cam._rate_done:
            await cam.recv()

    _, logs = run_camera(WebcamOptions(device=0, fps=15), body)
    (rate,) = events(logs, "webcam_rate")
    assert rate["measured"] > 20.0
    assert not events(logs, "webcam_rate_mismatch")


def test_macos_permission_is_named_when_the_camera_does_not_open(fake, monkeypatch):
    made = fake(opens=False)
    monkeypatch.setattr("sys.platform", "darwin")
    with pytest.raises(NoCamera) as e:
        webcam.open_capture(0)
    text = str(e.value)
    assert "Privacy & Security > Camera" in text and "terminal (or Python)" in text
    assert "start again" in text and "Continuity Camera" in text and "python -m wccl.devices" in text
    assert made[0].released and made[0].api == cv2.CAP_AVFOUNDATION
    monkeypatch.setattr("sys.platform", "linux")
    with pytest.raises(NoCamera) as e:
        webcam.open_capture(0)
    assert "Privacy" not in str(e.value) and "cannot be opened" in str(e.value)


# ------------------------------------------------------------------------------------------ by name
@pytest.fixture
def cameras(tmp_path, monkeypatch):
    """A Linux machine with a laptop camera (a capture node and its metadata node) and a USB camera."""
    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    for node, name, index in [("video0", "Integrated Camera: Integrated C", 0),
                              ("video1", "Integrated Camera: Integrated C", 1),
                              ("video2", "HD Pro Webcam C920", 0), ("video3", "HD Pro Webcam C920", 1)]:
        (sysfs / node).mkdir(parents=True)
        (sysfs / node / "name").write_text(name + "\n")
        (sysfs / node / "index").write_text(f"{index}\n")
        dev.mkdir(exist_ok=True)
        (dev / node).write_text("")
    monkeypatch.setattr(webcam, "SYS_V4L", sysfs)
    monkeypatch.setattr(webcam, "DEV", dev)
    monkeypatch.setattr("sys.platform", "linux")
    return dev


def test_a_camera_is_found_by_part_of_its_name(cameras):
    from wccl.media.webcam import find_camera

    assert find_camera("c920") == str(cameras / "video2")
    assert find_camera("integrated") == str(cameras / "video0")  # the capture node, not its metadata node
    assert find_camera("HD Pro Webcam C920") == str(cameras / "video2")
    assert webcam.resolve_device("name:Webcam") == str(cameras / "video2")
    assert webcam.resolve_device("2") == 2 and webcam.resolve_device(1) == 1
    assert webcam.resolve_device("/dev/video7") == "/dev/video7"
    assert webcam.resolve_device("room.mp4") == "room.mp4"


@pytest.mark.parametrize("name, message", [
    ("Logitech", "no camera has that name"),
    ("name:c", "2 cameras match"),
])
def test_a_name_that_matches_no_camera_or_several_lists_them(cameras, name, message):
    with pytest.raises(NoCamera) as e:
        webcam.resolve_device(name)
    text = str(e.value)
    assert message in text
    assert "Integrated Camera" in text and "C920" in text


def test_names_elsewhere_than_linux_ask_for_an_index(monkeypatch):
    monkeypatch.setattr("sys.platform", "darwin")
    with pytest.raises(NoCamera, match=r"cannot be chosen by name.*give an index"):
        webcam.resolve_device("FaceTime")


def test_the_webcam_opens_the_camera_named(cameras, fake):
    made = fake()

    async def body(cam):
        return cam.device

    device, logs = run_camera(WebcamOptions(device="c920"), body)
    assert device == str(cameras / "video2") and made[0].device == device
    assert events(logs, "webcam_opened")[0]["device"] == device


# -------------------------------------------------------------------------------------------- locks
def lock_sets(cap: FakeCapture) -> list[tuple[float, int, float]]:
    return [s for s in cap.sets if s[1] in LOCKS]


def test_locks_wait_for_the_code_then_settle_then_lock(fake, monkeypatch):
    made = fake(gain=0.5)  # exposure 300: the code at 150, not clipped
    monkeypatch.setattr(webcam, "METER_DELAY_S", 0.05)
    opts = WebcamOptions(device=0, settle_s=0.4, lock_wait_s=0.3)

    async def body(cam):
        states = [cam.lock_state]
        await asyncio.sleep(0.6)
        states.append(cam.lock_state)
        assert not lock_sets(made[0])  # nothing locked while no code is in view: not even the focus
        t_seen = time.monotonic()
        cam.code_seen(CODE, None)
        await until(lambda: cam.lock_state != "waiting for the other screen's code")
        states.append(cam.lock_state)
        await until(lambda: cam.lock_state == "locked")
        return states, t_seen

    (states, t_seen), logs = run_camera(opts, body)
    assert states == ["waiting for the other screen's code"] * 2 + ["settling"]
    cap = made[0]
    assert min(t for t, _, _ in lock_sets(cap)) - t_seen >= 0.4  # settle_s after the code was first seen
    assert cap.props[cv2.CAP_PROP_AUTO_EXPOSURE] == 1 and cap.props[cv2.CAP_PROP_EXPOSURE] == 300
    assert cap.props[cv2.CAP_PROP_AUTO_WB] == 0 and cap.props[cv2.CAP_PROP_AUTOFOCUS] == 0
    assert len(events(logs, "webcam_lock_waiting")) == 1
    (locked,) = events(logs, "webcam_locked")
    assert locked["exposure"] == 300 and locked["autofocus"] == 0 and locked["white_balance_k"] == 4600
    (metered,) = events(logs, "webcam_metered")
    assert metered["steps"] == 0 and metered["outcome"] == "the code is not clipped"
    assert not events(logs, "webcam_lock_ignored")


@pytest.mark.parametrize("gain, steps, final", [(1.3, 2, 192.0), (10.0, 4, 300 * 0.8 ** 4)])
def test_a_clipped_code_lowers_the_exposure(fake, monkeypatch, gain, steps, final):
    made = fake(gain=gain)  # 1.3: 300 and 240 clip the code (390, 312), 192 does not (249)
    monkeypatch.setattr(webcam, "METER_DELAY_S", 0.05)

    async def body(cam):
        cam.code_seen(CODE)
        await until(lambda: cam.lock_state == "locked")

    _, logs = run_camera(WebcamOptions(device=0, settle_s=0.0), body)
    assert math.isclose(made[0].props[cv2.CAP_PROP_EXPOSURE], final)
    (metered,) = events(logs, "webcam_metered")
    assert metered["steps"] == steps and math.isclose(metered["exposure"], final)
    if steps < webcam.EXPOSURE_STEPS:
        assert metered["log_level"] == "info" and metered["clipped"] <= webcam.CLIPPED_SHARE
    else:
        assert metered["log_level"] == "warning" and "still clipped" in metered["outcome"]


def test_metering_reads_the_image_the_code_was_found_in(fake, monkeypatch):
    fake(gain=0.5)  # the camera's own images are not clipped ...
    monkeypatch.setattr(webcam, "METER_DELAY_S", 0.05)
    white = np.full((720, 1280, 3), 255, np.uint8)  # ... the one the decoder hands over is

    async def body(cam):
        cam.code_seen(CODE, white)
        await until(lambda: cam.lock_state == "locked, metering the code")
        for _ in range(20):
            await asyncio.sleep(0.06)
            cam.code_seen(CODE, white)

    _, logs = run_camera(WebcamOptions(device=0, settle_s=0.0), body)
    assert any(e["setting"] == "exposure" and e["asked"] < 300 for e in events(logs, "webcam_setting"))


@pytest.mark.parametrize("pretend", [False, True])
def test_a_driver_that_ignores_the_locks_is_named(fake, pretend):
    made = fake(ignore=("exposure", "white balance"), pretend=pretend)

    async def body(cam):
        cam.code_seen(CODE)
        await until(lambda: cam.lock_state.startswith("ignored"))
        return cam.lock_state

    state, logs = run_camera(WebcamOptions(device=0, settle_s=0.0), body)
    assert state == "ignored by the driver (exposure, white balance)"
    (warn,) = events(logs, "webcam_lock_ignored")
    assert warn["log_level"] == "warning" and warn["ignored"] == ["exposure", "white balance"]
    assert warn["locked"] == ["focus"] and "keep the light steady" in warn["means"]
    assert made[0].props[cv2.CAP_PROP_AUTOFOCUS] == 0
    assert not events(logs, "webcam_locked") and not events(logs, "webcam_metered")


@pytest.mark.parametrize("backend, platform", [("AVFOUNDATION", "linux"), ("V4L2", "darwin")])
def test_avfoundation_is_not_asked_to_lock(fake, monkeypatch, backend, platform):
    made = fake(backend=backend)

    async def body(cam):
        monkeypatch.setattr("sys.platform", platform)
        cam.code_seen(CODE)
        await until(lambda: cam.lock_state.startswith("not locked"))
        return cam.lock_state

    state, logs = run_camera(WebcamOptions(device=0, settle_s=0.0), body)
    assert state == "not locked: OpenCV's AVFoundation backend sets only size and frame rate"
    (warn,) = events(logs, "webcam_lock_ignored")
    assert warn["reason"] == webcam.AVFOUNDATION and warn["ignored"] == ["exposure", "white balance", "focus"]
    assert not lock_sets(made[0])


def test_locks_off_never_lock(fake):
    made = fake()

    async def body(cam):
        cam.code_seen(CODE)
        await asyncio.sleep(0.3)
        return cam.lock_state

    state, logs = run_camera(WebcamOptions(device=0, settle_s=0.0, lock_exposure=False, lock_white_balance=False,
                                           lock_focus=False), body)
    assert state.startswith("off")
    assert not lock_sets(made[0]) and not events(logs, "webcam_locked") and not events(logs, "webcam_lock_ignored")


def test_only_the_focus_lock(fake):
    made = fake()

    async def body(cam):
        cam.code_seen(CODE)
        await until(lambda: cam.lock_state == "locked")

    _, logs = run_camera(WebcamOptions(device=0, settle_s=0.0, lock_exposure=False, lock_white_balance=False), body)
    assert {p for _, p, _ in lock_sets(made[0])} == {cv2.CAP_PROP_AUTOFOCUS}
    assert events(logs, "webcam_locked") and not events(logs, "webcam_metered")


# ------------------------------------------------------------------------------- the decoder's hook
def test_the_decoder_tells_the_webcam_where_the_code_is():
    """The FrameDecoder emits CodeSeen with the code's box; the CameraReader hands it to a camera with code_seen."""
    from actors.camera_reader import CameraReader
    from actors.frame_decoder import FrameDecoder
    from protocols import layout, transfer
    from protocols.layout import GridLayout
    from protocols.link import LinkCodec
    from protocols.messages import CodeSeen
    from wccl.runtime.actor import ActorContext, Mailbox

    codec = LinkCodec(GridLayout(36, 70, 8, 16), 0.8)
    frame = codec.encode(b"x" * 100, count=1, session=1, sender=1, stream="sync", step=0)[0]
    image = layout.render(frame, codec.layout, 1280, 720, sender=1)
    seen: list = []

    class Camera:
        def __init__(self):
            self.images = [image]

        async def recv(self):
            if self.images:
                return self.images.pop(), 0.0
            await asyncio.Event().wait()

        def code_seen(self, bbox, image=None):
            seen.append((bbox, image))

    async def go():
        clock = NodeClock()
        reader_box = Mailbox("r", 1, "drop_oldest")

        async def to_reader(msg):  # the supervisor's wiring, by type: CodeSeen goes to the CameraReader
            if isinstance(msg, CodeSeen):
                await reader_box.put(msg)

        decoder = FrameDecoder(ActorContext("alice", "frame_decoder", clock, Mailbox("d", 8, "drop_oldest"), to_reader),
                               codec, 1, ["alice", "bob"], transfer.TransferAssembler())

        async def emit(msg):
            await decoder.handle(msg)

        reader = CameraReader(ActorContext("alice", "camera_reader", clock, reader_box, emit), Camera())
        task = asyncio.create_task(reader.run())
        await until(lambda: seen)
        await until(lambda: "camera_seen" in decoder.ctx.results)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return decoder.ctx.results

    results = asyncio.run(go())
    (bbox, img), = seen
    assert img is image
    x, y, w, h = bbox
    assert w > 600 and h > 300 and 0 <= x < 1280 and 0 <= y < 720  # the code fills most of the image
    # its first frame from bob is in what its camera saw at once, before any link report (a rank that has
    # heard of a peer never says its camera read no frame of it)
    assert results["camera_problem"] is None and "reads the screens of bob" in results["camera_seen"], results


# ------------------------------------------------------------------------------ a recorded video
def test_a_recorded_video_through_the_webcam_reader(tmp_path):
    path = tmp_path / "recorded.avi"
    w, h, n = 320, 240, 30
    out = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (w, h))
    assert out.isOpened()
    for i in range(n):
        img = np.zeros((h, w, 3), np.uint8)
        img[:, : 10 * (i + 1)] = 255  # a bar one step longer each frame
        out.write(img)
    out.release()
    opts = WebcamOptions(device=str(path), backend="any", width=w, height=h, buffer=64)

    async def body(cam):
        got = []
        for _ in range(n - 1):  # the first frame was read when the camera opened
            got.append(await cam.recv())
        return got

    got, logs = run_camera(opts, body)
    times = [t for _, t in got]
    assert all(b > a for a, b in itertools.pairwise(times))
    bars = [int((img[h // 2] > 128).all(axis=1).sum()) for img, _ in got]
    assert bars == [10 * (i + 2) for i in range(n - 1)]
    assert not events(logs, "webcam_size_mismatch")
