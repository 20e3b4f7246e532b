"""`python -m wccl.lab sweep`: run `wccl.lab bench` over a grid of link layouts.

Grid: cell size (`cell_px`; rows and cols derived to fill the screen), colour
count, hold time per frame, code rate, and room channel profile. Every point
is one `run_bench` call with the same bytes, tensor size, repair and seed, so
a sweep is reproducible from its seed (each point runs in a fresh worker process:
see `run_sweep`). The hackathon layout (40x70 cells of
16 px, 8 colours, 1 s hold, code rate 1.0) is added as one more point per
profile, marked `hackathon = True`.

Output directory:

- `results.jsonl`: one JSON object per finished point, appended (and flushed)
  as soon as the point ends. On start, points already there with the same
  parameters and seed are skipped: a sweep cut short with Ctrl-C resumes
  where it stopped.
- `sweep.csv`: every point of this grid (rewritten after every point).
- `goodput_vs_cell_px.png`, `errors_vs_cell_px.png`, `goodput_vs_hold.png`.
- `summary.md`: the grid, the definitions, every point, the best layout.
- `best_link.toml`: the best layout within the residual-error budget, as a
  `[link]` table the node's config accepts as is.

Residual error, defined per point:

- `tensor_loss` = 1 - tensors_delivered / tensors_sent (tensors not rebuilt intact);
- `frame_loss` = 1 - frames_decoded / frames_shown (shown frames never decoded);
- `frames_uncorrectable_share` = frames_uncorrectable / (frames_decoded + frames_uncorrectable):
  the share of Reed-Solomon decode attempts that failed (the bench counts a failed attempt per
  capture, a decoded frame once: a frame that fails on one capture may decode on the next, so
  this can be high while frame_loss is 0);
- `undetected_errors`: tensors delivered with wrong bytes (the bench's figure).

The budget (`--budget X`): tensor_loss <= X (default 0: every tensor
delivered) and undetected_errors == 0 (always). The best layout is the one
with the highest goodput within the budget.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable

from wccl.lab.bench import HACKATHON_LINK

RESULTS = "results.jsonl"
CSV_NAME = "sweep.csv"
SUMMARY = "summary.md"
BEST_TOML = "best_link.toml"
PLOTS = ("goodput_vs_cell_px.png", "errors_vs_cell_px.png", "goodput_vs_hold.png")
MAX_CELLS = 512  # LinkConfig's bound on rows and cols


@dataclass(frozen=True)
class Point:
    """One layout of the sweep, with everything that determines its result."""

    profile: str
    cell_px: int
    rows: int
    cols: int
    colours: int
    hold_s: float
    code_rate: float
    hackathon: bool
    nbytes: int
    tensor_bytes: int
    repair: float
    extra: int
    seed: int

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def link(self) -> dict[str, Any]:
        return dict(rows=self.rows, cols=self.cols, colours=self.colours, cell_px=self.cell_px,
                    hold_s=self.hold_s, code_rate=self.code_rate)


def margin_of(rec: dict, screen_w: int, screen_h: int, border: int) -> int | None:
    """The margin (cells a side) a grid point was derived with; None for the hackathon layout."""
    if rec.get("hackathon"):
        return None
    m = (screen_h // rec["cell_px"] - 2 * border - rec["rows"]) // 2
    return m if grid_for(rec["cell_px"], screen_w, screen_h, border, m) == (rec["rows"], rec["cols"]) else None


def grid_for(cell_px: int, screen_w: int, screen_h: int, border: int, margin: int) -> tuple[int, int]:
    """(rows, cols) of cells of `cell_px` screen px filling the screen, less the ring and `margin` cells a side."""
    rows = screen_h // cell_px - 2 * border - 2 * margin
    cols = screen_w // cell_px - 2 * border - 2 * margin
    return min(rows, MAX_CELLS), min(cols, MAX_CELLS)


def _holds_a_packet(rows: int, cols: int, colours: int, cell_px: int, border: int, code_rate: float) -> bool:
    from protocols.layout import GridLayout
    from protocols.link import LinkCodec

    try:
        LinkCodec(GridLayout(rows, cols, colours, cell_px, border), code_rate)
    except ValueError:
        return False
    return True


def make_points(profiles: list[str], cell_px: list[int], colours: list[int], holds: list[float],
                code_rates: list[float], *, screen_w: int, screen_h: int, border: int, margin: int | list[int],
                nbytes: int, tensor_bytes: int, repair: float, extra: int, seed: int,
                hackathon: bool = True) -> list[Point]:
    pts = []
    common = dict(nbytes=nbytes, tensor_bytes=tensor_bytes, repair=repair, extra=extra, seed=seed)
    for prof in profiles:
        if hackathon:
            pts.append(Point(profile=prof, hackathon=True, **HACKATHON_LINK, **common))
        margins = [margin] if isinstance(margin, int) else list(margin)
        for m, c, k, h, r in itertools.product(margins, cell_px, colours, holds, code_rates):
            rows, cols = grid_for(c, screen_w, screen_h, border, m)
            if not _holds_a_packet(rows, cols, k, c, border, r):
                continue  # too few cells for one frame header and packet: not a link at all
            pts.append(Point(profile=prof, cell_px=c, rows=rows, cols=cols, colours=k, hold_s=h, code_rate=r,
                             hackathon=False, **common))
    seen: set[str] = set()
    out = []
    for p in pts:  # a grid point equal to the hackathon layout is run once
        if p.key() not in seen:
            seen.add(p.key())
            out.append(p)
    return out


# --- worker side -----------------------------------------------------------------------------------------------

ONE_THREAD_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _one_thread() -> None:
    """cv2 and BLAS on one thread: with two workers on two cores, multi-threaded BLAS thrashes (10x slower)."""
    import cv2

    cv2.setNumThreads(1)
    try:  # optional: limits a BLAS already loaded (the in-process path, jobs=1)
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:
        pass


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops the workers
    _one_thread()
    from wccl.runtime.logs import configure_logging

    configure_logging("json", "error", stream=sys.stderr)


def run_point(cfg_data: dict, point: Point) -> dict:
    """Run one point (in a worker process); never raises: a layout that cannot run reports `error`."""
    from wccl.config import ConfigError, parse_config, with_values
    from wccl.lab.bench import run_bench

    rec: dict[str, Any] = dict(asdict(point))
    try:
        cfg = with_values(parse_config(cfg_data, "sweep"), "sweep", room={"profile": point.profile}, link=point.link())
        r = run_bench(cfg, point.nbytes, point.tensor_bytes, point.repair, point.extra, point.seed)
    except (ConfigError, ValueError) as e:
        rec["error"] = str(e)
        return rec
    r.pop("layout", None)
    r.pop("profile", None)
    rec.update(r)
    rec.update(derived(r))
    rec["error"] = ""
    return rec


def derived(r: dict) -> dict:
    sent, shown = r["tensors_sent"], r["frames_shown"]
    dec, unc = r["frames_decoded"], r["frames_uncorrectable"]
    return dict(
        tensor_loss=round(1 - r["tensors_delivered"] / sent, 6) if sent else None,
        frame_loss=round(1 - dec / shown, 6) if shown else None,
        frames_uncorrectable_share=round(unc / (dec + unc), 6) if dec + unc else None,
    )


def camera_px_per_screen_px(cfg_data: dict, profile: str) -> float | None:
    """Camera px per screen px at the centre of the sender's screen, as the receiver's camera sees it."""
    try:
        import numpy as np

        from wccl.room.room import SimulatedRoom

        names = [n["name"] for n in cfg_data["room"]["nodes"]]
        room = SimulatedRoom(names, cfg_data["screen"]["width"], cfg_data["screen"]["height"],
                             cfg_data["camera"]["fps"], profile=profile, seed=cfg_data["room"]["seed"])
        cx, cy, d = cfg_data["screen"]["width"] / 2, cfg_data["screen"]["height"] / 2, 50.0
        q = room.project(names[0], names[1], np.array([[cx - d, cy], [cx + d, cy], [cx, cy - d], [cx, cy + d]]))
        if not np.all(np.isfinite(q)):
            return None
        return float((np.linalg.norm(q[1] - q[0]) + np.linalg.norm(q[3] - q[2])) / (4 * d))
    except Exception:  # optional figure: never fail a sweep for it
        return None


# --- results store ---------------------------------------------------------------------------------------------

def load_results(out: Path) -> dict[str, dict]:
    done: dict[str, dict] = {}
    f = out / RESULTS
    if not f.exists():
        return done
    for line in f.read_text().splitlines():
        try:
            rec = json.loads(line)
            p = Point(**{k: rec[k] for k in Point.__dataclass_fields__})
        except (json.JSONDecodeError, KeyError, TypeError):
            continue  # a line cut short by a kill
        done[p.key()] = rec
    return done


def append_result(out: Path, rec: dict) -> None:
    with open(out / RESULTS, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


CSV_FIRST = ["profile", "hackathon", "cell_px", "camera_px_per_cell", "margin", "rows", "cols", "colours", "hold_s",
             "code_rate", "goodput_kBps", "raw_cell_error_rate", "tensor_loss", "frame_loss",
             "frames_uncorrectable_share", "undetected_errors", "meets_budget"]


def write_csv(path: Path, recs: list[dict]) -> None:
    keys = list(CSV_FIRST)
    for r in recs:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in recs:
            w.writerow({k: r.get(k, "") for k in keys})


# --- budget and best layout ------------------------------------------------------------------------------------

def meets_budget(rec: dict, budget: float) -> bool:
    return (not rec.get("error") and rec.get("tensor_loss") is not None and rec["tensor_loss"] <= budget + 1e-12
            and rec.get("undetected_errors", 1) == 0 and rec.get("goodput_kBps", 0) > 0)


def best_point(recs: list[dict], budget: float) -> dict | None:
    ok = [r for r in recs if meets_budget(r, budget)]
    # ties: fewer raw errors, then bigger cells (more margin)
    return max(ok, key=lambda r: (r["goodput_kBps"], -(r.get("raw_cell_error_rate") or 0), r["cell_px"]),
               default=None)


def link_toml(rec: dict, border_cells: int, budget: float) -> str:
    return (
        f"# wccl.lab sweep: best layout under profile {rec['profile']!r} within the budget "
        f"(tensor_loss <= {budget:g}, no undetected errors)\n"
        f"# goodput {rec['goodput_kBps']} KB/s, raw cell error rate {rec['raw_cell_error_rate']}, "
        f"{rec['tensors_delivered']}/{rec['tensors_sent']} tensors of {rec['tensor_bytes']} bytes, seed {rec['seed']}\n"
        "[link]\n"
        f"rows = {rec['rows']}\n"
        f"cols = {rec['cols']}\n"
        f"colours = {rec['colours']}\n"
        f"cell_px = {rec['cell_px']}\n"
        f"border_cells = {border_cells}\n"
        f"hold_s = {float(rec['hold_s'])!r}\n"
        f"code_rate = {float(rec['code_rate'])!r}\n"
    )


# --- plots and summary -----------------------------------------------------------------------------------------

def _lines(recs: list[dict], x: str, group: Callable[[dict], Any]) -> dict[Any, list[tuple[float, float, dict]]]:
    out: dict[Any, list] = {}
    for r in recs:
        out.setdefault(group(r), []).append(r)
    return {g: sorted(v, key=lambda r: r[x]) for g, v in sorted(out.items(), key=lambda kv: str(kv[0]))}



def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path

def write_plots(out: Path, recs: list[dict]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in recs if not r.get("error")]
    grid = [r for r in ok if not r["hackathon"]]
    hack = [r for r in ok if r["hackathon"]]
    profiles = sorted({r["profile"] for r in ok}) or ["-"]
    colour_of = {2: "tab:blue", 4: "tab:orange", 8: "tab:green"}
    holds = sorted({r["hold_s"] for r in grid})
    styles = ["-", "--", ":", "-."]
    rates = sorted({r["code_rate"] for r in grid})
    margins = sorted({r.get("margin") or 0 for r in grid})
    markers = ["o", "s", "^", "D", "v", "P", "X", "h"]
    paths = []

    def label_extra(r: dict) -> str:
        return ((f", rate {r['code_rate']:g}" if len(rates) > 1 else "") +
                (f", margin {r.get('margin')}" if len(margins) > 1 else ""))

    def marker(r: dict) -> str:
        return markers[(rates.index(r["code_rate"]) + len(rates) * margins.index(r.get("margin") or 0)) % len(markers)]

    def cell_ticks(ax, prof: str) -> None:
        cam = {r["cell_px"]: r.get("camera_px_per_cell") for r in ok if r["profile"] == prof}
        ax.set_xticks(sorted(cam))
        ax.set_xticklabels([f"{c}\n({cam[c]:.1f} cam)" if cam[c] else str(c) for c in sorted(cam)], fontsize=8)

    def raw_y(r: dict) -> float:  # no frame decoded: no point; zero errors: on the 1e-6 floor of the log axis
        v = r.get("raw_cell_error_rate")
        return math.nan if v is None else max(v, 1e-6)

    def mark_hackathon(ax, prof: str, ykey: str) -> None:
        for r in hack:
            if r["profile"] == prof and r.get(ykey) is not None:
                y = raw_y(r) if ykey == "raw_cell_error_rate" else r[ykey]
                ax.plot([r["cell_px"]], [y], marker="*", ms=14, color="crimson", ls="none",
                        label=f"hackathon (40x70, 8 col, {r['hold_s']:g} s, rate 1.0)")

    # 1. goodput against cell size, one line per colour count (and hold time, code rate)
    fig, axes = plt.subplots(1, len(profiles), figsize=(8.4 * len(profiles), 4.2), squeeze=False, dpi=80)
    for ax, prof in zip(axes[0], profiles):
        lines = _lines([r for r in grid if r["profile"] == prof], "cell_px",
                       lambda r: (r["colours"], r["hold_s"], r["code_rate"], r.get("margin") or 0))
        for (k, h, cr, _m), rs in lines.items():
            ax.plot([r["cell_px"] for r in rs], [r["goodput_kBps"] for r in rs], color=colour_of.get(k, "k"),
                    ls=styles[holds.index(h) % len(styles)], marker=marker(rs[0]),
                    label=f"{k} colours, hold {h:g} s" + label_extra(rs[0]))
        mark_hackathon(ax, prof, "goodput_kBps")
        ax.set_title(f"goodput, profile {prof}")
        cell_ticks(ax, prof)
        ax.set_xlabel("cell size (screen px per cell; camera px per cell)")
        ax.set_ylabel("goodput (KB/s, tensors delivered intact)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    paths.append(_save(fig, out / PLOTS[0]))

    # 2. raw and residual error against cell size
    fig, axes = plt.subplots(2, len(profiles), figsize=(8.8 * len(profiles), 7.2), squeeze=False, dpi=80)
    for j, prof in enumerate(profiles):
        lines = _lines([r for r in grid if r["profile"] == prof], "cell_px",
                       lambda r: (r["colours"], r["hold_s"], r["code_rate"], r.get("margin") or 0))
        ax_raw, ax_res = axes[0][j], axes[1][j]
        for (k, h, cr, _m), rs in lines.items():
            kw = dict(color=colour_of.get(k, "k"), ls=styles[holds.index(h) % len(styles)], marker=marker(rs[0]))
            xs = [r["cell_px"] for r in rs]
            lab = f"{k} col, hold {h:g} s" + label_extra(rs[0])
            ax_raw.plot(xs, [raw_y(r) for r in rs], label=lab, **kw)
            ax_res.plot(xs, [r["tensor_loss"] for r in rs], label=lab + ": tensor loss", **kw)
            ax_res.plot(xs, [r["frame_loss"] for r in rs], alpha=0.45, lw=1, **{**kw, "marker": "x"},
                        label=lab + ": frame loss")
        mark_hackathon(ax_raw, prof, "raw_cell_error_rate")
        mark_hackathon(ax_res, prof, "tensor_loss")
        ax_raw.set_yscale("log")
        ax_raw.set_title(f"raw cell error rate (before RS), profile {prof}")
        ax_raw.set_ylabel("wrong cells / cells read (0 drawn at 1e-6)")
        ax_res.set_title(f"residual: tensor loss (bold), frame loss (x), {prof}")
        ax_res.set_ylabel("share")
        ax_res.set_ylim(-0.05, 1.05)
        for ax in (ax_raw, ax_res):
            cell_ticks(ax, prof)
            ax.set_xlabel("cell size (screen px per cell; camera px per cell)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    paths.append(_save(fig, out / PLOTS[1]))

    # 3. goodput against hold time, one line per cell size and colour count
    cells = sorted({r["cell_px"] for r in grid})
    cmap = plt.get_cmap("viridis")
    fig, axes = plt.subplots(1, len(profiles), figsize=(8.4 * len(profiles), 4.2), squeeze=False, dpi=80)
    for ax, prof in zip(axes[0], profiles):
        lines = _lines([r for r in grid if r["profile"] == prof], "hold_s",
                       lambda r: (r["cell_px"], r["colours"], r["code_rate"], r.get("margin") or 0))
        for (c, k, cr, _m), rs in lines.items():
            ax.plot([r["hold_s"] for r in rs], [r["goodput_kBps"] for r in rs],
                    color=cmap(cells.index(c) / max(1, len(cells) - 1)),
                    ls="-" if k == 8 else ("--" if k == 4 else ":"), marker=marker(rs[0]),
                    label=f"{c} px, {k} colours" + label_extra(rs[0]))
        ax.set_title(f"goodput against hold time, profile {prof}")
        ax.set_xlabel("hold time per frame (s)")
        ax.set_ylabel("goodput (KB/s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    paths.append(_save(fig, out / PLOTS[2]))
    return paths


def _fmt(v: Any) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def write_summary(out: Path, recs: list[dict], args: dict, budget: float, best: dict | None,
                  border_cells: int) -> None:
    lines = [
        "# Link lab sweep",
        "",
        f"Command: `{args.get('command', 'python -m wccl.lab sweep')}`",
        "",
        f"Grid: profiles {args.get('profiles')}; cell_px {args.get('cell_px')}; colours {args.get('colours')}; "
        f"hold_s {args.get('hold')}; code_rate {args.get('code_rate')}; rows and cols fill the "
        f"{args.get('screen')} screen less the ring ({border_cells} cell) and {args.get('margin')} cell(s) of margin "
        "a side; plus the hackathon layout (40x70, 16 px, 8 colours, hold 1.0 s, code_rate 1.0) per profile.",
        f"Every point: {args.get('bytes')} bytes in tensors of {args.get('tensor_bytes')} bytes, repair "
        f"{args.get('repair')}, extra {args.get('extra')}, seed {args.get('seed')} (`wccl.lab bench`).",
        "",
        "Definitions: goodput = payload bytes of tensors delivered intact / simulated link seconds; "
        "raw cell error rate = wrong cells / cells read in decoded frames (before Reed-Solomon); "
        "tensor loss = 1 - tensors delivered / tensors sent; frame loss = 1 - frames decoded / frames shown; "
        "uncorrectable share = failed Reed-Solomon decode attempts (one per capture) / (failed attempts + frames "
        "decoded); "
        "undetected = tensors delivered with wrong bytes.",
        f"Budget: tensor loss <= {budget:g} and no undetected errors.",
        "",
    ]
    if best:
        lines += [f"**Best layout within the budget** ({best['profile']}): {best['rows']}x{best['cols']} cells of "
                  f"{best['cell_px']} px, {best['colours']} colours, hold {best['hold_s']:g} s, code rate "
                  f"{best['code_rate']:g}: **{best['goodput_kBps']} KB/s**" +
                  (" (the hackathon layout)" if best["hackathon"] else "") +
                  f". As a config snippet (`{BEST_TOML}`):", "",
                  "```toml", link_toml(best, border_cells, budget).rstrip(), "```", ""]
    else:
        lines += ["**No layout met the budget.**", ""]
    for r in recs:
        if r["hackathon"] and not r.get("error"):
            lines.append(f"Hackathon layout under {r['profile']}: {r['goodput_kBps']} KB/s, "
                         f"{r['tensors_delivered']}/{r['tensors_sent']} tensors.")
    cols = ["profile", "hackathon", "cell_px", "camera_px_per_cell", "margin", "rows", "cols", "colours", "hold_s",
            "code_rate", "goodput_kBps", "raw_cell_error_rate", "tensor_loss", "frame_loss",
            "frames_uncorrectable_share", "undetected_errors", "meets_budget", "wall_seconds"]
    lines += ["", "All points, best goodput first:", "",
              "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in sorted(recs, key=lambda r: (r["profile"], -(r.get("goodput_kBps") or 0))):
        if r.get("error"):
            lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols[:10]) + f" | error: {r['error']} |")
        else:
            lines.append("| " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    lines += ["", "Plots: " + ", ".join(f"![{p}]({p})" for p in PLOTS), ""]
    (out / SUMMARY).write_text("\n".join(lines), encoding="utf-8")


# --- the sweep -------------------------------------------------------------------------------------------------

def _hms(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m{s % 60:02d}s" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    def __init__(self, total: int, already: int, stream=sys.stderr) -> None:
        self.total, self.done, self.new = total, already, 0
        self.t0 = time.monotonic()
        self.stream = stream
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def tick(self, note: str = "") -> None:
        self.done += 1
        self.new += 1
        el = time.monotonic() - self.t0
        left = self.total - self.done
        eta = el / self.new * left
        end = "\r" if self.tty and left else "\n"
        self.stream.write(f"[{self.done}/{self.total}] {100 * self.done // self.total}% "
                          f"elapsed {_hms(el)} eta {_hms(eta)} {note}".ljust(100 if self.tty else 0) + end)
        self.stream.flush()


def run_sweep(cfg_data: dict, points: list[Point], out: Path, jobs: int = 2, budget: float = 0.0,
              args: dict | None = None, progress_stream=sys.stderr, inline: bool = False) -> dict:
    """Run the points not yet in `out`/results.jsonl; write CSV, plots, summary and best TOML.

    Every point runs in a fresh worker process (spawned, one point per process: ~1.5 s of start-up),
    so that nothing a bench run leaves behind can reach the next point: a point's figures are those
    of `python -m wccl.lab bench` with the same arguments, whatever ran before it. (Checked: a point
    run after another in the same process gives the same figures today.) `inline` runs the points
    one after another in this process instead (faster; for tests on the `exact` profile).

    Returns {"ran": n, "skipped": n, "interrupted": bool, "best": rec | None, "records": [...]}.
    """
    out.mkdir(parents=True, exist_ok=True)
    done = load_results(out)
    todo = [p for p in points if p.key() not in done]
    skipped = len(points) - len(todo)
    border = cfg_data["link"].get("border_cells", 1)
    cam_scale = {prof: camera_px_per_screen_px(cfg_data, prof) for prof in sorted({p.profile for p in todo})}
    # long points first (the hackathon's 1 s hold), so the last minutes keep both cores busy
    todo.sort(key=lambda p: -p.hold_s * p.nbytes / max(1, p.rows * p.cols))
    print(f"wccl.lab sweep: {len(points)} points, {skipped} already in {out / RESULTS}, {len(todo)} to run, "
          f"{jobs} job(s)", file=progress_stream, flush=True)
    prog = Progress(len(points), skipped, progress_stream)
    interrupted = False

    def finish(rec: dict) -> None:
        s = cam_scale.get(rec["profile"])
        rec["camera_px_per_cell"] = round(s * rec["cell_px"], 2) if s else None
        append_result(out, rec)
        done[Point(**{k: rec[k] for k in Point.__dataclass_fields__}).key()] = rec
        note = (f"{rec['profile']} {rec['cell_px']}px {rec['colours']}c hold {rec['hold_s']:g} rate "
                f"{rec['code_rate']:g}: " + (f"error {rec['error']}" if rec.get("error") else
                                            f"{rec['goodput_kBps']} KB/s {rec['tensors_delivered']}/"
                                            f"{rec['tensors_sent']}"))
        prog.tick(note)

    try:
        if inline:
            _one_thread()
            for p in todo:
                finish(run_point(cfg_data, p))
        else:
            # spawned (not forked) workers, so that they load BLAS with one thread (env read at import)
            for k in ONE_THREAD_ENV:
                os.environ[k] = "1"
            ex = ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker, mp_context=get_context("spawn"),
                                     max_tasks_per_child=1)
            pending: set[Future] = set()
            try:
                pending = {ex.submit(run_point, cfg_data, p) for p in todo}
                while pending:
                    fin, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in fin:
                        finish(f.result())
            except BaseException:
                for f in pending:
                    f.cancel()
                for pr in list((getattr(ex, "_processes", None) or {}).values()):  # our own workers, by handle
                    if pr.is_alive():
                        pr.terminate()
                ex.shutdown(wait=True, cancel_futures=True)
                raise
            ex.shutdown(wait=True)
    except KeyboardInterrupt:
        interrupted = True
        print(f"\nwccl.lab sweep: interrupted; {prog.done}/{len(points)} points saved in {out / RESULTS}; "
              "run the same command again to resume", file=progress_stream, flush=True)

    recs = [done[p.key()] for p in points if p.key() in done]
    for r in recs:
        r["meets_budget"] = meets_budget(r, budget)
        r["margin"] = margin_of(r, cfg_data["screen"]["width"], cfg_data["screen"]["height"], border)
    write_csv(out / CSV_NAME, recs)
    best = best_point(recs, budget)
    if best is not None:
        (out / BEST_TOML).write_text(link_toml(best, border, budget), encoding="utf-8")
    elif (out / BEST_TOML).exists():
        (out / BEST_TOML).unlink()
    if recs:
        write_plots(out, recs)
    write_summary(out, recs, args or {}, budget, best, border)
    return dict(ran=prog.new, skipped=skipped, interrupted=interrupted, best=best, records=recs)


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def add_arguments(p) -> None:
    p.add_argument("--config", default="config.toml", help="room config (nodes, screen, camera, link defaults)")
    p.add_argument("--profiles", default=None,
                   help="comma-separated room channel profiles, e.g. webcam,harsh (default: the config's)")
    p.add_argument("--cell-px", type=_ints, default=[8, 10, 12, 16],
                   help="cell sizes in screen px (default 8,10,12,16)")
    p.add_argument("--colours", type=_ints, default=[4, 8], help="colour counts (2, 4, 8; default 4,8)")
    p.add_argument("--hold", type=_floats, default=[0.083, 0.133],
                   help="hold times per frame in s (default 0.083,0.133)")
    p.add_argument("--code-rate", type=_floats, default=[0.8], help="Reed-Solomon code rates (default 0.8)")
    p.add_argument("--margin", type=_ints, default=[1],
                   help="cells left free a side beyond the ring; a list sweeps it too, e.g. 1,6 (default 1)")
    p.add_argument("--no-hackathon", action="store_true", help="leave out the hackathon layout point")
    p.add_argument("--bytes", type=int, default=200_000, help="payload bytes per point (default 200,000)")
    p.add_argument("--tensor-bytes", type=int, default=65536, help="bytes per tensor (default 65536)")
    p.add_argument("--repair", type=float, default=0.25, help="fountain repair share of K (default 0.25)")
    p.add_argument("--extra", type=int, default=2, help="repair frames added per tensor (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=float, default=0.0,
                   help="max tensor loss for the best layout (default 0: all delivered); undetected errors must be 0")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--out", required=True, help="output directory (resumes from its results.jsonl)")


def main(args) -> int:
    from wccl.config import ConfigError, load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"wccl.lab: config error: {e}", file=sys.stderr)
        return 2
    cfg_data = cfg.model_dump()
    profiles = args.profiles.split(",") if args.profiles else [cfg.room.profile]
    bad = [c for c in args.colours if c not in (2, 4, 8)]
    if bad or not args.cell_px or not args.hold or not args.code_rate or not args.margin or args.jobs < 1 \
            or min(args.margin) < 0:
        print("wccl.lab: bad grid (colours must be 2, 4 or 8; lists must not be empty; margin >= 0; jobs >= 1)",
              file=sys.stderr)
        return 2
    points = make_points(profiles, args.cell_px, args.colours, args.hold, args.code_rate,
                         screen_w=cfg.screen.width, screen_h=cfg.screen.height, border=cfg.link.border_cells,
                         margin=args.margin, nbytes=args.bytes, tensor_bytes=args.tensor_bytes, repair=args.repair,
                         extra=args.extra, seed=args.seed, hackathon=not args.no_hackathon)
    # reject impossible layouts and profiles up front, with the config's own message
    from wccl.config import with_values

    for p in points:
        try:
            with_values(cfg, "sweep", room={"profile": p.profile}, link=p.link())
        except (ConfigError, ValueError) as e:
            print(f"wccl.lab: point {p.profile} cell_px={p.cell_px} ({p.rows}x{p.cols}): {e}", file=sys.stderr)
            return 2
    info = dict(command="python -m wccl.lab sweep " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["sweep"]
                else "python -m wccl.lab sweep", profiles=",".join(profiles),
                cell_px=",".join(map(str, args.cell_px)), colours=",".join(map(str, args.colours)),
                hold=",".join(f"{h:g}" for h in args.hold), code_rate=",".join(f"{r:g}" for r in args.code_rate),
                screen=f"{cfg.screen.width}x{cfg.screen.height}", margin=",".join(map(str, args.margin)),
                bytes=args.bytes, tensor_bytes=args.tensor_bytes, repair=args.repair, extra=args.extra, seed=args.seed)

    def _term(signum, frame):  # SIGTERM stops a sweep like Ctrl-C: finished points are kept
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    res = run_sweep(cfg_data, points, Path(args.out), jobs=args.jobs, budget=args.budget, args=info)
    best = res["best"]
    out = Path(args.out)
    print(f"wccl.lab sweep: {res['ran']} run, {res['skipped']} resumed; {out / CSV_NAME}, {out / SUMMARY}"
          + (f"; best {best['rows']}x{best['cols']} {best['cell_px']} px {best['colours']} colours hold "
             f"{best['hold_s']:g} rate {best['code_rate']:g}: {best['goodput_kBps']} KB/s -> {out / BEST_TOML}"
             if best else "; no layout met the budget"), file=sys.stderr)
    return 130 if res["interrupted"] else 0
