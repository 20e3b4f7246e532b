"""`python -m wccl.imaging.bench`: how fast one core decodes camera captures.

Renders captures of the `webcam` profile (1280x720, one screen in view,
showing frames of the given layout), then times the FrameDecoder's work per
capture on one core (cv2 and BLAS limited to one thread): finding the code,
sampling its cells, the colour model and classification, error correction
and the frame check. Prints the median time and frames per second for a
capture of a new frame (everything runs) and of a frame already decoded
(only finding and sampling run: the decoder sees it is unchanged); and
how well the cells read against what the screen showed: the share of data
cells read wrong, the share of those the reader doubted (its confidence
below the erasure threshold: Reed-Solomon erases them), the share of right
cells it doubted, and, with 8 colours, the bits wrong in each channel.

    python -m wccl.imaging.bench --config rooms/two-laptops-sim.toml --set cell_px=9 --set rows=76 --set cols=138
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from protocols.cells import bytes_to_symbols as symbols_of  # noqa: E402
from protocols.fec import ERASE_BELOW  # noqa: E402
from protocols.layout import render  # noqa: E402
from wccl.config import ConfigError, assignments, load_config, parse_config  # noqa: E402
from wccl.imaging import reader  # noqa: E402
from wccl.room import SimulatedRoom  # noqa: E402
from wccl.cli import command_parser


def cell_errors(reads: list[tuple[np.ndarray, np.ndarray]], truth: list[np.ndarray], colours: int,
                erase_below: float = ERASE_BELOW) -> dict:
    """How the clean reads' cells compare with what the screen showed (see the module doc)."""
    if not reads:
        return dict(clean_reads=0)
    got = np.concatenate([r[0] for r in reads])
    conf = np.concatenate([r[1] for r in reads])
    want = np.concatenate(truth)
    wrong = got != want
    out = dict(clean_reads=len(reads), cell_error_rate=round(float(wrong.mean()), 5),
               wrong_cells_doubted=round(float((conf[wrong] < erase_below).mean()), 3) if wrong.any() else None,
               right_cells_doubted=round(float((conf[~wrong] < erase_below).mean()), 4))
    if colours == 8:  # symbol = r*4 + g*2 + b
        flips = got ^ want
        out["bit_error_rate_bgr"] = [round(float(((flips >> k) & 1).mean()), 5) for k in range(3)]
    return out


def main(argv: list[str] | None = None) -> int:
    p = command_parser("wccl.imaging.bench", __doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="config.toml")
    p.add_argument("--profile", default="webcam")
    p.add_argument("--captures", type=int, default=60)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a [link] key")
    p.add_argument("--lens", choices=["fit", "pinhole"],
                   help="sample cells through the lens fitted from the code's edges, as a run's decoder does, or "
                   "through a pinhole (default: as a run reads: the config's [camera] lens; a pinhole in the exact room)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    cv2.setNumThreads(1)
    try:
        data = load_config(args.config).model_dump()
        data["room"]["profile"] = args.profile
        data["link"].update(assignments(args.set))
        cfg = parse_config(data, args.config)
    except ConfigError as e:
        print(f"wccl.imaging.bench: config error: {e}", file=sys.stderr)
        return 2
    codec = cfg.link.codec()
    grid = codec.layout
    room = SimulatedRoom.from_config(cfg)
    rx, tx = cfg.room.nodes[0].name, cfg.room.nodes[1].name
    rng = np.random.default_rng(0)
    captures, shown = [], []
    for i in range(args.captures):
        frame = codec.encode(rng.bytes(codec.payload_per_frame), count=1, session=1, sender=1, stream="grad",
                             step=i)[0]
        room.show_at(tx, render(frame, grid, cfg.screen.width, cfg.screen.height, sender=1, parity=i & 1), i * 1.0)
        captures.append(room.capture_at(rx, i * 1.0 + 0.5, k=i))
        shown.append(symbols_of(frame, grid.colours, grid.n_data))
    model = reader.ColourModel(grid)
    lens_mode = args.lens or cfg.lens_of(rx)
    fit = None
    if lens_mode == "fit":
        from wccl.imaging.lens import LensFit

        h, w = captures[0].shape[:2]
        fit = LensFit(w, h)
        for img in captures[:8]:  # the lens is fitted from the first captures' code edges, as in a run
            for q in reader.find_quads(img, grid):
                fit.edges(img, q.corners, grid)

    def cells(img: np.ndarray, q):
        # what the FrameDecoder does per code once it uses the fitted lens: the code's edges, then the cells
        sides = fit.edges(img, q.corners, grid) if fit is not None else None
        pixels = fit.pixels(sides, grid, img.shape) if sides is not None else None
        return reader.sample(img, q, grid, pixels)

    reads: list[tuple[np.ndarray, np.ndarray]] = []  # (symbols, confidence) of each clean read

    def full(img: np.ndarray) -> bool:
        ok = False
        for q in reader.find_quads(img, grid):
            sampled = cells(img, q)
            code = reader.read_quad(img, q, grid, model, sampled=sampled)
            if code is None or code.mixed:
                continue
            reads.append((code.symbols, code.confidence))
            try:
                codec.decode(code.symbols, code.confidence)
                ok = True
            except ValueError:
                pass
        return ok

    def repeated(img: np.ndarray) -> None:
        for q in reader.find_quads(img, grid):
            v, _ = cells(img, q)
            reader.same_frame(v, v)

    times_new, times_rep, decoded, truth = [], [], 0, []
    for img, sym in zip(captures, shown):
        t = time.perf_counter()
        n_reads = len(reads)
        decoded += full(img)
        truth += [sym] * (len(reads) - n_reads)
        times_new.append(time.perf_counter() - t)
        t = time.perf_counter()
        repeated(img)
        times_rep.append(time.perf_counter() - t)
    new_ms, rep_ms = float(np.median(times_new)) * 1000, float(np.median(times_rep)) * 1000
    out = dict(profile=args.profile, lens=lens_mode, lens_fits=fit.fits if fit else None,
               layout=f"{grid.rows}x{grid.cols}x{grid.colours}@{grid.cell_px}px",
               captures=len(captures), decoded=decoded, new_frame_ms=round(new_ms, 2),
               new_frame_fps=round(1000 / new_ms, 1), repeated_frame_ms=round(rep_ms, 2),
               repeated_frame_fps=round(1000 / rep_ms, 1), **cell_errors(reads, truth, grid.colours))
    print(json.dumps(out) if args.json else "\n".join(f"{k:>18}: {v}" for k, v in out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
