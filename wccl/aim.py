"""`wccl aim --config ROOM --node NAME`: point the laptops at each other before a run.

Each node shows an aim code on its screen (a grid of 30x48 cells in 4
colours, of 16 px where the screen has room, on the left) and, on the right, outside the code, a dimmed
inset of what its own camera sees: the codes it finds outlined (green when
read, amber when found but not read), camera pixels per cell (and what that
makes of each layout of the run's ladder), the camera's measured frame
rate, its exposure lock state, and a hint in words for each peer it aims at
(turn left, tilt the lid back, move closer...).

The aim code is a keyed status frame (protocols.transfer.status_message,
checked with the room key; unkeyed in a room that pairs over the light, which
has no key before its run) whose `trusts` mask names the peers this node
has read within the last READ_WINDOW_S: so every node learns over the light
alone whether its own screen is read. Per peer the state goes `searching`
(no code in view) -> `found` (a code, not read) -> `reading` (its frames
read) -> `both` (and it reads this screen), each change logged as
`aim_state` with the hint. Once every peer aimed at is `both` for
OK_HOLD_S, the node logs `aim_ok` and goes on showing its code for LINGER_S
(its peers learn from it that they are read), then ends.

A run on real devices starts the same way (`aim_first`): `python -m
wccl.node` and `python -m wccl.launch` with room.medium = "hardware" aim
first (for at most `--aim-seconds`, then it
warns `aim_not_done`, naming the directions, and starts anyway).

In the simulated room every node named (all by default) runs in this
process on the room's clock; on real devices one node per laptop
(`--node`), on the wall clock, until `aim_ok`, Esc in the window, Ctrl-C
or `--seconds`. Exit status 0 when every node run is aimed, 1 when time ran
out (each direction that did not read is named), 2 bad arguments or config,
3 no display, 4 no camera, 130 interrupted.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from protocols import fec
from protocols.frames import FrameError
from protocols.layout import GridLayout, render
from protocols.link import LinkCodec
from protocols.security import RoomKey
from protocols.transfer import status_message
from wccl.cli import command_parser
from wccl.config import ConfigError, WcclConfig, load_config
from wccl.keys import new_run_nonce

AIM_ROWS, AIM_COLS, AIM_COLOURS, AIM_CELL_PX = 30, 48, 4, 16  # the aim code: 16 px cells where they fit
CODE_SHARE = 0.65  # of the screen's width, at most, for the code (the inset and the words take the rest)
AIM_CODE_RATE = 0.8
AIM_HOLD_S = 0.2  # each aim frame is shown this long
READ_WINDOW_S = 2.0  # a peer is read while one of its frames was read this recently
FOUND_WINDOW_S = 1.0  # a code seen this recently is in view
OK_HOLD_S = 1.0  # every direction read this long before aim_ok
LINGER_S = 2.0  # the code stays up this long after aim_ok, so the peers see that they are read
NEED_CAMERA_PX = 4.0  # camera pixels per cell the reader needs (docs/real-laptops.md's placement table)
INSET_DIM = 0.35  # the inset is dimmed: far below the code's white ring, which the locator looks for
TEXT_SCALE = 0.4
TEXT_COLOUR = (60, 120, 135)  # BGR: the start-up overlay's dim amber
READ_COLOUR = (40, 110, 40)
FOUND_COLOUR = (30, 90, 130)


def aim_layout(width: int, height: int) -> GridLayout:
    """The aim code for a screen of width x height: cells of AIM_CELL_PX, or smaller where the code,
    with a margin of a cell, would take more than CODE_SHARE of the width or the whole height."""
    cell = min(AIM_CELL_PX, int(CODE_SHARE * width) // (AIM_COLS + 4), height // (AIM_ROWS + 4))
    if cell < 2:
        raise ConfigError(f"screen {width}x{height}: too small for the aim code and its inset")
    return GridLayout(rows=AIM_ROWS, cols=AIM_COLS, colours=AIM_COLOURS, cell_px=cell)


@dataclass
class PeerView:
    """What one node knows of one peer it aims at."""

    name: str
    index: int
    needs_back: bool = True  # this node's code must be read by the peer (false for an observer's)
    state: str = "searching"
    read_at: float | None = None  # the last time a frame of the peer was read
    found_at: float | None = None  # the last time a code of the peer (or one of unknown sender) was found
    reads_me_at: float | None = None  # the last frame read that said the peer reads this screen
    corners: np.ndarray | None = None  # its code's corners in the last image it was found in
    cell_px: float = 0.0  # camera pixels per aim cell, then
    hint: str = ""


@dataclass
class NodeAim:
    """One node's aim: its peers' views, its camera's frame times, and the outcome."""

    name: str
    index: int
    peers: dict[str, PeerView]
    capture_times: deque = field(default_factory=lambda: deque(maxlen=60))
    ok_since: float | None = None
    ok_at: float | None = None
    image: np.ndarray | None = None
    frames_read: int = 0
    frames_refused: int = 0

    def reads(self, now: float) -> int:
        """The `trusts` mask this node shows: the peers read within READ_WINDOW_S."""
        mask = 0
        for p in self.peers.values():
            if p.read_at is not None and now - p.read_at <= READ_WINDOW_S:
                mask |= 1 << p.index
        return mask

    def fps(self) -> float:
        t = self.capture_times
        return (len(t) - 1) / (t[-1] - t[0]) if len(t) > 2 and t[-1] > t[0] else 0.0


