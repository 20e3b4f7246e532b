"""`python -m wccl.lab.cimbar --cimbar PATH`: libcimbar through WCCL's simulated room, for comparison.

cimbar (github.com/sz3/libcimbar, the best public screen-to-camera code) is not part of WCCL and is never
vendored: build its command-line tool yourself (docs/cimbar.md) and give its path with `--cimbar` or the
environment variable WCCL_CIMBAR. The two laptops of the room file (default rooms/two-laptops-sim.toml):
the second node's screen shows cimbar's frames, the first node's camera films them, cimbar's own decoder
reads the captures. E.g.

    python -m wccl.lab.cimbar --cimbar ~/libcimbar/build/build/src/exe/cimbar/cimbar --profile webcam --mode Bu --hold 0.1 --upscale 2

Pipeline: random file -> `cimbar --encode` (PNG frames) -> each frame scaled to fit the 1280x720 screen,
centred on the frame's own border colour -> shown on bob's screen for --hold s each (the frame list looped
--passes times, after a --warmup s showing frame 0 that is not counted) -> alice's camera captured at the
camera's fps (stream=True, as the room's RoomCamera does) -> `cimbar CAPTURES -o OUT` (fountain decode).
If the whole run decodes, a binary search finds the fewest frames shown whose captures decode.
goodput = file bytes / (frames shown x hold) / 1000 (kB/s, as wccl.lab.bench), 0 if it never decodes.
The search after the fact favours cimbar (a sender would not know when to stop); its square frames on a
16:9 screen, and its command-line encoder's few spare frames (the list is looped instead), do not.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import cv2
import numpy as np

from wccl.config import ConfigError, assignments, load_config, with_values
from wccl.room import SimulatedRoom
from wccl.cli import command_parser


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main(argv=None):
    p = command_parser("wccl.lab.cimbar", __doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="webcam")
    p.add_argument("--config", default="rooms/two-laptops-sim.toml")
    p.add_argument("--seed", type=int, default=None, help="room seed (default: the config's)")
    p.add_argument("--hold", type=float, default=0.1, help="seconds each cimbar frame stays on the screen")
    p.add_argument("--mode", default="B", help="cimbar mode: B (1024x1024), Bm (1024x720), Bu (736x637), 4C")
    p.add_argument("--scale", type=float, default=0.0, help="screen px per cimbar px (0: fit 1280x720)")
    p.add_argument("--interp", default="area", choices=["area", "nearest", "linear", "cubic"])
    p.add_argument("--kb", type=int, default=200, help="file size in kB (1000 bytes)")
    p.add_argument("--passes", type=int, default=2, help="times the encoded frame list is shown")
    p.add_argument("--warmup", type=float, default=1.0, help="s showing frame 0 before the clock starts")
    p.add_argument("--upscale", type=float, default=1.0,
                   help="receiver side: resize each capture by this factor (bicubic) before cimbar's decoder "
                        "(its anchor scanner misses anchors this small at 1x)")
    p.add_argument("--channel", action="append", default=[], metavar="KEY=JSON",
                   help="diagnostic only: a [room.channel] override (e.g. distance_m=0.3); not the shipped room")
    p.add_argument("--cimbar", default=os.environ.get("WCCL_CIMBAR"),
                   help="cimbar's command-line tool (default: $WCCL_CIMBAR)")
    p.add_argument("--out", default=None, help="folder for the frames, captures and result.json "
                   "(default: runs/cimbar/<profile>_<mode>_h<hold>...)")
    p.add_argument("--no-search", action="store_true", help="skip the binary search for the fewest frames")
    p.add_argument("--per-capture", type=int, default=0, metavar="N",
                   help="also run the decoder on every Nth capture alone: count those it extracts and reads "
                        "(exit code 0: anchors found and some bytes decoded; not proof the ECC passed)")
    args = p.parse_args(argv)
    if not args.cimbar or not (os.path.isfile(args.cimbar) and os.access(args.cimbar, os.X_OK)):
        print(f"wccl.lab.cimbar: no cimbar tool at {args.cimbar!r}: build libcimbar's `cimbar` (docs/cimbar.md) "
              "and give its path with --cimbar or WCCL_CIMBAR", file=sys.stderr)
        return 2
    cv2.setNumThreads(1)

    tag = f"{args.profile}_{args.mode}_h{args.hold}_s{args.scale or 'fit'}_u{args.upscale}" + "".join("_" + c.replace("=", "") for c in args.channel)
    out = args.out or os.path.join("runs", "cimbar", tag)
    shutil.rmtree(out, ignore_errors=True)
    for d in ("enc", "caps"):
        os.makedirs(os.path.join(out, d))

    # 1. the file and its cimbar frames
    rng = np.random.default_rng(1234)
    data = rng.bytes(args.kb * 1000)
    src = os.path.join(out, "payload.bin")
    with open(src, "wb") as f:
        f.write(data)
    r = sh([args.cimbar, "--encode", "-m", args.mode, "-i", src, "-o", os.path.join(out, "enc", "f")])
    if r.returncode:
        print(f"wccl.lab.cimbar: cimbar --encode failed: {r.stderr.strip()}", file=sys.stderr)
        return 1
    enc = sorted(glob.glob(os.path.join(out, "enc", "f_*.png")), key=lambda s: int(s.rsplit("_", 1)[1][:-4]))

    # 2. the room
    try:
        base = load_config(args.config)
        values = {"profile": args.profile, **({"seed": args.seed} if args.seed is not None else {})}
        if args.profile == "exact":  # (the exact profile takes no channel parameters)
            values["nodes"] = [dict(n.model_dump(), channel={}) for n in base.room.nodes]
        values["channel"] = {} if args.profile == "exact" else dict(base.room.channel)
        values["channel"].update(assignments(args.channel, "--channel"))
        cfg = with_values(base, args.config, room=values)
    except ConfigError as e:
        print(f"wccl.lab.cimbar: config error: {e}", file=sys.stderr)
        return 2
    room = SimulatedRoom.from_config(cfg)
    rx, tx = cfg.room.nodes[0].name, cfg.room.nodes[1].name
    W, H = cfg.screen.width, cfg.screen.height
    fps = room.camera_fps(rx)

    interp = dict(area=cv2.INTER_AREA, nearest=cv2.INTER_NEAREST, linear=cv2.INTER_LINEAR,
                  cubic=cv2.INTER_CUBIC)[args.interp]

    def screen_image(path):
        fr = cv2.imread(path)
        h, w = fr.shape[:2]
        s = args.scale or min(W / w, H / h)
        nw, nh = min(W, round(w * s)), min(H, round(h * s))
        fr = cv2.resize(fr, (nw, nh), interpolation=interp) if (nw, nh) != (w, h) else fr
        img = np.empty((H, W, 3), np.uint8)
        img[:] = fr[0, 0]  # cimbar's own background colour around the code
        y, x = (H - nh) // 2, (W - nw) // 2
        img[y:y + nh, x:x + nw] = fr
        return img, (w, h, nw, nh)

    screens = []
    for pth in enc:
        img, geo = screen_image(pth)
        screens.append(img)
    cv2.imwrite(os.path.join(out, "screen_0.png"), screens[0])
    seq = [i for _ in range(args.passes) for i in range(len(screens))]
    n_shown = len(seq)
    t0 = args.warmup
    t_end = t0 + n_shown * args.hold

    # 3. show and capture, in time order
    t_wall = time.time()
    room.show_at(tx, screens[0], 0.0)
    shows = [(t0 + j * args.hold, seq[j]) for j in range(n_shown)]
    caps = []  # (t, path)
    k, js = 0, 0
    t_cap = 0.0
    while True:
        t_cap = k / fps
        if t_cap >= t_end:
            break
        while js < n_shown and shows[js][0] <= t_cap:
            if js == 0 or seq[js] != seq[js - 1]:
                room.show_at(tx, screens[shows[js][1]], shows[js][0])
            js += 1
        img = room.capture_at(rx, t_cap, k=k, stream=True)
        if t_cap >= t0 - 0.5:  # keep the captures from just before the clock starts
            pth = os.path.join(out, "caps", f"c{k:05d}.png")
            if args.upscale != 1:
                img = cv2.resize(img, None, fx=args.upscale, fy=args.upscale, interpolation=cv2.INTER_CUBIC)
            cv2.imwrite(pth, img)
            caps.append((t_cap, pth))
        k += 1
    t_render = time.time() - t_wall

    # 4. decode
    def decode(paths, name):
        od = os.path.join(out, name)
        shutil.rmtree(od, ignore_errors=True)
        os.makedirs(od)
        rr = sh([args.cimbar, "-m", args.mode, "-o", od, *paths])
        files = glob.glob(os.path.join(od, "*"))  # the CLI names it <encode id>.<size>, e.g. 109.200000
        ok = any(open(g, "rb").read() == data for g in files)
        return ok, rr

    ok_all, rr = decode([c[1] for c in caps], "dec_all")
    per_capture = None
    if args.per_capture:
        good = 0
        sample = caps[::args.per_capture]
        for _, pth in sample:
            r1 = sh([args.cimbar, "-m", args.mode, "-o", os.path.join(out, "dec_one"), pth])
            good += r1.returncode == 0
            shutil.rmtree(os.path.join(out, "dec_one"), ignore_errors=True)
        per_capture = f"{good}/{len(sample)}"

    best = n_shown if ok_all else None
    if ok_all and not args.no_search:
        lo, hi = 1, n_shown  # hi decodes; find the fewest frames shown whose captures decode
        while lo < hi:
            mid = (lo + hi) // 2
            ok, _ = decode([c[1] for c in caps if c[0] < t0 + mid * args.hold], "dec_search")
            if ok:
                hi = mid
            else:
                lo = mid + 1
        best = hi
    res = dict(profile=args.profile, mode=args.mode, hold_s=args.hold, camera_fps=fps,
               frame_px=f"{geo[0]}x{geo[1]}", shown_px=f"{geo[2]}x{geo[3]}", file_bytes=len(data),
               encoded_frames=len(enc), passes=args.passes, frames_shown_total=n_shown, captures=len(caps),
               decoded_all=ok_all, decoder_rc=rr.returncode,
               frames_needed=best, captures_needed=(sum(c[0] < t0 + best * args.hold for c in caps) if best else None),
               goodput_kBps=round(len(data) / (best * args.hold) / 1000, 2) if best else 0.0,
               captures_decoded_alone=per_capture, upscale=args.upscale, channel=args.channel, render_s=round(t_render, 1), out=out)
    print(json.dumps(res))
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
