"""`python -m wccl.room.fit`: fit the room's channel to real screen photos and check the `webcam` profile.

Consumes: ../shared/realcaps (photos of a screen beside the images it
showed; see wccl/room/realcaps.py). Emits: the fitted parameters per photo
and their medians (printed, and written to wccl/room/fitted.json), then a
Markdown table of the raw cell colour error rate of a simple nearest-colour
classifier on each real photo versus on the simulator rendering the same
displayed image at the same camera pixels per cell with the `webcam`
profile. The profile must not be easier than the photos.

Options: --out PATH (default wccl/room/fitted.json), --no-write, --profile
(default webcam), --captures N (simulated captures per photo, default 3),
--quick (skip the photometric fit: alignment and error rates only).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import cv2
import numpy as np

from wccl.room import realcaps as rc
from wccl.cli import command_parser

HERE = Path(__file__).resolve().parent
SCREEN_PX = rc.SIZE            # the displayed PNG fills a 1024x1024 screen, pixel for pixel
SCREEN_PITCH_M = 0.00025       # a desktop monitor's pixel pitch (0.25 mm)
SIM_CAMERA = (1280, 1024)      # a 1024 px code at 7.8 px/cell, seen at an angle, needs ~960 rows (photos: 1280x960)


def sim_room(profile: str, px_per_cell: float, seed: int, overrides: dict | None = None):
    """A two-node room: camera 'cam' looks at screen 'scr' (showing a 1024x1024 image) at `px_per_cell`.

    The screen keeps the profile's turn (yaw/pitch/roll) so it is seen at the
    profile's angle; the camera aims straight at it from its own screen centre.
    """
    from wccl.room import SimulatedRoom

    diag_in = SCREEN_PITCH_M * SCREEN_PX * math.sqrt(2) / 0.0254
    room_ch = dict(camera_width=SIM_CAMERA[0], camera_height=SIM_CAMERA[1], screen_diag_in=diag_in)
    room_ch.update(overrides or {})
    from wccl.room.params import resolve

    p = resolve(profile, room_ch, {})
    room_ch.setdefault("hfov_deg", p.hfov_deg)  # the profile's lens, whatever the layout
    f = (p.camera_width / 2) / math.tan(math.radians(p.hfov_deg) / 2)
    want = px_per_cell / rc.PITCH  # camera px per screen px
    dist = f * SCREEN_PITCH_M / want
    cam_ch = dict(yaw_deg=0.0, pitch_deg=0.0, roll_deg=0.0, camera_offset_m=[0.0, 0.0])
    x, y = rc.sample_points()
    centres = np.stack([x[..., 14].ravel(), y[..., 14].ravel()], axis=1)  # one point per cell
    for _ in range(3):
        ch = dict(room_ch, distance_m=dist)
        room = SimulatedRoom(["cam", "scr"], SCREEN_PX, SCREEN_PX, 30.0, profile=profile, seed=seed,
                             channel=ch, node_channels=[cam_ch, {}])
        proj = room.project("cam", "scr", centres).reshape(rc.CELLS, rc.CELLS, 2)
        got = float(np.median(np.hypot(*np.diff(proj, axis=1).reshape(-1, 2).T)))
        got = 0.5 * got + 0.5 * float(np.median(np.hypot(*np.diff(proj, axis=0).reshape(-1, 2).T)))
        if abs(got / px_per_cell - 1) < 0.003:
            break
        dist *= got / px_per_cell
    return room, got


def sim_error(gt: np.ndarray, profile: str, px_per_cell: float, captures: int = 3, seed: int = 0,
              overrides: dict | None = None, save: Path | None = None, measure: bool = False):
    """(mean error rate, px/cell reached, per-capture rates, measurements) of the classifier on simulated
    captures of `gt`; with `measure`, the first capture also goes through the same fit as the photos."""
    room, got = sim_room(profile, px_per_cell, seed, overrides)
    room.show_at("scr", gt, 0.0)
    labels = rc.cell_labels(gt)
    x, y = rc.sample_points()
    pts = room.project("cam", "scr", np.stack([x.ravel(), y.ravel()], axis=1))
    px, py = pts[:, 0].reshape(x.shape), pts[:, 1].reshape(x.shape)
    rates = []
    measured: dict = {}
    for k in range(captures):
        img = room.capture_at("cam", 5.0 + 0.5 * k, k)  # auto exposure has settled on the code
        if save is not None and k == 0:
            cv2.imwrite(str(save), img)
        rates.append(rc.colour_error_rate(rc.cell_features(img, px, py), labels)[0])
        if measure and k == 0:
            measured = measure_capture(room, gt, img)
    return float(np.mean(rates)), got, rates, measured


def measure_capture(room, gt: np.ndarray, img: np.ndarray) -> dict:
    """Run the photos' fit on a simulated capture (its map from displayed to camera pixels is known exactly)."""
    yy, xx = np.mgrid[0:rc.SIZE, 0:rc.SIZE].astype(np.float64)
    p = room.project("cam", "scr", np.stack([xx.ravel(), yy.ravel()], axis=1))
    mapx = p[:, 0].reshape(rc.SIZE, rc.SIZE).astype(np.float32)
    mapy = p[:, 1].reshape(rc.SIZE, rc.SIZE).astype(np.float32)
    jx, jy = np.gradient(mapx, axis=1), np.gradient(mapy, axis=1)
    kx, ky = np.gradient(mapx, axis=0), np.gradient(mapy, axis=0)
    scale = float(np.median(np.sqrt(np.abs(jx * ky - jy * kx))))
    al = rc.Alignment(mapx, mapy, 0.0, scale)
    fit, aligned, pred = rc.fit_photometry(gt, img, al)
    noise = rc.fit_noise(gt, aligned, pred, fit)
    shading = rc.fit_shading(aligned, pred)
    return dict(blur_sigma_camera_px=round(fit.sigma_px * scale, 3), camera_gamma=round(fit.gamma, 3),
                shading=round(shading["shading"], 4), shading_chroma=round(shading["shading_chroma"], 4),
                noise_lit_sigma_dn=round(noise["lit_sigma_dn"], 2), fit_rms_dn=round(fit.rms, 2))


