"""Where things are in the room: node poses, screens as planes, cameras as pinholes with lens distortion.

Consumes: each node's `ChannelParams` (pose, screen size, camera). Emits:
`Body` poses, `ScreenPlane`s and `PinholeCamera`s, and for a camera/screen
pair a `ScreenView`: the homography from screen pixels to the camera's
normalised image plane, whether the screen is in view, its footprint.

World frame: x east, y up, z north, metres. A node's body frame has its
origin at its screen's centre, x to the camera's right, y up, z out of the
screen (the way the screen shines and the camera looks). Camera frame
(OpenCV): x right, y down, z forward. Pixel centres sit at integer
coordinates (OpenCV's convention): a W-pixel-wide image spans [-0.5, W-0.5].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from wccl.room.params import ChannelParams


def _rot(axis: str, deg: float) -> np.ndarray:
    a = math.radians(deg)
    c, s = math.cos(a), math.sin(a)
    if axis == "x":
        return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])
    if axis == "y":
        return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


@dataclass(frozen=True)
class Body:
    """A node's pose: `origin` (its screen centre) and `R` (columns: body x, y, z in world)."""

    origin: np.ndarray
    R: np.ndarray

    def to_world(self, p: np.ndarray) -> np.ndarray:
        return self.origin + self.R @ np.asarray(p, dtype=float)


