"""`python -m wccl.lab report [--slow] [--only NAMES] [--write FILE]`: the headline figures, measured.

Runs the command behind each figure of BENCHMARKS.md's table (the link
bench per profile, a 2 KB tensor's latency, the default run, the
torch backend's DDP example against gloo, the eight-laptop table, start-up,
Fashion-MNIST's time to accuracy, the attack bench, the test suite), reads the figure off
its output and prints the table: figure, value, command, date and commit.
Rows marked slow run only with `--slow`. `--write FILE` replaces the
table between FILE's `<!-- report -->` and `<!-- /report -->` lines, keeping
the rows not run this time as they were (with the date and commit they
were measured at): one command keeps the table true.

A figure the command did not give (it failed, or said nothing) is written
as `no figure` with the reason, never as a zero.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from wccl.cli import command_parser

BEGIN, END = "<!-- report -->", "<!-- /report -->"


def _objects(text: str) -> list[dict]:
    """Every JSON object printed on a line of its own (or at the end of one) in `text`."""
    out = []
    for line in text.splitlines():
        i = line.find("{")
        if i < 0:
            continue
        try:
            obj = json.loads(line[i:])
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _last(text: str) -> dict:
    objs = _objects(text)
    if not objs:
        raise ValueError("printed no JSON object")
    return objs[-1]


def _bench(out: str, err: str) -> list[str]:
    j = _last(out)
    if j.get("zero_reason"):
        raise ValueError(j["zero_reason"])
    lay = j.get("layout_choice") or {}
    where = f", {lay['rows']}x{lay['cols']} cells of {lay['cell_px']} px held {lay['hold_s'] * 1000:.0f} ms" if lay else ""
    return [f"**{j['goodput_kBps']:.1f} KB/s**, {j['tensors_delivered']} of {j['tensors_sent']} tensors, "
            f"{j['undetected_errors']} undetected{where}"]


def _latency(out: str, err: str) -> list[str]:
    j = _last(out)
    return [f"**p95 {j['latency_p95_s']:.3f} s**, p50 {j['latency_p50_s']:.3f} s, {j['tensors_delivered']} of "
            f"{j['tensors_sent']} delivered, {j['undetected_errors']} undetected"]


def _events(out: str, err: str) -> list[dict]:
    return [o for o in _objects(out + "\n" + err) if "event" in o]


def _run(out: str, err: str) -> list[str]:
    """The built-in run's log (--log-format json): steps, step time, accuracy, start-up, replicas."""
    ev = _events(out, err)
    fin = next((e for e in ev if e["event"] == "run_finished"), None)
    if fin is None:
        raise ValueError("no run_finished: " + (err.strip().splitlines() or ["?"])[-1][:200])
    applied: dict[str, list[float]] = {}  # node -> when it applied each step
    for e in ev:
        if e["event"] == "step_applied" and "t" in e:
            applied.setdefault(e.get("node", ""), []).append(e["t"])
    gaps = [b - a for times in applied.values() for a, b in zip(times, times[1:])]
    step = f"{statistics.median(gaps):.2f} s a step" if gaps else "no step time (fewer than two steps)"
    known = [e["t"] for e in ev if e["event"] == "sight_known" and "t" in e]
    same = {True: "identical", False: "DIFFERENT", None: "-"}
    run = (f"**{step}**, {fin['applied']} of {fin['steps']} applied, accuracy {fin['test_accuracy']:.3f}, replicas "
           f"{same[fin['replicas_identical']]}, observers {same[fin['observer_identical']]}, "
           f"{fin['sim_seconds']:.1f} room s ({fin['wall_seconds']:.0f} s wall)")
    start = f"**{max(known):.2f} room s** to the layout (`sight_known`)" if known else "no figure: no sight_known"
    return [run, start]


