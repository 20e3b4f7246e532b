"""Real devices (issue 8): no-display and no-camera paths, the device list, the webcam reader, windows.

Everything that opens a window runs in a subprocess on a virtual display (Xvfb, started here):
OpenCV's Qt backend keeps its X connection for the life of the process, and must not outlive it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from wccl.config import ConfigError, parse_config
from wccl.media.display import EXIT_NO_CAMERA, EXIT_NO_DISPLAY, NoCamera, NoDisplay, probe_display
from wccl.media.window import draw_overlay, free_bands
from wccl.runtime.timebase import NodeClock

from conftest import IN_CI, ROOT, needs_tools, run_virtual, shipped_config_dict

needs_xvfb = needs_tools("Xvfb")


def _env_without_display(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _message_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def xdisplay():
    from wccl.media.xvfb import VirtualDisplay

    if shutil.which("Xvfb") is None and not IN_CI:
        pytest.skip("Xvfb is not installed (.ci/run installs it)")
    with VirtualDisplay(1400, 800) as d:
        yield d


# ------------------------------------------------------------------------------------- no display
def test_node_without_display_says_so_and_exits_3():
    r = _run(["-m", "wccl.node", "--config", "rooms/two-laptops.toml", "--node", "alice"], _env_without_display())
    assert r.returncode == EXIT_NO_DISPLAY, (r.returncode, r.stderr)
    lines = _message_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("wccl: no display: DISPLAY is not set")
    assert "Traceback" not in r.stderr + r.stdout


def test_node_with_unreachable_display_exits_3_without_an_abort():
    # Qt would abort the process (SIGABRT) on an X server it cannot reach: we must never get that far.
    r = _run(["-m", "wccl.node", "--config", "rooms/two-laptops.toml", "--node", "bob"],
             _env_without_display(DISPLAY=":20093"))
    assert r.returncode == EXIT_NO_DISPLAY, (r.returncode, r.stderr)
    assert r.returncode != -signal.SIGABRT
    lines = _message_lines(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("wccl: display :20093: cannot connect to the X server"), r.stderr


def test_wayland_without_xwayland_is_named():
    os_env = dict(os.environ)
    try:
        os.environ.pop("DISPLAY", None)
        os.environ["WAYLAND_DISPLAY"] = "wayland-0"
        if not sys.platform.startswith("linux"):
            pytest.skip("X11 check is for Linux")
        with pytest.raises(NoDisplay, match="Wayland"):
            probe_display()
    finally:
        os.environ.clear()
        os.environ.update(os_env)


def test_window_screen_raises_no_display_in_process():
    from wccl.media.window import WindowScreen

    async def go():
        WindowScreen(NodeClock(), "never", 320, 200, display=":20094")

    with pytest.raises(NoDisplay, match=":20094"):
        run_virtual(go)


# -------------------------------------------------------------------------------------- no camera
NO_CAMERA_ROOM = textwrap.dedent("""
    [room]
    medium = "hardware"
    clock = "realtime"

    [[room.nodes]]
    name = "alice"
    roles = ["server", "worker"]
    camera = "webcam"
    screen = "recording"
    webcam = {{ device = {device!r} }}

    [[room.nodes]]
    name = "bob"
    roles = ["worker"]
    camera = "webcam"
    screen = "recording"

    [recovery]
    checkpoint_every = 0