@dataclass(frozen=True)
class ScreenPlane:
    body: Body
    width_px: int
    height_px: int
    width_m: float
    height_m: float

    @property
    def normal(self) -> np.ndarray:
        return self.body.R[:, 2]

    def point(self, u: float, v: float) -> np.ndarray:
        """World position of screen pixel coordinate (u, v) (u right, v down as the viewer sees it)."""
        # The screen faces +z: a viewer in front sees the body's -x as its right.
        x = -((u + 0.5) / self.width_px - 0.5) * self.width_m
        y = (0.5 - (v + 0.5) / self.height_px) * self.height_m
        return self.body.to_world((x, y, 0.0))

    def pixel_axes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(world point of pixel (0, 0), world step per +1 u, world step per +1 v)."""
        p0 = self.point(0.0, 0.0)
        return p0, self.point(1.0, 0.0) - p0, self.point(0.0, 1.0) - p0


@dataclass(frozen=True)
class PinholeCamera:
    position: np.ndarray
    R: np.ndarray  # columns: camera x (right), y (down), z (forward) in world
    width: int
    height: int
    f: float
    k1: float = 0.0
    k2: float = 0.0

    def to_camera(self, p: np.ndarray) -> np.ndarray:
        return (np.asarray(p, dtype=float) - self.position) @ self.R

    def distort(self, xn: np.ndarray, yn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Normalised undistorted -> pixel coordinates."""
        r2 = xn * xn + yn * yn
        d = 1 + self.k1 * r2 + self.k2 * r2 * r2
        cx, cy = (self.width - 1) / 2, (self.height - 1) / 2
        return self.f * xn * d + cx, self.f * yn * d + cy

    def undistort(self, px: np.ndarray, py: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pixel -> normalised undistorted coordinates (the ray through each pixel)."""
        cx, cy = (self.width - 1) / 2, (self.height - 1) / 2
        xd = (np.asarray(px, dtype=np.float64) - cx) / self.f
        yd = (np.asarray(py, dtype=np.float64) - cy) / self.f
        if self.k1 == 0 and self.k2 == 0:
            return xd, yd
        xu, yu = xd.copy(), yd.copy()
        for _ in range(30):  # fixed point of x_d = x_u * d(r_u); converges for lens-like k1, k2
            r2 = xu * xu + yu * yu
            d = 1 + self.k1 * r2 + self.k2 * r2 * r2
            xu, yu = xd / d, yd / d
        return xu, yu


def screen_size_m(diag_in: float, width_px: int, height_px: int) -> tuple[float, float]:
    d = diag_in * 0.0254
    a = math.hypot(width_px, height_px)
    return d * width_px / a, d * height_px / a


def layout(params: list[ChannelParams], screen_w: int, screen_h: int, names: list[str] | None = None) -> list[Body]:
    """Every node's body pose: its `position_m`, or a place on the circle; aimed at the others (or at the node
    its `aim` names, by `names`), then turned. ValueError for an `aim` that names no other node."""
    n = len(params)
    aims: list[int | None] = []
    for i, p in enumerate(params):
        if p.aim is None:
            aims.append(None)
            continue
        who = names[i] if names is not None else f"node {i}"
        known = [m for j, m in enumerate(names or []) if j != i]
        if names is None or p.aim not in known:
            raise ValueError(f"room.nodes[{i}].channel.aim: {who} aims at {p.aim!r}, which is not another node "
                             f"of the room; known: {', '.join(known) or '(none)'}")
        aims.append(names.index(p.aim))
    positions = []
    for i, p in enumerate(params):
        if p.position_m is not None:
            positions.append(np.array(p.position_m, dtype=float))
            continue
        # Neighbours are distance_m apart on the circle (two nodes: face to face at distance_m).
        r = p.distance_m / (2 * math.sin(math.pi / n)) if n > 1 else 0.0
        th = 2 * math.pi * i / max(n, 1)
        positions.append(np.array([r * math.sin(th), 0.0, -r * math.cos(th)]))
    bodies = []
    up = np.array([0.0, 1.0, 0.0])
    for i, p in enumerate(params):
        others = [positions[j] for j in range(n) if j != i]
        if aims[i] is not None:
            target = positions[aims[i]]
        else:
            target = np.mean(others, axis=0) if others else positions[i] + np.array([0, 0, 1.0])
        fwd = target - positions[i]
        fwd = fwd / (np.linalg.norm(fwd) or 1.0)
        right = np.cross(up, fwd)
        if np.linalg.norm(right) < 1e-9:
            right = np.array([1.0, 0.0, 0.0])
        right /= np.linalg.norm(right)
        upv = np.cross(fwd, right)
        R_aim = np.stack([right, upv, fwd], axis=1)
        # +yaw turns towards the camera's left, +pitch tilts up, +roll turns clockwise as the camera sees it.
        R = R_aim @ _rot("y", -p.yaw_deg) @ _rot("x", -p.pitch_deg) @ _rot("z", p.roll_deg)
        bodies.append(Body(positions[i], R))
    return bodies


def screen_of(body: Body, p: ChannelParams, width_px: int, height_px: int) -> ScreenPlane:
    w, h = screen_size_m(p.screen_diag_in, width_px, height_px)
    return ScreenPlane(body, width_px, height_px, w, h)


def camera_of(body: Body, p: ChannelParams, screen: ScreenPlane) -> PinholeCamera:
    if p.camera_offset_m is None:
        off = (0.0, screen.height_m / 2 + p.bezel_m + 0.004)  # centred in the top bezel
    else:
        off = p.camera_offset_m
    pos = body.to_world((off[0], off[1], 0.0))
    R = np.stack([body.R[:, 0], -body.R[:, 1], body.R[:, 2]], axis=1)
    f = (p.camera_width / 2) / math.tan(math.radians(p.hfov_deg) / 2)
    return PinholeCamera(pos, R, p.camera_width, p.camera_height, f, p.distortion_k1, p.distortion_k2)


@dataclass(frozen=True)
class ScreenView:
    """How one camera sees one screen."""

    visible: bool
    H: np.ndarray | None          # screen px (u, v, 1) -> camera coords (x, y, z) up to scale (normalised plane)
    outline: np.ndarray | None    # distorted pixel polygon of the screen edge (N x 2)
    lid: np.ndarray | None        # distorted pixel polygon of screen + bezel
    angle_deg: float              # angle between the screen normal and the line to the camera
    distance_m: float
    reason: str = ""

    def to_screen(self, xn: np.ndarray, yn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Normalised undistorted camera coordinates -> screen pixel coordinates.

        Rays that meet the screen's plane behind the camera map far outside the screen.
        """
        Hi = np.linalg.inv(self.H)
        w = Hi[2, 0] * xn + Hi[2, 1] * yn + Hi[2, 2]
        # A point in front has camera z > 0: its ray d = (xn, yn, 1) = H @ (u, v, 1) / z, so w = 1 / z > 0.
        front = w > 1e-12
        w = np.where(front, w, 1.0)
        u = np.where(front, (Hi[0, 0] * xn + Hi[0, 1] * yn + Hi[0, 2]) / w, -1e6)
        v = np.where(front, (Hi[1, 0] * xn + Hi[1, 1] * yn + Hi[1, 2]) / w, -1e6)
        return u, v


