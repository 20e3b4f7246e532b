"""`python -m wccl.lab placement [--config ROOM] [--json]`: how far apart two laptops may stand.

A pure computation (no camera, no room): for each layout a run chooses from
at start-up (`config.DEFAULT_LADDER`, or the room file's layouts with
`--config`), each laptop screen (diagonal and panel shape), webcam lens
(horizontal field of view at the camera's resolution), distance and viewing
angle, it gives

- camera pixels per cell: the cell's physical size divided by the width one
  camera pixel covers at that distance (`2 * d * tan(fov / 2) / camera_width`).
  The frame ([screen] width x height) fills the panel's width or height,
  keeping its shape, as the fullscreen window scales it
  (wccl/media/window.py), so one frame pixel is
  `min(panel_width / frame_width, panel_height / frame_height)` metres.
  Seen at an angle, the cell is narrower by cos(angle) across (the
  foreshortened side is the one given: the smaller);
- the share of the camera picture's width the screen (the whole panel) fills;
- whether the decoder reads that many camera pixels per cell
  (`MIN_CAMERA_PX_PER_CELL`, by the layout's colours), and, per screen and
  lens, the furthest distance each layout reads at (`furthest_distance`).

The distance is from the webcam to the middle of the other screen; lens
distortion, blur, light and the screen's position in the picture are left
out: the figures are geometry only.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from wccl.config import DEFAULT_LADDER, LadderStep, ScreenConfig

INCH_M = 0.0254

# The fewest camera pixels per cell (across, at the cell's narrower side) the decoder needs, by colours per
# cell. Where they come from: in the simulated `webcam` room (wccl/room/NOTES.md; it films through a
# 1280x720 lens of 62 degrees, blur 1.2 px, MJPEG at quality 60 with 4:2:0 colour, i.e. colour at half
# resolution) the decoder reads 8-colour cells of 4.1 camera pixels (10 px cells at 0.6 m: the default
# ladder's fastest layout: the dated benchmark notes, `git show dddd183:BENCHMARKS.md`, "A faster link"
# and "Faster layouts for collectives") but not
# of 3.7 (9 px cells) or 3.3 (8 px); 4-colour cells read at 3.9 camera pixels (16 px cells at 1 m,
# the same notes, "Faster layouts for collectives") and did not at 3.3 (`webcam`) or 3.5 (`harsh`, blurrier;
# the same notes, "The link lab sweep"). No real webcam has been measured: the figures below add a margin
# to the simulated ones and are estimates for a real camera (8 colours 4.5, about 10 % over 4.1; 4 colours
# 4.0, just over the 3.9 that read). Two colours were never measured at their limit: they are given the
# 4-colour figure (the failures at 3.3-3.5 were the same for every colour count: finding the cells, not
# telling their colours apart, failed there).
MIN_CAMERA_PX_PER_CELL: dict[int, float] = {8: 4.5, 4: 4.0, 2: 4.0}

SCREENS_IN: tuple[float, ...] = (13.3, 14.0, 15.6, 16.0)  # laptop screen diagonals, inches
ASPECTS: tuple[tuple[int, int], ...] = ((16, 9), (16, 10))  # panel shapes
DISTANCES_M: tuple[float, ...] = (0.4, 0.5, 0.6, 0.8, 1.0, 1.2)  # webcam to the other screen's middle
FOVS_DEG: tuple[float, ...] = (60.0, 70.0, 78.0)  # webcam lenses' horizontal field of view
ANGLES_DEG: tuple[float, ...] = (0.0, 30.0)  # head-on, and the most the guide allows
CAMERA_WIDTH, CAMERA_HEIGHT = 1280, 720


@dataclass(frozen=True)
class Screen:
    """A laptop panel: its diagonal in inches and its shape (16:9, 16:10)."""

    diag_in: float
    aspect: tuple[int, int] = (16, 9)

    @property
    def size_m(self) -> tuple[float, float]:
        """(width, height) of the panel in metres."""
        a, b = self.aspect
        d = self.diag_in * INCH_M / math.hypot(a, b)
        return a * d, b * d

    @property
    def label(self) -> str:
        return f'{self.diag_in:g}" {self.aspect[0]}:{self.aspect[1]}'


def frame_px_m(screen: Screen, frame_w: int, frame_h: int) -> float:
    """Metres one frame pixel covers on `screen` when the frame fills the panel's width or height, keeping its
    shape (the fullscreen window pads it with black to the panel's shape and scales it up)."""
    w, h = screen.size_m
    return min(w / frame_w, h / frame_h)


def camera_px_m(distance_m: float, fov_deg: float, camera_width: int = CAMERA_WIDTH) -> float:
    """Metres one camera pixel covers across, at `distance_m` from a lens of `fov_deg` horizontal field of view."""
    return 2 * distance_m * math.tan(math.radians(fov_deg) / 2) / camera_width


def camera_px_per_cell(cell_px: float, screen: Screen, fov_deg: float, distance_m: float, *,
                       frame: tuple[int, int] = (1280, 720), camera_width: int = CAMERA_WIDTH,
                       angle_deg: float = 0.0) -> float:
    """Camera pixels across one cell of `cell_px` frame pixels (its narrower side when seen at `angle_deg`)."""
    cell_m = cell_px * frame_px_m(screen, *frame) * math.cos(math.radians(angle_deg))
    return cell_m / camera_px_m(distance_m, fov_deg, camera_width)


def screen_share(screen: Screen, fov_deg: float, distance_m: float, *, angle_deg: float = 0.0) -> float:
    """The share of the camera picture's width the panel fills (above 1: it does not fit across)."""
    width_m = screen.size_m[0] * math.cos(math.radians(angle_deg))
    return width_m / (2 * distance_m * math.tan(math.radians(fov_deg) / 2))


def nearest_fit_m(screen: Screen, fov_deg: float, *, camera: tuple[int, int] = (CAMERA_WIDTH, CAMERA_HEIGHT),
                  angle_deg: float = 0.0) -> float:
    """The nearest distance at which the whole panel fits in the picture, across and up (square pixels)."""
    w, h = screen.size_m
    half_h = math.tan(math.radians(fov_deg) / 2)
    half_v = half_h * camera[1] / camera[0]
    return max(w * math.cos(math.radians(angle_deg)) / (2 * half_h), h / (2 * half_v))


def needed_px(colours: int) -> float:
    """The fewest camera pixels per cell the decoder needs for cells of `colours` colours."""
    return MIN_CAMERA_PX_PER_CELL[colours]


def _get(layout: Any, key: str) -> Any:
    return layout[key] if isinstance(layout, dict) else getattr(layout, key)


def furthest_distance(layout: Any, screen_in: float, fov_deg: float, *, aspect: tuple[int, int] = (16, 9),
                      frame: tuple[int, int] = (1280, 720),
                      camera: tuple[int, int] = (CAMERA_WIDTH, CAMERA_HEIGHT),
                      angle_deg: float = 0.0) -> float | None:
    """The furthest distance (metres, webcam to the screen's middle) at which `layout` (a LadderStep, or a dict
    with cell_px and colours) shows cells of at least `needed_px(colours)` camera pixels; None when the
    screen must be nearer than that to fit in the picture (it then reads at no distance)."""
    screen = Screen(screen_in, aspect)
    cell_m = _get(layout, "cell_px") * frame_px_m(screen, *frame) * math.cos(math.radians(angle_deg))
    far = cell_m * camera[0] / (2 * math.tan(math.radians(fov_deg) / 2) * needed_px(_get(layout, "colours")))
    return far if far >= nearest_fit_m(screen, fov_deg, camera=camera, angle_deg=angle_deg) else None


def layout_label(step: LadderStep) -> str:
    return f"{step.rows}x{step.cols} {step.cell_px}px {step.colours}c {round(step.hold_s * 1000)}ms"


def ladder_of(config_path: str | None) -> tuple[list[LadderStep], tuple[int, int]]:
    """The layouts a run of the room file may use (`[link]`: the pinned one or its ladder; the default ladder
    less those that do not fit its screen, as start-up does) and its frame size; without a file, the default
    ladder and the default [screen]."""
    if config_path is None:
        s = ScreenConfig()
        steps, frame, auto_default = [LadderStep(**d) for d in DEFAULT_LADDER], (s.width, s.height), True
    else:
        from wccl.config import load_config

        cfg = load_config(config_path)
        steps, frame = cfg.link.steps(), (cfg.screen.width, cfg.screen.height)
        auto_default = cfg.link.choose == "auto" and not cfg.link.ladder
    if auto_default:
        from protocols.layout import GridLayout

        def fits(s: LadderStep) -> bool:
            h, w = GridLayout(s.rows, s.cols, s.colours, s.cell_px).size_px
            return w <= frame[0] and h <= frame[1]

        steps = [s for s in steps if fits(s)]
    return steps, frame


def placement(steps: Sequence[LadderStep], *, frame: tuple[int, int] = (1280, 720),
              screens: Iterable[float] = SCREENS_IN, aspects: Iterable[tuple[int, int]] = ASPECTS,
              distances: Iterable[float] = DISTANCES_M, fovs: Iterable[float] = FOVS_DEG,
              angles: Iterable[float] = ANGLES_DEG,
              camera: tuple[int, int] = (CAMERA_WIDTH, CAMERA_HEIGHT)) -> dict[str, Any]:
    """The placement table as one JSON-ready dict: `rows` (one per screen, lens, angle and distance: camera
    pixels per cell and readable, per layout) and `furthest` (one per screen, lens and angle: each layout's
    furthest distance)."""
    distances, steps = list(distances), list(steps)
    rows, furthest = [], []
    for diag in screens:
        for aspect in aspects:
            screen = Screen(diag, aspect)
            for fov in fovs:
                for angle in angles:
                    key = {"screen_in": diag, "aspect": f"{aspect[0]}:{aspect[1]}", "fov_deg": fov, "angle_deg": angle}
                    near = nearest_fit_m(screen, fov, camera=camera, angle_deg=angle)
                    far = [furthest_distance(s, diag, fov, aspect=aspect, frame=frame, camera=camera, angle_deg=angle)
                           for s in steps]
                    furthest.append(dict(key, nearest_fit_m=math.ceil(near * 1000) / 1000,
                                         furthest_m=[None if f is None else math.floor(f * 1000) / 1000 for f in far]))
                    for d in distances:
                        fits = d >= near
                        cells = []
                        for s in steps:
                            px = camera_px_per_cell(s.cell_px, screen, fov, d, frame=frame, camera_width=camera[0],
                                                    angle_deg=angle)
                            # (rounded down: a figure shown is never above what was compared)
                            cells.append({"camera_px_per_cell": math.floor(px * 100) / 100,
                                          "readable": fits and px >= needed_px(s.colours)})
                        rows.append(dict(key, distance_m=d, screen_share=round(
                            screen_share(screen, fov, d, angle_deg=angle), 3), screen_fits=fits, cells=cells))
    return {"frame": list(frame), "camera": list(camera),
            "min_camera_px_per_cell": {str(k): v for k, v in sorted(MIN_CAMERA_PX_PER_CELL.items())},
            "layouts": [{**s.model_dump(), "label": layout_label(s)} for s in steps], "rows": rows, "furthest": furthest}


def _angle(a: float) -> str:
    return "head-on" if a == 0 else f"{a:g} deg"


def markdown(table: dict[str, Any]) -> str:
    """The placement table as Markdown: each layout's furthest distance per screen and lens, then camera pixels
    per cell at each distance (a tick: the decoder reads it)."""
    labels = [lay["label"] for lay in table["layouts"]]
    need = ", ".join(f"{v:.1f} for {k} colours" for k, v in sorted(table["min_camera_px_per_cell"].items(),
                                                                  key=lambda kv: -int(kv[0])))
    cam = f"{table['camera'][0]}x{table['camera'][1]}"
    out = [(f"Frame {table['frame'][0]}x{table['frame'][1]} scaled to fill the screen; webcam {cam}; "
            f"readable: at least {need} camera px per cell."), "",
           "Furthest distance (webcam to the other screen's middle) each layout reads at:", "",
           "| screen | lens | view | " + " | ".join(labels) + " |",
           "|---|---|---|" + "---:|" * len(labels)]
    for f in table["furthest"]:
        dist = [("-" if m is None else f"{math.floor(m * 100) / 100:.2f} m") for m in f["furthest_m"]]
        out.append(f"| {f['screen_in']:g}\" {f['aspect']} | {f['fov_deg']:g} deg | {_angle(f['angle_deg'])} | "
                   + " | ".join(dist) + " |")
    out += ["", "Camera pixels per cell (✓: readable; screen: the share of the picture's width the screen fills):", "",
            "| screen | lens | view | distance | screen | " + " | ".join(labels) + " |",
            "|---|---|---|---:|---:|" + "---:|" * len(labels)]
    for r in table["rows"]:
        cells = [f"{math.floor(c['camera_px_per_cell'] * 10) / 10:.1f}" + (" ✓" if c["readable"] else "")
                 for c in r["cells"]]
        share = f"{r['screen_share']:.0%}" + ("" if r["screen_fits"] else " (too big)")
        out.append(f"| {r['screen_in']:g}\" {r['aspect']} | {r['fov_deg']:g} deg | {_angle(r['angle_deg'])} | "
                   f"{r['distance_m']:g} m | {share} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _floats(text: str, option: str) -> list[float]:
    """A comma-separated list of numbers given to `option` (ValueError naming the option and the value)."""
    out = []
    for part in (x.strip() for x in text.split(",") if x.strip()):
        try:
            out.append(float(part))
        except ValueError:
            raise ValueError(f"{option} {part}: expected numbers separated by commas, e.g. {option} 13.3,15.6") from None
    return out


def _aspects(text: str) -> list[tuple[int, int]]:
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        a, _, b = part.partition(":")
        if not (a.isdigit() and b.isdigit()):
            raise ValueError(f"--aspects {part}: write a panel shape as W:H, e.g. 16:10")
        out.append((int(a), int(b)))
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="a room file: its layouts ([link] ladder, or the pinned layout) and [screen] "
                   "size (default: the default ladder on a 1280x720 frame)")
    p.add_argument("--screens", default=",".join(f"{s:g}" for s in SCREENS_IN), help="screen diagonals, inches")
    p.add_argument("--aspects", default=",".join(f"{a}:{b}" for a, b in ASPECTS), help="panel shapes")
    p.add_argument("--distances", default=",".join(f"{d:g}" for d in DISTANCES_M),
                   help="metres from the webcam to the other screen's middle")
    p.add_argument("--fov", default=",".join(f"{f:g}" for f in FOVS_DEG),
                   help="webcam lenses: horizontal field of view, degrees")
    p.add_argument("--angle", default=",".join(f"{a:g}" for a in ANGLES_DEG),
                   help="viewing angles, degrees (0: head-on)")
    p.add_argument("--camera-width", type=int, default=CAMERA_WIDTH, help="webcam picture width, pixels")
    p.add_argument("--camera-height", type=int, default=CAMERA_HEIGHT, help="webcam picture height, pixels")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from wccl.config import ConfigError

    try:
        steps, frame = ladder_of(args.config)
        screens, aspects = _floats(args.screens, "--screens"), _aspects(args.aspects)
        distances, fovs = _floats(args.distances, "--distances"), _floats(args.fov, "--fov")
        angles = _floats(args.angle, "--angle")
    except ConfigError as e:
        print(f"wccl.lab: config error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"wccl.lab placement: {e}", file=sys.stderr)
        return 2
    bad = ([f"--screens {s:g}" for s in screens if s <= 0] + [f"--aspects {a}:{b}" for a, b in aspects if a <= 0 or b <= 0]
           + [f"--distances {d:g}" for d in distances if d <= 0] + [f"--fov {f:g}" for f in fovs if not 0 < f < 180]
           + [f"--angle {a:g}" for a in angles if not 0 <= a < 90]
           + [f"--camera-width/height {args.camera_width}x{args.camera_height}"
              for _ in [0] if min(args.camera_width, args.camera_height) < 1])
    if bad:
        print(f"wccl.lab placement: out of range: {', '.join(bad)}", file=sys.stderr)
        return 2
    if not steps:
        print("wccl.lab placement: no layout of the room fits its screen", file=sys.stderr)
        return 2
    table = placement(steps, frame=frame, screens=screens, aspects=aspects, distances=distances, fovs=fovs,
                      angles=angles, camera=(args.camera_width, args.camera_height))
    print(json.dumps(table) if args.json else markdown(table), end="\n" if args.json else "")
    return 0
