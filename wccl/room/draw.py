"""`wccl room draw ROOM [--out FILE.png]`: a room file seen from above, and who reads whom.

Made from the room file alone, before any run: the simulated room
(`SimulatedRoom.from_config`) places and turns every laptop by its pose
(wccl/room/geometry.py) and decides which camera sees which screen; this
draws that with OpenCV into a PNG (`--out`; by default the room file's
name with `.png`, in the current folder):

- each laptop's lid as a bar (its screen, seen from above; the screen's
  side blue), its name behind it, its webcam as a dot;
- each camera's horizontal field of view as a wedge (the edges of its
  picture, through its lens's distortion);
- an arrow for each direction, from a screen to the camera that films it
  (as the console writes a direction: `bob -> alice` is bob's screen read
  by alice's camera): green where a layout of the room's ladder is
  readable, labelled with the densest such layout's camera pixels per cell;
  amber where the camera sees the screen but no layout is readable; red and
  dashed where it does not see the screen (drawn in rooms of up to four
  laptops; the text says why in every room);
- the distance from each webcam to the middle of the other screen, metres;
- a table of camera pixels per cell for each layout of the ladder and each
  direction, green where readable;
- a legend and a title (the room file's name).

Camera pixels per cell: a cell of the layout in the middle of the screen,
projected into the camera's picture by the room (pose, lens, distortion,
where in the picture the screen lands: `SimulatedRoom.project`), the
narrower of its two sides. A layout is readable when that is at least what
the placement table asks (`wccl.lab.placement.MIN_CAMERA_PX_PER_CELL`: 4.5
for 8 colours, 4.0 for 4 and 2, its estimate for a real webcam; the
simulated room reads a little less) and its whole code lies inside the
camera's picture. Light, blur and compression are left out: a run's
start-up measures what actually reads (`sight_known`).

It prints a line per direction too: seen or not and why, the distance and
angle, and the densest readable layout with its camera pixels per cell. An
observer's screen shows nothing: its directions are left out.

Rooms without geometry: a room of profile `exact` (a perfect camera that
sees the other screens side by side) has no poses; this says so in one line
and exits 0 without a picture. A room of real devices (`medium =
"hardware"`, or the desktop loopback) has none either: this says that the
picture needs a simulated room and exits 2, as for a room file that does
not load or an `--out` it cannot write.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from wccl.cli import command_parser
from wccl.lab.placement import MIN_CAMERA_PX_PER_CELL, layout_label, ladder_of, needed_px

WIDTH = 1200  # the picture's width, pixels (its height follows the room's shape and the table's rows)
MARGIN = 30
VIEW_MAX_H = 700  # the top view's height at most (and at least VIEW_MIN_H)
VIEW_MIN_H = 380
TABLE_ROWS = 16  # directions listed in the picture's table at most (the text lists all)
LABELLED = 4  # rooms of up to this many laptops: unseen directions drawn, every arrow and distance labelled
FONT = cv2.FONT_HERSHEY_SIMPLEX

# BGR
INK = (40, 40, 40)
MUTED = (120, 120, 120)
LID = (70, 60, 50)
SCREEN = (200, 130, 40)
CAMERA = (20, 20, 20)
FOV = (120, 220, 245)
FOV_EDGE = (60, 170, 210)
READS = (40, 150, 40)
SEES = (0, 140, 235)
UNSEEN = (50, 50, 210)
PAPER = (255, 255, 255)


@dataclass(frozen=True)
class Direction:
    """One direction of a room: `shown`'s screen filmed by `viewer`'s camera, and what each layout makes of it."""

    shown: str
    viewer: str
    seen: bool
    reason: str  # why not seen ("" when seen)
    distance_m: float  # the viewer's webcam to the middle of the shown screen
    angle_deg: float  # between the shown screen's axis and the line to the webcam
    px: tuple[float, ...]  # camera pixels per cell, per layout of the ladder
    whole: tuple[bool, ...]  # the layout's code lies wholly inside the camera's picture, per layout
    readable: tuple[bool, ...]

    @property
    def best(self) -> int | None:
        """The densest readable layout (the ladder lists the densest first): its index, or None."""
        return next((k for k, ok in enumerate(self.readable) if ok), None)

    @property
    def name(self) -> str:
        return f"{self.shown} -> {self.viewer}"


def _code_outline(layout, screen_w: int, screen_h: int, per_edge: int = 8) -> np.ndarray:
    """Screen pixel coordinates along the edge of a layout's code, centred on the screen as it is shown."""
    h, w = layout.size_px
    x0, y0 = (screen_w - w) // 2 - 0.5, (screen_h - h) // 2 - 0.5
    corners = np.array([[x0, y0], [x0 + w, y0], [x0 + w, y0 + h], [x0, y0 + h]])
    s = np.linspace(0, 1, per_edge, endpoint=False)[:, None]
    return np.concatenate([a * (1 - s) + b * s for a, b in zip(corners, np.roll(corners, -1, axis=0))])