""").replace("'", '"')


@pytest.mark.parametrize("device", ["/dev/video63", 63])
def test_node_without_camera_says_so_and_exits_4(tmp_path, device):
    cfg = tmp_path / "room.toml"
    cfg.write_text(NO_CAMERA_ROOM.format(device=device))
    r = _run(["-m", "wccl.node", "--config", str(cfg), "--node", "alice"], _env_without_display())
    assert r.returncode == EXIT_NO_CAMERA, (r.returncode, r.stderr)
    lines = _message_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("wccl: camera ") and "python -m wccl.devices" in lines[0]
    assert "Traceback" not in r.stderr + r.stdout


def test_open_capture_raises_no_camera():
    from wccl.media.webcam import open_capture

    with pytest.raises(NoCamera, match="video63"):
        open_capture("/dev/video63")


# ---------------------------------------------------------------------------------------- config
def _room(**node_updates):
    data = shipped_config_dict()
    data["room"].update(node_updates.pop("room", {}))
    for node in data["room"]["nodes"]:
        node.update(node_updates)
    return data


@pytest.mark.parametrize("updates, message", [
    (dict(camera="webcam"), "camera 'webcam' needs medium 'hardware'"),
    (dict(screen="window"), "screen 'window' needs medium 'hardware' or 'desktop'"),
    (dict(camera="x11grab", screen="window", room={"medium": "hardware", "clock": "realtime"}),
     "camera 'x11grab' needs medium 'desktop'"),
    (dict(camera="webcam", screen="window", room={"medium": "hardware"}), 'set clock = "realtime"'),
    (dict(webcam={"device": 0}), "webcam options need camera = 'webcam'"),
    (dict(camera="webcam", screen="window", webcam={"device": 0, "fps": 0},
          room={"medium": "hardware", "clock": "realtime"}), "webcam.fps"),
    (dict(camera="webcam", screen="window", webcam={"exposure_lock": True},
          room={"medium": "hardware", "clock": "realtime"}), "unknown key"),
])
def test_media_config_rules(updates, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(_room(**updates), "test")


def test_shipped_room_configs_load():
    from wccl.config import load_config

    two = load_config(ROOT / "rooms/two-laptops.toml")
    assert two.room.medium == "hardware" and [n.camera for n in two.room.nodes] == ["webcam", "webcam"]
    assert all(n.window.fullscreen for n in two.room.nodes)
    three = load_config(ROOT / "rooms/three-laptops.toml")
    assert [n.name for n in three.room.nodes] == ["alice", "bob", "carol"]
    loop = load_config(ROOT / "rooms/loopback.toml")
    assert loop.room.medium == "desktop" and {n.camera for n in loop.room.nodes} == {"x11grab"}


def test_virtual_clock_override_is_refused_for_real_devices():
    r = _run(["-m", "wccl.node", "--config", "rooms/two-laptops.toml", "--node", "alice", "--clock", "virtual"],
             _env_without_display())
    assert r.returncode == 2 and "realtime" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------ device list
def test_devices_lists_cameras_and_displays():
    r = _run(["-m", "wccl.devices", "--no-read"], _env_without_display())
    assert r.returncode == 0, r.stderr
    assert "Cameras:" in r.stdout and "Displays:" in r.stdout
    assert "DISPLAY is not set" in r.stdout
    r = _run(["-m", "wccl.devices", "--json", "--no-read"], _env_without_display())
    report = json.loads(r.stdout)
    assert report["displays"]["display"] is None and isinstance(report["cameras"], list)


@needs_xvfb
def test_devices_sees_a_virtual_display(xdisplay):
    r = _run(["-m", "wccl.devices", "--json", "--no-read"], xdisplay.env())
    assert r.returncode == 0, r.stderr
    disp = json.loads(r.stdout)["displays"]
    assert disp["display"] == xdisplay.name and disp["screens"] == [[1400, 800]]


# --------------------------------------------------------------------------------- webcam reader
def _write_video(path, n: int, w: int = 160, h: int = 120) -> None:
    import av

    with av.open(str(path), "w") as c:
        s = c.add_stream("mjpeg", rate=30)
        s.width, s.height, s.pix_fmt = w, h, "yuvj420p"
        for i in range(n):
            img = np.zeros((h, w, 3), np.uint8)
            img[:, : (i * 7) % w] = 255  # a bar that grows frame by frame: which frame is which
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="bgr24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


def test_webcam_reader_thread_timestamps_and_drops(tmp_path):
    """A video file through the webcam reader (backend "any"): images arrive in order with increasing
    times, the ring keeps the newest and counts what it dropped, and the end of the stream is an error."""
    from wccl.config import WebcamOptions
    from wccl.media.capture import CameraLost
    from wccl.media.webcam import WebcamCamera

    video = tmp_path / "cam.avi"
    _write_video(video, 60)
    opts = WebcamOptions(device=str(video), backend="any", lock_exposure=False, lock_white_balance=False,
                         lock_focus=False, mjpeg=False, buffer=3)

    async def go():
        cam = WebcamCamera(NodeClock(), opts, fps=30.0)
        for _ in range(200):  # the file reads far faster than it is taken: the ring overflows
            if cam.ended:
                break
            await asyncio.sleep(0.05)
        got = []
        with pytest.raises(CameraLost):
            while True:
                got.append(await cam.recv())
        stats = cam.stats()
        cam.close()
        return got, stats

    got, stats = asyncio.run(go())
    assert stats["captured"] == 59  # 60 frames, the first read when the camera opened
    assert stats["dropped"] == 59 - 3 and len(got) == 3 and stats["delivered"] == 3
    times = [t for _, t in got]
    assert times == sorted(times)
    widths = [int((img[60] > 128).all(axis=1).sum()) for img, _ in got]
    assert widths == sorted(widths) and widths[-1] == (59 * 7) % 160  # the newest frames, in order
    assert got[0][0].shape == (120, 160, 3)


# -------------------------------------------------------------------------------------- overlay
@pytest.mark.parametrize("rows, cols, cell_px, w, h", [(36, 70, 16, 1280, 720), (60, 110, 10, 1280, 720),
                                                       (40, 70, 8, 640, 400)])
def test_overlay_leaves_the_code_readable(rows, cols, cell_px, w, h):
    import cv2

    from protocols import layout, streams, transfer
    from protocols.layout import GridLayout
    from protocols.link import LinkCodec
    from wccl.imaging import reader

    codec = LinkCodec(GridLayout(rows, cols, 8, cell_px), 0.8)
    data = np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8).tobytes()
    frame = codec.encode(data, count=1, session=1, sender=1, stream="sync", step=0)[0]
    image = layout.render(frame, codec.layout, w, h, sender=1)
    shown, drawn = draw_overlay(image, ["WCCL is starting: clocks are syncing over the light.",
                                        "Point every camera at the other screens."])
    assert drawn
    top, bottom = free_bands(image)
    assert (shown[top : h - bottom] == image[top : h - bottom]).all()  # no cell covered
    assert shown[:top].any() and shown[h - bottom :].any()  # the text is there
    for im in (shown, cv2.GaussianBlur(shown, (0, 0), 2.5)):  # and with a lens's blur
        codes = reader.read_codes(im, codec.layout)
        assert len(codes) == 1
        packet, _ = codec.decode(codes[0].symbols, codes[0].confidence)
        assert streams.unwrap(transfer.TransferAssembler().add(packet))[2] == data


# ---------------------------------------------------------------------------- windows under Xvfb
WINDOW_PROBE = textwrap.dedent("""
    import asyncio, json, subprocess, sys
    import numpy as np
    from wccl.media.window import WindowScreen
    from wccl.media.x11grab import HEADER
    from wccl.runtime.timebase import NodeClock

    async def main():
        clock = NodeClock()
        quit = asyncio.Event()
        s = WindowScreen(clock, "wccl probe", 320, 200, fullscreen=False, x=50, y=40, on_quit=quit.set)
        rng = np.random.default_rng(0)
        image = rng.integers(0, 256, (200, 320, 3), dtype=np.uint8)
        lags = []
        for _ in range(40):
            t0 = clock.now()
            t = s.show(image)
            lags.append((t - t0, clock.now() - t))
            await asyncio.sleep(0.01)
        grab = subprocess.run([sys.executable, "-m", "wccl.media.x11grab", "--x", "50", "--y", "40", "--width",
                               "320", "--height", "200", "--count", "1"], capture_output=True, timeout=30)
        pixels = np.frombuffer(grab.stdout[HEADER.size:], np.uint8).reshape(200, 320, 3)
        r = subprocess.run(["xdotool", "search", "--name", "wccl probe", "windowfocus", "--sync", "key",
                            "Escape"], capture_output=True, timeout=10) if "--esc" in sys.argv else None
        if r is not None:
            try:
                await asyncio.wait_for(quit.wait(), 3)
            except asyncio.TimeoutError:
                pass
        s.close()
        print(json.dumps(dict(exact=bool((pixels == image).all()), lags=lags, quit=s.quit_requested,
                              xdotool=None if r is None else r.returncode)))

    asyncio.run(main())
