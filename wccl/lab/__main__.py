"""`python -m wccl.lab bench --config FILE --profile NAME --bytes N --json`; `python -m wccl.lab sweep --out DIR`;
`python -m wccl.lab sync --config FILE --steps N --json` (clock sync and lockstep over a long run);
`python -m wccl.lab collectives --config FILE --json` (each collective and size through the wccl backend);
`python -m wccl.lab train --config FILE --out DIR` (accuracy against simulated time: codecs, local steps);
`python -m wccl.lab attack --frames N --json` (forged, replayed, foreign, bit-flipped frames against a rank);
`python -m wccl.lab fuzz --seconds N --json` (random and mutated inputs to every entry point)."""

from __future__ import annotations

import argparse
import json
import sys

from wccl.cli import HelpFormatter
from wccl.config import ConfigError, load_config

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="python -m wccl.lab", description="Measure the optical link.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", formatter_class=HelpFormatter, help="send N bytes of random tensors from one simulated node to another")
    b.add_argument("--config", default="config.toml", help="the room file")
    b.add_argument("--profile", help="room channel profile (default: the config's)")
    b.add_argument("--bytes", type=int, default=1_000_000, help="payload bytes to send (default 1,000,000)")
    b.add_argument("--tensor-bytes", type=int, default=65536, help="bytes per tensor (default 65536)")
    b.add_argument("--repair", type=float, default=0.25, help="fountain repair frames, share of K (default 0.25)")
    b.add_argument("--extra", type=int, default=2, help="repair frames added to every tensor (default 2)")
    b.add_argument("--layout", choices=["config", "hackathon"], default="config",
                   help="'hackathon': 40x70 cells, 8 colours, 1 s hold, no error correction")
    b.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a [link] key, e.g. --set cell_px=8 (repeatable)")
    b.add_argument("--seed", type=int, default=0, help="random tensors' seed")
    b.add_argument("--sender", help="the node whose screen sends (default: the room's second node)")
    b.add_argument("--receiver", help="the node whose camera reads (default: the room's first node)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    from wccl.lab.sweep import add_arguments as sweep_arguments

    s = sub.add_parser("sweep", formatter_class=HelpFormatter, help="run the bench over a grid of layouts; CSV, plots, summary, best [link]")
    sweep_arguments(s)
    y = sub.add_parser("sync", formatter_class=HelpFormatter, help="run the room for N steps; clock residuals against the truth, lockstep figures")
    y.add_argument("--config", default="config.toml", help="the room file")
    y.add_argument("--profile", help="room channel profile (default: the config's)")
    y.add_argument("--steps", type=int, default=1000, help="training steps to run")
    y.add_argument("--seed", type=int, help="room seed (the laptops' clock offsets and drifts are drawn from it)")
    y.add_argument("--json", action="store_true", help="print one JSON object")
    c = sub.add_parser("collectives", formatter_class=HelpFormatter, help="time each collective and size through the wccl backend "
                                           "(one process per rank, the room as its own process)")
    c.add_argument("--config", default="rooms/two-laptops-sim.toml", help="the room file (its ranks run the bench)")
    c.add_argument("--sizes", default="4,2048,65536,1048576", help="tensor sizes in bytes")
    c.add_argument("--ops", default="all_reduce,broadcast,all_gather,reduce_scatter,barrier", help="collectives to time")
    c.add_argument("--repeat", type=int, default=3, help="runs of each collective of 2 KB or less (the worst counts)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    t = sub.add_parser("train", formatter_class=HelpFormatter,
                       help="accuracy against simulated time for a model, codec and sync period (through the backend)")
    from wccl.lab import train as train_lab

    train_lab.add_arguments(t)
    a = sub.add_parser("attack", formatter_class=HelpFormatter,
                       help="forged, replayed, foreign and bit-flipped frames against a rank: none may be accepted")
    from wccl.lab import attack as attack_lab

    attack_lab.add_arguments(a)
    z = sub.add_parser("fuzz", formatter_class=HelpFormatter,
                       help="random and mutated inputs to every entry point that reads from outside: no crash, no hang")
    from wccl.lab import fuzz as fuzz_lab

    fuzz_lab.add_arguments(z)
    args = p.parse_args(argv)
    if args.cmd == "fuzz":
        return fuzz_lab.run(args)
    if args.cmd == "train":
        return train_lab.run(args)
    if args.cmd == "attack":
        return attack_lab.run(args)
    if args.cmd == "collectives":
        return _collectives(args)
    if args.cmd == "sync":
        return _sync(args)
    if args.cmd == "sweep":
        from wccl.lab.sweep import main as sweep_main

        return sweep_main(args)

    from wccl.lab.bench import HACKATHON_LINK, run_bench, with_overrides
    from wccl.logs import configure_logging

    configure_logging("json" if args.json else "auto", "warning", stream=sys.stderr)

    try:
        cfg = load_config(args.config)
        link = dict(HACKATHON_LINK) if args.layout == "hackathon" else {}
        for kv in args.set:
            k, _, v = kv.partition("=")
            link[k] = json.loads(v)
        cfg = with_overrides(cfg, args.profile, link)
    except (ConfigError, ValueError) as e:
        print(f"wccl.lab: config error: {e}", file=sys.stderr)
        return 2
    repair, extra = args.repair, args.extra
    try:
        result = run_bench(cfg, args.bytes, args.tensor_bytes, repair, extra, args.seed, args.sender, args.receiver)
    except ValueError as e:
        print(f"wccl.lab: {e}", file=sys.stderr)
        return 2
    if result["zero_reason"]:
        print(f"wccl.lab: nothing got through from {result['sender']} to {result['receiver']}: "
              f"{result['zero_reason']}", file=sys.stderr)
    _print(result, args.json)
    return 0


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>22}: {v}")


