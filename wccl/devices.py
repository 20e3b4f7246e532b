"""`python -m wccl.devices`: the cameras and displays this laptop has, for a room config.

Consumes: the machine (on Linux /dev/video* and /sys/class/video4linux, and
`v4l2-ctl` if installed; on macOS and Windows camera indices 0..N-1; the X
display from $DISPLAY and, if installed, `xrandr --listmonitors`). Emits: a
plain-text list (or JSON with `--json`): each camera's device, name, whether
it delivers images and at what size, rate and pixel format, and the modes it
offers: on Linux with `v4l2-ctl`, every pixel format with its sizes and
frame rates; otherwise what the driver gives when asked for a few common
modes (1280x720, 1920x1080, 640x480; MJPEG and the default format), probed
with OpenCV (not with `--no-read`, which only asks the driver what it
starts in). The display's size and monitors, or why there is none. Exit
status 0 even when nothing is found: finding nothing is an answer.

Opening a camera here switches its light on for a moment; a camera busy in
another program shows as "cannot be opened".

The names it lists are those a node's `webcam = {device = "Logitech"}`
matches (wccl.media.webcam.find_camera).

`python -m wccl.devices --window [--config room.toml --node NAME]` shows
the node's window as it looks at start-up (start-up frames with the
instructions around them) until Esc or `--seconds`: a check of the screen
side before a run.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

from wccl.cli import command_parser
from wccl.media.display import NoDisplay, monitors, probe_display
from wccl.media.webcam import v4l2_name, video_nodes

PROBE_MODES = ((1280, 720), (1920, 1080), (640, 480))  # asked of a camera when v4l2-ctl cannot list its modes


# ----------------------------------------------------------------------------- modes and formats
def parse_v4l2_formats(text: str) -> list[dict[str, Any]]:
    """`v4l2-ctl --list-formats-ext` output as [{fourcc, description, sizes: [{width, height, fps}]}].

    `fps` lists the frame rates of a discrete size (fastest first); a stepwise size or interval gives
    its range's ends (`width`/`height` the largest, `fps` the fastest and slowest)."""
    formats: list[dict[str, Any]] = []
    size: dict[str, Any] | None = None
    for line in text.splitlines():
        s = line.strip()
        m = re.match(r"(?:\[\d+\]:|Pixel Format\s*:)\s*'([^']*)'\s*(?:\((.*)\))?", s)
        if m:
            formats.append({"fourcc": m.group(1).strip(), "description": (m.group(2) or "").strip(), "sizes": []})
            size = None
            continue
        m = re.match(r"Name\s*:\s*(.*)", s)
        if m and formats and not formats[-1]["description"]:
            formats[-1]["description"] = m.group(1).strip()
            continue
        m = re.match(r"Size:\s*\w+\s+(\d+)x(\d+)(?:\s*-\s*(\d+)x(\d+))?", s)
        if m and formats:
            w, h = (int(m.group(3)), int(m.group(4))) if m.group(3) else (int(m.group(1)), int(m.group(2)))
            size = {"width": w, "height": h, "fps": []}
            formats[-1]["sizes"].append(size)
            continue
        if s.startswith("Interval:") and size is not None:
            rates = re.search(r"\(([\d.]+)(?:\s*-\s*([\d.]+))? fps\)", s)
            if rates:
                values = [float(v) for v in rates.groups() if v is not None]
            else:
                secs = [float(v) for v in re.findall(r"([\d.]+)s", s)]
                values = [1.0 / v for v in secs if v > 0]
            size["fps"].extend(round(v, 2) for v in values)
    for f in formats:
        for sz in f["sizes"]:
            sz["fps"] = sorted(set(sz["fps"]), reverse=True)
    return formats


def v4l2_formats(device: str, timeout: float = 5.0) -> list[dict[str, Any]] | None:
    """The device's formats from `v4l2-ctl --list-formats-ext` (fast: it does not stream); None without it."""
    exe = shutil.which("v4l2-ctl")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "-d", str(device), "--list-formats-ext"], check=False, capture_output=True,
                           text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_v4l2_formats(r.stdout) if r.returncode == 0 else None


def _rate(v: float) -> str:
    return f"{v:g}"


def format_modes(formats: list[dict[str, Any]]) -> list[str]:
    """One compact line per pixel format: `MJPG: 1280x720@30/15 640x480@30`."""
    lines = []
    for f in formats:
        sizes = " ".join(f"{s['width']}x{s['height']}" + ("@" + "/".join(_rate(v) for v in s["fps"]) if s["fps"] else "")
                         for s in f["sizes"])
        lines.append(f"{f['fourcc']}: {sizes}" if sizes else f"{f['fourcc']}")
    return lines


