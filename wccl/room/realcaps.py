"""Real screen photos (../shared/realcaps): align them to what was shown, fit the channel, read cell colours.

Consumes: a displayed image (the cimbar 1024x1024 PNG: 112x112 cells on a
9 px pitch, 8x8 px tiles on black, four 30 px corner anchors) and a camera
photo of it (raw, or already deskewed to 1024x1024). Emits: a dense map
from displayed pixels to photo pixels; the photometric channel parameters
(colour matrix, black level, flare, tone gamma, vignetting), blur and noise
that best explain the photo; and cell colour error rates of a simple
nearest-colour classifier.

Nothing here is needed at run time: it anchors the `webcam` profile to
real cameras (python -m wccl.room.fit). The photos are never copied into
the repository; everything skips cleanly when the folder is absent.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

CELLS = 112
PITCH = 9
ORIGIN = 8
TILE = 8
SIZE = 1024
# Anchor centres in the displayed image: top-left, top-right, bottom-right (the odd one), bottom-left.
GT_ANCHORS = np.array([[29.5, 29.5], [993.5, 29.5], [993.5, 993.5], [29.5, 993.5]])
# The four colours of the 4-colour cimbar code, BGR: green, yellow, magenta, cyan.
PALETTE_BGR = np.array([[0, 255, 0], [0, 255, 255], [255, 0, 255], [255, 255, 0]])

# (displayed, photo, kind) — kind "raw" (a camera photo) or "deskewed" (already warped to 1024x1024).
PAIRS: list[tuple[str, str, str]] = [
    ("4color/4color_ecc30_fountain_0.png", "4color/4_30_f0_627.jpg", "raw"),
    ("4color/4color_ecc30_fountain_0.png", "4color/4_30_f0_627_extract.jpg", "deskewed"),
    ("4color/4color_ecc30_fountain_0.png", "4color/4_30_f0_177_ccm.jpg", "deskewed"),
    ("4color/4color_ecc30_fountain_1.png", "4color/4_30_f1_360.jpg", "raw"),
    ("4color/4color_ecc30_fountain_2.png", "4color/4_30_f2_246.jpg", "raw"),
    ("b/tr_0.png", "b/scan2434.jpg", "raw"),
    ("b/tr_0.png", "b/ex2434.jpg", "deskewed"),
]
DESKEWED_CAM_PX_PER_PX = 7.8 / PITCH  # the deskewed images were upsampled from ~7.8 camera px per cell


def realcaps_dir() -> Path | None:
    """The shared folder of real captures (<checkout>/../shared/realcaps, or $WCCL_REALCAPS), or None."""
    env = os.environ.get("WCCL_REALCAPS")  # when set, the only place looked at
    here = Path(__file__).resolve()
    candidates = [Path(env)] if env is not None else [here.parents[3] / "shared" / "realcaps"]
    for c in candidates:
        if (c / "4color").is_dir():
            return c.resolve()
    return None


# ---- alignment --------------------------------------------------------------------------------

def find_anchors(photo: np.ndarray) -> np.ndarray:
    """The four corner anchors in a photo, ordered like GT_ANCHORS (4 x 2). RuntimeError if not 4.

    An anchor is a white square ring holding a white square: three nested
    contours with known area ratios; the bottom-right one's inner square is
    smaller, which fixes the orientation.
    """
    mn = photo.min(axis=2)  # data colours all have a dark channel; white does not
    _, mask = cv2.threshold(mn, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
    contours, hier = cv2.findContours(mask, cv2.RETR_TREE, cv2.CHAIN_APPROX_SIMPLE)
    if hier is None:
        raise RuntimeError("no anchors found")
    hier = hier[0]
    found = []
    for i, c in enumerate(contours):
        hole = hier[i][2]
        a_out = cv2.contourArea(c)
        if hole < 0 or a_out < 100:
            continue
        j, best, a_hole = hole, hole, 0.0
        while j >= 0:
            a = cv2.contourArea(contours[j])
            if a > a_hole:
                best, a_hole = j, a
            j = hier[j][0]
        inner = hier[best][2]
        if inner < 0 or a_hole <= 0:
            continue
        r_out, r_in = a_out / a_hole, cv2.contourArea(contours[inner]) / a_hole
        if not (1.3 < r_out < 2.6 and 0.05 < r_in < 0.75):
            continue
        m = cv2.moments(c)
        found.append((m["m10"] / m["m00"], m["m01"] / m["m00"], r_in))
    if len(found) != 4:
        raise RuntimeError(f"expected 4 anchors, found {len(found)}")
    pts = np.array([f[:2] for f in found])
    r_in = np.array([f[2] for f in found])
    c = pts.mean(axis=0)
    order = np.argsort(np.arctan2(pts[:, 1] - c[1], pts[:, 0] - c[0]))  # clockwise on screen (y down)
    pts, r_in = pts[order], r_in[order]
    return np.roll(pts, 2 - int(np.argmin(r_in)), axis=0)


def _refine(gt: np.ndarray, photo: np.ndarray, mapx: np.ndarray, mapy: np.ndarray, search: int,
            block: int = 32, stride: int = 16) -> tuple[np.ndarray, np.ndarray, float]:
    """One pass of block matching in the displayed frame; returns the corrected maps and the median shift."""
    gm = cv2.GaussianBlur(gt.max(axis=2).astype(np.float32), (0, 0), 1.5)
    warped = cv2.remap(photo.max(axis=2).astype(np.float32), mapx, mapy, cv2.INTER_LINEAR)
    H, W = gm.shape
    xs = np.arange(search, W - block - search, stride)
    ys = np.arange(search, H - block - search, stride)
    gx = np.full((len(ys), len(xs)), np.nan, np.float32)
    gy = gx.copy()

    def sub(a: float, b: float, c: float) -> float:
        d = a - 2 * b + c
        return 0.0 if d >= 0 else 0.5 * (a - c) / d

    for i, y in enumerate(ys):
        for j, x in enumerate(xs):
            tpl = gm[y:y + block, x:x + block]
            if tpl.std() < 10:
                continue
            r = cv2.matchTemplate(warped[y - search:y + block + search, x - search:x + block + search], tpl,
                                  cv2.TM_CCOEFF_NORMED)
            _, mv, _, (px, py) = cv2.minMaxLoc(r)
            if mv < 0.5:
                continue
            dx = px - search + (sub(r[py, px - 1], r[py, px], r[py, px + 1]) if 0 < px < r.shape[1] - 1 else 0.0)
            dy = py - search + (sub(r[py - 1, px], r[py, px], r[py + 1, px]) if 0 < py < r.shape[0] - 1 else 0.0)
            gx[i, j], gy[i, j] = dx, dy
    from scipy.ndimage import median_filter

    def fill(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        a[np.isnan(a)] = np.nanmedian(a)
        return a

    med = float(np.nanmedian(np.hypot(gx, gy)))
    gx = cv2.GaussianBlur(median_filter(fill(gx), 3), (0, 0), 0.7)
    gy = cv2.GaussianBlur(median_filter(fill(gy), 3), (0, 0), 0.7)
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    c0 = search + block / 2 - 0.5
    gxx, gyy = (xx - c0) / stride, (yy - c0) / stride
    dxf = cv2.remap(gx, gxx, gyy, cv2.INTER_CUBIC, borderMode=cv2.BORDER_REPLICATE)
    dyf = cv2.remap(gy, gxx, gyy, cv2.INTER_CUBIC, borderMode=cv2.BORDER_REPLICATE)
    nx = cv2.remap(mapx, xx + dxf, yy + dyf, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    ny = cv2.remap(mapy, xx + dxf, yy + dyf, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    return nx, ny, med


@dataclass
class Alignment:
    mapx: np.ndarray       # (1024, 1024) float32: photo x of each displayed pixel
    mapy: np.ndarray
    residual_px: float     # median block shift left after the last pass (displayed px)
    cam_px_per_px: float   # camera pixels per displayed pixel (median)

    def to_photo(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        shape = np.shape(x)
        n = shape[-1] if len(shape) > 1 else 1
        xx = np.asarray(x, np.float32).reshape(-1, n)
        yy = np.asarray(y, np.float32).reshape(-1, n)
        px = cv2.remap(self.mapx, xx, yy, cv2.INTER_LINEAR).reshape(shape)
        py = cv2.remap(self.mapy, xx, yy, cv2.INTER_LINEAR).reshape(shape)
        return px, py


def align(gt: np.ndarray, photo: np.ndarray, kind: str) -> Alignment:
    """Map displayed pixels to photo pixels: anchors -> homography, then dense block matching (lens, drift)."""
    dst = find_anchors(photo)
    Hm, _ = cv2.findHomography(GT_ANCHORS, dst)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float64)
    pts = cv2.perspectiveTransform(np.stack([xx.ravel(), yy.ravel()], 1)[None], Hm)[0]
    mapx = pts[:, 0].reshape(SIZE, SIZE).astype(np.float32)
    mapy = pts[:, 1].reshape(SIZE, SIZE).astype(np.float32)
    med = math.nan
    for search in (8, 4, 3, 2):
        mapx, mapy, med = _refine(gt, photo, mapx, mapy, search)
    jx, jy = np.gradient(mapx, axis=1), np.gradient(mapy, axis=1)
    kx, ky = np.gradient(mapx, axis=0), np.gradient(mapy, axis=0)
    scale = float(np.median(np.sqrt(np.abs(jx * ky - jy * kx))[16:-16, 16:-16]))
    if kind == "deskewed":
        scale *= DESKEWED_CAM_PX_PER_PX
    return Alignment(mapx, mapy, med, scale)


# ---- cells and the colour classifier ------------------------------------------------------------

def cell_labels(gt: np.ndarray) -> np.ndarray:
    """(112, 112) colour index of each data cell (PALETTE_BGR), -1 for anchors/guides/ambiguous cells."""
    t = gt[ORIGIN:ORIGIN + CELLS * PITCH, ORIGIN:ORIGIN + CELLS * PITCH].reshape(CELLS, PITCH, CELLS, PITCH, 3)
    t = t[:, :TILE, :, :TILE].transpose(0, 2, 1, 3, 4).reshape(CELLS, CELLS, TILE * TILE, 3).astype(np.int32)
    lit = t.max(axis=3) > 0
    white = (t.min(axis=3) > 0) & lit
    labels = np.full((CELLS, CELLS), -1, int)
    for k, col in enumerate(PALETTE_BGR):
        is_k = (t == col).all(axis=3)
        only_k = (is_k | ~lit).all(axis=2) & lit.any(axis=2) & ~white.any(axis=2)
        labels[only_k] = k
    return labels


def sample_points() -> tuple[np.ndarray, np.ndarray]:
    """Displayed-pixel centres of each cell's inner 6x6 (shape 112, 112, 36)."""
    r, c, i, j = np.meshgrid(np.arange(CELLS), np.arange(CELLS), np.arange(1, TILE - 1), np.arange(1, TILE - 1),
                             indexing="ij")
    x = (ORIGIN + PITCH * c + j).astype(np.float32).reshape(CELLS, CELLS, -1)
    y = (ORIGIN + PITCH * r + i).astype(np.float32).reshape(CELLS, CELLS, -1)
    return x, y


