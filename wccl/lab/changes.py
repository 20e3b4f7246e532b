"""`python -m wccl.lab changes [--config config.toml] [--at 20] [--only lamp,nudge] [--jobs 2] [--json]`: the
built-in run through changes of the simulated room while it goes, one change a run.

Each scenario adds a change to one node of the room file (`[[room.nodes]] changes`, or `covered_s` for a
hand; wccl/room/NOTES.md) at `--at` room seconds after the cameras start: a lamp over bob's camera, bob's
lid nudged 8 degrees toward alice, and 8 degrees the other way (in the default room that takes part of her
screen out of his camera's view), a hand over bob's camera for 3 s, alice's screen dimmed to 40 % for 30 s, bob's camera
at 15 frames a second for 30 s, bob's lid turned 60 degrees away (his screen and camera out of each
other's view) and back 20 s later. The run lasts long enough for the change and 20 s after it. Printed per
scenario, and with --json as one object: the steps applied of those scheduled, whether the replicas and the
observers ended identical, the test accuracy, what the nodes said of screens they stopped reading
(`screen_lost`, `screen_unread`) and found again, and the step time (the median time between the server's
updates) in the 10 s before the change, in the 5 s from the change, and in the last 10 s; a step time of
None means no update in that window (the run skipped those steps), with the count of updates there; the
longest wait for an update from the change until 10 s after it is over, and how soon after the change the
updates came back, for good, to within 1.3x of that span's median step (the step time the changed room
allows); and every layout a camera asked a screen for (`layout_asked`, protocols.adapt).
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

AFTER_S = 20.0  # a run goes on this long after its change (or after a change's end)


def scenarios(data: dict[str, Any], at: float) -> dict[str, tuple[str, dict[str, Any], float]]:
    """Scenario name -> (node, what to add to its table, when the change is over) for the room `data`."""
    from wccl.room.params import resolve

    room = data["room"]
    bob = next(n for n in room["nodes"] if n["name"] == "bob")
    yaw = resolve(room.get("profile", "webcam"), room.get("channel"), bob.get("channel")).yaw_deg
    return {
        "none": ("bob", {}, at),
        "lamp": ("bob", {"changes": [{"at_s": at, "channel": {"ambient": 0.6, "glare": 0.1}}]}, at),
        "nudge": ("bob", {"changes": [{"at_s": at, "ramp_s": 0.5, "channel": {"yaw_deg": yaw - 8.0}}]}, at + 0.5),
        "nudge away": ("bob", {"changes": [{"at_s": at, "ramp_s": 0.5, "channel": {"yaw_deg": yaw + 8.0}}]},
                       at + 0.5),
        "hand": ("bob", {"covered_s": [[at, at + 3.0]]}, at + 3.0),
        "dimmed": ("alice", {"changes": [{"at_s": at, "channel": {"screen_brightness": 0.4}},
                                         {"at_s": at + 30.0, "channel": {"screen_brightness": 1.0}}]}, at + 30.0),
        "slow camera": ("bob", {"changes": [{"at_s": at, "channel": {"fps": 15.0}},
                                            {"at_s": at + 30.0, "channel": {"fps": 30.0}}]}, at + 30.0),
        "turned away": ("bob", {"changes": [{"at_s": at, "ramp_s": 0.5, "channel": {"yaw_deg": yaw + 60.0}},
                                            {"at_s": at + 20.0, "ramp_s": 0.5, "channel": {"yaw_deg": yaw}}]},
                        at + 20.5),
    }


def _back(times: list[float], at: float, over: float) -> tuple[float | None, float | None]:
    """From the change at `at` (over at `over`) to 10 s after it is over: the longest gap between updates,
    and how long after the change the updates came back to within 1.3x of that span's median step for good
    (None: fewer than three updates there)."""
    t = [at] + [x for x in times if at < x < max(over, at) + 10.0]
    if len(t) < 4:
        return None, None
    gaps = np.diff(t)
    limit = 1.3 * float(np.median(gaps[1:]))
    bad = [i for i, g in enumerate(gaps) if g > limit]
    back = 0.0 if not bad else t[bad[-1] + 1] - at
    return round(float(gaps.max()), 3), round(back, 3)


def _step_s(times: list[float], lo: float, hi: float) -> tuple[float | None, int]:
    """The median gap between the updates in [lo, hi) (None: fewer than two), and how many there were."""
    t = [x for x in times if lo <= x < hi]
    return (round(float(np.median(np.diff(t))), 3) if len(t) >= 2 else None), len(t)


def one(config: str, name: str, at: float, step_s: float) -> dict[str, Any]:
    """Run scenario `name` on the room file `config`."""
    import io

    from wccl.lab.rooms import run_room
    from wccl.runtime.logs import configure_logging

    logs = io.StringIO()
    configure_logging("json", "info", stream=logs)
    data = tomllib.loads(Path(config).read_text())
    node, extra, over = scenarios(data, at)[name]
    for n in data["room"]["nodes"]:
        if n["name"] == node:
            n.update(extra)
    steps = int((over + AFTER_S) / step_s) + 1
    data.setdefault("training", {})["steps"] = steps
    data.setdefault("logging", {})["level"] = "info"
    res = run_room(data)
    # what the nodes said of the screens they stopped reading, and found again: (event, direction) in order
    said = [json.loads(line) for line in logs.getvalue().splitlines() if '"screen_' in line]
    screens = [f"{e['event']} {e['direction']} at {e.get('t', 0):.1f} s" for e in said
               if e.get("event") in ("screen_lost", "screen_unread", "screen_found_again")]
    asked = [json.loads(line) for line in logs.getvalue().splitlines() if '"layout_asked"' in line]
    layouts = [f"{e['direction']} at {e.get('t', 0):.1f} s: {e['layout']} (was {e['was']}: {e['read']} read)"
               for e in asked if e.get("event") == "layout_asked"]
    times = res.pop("applied_at", [])
    gap, back = _back(times, at, over)
    before, n_before = _step_s(times, at - 10.0, at)
    soon, n_soon = _step_s(times, at, at + 5.0)
    end = max(times) if times else at
    last, n_last = _step_s(times, max(over, end - 10.0), end + 1e-9)
    return dict(scenario=name, node=node, change=extra, steps=steps, step_s_before=before, step_s_first_5s=soon,
                updates_first_5s=n_soon, step_s_last_10s=last, updates_last_10s=n_last,
                updates_after=sum(1 for t in times if t >= at), longest_gap_s=gap, back_within_s=back,
                screens=screens, layouts=layouts, **res)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="config.toml", help="the room file (its nodes alice and bob change)")
    p.add_argument("--at", type=float, default=20.0, help="room seconds from the cameras' start to the change")
    p.add_argument("--step-s", type=float, default=0.45,
                   help="the room's step time, to size each run (default 0.45: the default room's)")
    p.add_argument("--only", help="scenarios to run, comma-separated (default: all): none, lamp, nudge, "
                                  "nudge away, hand, dimmed, slow camera, turned away")
    p.add_argument("--jobs", type=int, default=1, help="scenarios run at once, each in a process of its own")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    data = tomllib.loads(Path(args.config).read_text())
    names = list(scenarios(data, args.at))
    if args.only:
        want = [s.strip() for s in args.only.split(",")]
        bad = [s for s in want if s not in names]
        if bad:
            print(f"wccl.lab changes: --only {', '.join(bad)}: not a scenario ({', '.join(names)})", file=sys.stderr)
            return 2
        names = want
    if {"alice", "bob"} - {n["name"] for n in data["room"]["nodes"]}:
        print(f"wccl.lab changes: {args.config} needs nodes named alice and bob", file=sys.stderr)
        return 2
    if args.jobs <= 1:
        rows = [one(args.config, n, args.at, args.step_s) for n in names]
    else:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
            rows = list(pool.map(one, [args.config] * len(names), names, [args.at] * len(names),
                                 [args.step_s] * len(names)))
    if args.json:
        print(json.dumps({"config": args.config, "at_s": args.at, "scenarios": rows}))
        return 0
    print(f"{'scenario':12s} {'applied':>9s} {'replicas':>9s} {'observer':>9s} {'acc':>6s} "
          f"{'step before':>11s} {'first 5 s':>16s} {'last 10 s':>16s}")
    for r in rows:
        def s(v, n=None):
            return ("-" if v is None else f"{v:.2f} s") + (f" ({n} upd)" if n is not None else "")
        print(f"{r['scenario']:12s} {str(r['applied']) + '/' + str(r['steps']):>9s} "
              f"{str(r.get('replicas_identical')):>9s} {str(r.get('observer_identical')):>9s} "
              f"{r.get('test_accuracy', float('nan')):6.3f} {s(r['step_s_before']):>11s} "
              f"{s(r['step_s_first_5s'], r['updates_first_5s']):>16s} {s(r['step_s_last_10s'], r['updates_last_10s']):>16s}")
        print(f"{'':12s} longest wait for an update after the change: {s(r['longest_gap_s'])}; back to its "
              f"step time {s(r['back_within_s'])} after the change")
        for line in r["screens"] + r["layouts"]:
            print(f"{'':12s} {line}")
    return 0
