"""`python -m wccl.lab rooms`: rooms no one chose, drawn at random, and whether each that can read starts.

Each room is drawn from its seed (`draw_room`): two to eight simulated
laptops of the `webcam` profile, `distance_m` apart on the default circle
(two face to face), each turned and tilted at random, each with a webcam of
its own (lens, frame rate, exposure, readout, compression, dropped captures,
white balance) and the room's light (ambient, glare). The ranges are wide
on purpose (`RANGES`): the harder ends put a screen at the edge of the view
or too far to read.

For each room the sweep finds out:

- **readable**: whether some layout of the collectives' ladder
  (wccl.distributed.rank_node.collective_ladder) reads enough of the room for
  the collectives: every screen shows single-frame transfers in that layout
  at once and every camera decodes what it sees (the link bench's decoder,
  listening, wccl.lab.bench); a direction reads when at least
  `bench.MIN_SHARE` of the frames shown get through and the layout's hold
  does not beat with the reader's camera (protocols.discovery.steady_hold:
  what such a layout reads depends on a phase that drifts), and the layout serves
  when the pairs of laptops that read each other both ways connect them all
  (what relays and acknowledgements need). Layouts are tried from the most
  robust (the end of the ladder) until one serves.
- **started**: start-up, then `--steps` steps of the built-in run
  (wccl.node.RoomRun, in this process, on virtual time): started or not,
  how long start-up took (room seconds), steps applied, replicas identical,
  and why not (the node's error: what start-up lacked, and what each camera
  read).
- with `--backend`, a 2 KB all_reduce through the torch backend
  (`python -m wccl.launch` on the room written as a file): right or not.

It prints a line a room and a summary, and writes `rooms.jsonl` (a JSON
object a room, appended as each ends: a sweep cut short goes on where it
stopped) and `summary.json` in `--out`. The same seeds draw the same rooms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from wccl.config import NODE_NAMES

# The ranges rooms are drawn from: (low, high) drawn uniformly, or a list drawn from.
RANGES: dict[str, Any] = {
    "distance_m": (0.4, 1.3),
    "yaw_deg": (0.0, 25.0),  # each laptop turned this far from facing the others, left or right
    "pitch_deg": (0.0, 25.0),  # and tilted up or down
    "hfov_deg": (55.0, 90.0),
    "fps": [10.0, 12.0, 15.0, 20.0, 24.0, 25.0, 30.0],
    "exposure_ms": (8.0, 33.0),
    "readout_ms": (8.0, 33.0),
    "codec": ["none", "mjpeg", "h264"],
    "jpeg_quality": (40, 90),
    "drop_prob": (0.0, 0.05),
    "white_balance": (0.8, 1.2),  # each channel's gain: a colour cast
    "ambient": (0.0, 0.3),
    "glare": (0.0, 0.06),
}
PROBE_FRAMES = 24  # frames every screen shows in a layout while the sweep judges it


def _uniform(rng: np.random.Generator, name: str) -> float:
    lo, hi = RANGES[name]
    return float(rng.uniform(lo, hi))


def draw_room(seed: int, index: int, laptops: tuple[int, int] = (2, 2), steps: int = 3) -> dict[str, Any]:
    """Room `index` of the draw `seed`: a room file's settings (as tomllib reads them)."""
    rng = np.random.default_rng([seed, index])
    n = int(rng.integers(laptops[0], laptops[1] + 1))
    room_channel = dict(distance_m=round(_uniform(rng, "distance_m"), 3),
                        ambient=round(_uniform(rng, "ambient"), 3), glare=round(_uniform(rng, "glare"), 4))
    nodes = []
    for i in range(n):
        ch: dict[str, Any] = {
            "yaw_deg": round(float(rng.choice([-1, 1])) * _uniform(rng, "yaw_deg"), 2),
            "pitch_deg": round(float(rng.choice([-1, 1])) * _uniform(rng, "pitch_deg"), 2),
            "hfov_deg": round(_uniform(rng, "hfov_deg"), 1),
            "fps": float(rng.choice(RANGES["fps"])),
            "readout_ms": round(_uniform(rng, "readout_ms"), 1),
            "drop_prob": round(_uniform(rng, "drop_prob"), 3),
            "white_balance": [round(_uniform(rng, "white_balance"), 3) for _ in range(3)],
        }
        # (a row's exposure fits in a frame period)
        ch["exposure_ms"] = round(min(_uniform(rng, "exposure_ms"), 1000 / ch["fps"]), 1)
        codec = str(rng.choice(RANGES["codec"]))
        ch["codec"] = codec
        if codec == "mjpeg":
            ch["jpeg_quality"] = int(rng.integers(RANGES["jpeg_quality"][0], RANGES["jpeg_quality"][1] + 1))
        nodes.append(dict(name=NODE_NAMES[i], roles=["server", "worker"] if i == 0 else ["worker"], channel=ch))
    return {
        "room": dict(medium="simulated", profile="webcam", clock="virtual", seed=index, session=1 + index % 60000,
                     channel=room_channel, nodes=nodes),
        "training": dict(steps=steps, eval_every=0),
        "dashboard": dict(enabled=False),
        "logging": dict(level="warning"),
    }


