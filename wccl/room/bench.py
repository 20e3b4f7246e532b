"""`python -m wccl.room.bench`: how long one camera capture takes to render, per profile, on one core.

Consumes: nothing (renders layout frames of random bytes on a 1280x720
screen seen by one 1280x720 camera). Emits: a Markdown table of median
milliseconds per capture: `held` (the screen shows the same frame as the
last capture: the usual case, frames are held ~1 s), `new frame` (a new
image on the screen for every capture: the worst case), `mixed` (the
screen changes during the exposure: two frames blended per row, one of
them new), and the one-off set-up of a camera. H.264 is timed as a stream.
"""

from __future__ import annotations

import platform
import subprocess
import time

import cv2
import numpy as np

from protocols.layout import GridLayout, render
from wccl.room import SimulatedRoom
from wccl.cli import command_parser


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        for line in out.splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown"


def bench_profile(profile: str, n: int = 60, seed: int = 0) -> dict[str, float]:
    lay = GridLayout(40, 70, 8, 16, 1)
    rng = np.random.default_rng(seed)
    frames = [render(rng.bytes(lay.frame_bytes), lay, 1280, 720) for _ in range(8)]
    t0 = time.perf_counter()
    room = SimulatedRoom(["alice", "bob"], 1280, 720, 30.0, profile=profile, seed=seed)
    room.show_at("alice", frames[0], 0.0)
    room.capture_at("bob", 1.0, 0)
    setup = time.perf_counter() - t0
    period = 1 / room.camera_fps("bob")
    held, new, mixed = [], [], []
    t = 2.0
    for k in range(n):  # the same frame
        a = time.perf_counter()
        room.capture_at("bob", t, k, stream=True)
        held.append(time.perf_counter() - a)
        t += period
    for k in range(n):  # a new frame before every capture (shown long enough before it: no mixing)
        room.show_at("alice", frames[(k + 1) % len(frames)], t - period / 2)
        a = time.perf_counter()
        room.capture_at("bob", t + period / 4, n + k, stream=True)
        new.append(time.perf_counter() - a)
        t += period
    if not room.exact and room.params["bob"].exposure_ms > 0:
        e = room.params["bob"].exposure_ms * 1e-3
        iv = room.cams["bob"].views[0]
        for k in range(n // 2):  # the screen changes in the middle of the exposure
            room.show_at("alice", frames[k % len(frames)], t)
            room.capture_at("bob", t + 0.1, 2 * n + 2 * k, stream=True)
            room.show_at("alice", frames[(k + 1) % len(frames)], t + 0.2)
            up = room._times["alice"][-1]
            before = room.cams["bob"].stats["mixed"]
            a = time.perf_counter()
            room.capture_at("bob", up - (iv.u_min + iv.u_max + e) / 2, 2 * n + 2 * k + 1, stream=True)
            mixed.append(time.perf_counter() - a)
            assert room.cams["bob"].stats["mixed"] == before + 1, "the capture did not straddle the change"
            t += 0.5
    ms = lambda xs: 1e3 * float(np.median(xs)) if xs else float("nan")  # noqa: E731
    px = None
    if not room.exact:
        cell = room.project("bob", "alice", np.array([[640.0, 360.0], [656.0, 360.0], [640.0, 376.0]]))
        px = float(np.mean([np.hypot(*(cell[1] - cell[0])), np.hypot(*(cell[2] - cell[0]))]))
    return dict(held=ms(held), new=ms(new), mixed=ms(mixed), setup=1e3 * setup, px_per_cell=px)


def main(argv: list[str] | None = None) -> int:
    ap = command_parser("wccl.room.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profiles", default="exact,ideal,webcam,harsh")
    ap.add_argument("-n", type=int, default=60, help="captures timed per case")
    args = ap.parse_args(argv)
    cv2.setNumThreads(1)
    print(f"CPU: {cpu_model()} ({platform.machine()}), cv2.setNumThreads(1), numpy {np.__version__}, "
          f"OpenCV {cv2.__version__}")
    print("1280x720 screen (40x70 cells of 16 px), 1280x720 camera, one screen in view; median ms per capture\n")
    print("| profile | held frame | new frame | mixed (2 frames) | camera set-up | camera px per 16 px cell |")
    print("|---|---:|---:|---:|---:|---:|")
    for prof in args.profiles.split(","):
        r = bench_profile(prof.strip(), args.n)
        cell = f"{r['px_per_cell']:.1f}" if r["px_per_cell"] else "16 (pixel-exact)"
        mixed = f"{r['mixed']:.2f}" if r["mixed"] == r["mixed"] else "-"
        print(f"| {prof} | {r['held']:.2f} | {r['new']:.2f} | {mixed} | {r['setup']:.0f} | {cell} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
