"""`python -m wccl.lab bench`: send N bytes of random tensors from one simulated node to another.

The sender is the room's second node and the receiver its first, or the
pair given (`--sender`, `--receiver`); everything else in the room stays
dark. When nothing gets through, `zero_reason` says why, from the
receiver's counters (its camera never found the code, every frame was
uncorrectable, captures mixed two frames, ...), and the CLI prints it on
stderr.

The link is measured open loop: nothing is acknowledged. Tensor i is one of
the built-in run's transfers (protocols.link.LinkCodec.encode: op `grad`,
seq i, tid i + 1, the streams envelope, sealed under the room key; packets
sized for frames carrying the entries of the room's ranks), and the sender's
screen shows it as `ceil(K * (1 + repair)) + extra` fountain-coded frames
(K: its source packets), one every `hold_s` on the bench's clock, back to
back with the next tensor's, their parity marks alternating. The receiver's
FrameDecoder listens (`listen=True`, as an observer's does: it checks the
room key's MAC and the session and rebuilds every transfer it sees) and
rebuilds what it can from the captures of its camera, driven by the actor
harness. Every delivered tensor is compared with what was sent: a difference
is an undetected error.

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

import numpy as np

from actors.frame_decoder import FrameDecoder
from protocols import streams
from protocols.layout import render, render_idle
from protocols.messages import Capture, TensorReceived
from protocols.security import TAG_BYTES
from wccl.keys import new_run_nonce
from protocols.transfer import TransferAssembler
from wccl.config import WcclConfig, with_values
from wccl.runtime.harness import ActorHarness
from protocols.registry import REGISTRY
from wccl.runtime.timebase import NodeClock, VirtualTimeLoop

HACKATHON_LINK = dict(rows=40, cols=70, colours=8, cell_px=16, hold_s=1.0, code_rate=1.0)


def sealed_bytes(tensor_bytes: int, encrypts: bool = True) -> int:
    """What one tensor's transfer sends: the tensor, its streams envelope and, when the key encrypts,
    the seal's tag."""
    return tensor_bytes + streams.OVERHEAD + (TAG_BYTES if encrypts else 0)


async def _bench(cfg: WcclConfig, nbytes: int, tensor_bytes: int, repair: float, extra: int, seed: int,
                 sender: str | None = None, receiver: str | None = None, per_tensor: int | None = None) -> dict:

    wall0 = time.perf_counter()
    medium = REGISTRY.create("medium", cfg.room.medium, config=cfg)
    names = [n.name for n in cfg.room.nodes]
    rx, tx = pair_of(cfg, sender, receiver)
    clock = NodeClock(origin=0.0)
    codec = cfg.link.codec()
    hold = cfg.link.hold_s
    w, h = cfg.screen.width, cfg.screen.height
    # The room key, as a run would have it (simulated rooms: a fresh one; `[room] key = "none"`: none):
    # frames authenticated, tensors sealed.
    from wccl.keys import new_ephemeral, room_key

    key = room_key(cfg, ephemeral=new_ephemeral())
    run_nonce = new_run_nonce()
    ranks = len(cfg.room.ranks)  # a run's frames carry every rank's entries: packets sized for them
    index = names.index(tx)
    rng = np.random.default_rng(seed)
    n_tensors = max(1, math.ceil(nbytes / tensor_bytes))
    sent: dict[int, bytes] = {}
    sealed = sealed_bytes(tensor_bytes, key.encrypts)  # what one transfer sends
    if per_tensor is None:
        per_tensor = math.ceil(codec.frames_needed(sealed, ranks) * (1 + repair)) + extra
    window = per_tensor * hold
    start = 1.0
    received: dict[int, bytes] = {}
    arrived: dict[int, float] = {}  # tensor -> when the decoder delivered it (the bench's clock)
    screen = REGISTRY.create("screen", "room", medium=medium, node=tx, clock=clock, config=cfg)
    camera = REGISTRY.create("camera", "room", medium=medium, node=rx, clock=clock, config=cfg)
    # Every other laptop's screen shows its idle grid, as in a run (where every screen is lit from the
    # start): a camera's auto exposure meters all the screens in view, so black ones would over-expose
    # the one that sends. The sender's shows it before its first frame and after its last.
    idle = render_idle(codec.layout, w, h)
    for other in names:
        if other not in (tx, rx):
            REGISTRY.create("screen", "room", medium=medium, node=other, clock=clock, config=cfg).show(idle)
    screen.show(idle)
    end = start + n_tensors * window
    shown = 0  # frames the sender's screen showed

    async with ActorHarness(FrameDecoder, node=rx, clock=clock, capacity=8, overflow="drop_oldest", codec=codec,
                            session=cfg.room.session, node_names=names, transfers=TransferAssembler(max_pending=8),
                            key=key, lens=cfg.lens_of(rx), listen=True) as dec:

        async def show_frames() -> None:
            nonlocal shown
            parity = 0
            for i in range(n_tensors):
                data = rng.integers(0, 256, tensor_bytes, dtype=np.uint8).tobytes()
                sent[i] = data
                frames = codec.encode(data, count=per_tensor, session=cfg.room.session, sender=index,
                                      stream="grad", step=i, key=key, run_nonce=run_nonce, ranks=ranks, tid=i + 1)
                for j, frame in enumerate(frames):
                    t = start + i * window + j * hold
                    if clock.now() > t + hold / 2:  # too late for this frame: never shown late
                        continue
                    await clock.sleep_until(t)
                    screen.show(render(frame, codec.layout, w, h, sender=index, parity=parity))
                    parity ^= 1
                    shown += 1
            await clock.sleep_until(end)
            screen.show(idle)

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

        await asyncio.gather(show_frames(), pump_camera())
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
        frames_shown=shown,
        frames_decoded=link.get("frames_ok", 0),
        frames_uncorrectable=link.get("frames_rejected_uncorrectable", 0),
        frames_rejected_check=sum(v for k, v in link.items() if k.startswith("frames_rejected_") and
                                  k != "frames_rejected_uncorrectable"),
        captures=link.get("captures", 0),
        captures_mixed=link.get("captures_mixed", 0),
        captures_combined=link.get("captures_combined", 0),  # frames two uncorrectable reads gave together
        codes_seen=link.get("codes_seen", 0),
        source_frames=codec.frames_needed(sealed, ranks),  # a tensor's, without repair
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