def fit_photo(root: Path, gt_name: str, photo_name: str, kind: str, photometry: bool = True) -> dict:
    gt, photo = rc.load_pair(root, gt_name, photo_name)
    al = rc.align(gt, photo, kind)
    labels = rc.cell_labels(gt)
    x, y = rc.sample_points()
    px, py = al.to_photo(x, y)
    rate, errors, cells = rc.colour_error_rate(rc.cell_features(photo, px, py), labels)
    out = dict(displayed=gt_name, photo=photo_name, kind=kind, photo_size=[photo.shape[1], photo.shape[0]],
               px_per_cell=round(al.cam_px_per_px * rc.PITCH, 3), align_residual_px=round(al.residual_px, 3),
               colour_error_rate=round(rate, 5), colour_errors=errors, cells=cells)
    if photometry:
        fit, aligned, pred = rc.fit_photometry(gt, photo, al)
        noise = rc.fit_noise(gt, aligned, pred, fit)
        shading = rc.fit_shading(aligned, pred)
        cam_scale = al.cam_px_per_px
        out.update(
            crosstalk_rgb=rc.rgb_from_bgr_matrix(fit.M_bgr),
            black_level_rgb=np.round(fit.black_bgr[::-1], 2).tolist(),
            flare_rgb=np.round(fit.flare_bgr[::-1], 4).tolist(),
            camera_gamma=round(fit.gamma, 3),
            vignette=round(fit.vignette, 3),
            blur_sigma_displayed_px=round(fit.sigma_px, 3),
            blur_sigma_camera_px=round(fit.sigma_px * cam_scale, 3),
            fit_rms_dn=round(fit.rms, 2),
            shading=round(shading["shading"], 4),
            shading_chroma=round(shading["shading_chroma"], 4),
            noise_lit_sigma_dn=round(noise["lit_sigma_dn"], 2),
            noise_dark_sigma_dn=round(noise["dark_sigma_dn"], 2),
            read_noise=round(noise["read_noise"], 5),
            shot_noise=round(noise["shot_noise"], 6),
            noise_levels_dn=noise["levels"],
            noise_sigma_dn=noise["sigma_dn"],
        )
    return out


def summarise(photos: list[dict]) -> dict:
    keys = ["camera_gamma", "vignette", "blur_sigma_camera_px", "shading", "shading_chroma", "noise_lit_sigma_dn",
            "noise_dark_sigma_dn", "read_noise", "shot_noise", "fit_rms_dn"]
    med = {k: round(float(np.median([p[k] for p in photos])), 5) for k in keys if k in photos[0]}
    for k in ("crosstalk_rgb", "black_level_rgb", "flare_rgb"):
        if k in photos[0]:
            med[k] = np.round(np.median([p[k] for p in photos], axis=0), 4).tolist()
    med["max_blur_sigma_camera_px"] = round(float(max(p.get("blur_sigma_camera_px", 0) for p in photos)), 3)
    return med


