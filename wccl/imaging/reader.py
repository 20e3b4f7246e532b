"""Find the codes in a camera image and read their cells.

Consumes: one BGR camera image and the grid layout. Emits: for every code
found, a `ReadCode`: its corners in the image, whether the capture is clean
(the parity marks agree) or mixed, the sender's number from the sender
strips, and a symbol and a confidence for every data cell. Nothing here is
trusted yet: the frame's error correction and check decide.

Steps, each a pure function:
1. `find_quads`: the bright outer ring of each code is the largest bright
   connected region; its outline, simplified to four corners and refined by
   fitting a line to each side, gives the code's quadrilateral (any
   perspective, any position; several codes per image).
2. `sample`: a homography from code units to the image places every cell
   centre; each cell is read as the mean of five points around its centre.
3. `ColourModel`: the pilot cells (known colours) fit an affine colour
   transform (crosstalk, white balance, black level, exposure); then all
   confidently classified cells refit it with a bilinear dependence on the
   position in the frame (vignetting, glare gradients), and cells are
   classified again in the corrected space: with 8 colours, each to the
   nearest corner of the colour cube in the metric of the frame's own read
   noise (`noise_metric`: channels read noisier count for less, noise they
   share is told apart from a colour).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache

import cv2
import numpy as np

from protocols import cells
from protocols.layout import ANTI, DATA, MARK, PILOT, SENDER, SENDER_BITS, GridLayout

_DOWN = 2  # locate on a half-resolution mask


@dataclass(frozen=True, slots=True)
class Quad:
    """A code's outer corners in image pixels: top-left, top-right, bottom-right, bottom-left."""

    corners: np.ndarray  # (4, 2) float32

    @property
    def bbox(self) -> tuple[int, int, int, int]:
        x0, y0 = self.corners.min(axis=0)
        x1, y1 = self.corners.max(axis=0)
        return int(x0), int(y0), int(np.ceil(x1 - x0)), int(np.ceil(y1 - y0))


@dataclass(frozen=True, slots=True)
class ReadCode:
    quad: Quad
    sender: int | None  # None when the two sender strips disagree
    parity: int
    mixed: bool  # the parity marks disagree or sit between black and white
    symbols: np.ndarray  # per data cell, uint8
    confidence: np.ndarray  # per data cell, float32 in [0, 1]
    cell_px: float  # camera pixels per cell (mean)


def _least(v: np.ndarray) -> np.ndarray:
    """The smallest of each row's three values (n, 3) -> (n,) (numpy's min over so short an axis is slow)."""
    return np.minimum(np.minimum(v[:, 0], v[:, 1]), v[:, 2])


def _lum(v: np.ndarray) -> np.ndarray:
    """Each row's mean of its three values (n, 3) -> (n,), as v.mean(axis=1) gives it, faster."""
    return (v[:, 0] + v[:, 1] + v[:, 2]) / 3


def _brightest_channel(image: np.ndarray) -> np.ndarray:
    return np.maximum(np.maximum(image[..., 0], image[..., 1]), image[..., 2])


def _order_corners(pts: np.ndarray) -> np.ndarray:
    c = pts.mean(axis=0)
    ang = np.arctan2(pts[:, 1] - c[1], pts[:, 0] - c[0])
    pts = pts[np.argsort(ang)]  # clockwise in image coordinates, starting near -pi (left)
    # start at the top-left: smallest x + y
    start = int(np.argmin(pts.sum(axis=1)))
    return np.roll(pts, -start, axis=0)