def describe(data: dict[str, Any]) -> str:
    """A room in one line: laptops, distance, and each laptop's camera."""
    room = data["room"]
    cams = []
    for n in room["nodes"]:
        c = n["channel"]
        codec = c["codec"] + (f" q{c['jpeg_quality']}" if c["codec"] == "mjpeg" else "")
        cams.append(f"{n['name']} yaw {c['yaw_deg']:+.0f} pitch {c['pitch_deg']:+.0f} {c['hfov_deg']:.0f}deg "
                    f"{c['fps']:g}fps {codec}")
    return f"{len(room['nodes'])} laptops {room['channel']['distance_m']:.2f} m apart; " + "; ".join(cams)


# ------------------------------------------------------------------ readable
async def _probe(cfg, k: int, frames: int, seed: int) -> dict[tuple[int, int], float]:
    """Every screen shows `frames` single-frame transfers in layout k of the ladder at once (each from a
    random phase of its hold); every camera decodes what it sees. (reader, shown) -> share of the frames
    shown that it read."""
    from actors.frame_decoder import FrameDecoder
    from protocols.discovery import steady_hold
    from protocols.layout import render, render_idle
    from protocols.messages import Capture, TensorReceived
    from wccl.keys import new_run_nonce
    from protocols.transfer import TransferAssembler
    from wccl.distributed.rank_node import collective_ladder
    from wccl.runtime.harness import ActorHarness
    from wccl.keys import new_ephemeral, room_key
    from protocols.registry import REGISTRY
    from wccl.runtime.timebase import NodeClock

    codec, hold = collective_ladder(cfg)[k]
    names = [n.name for n in cfg.room.nodes]
    n = len(names)
    medium = REGISTRY.create("medium", cfg.room.medium, config=cfg)
    clock = NodeClock(origin=0.0)
    key = room_key(cfg, ephemeral=new_ephemeral())
    w, h = cfg.screen.width, cfg.screen.height
    rng = np.random.default_rng(seed)
    screens = [REGISTRY.create("screen", "room", medium=medium, node=x, clock=clock, config=cfg) for x in names]
    cameras = [REGISTRY.create("camera", "room", medium=medium, node=x, clock=clock, config=cfg) for x in names]
    idle = render_idle(codec.layout, w, h)
    for s in screens:
        s.show(idle)
    start, end = 1.0, 1.0 + (frames + 1) * hold
    got: dict[tuple[int, int], set[int]] = {(r, s): set() for r in range(n) for s in range(n) if r != s}

    async def show(i: int) -> None:
        nonce = new_run_nonce()
        t0 = start + float(rng.uniform(0, hold))
        for j in range(frames):
            data = rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
            (frame,) = codec.encode(data, count=1, session=cfg.room.session, sender=i, stream="grad", step=j,
                                    key=key, run_nonce=nonce, ranks=n, tid=j + 1)
            await clock.sleep_until(t0 + j * hold)
            screens[i].show(render(frame, codec.layout, w, h, sender=i, parity=j & 1))
        await clock.sleep_until(t0 + frames * hold)
        screens[i].show(idle)

    async def read(r: int) -> None:
        async with ActorHarness(FrameDecoder, node=names[r], clock=clock, capacity=8, overflow="drop_oldest",
                                codec=codec, session=cfg.room.session, node_names=names,
                                transfers=TransferAssembler(max_pending=64), key=key, lens=cfg.lens_of(names[r]),
                                listen=True) as dec:
            seq = 0
            while clock.now() < end + 0.3:
                image, t = await cameras[r].recv()
                await dec.send(Capture(sender=names[r], time=t, image=image, seq=seq))
                seq += 1
                for m in dec.of_type(TensorReceived):
                    got[(r, names.index(m.origin))].add(m.step)
                dec.outputs.clear()
                await asyncio.sleep(0)
            await dec.settle()
            for m in dec.of_type(TensorReceived):
                got[(r, names.index(m.origin))].add(m.step)

    await asyncio.gather(*(show(i) for i in range(n)), *(read(r) for r in range(n)))
    # A hold that beats with the reader's camera reads for a while at one phase and not at all at another
    # (protocols.discovery.steady_hold): what a few seconds of it read says nothing of a run.
    steady = [steady_hold(hold, 1 / medium.camera_fps(x)) for x in names]
    return {(r, s): len(v) / frames if steady[r] else 0.0 for (r, s), v in got.items()}