def table(rows: list[dict], profile: str) -> str:
    lines = [f"| photo | kind | px/cell | real colour error | sim `{profile}` colour error | sim >= real |",
             "|---|---|---:|---:|---:|:---:|"]
    for r in rows:
        ok = "yes" if r["sim_error_rate"] >= r["colour_error_rate"] else "**no**"
        lines.append(f"| {r['photo']} | {r['kind']} | {r['px_per_cell']:.2f} | {100 * r['colour_error_rate']:.2f} % "
                     f"| {100 * r['sim_error_rate']:.2f} % | {ok} |")
    real = np.mean([r["colour_error_rate"] for r in rows])
    sim = np.mean([r["sim_error_rate"] for r in rows])
    lines.append(f"| **mean** | | | {100 * real:.2f} % | {100 * sim:.2f} % | {'yes' if sim >= real else '**no**'} |")
    return "\n".join(lines)


def measured_table(rows: list[dict], profile: str) -> str:
    """The same fit run on the photos and on the simulator's captures of the same images."""
    lines = ["| photo | blur sigma (cam px) real / sim | lit noise (DN) real / sim | shading real / sim "
             "| colour shading real / sim | fit RMS (DN) real / sim |", "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        m = r.get("sim_measured", {})
        if not m:
            continue
        lines.append(f"| {r['photo']} | {r['blur_sigma_camera_px']:.2f} / {m['blur_sigma_camera_px']:.2f} "
                     f"| {r['noise_lit_sigma_dn']:.1f} / {m['noise_lit_sigma_dn']:.1f} "
                     f"| {r['shading']:.3f} / {m['shading']:.3f} "
                     f"| {r['shading_chroma']:.3f} / {m['shading_chroma']:.3f} "
                     f"| {r['fit_rms_dn']:.1f} / {m['fit_rms_dn']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("wccl.room.fit", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(HERE / "fitted.json"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--profile", default="webcam")
    ap.add_argument("--captures", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="alignment and error rates only (no photometric fit)")
    ap.add_argument("--save-sim", default=None, help="folder for one simulated capture per photo (PNG)")
    args = ap.parse_args(argv)
    root = rc.realcaps_dir()
    if root is None:
        print("no real captures: ../shared/realcaps is absent (set WCCL_REALCAPS to point at it)", file=sys.stderr)
        return 1
    cv2.setNumThreads(1)
    t0 = time.perf_counter()
    photos = []
    for gt_name, photo_name, kind in rc.PAIRS:
        r = fit_photo(root, gt_name, photo_name, kind, photometry=not args.quick)
        photos.append(r)
        shown = {k: v for k, v in r.items() if k not in ("noise_levels_dn", "noise_sigma_dn")}
        print(json.dumps(shown))
    save = Path(args.save_sim) if args.save_sim else None
    if save:
        save.mkdir(parents=True, exist_ok=True)
    for r in photos:
        gt = cv2.imread(str(root / r["displayed"]), cv2.IMREAD_COLOR)
        rate, got, rates, measured = sim_error(gt, args.profile, r["px_per_cell"], args.captures,
                                               save=save / (Path(r["photo"]).stem + ".png") if save else None,
                                               measure=not args.quick)
        r["sim_error_rate"] = round(rate, 5)
        r["sim_error_rates"] = [round(x, 5) for x in rates]
        r["sim_px_per_cell"] = round(got, 3)
        if measured:
            r["sim_measured"] = measured
    summary = summarise(photos) if not args.quick else {}
    md = table(photos, args.profile)
    if not args.quick:
        md += "\n\n" + measured_table(photos, args.profile)
    print()
    if summary:
        print("median fit:", json.dumps(summary))
        print()
    print(md)
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    if not args.no_write:
        doc = dict(
            source="../shared/realcaps (sz3/cimbar-samples, MPL-2.0): 7 phone photos of a monitor",
            model="out = black + 255 * clip((1 - vignette * r^2) * (M @ blur(screen_linear)) + flare, 0, 1)"
                  " ** (1 / camera_gamma); RGB order; r^2 relative to the photo's corner",
            classifier="per cell: mean of the brightest third of its inner 6x6 samples; nearest class mean "
                       "(class means from the truth, per image)",
            profile=args.profile, median=summary, photos=photos, table_markdown=md,
        )
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