def pair_of(cfg: WcclConfig, sender: str | None, receiver: str | None) -> tuple[str, str]:
    """(receiver, sender): the nodes named, by default the room's first and second; ValueError naming the
    room's nodes for a name that is not one."""
    names = [n.name for n in cfg.room.nodes]
    rx, tx = receiver or names[0], sender or names[1]
    for who, name in (("--sender", tx), ("--receiver", rx)):
        if name not in names:
            raise ValueError(f"{who} {name}: not a node of the room ({', '.join(names)})")
    if rx == tx:
        raise ValueError("the sender and the receiver must be two different nodes")
    return rx, tx


def run_bench(cfg: WcclConfig, nbytes: int, tensor_bytes: int = 65536, repair: float | None = 0.25,
              extra: int | None = 2, seed: int = 0, sender: str | None = None, receiver: str | None = None,
              choose: bool = False) -> dict:
    """Send from `sender` (default: the room's second node) to `receiver` (default: its first).

    `choose`: measure the room as its ranks would use it when its [link] pins no layout: in the layout their
    start-up chooses (`choose_layout`; `layout_choice` says what it found); otherwise the config's [link]
    layout. `repair` None: the repair frames a tensor gets are chosen from the frame loss measured in that
    layout (`spare_frames`)."""
    pair_of(cfg, sender, receiver)  # (a name that is no node's fails here, before the start-up's seconds)
    choice = None
    per_tensor = None
    if choose and cfg.link.choose == "auto":
        cfg, choice = choose_layout(cfg, tensor_bytes, seed, sender, receiver)
    if repair is None:
        if choice is None:
            _, choice = choose_layout(cfg, tensor_bytes, seed, sender, receiver)  # the pinned layout's loss
        per_tensor = choice["source_frames"] + spare_frames(choice["source_frames"], choice["frames_lost"],
                                                            choice["frames_shown"])
    result = _run(_bench(cfg, nbytes, tensor_bytes, repair or 0.0, extra or 0, seed, sender, receiver, per_tensor))
    if choice is not None:
        result["layout_choice"] = choice
    return result


