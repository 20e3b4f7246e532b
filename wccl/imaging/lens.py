"""A wide lens bends straight lines: fit its radial distortion from the codes' own borders.

`reader.sample` maps the code grid onto the image with one homography from the quad's corners: right
for a pinhole, wrong by up to a few cells for a screen seen at 45 degrees through a 128-degree lens
(rooms/circle-4.toml), where barrel distortion bends the code's edges and squeezes its far cells.

Here each code's outer edge (the white ring's border with the black screen around it) is found along
24 normal profiles per side, to a tenth of a cell. A screen is flat, so through an undistorted lens
each side is a straight line: `LensFit` finds the radial model (about the image centre, in units of
half the image width: r' = r (1 + a r^2 + b r^4)) that makes every side seen so far straightest,
and `sample` maps the grid through the homography of the straightened corners, then through the lens.
The fit is the camera's (the lens does not change): made from the first captures with codes in
them, refined now and then. Pure numpy and OpenCV: no I/O.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import cv2
import numpy as np

from protocols.layout import GridLayout
from wccl.imaging.reader import SAMPLE_OFFSETS, _brightest_channel, grid_homography, pixel_index

PROFILES = 24  # normal profiles per side
PLACE_CELLS = 8  # a code's place in the image: its centre on a grid of this many cells across
PLACE_TRIAL = 10  # codes at each place, read both ways once the fits are done, before its way is chosen
REUSE_PX = 0.5  # a code whose corners moved less than this keeps the edges found before
MAX_KEPT_LAYOUTS = 8  # edges are kept for four codes in up to this many layouts each
_S = np.linspace(2.0, -0.8, 57)  # outward offsets (cells) along a profile: outside (dark) into the white ring
_NORMALS = (np.array([0.0, -1.0]), np.array([1.0, 0.0]), np.array([0.0, 1.0]), np.array([-1.0, 0.0]))


@dataclass(frozen=True)
class Lens:
    """Radial distortion about the image centre: undistorted -> distorted is r (1 + a r^2 + b r^4),
    r in units of half the image width."""

    width: int
    height: int
    a: float = 0.0
    b: float = 0.0

    @property
    def _c(self) -> np.ndarray:
        return np.array([(self.width - 1) / 2, (self.height - 1) / 2])

    def distort(self, p: np.ndarray) -> np.ndarray:
        s = self.width / 2
        q = (p - self._c) / s
        r2 = (q * q).sum(axis=1, keepdims=True)
        return self._c + s * q * (1 + self.a * r2 + self.b * r2 * r2)

    def undistort(self, p: np.ndarray) -> np.ndarray:
        s = self.width / 2
        qd = (p - self._c) / s
        q = qd.copy()
        for _ in range(20):  # fixed point of q_d = q (1 + a r^2 + b r^4); converges for lens-like a, b
            r2 = (q * q).sum(axis=1, keepdims=True)
            q = qd / (1 + self.a * r2 + self.b * r2 * r2)
        return self._c + s * q


def edge_points(bright: np.ndarray, corners: np.ndarray, layout: GridLayout) -> list[np.ndarray] | None:
    """Image points on the outer edge of each side (top, right, bottom, left), found along normal
    profiles of the brightest channel `bright` (float32) where it crosses half way from the dark outside
    to the white ring; None if a side has fewer than 6."""
    H = grid_homography(corners, layout)
    out_r, out_c = layout.outer_cells
    t = np.linspace(0.04, 0.96, PROFILES)
    bases = (np.c_[t * out_c, np.zeros_like(t)], np.c_[np.full_like(t, out_c), t * out_r],
             np.c_[t * out_c, np.full_like(t, out_r)], np.c_[np.zeros_like(t), t * out_r])
    prof = np.concatenate([b[:, None, :] + _S[None, :, None] * n for b, n in zip(bases, _NORMALS)])
    img = cv2.perspectiveTransform(prof.reshape(-1, 1, 2).astype(np.float32), H).reshape(-1, 2)
    vals = cv2.remap(bright, img[:, 0].reshape(1, -1), img[:, 1].reshape(1, -1), cv2.INTER_LINEAR,
                     borderMode=cv2.BORDER_REPLICATE).reshape(4 * PROFILES, len(_S))
    lo = vals[:, :10].min(axis=1)  # 1.5 cells and more outside: the screen's black
    hi = vals[:, _S < -0.05].max(axis=1)  # the white ring
    thr = (lo + hi) / 2
    above = vals >= thr[:, None]
    j = np.argmax(above, axis=1)
    ok = (hi - lo >= 30) & (j > 0) & above.any(axis=1)
    rows = np.arange(len(j))
    jj = np.maximum(j, 1)
    v0, v1 = vals[rows, jj - 1], vals[rows, jj]
    f = np.clip((thr - v0) / np.maximum(v1 - v0, 1e-6), 0, 1)
    s = _S[jj - 1] + f * (_S[jj] - _S[jj - 1])
    edge = np.concatenate(bases) + s[:, None] * np.repeat(np.stack(_NORMALS), PROFILES, axis=0)
    pts = cv2.perspectiveTransform(edge.reshape(-1, 1, 2).astype(np.float32), H).reshape(-1, 2).astype(np.float64)
    sides = []
    for k in range(4):
        sel = ok[k * PROFILES:(k + 1) * PROFILES]
        if sel.sum() < 6:
            return None
        sides.append(pts[k * PROFILES:(k + 1) * PROFILES][sel])
    return sides


def _line(p: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """The best line through points: a point on it, its direction, and the squared residual."""
    m = p.mean(axis=0)
    _, sv, vt = np.linalg.svd(p - m, full_matrices=False)
    return m, vt[0], float(sv[-1] ** 2)


def straightness(lens: Lens, sides: list[np.ndarray]) -> float:
    """How far the undistorted sides are from straight lines (sum of squared residuals, pixels^2): each
    side's residual about its best line is the smaller eigenvalue of its points' scatter matrix (what
    `_line` gets from the SVD), here for every side at once (the lens fit asks it hundreds of times)."""
    lengths = np.array([len(p) for p in sides])
    q = lens.undistort(np.concatenate(sides))
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    c = q - np.repeat(np.add.reduceat(q, starts) / lengths[:, None], lengths, axis=0)
    sxx, syy, sxy = (np.add.reduceat(v, starts) for v in (c[:, 0] * c[:, 0], c[:, 1] * c[:, 1], c[:, 0] * c[:, 1]))
    half = (sxx - syy) / 2
    return float(np.maximum((sxx + syy) / 2 - np.sqrt(half * half + sxy * sxy), 0.0).sum())


def straight_corners(lens: Lens, sides: list[np.ndarray]) -> np.ndarray | None:
    """The code's corners in undistorted image coordinates: where its straightened sides meet."""
    flat = lens.undistort(np.concatenate(sides))
    lines = [_line(p)[:2] for p in np.split(flat, np.cumsum([len(p) for p in sides])[:-1])]
    out = np.empty((4, 2))
    for i in range(4):
        (p, d1), (q, d2) = lines[i - 1], lines[i]
        m = np.array([[d1[0], -d2[0]], [d1[1], -d2[1]]])
        if abs(np.linalg.det(m)) < 1e-6:
            return None
        s, _ = np.linalg.solve(m, q - p)
        out[i] = p + s * d1
    return out