def _edge(points: np.ndarray, per_edge: int = 48) -> np.ndarray:
    out = []
    for a, b in zip(points, np.roll(points, -1, axis=0)):
        s = np.linspace(0, 1, per_edge, endpoint=False)[:, None]
        out.append(a[None] * (1 - s) + b[None] * s)
    return np.concatenate(out)


def view(camera: PinholeCamera, screen: ScreenPlane, bezel_m: float = 0.0) -> ScreenView:
    """The projective view of `screen` from `camera` (not visible: behind, facing away or out of frame)."""
    c = screen.body.origin
    to_cam = camera.position - c
    dist = float(np.linalg.norm(to_cam))
    cosang = float(np.dot(screen.normal, to_cam) / max(dist, 1e-9))
    angle = math.degrees(math.acos(max(-1.0, min(1.0, cosang))))
    if cosang <= 0.02:
        return ScreenView(False, None, None, None, angle, dist, "facing away")
    W, Hh = screen.width_px, screen.height_px
    corners_uv = np.array([[-0.5, -0.5], [W - 0.5, -0.5], [W - 0.5, Hh - 0.5], [-0.5, Hh - 0.5]])
    p0, eu, ev = screen.pixel_axes()
    Hm = np.stack([camera.R.T @ eu, camera.R.T @ ev, camera.R.T @ (p0 - camera.position)], axis=1)
    # The lid: the screen grown by the bezel on every side, in screen pixels.
    bu = bezel_m / screen.width_m * W
    bv = bezel_m / screen.height_m * Hh
    lid_uv = corners_uv + np.array([[-bu, -bv], [bu, -bv], [bu, bv], [-bu, bv]])

    def project(uv: np.ndarray) -> np.ndarray | None:
        pts = _edge(uv)
        xyz = np.c_[pts, np.ones(len(pts))] @ Hm.T
        if (xyz[:, 2] <= 0.01).any():
            return None
        xn, yn = xyz[:, 0] / xyz[:, 2], xyz[:, 1] / xyz[:, 2]
        # Far outside the lens's field the distortion polynomial folds back: treat as out of view.
        r2 = xn * xn + yn * yn
        lim = (camera.width / 2 / camera.f) ** 2 + (camera.height / 2 / camera.f) ** 2
        xn, yn = np.where(r2 > 4 * lim, np.nan, xn), np.where(r2 > 4 * lim, np.nan, yn)
        px, py = camera.distort(xn, yn)
        return np.stack([px, py], axis=1)

    outline = project(corners_uv)
    if outline is None:
        return ScreenView(False, None, None, None, angle, dist, "behind the camera")
    lid = project(lid_uv)
    ok = np.isfinite(outline).all(axis=1)
    inside = ok & (outline[:, 0] > -0.5) & (outline[:, 0] < camera.width - 0.5) & \
        (outline[:, 1] > -0.5) & (outline[:, 1] < camera.height - 0.5)
    if not inside.any():
        # No edge point inside: the screen could still cover the whole frame; test the image centre.
        xn, yn = camera.undistort(np.array([(camera.width - 1) / 2]), np.array([(camera.height - 1) / 2]))
        u, v = ScreenView(True, Hm, None, None, angle, dist).to_screen(xn, yn)
        if not (-0.5 <= u[0] <= W - 0.5 and -0.5 <= v[0] <= Hh - 0.5):
            return ScreenView(False, None, None, None, angle, dist, "out of the field of view")
    if not ok.all():
        outline = outline[ok]
        lid = lid[np.isfinite(lid).all(axis=1)] if lid is not None else None
    return ScreenView(True, Hm, outline, lid, angle, dist)