def _connected(n: int, both: set[tuple[int, int]]) -> bool:
    seen, todo = {0}, [0]
    while todo:
        a = todo.pop()
        for b in range(n):
            if b not in seen and ((a, b) in both):
                seen.add(b)
                todo.append(b)
    return len(seen) == n


def judge(cfg, seed: int = 0, frames: int = PROBE_FRAMES) -> dict[str, Any]:
    """Whether some layout of the ladder reads enough of the room for the collectives (the module's
    docstring), trying the layouts from the end of the ladder; what each tried read."""
    from wccl.distributed.rank_node import collective_ladder
    from wccl.lab.bench import MIN_SHARE, _run

    names = [n.name for n in cfg.room.nodes]
    n = len(names)
    ladder = collective_ladder(cfg)
    tried = []
    for k in reversed(range(len(ladder))):
        share = _run(_probe(cfg, k, frames, seed))
        reads = {e for e, q in share.items() if q >= MIN_SHARE}
        both = {(a, b) for a, b in reads if (b, a) in reads}
        lay = ladder[k][0].layout
        tried.append(dict(layout=k, words=f"{lay.rows}x{lay.cols} of {lay.cell_px} px held {ladder[k][1] * 1000:.0f} ms",
                          read={f"{names[s]}->{names[r]}": round(q, 2) for (r, s), q in sorted(share.items())}))
        if _connected(n, both):
            return dict(readable=True, layout=k, tried=tried)
    return dict(readable=False, layout=None, tried=tried)


# ------------------------------------------------------------------ started
def run_room(data: dict[str, Any]) -> dict[str, Any]:
    """Start-up and the built-in run's steps in this room, in this process (virtual time)."""
    from wccl.config import parse_config
    from wccl.node import RoomRun
    from wccl.runtime.supervisor import NodeFailed
    from wccl.runtime.timebase import VirtualTimeLoop

    cfg = parse_config(data, "random room", Path.cwd())
    runs: list[RoomRun] = []

    async def go():
        run = RoomRun(cfg, None)
        runs.append(run)
        return await run.run()

    wall = time.perf_counter()
    out: dict[str, Any] = {}
    try:
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            res = runner.run(go())
        out.update(started=True, applied=res["applied"], made_up=res["made_up"],
                   replicas_identical=res["replicas_identical"],
                   observer_identical=res["observer_identical"], test_accuracy=res["test_accuracy"],
                   room_s=res["sim_seconds"], why=None)
        # when the server's replica took each update, in room seconds after the first camera started
        t0 = getattr(runs[0].medium, "cameras_started_at", None) or 0.0
        server = res["nodes"].get(cfg.room.server, {}).get("worker", {})
        out["applied_at"] = [round(t - t0, 3) for t in server.get("applied_at", [])]
    except BaseExceptionGroup as eg:
        failed = [str(e) for e in eg.subgroup(NodeFailed).exceptions] if eg.subgroup(NodeFailed) else [repr(eg)]
        out.update(started=False, applied=0, why=" | ".join(failed))
    startup = [sup.results.get("startup_s") for sup in runs[0].supervisors] if runs else []
    out["startup_s"] = max(startup) if startup and all(s is not None for s in startup) else None
    out["wall_s"] = round(time.perf_counter() - wall, 1)
    return out