def state_of(p: PeerView, now: float) -> str:
    if p.read_at is not None and now - p.read_at <= READ_WINDOW_S:
        if p.reads_me_at is not None and now - p.reads_me_at <= READ_WINDOW_S:
            return "both"
        return "reading"
    if p.found_at is not None and now - p.found_at <= FOUND_WINDOW_S:
        return "found"
    return "searching"


def aimed(p: PeerView) -> bool:
    """This direction reads, and the other too where it must."""
    return p.state == "both" or (p.state == "reading" and not p.needs_back)


def hint_for(p: PeerView, image_size: tuple[int, int], ladder_cells: list[int], aim_cell: int, now: float) -> str:
    """What to do so that this direction reads, in words."""
    state = state_of(p, now)
    if state == "both":
        return f"{p.name}: read both ways"
    if state == "reading":
        if not p.needs_back:
            return f"{p.name}: read"
        return f"reading {p.name}; {p.name}'s camera does not read this screen yet"
    if p.corners is None or state == "searching":
        return f"no code of {p.name} in view: turn this camera toward {p.name}'s screen"
    w, h = image_size
    words = []
    x0, y0 = p.corners.min(axis=0)
    x1, y1 = p.corners.max(axis=0)
    cx, cy = (x0 + x1) / 2 / w - 0.5, (y0 + y1) / 2 / h - 0.5
    edge = min(x0, y0, w - 1 - x1, h - 1 - y1) < 0.01 * min(w, h)
    if cx > 0.2 or (edge and x1 >= w - 2):
        words.append("turn right")
    elif cx < -0.2 or (edge and x0 <= 1):
        words.append("turn left")
    if cy < -0.2 or (edge and y0 <= 1):
        words.append("tilt the lid back")
    elif cy > 0.2 or (edge and y1 >= h - 2):
        words.append("tilt the lid forward")
    densest = p.cell_px * min(ladder_cells) / aim_cell
    if (x1 - x0) > 0.9 * w:
        words.append("move further away")
    elif densest < NEED_CAMERA_PX:
        words.append(f"move closer ({densest:.1f} camera px per cell of the densest layout; it needs "
                     f"{NEED_CAMERA_PX:g})")
    if not words:
        words.append("hold still: the code is found but not read (glare? focus? a reflection?)")
    return f"{p.name}: " + ", ".join(words)


def layouts_line(cell_px: float, ladder_cells: list[int], aim_cell: int) -> str:
    """Camera pixels per cell for each cell size of the ladder, given the aim code's (`cell_px` camera
    pixels per cell of `aim_cell` screen pixels); `!` marks a size that gets fewer than NEED_CAMERA_PX."""
    parts = []
    for c in sorted(set(ladder_cells)):
        v = cell_px * c / aim_cell
        parts.append(f"{c}px:{v:.1f}{'' if v >= NEED_CAMERA_PX else '!'}")
    return "cells " + " ".join(parts)


