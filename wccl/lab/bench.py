"""`python -m wccl.lab bench`: send N bytes of random tensors from one simulated node to another.

The sender is the room's second node and the receiver its first, or the
pair given (`--sender`, `--receiver`); everything else in the room stays
dark. When nothing gets through, `zero_reason` says why, from the
receiver's counters (its camera never found the code, every frame was
uncorrectable, captures mixed two frames, ...), and the CLI prints it on
stderr. The sender's ScreenWriter shows each tensor as
`ceil(K * (1 + repair)) + extra` fountain-coded frames, back to back; the
receiver's CameraReader and FrameDecoder (the node's own actors, driven by
the actor harness) rebuild what they can. Every delivered tensor is compared
with what was sent: a difference is an undetected error.

Figures: `goodput_kBps` = payload bytes delivered intact / simulated link
seconds / 1000; `raw_cell_error_rate` = wrong cells / cells read, over the
frames that were decoded (the reader's errors before correction);
`frames_shown`, `frames_decoded`, `captures`, `captures_mixed`,
`frames_uncorrectable`, `tensors_sent`, `tensors_delivered`,
`undetected_errors`, `sim_seconds`, `wall_seconds`.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import numpy as np

from actors.frame_decoder import FrameDecoder
from actors.screen_writer import ScreenWriter
from protocols.security import TAG_BYTES
from protocols.steps import OVERHEAD as STEP_OVERHEAD, StepAssembler
from protocols.messages import Capture, Show, TensorReceived
from wccl.config import WcclConfig
from wccl.harness import ActorHarness
from wccl.registry import REGISTRY
from wccl.timebase import NodeClock, VirtualTimeLoop

HACKATHON_LINK = dict(rows=40, cols=70, colours=8, cell_px=16, hold_s=1.0, code_rate=1.0)


def with_overrides(cfg: WcclConfig, profile: str | None = None, link: dict[str, Any] | None = None) -> WcclConfig:
    from wccl.config import parse_config

    data = cfg.model_dump()
    if profile:
        data["room"]["profile"] = profile
    if link:
        data["link"].update(link)
    return parse_config(data, "bench overrides")


async def _bench(cfg: WcclConfig, nbytes: int, tensor_bytes: int, repair: float, extra: int, seed: int,
                 sender: str | None = None, receiver: str | None = None) -> dict:
    import wccl.media.parts  # noqa: F401  (registers the room)

    wall0 = time.perf_counter()
    medium = REGISTRY.create("medium", cfg.room.medium, config=cfg)
    names = [n.name for n in cfg.room.nodes]
    rx, tx = receiver or names[0], sender or names[1]
    for who, name in (("--sender", tx), ("--receiver", rx)):
        if name not in names:
            raise ValueError(f"{who} {name}: not a node of the room ({', '.join(names)})")
    if rx == tx:
        raise ValueError("the sender and the receiver must be two different nodes")
    clock = NodeClock(origin=0.0)
    codec = cfg.link.codec()
    # The room key, as a run would have it (simulated rooms: a fresh one; `[room] security = "off"`: none):
    # frames authenticated, tensors sealed.
    from wccl.keys import new_ephemeral, room_key

    key = room_key(cfg, ephemeral=new_ephemeral())
    rng = np.random.default_rng(seed)
    n_tensors = max(1, math.ceil(nbytes / tensor_bytes))
    sent: dict[int, bytes] = {}
    sealed = tensor_bytes + STEP_OVERHEAD - (0 if key.encrypts else TAG_BYTES)  # what one transfer sends
    per_tensor = math.ceil(codec.frames_needed(sealed, len(names), echoes=True) * (1 + repair)) + extra
    window = per_tensor * cfg.link.hold_s
    start = 1.0
    received: dict[int, bytes] = {}
    arrived: dict[int, float] = {}  # tensor -> when the decoder delivered it (the bench's clock)
    screen = REGISTRY.create("screen", "room", medium=medium, node=tx, clock=clock, config=cfg)
    camera = REGISTRY.create("camera", "room", medium=medium, node=rx, clock=clock, config=cfg)
    # Every other laptop's screen shows its idle grid, as in a run (where every screen is lit from the
    # start): a camera's auto exposure meters all the screens in view, so black ones would over-expose
    # the one that sends.
    from protocols.layout import render_idle

    idle = render_idle(codec.layout, cfg.screen.width, cfg.screen.height)
    for other in names:
        if other not in (tx, rx):
            REGISTRY.create("screen", "room", medium=medium, node=other, clock=clock, config=cfg).show(idle)
    end = start + n_tensors * window

    async with ActorHarness(ScreenWriter, node=tx, clock=clock, screen=screen, codec=codec,
                            screen_w=cfg.screen.width, screen_h=cfg.screen.height, hold_s=cfg.link.hold_s,
                            session=cfg.room.session, sender_id=names.index(tx), node_names=names,
                            key=key) as writer, \
            ActorHarness(FrameDecoder, node=rx, clock=clock, capacity=8, overflow="drop_oldest", codec=codec,
                         session=cfg.room.session, node_names=names, assembler=StepAssembler(key, max_pending=8),
                         key=key,
                         lens=cfg.camera.lens) as dec:

        async def feed_writer() -> None:
            for i in range(n_tensors):
                data = rng.integers(0, 256, tensor_bytes, dtype=np.uint8).tobytes()
                sent[i] = data
                t0 = start + i * window
                await writer.send(Show(sender=tx, step=i, time=clock.now(), stream="grad", payload=data,
                                       start=t0, end=t0 + window))

        async def pump_camera() -> None:
            seq = 0
            while clock.now() < end + 0.5:
                image, t = await camera.recv()
                await dec.send(Capture(sender=rx, time=t, image=image, seq=seq))
                seq += 1
                for m in dec.of_type(TensorReceived):
                    received.setdefault(m.step, m.payload)
                    arrived.setdefault(m.step, m.time)
                dec.outputs.clear()
                await asyncio.sleep(0)

        await asyncio.gather(feed_writer(), pump_camera())
        await dec.settle()
        for m in dec.of_type(TensorReceived):
            received.setdefault(m.step, m.payload)
            arrived.setdefault(m.step, m.time)
    link = dec.results["link"]  # the decoder's totals, reported when it finished
    delivered = sum(1 for i, d in received.items() if sent.get(i) == d)
    undetected = sum(1 for i, d in received.items() if sent.get(i) != d)
    sim_seconds = end - start
    cells_read = link.get("cells_read", 0)
    # Latency: from the tensor's first frame going up (its window's start) to its delivery.
    lat = sorted(arrived[i] - (start + i * window) for i, d in received.items() if sent.get(i) == d)
    return dict(
        sender=tx, receiver=rx,
        zero_reason=None if delivered else zero_reason(tx, rx, link),
        profile=cfg.room.profile,
        layout=dict(rows=cfg.link.rows, cols=cfg.link.cols, colours=cfg.link.colours, cell_px=cfg.link.cell_px,
                    hold_s=cfg.link.hold_s, code_rate=cfg.link.code_rate),
        authenticated=key.authenticated,
        goodput_kBps=round(delivered * tensor_bytes / sim_seconds / 1000, 3),
        latency_p50_s=round(float(np.percentile(lat, 50)), 4) if lat else None,
        latency_p95_s=round(float(np.percentile(lat, 95)), 4) if lat else None,
        raw_cell_error_rate=round(link.get("cells_wrong", 0) / cells_read, 6) if cells_read else None,
        frames_shown=writer.results.get("screen", {}).get("frames_shown", 0),
        frames_decoded=link.get("frames_ok", 0),
        frames_uncorrectable=link.get("frames_rejected_uncorrectable", 0),
        frames_rejected_check=sum(v for k, v in link.items() if k.startswith("frames_rejected_") and
                                  k != "frames_rejected_uncorrectable"),
        captures=link.get("captures", 0),
        captures_mixed=link.get("captures_mixed", 0),
        codes_seen=link.get("codes_seen", 0),
        tensors_sent=n_tensors,
        tensors_delivered=delivered,
        undetected_errors=undetected,
        bytes_sent=n_tensors * tensor_bytes,
        frames_per_tensor=per_tensor,
        sim_seconds=round(sim_seconds, 3),
        wall_seconds=round(time.perf_counter() - wall0, 2),
    )


def zero_reason(tx: str, rx: str, link: dict) -> str:
    """Why no tensor got from `tx` to `rx`, from the receiver's link counters (the commonest failure first)."""
    captures, codes = link.get("captures", 0), link.get("codes_seen", 0)
    ok = link.get("frames_ok", 0)
    if captures == 0:
        return f"{rx}'s camera delivered no captures"
    if codes == 0:
        return (f"{rx}'s camera never found {tx}'s code in {captures} captures: {tx}'s screen is out of its view, "
                "hidden, or too small in it")
    if ok:
        return (f"{ok} frames decoded but no tensor completed: too few of each tensor's frames got through "
                "(raise --repair or --extra)")
    causes = {
        "uncorrectable": (link.get("frames_rejected_uncorrectable", 0),
                          "frames read but uncorrectable: cells too small or blurred for that camera "
                          "(try --set cell_px=12, or --set colours=4)"),
        "unreadable": (link.get("frames_rejected_unreadable", 0),
                       "codes whose cells could not be read: cells too small for that camera (larger cell_px)"),
        "mixed": (link.get("captures_mixed", 0),
                  "captures that mixed two frames, or whose parity marks were too blurred to tell "
                  "(hold frames longer with --set hold_s=..., or larger cells)"),
    }
    worst = max(causes.values(), key=lambda c: c[0])
    counts = ", ".join(f"{k} {n}" for k, (n, _) in causes.items())
    return (f"{rx}'s camera saw {tx}'s code {codes} times and decoded no frame ({counts}); mostly "
            f"{worst[1]}")


def run_bench(cfg: WcclConfig, nbytes: int, tensor_bytes: int = 65536, repair: float = 0.25, extra: int = 2,
              seed: int = 0, sender: str | None = None, receiver: str | None = None) -> dict:
    """Send from `sender` (default: the room's second node) to `receiver` (default: its first)."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(_bench(cfg, nbytes, tensor_bytes, repair, extra, seed, sender, receiver))