def _fourcc_text(v: float) -> str:
    v = int(v)
    return "".join(chr((v >> (8 * i)) & 0xFF) for i in range(4)).strip("\x00") or "?"


def probe_modes(cap, read: bool) -> list[dict[str, Any]]:
    """Ask an opened VideoCapture for each of PROBE_MODES, in MJPEG and in the default format, and note
    what the driver reports it gives (size, rate, pixel format) and, with `read`, the size of an image."""
    import cv2

    default = cap.get(cv2.CAP_PROP_FOURCC)
    out = []
    for fourcc in ("MJPG", None):
        for w, h in PROBE_MODES:
            cap.set(cv2.CAP_PROP_FOURCC, cv2.VideoWriter_fourcc(*fourcc) if fourcc else default)
            cap.set(cv2.CAP_PROP_FRAME_WIDTH, w)
            cap.set(cv2.CAP_PROP_FRAME_HEIGHT, h)
            cap.set(cv2.CAP_PROP_FPS, 30)
            mode = {"asked": f"{w}x{h} {fourcc or 'default'}", "width": int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)),
                    "height": int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
                    "fps": round(float(cap.get(cv2.CAP_PROP_FPS)), 2), "fourcc": _fourcc_text(cap.get(cv2.CAP_PROP_FOURCC))}
            if read:
                ok, image = cap.read()
                if ok and image is not None:
                    mode["width"], mode["height"] = int(image.shape[1]), int(image.shape[0])
            out.append(mode)
    return out


def _probe_camera(device: int | str, backend: str, read: bool, modes: bool = False) -> dict[str, Any]:
    """What the camera starts in; with `modes` (and `read`) also what it gives for PROBE_MODES."""
    import cv2

    from wccl.media.webcam import _quiet_opencv, backend_id

    _quiet_opencv()
    out: dict[str, Any] = {"device": device}
    cap = cv2.VideoCapture(device, backend_id(backend))
    try:
        if not cap.isOpened():
            out["status"] = "cannot be opened (busy, no permission, or not a capture device)"
            return out
        out["backend"] = cap.getBackendName()
        if read:
            ok, image = cap.read()
            if not ok or image is None:
                out["status"] = "opens, but delivers no images (a metadata node?)"
                return out
            out["width"], out["height"] = int(image.shape[1]), int(image.shape[0])
        else:
            out["width"] = int(cap.get(cv2.CAP_PROP_FRAME_WIDTH))
            out["height"] = int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
        out["fps"] = round(float(cap.get(cv2.CAP_PROP_FPS)), 2)
        out["fourcc"] = _fourcc_text(cap.get(cv2.CAP_PROP_FOURCC))
        out["status"] = "ok"
        if modes and read:
            out["modes"] = probe_modes(cap, read)
        return out
    finally:
        cap.release()


def list_cameras(max_index: int = 4, read: bool = True) -> list[dict[str, Any]]:
    """Every camera with what it starts in and its modes: `formats` from v4l2-ctl (Linux, if installed),
    else, when `read`, `modes` probed with OpenCV. Without `read` nothing streams (fast)."""
    if sys.platform.startswith("linux"):
        cams = []
        for p in video_nodes():
            if not os.access(p, os.R_OK | os.W_OK):
                cams.append({"device": str(p), "name": v4l2_name(str(p)),
                             "status": "permission denied (add this user to the 'video' group)"})
                continue
            formats = v4l2_formats(str(p))
            info = _probe_camera(str(p), "v4l2", read, modes=formats is None)
            info["name"] = v4l2_name(str(p))
            if formats:
                info["formats"] = formats
            cams.append(info)
        return cams
    cams = []
    for i in range(max_index):
        info = _probe_camera(i, "auto", read, modes=True)
        if info.get("status") == "ok":
            cams.append(info)
    return cams


def _monitors(name: str) -> list[dict[str, Any]]:
    return [{"width": w, "height": h, "x": x, "y": y} for x, y, w, h in monitors(name)]


def list_displays() -> dict[str, Any]:
    try:
        info = probe_display()
    except NoDisplay as e:
        return {"display": None, "why": str(e)}
    return {"display": info.name, "screens": [list(s) for s in info.screens], "monitors": _monitors(info.name)}