@dataclass(frozen=True)
class Lid:
    """A laptop's lid: its screen grown by the bezel, an opaque rectangle (both faces) in the room."""

    name: str
    body: Body
    half_w: float
    half_h: float

    def corners(self) -> np.ndarray:
        """The four corners in world coordinates (4 x 3)."""
        return np.array([self.body.to_world((x * self.half_w, y * self.half_h, 0.0))
                         for x, y in ((-1, 1), (1, 1), (1, -1), (-1, -1))])

    def hit(self, origin: np.ndarray, dirs: np.ndarray) -> np.ndarray:
        """Per ray `origin + t * dirs` (dirs: ... x 3): the t > 0 where it meets the lid, inf where it misses."""
        ex, ey, ez = self.body.R[:, 0], self.body.R[:, 1], self.body.R[:, 2]
        rel = np.asarray(origin, dtype=float) - self.body.origin
        dz = dirs @ ez
        with np.errstate(divide="ignore", invalid="ignore"):
            t = -(rel @ ez) / dz
            x = rel @ ex + t * (dirs @ ex)
            y = rel @ ey + t * (dirs @ ey)
            ok = (np.abs(dz) > 1e-12) & (t > 1e-9) & (np.abs(x) <= self.half_w) & (np.abs(y) <= self.half_h)
        return np.where(ok, t, np.inf)


def lid_of(name: str, screen: ScreenPlane, bezel_m: float) -> Lid:
    return Lid(name, screen.body, screen.width_m / 2 + bezel_m, screen.height_m / 2 + bezel_m)


def plane_hit(plane: ScreenPlane, origin: np.ndarray, dirs: np.ndarray) -> np.ndarray:
    """Per ray: the t where it meets the screen's (unbounded) plane; inf if never in front."""
    n = plane.normal
    dz = dirs @ n
    with np.errstate(divide="ignore", invalid="ignore"):
        t = ((plane.body.origin - np.asarray(origin, dtype=float)) @ n) / dz
    return np.where((np.abs(dz) > 1e-12) & (t > 0), t, np.inf)


def occluder(camera: PinholeCamera, target: np.ndarray, lids: list[Lid]) -> str | None:
    """The nearest lid between `camera` and the world point `target` (its name), or None."""
    d = np.asarray(target, dtype=float) - camera.position
    best, name = 1.0 - 1e-6, None
    for lid in lids:
        t = float(lid.hit(camera.position, d[None])[0])
        if t < best:
            best, name = t, lid.name
    return name


def project_polygon(camera: PinholeCamera, corners: np.ndarray, per_edge: int = 24) -> np.ndarray | None:
    """Distorted pixel polygon of a flat world polygon (clipped to the space in front of the camera), or None."""
    z_near = 0.02
    cam = np.array([camera.to_camera(c) for c in corners])
    kept = []
    for a, b in zip(cam, np.roll(cam, -1, axis=0)):  # Sutherland-Hodgman against z = z_near
        if a[2] >= z_near:
            kept.append(a)
        if (a[2] >= z_near) != (b[2] >= z_near):
            kept.append(a + (b - a) * (z_near - a[2]) / (b[2] - a[2]))
    if len(kept) < 3:
        return None
    pts = _edge(np.array(kept), per_edge)
    xn, yn = pts[:, 0] / pts[:, 2], pts[:, 1] / pts[:, 2]
    # Beyond the lens's field the distortion polynomial may fold back: pull such points in radially.
    lim = 4 * ((camera.width / 2 / camera.f) ** 2 + (camera.height / 2 / camera.f) ** 2)
    r2 = xn * xn + yn * yn
    s = np.where(r2 > lim, np.sqrt(lim / np.maximum(r2, 1e-12)), 1.0)
    px, py = camera.distort(xn * s, yn * s)
    return np.stack([px, py], axis=1)


__all__ = ["Body", "Lid", "lid_of", "plane_hit", "occluder", "project_polygon", "ScreenPlane", "PinholeCamera", "ScreenView", "layout", "screen_of", "camera_of", "view",
           "screen_size_m"]