def _px_per_cell(room, viewer: str, shown: str, cell_px: int) -> float:
    """Camera pixels across one cell of `cell_px` screen pixels in the middle of `shown`'s screen, as `viewer`'s
    camera films it (`room.project`: pose, lens and its distortion, where in the picture the screen lands);
    the narrower of its two sides, as the placement table gives it. NaN for a screen out of view."""
    W, H = room.screen_w, room.screen_h
    c = np.array([(W - 1) / 2, (H - 1) / 2])
    q = room.project(viewer, shown, np.array([c, c + (cell_px, 0), c + (0, cell_px)]))
    return float(min(np.hypot(*(q[1] - q[0])), np.hypot(*(q[2] - q[0]))))


def directions(room, steps, link, quiet: frozenset[str] | set[str] = frozenset()) -> list[Direction]:
    """Every direction of a room with geometry (a camera outer, in room order) but from the screens of `quiet`
    (observers: they show nothing), with the camera pixels per cell of each layout of `steps` and whether it
    is readable: enough pixels (`wccl.lab.placement.needed_px`) and the code wholly inside the picture."""
    from protocols.layout import GridLayout

    W, H = room.screen_w, room.screen_h
    layouts = [GridLayout(s.rows, s.cols, s.colours, s.cell_px, link.border_cells, link.pilot_spacing) for s in steps]
    outlines = [_code_outline(g, W, H) for g in layouts]
    out = []
    for viewer in room.nodes:
        p = room.params[viewer]
        for shown in room.nodes:
            if shown == viewer or shown in quiet:
                continue
            v = room.views[(viewer, shown)]
            px = tuple(_px_per_cell(room, viewer, shown, s.cell_px) for s in steps)
            whole = []
            for line in outlines:
                q = room.project(viewer, shown, line) if v.visible else np.full((1, 2), np.nan)
                inside = (q[:, 0] > -0.5) & (q[:, 0] < p.camera_width - 0.5) & (q[:, 1] > -0.5) & \
                    (q[:, 1] < p.camera_height - 0.5)  # (NaN: out of view, never inside)
                whole.append(bool(inside.all()))
            readable = tuple(v.visible and ok and x >= needed_px(s.colours) for s, x, ok in zip(steps, px, whole))
            out.append(Direction(shown, viewer, v.visible, v.reason, v.distance_m, v.angle_deg, px, tuple(whole),
                                 readable))
    return out


def _need() -> str:
    """The camera pixels per cell a layout needs, in words: "4.5 camera px per cell for 8 colours, 4.0 for 4
    and 2" (the placement table's estimate for a real webcam)."""
    by: dict[float, list[int]] = {}
    for colours, px in sorted(MIN_CAMERA_PX_PER_CELL.items(), reverse=True):
        by.setdefault(px, []).append(colours)
    parts = [f"{px:.1f} for {' and '.join(map(str, cs))}" for px, cs in by.items()]
    head = parts[0].replace(" for ", " camera px per cell for ", 1)
    return f"{head} colours" + "".join(f", {p}" for p in parts[1:])