def run_backend(data: dict[str, Any], timeout_s: float = 900.0) -> dict[str, Any]:
    """A 2 KB all_reduce through the torch backend on this room, written as a file
    (tests/dist_scripts/many.py's check, through `python -m wccl.launch`)."""
    from wccl.config import toml_text

    script = Path(__file__).resolve().parent / "collectives_rank.py"
    with tempfile.TemporaryDirectory() as tmp:
        room = Path(tmp) / "room.toml"
        room.write_text(toml_text(data))
        wall = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, "-m", "wccl.launch", "--config", str(room), str(script),
                                "--sizes", "2048", "--ops", "all_reduce", "--repeat", "1"],
                               capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return dict(ok=False, why=f"no answer in {timeout_s:g} s of wall time")
        ranks = []
        for line in p.stdout.splitlines():
            if '{"rank"' in line:
                ranks.append(json.loads(line[line.index('{"rank"'):]))
        world = len(data["room"]["nodes"])
        rows = [row for r in ranks for row in r["rows"]]
        ok = p.returncode == 0 and len(ranks) == world and bool(rows) and all(row["correct"] for row in rows)
        tail = (p.stderr.strip().splitlines() or [""])[-1]
        why = None if ok else (f"exit {p.returncode}: {tail[:400]}" if p.returncode else
                               f"{len(ranks)} of {world} ranks answered; wrong: "
                               f"{[row for row in rows if not row['correct']][:2]}")
        return dict(ok=ok, why=why, latency_s=max((row["latency_s"] for row in rows), default=None),
                    wall_s=round(time.perf_counter() - wall, 1))


# ------------------------------------------------------------------ the sweep
def one(seed: int, index: int, laptops: tuple[int, int], steps: int, backend: bool) -> dict[str, Any]:
    """Draw, judge and run room `index` of the draw `seed`."""
    from wccl.config import parse_config
    from wccl.runtime.logs import configure_logging

    configure_logging("json", "error", stream=open(os.devnull, "w"))
    data = draw_room(seed, index, laptops, steps)
    cfg = parse_config(data, "random room", Path.cwd())
    wall = time.perf_counter()
    verdict = judge(cfg, seed=index)
    judged_s = round(time.perf_counter() - wall, 1)
    ran = run_room(data)
    out = dict(seed=seed, index=index, draw=f"{laptops[0]}-{laptops[1]}", laptops=len(data["room"]["nodes"]),
               steps=steps, room=describe(data),
               readable=verdict["readable"],
               readable_layout=verdict["layout"], judge=verdict["tried"], judge_wall_s=judged_s, **ran)
    out["ok"] = (out["started"] and out["applied"] == steps and out.get("replicas_identical") is not False
                 if verdict["readable"] else True)
    if backend:
        out["backend"] = run_backend(data)
    out["channel"] = data["room"]
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    readable = [r for r in rows if r["readable"]]
    unreadable = [r for r in rows if not r["readable"]]
    started = [r for r in readable if r["started"] and r["applied"] == r.get("steps", r["applied"])]
    out = dict(rooms=len(rows), readable=len(readable), readable_started=len(started),
               readable_not_started=[r["index"] for r in readable if r not in started],
               unreadable=len(unreadable), unreadable_started=[r["index"] for r in unreadable if r["started"]],
               unreadable_stopped_s=sorted(round(float(r["why_at_s"]), 1) for r in unreadable
                                           if r.get("why_at_s") is not None),
               startup_s_median=(float(np.median([r["startup_s"] for r in started])) if started else None),
               startup_s_max=(max(r["startup_s"] for r in started) if started else None))
    backend = [r for r in rows if "backend" in r and r["readable"]]
    if backend:
        out["backend_ok"] = sum(1 for r in backend if r["backend"]["ok"])
        out["backend_runs"] = len(backend)
    return out