def sample_points(lens: Lens, sides: list[np.ndarray], layout: GridLayout) -> np.ndarray | None:
    """Where to sample every cell (len(SAMPLE_OFFSETS), n_cells, 2): the grid through the straightened
    corners' homography, then through the lens."""
    corners = straight_corners(lens, sides)
    if corners is None:
        return None
    H = grid_homography(corners, layout).astype(np.float64)
    pts = (layout.cell_centres().astype(np.float64)[None] + SAMPLE_OFFSETS[:, None]).reshape(-1, 2)
    und = cv2.perspectiveTransform(pts.reshape(-1, 1, 2), H).reshape(-1, 2)
    return lens.distort(und).reshape(len(SAMPLE_OFFSETS), -1, 2)


class LensFit:
    """One camera's lens, fitted from the edges of the codes it saw, and whether it reads better.

    `edges(image, quad, layout)` finds a code's edges and keeps the last `keep` codes'; the fit runs when
    `fit_at` codes were seen (a code counts once a capture, in however many layouts it is tried; the lens
    does not change: a few fits early on, a fraction of a second each, then none). A fit is only a guess until it reads better: for the next `trial` codes the
    reader samples each code both through it and the way it read before (through the lens `kept` from
    an earlier fit, or a pinhole), reads the better, and `vote`s the colour model's mean confidence of
    each; the fitted lens is `used` if it won on average, else the one before it comes back (a later fit
    from other codes can be worse than an earlier one).

    The trial is won on average over the codes, most of them where the screens read from the start are;
    a screen elsewhere in the view (one that lights up later, at the image's edge) can then read through
    a pinhole and not through the lens. So once the fits are done, each place in the image (`place`)
    has a trial of its own: its first PLACE_TRIAL codes are read both through the lens and through a
    pinhole (`place_use` None: the better read is used, `place_vote`), and the place then keeps the way
    that read better on average (a way that did not read counts 0).
    """

    def __init__(self, width: int, height: int, keep: int = 12, fit_at: tuple[int, ...] = (6, 60, 600),
                 trial: int = 30) -> None:
        self.lens = Lens(width, height)
        self._sides: deque[list[np.ndarray]] = deque(maxlen=keep)
        self.fit_at, self.trial = fit_at, trial
        self._seen = 0
        self.fits = 0
        self.used: bool | None = None  # None: on trial
        self._votes: list[float] = []
        self.kept: Lens | None = None  # the lens used before the one on trial (None: a pinhole)
        # the last captures' codes: corners, the layout their edges were found for, the edges
        self._last: list[tuple[np.ndarray, GridLayout, list[np.ndarray]]] = []
        self._seen_last: tuple[np.ndarray, np.ndarray] | None = None  # the last capture and code counted
        # Pixels to sample the last codes' cells at: (edges, lens, layout, image size, pixel_index)
        self._pixels: list[tuple] = []
        self._place_votes: dict[tuple[int, int], list[float]] = {}
        self.place_lens: dict[tuple[int, int], bool] = {}  # each place, once its trial is over: the lens (True) or a pinhole

    def edges(self, image: np.ndarray, corners: np.ndarray, layout: GridLayout) -> list[np.ndarray] | None:
        """The code's edge points for `layout` (see edge_points), found in a crop of `image` around
        `corners`. A code whose corners moved less than REUSE_PX since a recent capture keeps the edges
        found then for that layout (a screen holds still: its edges are found once, not in every capture).
        The fit counts a code once a capture, in however many layouts it is tried."""
        sides = next((sd for old, lay, sd in self._last if lay == layout and np.abs(old - corners).max() < REUSE_PX),
                     None)
        if sides is None:
            sides = self._find(image, corners, layout)
            if sides is None:
                return None
            self._last = [(np.array(corners, np.float64), layout, sides)] + self._last[:4 * MAX_KEPT_LAYOUTS - 1]
        last = self._seen_last
        if last is not None and last[0] is image and np.abs(last[1] - corners).max() < REUSE_PX:
            return sides
        self._seen_last = (image, np.array(corners, np.float64))
        if not self.settled:
            self._sides.append(sides)
            self._seen += 1
            if self._seen in self.fit_at:
                if self.used is not None:
                    self.kept = self.lens if self.used else None
                self.lens = fit(self.lens.width, self.lens.height, list(self._sides), start=self.lens)
                self.fits += 1
                self.used, self._votes = None, []  # a new guess: on trial again
        return sides

    def place(self, corners: np.ndarray) -> tuple[int, int]:
        """Where a code is in the image: its centre's cell on a grid PLACE_CELLS cells across."""
        x, y = np.asarray(corners, np.float64).mean(axis=0) / (self.lens.width / PLACE_CELLS)
        return int(x), int(y)

    def place_use(self, corners: np.ndarray) -> bool | None:
        """Whether a code at `corners` is read through the fitted lens (True: its place chose the lens), through
        a pinhole (False), or both ways on trial (None)."""
        return self.place_lens.get(self.place(corners))

    def place_vote(self, corners: np.ndarray, with_lens: float, pinhole: float) -> bool | None:
        """One code's mean confidence read through the lens and through a pinhole (0: not read) at a place
        on trial; the way that place keeps once PLACE_TRIAL codes voted (returned then), else None."""
        key = self.place(corners)
        votes = self._place_votes.setdefault(key, [])
        votes.append(with_lens - pinhole)
        if len(votes) < PLACE_TRIAL:
            return None
        self.place_lens[key] = float(np.mean(votes)) >= 0
        del self._place_votes[key]
        return self.place_lens[key]

    def forget(self, corners: np.ndarray) -> None:
        """Drop the edges kept for a code at `corners`: the next capture of it finds them again."""
        self._last = [(old, lay, sd) for old, lay, sd in self._last if np.abs(old - corners).max() >= REUSE_PX]

    def pixels(self, sides: list[np.ndarray], layout: GridLayout, shape: tuple[int, ...],
               lens: Lens | None = None) -> np.ndarray | None:
        """Where to sample a code's cells through `lens` (default: the fitted one; reader.sample's `pixels`),
        from its edges (`edges`); None if its straightened corners cannot be found. A screen that holds still
        keeps its edges (the same object again), and so its pixels: worked out once per lens."""
        lens = lens or self.lens
        size = tuple(shape[:2])
        for sd, ln, lay, sz, pix in self._pixels:
            if sd is sides and ln is lens and lay == layout and sz == size:
                return pix
        pts = sample_points(lens, sides, layout)
        if pts is None:
            return None
        pix = pixel_index(pts, *size)
        self._pixels = [(sides, lens, layout, size, pix)] + self._pixels[:7]
        return pix

    @staticmethod
    def _find(image: np.ndarray, corners: np.ndarray, layout: GridLayout) -> list[np.ndarray] | None:
        h, w = image.shape[:2]
        out_r, out_c = layout.outer_cells
        cell = float(np.linalg.norm(corners[1] - corners[0])) / out_c
        m = int(3 * cell) + 4  # the profiles reach 2 cells outside the code
        x0, y0 = (max(0, int(v) - m) for v in corners.min(axis=0))
        x1, y1 = (int(v) + m for v in corners.max(axis=0))
        crop = image[y0:min(h, y1), x0:min(w, x1)]
        bright = _brightest_channel(crop).astype(np.float32)
        shift = np.array([x0, y0], np.float64)
        sides = edge_points(bright, (corners - shift).astype(np.float32), layout)
        return None if sides is None else [p + shift for p in sides]

    @property
    def settled(self) -> bool:
        """No fit is due any more (every later code is read the way the last trial chose)."""
        return self._seen > self.fit_at[-1]

    def vote(self, with_lens: float, before: float) -> None:
        """One code's mean confidence read through the lens on trial and the way it read before (`kept`)."""
        self._votes.append(with_lens - before)
        if len(self._votes) >= self.trial:
            self.used = float(np.mean(self._votes)) > 0
            if not self.used and self.kept is not None:
                self.lens, self.used = self.kept, True