def _collectives(args: argparse.Namespace) -> int:
    import subprocess
    from pathlib import Path

    from wccl.lab import collectives_rank

    cmd = [sys.executable, "-m", "wccl.launch", "--config", args.config, collectives_rank.__file__,
           "--sizes", args.sizes, "--ops", args.ops, "--repeat", str(args.repeat)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        print(f"wccl.lab: the ranks failed (exit status {proc.returncode}); see their errors above", file=sys.stderr)
        return proc.returncode
    from wccl.launch import json_objects

    ranks = sorted((d for d in json_objects(proc.stdout) if "rows" in d), key=lambda d: d["rank"])
    rows = []
    for per_rank in zip(*(r["rows"] for r in ranks)):
        worst = max(per_rank, key=lambda r: r["latency_s"])
        got = max(r["received_bytes"] for r in per_rank)
        rows.append(dict(op=worst["op"], bytes=worst["bytes"], correct=all(r["correct"] for r in per_rank),
                         latency_s=worst["latency_s"], latency_min_s=min(r["latency_min_s"] for r in per_rank),
                         received_bytes=got,
                         # tensor bytes a rank read off the other screens per simulated second
                         goodput_kBps=round(got / 1000 / worst["latency_s"], 2) if worst["op"] != "barrier" else None))
    result = dict(config=str(Path(args.config)), world=ranks[0]["world"], rows=rows,
                  nodes={r["rank"]: r["node"] for r in ranks})
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{'op':>15} {'bytes':>9} {'latency s':>10} {'(best)':>8} {'goodput kB/s':>13} correct")
        for r in rows:
            print(f"{r['op']:>15} {r['bytes']:>9} {r['latency_s']:>10} {r['latency_min_s']:>8} "
                  f"{str(r['goodput_kBps']):>13} {r['correct']}")
    return 0


def _sync(args: argparse.Namespace) -> int:
    import torch

    from wccl.lab.bench import with_overrides
    from wccl.lab.syncbench import run_sync_bench
    from wccl.logs import configure_logging

    configure_logging("json", "warning", stream=sys.stderr)
    torch.set_num_threads(1)
    try:
        cfg = with_overrides(load_config(args.config), args.profile, {})
        if args.seed is not None:
            cfg = cfg.model_copy(update={"room": cfg.room.model_copy(update={"seed": args.seed})})
    except (ConfigError, ValueError) as e:
        print(f"wccl.lab: config error: {e}", file=sys.stderr)
        return 2
    result = run_sync_bench(cfg, args.steps)
    _print(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
