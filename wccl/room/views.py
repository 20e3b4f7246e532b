"""`python -m wccl.room.views --config config.toml --at 5.0 --out DIR`: what every camera sees at a moment.

Consumes: a config (its room, profile, channel overrides, screen and link
layout). Emits: DIR/<node>.png, the image each node's camera captures at
true time `--at`, with every screen showing a frame of random bytes drawn
by protocols.layout.render (DIR/<node>_screen.png); and a line per camera
saying which screens it sees, at what angle and how many camera pixels a
cell spans.

Options: --profile NAME (override the config's), --seed N (of the random
frames), --change (each screen switches to a second frame at --at, so the
captures show the exposure mixing the two frames).
"""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np

from protocols.layout import render
from wccl.cli import command_parser


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("wccl.room.views", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="config.toml")
    ap.add_argument("--at", type=float, default=5.0, help="true time of the capture, s")
    ap.add_argument("--out", required=True, help="folder for the PNGs")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--change", action="store_true", help="switch every screen to a new frame at --at")
    args = ap.parse_args(argv)

    from wccl.config import ConfigError, load_config, with_values
    from wccl.room import SimulatedRoom

    try:
        cfg = with_values(load_config(args.config), f"{args.config} (--profile {args.profile})" if args.profile
                          else args.config, room=args.profile and {"profile": args.profile})
        room = SimulatedRoom.from_config(cfg)
    except (ConfigError, ValueError) as e:
        print(f"wccl.room.views: config error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    layout = cfg.link.layout()
    rng = np.random.default_rng(args.seed)
    W, H = cfg.screen.width, cfg.screen.height
    for i, node in enumerate(room.nodes):
        first = render(rng.bytes(layout.frame_bytes), layout, W, H, sender=i)
        room.show_at(node, first, max(0.0, args.at - 2.0))
        cv2.imwrite(str(out / f"{node}_screen.png"), first)
        if args.change:
            room.show_at(node, render(rng.bytes(layout.frame_bytes), layout, W, H, sender=i, parity=1), args.at)
    centre = np.array([[W / 2, H / 2], [W / 2 + layout.cell_px, H / 2], [W / 2, H / 2 + layout.cell_px]])
    for node in room.nodes:
        image = room.capture_at(node, args.at, k=int(args.at * room.camera_fps(node)))
        path = out / f"{node}.png"
        cv2.imwrite(str(path), image)
        seen = []
        for other in room.visible_from(node):
            p = room.project(node, other, centre)
            cell = float(np.mean([np.hypot(*(p[1] - p[0])), np.hypot(*(p[2] - p[0]))]))
            angle = "" if room.exact else f", {room.views[(node, other)].angle_deg:.0f} deg"
            seen.append(f"{other} ({cell:.1f} px/cell{angle})")
        hidden = [f"{n} ({why})" for n, why in room.hidden_from(node).items()]
        print(f"{path}: {image.shape[1]}x{image.shape[0]}, sees {', '.join(seen) or 'nothing'}"
              + (f"; not {', '.join(hidden)}" if hidden else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
