"""The screen -> light -> camera channel of one camera: optics, sensor, time mixing, compression.

Consumes: the images each visible screen showed around a capture (with the
times they went up), the capture's start time, its exposure gain and white
balance, and a per-capture random generator. Emits: one BGR uint8 camera
image of `camera_width` x `camera_height`.

Per screen in view, once (when the camera is first used):
  a region of interest (ROI) around the screen's footprint, remap tables
  from camera pixels to the (halved) screen image through the lens
  distortion and the pose homography, and static fields: vignetting, the
  moire of the panel's sub-pixel stripes, viewing-angle fall-off, the
  screen's coverage, its black-level leakage and the room's glare on it.
Per distinct screen image, once (cached: frames are held for many captures):
  display gamma -> linear light (uint16) -> area reduction by 2 while the
  screen is still finer than the sensor -> bilinear remap at sensor
  resolution (moire of the cell grid comes from this resampling) ->
  defocus blur -> fields -> camera crosstalk matrix.
Per capture:
  mix the cached images of the frames that overlapped each row's exposure
  window (rolling shutter, panel scan-out: a different mix per row), add the
  room (ambient, glare), apply exposure gain and white balance, add shot and
  read noise, the ISP's black crush/flare, the tone curve and black level,
  and compress (JPEG of the ROI, aligned to the 16-pixel MCU grid so it is
  the same as compressing the whole frame; or H.264 of the whole stream).
Outside the ROI the frame is a static background (the room, the laptops'
lids), rendered once through the same sensor and JPEG and re-toned for
the current exposure gain.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import cv2
import numpy as np

from wccl.room.geometry import Lid, PinholeCamera, ScreenPlane, ScreenView, plane_hit, project_polygon
from wccl.room.params import ChannelParams

_MCU = 16           # JPEG macro-block: ROIs snap to it
_NOISE_PAD = 32     # noise texture margin: per-capture offsets in [0, pad)
_BG_STEP = 0.02     # background re-toning step (log gain)
_LUM_BGR = np.array([0.0722, 0.7152, 0.2126])  # linear luminance weights, BGR order


def rgb_matrix_to_bgr(m) -> np.ndarray:
    """A 3x3 RGB->RGB matrix as the BGR->BGR matrix OpenCV's transform wants."""
    a = np.asarray(m, dtype=np.float64)
    p = [2, 1, 0]
    return a[np.ix_(p, p)]


class ScreenModel:
    """A node's screen: its physical plane, display transfer and refresh timing."""

    def __init__(self, name: str, index: int, params: ChannelParams, plane: ScreenPlane, seed_seq: list[int]):
        self.name, self.index, self.params, self.plane = name, index, params, plane
        p = params
        lin = (np.arange(256) / 255.0) ** p.screen_gamma
        self.lut16 = np.round(lin * 65535).astype(np.uint16)
        self.lut_f = lin.astype(np.float32)
        self.refresh = p.screen_refresh_hz
        rng = np.random.default_rng([*seed_seq, index, 0x5C4EE7])
        self.vsync_phase = float(rng.random() / self.refresh) if self.refresh > 0 else 0.0
        self.scan_s = p.screen_scanout / self.refresh if self.refresh > 0 else 0.0

    def display_time(self, t: float) -> float:
        """When an image shown at true time `t` reaches the panel (the next refresh; its top row)."""
        if self.refresh <= 0:
            return t
        n = math.ceil((t - self.vsync_phase) * self.refresh - 1e-9)
        return self.vsync_phase + n / self.refresh

    def luminance(self, image: np.ndarray) -> float:
        """Mean linear luminance of an image on this screen (relative to its white)."""
        small = image[::4, ::4]
        lin = cv2.LUT(small, self.lut_f)
        return float((lin.reshape(-1, 3).mean(axis=0) @ _LUM_BGR) * self.params.screen_brightness)