def _run(coro):
    """Run one bench coroutine on its own virtual-time loop."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)


LOSS_TENSORS = 8  # tensors the chosen layout shows to measure its loss (about 300 frames of 64 KB tensors)
MIN_SHARE = 0.5  # a pair that reads fewer of a layout's frames than this is not measured in it
MISS = 0.01  # chance a tensor may miss its frames, in choosing its repair frames
Z = 1.0  # the loss taken as the measured share plus this many standard errors (Wilson's bound)


def spare_frames(source: int, lost: int, shown: int, miss: float = MISS) -> int:
    """Repair frames for a tensor of `source` frames when `lost` of `shown` frames were lost: the fewest
    spares s such that more than s of its source + s frames are lost with a chance under `miss`, taking
    the loss at the upper end (Wilson, Z standard errors) of what was measured."""
    n = max(1, shown)
    p_hat = min(1.0, lost / n)
    z2 = Z * Z
    p = (p_hat + z2 / (2 * n) + Z * math.sqrt(p_hat * (1 - p_hat) / n + z2 / (4 * n * n))) / (1 + z2 / n)
    p = min(max(p, 1e-6), 0.95)
    lp, lq = math.log(p), math.log1p(-p)
    for s in range(0, 10 * source + 50):
        n = source + s
        # P(lost > s) for lost ~ Binomial(n, p), its terms in log space (no overflow for long tensors)
        head = sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq)
                   for i in range(s + 1))
        if 1.0 - head <= miss:
            return s
    return 10 * source + 50


def choose_layout(cfg: WcclConfig, tensor_bytes: int, seed: int, sender: str | None,
                  receiver: str | None) -> tuple[WcclConfig, dict]:
    """The config pinned to the layout its ranks choose (their own start-up: wccl.distributed.rank_node's
    discovery over the light, each layout judged by an all_reduce of `tensor_bytes`; a pinned [link] is kept
    as it is), and that layout's loss between this pair, measured over LOSS_TENSORS tensors (it sizes each
    tensor's repair frames)."""
    from wccl.distributed.rank_node import collective_ladder

    startup = None
    if cfg.link.choose == "auto":
        k, startup = startup_choice(cfg, tensor_bytes)
        codec, hold = collective_ladder(cfg)[k]
        lay = codec.layout
        cfg = with_values(cfg, link=dict(choose="pinned", rows=lay.rows, cols=lay.cols, colours=lay.colours,
                                         cell_px=lay.cell_px, hold_s=hold, code_rate=codec.code_rate))
    lay, hold = cfg.link.layout(), cfg.link.hold_s
    r = _run(_bench(cfg, LOSS_TENSORS * tensor_bytes, tensor_bytes, 0.25, 2, seed + 1, sender, receiver))
    shown, lost = r["frames_shown"], r["frames_shown"] - r["frames_decoded"]
    share = 1 - lost / max(1, shown)
    row = dict(rows=lay.rows, cols=lay.cols, colours=lay.colours, cell_px=lay.cell_px, hold_s=hold,
               code_rate=cfg.link.code_rate, frames_shown=shown, frames_lost=lost, share_read=round(share, 3),
               source_frames=r["source_frames"], loss_sim_seconds=r["sim_seconds"],
               **({"startup": startup} if startup else {}))
    if share < MIN_SHARE:
        raise ValueError(f"{lay.rows}x{lay.cols} cells of {lay.cell_px} px held {hold * 1000:.0f} ms"
                         + (" (the layout the room's ranks chose)" if startup else "")
                         + f": {receiver or 'the receiver'}'s camera read {share:.0%} of the frames"
                         + f" {sender or 'the sender'} showed")
    return cfg, row


def startup_choice(cfg: WcclConfig, layout_bytes: int, timeout_s: float = 120.0) -> tuple[int, dict]:
    """The layout of the collectives' ladder the room's ranks choose at start-up, judging each by an
    all_reduce of `layout_bytes` (every rank's node in one simulated room, on virtual time, as
    init_process_group runs them), and what rank 0's discovery found (`sight_known`: the edges, the layouts
    measured) with the room seconds start-up took. A ValueError saying what start-up lacked if it fails."""
    from wccl.distributed.rank_node import CollectiveNode

    names = cfg.room.ranks
    if len(names) < 2:
        raise ValueError("the room has one rank: there is no layout to choose (pin one in [link])")

    from wccl.keys import new_ephemeral, room_key

    key = room_key(cfg, ephemeral=new_ephemeral())  # the bench's own key, as its transfers use

    async def go():
        medium = REGISTRY.create("medium", cfg.room.medium, config=cfg)
        loop = asyncio.get_running_loop()
        nodes = [CollectiveNode(cfg.model_copy(deep=True), n, medium, timeout_s=timeout_s, on_done=lambda m: None,
                                key=key) for n in names]
        for node in nodes:
            node.layout_bytes = layout_bytes
            node.build()
        try:
            async with asyncio.TaskGroup() as tg:
                for node in nodes:
                    tg.create_task(node.run())
                while not all("discovery" in node.results for node in nodes) and loop.time() < timeout_s:
                    if any(node.greeted.problem for node in nodes):
                        break
                    await asyncio.sleep(0.05)
                for node in nodes:
                    node.stop.set()
        except BaseExceptionGroup as eg:
            raise ValueError("start-up failed: " + "; ".join(str(e) for e in eg.exceptions)) from None
        found = [node.results.get("discovery") for node in nodes]
        if not all(found):
            why = [f"{n}: {node.greeted.problem}" for n, node in zip(names, nodes) if node.greeted.problem]
            raise ValueError(f"start-up chose no layout in {loop.time():.1f} room s"
                             + (": " + "; ".join(why) if why else ""))
        return found, loop.time()

    found, took = _run(go())
    return found[0]["layout"], dict(found[0], startup_sim_seconds=round(took, 3))
