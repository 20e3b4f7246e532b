"""The desktop loopback medium: real windows on one X display, filmed by x11grab.

Consumes: the room config (room.medium = "desktop", room.desktop: the X
display, where the first window goes, the gap between windows, the margin
captured around them; a node's `window = {x, y}` places it by hand).
Emits: per node, a screen "window" (a real OpenCV window, 1:1 pixels, at its
place on the display) and a camera "x11grab" that films the other nodes'
windows (the bounding box of all of them plus the margin; the node's own
window, if it falls inside, painted black). No simulated optics: the pixels
a camera gets are the pixels the other windows show.

Every process of the room computes the same places from the same config, so
two nodes run as two processes (`--node alice`, `--node bob`) find each
other's windows. Under Xvfb nothing moves the windows; on a desktop with a
window manager, title bars may shift them by a few pixels (the margin takes
that, and the reader finds the ring anywhere in the capture).
"""

from __future__ import annotations

import asyncio
import os

from wccl.config import ConfigError
from wccl.media.display import probe_display
from wccl.media.hardware import StopHook, require_realtime, window_screen
from wccl.cli import command_parser

Rect = tuple[int, int, int, int]  # x, y, width, height


class DesktopMedium(StopHook):
    def __init__(self, config) -> None:
        super().__init__()
        require_realtime(config, "desktop")
        self.config = config
        d = config.room.desktop
        self.display_name = d.display or os.environ.get("DISPLAY") or ""
        self.display = probe_display(self.display_name or None)  # NoDisplay (exit 3) first
        self.display_name = self.display.name
        w, h = config.screen.width, config.screen.height
        self.rects: dict[str, Rect] = {}
        x = d.x
        for spec in config.room.nodes:
            if spec.window is not None:
                self.rects[spec.name] = (spec.window.x, spec.window.y, w, h)
            else:
                self.rects[spec.name] = (x, d.y, w, h)
                x += w + d.gap_px
        dw, dh = self.display.size
        need_w = max(r[0] + r[2] for r in self.rects.values())
        need_h = max(r[1] + r[3] for r in self.rects.values())
        if dw and (need_w > dw or need_h > dh):
            raise ConfigError(f"room.desktop: the windows need {need_w}x{need_h} px, display {self.display_name} "
                              f"is {dw}x{dh} (make the display larger, or the [screen] smaller)")

    @classmethod
    def from_config(cls, *, config) -> DesktopMedium:
        return cls(config)

    def window_rect(self, node: str) -> Rect:
        return self.rects[node]

    def capture_rect(self, node: str) -> Rect:
        """What `node`'s camera films: the other windows' bounding box plus the margin, on the display."""
        m = self.config.room.desktop.margin_px
        others = [r for n, r in self.rects.items() if n != node]
        x0 = max(0, min(r[0] for r in others) - m)
        y0 = max(0, min(r[1] for r in others) - m)
        x1 = max(r[0] + r[2] for r in others) + m
        y1 = max(r[1] + r[3] for r in others) + m
        dw, dh = self.display.size
        if dw:
            x1, y1 = min(x1, dw), min(y1, dh)
        # x11grab wants even sizes for some pixel formats; keep them even.
        return x0, y0, (x1 - x0) // 2 * 2, (y1 - y0) // 2 * 2


def x11grab_camera(*, medium, node, clock, config):
    """Camera "x11grab": films the other nodes' windows (needs the desktop medium)."""
    from wccl.media.x11grab import X11GrabCamera

    if not isinstance(medium, DesktopMedium):
        raise ConfigError(f"room.nodes: camera 'x11grab' of node {node!r} needs medium \"desktop\"")
    return X11GrabCamera(clock, medium.display_name, medium.capture_rect(node), config.camera.fps,
                         blackout=[medium.window_rect(node)], node=node)