def compose(frame: bytes, layout: GridLayout, sender: int, parity: int, node: NodeAim, lines: list[str], width: int,
            height: int) -> np.ndarray:
    """The aim screen: the code on the left, the camera inset and `lines` on the right, never over it."""
    import cv2

    code_w = layout.size_px[1] + 2 * layout.cell_px
    screen = np.zeros((height, width, 3), np.uint8)
    screen[:, :code_w] = render(frame, layout, code_w, height, sender=sender, parity=parity)
    panel_w = width - code_w - 16
    x_panel = code_w + 8
    y = 8
    if node.image is not None:
        img = node.image
        ih, iw = img.shape[:2]
        tw = panel_w
        th = max(1, round(ih * tw / iw))
        thumb = (cv2.resize(img, (tw, th), interpolation=cv2.INTER_AREA).astype(np.float32) * INSET_DIM).astype(np.uint8)
        scale = tw / iw
        for p in node.peers.values():
            if p.corners is not None and p.state != "searching":
                pts = (p.corners * scale).astype(np.int32).reshape(-1, 1, 2)
                colour = READ_COLOUR if p.state in ("reading", "both") else FOUND_COLOUR
                cv2.polylines(thumb, [pts], True, colour, 2)
        th = min(th, height // 2)
        screen[y:y + th, x_panel:x_panel + tw] = thumb[:th]
        y += th + 8
    font = cv2.FONT_HERSHEY_SIMPLEX
    for text in lines:
        for chunk in _wrap(text, panel_w, font):
            if y + 16 > height:
                return screen
            cv2.putText(screen, chunk, (x_panel, y + 12), font, TEXT_SCALE, TEXT_COLOUR, 1, cv2.LINE_AA)
            y += 16
    return screen


def _wrap(text: str, width: int, font: int) -> list[str]:
    import cv2

    out, line = [], ""
    for word in text.split():
        candidate = f"{line} {word}".strip()
        if line and cv2.getTextSize(candidate, font, TEXT_SCALE, 1)[0][0] > width:
            out.append(line)
            line = word
        else:
            line = candidate
    return out + ([line] if line else [])


class Aimer:
    """One node's aim: shows its aim code and inset, reads its camera, logs states and `aim_ok`."""

    def __init__(self, cfg: WcclConfig, name: str, medium: Any, key: RoomKey, peers: list[str], clock) -> None:
        from protocols.registry import REGISTRY

        self.cfg, self.name, self.key, self.clock = cfg, name, key, clock
        names = [n.name for n in cfg.room.nodes]
        self.index = names.index(name)
        spec = cfg.room.node(name)
        self.layout = aim_layout(cfg.screen.width, cfg.screen.height)
        self.codec = LinkCodec(self.layout, AIM_CODE_RATE)
        self.nonce = new_run_nonce()
        back = shows(cfg, name)
        self.state = NodeAim(name, self.index, {p: PeerView(p, names.index(p), back and shows(cfg, p)) for p in peers})
        self.ladder_cells = sorted({step.cell_px for step in cfg.link.steps()})
        self.log = structlog.get_logger("wccl").bind(node=name, actor="aim")
        # (the camera first: a laptop with no camera says so before a fullscreen window covers its desktop)
        self.camera = REGISTRY.create("camera", spec.camera, medium=medium, node=name, clock=clock, config=cfg)
        self.screen = REGISTRY.create("screen", spec.screen, medium=medium, node=name, clock=clock, config=cfg)
        self.model = None
        self.done = asyncio.Event()

    def lines(self, now: float) -> list[str]:
        s = self.state
        image_size = (s.image.shape[1], s.image.shape[0]) if s.image is not None else (1, 1)
        out = [f"{self.name}: aiming at {', '.join(s.peers)}"]
        best = max((p.cell_px for p in s.peers.values() if p.corners is not None), default=0.0)
        if best:
            out.append(f"camera px per cell: {best:.1f} (aim code); "
                       f"{layouts_line(best, self.ladder_cells, self.layout.cell_px)}")
        out.append(f"camera: {s.fps():.1f} fps, exposure lock: {getattr(self.camera, 'lock_state', 'not applicable')}")
        for p in s.peers.values():
            out.append(hint_for(p, image_size, self.ladder_cells, self.layout.cell_px, now))
        if s.ok_at is not None:
            out.append("aim_ok: every direction reads")
        return out

    async def show(self, until: float) -> None:
        parity = 0
        t = self.clock.now()
        while not self.done.is_set() and t < until:
            now = self.clock.now()
            message = status_message(session=self.cfg.room.session, sender=self.index, acks=(),
                                     message_bytes=self.codec.message_bytes, shown_us=int(now * 1e6),
                                     run_nonce=self.nonce, trusts=self.state.reads(now), key=self.key)
            frame = self.codec.encode_message(message)
            self.screen.show(compose(frame, self.layout, self.index, parity, self.state, self.lines(now),
                                     self.cfg.screen.width, self.cfg.screen.height))
            parity ^= 1
            t += AIM_HOLD_S
            await self.clock.sleep_until(t)
            if self.state.ok_at is not None and self.clock.now() >= self.state.ok_at + LINGER_S:
                self.done.set()

    async def watch(self, until: float) -> None:
        from wccl.imaging import reader

        self.model = reader.ColourModel(self.layout)
        while not self.done.is_set() and self.clock.now() < until:
            image, captured = await self.camera.recv()
            self.state.capture_times.append(captured)
            self.state.image = image
            for quad in reader.find_quads(image, self.layout):
                code_seen = getattr(self.camera, "code_seen", None)
                if code_seen is not None:
                    code_seen(quad.bbox, image)
                code = reader.read_quad(image, quad, self.layout, self.model)
                self._read(code, quad, captured)
            self._update(self.clock.now())

    def _read(self, code, quad, captured: float) -> None:
        s = self.state
        sender = code.sender if code is not None else None
        peer = next((p for p in s.peers.values() if p.index == sender), None)
        if peer is None and sender is None:  # a code whose sender strips did not read: the nearest peer's
            peer = min((p for p in s.peers.values() if p.corners is not None),
                       key=lambda p: float(np.abs(p.corners - quad.corners).mean()), default=None)
            if peer is None and len(s.peers) == 1:
                peer = next(iter(s.peers.values()))
        if peer is None:
            return
        peer.found_at, peer.corners = captured, quad.corners
        if code is None:
            return
        peer.cell_px = float(code.cell_px)
        if code.mixed:
            return
        try:
            f, _ = self.codec.decode(code.symbols, code.confidence, key=self.key)
        except (fec.UncorrectableFrame, FrameError):
            return
        if f.header is not None or f.session != self.cfg.room.session or f.sender != peer.index:
            s.frames_refused += 1
            return
        s.frames_read += 1
        peer.read_at = captured
        if f.trusts >> self.index & 1:
            peer.reads_me_at = captured

    def _update(self, now: float) -> None:
        s = self.state
        image_size = (s.image.shape[1], s.image.shape[0]) if s.image is not None else (1, 1)
        for p in s.peers.values():
            state = state_of(p, now)
            hint = hint_for(p, image_size, self.ladder_cells, self.layout.cell_px, now)
            if state != p.state:
                self.log.info("aim_state", peer=p.name, state=state, was=p.state, hint=hint,
                              camera_px_per_cell=round(p.cell_px, 2), fps=round(s.fps(), 1),
                              lock=getattr(self.camera, "lock_state", None))
            p.state, p.hint = state, hint
        if all(aimed(p) for p in s.peers.values()):
            if s.ok_since is None:
                s.ok_since = now
            if s.ok_at is None and now - s.ok_since >= OK_HOLD_S:
                s.ok_at = now
                best = {p.name: round(p.cell_px, 2) for p in s.peers.values()}
                self.log.info("aim_ok", peers=list(s.peers), camera_px_per_aim_cell=best, fps=round(s.fps(), 1),
                              lock=getattr(self.camera, "lock_state", None), frames_read=s.frames_read)
        else:
            s.ok_since = None

    def close(self) -> None:
        self.camera.close()
        close = getattr(self.screen, "close", None)
        if close is not None:
            close()

    def result(self) -> dict[str, Any]:
        s = self.state
        return {"ok": s.ok_at is not None, "ok_at": round(s.ok_at, 3) if s.ok_at is not None else None,
                    "peers": {p.name: {"state": p.state, "aimed": aimed(p), "hint": p.hint,
                                        "camera_px_per_aim_cell": round(p.cell_px, 2)}
                           for p in s.peers.values()},
                    "frames_read": s.frames_read, "frames_refused": s.frames_refused, "fps": round(s.fps(), 1)}


def targets(cfg: WcclConfig, node: str, peers: list[str] | None) -> list[str]:
    """The peers `node` aims at: those named; by default an observer aims at the server (it reads the
    server's screen), any other node at every other node that shows (not an observer)."""
    names = [n.name for n in cfg.room.nodes]
    showing = [n.name for n in cfg.room.nodes if "observer" not in n.roles and n.name != node]
    if peers:
        chosen = peers
    elif "observer" in cfg.room.node(node).roles:
        chosen = [n.name for n in cfg.room.nodes if "server" in n.roles] or showing
    else:
        chosen = showing
    for p in chosen:
        if p not in names:
            raise ConfigError(f"--peers {p}: not a node of the room ({', '.join(names)})")
        if p == node:
            raise ConfigError(f"--peers {p}: a node does not aim at itself")
    if not chosen:
        raise ConfigError(f"{node}: no other node shows a code: nothing to aim at")
    return chosen


def shows(cfg: WcclConfig, node: str) -> bool:
    """Whether `node` shows a code that its peers must read (an observer only reads)."""
    return "observer" not in cfg.room.node(node).roles


async def aim(cfg: WcclConfig, nodes: list[str] | None = None, peers: list[str] | None = None,
              seconds: float = 60.0) -> dict[str, Any]:
    """Aim the nodes named (default: all), each at `peers` (default: every other node); return each
    node's outcome. Stops early on Esc in a window or when every node has lingered after `aim_ok`."""
    from protocols.registry import REGISTRY
    from protocols.security import NO_KEY
    from wccl.keys import new_ephemeral, pairs, room_key
    from wccl.runtime.timebase import NodeClock

    names = [n.name for n in cfg.room.nodes]
    run = nodes or names
    for n in run:
        if n not in names:
            raise ConfigError(f"--node {n}: not a node of the room ({', '.join(names)})")
    aims = {n: targets(cfg, n, peers) for n in run}  # (bad names said before the room or a window opens)
    medium = REGISTRY.create("medium", cfg.room.medium, config=cfg)
    # (a room that pairs has no key while it aims: its aim frames carry no tensors)
    key = NO_KEY if pairs(cfg) else room_key(cfg, ephemeral=new_ephemeral() if cfg.room.medium == "simulated" else None)
    stop = asyncio.Event()
    bind_stop = getattr(medium, "bind_stop", None)
    if bind_stop is not None:
        bind_stop(stop.set)
    origin = asyncio.get_running_loop().time()
    aimers: list[Aimer] = []
    try:
        for n in run:
            aimers.append(Aimer(cfg, n, medium, key, aims[n], NodeClock(origin=origin)))
        until = seconds
        tasks = [asyncio.ensure_future(coro) for a in aimers for coro in (a.show(until), a.watch(until))]

        async def all_done() -> None:
            for a in aimers:
                await a.done.wait()

        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(all_done()),
                   asyncio.ensure_future(asyncio.gather(*tasks))]
        finished, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for t in [*pending, *tasks]:
            t.cancel()
        await asyncio.gather(*tasks, *pending, return_exceptions=True)
        for t in finished:
            if not t.cancelled() and t.exception() is not None:
                raise t.exception()
    finally:
        for a in aimers:
            a.close()
        close = getattr(medium, "close", None)
        if close is not None:
            close()
    return {"stopped": stop.is_set(), "nodes": {a.name: a.result() for a in aimers}}