def _print(cams: list[dict[str, Any]], disp: dict[str, Any], read: bool) -> None:
    print("Cameras:")
    if not cams:
        print("  none found" + (" (no /dev/video* devices)" if sys.platform.startswith("linux") else ""))
    for c in cams:
        name = f"  {c.get('name')!r}" if c.get("name") else ""
        if c.get("status") == "ok":
            print(f"  {c['device']}{name}: {c['width']}x{c['height']} at {c['fps']:g} fps, {c['fourcc']} "
                  f"({c['backend']})")
        else:
            print(f"  {c['device']}{name}: {c['status']}")
        for line in format_modes(c.get("formats", [])):
            print(f"    {line}")
        for m in c.get("modes", []):
            print(f"    asked {m['asked']}: {m['width']}x{m['height']} at {m['fps']:g} fps, {m['fourcc']}")
    if any(c.get("status") == "ok" for c in cams):
        print("  (the size and rate a camera starts in; a room config asks for its own: "
              "webcam = {device = ..., width = 1280, height = 720, fps = 30, mjpeg = true})")
    if sys.platform == "darwin" and cams:
        print("  (a phone nearby (Continuity Camera) may take index 0: check which index is the laptop's camera)")
    print("Displays:")
    if disp["display"] is None:
        print(f"  {disp['why']}")
        return
    if disp["screens"]:
        for i, (w, h) in enumerate(disp["screens"]):
            print(f"  {disp['display']} screen {i}: {w}x{h}")
    else:
        print(f"  {disp['display']}: the desktop (windows open on it)")
    for i, m in enumerate(disp.get("monitors", [])):
        print(f"    monitor {i}: {m['width']}x{m['height']} at +{m['x']}+{m['y']} "
              f"(window = {{x = {m['x']}, y = {m['y']}}} goes fullscreen there)")


async def _show_window(config_path: str, node: str | None, seconds: float | None) -> int:
    import numpy as np

    from actors.screen_writer import STARTUP_OVERLAY
    from protocols import layout
    from wccl.config import load_config
    from wccl.media.window import WindowScreen
    from wccl.runtime.timebase import NodeClock

    cfg = load_config(config_path)
    spec = cfg.room.node(node) if node else cfg.room.nodes[0]
    opts = spec.window
    clock = NodeClock()
    done = asyncio.Event()
    screen = WindowScreen(clock, f"wccl {spec.name}", cfg.screen.width, cfg.screen.height,
                          fullscreen=opts.fullscreen if opts else True, x=opts.x if opts else 0,
                          y=opts.y if opts else 0, on_quit=done.set, node=spec.name)
    codec = cfg.link.codec()
    sender = cfg.room.index(spec.name)
    screen.set_overlay(STARTUP_OVERLAY)
    print(f"showing {spec.name}'s start-up screen ({cfg.screen.width}x{cfg.screen.height}, "
          f"{cfg.link.rows}x{cfg.link.cols} cells of {cfg.link.cell_px} px); Esc closes it", flush=True)
    rng = np.random.default_rng(0)
    t0 = clock.now()
    k = 0
    try:
        while not done.is_set() and (seconds is None or clock.now() - t0 < seconds):
            payload = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
            frame = codec.encode(payload, count=1, session=cfg.room.session, sender=sender, stream="sync",
                                 step=0, tid=k + 1)[0]
            screen.show(layout.render(frame, codec.layout, cfg.screen.width, cfg.screen.height, sender=sender,
                                      parity=k & 1))
            k += 1
            await clock.sleep_until(t0 + k * cfg.link.hold_s)
    finally:
        screen.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = command_parser("wccl.devices", "List cameras and displays.")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--max-index", type=int, default=4, help="camera indices to try where devices cannot be listed")
    p.add_argument("--no-read", action="store_true", help="do not read an image from each camera (faster)")
    p.add_argument("--window", action="store_true",
                   help="show a node's start-up screen (Esc closes it) instead of listing devices")
    p.add_argument("--config", default="rooms/two-laptops.toml", help="with --window: the room config")
    p.add_argument("--node", help="with --window: the node (default: the room's first)")
    p.add_argument("--seconds", type=float, help="with --window: close after this long")
    a = p.parse_args(argv)
    if a.window:
        from wccl.config import ConfigError
        from wccl.media.display import DeviceError

        try:
            return asyncio.run(_show_window(a.config, a.node, a.seconds))
        except ConfigError as e:
            print(f"wccl: config error: {e}", file=sys.stderr)
            return 2
        except (DeviceError, KeyError) as e:
            print(f"wccl: {e}", file=sys.stderr)
            return getattr(e, "exit_status", 2)
    cams = list_cameras(a.max_index, read=not a.no_read)
    disp = list_displays()
    if a.json:
        print(json.dumps({"cameras": cams, "displays": disp}))
    else:
        _print(cams, disp, not a.no_read)
    return 0


if __name__ == "__main__":
    sys.exit(main())