def _why_none(d: Direction, steps) -> str:
    """Why no layout is readable in a direction that is seen, in words."""
    fits = [k for k, ok in enumerate(d.whole) if ok]
    if not fits:
        return "no layout's code fits wholly in the picture (the screen is cut off at its edge)"
    k = max(fits, key=lambda i: d.px[i] / needed_px(steps[i].colours))
    return (f"cells too small: {layout_label(steps[k])} comes nearest, {math.floor(d.px[k] * 10) / 10:.1f} camera px "
            f"per cell of the {needed_px(steps[k].colours):g} it needs")


def summary(title: str, room, steps, dirs: list[Direction],
            quiet: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """The text: a head line, then a line per direction seen and, per camera, a line per reason it does not see
    other screens (all of them, grouped); a line for the observers (`quiet`), whose screens show nothing."""
    lines = [f"{title}: profile {room.profile}, {len(room.nodes)} laptops, {len(steps)} "
             f"layout{'s' if len(steps) != 1 else ''} (readable: at least {_need()}, and the whole code in the "
             "picture)"]
    for viewer in room.nodes:
        mine = [d for d in dirs if d.viewer == viewer]
        lens = f"{room.params[viewer].hfov_deg:.0f}-deg lens"
        for d in mine:
            if not d.seen:
                continue
            where = f"seen, {d.distance_m:.2f} m, {d.angle_deg:.0f} deg off the screen's axis, {lens}"
            if d.best is None:
                lines.append(f"  {d.name}: {where}; no layout readable: {_why_none(d, steps)}")
            else:
                lines.append(f"  {d.name}: {where}; readable: {layout_label(steps[d.best])} at "
                             f"{math.floor(d.px[d.best] * 10) / 10:.1f} camera px per cell")
        unseen: dict[str, list[Direction]] = {}
        for d in mine:
            if not d.seen:
                unseen.setdefault(d.reason, []).append(d)
        for reason, group in unseen.items():
            far = ", ".join(f"{d.distance_m:.2f} m" for d in group)
            lines.append(f"  {', '.join(d.shown for d in group)} -> {viewer}: not seen: {reason} ({far})")
    if quiet:
        names = [n for n in room.nodes if n in quiet]
        lines.append(f"  ({', '.join(names)}: {'an observer' if len(names) == 1 else 'observers'}, showing nothing; "
                     "only the camera counts)")
    return lines


# ---- the picture -----------------------------------------------------------------------------------


def _text(img: np.ndarray, text: str, org: tuple[float, float], scale: float = 0.45, colour=INK, thick: int = 1,
          centre: bool = False, box: bool = False) -> None:
    (w, h), base = cv2.getTextSize(text, FONT, scale, thick)
    x, y = int(round(org[0] - (w / 2 if centre else 0))), int(round(org[1] + (h / 2 if centre else 0)))
    if box:
        cv2.rectangle(img, (x - 3, y - h - 3), (x + w + 3, y + base), PAPER, -1)
    cv2.putText(img, text, (x, y), FONT, scale, colour, thick, cv2.LINE_AA)


def _dashed(img: np.ndarray, a: np.ndarray, b: np.ndarray, colour, thick: int = 1, dash: float = 9.0) -> None:
    length = float(np.linalg.norm(b - a))
    n = max(1, int(length // dash))
    for i in range(0, n, 2):
        p, q = a + (b - a) * i / n, a + (b - a) * min(i + 1, n) / n
        cv2.line(img, tuple(np.round(p).astype(int)), tuple(np.round(q).astype(int)), colour, thick, cv2.LINE_AA)


class _TopView:
    """World (x east, z north; metres) to the top view's pixels: north up, east right, as a map."""

    def __init__(self, points: np.ndarray, width: int) -> None:
        lo, hi = points.min(axis=0), points.max(axis=0)
        span = hi - lo
        pad = max(0.2, 0.1 * float(span.max()))
        lo, hi = lo - pad, hi + pad
        span = hi - lo
        self.scale = min((width - 2 * MARGIN) / span[0], VIEW_MAX_H / span[1])
        self.height = int(max(VIEW_MIN_H, math.ceil(span[1] * self.scale)))
        self.x0 = MARGIN + ((width - 2 * MARGIN) - span[0] * self.scale) / 2 - lo[0] * self.scale
        self.z0 = (self.height - span[1] * self.scale) / 2 + hi[1] * self.scale

    def __call__(self, xz) -> np.ndarray:
        xz = np.asarray(xz, dtype=float)
        return np.stack([self.x0 + xz[..., 0] * self.scale, self.z0 - xz[..., 1] * self.scale], axis=-1)


def _xz(p: np.ndarray) -> np.ndarray:
    return np.asarray(p, dtype=float)[..., [0, 2]]


def _pt(p: np.ndarray) -> tuple[int, int]:
    return int(round(float(p[0]))), int(round(float(p[1])))


def _fov_edges(cam) -> list[np.ndarray]:
    """The world directions (x, z) of the left and right edges of a camera's picture, through its middle row."""
    xn, yn = cam.undistort(np.array([-0.5, cam.width - 0.5]), np.array([(cam.height - 1) / 2] * 2))
    out = []
    for x, y in zip(xn, yn):
        d = _xz(cam.R @ np.array([x, y, 1.0]))
        out.append(d / (np.linalg.norm(d) or 1.0))
    return out


def _top_view(room, dirs: list[Direction], steps) -> np.ndarray:
    from wccl.room.geometry import lid_of

    lids = {n: lid_of(n, room.planes[n], room.params[n].bezel_m) for n in room.nodes}
    cams = {n: room.cams[n].camera for n in room.nodes}
    centres = {n: _xz(room.planes[n].body.origin) for n in room.nodes}
    pts = np.concatenate([_xz(lids[n].corners()) for n in room.nodes]
                         + [_xz(cams[n].position)[None] for n in room.nodes])
    tv = _TopView(pts, WIDTH)
    img = np.full((tv.height, WIDTH, 3), PAPER, np.uint8)

    # Fields of view: translucent wedges, a little longer than the furthest screen the camera sees (than the
    # nearest other screen, when it sees none).
    wedges = img.copy()
    edges = []
    for n in room.nodes:
        c = _xz(cams[n].position)
        far = {m: float(np.linalg.norm(centres[m] - c)) for m in room.nodes if m != n}
        seen = [far[m] for m in far if room.views[(n, m)].visible]
        reach = 1.15 * max(seen or [min(far.values(), default=0.5)])
        left, right = _fov_edges(cams[n])
        a0, a1 = math.atan2(left[1], left[0]), math.atan2(right[1], right[0])
        sweep = (a1 - a0 + math.pi) % (2 * math.pi) - math.pi  # the short way round: the lens is under 180 deg
        arc = [c + reach * np.array([math.cos(a0 + sweep * t), math.sin(a0 + sweep * t)])
               for t in np.linspace(0, 1, 33)]
        poly = tv(np.array([c, *arc]))
        cv2.fillPoly(wedges, [np.round(poly).astype(np.int32)], FOV, cv2.LINE_AA)
        edges.append(poly)
    img = cv2.addWeighted(wedges, 0.45, img, 0.55, 0)
    for poly in edges:
        for k in (1, -1):
            cv2.line(img, _pt(poly[0]), _pt(poly[k]), FOV_EDGE, 1, cv2.LINE_AA)

    # Directions: arrows from a screen to the camera that films it, side by side when both ways are drawn.
    small = len(room.nodes) <= LABELLED
    labels = []
    for d in dirs:
        if not d.seen and not small:
            continue
        a, b = tv(centres[d.shown]), tv(_xz(cams[d.viewer].position))
        along = b - a
        length = float(np.linalg.norm(along))
        if length < 30:
            continue
        u = along / length
        side = np.array([-u[1], u[0]])  # the arrow's right on the page (y down)
        a, b = a + 16 * u + 6 * side, b - 10 * u + 6 * side
        if not d.seen:
            _dashed(img, a, b, UNSEEN, 1)
            tip = b - 10 * u
            for s in (1, -1):
                cv2.line(img, _pt(b), _pt(tip + 5 * s * side), UNSEEN, 1, cv2.LINE_AA)
            continue
        colour = READS if d.best is not None else SEES
        cv2.arrowedLine(img, _pt(a), _pt(b), colour, 2, cv2.LINE_AA, tipLength=min(0.3, 14 / max(length, 1)))
        if small:
            text = (f"{steps[d.best].cell_px} px cells: {math.floor(d.px[d.best] * 10) / 10:.1f} camera px"
                    if d.best is not None else "no layout readable")
            labels.append((a + 0.3 * (b - a) + 14 * side, text, colour, side))
    for n in room.nodes:  # lids over the wedges and arrows
        corners = tv(_xz(lids[n].corners()))
        hull = cv2.convexHull(np.round(corners).astype(np.int32))
        cv2.fillConvexPoly(img, hull, LID, cv2.LINE_AA)
        lo = lids[n].body.to_world((-lids[n].half_w, 0.0, 0.0))
        hi = lids[n].body.to_world((lids[n].half_w, 0.0, 0.0))
        cv2.line(img, _pt(tv(_xz(lo))), _pt(tv(_xz(hi))), LID, 7, cv2.LINE_AA)
        normal = _xz(room.planes[n].normal)
        normal = normal / (np.linalg.norm(normal) or 1.0)
        face = np.array([normal[0], -normal[1]])  # on the page
        cv2.line(img, _pt(tv(_xz(lo)) + 3 * face), _pt(tv(_xz(hi)) + 3 * face), SCREEN, 2, cv2.LINE_AA)
        cv2.circle(img, _pt(tv(_xz(cams[n].position)) + 4 * face), 4, CAMERA, -1, cv2.LINE_AA)
        _text(img, n, tv(centres[n]) - 22 * face, 0.6, INK, 2, centre=True, box=True)
    for org, text, colour, side in labels:
        w = cv2.getTextSize(text, FONT, 0.42, 1)[0][0]
        x = org[0] - (w if side[0] < -0.3 else (w / 2 if abs(side[0]) <= 0.3 else 0))
        _text(img, text, (x, org[1] + 5), 0.42, colour, 1, box=True)
    if small:  # the distance of each pair of laptops, webcam to screen, once a pair
        done = set()
        for d in dirs:
            pair = frozenset((d.shown, d.viewer))
            if pair in done:
                continue
            done.add(pair)
            both = [e for e in dirs if frozenset((e.shown, e.viewer)) == pair]
            mid = (tv(centres[d.shown]) + tv(_xz(cams[d.viewer].position))) / 2
            far = {f"{e.distance_m:.2f}" for e in both}
            _text(img, " / ".join(sorted(far)) + " m", mid, 0.45, INK, 1, centre=True, box=True)

    # A scale bar.
    metres = next(m for m in (0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0) if m * tv.scale >= 90)
    x0, y0 = MARGIN, tv.height - 18
    cv2.line(img, (x0, y0), (int(x0 + metres * tv.scale), y0), INK, 2)
    for x in (x0, int(x0 + metres * tv.scale)):
        cv2.line(img, (x, y0 - 5), (x, y0 + 5), INK, 2)
    _text(img, f"{metres * 100:.0f} cm" if metres < 1 else f"{metres:g} m", (x0 + metres * tv.scale + 10, y0 + 5))
    return img


def _legend(room) -> np.ndarray:
    img = np.full((58, WIDTH, 3), PAPER, np.uint8)
    x, y = MARGIN, 18
    items = [("arrow", READS, "seen, readable: camera px per cell of the densest readable layout"),
             ("arrow", SEES, "seen, no layout readable"),
             ("dashed", UNSEEN, "does not see the screen"
              + ("" if len(room.nodes) <= LABELLED else " (not drawn: see the text)"))]
    for kind, colour, text in items:
        a, b = np.array([x, y - 4.0]), np.array([x + 34, y - 4.0])
        if kind == "arrow":
            cv2.arrowedLine(img, _pt(a), _pt(b), colour, 2, cv2.LINE_AA, tipLength=0.3)
        else:
            _dashed(img, a, b, colour, 1, 6)
        _text(img, text, (x + 42, y), 0.42)
        x += 42 + cv2.getTextSize(text, FONT, 0.42, 1)[0][0] + 26
    x, y = MARGIN, 44
    cv2.fillPoly(img, [np.array([[x, y - 4], [x + 34, y - 14], [x + 34, y + 6]], np.int32)], FOV, cv2.LINE_AA)
    _text(img, "a camera's field of view", (x + 42, y))
    x += 42 + cv2.getTextSize("a camera's field of view", FONT, 0.42, 1)[0][0] + 26
    cv2.line(img, (x, y - 4), (x + 34, y - 4), LID, 7)
    cv2.line(img, (x, y), (x + 34, y), SCREEN, 2)
    cv2.circle(img, (x + 17, y + 1), 4, CAMERA, -1, cv2.LINE_AA)
    text = "a lid, its screen's side (blue) and webcam (dot); arrows run from a screen to the camera reading it"
    _text(img, text, (x + 42, y))
    return img


def _table(steps, dirs: list[Direction]) -> np.ndarray:
    shown = sorted(dirs, key=lambda d: not d.seen)[:TABLE_ROWS]
    more = len(dirs) - len(shown)
    row_h, head_h = 22, 64
    height = head_h + row_h * len(shown) + (26 if more else 0) + 16
    img = np.full((height, WIDTH, 3), PAPER, np.uint8)
    _text(img, f"Camera pixels per cell of each layout (green: readable, at least {_need()}, and the whole "
               "code in the picture; 'cut': cut off)", (MARGIN, 18), 0.45, INK)
    cols = [MARGIN, MARGIN + 190, MARGIN + 265]
    step_w = min(110, (WIDTH - MARGIN - (MARGIN + 330)) // max(len(steps), 1))
    cols += [MARGIN + 330 + k * step_w for k in range(len(steps))]
    y = 42
    for x, text in zip(cols, ("screen -> camera", "distance", "angle")):
        _text(img, text, (x, y + 14), 0.42, MUTED)
    for k, s in enumerate(steps):
        _text(img, f"{s.rows}x{s.cols}", (cols[3 + k], y), 0.42, MUTED)
        _text(img, f"{s.cell_px}px {s.colours}c", (cols[3 + k], y + 16), 0.42, MUTED)
    cv2.line(img, (MARGIN, head_h - 2), (WIDTH - MARGIN, head_h - 2), MUTED, 1)
    for i, d in enumerate(shown):
        y = head_h + row_h * (i + 1) - 6
        _text(img, d.name, (cols[0], y), 0.45, INK if d.seen else MUTED)
        _text(img, f"{d.distance_m:.2f} m", (cols[1], y), 0.45, INK if d.seen else MUTED)
        _text(img, f"{d.angle_deg:.0f} deg", (cols[2], y), 0.45, INK if d.seen else MUTED)
        if not d.seen:
            _text(img, f"not seen: {d.reason}", (cols[3], y), 0.45, UNSEEN)
            continue
        for k in range(len(steps)):
            text = f"{math.floor(d.px[k] * 10) / 10:.1f}" + ("" if d.whole[k] else " cut")
            _text(img, text, (cols[3 + k], y), 0.45, READS if d.readable[k] else UNSEEN, 2 if k == d.best else 1)
    if more:
        _text(img, f"... and {more} more directions: the text summary lists them all",
              (MARGIN, head_h + row_h * len(shown) + 16), 0.45, MUTED)
    return img


def picture(title: str, room, steps, dirs: list[Direction]) -> np.ndarray:
    """The whole picture: title, top view, legend, table (BGR, WIDTH wide)."""
    head = np.full((74, WIDTH, 3), PAPER, np.uint8)
    _text(head, f"{title}, seen from above", (MARGIN, 32), 0.8, INK, 2)
    lenses = sorted({f"{room.params[n].hfov_deg:.0f}" for n in room.nodes}, key=float)
    sizes = sorted({f"{room.params[n].screen_diag_in:g}" for n in room.nodes}, key=float)
    _text(head, f"profile {room.profile}, {len(room.nodes)} laptops, {'/'.join(sizes)}-inch screens, "
                f"{'/'.join(lenses)}-degree webcams; distances: webcam to the other screen's middle",
          (MARGIN, 58), 0.48, MUTED)
    parts = [head, _top_view(room, dirs, steps), _legend(room), _table(steps, dirs)]
    return np.concatenate(parts, axis=0)


# ---- the command -----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("wccl.room.draw", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    ap.add_argument("room", metavar="ROOM", help="a room file (its laptops, poses and layouts)")
    ap.add_argument("--out", help="the PNG to write (default: the room file's name with .png, in this folder)")
    args = ap.parse_args(argv)

    from wccl.config import ConfigError, load_config
    from wccl.runtime.logs import configure_logging
    from wccl.room import SimulatedRoom

    path = Path(args.room)
    title = args.room if not path.is_absolute() else path.name
    out = Path(args.out) if args.out else Path(path.stem + ".png")
    if not out.parent.is_dir():
        print(f"{ap.prog}: --out {out}: no folder {out.parent}", file=sys.stderr)
        return 2
    if not cv2.haveImageWriter(str(out)):
        print(f"{ap.prog}: --out {out}: not a picture OpenCV writes (name it FILE.png)", file=sys.stderr)
        return 2
    try:
        cfg = load_config(path)
    except ConfigError as e:
        print(f"{ap.prog}: config error: {e}", file=sys.stderr)
        return 2
    if cfg.room.medium != "simulated":
        print(f"{ap.prog}: {title}: medium {cfg.room.medium!r} runs real devices, which have no poses in the room "
              "file: the picture needs a simulated room (medium = \"simulated\", e.g. rooms/two-laptops-sim.toml)",
              file=sys.stderr)
        return 2
    if cfg.room.profile == "exact":
        print(f"{title}: profile 'exact': a perfect camera sees the other screens side by side, there are no poses "
              "to draw (profiles 'ideal', 'webcam' and 'harsh' place the laptops); no picture written")
        return 0
    configure_logging("console", "error", stream=sys.stderr)  # (the room's own notes are this command's text)
    try:
        room = SimulatedRoom.from_config(cfg)
        steps, _ = ladder_of(str(path))
    except (ConfigError, ValueError) as e:
        print(f"{ap.prog}: config error: {title}: {e}", file=sys.stderr)
        return 2
    if not steps:
        print(f"{ap.prog}: {title}: no layout of the room fits its screen", file=sys.stderr)
        return 2
    quiet = {n.name for n in cfg.room.nodes if "observer" in n.roles}
    dirs = directions(room, steps, cfg.link, quiet)
    for line in summary(title, room, steps, dirs, quiet):
        print(line)
    image = picture(title, room, steps, dirs)
    if not cv2.imwrite(str(out), image):
        print(f"{ap.prog}: --out {out}: could not write the picture there", file=sys.stderr)
        return 2
    print(f"wrote {out} ({image.shape[1]}x{image.shape[0]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