def report(result: dict[str, Any]) -> list[str]:
    """A line per node aimed, and per direction that does not read, with its hint."""
    lines = []
    for name, r in result["nodes"].items():
        if r["ok"]:
            lines.append(f"{name}: aimed (aim_ok at {r['ok_at']:.1f} s, {r['fps']:.1f} fps)")
            continue
        for peer, v in r["peers"].items():
            if not v["aimed"]:
                lines.append(f"{name} <-> {peer}: {v['state']}: {v['hint']}")
    return lines


def aim_first(cfg: WcclConfig, node: str | None, seconds: float) -> int | None:
    """On real devices a run starts with aim mode (wccl.aim) until every direction of this node reads,
    or `seconds` pass (then it says which direction does not, and starts anyway: the run's own start-up
    says whether the room can train). Returns an exit status when the run must not start (interrupted,
    no display, no camera, a bad config), else None."""
    from wccl.media.capture import CameraLost
    from wccl.media.display import DeviceError
    from wccl.runtime.timebase import new_loop

    log = structlog.get_logger("wccl")
    try:
        with asyncio.Runner(loop_factory=lambda: new_loop(cfg.room.clock)) as runner:
            result = runner.run(aim(cfg, [node] if node else None, None, seconds))
    except CameraLost as e:
        print(f"wccl: aiming: {e}", file=sys.stderr)
        return 4
    except ConfigError as e:
        print(f"wccl: config error: {e}", file=sys.stderr)
        return 2
    except DeviceError as e:
        print(f"wccl: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        return 130
    if result["stopped"]:
        return 130
    if not all(r["ok"] for r in result["nodes"].values()):
        log.warning("aim_not_done", seconds=seconds, directions=report(result),
                    hint="starting anyway; `wccl aim` aims without a time limit")
    return None


def main(argv: list[str] | None = None) -> int:
    from wccl.runtime.hostos import stop_on_signals
    from wccl.runtime.logs import configure_logging
    from wccl.media.display import DeviceError
    from protocols.registry import UnknownPart
    from wccl.runtime.timebase import new_loop

    p = command_parser("wccl.aim",
                       description="Aim the laptops: each screen shows its code and what its camera sees, "
                                            "until every direction reads.")
    p.add_argument("--config", default="config.toml", help="room config file")
    p.add_argument("--node", action="append", help="aim this node (repeat for several; default: every node of "
                                                   "the room, in this process)")
    p.add_argument("--peers", help="comma-separated nodes to aim at (default: every other node)")
    p.add_argument("--seconds", type=float, default=60.0, help="give up after this long")
    p.add_argument("--log-format", choices=["auto", "console", "json"], help="override [logging] format")
    a = p.parse_args(argv)
    try:
        cfg = load_config(Path(a.config))
    except ConfigError as e:
        print(f"wccl: config error: {e}", file=sys.stderr)
        return 2
    configure_logging(a.log_format or cfg.logging.format, cfg.logging.level)
    peers = [s.strip() for s in a.peers.split(",") if s.strip()] if a.peers else None
    t0 = time.perf_counter()

    async def go() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        with stop_on_signals(loop, task.cancel):
            return await aim(cfg, a.node, peers, a.seconds)

    try:
        with asyncio.Runner(loop_factory=lambda: new_loop(cfg.room.clock)) as runner:
            result = runner.run(go())
    except (ConfigError, UnknownPart) as e:
        print(f"wccl: config error: {a.config}: {e}", file=sys.stderr)
        return 2
    except DeviceError as e:
        print(f"wccl: {e}", file=sys.stderr)
        return e.exit_status
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130
    for line in report(result):
        print(line, flush=True)
    if result["stopped"]:
        return 130
    ok = all(r["ok"] for r in result["nodes"].values())
    print(f"aim {'done' if ok else 'not done'} in {time.perf_counter() - t0:.1f} s wall", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