def cell_features(image: np.ndarray, px: np.ndarray, py: np.ndarray) -> np.ndarray:
    """Each cell's colour: the mean of the brightest third of its 36 samples (a tile is a shape on black)."""
    n = px.shape[-1]
    s = cv2.remap(image, px.reshape(-1, n).astype(np.float32), py.reshape(-1, n).astype(np.float32),
                  cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE).reshape(*px.shape, 3).astype(np.float32)
    order = np.argsort(-s.max(axis=3), axis=2)[..., : n // 3]
    return np.take_along_axis(s, order[..., None], axis=2).mean(axis=2)


def colour_error_rate(features: np.ndarray, labels: np.ndarray) -> tuple[float, int, int]:
    """Nearest-colour classification against this image's own class means (estimated from the truth).

    Returns (rate, errors, cells).
    """
    m = labels >= 0
    f, lab = features[m], labels[m]
    means = np.stack([f[lab == k].mean(axis=0) for k in range(len(PALETTE_BGR))])
    pred = ((f[:, None, :] - means[None]) ** 2).sum(axis=2).argmin(axis=1)
    errors = int((pred != lab).sum())
    return errors / len(lab), errors, len(lab)


# ---- photometric, blur and noise fit -----------------------------------------------------------------

@dataclass
class Photometry:
    M_bgr: np.ndarray      # camera BGR = M @ screen BGR (linear)
    black_bgr: np.ndarray  # output DN added after the tone curve
    flare_bgr: np.ndarray  # linear light added before it (negative: black crush)
    gamma: float           # output = 255 * linear ** (1 / gamma)
    vignette: float        # fall-off at the photo's corner
    sigma_px: float        # blur in displayed pixels
    rms: float             # residual RMS (DN) of the fit
    extra: dict = field(default_factory=dict)


def _predict(p: np.ndarray, L: np.ndarray, r2: np.ndarray) -> np.ndarray:
    M = p[:9].reshape(3, 3)
    lin = (L @ M.T) * (1 - p[16] * r2[:, None]) + p[12:15]
    return p[9:12] + 255 * np.clip(lin, 1e-6, None) ** (1 / p[15])


def fit_photometry(gt: np.ndarray, photo: np.ndarray, al: Alignment, samples: int = 6000,
                   seed: int = 0) -> tuple[Photometry, np.ndarray, np.ndarray]:
    """Fit the channel model to the photo, in the displayed frame. Returns (fit, aligned photo, prediction)."""
    from scipy.optimize import least_squares, minimize_scalar

    a = cv2.remap(photo, al.mapx, al.mapy, cv2.INTER_LINEAR).astype(np.float32)
    ph, pw = photo.shape[:2]
    cx, cy = (pw - 1) / 2, (ph - 1) / 2
    r2 = (((al.mapx - cx) ** 2 + (al.mapy - cy) ** 2) / (cx * cx + cy * cy)).astype(np.float32)
    rng = np.random.default_rng(seed)
    ys = rng.integers(12, SIZE - 12, samples)
    xs = rng.integers(12, SIZE - 12, samples)
    obs, rr = a[ys, xs], r2[ys, xs]
    g = gt.astype(np.float32) / 255  # binary display values: linear light whatever the display gamma
    lo = [-0.5] * 9 + [0.0] * 3 + [-0.3] * 3 + [0.8, 0.0]  # black >= 0: a lifted floor; the crush is flare < 0
    hi = [3.0] * 9 + [80] * 3 + [0.5] * 3 + [4.0, 0.9]
    state: dict = {}

    def run(sigma: float) -> float:
        L = cv2.GaussianBlur(g, (0, 0), sigma)[ys, xs]
        p0 = state["best"][2] if "best" in state else np.r_[np.eye(3).ravel() * 0.7, [5, 5, 5], [0, 0, 0], 1.8, 0.2]
        res = least_squares(lambda p: (_predict(p, L, rr) - obs).ravel(), p0, bounds=(lo, hi), x_scale="jac")
        cost = float(np.sqrt(np.mean(res.fun**2)))
        if "best" not in state or cost < state["best"][0]:
            state["best"] = (cost, sigma, res.x)
        return cost

    for s in (0.6, 1.0, 1.4, 1.8):
        run(s)
    s0 = state["best"][1]
    minimize_scalar(run, bounds=(max(0.3, s0 - 0.4), s0 + 0.4), method="bounded", options=dict(xatol=0.04))
    cost, sigma, p = state["best"]
    L = cv2.GaussianBlur(g, (0, 0), sigma)
    pred = _predict(p, L.reshape(-1, 3), r2.ravel()).reshape(SIZE, SIZE, 3).astype(np.float32)
    fit = Photometry(p[:9].reshape(3, 3), p[9:12], p[12:15], float(p[15]), float(p[16]), float(sigma), cost)
    return fit, a, pred


def _flat(gt: np.ndarray, size: int = 5) -> np.ndarray:
    """Displayed pixels whose size x size neighbourhood is one colour (away from the border)."""
    flat = np.ones(gt.shape[:2], bool)
    k = np.ones((size, size), np.uint8)
    for ch in range(3):
        flat &= cv2.erode(gt[..., ch], k) == cv2.dilate(gt[..., ch], k)
    flat[:12], flat[-12:], flat[:, :12], flat[:, -12:] = False, False, False, False
    return flat


def fit_shading(aligned: np.ndarray, pred: np.ndarray) -> dict:
    """Smooth gain left after the fit (backlight, viewing angle, ISP tone mapping): brightness and colour std.

    The gain is measured as local least squares of photo against prediction;
    brightness at a 32 px scale, colour (deviation of each channel from the
    mean gain) at a 16 px scale.
    """
    out = {}
    for name, s in (("shading", 32), ("shading_chroma", 16)):
        num = cv2.GaussianBlur(aligned * pred, (0, 0), s)
        den = cv2.GaussianBlur(pred * pred, (0, 0), s)
        g = (num / np.maximum(den, 1.0))[100:-100, 100:-100]
        lum = g.mean(axis=2)
        out[name] = float(lum.std()) if name == "shading" else float((g - lum[..., None]).std())
    return out


def fit_noise(gt: np.ndarray, aligned: np.ndarray, pred: np.ndarray, fit: Photometry) -> dict:
    """Pixel noise vs output level on flat areas, and the sensor (read, shot) that explains it.

    The residual is high-passed (minus its own 2 px blur) so that shading and
    slow misfit do not count as noise; what is left still holds JPEG and
    demosaicing noise after the phone's denoising.
    """
    from scipy.optimize import least_squares

    flat = _flat(gt)
    r = aligned - pred
    hp = r - cv2.GaussianBlur(r, (0, 0), 2.0)
    hp *= 1 / math.sqrt(1 - 1 / (4 * math.sqrt(math.pi) * 2.0))  # white noise keeps this share through the high-pass
    levels, sigmas, counts = [], [], []
    for ch in range(3):
        lv = pred[..., ch][flat]
        rs = hp[..., ch][flat]
        edges = np.arange(0, 257, 16)
        for lo_, hi_ in zip(edges[:-1], edges[1:]):
            sel = (lv >= lo_) & (lv < hi_)
            if sel.sum() < 200:
                continue
            x = rs[sel]
            levels.append(float(lv[sel].mean()))
            sigmas.append(1.4826 * float(np.median(np.abs(x - np.median(x)))))
            counts.append(int(sel.sum()))
    lv, sg, cn = np.array(levels), np.array(sigmas), np.array(counts)
    blk = float(np.mean(fit.black_bgr))
    use = lv > blk + 12  # below, the ISP's black crush hides the sensor noise
    gamma = fit.gamma

    def model(q: np.ndarray, level: np.ndarray) -> np.ndarray:
        y = np.clip((level - blk) / 255, 1e-4, 1) ** gamma
        slope = 255 / gamma * y ** (1 / gamma - 1)
        return slope * np.sqrt(q[0] ** 2 + q[1] * y)

    if use.sum() >= 2:
        w = np.sqrt(cn[use] / cn[use].max())
        res = least_squares(lambda q: (model(q, lv[use]) - sg[use]) * w, [0.005, 0.0005],
                            bounds=([0, 0], [0.2, 0.2]))
        read, shot = float(res.x[0]), float(res.x[1])
    else:
        read = shot = math.nan
    dark = sg[lv <= blk + 12]
    return dict(read_noise=read, shot_noise=shot, levels=lv.round(1).tolist(), sigma_dn=sg.round(2).tolist(),
                lit_sigma_dn=float(np.average(sg[use], weights=cn[use])) if use.any() else math.nan,
                dark_sigma_dn=float(dark.mean()) if dark.size else math.nan)


def load_pair(root: Path, gt_name: str, photo_name: str) -> tuple[np.ndarray, np.ndarray]:
    gt = cv2.imread(str(root / gt_name), cv2.IMREAD_COLOR)
    photo = cv2.imread(str(root / photo_name), cv2.IMREAD_COLOR)
    if gt is None or photo is None:
        raise FileNotFoundError(f"cannot read {gt_name} / {photo_name} in {root}")
    return gt, photo


def rgb_from_bgr_matrix(m: np.ndarray) -> list[list[float]]:
    p = [2, 1, 0]
    return np.asarray(m)[np.ix_(p, p)].round(4).tolist()


__all__ = ["PAIRS", "realcaps_dir", "find_anchors", "align", "Alignment", "cell_labels", "sample_points",
           "cell_features", "colour_error_rate", "fit_photometry", "fit_noise", "fit_shading", "Photometry",
           "load_pair"]