@dataclass
class _InView:
    """One screen as one camera sees it (all arrays cover the screen's ROI)."""

    screen: ScreenModel
    view: ScreenView
    x0: int
    y0: int
    x1: int
    y1: int
    halvings: int
    map1: np.ndarray
    map2: np.ndarray
    field: np.ndarray         # (h, w, 3) float32: brightness * vignette * moire * angle fall-off
    U: np.ndarray | None      # (h, w) float32 s: when this pixel's exposure starts, relative to row 0's,
    #                           minus when its screen row updates, relative to the top row's
    u_min: float
    u_max: float


def _moire(u: np.ndarray, v: np.ndarray, scale_u: np.ndarray, scale_v: np.ndarray, sigma_px: float,
           strength: float) -> np.ndarray:
    """Per-channel gain from the panel's RGB stripes and black matrix, as the camera samples them.

    The sub-pixel pattern (period: 1 screen pixel) is a Fourier series; each
    harmonic is attenuated by the camera's blur and pixel aperture projected
    onto the screen (`scale_*`: screen pixels per camera pixel), then
    evaluated at the pixel's screen position: what survives is the moire.
    """
    out = np.ones(u.shape + (3,), dtype=np.float32)
    if strength <= 0:
        return out
    stripe_fill, row_fill = 0.9 / 3, 0.85

    def transfer(n: int, scale: np.ndarray) -> np.ndarray:
        s = sigma_px * scale
        return np.exp(-2 * math.pi**2 * (s * n) ** 2) * np.abs(np.sinc(n * scale))

    vert = np.ones_like(v)
    for n in (1, 2, 3):
        vert = vert + 2 * np.sinc(n * row_fill) * transfer(n, scale_v) * np.cos(2 * math.pi * n * v)
    for ch, offset in ((2, 0.0), (1, 1 / 3), (0, 2 / 3)):  # R, G, B stripes left to right (BGR indices)
        centre = -0.5 + offset + stripe_fill / 2
        horiz = np.ones_like(u)
        for n in (1, 2, 3):
            horiz = horiz + 2 * np.sinc(n * stripe_fill) * transfer(n, scale_u) * np.cos(2 * math.pi * n * (u - centre))
        out[..., ch] = (1 + strength * (horiz * vert - 1)).astype(np.float32)
    return out