def _ddp(out: str, err: str) -> list[str]:
    """`examples/ddp_mnist.py` through the launcher, then under gloo (two commands joined by `&&`)."""
    rows = [o for o in _objects(out) if "params_sha256" in o]
    if not rows:
        raise ValueError("no rank printed its parameters")
    half = len(rows) // 2
    wccl, gloo = rows[:half], rows[half:]
    digests = {r["params_sha256"] for r in wccl}
    equal = digests == {r["params_sha256"] for r in gloo} and len(digests) == 1
    room = [o for o in _objects(err) if "sim_seconds" in o]
    took = f", {room[-1]['sim_seconds']:.1f} room s" if room else ""
    return [f"**{'equal to gloo' if equal else 'DIFFERENT from gloo'}** ({next(iter(digests))[:8]}), accuracy "
            f"{wccl[0]['test_accuracy']:.3f}{took}"]


def _fashion(out: str, err: str) -> list[str]:
    j = _last(out)
    m = j["median"]  # (--repeat 3: medians of three runs)
    wccl, alone = m["wccl"], m.get("all", {})

    def took(times: dict, a: str) -> str:
        t = times.get(a)
        return f"{t:.0f} s" if t is not None else "not reached"

    def ratio(a: str) -> str:
        r = wccl.get("vs_all", {}).get(a)
        return f" ({r:.2f}x)" if r is not None else ""

    tuned = j.get("reference_tuned")
    how = f" (tuned: lr {tuned['lr']:g}, batch {tuned['batch_size']})" if tuned else ""
    return [f"**0.90 after {took(wccl['time_to'], '0.900')}**{ratio('0.900')} (two laptops) against "
            f"{took(alone.get('time_to', {}), '0.900')} for one laptop with all the data{how}; 0.91 after "
            f"{took(wccl['time_to'], '0.910')}{ratio('0.910')} against {took(alone.get('time_to', {}), '0.910')}; "
            f"final {wccl['test_accuracy']:.3f} against {alone.get('test_accuracy', float('nan')):.3f} "
            f"(medians of {len(j['runs'])} runs)"]


def _attack(out: str, err: str) -> list[str]:
    j = _last(out)
    kinds = j["kinds"]
    tried = sum(k["tried"] for k in kinds.values())
    accepted = sum(k["accepted"] for k in kinds.values())
    return [f"**{accepted} of {tried:,} accepted** ({len(kinds)} kinds); {j['tensors_delivered']} of "
            f"{j['tensors_sent']} real tensors delivered, {j['tensors_wrong']} wrong"]


def _pytest(out: str, err: str) -> list[str]:
    m = re.search(r"(\d+) passed.*? in ([\d.]+)s", out)
    if m is None or re.search(r"\d+ failed", out):
        raise ValueError((out.strip().splitlines() or ["no summary"])[-1][:200])
    return [f"**{float(m.group(2)) / 60:.1f} min**, {m.group(1)} passed"]


@dataclass(frozen=True)
class Row:
    """One command and the figures it gives (one per name)."""

    names: tuple[str, ...]
    command: str
    read: Callable[[str, str], list[str]]
    slow: bool = False


PY = "python"
ROWS = (
    Row(("link, `webcam` profile",), f"{PY} -m wccl.lab bench --config rooms/two-laptops-sim.toml --profile webcam "
        "--bytes 2000000 --json", _bench),
    Row(("link, `ideal` profile",), f"{PY} -m wccl.lab bench --config rooms/two-laptops-sim.toml --profile ideal "
        "--bytes 2000000 --json", _bench),
    Row(("link, `harsh` profile",), f"{PY} -m wccl.lab bench --config rooms/two-laptops-sim.toml --profile harsh "
        "--bytes 2000000 --json", _bench),
    Row(("2 KB tensor latency, `webcam`",), f"{PY} -m wccl.lab bench --config rooms/two-laptops-sim.toml --profile "
        "webcam --bytes 409600 --tensor-bytes 2048 --json", _latency),
    Row(("default run (`config.toml`)", "start-up, default room"),
        f"{PY} -m wccl.node --config config.toml --log-format json --log-level info", _run),
    Row(("DDP example against gloo",), f"{PY} -m wccl.launch --config rooms/two-laptops-sim.toml "
        "examples/ddp_mnist.py --steps 30 && python -m torch.distributed.run --standalone --nproc-per-node 2 examples/ddp_mnist.py "
        "--backend gloo --steps 30", _ddp, slow=True),
    Row(("eight-laptop table", "start-up, eight-laptop table"),
        f"{PY} -m wccl.node --config rooms/table-8.toml --steps 12 --log-format json --log-level info", _run,
        slow=True),
    Row(("Fashion-MNIST time to 0.90",), f"{PY} -m wccl.lab train --config rooms/fashion.toml --budget-s 90 "
        "--references --tune-reference --repeat 3 --json --out runs/report-fashion", _fashion, slow=True),
    Row(("forged, replayed and foreign frames",), f"{PY} -m wccl.lab attack --frames 10000 --json", _attack),
    Row(("test suite, fast tier",), f"{PY} -m pytest -q -n 2", _pytest),
)


