"""`python -m wccl.lab bench --config FILE --profile NAME --bytes N --json`; `python -m wccl.lab sweep --out DIR`;
`python -m wccl.lab sync --config FILE --steps N --json` (clock sync and lockstep over a long run);
`python -m wccl.lab collectives --room FILE [--algorithms auto,ring,...] [--ranks N] --json` (each collective and
size through the wccl backend, per collective algorithm);
`python -m wccl.lab train --config FILE --out DIR` (accuracy against simulated time: codecs, local steps);
`python -m wccl.lab attack --frames N --json` (forged, replayed, foreign, bit-flipped frames against a rank);
`python -m wccl.lab fuzz --seconds N --json` (random and mutated inputs to every entry point);
`python -m wccl.lab startup --config FILE --repeat N --json` (init_process_group's wall and simulated seconds);
`python -m wccl.lab placement [--config FILE] [--json]` (camera pixels per cell by screen, lens and distance);
`python -m wccl.lab rooms --count N --laptops 2|LOW-HIGH --seed S --out DIR` (rooms drawn at random: whether each
that some layout reads starts and runs its steps, and why not);
`python -m wccl.lab changes [--config FILE] [--at S] [--only lamp,...]` (the built-in run through a lamp, a nudge,
a hand, a dimmed screen, a slower camera: steps applied, step time before and after);
`python -m wccl.lab report [--slow] [--write BENCHMARKS.md]` (the headline figures, measured, as one table)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from wccl.cli import HelpFormatter, command_parser
from wccl.config import LAYOUT_KEYS, NODE_NAMES, ConfigError, load_config, toml_text


def main(argv: list[str] | None = None) -> int:
    p = command_parser("wccl.lab.__main__", "Measure the optical link.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", formatter_class=HelpFormatter, help="send N bytes of random tensors from one simulated node to another")
    b.add_argument("--config", default="config.toml", help="the room file")
    b.add_argument("--profile", help="room channel profile (default: the config's)")
    b.add_argument("--bytes", type=int, default=1_000_000, help="payload bytes to send (default 1,000,000)")
    b.add_argument("--tensor-bytes", type=int, default=65536, help="bytes per tensor (default 65536)")
    b.add_argument("--repair", type=float, help="fountain repair frames, share of K (default: chosen from the "
                   "frame loss measured at start-up when the bench chooses the layout, else 0.25)")
    b.add_argument("--extra", type=int, help="repair frames added to every tensor (default 2 with a fixed --repair)")
    b.add_argument("--layout", choices=["config", "hackathon"], default="config",
                   help="'config': the room's [link] layout, or when it pins none (and no --set gives one) the "
                   "layout the room's ranks choose at start-up (discovery over the light); 'hackathon': 40x70 cells, 8 colours, "
                   "1 s hold, no error correction")
    b.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a [link] key, e.g. --set cell_px=8 (repeatable)")
    b.add_argument("--seed", type=int, default=0, help="random tensors' seed")
    b.add_argument("--sender", help="the node whose screen sends (default: the room's second node)")
    b.add_argument("--receiver", help="the node whose camera reads (default: the room's first node)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    from wccl.lab.sweep import add_arguments as sweep_arguments

    s = sub.add_parser("sweep", formatter_class=HelpFormatter, help="run the bench over a grid of layouts; CSV, plots, summary, best [link]")
    sweep_arguments(s)
    s.set_defaults(run=_sweep)
    y = sub.add_parser("sync", formatter_class=HelpFormatter, help="run the room for N steps; clock residuals against the truth, lockstep figures")
    y.add_argument("--config", default="config.toml", help="the room file")
    y.add_argument("--profile", help="room channel profile (default: the config's)")
    y.add_argument("--steps", type=int, default=1000, help="training steps to run")
    y.add_argument("--seed", type=int, help="room seed (the laptops' clock offsets and drifts are drawn from it)")
    y.add_argument("--json", action="store_true", help="print one JSON object")
    c = sub.add_parser("collectives", formatter_class=HelpFormatter, help="time each collective and size through the wccl backend "
                                           "(one process per rank, the room as its own process)")
    c.add_argument("--room", "--config", dest="room", default="rooms/two-laptops-sim.toml",
                   help="the room file (its ranks run the bench); --config is the same option")
    c.add_argument("--algorithms", help="run the bench once per collective algorithm, e.g. auto,all_see_all,ring,star "
                                        "(default: once, with the room file's [collectives] algorithm)")
    c.add_argument("--ranks", type=int, help="run on an `exact`-profile room of N ranks (alice, bob, carol, ...; 2 to "
                                             f"{len(NODE_NAMES)}) built from the room file's other settings")
    c.add_argument("--sizes", default="4,2048,65536,1048576", help="tensor sizes in bytes")
    c.add_argument("--ops", default="all_reduce,broadcast,all_gather,reduce_scatter,barrier", help="collectives to time")
    c.add_argument("--repeat", type=int, default=3, help="runs of each collective of 2 KB or less (the worst counts)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    # The tools of a module of their own: (command, module, help); each has add_arguments(parser) and run(args).
    for name, help_ in (
            ("train", "accuracy against simulated time for a model, codec and sync period (through the backend)"),
            ("attack", "forged, replayed, foreign and bit-flipped frames against a rank: none may be accepted"),
            ("fuzz", "random and mutated inputs to every entry point that reads from outside: no crash, no hang"),
            ("startup", "time init_process_group on every rank of a room (wall and simulated s)"),
            ("rooms", "rooms drawn at random: whether each that some layout reads starts and runs its steps, and "
                      "why not"),
            ("changes", "the built-in run through changes of the simulated room while it goes (a lamp, a nudge, a "
                        "hand, a dimmed screen, a slower camera): steps applied, step time before and after"),
            ("placement", "camera pixels per cell and the furthest distance each layout reads at, by screen, lens "
                          "and distance (no camera needed)"),
            ("report", "measure the headline figures; print their table or write it into BENCHMARKS.md")):
        tool = importlib.import_module(f"wccl.lab.{name}")
        parser = sub.add_parser(name, formatter_class=HelpFormatter, help=help_)
        tool.add_arguments(parser)
        parser.set_defaults(run=tool.run)
    c.set_defaults(run=_collectives)
    y.set_defaults(run=_sync)
    b.set_defaults(run=_bench)
    args = p.parse_args(argv)
    return args.run(args)


def _bench(args: argparse.Namespace) -> int:
    from wccl.config import assignments, with_values
    from wccl.lab.bench import HACKATHON_LINK, run_bench
    from wccl.runtime.logs import configure_logging

    configure_logging("json" if args.json else "auto", "warning", stream=sys.stderr)

    try:
        cfg = load_config(args.config)
        link = dict(HACKATHON_LINK) if args.layout == "hackathon" else {}
        link.update(assignments(args.set))
        if LAYOUT_KEYS & link.keys():
            link.setdefault("choose", "pinned")  # a layout given on the command line is the one measured
        cfg = with_values(cfg, "the command line", room=args.profile and {"profile": args.profile}, link=link)
    except (ConfigError, ValueError) as e:
        print(f"wccl.lab: config error: {e}", file=sys.stderr)
        return 2
    if args.repair is None and args.extra is None and cfg.link.choose == "auto":
        repair, extra = None, None  # chosen from the loss measured while choosing the layout
    else:
        repair = 0.25 if args.repair is None else args.repair
        extra = 2 if args.extra is None else args.extra
    try:
        result = run_bench(cfg, args.bytes, args.tensor_bytes, repair, extra, args.seed, args.sender, args.receiver,
                           choose=True)
    except ValueError as e:
        print(f"wccl.lab: {e}", file=sys.stderr)
        return 2
    if result["zero_reason"]:
        print(f"wccl.lab: nothing got through from {result['sender']} to {result['receiver']}: "
              f"{result['zero_reason']}", file=sys.stderr)
    _print(result, args.json)
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from wccl.lab.sweep import main as sweep_main

    return sweep_main(args)


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>22}: {v}")


def _room_variant(data: dict, base: Path, ranks: int | None, algorithm: str | None) -> dict:
    """The room file's settings with `--ranks` (an exact-profile simulated room of that many ranks) and an
    algorithm applied (`[collectives] algorithm`, set in the file's own table if it has one)."""
    import copy

    d = copy.deepcopy(data)
    room = d.setdefault("room", {})
    if room.get("key_file") and not Path(room["key_file"]).is_absolute():
        room["key_file"] = str((base / room["key_file"]).resolve())  # found wherever the copy is written
    if ranks is not None:
        if room.get("medium", "simulated") != "simulated":
            room["medium"], room["clock"] = "simulated", "virtual"
        room["profile"] = "exact"
        room.pop("channel", None)  # the exact profile takes no channel parameters
        room.pop("desktop", None)
        room["nodes"] = [{"name": n, "roles": ["server", "worker"] if i == 0 else ["worker"]}
                         for i, n in enumerate(NODE_NAMES[:ranks])]
    if algorithm is not None:
        if not isinstance(d.get("collectives"), dict):
            d["collectives"] = {}
        d["collectives"]["algorithm"] = algorithm
    return d


def _run_ranks(room: Path, args: argparse.Namespace, ops: list[str]) -> tuple[int, str, list[dict]]:
    """Run the rank program on every rank of `room` (wccl.launch); (exit status, its last error line, the
    ranks' JSON objects in rank order). The ranks' stderr goes on to this one's as it comes."""
    import collections
    import subprocess
    import threading

    from wccl.runtime.hostos import end_with_parent
    from wccl.lab import collectives_rank
    from wccl.launch import json_objects

    cmd = [sys.executable, "-m", "wccl.launch", "--config", str(room), collectives_rank.__file__,
           "--sizes", args.sizes, "--ops", ",".join(ops), "--repeat", str(args.repeat)]
    # (the launcher stops its ranks on SIGTERM: sent when this process dies, killed or not)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=end_with_parent)  # noqa: PLW1509 (it only calls prctl)
    tail: collections.deque[str] = collections.deque(maxlen=40)

    def forward() -> None:
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            tail.append(line.strip())

    t = threading.Thread(target=forward, daemon=True)
    t.start()
    out = proc.stdout.read()
    status = proc.wait()
    t.join(5)
    lines = [ln for ln in tail if ln]
    why = next((ln for ln in reversed(lines) if "error" in ln.lower() or "wccl" in ln.lower()),
               lines[-1] if lines else "")
    ranks = sorted((d for d in json_objects(out) if "rows" in d), key=lambda d: d["rank"])
    return status, why[:300], ranks


def _merge(ranks: list[dict], label: str) -> list[dict]:
    """The ranks' rows as one per op and size: the slowest rank's latency, the most bytes a rank read."""
    rows = []
    for per_rank in zip(*(r["rows"] for r in ranks)):
        worst = max(per_rank, key=lambda r: r["latency_s"])
        reads = [r.get("received_bytes") for r in per_rank]
        got = None if None in reads else max(reads)
        ran = sorted({a for r in per_rank for a in r.get("algorithm", "").split(",") if a})
        error = next((r["error"] for r in per_rank if r.get("error")), None)
        row = dict(algorithm=label, ran=",".join(ran) or None, op=worst["op"], bytes=worst["bytes"],
                   correct=all(r["correct"] for r in per_rank), latency_s=worst["latency_s"],
                   latency_min_s=min(r["latency_min_s"] for r in per_rank),
                   received_bytes=got, received_bytes_min=None if got is None else min(reads),
                   # tensor bytes the busiest rank read off the other screens per simulated second
                   goodput_kBps=round(got / 1000 / worst["latency_s"], 2)
                   if worst["op"] != "barrier" and got and worst["latency_s"] > 0 and error is None else None)
        if error is not None:
            row["error"] = error
        rows.append(row)
    return rows


def _collectives(args: argparse.Namespace) -> int:
    import os
    import tempfile
    import tomllib

    from wccl.config import parse_config
    from wccl.runtime.logs import configure_logging

    configure_logging("json", "warning", stream=sys.stderr)
    room = Path(args.room)
    multi = args.algorithms is not None
    if args.ranks is not None and not 2 <= args.ranks <= len(NODE_NAMES):
        print(f"wccl.lab: --ranks {args.ranks}: 2 to {len(NODE_NAMES)} ranks", file=sys.stderr)
        return 2
    try:
        base = load_config(room)
        data = tomllib.loads(room.read_text(encoding="utf-8"))
    except (ConfigError, OSError) as e:
        print(f"wccl.lab: config error: {e}", file=sys.stderr)
        return 2
    ops = [o for o in args.ops.split(",") if o]
    wanted = [a.strip() for a in args.algorithms.split(",") if a.strip()] if multi else [None]
    runs, rows, status = [], [], 0
    for want in wanted:
        label = want or base.collectives.algorithm
        run = dict(algorithm=label, room=str(room), exit_status=None, reason=None, world=None, nodes={})
        runs.append(run)
        variant = None
        if want is not None or args.ranks is not None:
            variant = _room_variant(data, room.parent, args.ranks, want)
        try:
            cfg = base if variant is None else parse_config(variant, f"{room} (algorithm {label})", room.parent)
        except (ConfigError, ValueError) as e:  # e.g. an algorithm of no such name
            run["reason"] = f"cannot run: {str(e).strip().splitlines()[0]}"
            continue
        run["world"] = len(cfg.room.ranks)
        path = room
        if variant is not None:  # next to the room file: its relative paths still resolve
            try:
                fd, name = tempfile.mkstemp(prefix=f".{room.stem}-{label}-", suffix=".toml", dir=room.parent)
            except OSError:
                fd, name = tempfile.mkstemp(prefix=f"{room.stem}-{label}-", suffix=".toml")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(f"# written by python -m wccl.lab collectives from {room}\n" + toml_text(variant))
            path = Path(name)
        try:
            code, why, ranks = _run_ranks(path, args, ops)
        finally:
            if path != room:
                path.unlink(missing_ok=True)
        run["exit_status"] = code
        if code != 0 or not ranks:
            status = status or code or 1
            run["reason"] = f"the ranks failed (exit status {code})" + (f": {why}" if why else "")
            if not multi:
                print(f"wccl.lab: the ranks failed (exit status {code}); see their errors above", file=sys.stderr)
                return code or 1
            continue
        run["world"], run["nodes"] = ranks[0]["world"], {r["rank"]: r["node"] for r in ranks}
        rows += _merge(ranks, label)
    first = next((r for r in runs if r["nodes"]), runs[0])
    result = dict(config=str(room), world=first["world"], ranks=args.ranks, algorithms=[r["algorithm"] for r in runs],
                  rows=rows, runs=[{k: v for k, v in r.items() if k != "nodes"} for r in runs], nodes=first["nodes"])
    if args.json:
        print(json.dumps(result))
        return status
    lead = f"{'algorithm':>12} " if multi else ""
    print(f"{lead}{'op':>15} {'bytes':>9} {'latency s':>10} {'(best)':>8} {'goodput kB/s':>13} correct "
          f"{'read B':>9} ran")
    for run in runs:
        if run["reason"] is not None and not any(r["algorithm"] == run["algorithm"] and "reason" not in r
                                                 for r in rows):
            print(f"{run['algorithm']:>12} {run['reason']}" if multi else f"wccl.lab: {run['reason']}")
            continue
        for r in (r for r in rows if r["algorithm"] == run["algorithm"]):
            lead = f"{r['algorithm']:>12} " if multi else ""
            if "reason" in r:
                print(f"{lead}{r['op']:>15} {r['reason']}")
                continue
            print(f"{lead}{r['op']:>15} {r['bytes']:>9} {r['latency_s']:>10} {r['latency_min_s']:>8} "
                  f"{str(r['goodput_kBps']):>13} {str(r['correct']):>7} {str(r['received_bytes']):>9} "
                  f"{r['ran'] or '-'}" + (f"  ({r['error']})" if r.get("error") else ""))
    return status

def _sync(args: argparse.Namespace) -> int:
    import torch

    from wccl.config import with_values
    from wccl.lab.syncbench import run_sync_bench
    from wccl.runtime.logs import configure_logging

    configure_logging("json", "warning", stream=sys.stderr)
    torch.set_num_threads(1)
    try:
        room = {k: v for k, v in (("profile", args.profile), ("seed", args.seed)) if v is not None}
        cfg = with_values(load_config(args.config), "the command line", room=room)
    except (ConfigError, ValueError) as e:
        print(f"wccl.lab: config error: {e}", file=sys.stderr)
        return 2
    result = run_sync_bench(cfg, args.steps)
    _print(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