MAX_DISTORTION = 0.4  # a lens that moves a point of the image by more than this share of its radius is no lens


def plausible(lens: Lens) -> bool:
    """The radial model could be a camera's lens: out to the image's corners it moves no point by more
    than MAX_DISTORTION of its radius and keeps points in order (r (1 + a r^2 + b r^4) grows with r). A fit
    to codes near the middle of the image can make their sides straight with a model that folds the
    image's edges over: that is not a lens."""
    r = np.linspace(0.0, np.hypot(1.0, lens.height / lens.width), 64)
    bend = lens.a * r**2 + lens.b * r**4
    slope = 1 + 3 * lens.a * r**2 + 5 * lens.b * r**4
    return bool(np.abs(bend).max() <= MAX_DISTORTION and slope.min() > 0)


def fit(width: int, height: int, codes: list[list[np.ndarray]], start: Lens | None = None) -> Lens:
    """The radial lens that makes every side of these codes straightest (Nelder-Mead on a, b, from `start`'s
    or none); no distortion if none straightens them or the best is not `plausible`."""
    from scipy.optimize import minimize

    every = [side for sides in codes for side in sides]

    def cost(x):
        lens = Lens(width, height, float(x[0]), float(x[1]))
        return straightness(lens, every)

    x0 = np.zeros(2) if start is None else np.array([start.a, start.b])
    r = minimize(cost, x0, method="Nelder-Mead", options=dict(xatol=1e-4, fatol=1e-6, maxiter=200))
    a, b = (float(v) for v in r.x)
    if not (np.isfinite(a) and np.isfinite(b)) or cost(r.x) >= cost(np.zeros(2)):
        return Lens(width, height)
    lens = Lens(width, height, a, b)
    return lens if plausible(lens) else Lens(width, height)