class CameraModel:
    """Renders one node's camera images. Build with the screens it could see; heavy set-up is lazy."""

    def __init__(self, name: str, index: int, params: ChannelParams, camera: PinholeCamera,
                 screens: list[tuple[ScreenModel, ScreenView]], seed_seq: list[int],
                 occluders: list[Lid] | None = None):
        self.name, self.index, self.params, self.camera = name, index, params, camera
        self.occluders = list(occluders or [])  # the other laptops' lids: they hide what is behind them
        self.seed_seq = seed_seq
        self.candidates = [(s, v) for s, v in screens if v.visible]
        self.hidden = {s.name: v.reason for s, v in screens if not v.visible}
        p = params
        self.M = rgb_matrix_to_bgr(p.crosstalk).astype(np.float32)
        self.wb = np.array(p.white_balance[::-1], dtype=np.float64)
        self.black = np.array(p.black_level[::-1], dtype=np.float64)
        self.flare = np.array(p.flare[::-1], dtype=np.float64)
        self.inv_gamma = 1.0 / p.camera_gamma
        # 3x4 affine colour maps for cv2.transform (much faster than cv2.multiply/add with a scalar tuple).
        self._flare_m = np.c_[np.eye(3), self.flare].astype(np.float32)
        self._out_m = np.c_[255 * np.eye(3), self.black].astype(np.float32)
        self._noise_m = np.c_[p.shot_noise * np.eye(3), np.full(3, p.read_noise**2)].astype(np.float32)
        self._ready = False
        self._cache: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._bg_lut_cache: OrderedDict[tuple[int, int, int], np.ndarray] = OrderedDict()
        self.stats = {"optical_renders": 0, "mixed": 0}
        # What auto exposure meters, known before the heavy set-up: each screen's share of the frame's
        # light per unit of its mean luminance, and the room's light.
        W, H = camera.width, camera.height
        white = float(_LUM_BGR @ self.M @ np.ones(3))
        self.ae_weights: dict[str, float] = {}
        covered = 0.0
        for s, v in self.candidates:
            poly = np.clip(v.outline, [0, 0], [W, H]).astype(np.float32)
            share = abs(cv2.contourArea(poly)) / (W * H)
            covered += share
            falloff = max(math.cos(math.radians(v.angle_deg)), 0.0) ** s.params.screen_angle_falloff
            self.ae_weights[s.name] = share * falloff * white * (1 - p.vignette / 3)
        self.ae_room = p.ambient * 0.55 * (1 - p.vignette / 2) * max(0.0, 1 - covered)

    # ---- set-up ------------------------------------------------------------------------------

    def _vignette(self, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
        c = self.camera
        cx, cy = (c.width - 1) / 2, (c.height - 1) / 2
        r2 = ((xs - cx) ** 2 + (ys - cy) ** 2) / (cx * cx + cy * cy)
        return (1.0 - self.params.vignette * r2).astype(np.float32)

    def prepare(self) -> None:
        if self._ready:
            return
        p, cam = self.params, self.camera
        W, H = cam.width, cam.height
        margin = int(math.ceil(3 * p.blur_sigma_px)) + 3
        views: list[_InView] = []
        for s, v in self.candidates:
            pts = v.lid if v.lid is not None and len(v.lid) else v.outline
            x0 = max(0, int(math.floor(np.nanmin(pts[:, 0]))) - margin)
            y0 = max(0, int(math.floor(np.nanmin(pts[:, 1]))) - margin)
            x1 = min(W, int(math.ceil(np.nanmax(pts[:, 0]))) + margin + 1)
            y1 = min(H, int(math.ceil(np.nanmax(pts[:, 1]))) + margin + 1)
            if x1 <= x0 or y1 <= y0:
                self.hidden[s.name] = "out of the field of view"
                continue
            views.append(self._in_view(s, v, x0, y0, x1, y1))
        self.views = views
        # The frame ROI: union of the screens' ROIs, snapped to the JPEG block grid.
        if views:
            fx0 = min(iv.x0 for iv in views) // _MCU * _MCU
            fy0 = min(iv.y0 for iv in views) // _MCU * _MCU
            fx1 = min(W, -(-max(iv.x1 for iv in views) // _MCU) * _MCU)
            fy1 = min(H, -(-max(iv.y1 for iv in views) // _MCU) * _MCU)
        else:
            fx0 = fy0 = fx1 = fy1 = 0
        self.roi = (fx0, fy0, fx1, fy1)
        self._build_static()
        rng = np.random.default_rng([*self.seed_seq, self.index, 0x7E47])
        h, w = fy1 - fy0, fx1 - fx0
        if p.read_noise > 0 or p.shot_noise > 0:
            tex = rng.standard_normal((h + _NOISE_PAD, w + _NOISE_PAD, 3), dtype=np.float32)
            if p.noise_grain_px > 0:
                tex = cv2.GaussianBlur(tex, (0, 0), p.noise_grain_px)
                tex /= max(float(tex.std()), 1e-6)
            self.noise_tex = tex
        else:
            self.noise_tex = None
        self._ready = True

    def _in_view(self, s: ScreenModel, v: ScreenView, x0: int, y0: int, x1: int, y1: int) -> _InView:
        p, cam, sp = self.params, self.camera, s.params
        xs, ys = np.meshgrid(np.arange(x0, x1, dtype=np.float64), np.arange(y0, y1, dtype=np.float64))
        xn, yn = cam.undistort(xs, ys)
        u, vv = v.to_screen(xn, yn)  # full-resolution screen pixel coordinates of every camera pixel
        # Screen pixels per camera pixel, along the screen's axes.
        du_dx, du_dy = np.gradient(u, axis=1), np.gradient(u, axis=0)
        dv_dx, dv_dy = np.gradient(vv, axis=1), np.gradient(vv, axis=0)
        scale_u = np.hypot(du_dx, du_dy)
        scale_v = np.hypot(dv_dx, dv_dy)
        sw, sh = s.plane.width_px, s.plane.height_px
        inside = ((u >= -0.5) & (u <= sw - 0.5) & (vv >= -0.5) & (vv <= sh - 0.5)).astype(np.float32)
        occ = self._occluded(s, xn, yn, inside > 0)
        if occ is not None:
            inside *= ~occ  # another laptop's lid is in front: that part of the screen is not seen
        on = inside > 0
        finest = float(np.minimum(scale_u, scale_v)[on].min()) if on.any() else 1.0
        # Area-reduce by 2 while even the nearest part of the screen stays at least sensor-fine.
        halvings, f = 0, 1.0
        while finest / (f * 2) >= 1.0 and sw // (2 ** (halvings + 1)) >= 8 and sh // (2 ** (halvings + 1)) >= 8:
            halvings += 1
            f *= 2
        rw, rh = sw, sh
        for _ in range(halvings):
            rw, rh = rw // 2, rh // 2
        mx = ((u + 0.5) * (rw / sw) - 0.5).astype(np.float32)
        my = ((vv + 0.5) * (rh / sh) - 0.5).astype(np.float32)
        map1, map2 = cv2.convertMaps(mx, my, cv2.CV_16SC2)
        cover = cv2.GaussianBlur(inside, (0, 0), p.blur_sigma_px) if p.blur_sigma_px > 0 else inside
        # Static gain field: screen white level, vignetting, viewing-angle fall-off, shading, sub-pixel moire.
        field = _moire(u, vv, scale_u, scale_v, p.blur_sigma_px, sp.screen_subpixel)
        gain = self._vignette(xs, ys) * np.float32(sp.screen_brightness)
        if sp.screen_angle_falloff > 0:
            p0, eu, ev = s.plane.pixel_axes()
            to_cam = cam.position[None, None, :] - (p0 + u[..., None] * eu + vv[..., None] * ev)
            cos = (to_cam @ s.plane.normal) / np.linalg.norm(to_cam, axis=2)
            gain *= (np.clip(cos, 0, 1) ** sp.screen_angle_falloff).astype(np.float32)
        if occ is not None:  # the lid's edge is as blurred as the screen's
            seen = (~occ).astype(np.float32)
            gain *= cv2.GaussianBlur(seen, (0, 0), p.blur_sigma_px) if p.blur_sigma_px > 0 else seen
        field *= gain[..., None]
        if p.shading > 0 or p.shading_chroma > 0:
            field *= self._shading(s, u, vv)
        # Time: rolling shutter (camera rows) against panel scan-out (screen rows).
        U = None
        u_min = u_max = 0.0
        if p.readout_ms > 0 or s.scan_s > 0:
            U = (ys / cam.height * p.readout_ms * 1e-3 - np.clip(vv / sh, 0, 1) * s.scan_s).astype(np.float32)
            u_min, u_max = float(U.min()), float(U.max())
        iv = _InView(s, v, x0, y0, x1, y1, halvings, map1, map2, field, U, u_min, u_max)
        iv._cover = cover  # type: ignore[attr-defined]
        iv._uv = (u, vv)   # type: ignore[attr-defined]
        return iv

    def _occluded(self, s: ScreenModel, xn: np.ndarray, yn: np.ndarray, on: np.ndarray) -> np.ndarray | None:
        """Where (camera pixels of the ROI) another laptop's lid lies between this camera and screen `s`."""
        lids = [lid for lid in self.occluders if lid.name != s.name]
        if not lids or not on.any():
            return None
        R = self.camera.R
        dirs = xn[..., None] * R[:, 0] + yn[..., None] * R[:, 1] + R[:, 2]
        t_screen = plane_hit(s.plane, self.camera.position, dirs)
        occ = np.zeros(on.shape, dtype=bool)
        for lid in lids:
            occ |= lid.hit(self.camera.position, dirs) < t_screen
        occ &= on
        return occ if occ.any() else None

    def _shading(self, s: ScreenModel, u: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Smooth non-uniformity: brightness attached to the screen (a coarse random grid over it), colour
        in camera pixels (per-channel noise blurred to 16 px), each with the parameter's std."""
        p = self.params
        rng = np.random.default_rng([*self.seed_seq, self.index, s.index, 0x5AD])
        gh, gw = 5, 8
        grid = rng.standard_normal((gh, gw)).astype(np.float32)
        gu = (np.clip(u / s.plane.width_px, 0, 1) * (gw - 1)).astype(np.float32)
        gv = (np.clip(v / s.plane.height_px, 0, 1) * (gh - 1)).astype(np.float32)
        lum = cv2.remap(grid, gu, gv, cv2.INTER_CUBIC, borderMode=cv2.BORDER_REFLECT)
        fine = cv2.resize(grid, (gw * 16, gh * 16), interpolation=cv2.INTER_CUBIC)
        lum *= np.float32(p.shading / max(float(fine.std()), 1e-6))
        h, w = u.shape
        chroma = rng.standard_normal((h, w, 3)).astype(np.float32)
        chroma = cv2.GaussianBlur(chroma, (0, 0), 16.0)
        chroma -= chroma.mean(axis=2, keepdims=True)
        chroma *= np.float32(p.shading_chroma / max(float(chroma.std()), 1e-9))
        return np.clip(1.0 + lum[..., None] + chroma, 0.05, None)

    def _build_static(self) -> None:
        """The room, lids, screen black leakage and glare (linear, unit gain), and the background frame."""
        p, cam = self.params, self.camera
        W, H = cam.width, cam.height
        rng = np.random.default_rng([*self.seed_seq, self.index, 0xB6])
        # A dim room: smooth blotches of neutral-ish reflectance, lit by the ambient light.
        coarse = rng.uniform(0.25, 0.9, (9, 16, 1)) * rng.uniform(0.85, 1.15, (9, 16, 3))
        room = cv2.resize(coarse.astype(np.float32), (W, H), interpolation=cv2.INTER_CUBIC)
        room = np.clip(room, 0.05, 1.2) * np.float32(p.ambient)
        # Lids, far to near: those of the screens in view (dark bezels), then any other laptop's lid in the
        # frame: a screen not read (dark) or a lid's back (dark grey), hiding what is behind it.
        lids = [(iv.view.distance_m, iv.view.lid, 0.06) for iv in self.views if iv.view.lid is not None]
        shown = {iv.screen.name for iv in self.views}
        for lid in self.occluders:
            if lid.name in shown:
                continue
            poly = project_polygon(cam, lid.corners())
            if poly is None:
                continue
            back = float(np.dot(lid.body.R[:, 2], cam.position - lid.body.origin)) < 0
            lids.append((float(np.linalg.norm(lid.body.origin - cam.position)), poly, 0.2 if back else 0.06))
        lids.sort(key=lambda e: -e[0])
        for _, poly, level in lids:
            cv2.fillPoly(room, [np.round(poly * 16).astype(np.int32)], (level * p.ambient,) * 3,
                         lineType=cv2.LINE_AA, shift=4)
        xs, ys = np.meshgrid(np.arange(W, dtype=np.float32), np.arange(H, dtype=np.float32))
        vig = self._vignette(xs, ys)
        A = room * vig[..., None]
        for iv in self.views:
            sl = (slice(iv.y0, iv.y1), slice(iv.x0, iv.x1))
            cover = iv._cover  # type: ignore[attr-defined]
            u, v = iv._uv      # type: ignore[attr-defined]
            sp = iv.screen.params
            sw, sh = iv.screen.plane.width_px, iv.screen.plane.height_px
            # Black pixels still leak light; the screen's surface reflects the room (a gradient).
            leak = cv2.transform(iv.field * np.float32(sp.screen_black), self.M)
            g = p.glare * (1 + p.glare_gradient * ((np.clip(u / sw, 0, 1) + np.clip(v / sh, 0, 1)) / 2 - 0.5))
            glare = (g * vig[sl]).astype(np.float32)[..., None]
            A[sl] = A[sl] * (1 - cover[..., None]) + cover[..., None] * (leak + glare)
            del iv._cover, iv._uv  # type: ignore[attr-defined]
        fx0, fy0, fx1, fy1 = self.roi
        self.A_roi = np.ascontiguousarray(A[fy0:fy1, fx0:fx1])
        # The background outside the ROI: through the sensor at the reference gain, once.
        g0 = p.exposure_gain
        bg_rng = np.random.default_rng([*self.seed_seq, self.index, 0xB7])
        Y = A * np.float32(g0)
        if p.read_noise > 0 or p.shot_noise > 0:
            sig = np.sqrt(np.maximum(Y, 0) * p.shot_noise + p.read_noise**2)
            Y = Y + sig * bg_rng.standard_normal(Y.shape, dtype=np.float32)
        bg = self._tone(Y.astype(np.float32))
        if p.codec == "mjpeg":
            bg = self._jpeg(bg)
        self.bg8 = bg
        self.bg_gain = g0

    # ---- per capture ---------------------------------------------------------------------------

    def _tone(self, Y: np.ndarray) -> np.ndarray:
        """Linear sensor values (BGR float32, consumed) -> output uint8: ISP flare/crush, tone curve, black level."""
        if self.flare.any():
            Y = cv2.transform(Y, self._flare_m)
        # The floor keeps log() finite (1e-6 ** (1/g) * 255 < 0.01 DN); cv2.pow is ~15x slower on zeros.
        Y = cv2.max(Y, (1e-6, 1e-6, 1e-6, 0.0))
        cv2.threshold(Y, 1.0, 1.0, cv2.THRESH_TRUNC, dst=Y)
        if self.inv_gamma != 1.0:
            cv2.log(Y, Y)
            Y *= np.float32(self.inv_gamma)
            cv2.exp(Y, Y)
        return cv2.convertScaleAbs(cv2.transform(Y, self._out_m))

    def _jpeg(self, img: np.ndarray) -> np.ndarray:
        p = self.params
        samp = {"420": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_420, "422": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_422,
                "444": cv2.IMWRITE_JPEG_SAMPLING_FACTOR_444}[p.jpeg_subsampling]
        ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, p.jpeg_quality,
                                             cv2.IMWRITE_JPEG_SAMPLING_FACTOR, samp])
        if not ok:
            raise RuntimeError("JPEG encoding failed")
        return cv2.imdecode(buf, cv2.IMREAD_COLOR)

    def optical(self, iv: _InView, serial: int, image: np.ndarray) -> np.ndarray:
        """Camera-channel linear light of one screen image over the screen's ROI (cached)."""
        key = (iv.screen.index, serial)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        lin = cv2.LUT(image, iv.screen.lut16)
        for _ in range(iv.halvings):
            lin = cv2.resize(lin, (lin.shape[1] // 2, lin.shape[0] // 2), interpolation=cv2.INTER_AREA)
        warped = cv2.remap(lin, iv.map1, iv.map2, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
        O = warped.astype(np.float32)
        O *= np.float32(1 / 65535)
        if self.params.blur_sigma_px > 0:
            O = cv2.GaussianBlur(O, (0, 0), self.params.blur_sigma_px)
        O *= iv.field
        if not np.array_equal(self.M, np.eye(3, dtype=np.float32)):
            O = cv2.transform(O, self.M)
        O.setflags(write=False)
        self._cache[key] = O
        self.stats["optical_renders"] += 1
        while len(self._cache) > 4 * max(1, len(self.views)) + 2:
            self._cache.popitem(last=False)
        return O

    def _mix(self, iv: _InView, t: float, frames: list[tuple[float, int, np.ndarray]]) -> np.ndarray:
        """The screen's light integrated over each pixel's exposure window (frames: (up_time, serial, image))."""
        e = max(self.params.exposure_ms * 1e-3, 1e-7)
        lo, hi = t + iv.u_min, t + iv.u_max + e
        spans = []
        for i, (T, serial, img) in enumerate(frames):
            end = frames[i + 1][0] if i + 1 < len(frames) else math.inf
            if T < hi and end > lo:
                spans.append((T - t, end - t, serial, img))
        if len(spans) == 1:
            return self.optical(iv, spans[0][2], spans[0][3])
        self.stats["mixed"] += 1
        out = None
        for a, b, serial, img in spans:
            if iv.U is None:
                w = np.float32(max(0.0, min(b, e) - max(a, 0.0)) / e)
            else:
                w = np.minimum(iv.U + np.float32(e), np.float32(min(b, 1e9)))
                w -= np.maximum(iv.U, np.float32(max(a, -1e9)))
                np.clip(w, 0, e, out=w)
                w *= np.float32(1 / e)
                w = w[..., None]
            term = self.optical(iv, serial, img) * w
            out = term if out is None else cv2.add(out, term)
        return out

    def background(self, gain_bgr: np.ndarray) -> np.ndarray:
        """The static background re-toned for the current gain (cached in 2 % steps: it carries no data)."""
        ratio = gain_bgr / self.bg_gain
        key = tuple(int(round(math.log(max(r, 1e-6)) / _BG_STEP)) for r in ratio)
        hit = self._bg_lut_cache.get(key)
        if hit is None:
            if key == (0, 0, 0):
                hit = self.bg8
            else:
                q = np.exp(np.array(key) * _BG_STEP) ** self.inv_gamma
                v = np.arange(256, dtype=np.float64)[:, None]
                lut = np.clip(self.black + np.maximum(v - self.black, 0) * q, 0, 255)
                hit = cv2.LUT(self.bg8, np.round(lut).astype(np.uint8).reshape(256, 1, 3))
            self._bg_lut_cache[key] = hit
            while len(self._bg_lut_cache) > 3:
                self._bg_lut_cache.popitem(last=False)
        return hit

    def render(self, t: float, frames: dict[str, list[tuple[float, int, np.ndarray]]], gain: float,
               wb_bgr: np.ndarray, rng: np.random.Generator, compress: bool = True) -> np.ndarray:
        """One camera image whose row 0 starts integrating at true time `t`."""
        self.prepare()
        p = self.params
        gain_bgr = gain * self.wb * wb_bgr
        frame = self.background(gain_bgr).copy()
        ox, oy = (int(x) for x in rng.integers(0, _NOISE_PAD, 2))
        sign = np.float32(1.0 if rng.random() < 0.5 else -1.0)
        fx0, fy0, fx1, fy1 = self.roi
        if fx1 > fx0 and fy1 > fy0:
            Y = self.A_roi.copy()
            for iv in self.views:
                O = self._mix(iv, t, frames[iv.screen.name])
                sub = Y[iv.y0 - fy0:iv.y1 - fy0, iv.x0 - fx0:iv.x1 - fx0]
                sub += O
            Y = cv2.transform(Y, np.diag(gain_bgr).astype(np.float32))
            if self.noise_tex is not None:
                # Shot + read noise: sigma^2 = read^2 + shot * signal (the signal is >= 0 here).
                sig = cv2.sqrt(cv2.transform(Y, self._noise_m))
                h, w = Y.shape[:2]
                sig = cv2.multiply(sig, self.noise_tex[oy:oy + h, ox:ox + w])
                if sign < 0:
                    Y -= sig
                else:
                    Y += sig
            out = self._tone(Y)
            if compress and p.codec == "mjpeg":
                out = self._jpeg(out)
            frame[fy0:fy1, fx0:fx1] = out
        return frame


__all__ = ["CameraModel", "ScreenModel", "rgb_matrix_to_bgr"]