def measure(row: Row, timeout_s: float) -> list[tuple[str, str]]:
    """Run `row`'s command; (name, figure) for each of its names."""
    parts = row.command.split(" && ")
    out = err = ""
    try:
        for part in parts:
            argv = part.split()
            if argv[0] == PY:
                argv[0] = sys.executable
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
            out, err = out + p.stdout, err + p.stderr
            if p.returncode != 0 and row.read is not _pytest:
                raise ValueError(f"exit {p.returncode}: " + (p.stderr.strip().splitlines() or ["?"])[-1][:200])
        figures = row.read(out, err)
    except subprocess.TimeoutExpired:
        figures = [f"no figure: no answer in {timeout_s:g} s"] * len(row.names)
    except (ValueError, KeyError, TypeError, StopIteration) as e:
        figures = [f"no figure: {e}"] * len(row.names)
    return list(zip(row.names, figures))


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "-"


def table(rows: dict[str, tuple[str, str, str]]) -> str:
    """The markdown table of {name: (figure, command, measured)}, in ROWS' order."""
    order = [n for r in ROWS for n in r.names]
    lines = ["| figure | today | command | measured |", "|---|---|---|---|"]
    for name in sorted(rows, key=lambda n: order.index(n) if n in order else len(order)):
        figure, command, when = rows[name]
        lines.append(f"| {name} | {figure} | `{command}` | {when} |")
    return "\n".join(lines)


def parse_table(text: str) -> dict[str, tuple[str, str, str]]:
    """The rows of the table between BEGIN and END in `text` (empty if there is none)."""
    if BEGIN not in text or END not in text:
        return {}
    body = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    rows = {}
    for line in body.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == 4:
            rows[cells[0]] = (cells[1], cells[2].strip("`"), cells[3])
    return rows


def write(path: Path, rows: dict[str, tuple[str, str, str]]) -> None:
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"wccl.lab report: {path} has no {BEGIN} ... {END} lines to put the table between")
    old = parse_table(text)
    old.update(rows)
    text = text[:text.index(BEGIN) + len(BEGIN)] + "\n" + table(old) + "\n" + text[text.index(END):]
    path.write_text(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slow", action="store_true", help="also the slow rows (the table, DDP, Fashion-MNIST: an hour)")
    p.add_argument("--only", help="comma-separated words; only the rows whose figure names contain one")
    p.add_argument("--write", type=Path, metavar="FILE",
                   help=f"put the table in FILE between its {BEGIN} and {END} lines (other rows kept)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds each command may take (default 3600)")


def run(args: argparse.Namespace) -> int:
    words = [w.strip().lower() for w in args.only.split(",")] if args.only else None
    chosen = [r for r in ROWS if (args.slow or not r.slow)
              and (words is None or any(w in n.lower() for n in r.names for w in words))]
    if not chosen:
        print("wccl.lab report: no row matches", file=sys.stderr)
        return 2
    commit, rows = _commit(), {}
    for row in chosen:
        t0 = time.perf_counter()
        print(f"wccl.lab report: {row.command}", file=sys.stderr, flush=True)
        day = datetime.date.today().isoformat()
        for name, figure in measure(row, args.timeout):
            rows[name] = (figure, row.command, f"{day}, {commit}")
            print(f"wccl.lab report:   {name}: {figure} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
                  flush=True)
    print(table(rows))
    if args.write:
        write(args.write, rows)
    return 0 if not any(f.startswith("no figure") for f, _, _ in rows.values()) else 1


def main(argv: list[str] | None = None) -> int:
    p = command_parser("wccl.lab.report", "Measure the headline figures and print (or write) their table.")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