""")


@needs_xvfb
def test_window_shows_pixels_exactly_and_returns_the_presentation_time(xdisplay):
    args = ["-c", WINDOW_PROBE] + (["--esc"] if shutil.which("xdotool") else [])
    r = _run(args, xdisplay.env(), timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["exact"]  # a 1:1 window: what x11grab films is exactly what was shown
    for took, since in out["lags"]:
        assert 0.0 <= took < 0.5 and since >= 0.0  # returned: when the frame went up, on the node clock
    if out["xdotool"] is not None:
        assert out["xdotool"] == 0 and out["quit"]  # Esc reached the node's stop hook


@needs_xvfb
def test_window_check_command_shows_the_startup_screen(xdisplay):
    r = _run(["-m", "wccl.devices", "--window", "--config", "rooms/loopback.toml", "--seconds", "1"],
             xdisplay.env(), timeout=60)
    assert r.returncode == 0, r.stderr
    assert "start-up screen" in r.stdout


# ------------------------------------------------------------------------------- camera modes
V4L2_FORMATS = """ioctl: VIDIOC_ENUM_FMT
	Type: Video Capture

	[0]: 'MJPG' (Motion-JPEG, compressed)
		Size: Discrete 1280x720
			Interval: Discrete 0.033s (30.000 fps)
		Size: Discrete 640x480
			Interval: Discrete 0.033s (30.000 fps)
			Interval: Discrete 0.067s (15.000 fps)
	[1]: 'YUYV' (YUYV 4:2:2)
		Size: Discrete 640x480
			Interval: Discrete 0.033s (30.000 fps)
		Size: Discrete 1280x720
			Interval: Discrete 0.100s (10.000 fps)
			Interval: Discrete 0.200s