def _refine_corners(contour: np.ndarray, corners: np.ndarray) -> np.ndarray:
    """Fit a line to the contour points along each side; corners are the lines' intersections."""
    pts = contour.reshape(-1, 2).astype(np.float32)
    lines = []
    for i in range(4):
        a, b = corners[i], corners[(i + 1) % 4]
        ab = b - a
        length = float(np.hypot(*ab))
        if length < 4:
            return corners
        t = ((pts - a) @ ab) / (length * length)
        dist = np.abs((pts - a) @ np.array([-ab[1], ab[0]]) / length)
        sel = pts[(t > 0.1) & (t < 0.9) & (dist < max(3.0, 0.02 * length))]
        if len(sel) < 4:
            return corners
        vx, vy, x0, y0 = cv2.fitLine(sel, cv2.DIST_HUBER, 0, 0.01, 0.01).ravel()
        lines.append((np.array([x0, y0]), np.array([vx, vy])))
    out = np.empty((4, 2), np.float32)
    for i in range(4):
        (p, u), (q, v) = lines[i - 1], lines[i]
        m = np.array([[u[0], -v[0]], [u[1], -v[1]]])
        if abs(np.linalg.det(m)) < 1e-6:
            return corners
        s, _ = np.linalg.solve(m, q - p)
        out[i] = p + s * u
    if np.abs(out - corners).max() > 8:
        return corners
    return out


def find_quads(image: np.ndarray, layout: GridLayout, min_cell_px: float = 1.5) -> list[Quad]:
    """Every code's quadrilateral in `image`, left to right."""
    small = _brightest_channel(image[::_DOWN, ::_DOWN])
    if small.size == 0:
        return []
    # A screen that holds still gives the same image capture after capture (in a simulated room without
    # noise): its codes are found once.
    key = (hashlib.blake2b(np.ascontiguousarray(small), digest_size=16).digest(), small.shape,
           layout.outer_cells, min_cell_px)
    quads = _FOUND.get(key)
    if quads is None:
        quads = _FOUND[key] = _quads_in(small, layout.outer_cells, min_cell_px)
        if len(_FOUND) > 64:
            del _FOUND[next(iter(_FOUND))]
    return list(quads)


_FOUND: dict[tuple, tuple[Quad, ...]] = {}  # find_quads' latest answers, oldest first


