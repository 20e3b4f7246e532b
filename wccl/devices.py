"""`python -m wccl.devices`: the cameras and displays this laptop has, for a room config.

Consumes: the machine (on Linux /dev/video* and /sys/class/video4linux; on
macOS and Windows camera indices 0..N-1; the X display from $DISPLAY and,
if installed, `xrandr --listmonitors`). Emits: a plain-text list (or JSON
with `--json`): each camera's device, name, whether it delivers images and
at what size, rate and pixel format; the display's size and monitors, or
why there is none. Exit status 0 even when nothing is found: finding
nothing is an answer.

Opening a camera here switches its light on for a moment; a camera busy in
another program shows as "cannot be opened".

`python -m wccl.devices --window [--config room.toml --node NAME]` shows
the node's window as it looks at start-up (start-up frames with the
instructions around them) until Esc or `--seconds`: a check of the screen
side before a run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from wccl.cli import HelpFormatter
from wccl.media.display import NoDisplay, monitors, probe_display


def _v4l2_name(dev: str) -> str:
    p = Path("/sys/class/video4linux") / Path(dev).name / "name"
    try:
        return p.read_text().strip()
    except OSError:
        return ""


def _probe_camera(device: int | str, backend: str, read: bool) -> dict[str, Any]:
    import cv2

    from wccl.media.webcam import backend_id, _quiet_opencv

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
        v = int(cap.get(cv2.CAP_PROP_FOURCC))
        out["fourcc"] = "".join(chr((v >> (8 * i)) & 0xFF) for i in range(4)).strip("\x00") or "?"
        out["status"] = "ok"
        return out
    finally:
        cap.release()


def list_cameras(max_index: int = 4, read: bool = True) -> list[dict[str, Any]]:
    if sys.platform.startswith("linux"):
        devs = sorted((p for p in Path("/dev").glob("video*") if re.fullmatch(r"video\d+", p.name)),
                      key=lambda p: int(p.name[5:]))
        cams = []
        for p in devs:
            if not os.access(p, os.R_OK | os.W_OK):
                cams.append({"device": str(p), "name": _v4l2_name(str(p)),
                             "status": "permission denied (add this user to the 'video' group)"})
                continue
            info = _probe_camera(str(p), "v4l2", read)
            info["name"] = _v4l2_name(str(p))
            cams.append(info)
        return cams
    cams = []
    for i in range(max_index):
        info = _probe_camera(i, "auto", read)
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
    if any(c.get("status") == "ok" for c in cams):
        print("  (the size and rate a camera starts in; a room config asks for its own: "
              "webcam = {device = ..., width = 1280, height = 720, fps = 30, mjpeg = true})")
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
    from wccl.timebase import NodeClock

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
    p = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="python -m wccl.devices", description="List cameras and displays.")
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