"""

V4L2_FORMATS_OLD = """ioctl: VIDIOC_ENUM_FMT
	Index       : 0
	Type        : Video Capture
	Pixel Format: 'YUYV'
	Name        : YUYV 4:2:2
		Size: Stepwise 16x16 - 1920x1080 with step 1/1
			Interval: Stepwise 0.033s - 1.000s with step 0.000s (1.000-30.000 fps)
"""


def test_v4l2_formats_are_parsed():
    from wccl.devices import format_modes, parse_v4l2_formats

    formats = parse_v4l2_formats(V4L2_FORMATS)
    assert [f["fourcc"] for f in formats] == ["MJPG", "YUYV"]
    assert formats[0]["description"] == "Motion-JPEG, compressed"
    assert formats[0]["sizes"] == [{"width": 1280, "height": 720, "fps": [30.0]},
                                   {"width": 640, "height": 480, "fps": [30.0, 15.0]}]
    assert formats[1]["sizes"][1] == {"width": 1280, "height": 720, "fps": [10.0, 5.0]}  # 0.200s: 5 fps
    assert format_modes(formats) == ["MJPG: 1280x720@30 640x480@30/15", "YUYV: 640x480@30 1280x720@10/5"]
    old = parse_v4l2_formats(V4L2_FORMATS_OLD)
    assert old == [{"fourcc": "YUYV", "description": "YUYV 4:2:2",
                    "sizes": [{"width": 1920, "height": 1080, "fps": [30.0, 1.0]}]}]
    assert parse_v4l2_formats("") == []


@pytest.fixture
def one_camera(tmp_path, monkeypatch):
    """A Linux machine with one camera (its capture and metadata nodes), opened by a fake VideoCapture that
    gives 640x480 whatever is asked."""
    import cv2
    from test_webcam import FakeCapture

    from wccl.media import webcam

    sysfs, dev = tmp_path / "sys", tmp_path / "dev"
    for node, index in (("video0", 0), ("video1", 1)):
        (sysfs / node).mkdir(parents=True)
        (sysfs / node / "name").write_text("Integrated Camera\n")
        (sysfs / node / "index").write_text(f"{index}\n")
        dev.mkdir(exist_ok=True)
        (dev / node).write_text("")
    monkeypatch.setattr(webcam, "SYS_V4L", sysfs)
    monkeypatch.setattr(webcam, "DEV", dev)
    monkeypatch.setattr("sys.platform", "linux")
    opened = []

    def open_(device, api=None):
        opened.append(FakeCapture(device, api, size=(640, 480), rate=1000.0))
        return opened[-1]

    monkeypatch.setattr(cv2, "VideoCapture", open_)
    return opened


def test_camera_modes_are_probed_without_v4l2_ctl(one_camera, monkeypatch, capsys):
    from wccl import devices

    monkeypatch.setattr(devices, "v4l2_formats", lambda device: None)
    cams = devices.list_cameras(read=True)
    assert [c["name"] for c in cams] == ["Integrated Camera"] * 2 and cams[0]["status"] == "ok"
    modes = cams[0]["modes"]
    assert [m["asked"] for m in modes] == [f"{w}x{h} {f}" for f in ("MJPG", "default")
                                           for w, h in devices.PROBE_MODES]
    assert all((m["width"], m["height"]) == (640, 480) for m in modes)  # what the camera gave, not what was asked
    assert modes[0]["fourcc"] == "MJPG" and modes[-1]["fourcc"] == "YUYV"
    devices._print(cams, {"display": None, "why": "none"}, True)
    out = capsys.readouterr().out
    assert "asked 1920x1080 MJPG: 640x480 at 30 fps, MJPG" in out
    assert all(c.released for c in one_camera)


def test_camera_formats_come_from_v4l2_ctl_and_no_read_streams_nothing(one_camera, monkeypatch, capsys):
    from wccl import devices

    monkeypatch.setattr(devices, "v4l2_formats", lambda device: devices.parse_v4l2_formats(V4L2_FORMATS))
    cams = devices.list_cameras(read=False)
    assert all("modes" not in c and c["formats"][0]["fourcc"] == "MJPG" for c in cams)
    assert not any(c.sets for c in one_camera)  # --no-read: nothing asked of the camera
    devices._print(cams, {"display": None, "why": "none"}, False)
    out = capsys.readouterr().out
    assert "    MJPG: 1280x720@30 640x480@30/15\n" in out and "    YUYV: 640x480@30 1280x720@10/5\n" in out


def test_v4l2_ctl_is_run_on_the_device(monkeypatch):
    from wccl import devices

    calls = []

    def run(args, **kw):
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, V4L2_FORMATS, "")

    monkeypatch.setattr(devices.shutil, "which", lambda name: "/usr/bin/v4l2-ctl" if name == "v4l2-ctl" else None)
    monkeypatch.setattr(devices.subprocess, "run", run)
    assert devices.v4l2_formats("/dev/video2")[1]["fourcc"] == "YUYV"
    assert calls == [["/usr/bin/v4l2-ctl", "-d", "/dev/video2", "--list-formats-ext"]]
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    assert devices.v4l2_formats("/dev/video2") is None
