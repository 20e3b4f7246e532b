"""`python -m wccl.lab startup --config ROOM [--repeat N] [--json]`: how long `init_process_group` takes.

Runs a program that only calls `dist.init_process_group("wccl")` (and
destroys the group) on every rank of the room file, through
`python -m wccl.launch` (one process per rank, the simulated room as one
more), `--repeat` times. Each rank reports the wall seconds and the room's
simulated seconds its init_process_group took; the layout discovery chose
and its edges (the share of frames each camera read); how many layouts of
the start-up ladder each rank measured (discovery stops where the rest
could not change the choice) and how many rounds of measurement it took; and where
the wall time went: the camera captures its node decoded until the layout
was known, the status frames its screen showed, and the CPU seconds its own
process and the room process (which renders every capture) used meanwhile.
The summary gives the slowest rank's figures per run and their median;
`--json` prints it all as one JSON object.

Wall seconds depend on what else runs on the machine: repeat, and say.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from wccl.cli import command_parser


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="rooms/two-laptops-sim.toml", help="the room file (its ranks start up)")
    p.add_argument("--repeat", type=int, default=3, help="runs of the launcher (default 3)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="wall seconds a run may take")
    p.add_argument("--json", action="store_true", help="print one JSON object")


# ---------------------------------------------------------------------------------------------- rank side
def _room_cpu_s() -> float | None:
    """CPU seconds the room process (the launcher's `wccl.room.serve` child) has used so far (Linux)."""
    try:
        launcher = os.getppid()
        kids = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
        for pid in kids:
            if b"wccl.room.serve" in Path(f"/proc/{pid}/cmdline").read_bytes():
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    return None


def _rank_program() -> None:
    """One rank: time init_process_group, print one JSON line."""
    import torch.distributed as dist

    import wccl.distributed as wd
    from wccl.config import load_config
    from wccl.distributed.rank_node import collective_ladder

    room0, cpu0, t0 = _room_cpu_s(), time.process_time(), time.perf_counter()
    dist.init_process_group("wccl")
    wall = time.perf_counter() - t0
    cpu, room1 = time.process_time() - cpu0, _room_cpu_s()
    sim = wd.sim_seconds()
    res = wd.node_results()
    for _ in range(200):  # (the node notes what it found just after the handshake completes, on its own thread)
        if "discovery" in res:
            break
        time.sleep(0.01)
        res = wd.node_results()
    found = res.get("discovery", {})
    cfg = load_config(os.environ["WCCL_CONFIG"])
    ladder = collective_ladder(cfg)
    k = found.get("layout")  # (None: no discovery, a rank alone)
    chosen = None
    if k is not None:
        codec, hold = ladder[k]
        lay = codec.layout
        chosen = f"{lay.rows}x{lay.cols} cells of {lay.cell_px} px, {lay.colours} colours, held {hold * 1000:.0f} ms"
    room_cpu = None if room0 is None or room1 is None else round(room1 - room0, 2)
    print(json.dumps({
        "rank": dist.get_rank(), "node": os.environ.get("WCCL_NODE"), "init_wall_s": round(wall, 2),
        "init_sim_s": round(sim, 3), "layout": k, "chosen": chosen,
        "ladder_layouts": len(ladder), "edges": found.get("edges"), "measured": found.get("measured"),
        "rounds": found.get("rounds"),
        "captures": found.get("captures"), "cpu_s": round(cpu, 2), "room_cpu_s": room_cpu,
        "status_frames_shown": res.get("screen", {}).get("status_frames"),
    }), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- driver
def _one_run(config: str, timeout_s: float) -> tuple[int, list[dict], float, str]:
    """One launch: (exit status, the ranks' objects in rank order, its wall seconds, its last error line)."""
    from wccl.launch import json_objects

    cmd = [sys.executable, "-m", "wccl.launch", "--config", config, __file__, "--rank-program"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return 1, [], time.perf_counter() - t0, f"timed out after {timeout_s:g} s"
    wall = time.perf_counter() - t0
    ranks = sorted((d for d in json_objects(proc.stdout) if "init_wall_s" in d), key=lambda d: d["rank"])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    return proc.returncode, ranks, wall, (lines[-1][:300] if lines else "")


def run(args: argparse.Namespace) -> int:
    if args.repeat < 1:
        print("wccl.lab: --repeat must be at least 1", file=sys.stderr)
        return 2
    from wccl.config import ConfigError, load_config

    try:
        load_config(args.config)
    except ConfigError as e:
        print(f"wccl.lab: config error: {e}", file=sys.stderr)
        return 2
    runs = []
    for i in range(args.repeat):
        code, ranks, wall, why = _one_run(args.config, args.timeout_s)
        if code != 0 or not ranks:
            print(f"wccl.lab: run {i + 1}: the ranks failed (exit status {code}): {why}", file=sys.stderr)
            return code or 1
        layouts = {r["layout"] for r in ranks}
        runs.append(dict(
            init_wall_s=max(r["init_wall_s"] for r in ranks), init_sim_s=max(r["init_sim_s"] for r in ranks),
            launch_wall_s=round(wall, 2), agreed=len(layouts) == 1, layout=ranks[0]["layout"],
            chosen=ranks[0]["chosen"], ranks=ranks))
        if not args.json:
            print(f"run {i + 1}: init_process_group {runs[-1]['init_wall_s']:.2f} s wall, "
                  f"{runs[-1]['init_sim_s']:.3f} s simulated (slowest rank); layout {runs[-1]['chosen']}; "
                  f"measured {ranks[0]['measured']} of {ranks[0]['ladder_layouts']} layouts"
                  + ("" if runs[-1]["agreed"] else "; THE RANKS DISAGREE"), flush=True)
    summary = dict(
        config=args.config, repeat=args.repeat, cpus=os.cpu_count(), load_avg_1m=round(os.getloadavg()[0], 2),
        init_wall_s_median=round(statistics.median(r["init_wall_s"] for r in runs), 2),
        init_wall_s_max=max(r["init_wall_s"] for r in runs),
        init_sim_s_median=round(statistics.median(r["init_sim_s"] for r in runs), 3),
        layouts_chosen=sorted({str(r["chosen"]) for r in runs}), all_agreed=all(r["agreed"] for r in runs), runs=runs)
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"median of {args.repeat}: init_process_group {summary['init_wall_s_median']:.2f} s wall "
              f"(max {summary['init_wall_s_max']:.2f}), {summary['init_sim_s_median']:.3f} s simulated; "
              f"{os.cpu_count()} CPUs, load average {summary['load_avg_1m']}")
    return 0 if summary["all_agreed"] else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--rank-program"]:
        _rank_program()
    else:
        ap = command_parser("wccl.lab.startup")
        add_arguments(ap)
        raise SystemExit(run(ap.parse_args()))