def _at_s(why: str | None) -> float | None:
    """The room seconds a node's error says start-up took ("... in 12.5 s ...")."""
    import re

    m = re.search(r" in (\d+(?:\.\d+)?) s\b", why or "")
    return float(m.group(1)) if m else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--count", type=int, default=10, help="rooms to draw (default 10)")
    p.add_argument("--laptops", default="2", help="laptops a room: N, or LOW-HIGH drawn at random (default 2)")
    p.add_argument("--seed", type=int, default=1, help="the draw's seed: the same seed draws the same rooms")
    p.add_argument("--first", type=int, default=0, help="the index of the first room of the draw (default 0)")
    p.add_argument("--steps", type=int, default=3, help="steps of the built-in run after start-up (default 3)")
    p.add_argument("--backend", action="store_true", help="also a 2 KB all_reduce through the torch backend")
    p.add_argument("--jobs", type=int, default=1, help="rooms run at once, each in a process of its own (default 1)")
    p.add_argument("--out", default="rooms-out", help="folder for rooms.jsonl and summary.json (default rooms-out)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")


def _laptops(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    try:
        a, b = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"--laptops {text}: expected N or LOW-HIGH, e.g. 3-8") from None
    if not 2 <= a <= b <= len(NODE_NAMES):
        raise ValueError(f"--laptops {text}: 2 to {len(NODE_NAMES)} laptops, LOW <= HIGH")
    return a, b


def run(args: argparse.Namespace) -> int:
    try:
        laptops = _laptops(args.laptops)
    except ValueError as e:
        print(f"wccl.lab rooms: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "rooms.jsonl"
    done: dict[int, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            # (a room is the same room for the same seed, index, range of laptops and steps)
            if (r["seed"], r.get("draw"), r.get("steps")) == (args.seed, f"{laptops[0]}-{laptops[1]}", args.steps):
                done[r["index"]] = r
    todo = [i for i in range(args.first, args.first + args.count) if i not in done]
    rows = [done[i] for i in range(args.first, args.first + args.count) if i in done]

    def finished(r: dict) -> None:
        r["why_at_s"] = _at_s(r.get("why"))
        with path.open("a") as f:
            f.write(json.dumps(r) + "\n")
        rows.append(r)
        verdict = "readable" if r["readable"] else "unreadable"
        ran = (f"started in {r['startup_s']:.1f} s, {r['applied']} steps" if r["started"] else
               f"did not start: {(r['why'] or '')[:160]}")
        print(f"room {r['index']:3d} [{'ok' if r['ok'] else 'FAIL'}] {verdict}"
              f"{' (' + r['judge'][-1]['words'] + ')' if r['readable'] else ''}; {ran}; {r['room']}", flush=True)

    if args.jobs <= 1:
        for i in todo:
            finished(one(args.seed, i, laptops, args.steps, args.backend))
    else:
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from multiprocessing import get_context

        with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(one, args.seed, i, laptops, args.steps, args.backend) for i in todo]
            for fut in as_completed(futures):
                finished(fut.result())
    rows.sort(key=lambda r: r["index"])
    summary = dict(seed=args.seed, first=args.first, count=args.count, laptops=args.laptops, steps=args.steps,
                   **summarize(rows))
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['rooms']} rooms: {summary['readable']} readable, {summary['readable_started']} of them "
              f"started and ran their steps; {summary['unreadable']} unreadable, "
              f"{len(summary['unreadable_started'])} of them started anyway")
    return 0 if not summary["readable_not_started"] else 1