# ------------------------------------------------------------------------------ the loopback check
async def check(config, seconds: float = 2.0, payload_bytes: int = 400) -> dict:
    """Every node's window shows one frame; every camera reads what it can for `seconds`.

    Returns per node: captures, capture fps, codes found, frames decoded and whether each peer's
    bytes came back intact; and the windows' show() times (ms from the call to the frame being up).
    """
    import time

    import numpy as np

    from protocols import fec, layout, streams
    from protocols.receiver import TransferReceiver
    from wccl.imaging import reader
    from wccl.runtime.timebase import NodeClock

    medium = DesktopMedium(config)
    clock = NodeClock()
    names = [n.name for n in config.room.nodes]
    codec = config.link.codec()
    w, h = config.screen.width, config.screen.height
    screens, cameras, sent = {}, {}, {}
    show_ms: list[float] = []
    try:
        for i, name in enumerate(names):
            screens[name] = window_screen(medium=medium, node=name, clock=clock, config=config)
            data = np.random.default_rng(i).integers(0, 256, payload_bytes, dtype=np.uint8).tobytes()
            frame = codec.encode(data, count=1, session=config.room.session, sender=i, stream="grad", step=0)[0]
            image = layout.render(frame, codec.layout, w, h, sender=i)
            for _ in range(5):
                t0 = clock.now()
                t_shown = screens[name].show(image)
                show_ms.append((t_shown - t0) * 1000)
            sent[i] = data
        for name in names:
            cameras[name] = x11grab_camera(medium=medium, node=name, clock=clock, config=config)
        report: dict = {"display": medium.display_name, "nodes": {}}

        async def read(name: str) -> None:
            cam = cameras[name]
            rx = TransferReceiver(None, len(names), config.room.session)  # (listens: every sender's transfer)
            got: dict[int, bool] = {}
            n = codes = ok = 0
            t_end = time.monotonic() + seconds
            while time.monotonic() < t_end:
                image, _t = await cam.recv()
                n += 1
                for rc in reader.read_codes(image, codec.layout):
                    codes += 1
                    try:
                        message, _ = codec.decode_message(rc.symbols, rc.confidence)
                    except fec.UncorrectableFrame:  # (counted: not decoded)
                        continue
                    r = rx.receive(message)
                    if r.refused is not None:
                        continue
                    ok += 1
                    sender = r.frame.sender
                    data = streams.unwrap(r.data)[2] if r.data is not None else None
                    got[sender] = got.get(sender, False) or data == sent.get(sender)
                await asyncio.sleep(0)
            x, y, cw, ch = medium.capture_rect(name)
            report["nodes"][name] = dict(capture=[x, y, cw, ch], captures=n, codes=codes, decoded=ok,
                                         peers_intact={names[s]: v for s, v in sorted(got.items())},
                                         **{f"camera_{k}": v for k, v in cam.stats().items()})

        await asyncio.gather(*(read(n) for n in names))
        show_ms.sort()
        report["show_ms"] = dict(median=round(show_ms[len(show_ms) // 2], 2), max=round(show_ms[-1], 2))
        report["ok"] = all(set(v["peers_intact"]) == set(names) - {n} and all(v["peers_intact"].values())
                           for n, v in report["nodes"].items())
        return report
    finally:
        for cam in cameras.values():
            cam.close()
        for s in screens.values():
            s.close()


def main(argv: list[str] | None = None) -> int:
    """`python -m wccl.media.desktop --config rooms/loopback.toml`: does every window reach every camera?"""
    import json
    import sys

    from wccl.config import load_config
    from wccl.runtime.logs import configure_logging
    from wccl.media.display import DeviceError

    p = command_parser("wccl.media.desktop", main.__doc__)
    p.add_argument("--config", default="rooms/loopback.toml")
    p.add_argument("--seconds", type=float, default=2.0)
    a = p.parse_args(argv)
    configure_logging("json", "warning", stream=sys.stderr)
    try:
        report = asyncio.run(check(load_config(a.config), a.seconds))
    except ConfigError as e:
        print(f"wccl: config error: {e}", file=sys.stderr)
        return 2
    except DeviceError as e:
        print(f"wccl: {e}", file=sys.stderr)
        return e.exit_status
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    import sys

    sys.exit(main())