def _bright_mask(small: np.ndarray) -> np.ndarray | None:
    """Where the brightest channel at half resolution is bright (Otsu's threshold, at least a quarter of the
    brightest): the codes' white rings; None in an image with nothing bright."""
    hi = int(small.max()) if small.size else 0
    if hi < 48:
        return None
    thr, _ = cv2.threshold(small, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    return (small > max(thr, 0.25 * hi)).view(np.uint8)


def _quads_in(small: np.ndarray, outer_cells: tuple[int, int], min_cell_px: float) -> tuple[Quad, ...]:
    """`find_quads` on the brightest channel at half resolution."""
    mask = _bright_mask(small)
    if mask is None:
        return ()
    contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    out_r, out_c = outer_cells
    min_side = min_cell_px * min(out_r, out_c) / _DOWN
    quads = []
    for c in contours:
        if len(c) < 8:
            continue
        x, y, w, h = cv2.boundingRect(c)
        if min(w, h) < min_side:
            continue
        # A code's outline is the same while its screen holds still, whatever frame it shows (a screen's
        # neighbour in the same capture may have changed): its corners are worked out once.
        key = (hashlib.blake2b(c.tobytes(), digest_size=16).digest(), outer_cells)
        if key in _OUTLINES:
            q = _OUTLINES[key]
            if q is not None:
                quads.append(q)
            continue
        q = _OUTLINES[key] = _quad_of(c, w, h, outer_cells)
        if len(_OUTLINES) > 256:
            del _OUTLINES[next(iter(_OUTLINES))]
        if q is not None:
            quads.append(q)
    quads.sort(key=lambda q: (q.corners[:, 0].min(), q.corners[:, 1].min()))
    return tuple(quads)


_OUTLINES: dict[tuple, Quad | None] = {}  # an outline's quad (None: not a code's), oldest first


@dataclass(frozen=True, slots=True)
class Cut:
    """A bright outline that runs out of the image on one side (`side`: the image's "left", "right", "top"
    or "bottom"): a code partly out of the camera's view. `bbox`: its part in view (x, y, w, h, image px)."""

    bbox: tuple[int, int, int, int]
    side: str

    @property
    def centre(self) -> np.ndarray:
        x, y, w, h = self.bbox
        return np.array([x + w / 2, y + h / 2], np.float32)

    @property
    def aspect(self) -> float:
        return self.bbox[2] / max(1, self.bbox[3])


def cut_codes(image: np.ndarray, min_side_px: float) -> list[Cut]:
    """The bright outlines at least `min_side_px` across both ways that run out of the image on exactly one
    side (one out at a corner is left out: no part of the screen is sure to be in view), largest first."""
    mask = _bright_mask(_brightest_channel(image[::_DOWN, ::_DOWN]))
    if mask is None:
        return []
    contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    h, w = mask.shape
    out = []
    for c in contours:
        x, y, bw, bh = cv2.boundingRect(c)
        if min(bw, bh) * _DOWN < min_side_px:
            continue
        sides = [name for name, out_of_view in (("left", x <= 0), ("right", x + bw >= w), ("top", y <= 0),
                                                ("bottom", y + bh >= h)) if out_of_view]
        if len(sides) == 1:
            out.append(Cut((x * _DOWN, y * _DOWN, bw * _DOWN, bh * _DOWN), sides[0]))
    return sorted(out, key=lambda cut: -cut.bbox[2] * cut.bbox[3])


def _quad_of(c: np.ndarray, w: int, h: int, outer_cells: tuple[int, int]) -> Quad | None:
    """The code's quadrilateral whose outline on the half-resolution mask is `c` (bounding box w x h), or
    None if it is not one."""
    out_r, out_c = outer_cells
    hull = cv2.convexHull(c)
    peri = cv2.arcLength(hull, True)
    approx = cv2.approxPolyDP(hull, 0.02 * peri, True).reshape(-1, 2).astype(np.float32)
    if len(approx) != 4 or not cv2.isContourConvex(approx.reshape(-1, 1, 2)):
        return None
    if cv2.contourArea(approx) < 0.5 * w * h:
        return None
    corners = _refine_corners(c, _order_corners(approx))
    # Pixel centres: a mask pixel i covers full-resolution pixels [i*D, i*D + D).
    corners = corners * _DOWN + (_DOWN - 1) / 2.0
    # The outline runs through the outermost bright mask pixels: the edge lies half a mask pixel further out.
    centre = corners.mean(axis=0)
    direction = corners - centre
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    corners = corners + direction * (_DOWN / 2.0) * np.sqrt(2)
    sides = np.linalg.norm(corners - np.roll(corners, -1, axis=0), axis=1)
    ratio = (sides[0] + sides[2]) / max(1e-6, sides[1] + sides[3])
    want = out_c / out_r
    if not 0.4 * want < ratio < 2.5 * want:  # (wide enough for a layout drawn on part of the screen)
        return None
    q = Quad(corners.astype(np.float32))
    q.corners.setflags(write=False)  # shared by every caller of the caches
    return q


class QuadTracker:
    """Finds codes frame after frame: near where they were, with a full search when one is lost.

    Consumes camera images; emits the quads in each. A tracked code is looked for only in its
    last bounding box grown by `margin` of its size; every `redetect_every` images, and whenever a
    tracked code is not found again, the whole image is searched (a screen may have appeared).
    """

    def __init__(self, layout: GridLayout, margin: float = 0.15, redetect_every: int = 15) -> None:
        self.layout = layout
        self.margin = margin
        self.redetect_every = redetect_every
        self.quads: list[Quad] = []
        self._since_full = 0
        self.full_searches = 0
        self._shape: tuple | None = None

    def __call__(self, image: np.ndarray) -> list[Quad]:
        self._since_full += 1
        if image.shape != (self._shape or image.shape):
            self.quads = []  # another camera size: nothing tracked still holds
        self._shape = image.shape
        if self.quads and self._since_full < self.redetect_every:
            found = []
            h, w = image.shape[:2]
            for q in self.quads:
                x, y, bw, bh = q.bbox
                mx, my = int(bw * self.margin) + 4, int(bh * self.margin) + 4
                x0, y0 = max(0, x - mx) // _DOWN * _DOWN, max(0, y - my) // _DOWN * _DOWN
                x1, y1 = min(w, x + bw + mx), min(h, y + bh + my)
                near = find_quads(image[y0:y1, x0:x1], self.layout)
                if len(near) != 1:
                    break
                found.append(Quad(near[0].corners + np.array([x0, y0], np.float32)))
            else:
                self.quads = found
                return found
        self._since_full = 0
        self.full_searches += 1
        self.quads = find_quads(image, self.layout)
        return self.quads


# Where each cell is sampled: its centre and four points 0.22 cells towards its corners (code units).
SAMPLE_OFFSETS = np.array([[0, 0], [-0.22, -0.22], [0.22, -0.22], [-0.22, 0.22], [0.22, 0.22]], np.float32)


def homography(quad: Quad, layout: GridLayout) -> np.ndarray:
    return grid_homography(quad.corners, layout)


def grid_homography(corners: np.ndarray, layout: GridLayout) -> np.ndarray:
    """Code units (outer ring corner at 0, 0) -> image pixels, through the code's four outer corners."""
    out_r, out_c = layout.outer_cells
    src = np.array([[0, 0], [out_c, 0], [out_c, out_r], [0, out_r]], np.float32)
    return cv2.getPerspectiveTransform(src, np.asarray(corners, np.float32))


def pixel_index(img_pts: np.ndarray, h: int, w: int) -> np.ndarray:
    """Flat indices (row * w + column) of the pixels nearest `img_pts` (..., 2), clipped to the image."""
    xs = np.clip(np.rint(img_pts[..., 0]), 0, w - 1).astype(np.intp)
    ys = np.clip(np.rint(img_pts[..., 1]), 0, h - 1).astype(np.intp)
    return ys * w + xs


def sample(image: np.ndarray, quad: Quad, layout: GridLayout,
           pixels: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Mean BGR of every cell (n_cells, 3) float32, and camera pixels per cell.

    `pixels`: where each cell's samples lie (pixel_index, (len(SAMPLE_OFFSETS), n_cells)), e.g. through a
    fitted lens (wccl.imaging.lens.LensFit.pixels: a wide lens bends the grid); else one homography from
    the quad's corners (a pinhole camera)."""
    out_r, out_c = layout.outer_cells
    edges = np.linalg.norm(quad.corners - np.roll(quad.corners, -1, axis=0), axis=1)
    cell_px = float((edges[0] + edges[2]) / (2 * out_c) + (edges[1] + edges[3]) / (2 * out_r)) / 2
    if pixels is None:
        pixels = _pinhole_pixels(np.asarray(quad.corners, np.float32).tobytes(), layout, image.shape[:2])
    values = image.reshape(-1, image.shape[2])[pixels].astype(np.float32).mean(axis=0)
    return values, cell_px


@lru_cache(maxsize=256)
def _pinhole_pixels(corners: bytes, layout: GridLayout, shape: tuple[int, int]) -> np.ndarray:
    """`sample`'s pixels through one homography from a code's corners (float32 x, y as bytes). Cached: a
    screen that holds still is found at the same corners capture after capture, and sampled at the same
    pixels."""
    H = grid_homography(np.frombuffer(corners, np.float32).reshape(4, 2), layout)
    pts = (layout.cell_centres()[None, :, :] + SAMPLE_OFFSETS[:, None, :]).reshape(-1, 2)
    img_pts = cv2.perspectiveTransform(pts.reshape(-1, 1, 2), H).reshape(len(SAMPLE_OFFSETS), -1, 2)
    pixels = pixel_index(img_pts, *shape)
    pixels.setflags(write=False)
    return pixels


def _on_palette(corrected: np.ndarray, tolerance: float = 0.1) -> bool:
    """Every cell already within `tolerance` of a corner of the colour cube in every channel: the first
    fit explains the frame, and refitting it cannot change what a cell is read as."""
    return bool(np.abs(corrected - (corrected > 0.5)).max() < tolerance)


def _corners01(colours: int) -> np.ndarray:
    """The palette as 0/1 RGB-cube corners in BGR order, (colours, 3) float32."""
    return (cells.palette_bgr(colours) > 127).astype(np.float32)


def _fit(X: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Least squares X @ A ~ Y through the normal equations (small, well-posed, no LAPACK driver threads)."""
    return np.linalg.solve(_normal(X), X.T @ Y)


def _normal(X: np.ndarray) -> np.ndarray:
    """X'X with a touch of ridge on its diagonal (`_fit`'s normal equations)."""
    XtX = X.T @ X
    XtX[np.diag_indices_from(XtX)] += 1e-6 * max(1.0, float(np.trace(XtX)) / len(XtX))
    return XtX


def _inverse3(m: np.ndarray) -> np.ndarray | None:
    """Inverses of a stack of 3x3 matrices (n, 3, 3) by their adjugates; None if any is singular."""
    a, b, c = m[:, 0, 0], m[:, 0, 1], m[:, 0, 2]
    d, e, f = m[:, 1, 0], m[:, 1, 1], m[:, 1, 2]
    g, h, i = m[:, 2, 0], m[:, 2, 1], m[:, 2, 2]
    co = np.stack([e * i - f * h, c * h - b * i, b * f - c * e,
                   f * g - d * i, a * i - c * g, c * d - a * f,
                   d * h - e * g, b * g - a * h, a * e - b * d], axis=1).reshape(-1, 3, 3)
    det = a * co[:, 0, 0] + b * co[:, 1, 0] + c * co[:, 2, 0]
    if np.abs(det).min() < 1e-9:
        return None
    return co / det[:, None, None]


class ColourModel:
    """Maps observed BGR to the screen's 0..1 BGR, fitted per frame. See the module doc."""

    def __init__(self, layout: GridLayout) -> None:
        self.layout = layout
        self.ideal = _corners01(layout.colours)
        yy, xx = np.mgrid[0 : layout.rows, 0 : layout.cols]
        u = (xx.ravel() / max(1, layout.cols - 1) - 0.5).astype(np.float32)
        v = (yy.ravel() / max(1, layout.rows - 1) - 0.5).astype(np.float32)
        self.pos = np.stack([np.ones_like(u), u, v, u * v], axis=1)  # bilinear in position
        self.pilot_idx = layout.index(PILOT)
        self.data_idx = layout.index(DATA)
        self.pilot_ideal = self.ideal[layout.pilot_symbols]

    @staticmethod
    def _design(ideal: np.ndarray, pos: np.ndarray | None) -> np.ndarray:
        base = np.concatenate([ideal, np.ones((len(ideal), 1), np.float32)], axis=1)  # (n, 4)
        if pos is None:
            return base
        return (base[:, :, None] * pos[:, None, :]).reshape(len(ideal), -1)  # (n, 16)

    def _full_design(self, decided: np.ndarray, neigh: np.ndarray) -> np.ndarray:
        """`_design(decided, pos)` and the neighbours' colour side by side, (n, 19), built in place (the
        decoder's hottest loop: no (n, 4, 4) temporary)."""
        n = len(decided)
        X = np.empty((n, 19), np.float32)
        for k in range(3):
            np.multiply(decided[:, k : k + 1], self.pos, out=X[:, 4 * k : 4 * k + 4])
        X[:, 12:16] = self.pos
        X[:, 16:19] = neigh
        return X

    def _decide(self, corrected: np.ndarray) -> np.ndarray:
        """The screen colour each cell most likely showed (pilots: what they showed)."""
        decided = (corrected > 0.5).astype(np.float32)
        if self.layout.colours != 8:
            sym, _ = classify(corrected[self.data_idx], self.layout.colours)
            decided[self.data_idx] = self.ideal[sym]
        decided[self.pilot_idx] = self.pilot_ideal
        return decided

    def _neighbours(self, decided: np.ndarray) -> np.ndarray:
        """Mean screen colour of each cell's four neighbours (the white ring outside the grid)."""
        g = np.ones((self.layout.rows + 2, self.layout.cols + 2, 3), np.float32)
        g[1:-1, 1:-1] = decided.reshape(self.layout.rows, self.layout.cols, 3)
        n = (g[:-2, 1:-1] + g[2:, 1:-1] + g[1:-1, :-2] + g[1:-1, 2:]) * 0.25
        return n.reshape(-1, 3)

    def _correct_per_channel(self, values: np.ndarray, iterations: int) -> np.ndarray | None:
        """Two colours (black, white) cannot pin a 3x3 colour transform: fit each channel on its own,
        with a gain and an offset varying bilinearly over the frame, plus the neighbours' bleed."""
        obs_p = values[self.pilot_idx]
        white = self.pilot_ideal[:, 0] > 0.5
        if white.all() or not white.any():
            return None
        lo, hi = obs_p[~white].mean(axis=0), obs_p[white].mean(axis=0)
        if (hi - lo).min() < 8:
            return None
        corrected = (values - lo) / (hi - lo)
        if _on_palette(corrected):
            return corrected.astype(np.float32)
        for _ in range(iterations):
            decided = self._decide(corrected)
            neigh = self._neighbours(decided)
            use = _least(np.abs(corrected - 0.5)) > 0.2
            use[self.pilot_idx] = True
            if use.sum() < 32:
                break
            out = np.empty_like(corrected)
            for ch in range(3):
                X = np.concatenate([decided[use, ch : ch + 1] * self.pos[use], self.pos[use], neigh[use, ch : ch + 1]], 1)
                a = _fit(X, values[use, ch : ch + 1])[:, 0]
                gain = self.pos @ a[:4]
                if np.abs(gain).min() < 1e-3:
                    return None
                out[:, ch] = (values[:, ch] - self.pos @ a[4:8] - neigh[:, ch] * a[8]) / gain
            corrected = out
        return corrected.astype(np.float32)

    def correct(self, values: np.ndarray, iterations: int = 3) -> np.ndarray | None:
        """Observed (n_cells, 3) -> corrected (n_cells, 3) in screen units, or None if no fit."""
        if self.layout.colours == 2:
            return self._correct_per_channel(values, iterations)
        obs_p = values[self.pilot_idx]
        X = self._design(self.pilot_ideal, None)
        A = _fit(X, obs_p)  # observed = [ideal, 1] @ A
        M, b = A[:3], A[3]
        if abs(np.linalg.det(M)) < 1e-3:
            return None
        corrected = (values - b) @ np.linalg.inv(M)
        if _on_palette(corrected):
            return corrected.astype(np.float32)
        # Decision-directed refits from every confident cell: a colour transform that varies
        # bilinearly over the frame, plus the light that blur carries over from the four neighbours.
        for _ in range(iterations):
            decided = self._decide(corrected)
            neigh = self._neighbours(decided)
            conf = _least(np.abs(corrected - 0.5))
            use = conf > 0.2
            use[self.pilot_idx] = True
            if use.sum() < 64:
                break
            X = self._full_design(decided, neigh)[use]  # (n, 19)
            A = _fit(X, values[use])
            N = A[16:19]  # neighbours' colour -> observed
            A = A[:16].reshape(4, 4, 3)  # [ideal/1 component, position term, output]
            Mxy = (self.pos @ A[:3].transpose(1, 0, 2).reshape(4, 9)).reshape(-1, 3, 3)  # per cell (3 in, 3 out)
            bxy = self.pos @ A[3] + neigh @ N
            inv = _inverse3(Mxy)
            if inv is None:
                break
            corrected = np.einsum("ni,nij->nj", values - bxy, inv)
        return corrected.astype(np.float32)


METRIC_STRIDE = 3  # noise_metric reads every third cell


def noise_metric(corrected: np.ndarray) -> np.ndarray | None:
    """The 3x3 metric in which a frame's read noise is the same in every direction: the inverse of the
    covariance of the sure cells' departures from their corner of the colour cube, scaled to keep the
    mean variance (a channel read noisier, as blue often is, counts for less; noise the channels share,
    as a camera's colour matrix and JPEG's brightness make it, is told apart from a colour). None when
    too few cells are sure or the noise is degenerate."""
    some = corrected[::METRIC_STRIDE]  # a few thousand cells pin a 3x3 covariance
    sure = some[_least(np.abs(some - 0.5)) > 0.2]
    if len(sure) < 64:
        return None
    res = (sure - (sure > 0.5)).astype(np.float64)
    cov = (res.T @ res) / len(res)
    scale = float(np.trace(cov)) / 3
    if not np.isfinite(cov).all() or scale <= 1e-9 or np.linalg.det(cov) <= (1e-3 * scale) ** 3:
        return None
    return np.linalg.inv(cov) * scale


def classify(corrected: np.ndarray, colours: int) -> tuple[np.ndarray, np.ndarray]:
    """Corrected 0..1 BGR -> (symbols, confidence). Eight colours: the nearest corner of the colour cube
    in the frame's `noise_metric` (by each channel's threshold where it has none); the confidence is how
    much nearer that corner is than the next: 0 half-way, about 1 at a corner (less towards a corner
    across a channel that reads noisier than the others)."""
    if colours == 8:
        metric = noise_metric(corrected)
        if metric is None:
            bits = corrected > 0.5
            # symbol = r*4 + g*2 + b with BGR channels
            symbols = (bits[:, 2] * 4 + bits[:, 1] * 2 + bits[:, 0]).astype(np.uint8)
            confidence = np.clip(_least(np.abs(corrected - 0.5)) * 2, 0, 1)
            return symbols, confidence.astype(np.float32)
        # squared distances to the corners (corner k is symbol k) in the metric, as |y|^2 - 2 y.c + |c|^2
        # with y = x L and c = corner L, L L' the metric: three small products, no (n, 8, 3) temporary
        L = np.linalg.cholesky(metric).astype(np.float32)  # (positive definite: noise_metric checked it)
        yT, c = L.T @ corrected.T.astype(np.float32), _corners01(8) @ L  # cells (3, n) and corners (8, 3)
        dist = (c * c).sum(axis=1)[:, None] - 2 * (c @ yT)  # (8, n), less the |y|^2 every corner shares
        cols = np.arange(dist.shape[1])
        best = dist.argmin(axis=0)
        yy = (yT * yT).sum(axis=0)
        d1 = dist[best, cols] + yy
        dist[best, cols] = np.inf
        d2 = dist.min(axis=0) + yy
        margin = np.sqrt(np.maximum(d2, 0)) - np.sqrt(np.maximum(d1, 0))
        return best.astype(np.uint8), np.clip(margin, 0, 1).astype(np.float32)
    ideal = _corners01(colours)
    d = ((corrected[:, None, :] - ideal[None]) ** 2).sum(axis=2)
    order = np.argsort(d, axis=1)
    rows = np.arange(len(d))
    d1, d2 = np.sqrt(d[rows, order[:, 0]]), np.sqrt(d[rows, order[:, 1]])
    return order[:, 0].astype(np.uint8), np.clip((d2 - d1) / np.sqrt(2), 0, 1).astype(np.float32)


def marks_agree(values: np.ndarray, layout: GridLayout) -> bool:
    """The parity marks, read from the cells' raw brightness, all say the same parity: each mark is white
    and its partner black, or the other way round everywhere. A capture that mixes two frames, or a code
    sampled through another layout's grid (where the marks fall on data), fails it; `read_quad` calls such
    a read mixed after fitting its colours, and this says so before the fit."""
    d = _lum(values[layout.index(MARK)]) - _lum(values[layout.index(ANTI)])
    return bool((d > 0).all() or (d < 0).all())


def is_idle(values: np.ndarray, layout: GridLayout, residual: float = 20.0) -> bool:
    """The screen shows its idle pattern (every cell alike), not a frame.

    The cells' brightness minus a smooth (bilinear) surface over the frame, which takes out vignetting
    and shading: an even grey leaves only noise, a frame's colours leave ~60 DN. Every cell, not the
    pilots alone: a frame of another layout sampled through this one's grid can put this grid's pilots
    on that frame's pilots (a grid of twice the cell size lands every pilot on one), and it is no idle
    screen to a reader still trying the layouts of its ladder.
    """
    lum = _lum(values)
    X, solve = _smooth_surface(layout.rows, layout.cols)
    return bool(np.std(lum - X @ (solve @ lum)) < residual)


@lru_cache(maxsize=16)
def _smooth_surface(rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """A grid's bilinear surface over its cells (n_cells, 4), and the matrix that fits it to a value per
    cell (`_fit`'s normal equations, solved once per grid: `is_idle` runs on every capture)."""
    r, c = np.divmod(np.arange(rows * cols), cols)
    u, v = c / max(1, cols - 1) - 0.5, r / max(1, rows - 1) - 0.5
    X = np.stack([np.ones_like(u), u, v, u * v], axis=1).astype(np.float32)
    return X, np.linalg.solve(_normal(X), X.T)


def same_frame(a: np.ndarray, b: np.ndarray, level: float = 60.0, share: float = 0.02) -> bool:
    """Two cell samplings of one screen show the same frame (few cells changed by more than `level`)."""
    if a.shape != b.shape:
        return False
    d = np.abs(a - b)
    changed = np.maximum(np.maximum(d[:, 0], d[:, 1]), d[:, 2]) > level
    return bool(changed.mean() < share)


def read_quad(image: np.ndarray, quad: Quad, layout: GridLayout, model: ColourModel | None = None,
              mixed_threshold: float = 0.3, sampled: tuple[np.ndarray, float] | None = None) -> ReadCode | None:
    """Read one code; None if its colours cannot be modelled (not a code, or unreadable)."""
    values, cell_px = sampled if sampled is not None else sample(image, quad, layout)
    model = model or ColourModel(layout)
    corrected = model.correct(values)
    if corrected is None:
        return None
    lum = _lum(corrected)
    d = lum[layout.index(MARK)] - lum[layout.index(ANTI)]
    parity = int(np.median(d) > 0)
    mixed = bool((np.abs(d) < mixed_threshold).any() or (np.sign(d) != (1 if parity else -1)).any())
    sbits = (lum[layout.index(SENDER)] > 0.5).astype(np.uint8).reshape(2, SENDER_BITS)
    sender = None
    if (sbits[0] == sbits[1]).all():
        sender = int(sum(int(b) << (SENDER_BITS - 1 - i) for i, b in enumerate(sbits[0])))
    symbols, confidence = classify(corrected[model.data_idx], layout.colours)
    return ReadCode(quad, sender, parity, mixed, symbols, confidence, cell_px)


MIN_IMAGE_PX = 16


def image_problem(image) -> str | None:
    """Why `image` cannot be a camera capture (None: an H x W x 3 uint8 image of at least 16 x 16 px)."""
    if not isinstance(image, np.ndarray):
        return "not_an_image"
    if image.dtype != np.uint8:
        return "bad_dtype"
    if image.ndim != 3 or image.shape[2] != 3:
        return "bad_shape"
    if image.shape[0] < MIN_IMAGE_PX or image.shape[1] < MIN_IMAGE_PX:
        return "too_small"
    return None


def read_codes(image: np.ndarray, layout: GridLayout) -> list[ReadCode]:
    """Every code in `image`, read (unchecked)."""
    model = ColourModel(layout)
    out = []
    for q in find_quads(image, layout):
        r = read_quad(image, q, layout, model)
        if r is not None:
            out.append(r)
    return out
