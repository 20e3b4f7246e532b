"""A rank's node: the actors that carry its collectives, on their own event-loop thread.

`CollectiveNode` is a node supervisor (wccl.runtime.supervisor) with the actors of
a rank: CameraReader, FrameDecoder (transfer frames), ScreenWriter (the
screen) and Collectives. It consumes `CollectiveRequest`s and hands every
`CollectiveDone` to a callback. It runs on any loop and any medium; tests
run two of them in one virtual-time loop over one simulated room.

`RankNode` runs one CollectiveNode on a thread of the rank's process, so the
program's own thread (the user's training script) stays free: `submit()` is
thread-safe and returns at once. Its event loop is the room's virtual time
(wccl.room.vtime) or real time. Virtual time stands still while the
program's thread computes (`busy`); the compute between two collectives is
charged to the node's clock at the CPU time it took (times
`collectives.compute_scale`), so a collective goes up when a laptop that
fast would have issued it. So is the compute of the futures' callbacks (a
comm hook's work between its collectives), on the completion threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import structlog

from protocols import frames, transfer
from protocols.messages import CollectiveDone, CollectiveRequest, Drain, Message
from wccl.runtime.actor import GiveUp
from wccl.config import ConfigError, WcclConfig
from protocols.registry import REGISTRY
from wccl.runtime.supervisor import NodeSupervisor


def collective_layout(cfg: WcclConfig):
    """The (codec, hold_s) a rank's collectives start in: the pinned [link] layout, or with `choose = "auto"`
    (the default) the first of the collectives' ladder (discovery then picks from `collective_ladder` the
    one the cameras read best)."""
    return collective_ladder(cfg)[0]


def collective_ladder(cfg: WcclConfig):
    """The (codec, hold_s) of each layout discovery tries at start-up, fastest first (one when pinned): the
    room's own ladder, or the collectives' default ladder less the layouts that do not fit its screen. A
    layout whose frames are too small for the room's (a big room's frames carry more ranks'
    acknowledgements) is left out of the default ladder (logged: `layouts_too_small_for_room`); in a ladder or
    layout the room file sets, or when no layout is left, it is a ConfigError that says what it lacks."""
    from protocols.discovery import MAX_LAYOUTS

    ladder = cfg.link.ladder_codecs()
    if cfg.link.choose == "auto" and not cfg.link.ladder:
        def fits(layout) -> bool:
            try:
                layout.check_fits(cfg.screen.width, cfg.screen.height)
                return True
            except ValueError:
                return False

        ladder = [(c, h) for c, h in ladder if fits(c.layout)]
    if len(ladder) > MAX_LAYOUTS:
        raise ConfigError(f"link.ladder: collectives try at most {MAX_LAYOUTS} layouts at start-up, "
                          f"the ladder has {len(ladder)}")
    ranks = len(cfg.room.ranks)
    default = cfg.link.choose == "auto" and not cfg.link.ladder
    while True:
        # A status frame shows the discovery table a page at a time where the whole does not fit: one row
        # at least. A transfer's frame holds the smallest packet the fountain code makes.
        status = (transfer.header_bytes(ranks, status=True) + transfer.CHECK_BYTES
                  + transfer.status_packet(len(ladder), 1, ranks))
        packet = transfer.header_bytes(ranks) + transfer.CHECK_BYTES + frames.MIN_PACKET
        need = max(status, packet)
        small = [(c, h) for c, h in ladder if c.message_bytes < need]
        if not small:
            return ladder
        lay = small[0][0].layout
        why = (f"a {lay.rows} x {lay.cols} layout of {lay.colours} colours holds {small[0][0].message_bytes} "
               f"bytes a frame, too few for the frames of {ranks} ranks (a status frame takes {status} bytes, "
               f"a transfer's at least {packet})")
        if not default or len(small) == len(ladder):
            raise ConfigError(f"link: {why}")
        # The default ladder serves rooms of every size: a big room tries only the layouts its frames fit.
        structlog.get_logger("wccl").info("layouts_too_small_for_room", ranks=ranks, reason=why,
                                          layouts=[f"{c.layout.rows}x{c.layout.cols}" for c, _ in small])
        ladder = [(c, h) for c, h in ladder if c.message_bytes >= need]


ROUND_HOLDS = 2  # a round's fixed cost in frame holds: shown, filmed, decoded, passed on (a ring round: 0.17 s measured at 83 ms holds)


def link_goodput(cfg: WcclConfig, codec, hold_s: float) -> float:
    """A screen's goodput read at every frame (bytes per second): a packet a hold, less the first guess
    of frames lost. Discovery scales it by the share of frames each camera actually reads."""
    return transfer.packet_size_for(codec.message_bytes, len(cfg.room.ranks)) / hold_s * (1 - cfg.collectives.loss)


LAYOUT_BYTES = 65536  # the all_reduce a rank's layout is judged by at start-up (its estimated time)


def layout_cost(world: int, edges: dict, algorithm: str, goodput: float, latency_s: float,
                nbytes: int = LAYOUT_BYTES) -> float | None:
    """What an all_reduce of `nbytes` would cost on this sight graph (edges: share of frames read) in a
    layout of this nominal `goodput` and round latency, by `algorithm` (or the cheapest when "auto"); None
    if the collectives cannot run on it (all_reduce, all_gather and a broadcast from every root must fit)."""
    from protocols.algorithms import AlgorithmError, Sight, choose

    sight = Sight(world, {e: goodput * q for e, q in edges.items()}, latency_s)
    try:
        for root in range(world):
            choose(sight, "broadcast", 4, root, algorithm)
        choose(sight, "allgather", 4, 0, algorithm)
        cls = choose(sight, "allreduce", nbytes, 0, algorithm)
    except AlgorithmError:
        return None
    return cls.estimate(sight, "allreduce", nbytes)


class StartupGate:
    """Opens once the run handshake and discovery are done (`set`), or fails with the reason start-up gave
    up (`fail`): then `wait()` raises GiveUp with it, so the actors waiting on it stop the node then and
    there."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.problem: str | None = None

    def set(self) -> None:
        self._event.set()

    def fail(self, problem: str) -> None:
        self.problem = problem
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set() and self.problem is None

    async def wait(self) -> bool:
        await self._event.wait()
        if self.problem is not None:
            raise GiveUp(self.problem)
        return True


WATCH_S = 0.5  # how often (room seconds) a rank looks at how its start-up goes


def watch_times(start: float, budget: float) -> Iterator[tuple[float, bool]]:
    """When start-up's watch wakes (node clock): every WATCH_S from `start`, and at `start + budget` itself,
    flagged True (it then says what is missing). The flag, not a comparison of times, marks the budget: a
    drifting node clock may read a hair short of a time it slept until, and a watch that waited for `now -
    start >= budget` then woke at once, again and again, and held the room's virtual time still."""
    k, said = 0, False
    while True:
        k += 1
        t = start + k * WATCH_S
        if not said and t >= start + budget:
            said = True
            yield start + budget, True
            if t <= start + budget:
                continue
        yield t, False


class CollectiveNode(NodeSupervisor):
    """A rank's node: its camera and screen, and the actors that move its collectives."""

    def __init__(self, config: WcclConfig, node: str, medium: Any, *, timeout_s: float,
                 on_done: Callable[[CollectiveDone], None], stop: asyncio.Event | None = None,
                 clock_origin: float = 0.0, key=None, announce_key: bool = True, media: tuple | None = None,
                 keep_media: bool = False) -> None:
        super().__init__(config, node, medium, stop, clock_origin, key=key, media=media, keep_media=keep_media)
        self.announce_key = announce_key  # log which key it uses (a pairing's node, keyed by nothing yet, does not)
        self.ranks = config.room.ranks
        if node not in self.ranks:
            raise ConfigError(f"node {node!r} is an observer, not a rank ({', '.join(self.ranks)})")
        if len(self.ranks) > transfer.MAX_RANKS:
            raise ConfigError(f"room.nodes: at most {transfer.MAX_RANKS} ranks, the room has {len(self.ranks)}")
        self.rank, self.world = self.ranks.index(node), len(self.ranks)
        self.timeout_s = timeout_s
        self.layout_bytes = LAYOUT_BYTES  # the all_reduce its layout is judged by (a run judges by its own tensor)
        self.on_done = on_done

    def actor_names(self) -> list[str]:
        return ["camera_reader", "frame_decoder", "screen_writer", "collectives"]

    def build(self) -> None:

        cfg, room = self.config, self.config.room
        screen = self._media()  # no schedule to sync to: a rank's collectives run on demand, on its own clock
        ladder = collective_ladder(cfg)
        codec, hold_s = ladder[0]
        col = cfg.collectives
        from protocols.security import Handshake
        from wccl.keys import log_key, new_run_nonce

        key = self.room_key()
        if self.announce_key:
            log_key(structlog.get_logger("wccl"), key)
        self.key_fingerprint = key.fingerprint
        # The run handshake: this rank's run nonce, and which of its peers' nonces it trusts.
        from protocols.algorithms import Sight
        from protocols.discovery import ProbeSchedule, SightTable

        def cost(k: int, edges: dict, ranks: int) -> float | None:  # the collectives' cost in layout k (alike everywhere)
            return layout_cost(ranks, edges, col.algorithm, link_goodput(cfg, *ladder[k]),
                               ROUND_HOLDS * ladder[k][1], self.layout_bytes)

        # While the layout is not chosen, status frames follow the probe schedule (the same on every rank).
        schedule = ProbeSchedule(tuple(h for _, h in ladder))
        # (one rank alone: nothing to discover, nobody to greet)
        sight = (SightTable(self.rank, self.world, schedule.holds, settle_s=col.discovery_s,
                            min_ok=cfg.link.min_frames_ok, cost=cost, schedule=schedule) if self.world > 1 else None)
        self.handshake = Handshake(self.rank, self.world, new_run_nonce(), sight=sight, window_s=room.replay_window_s)
        self.clock_origin_local = self.local_clock.now()  # the node's start, on its own clock
        self.greeted = StartupGate()  # the run handshake and discovery are done, or start-up gave up
        self.handshake.on_complete.append(self._greeted_at)
        self.handshake.on_complete.append(self._open_or_fail)
        self.layout_cost_of = cost
        self.ladder_words = [f"{c.layout.rows}x{c.layout.cols} cells of {c.layout.cell_px} px" for c, _ in ladder]
        if self.handshake.complete:
            self._open_or_fail()
        from actors.frame_decoder import CameraView

        self.camera_view = CameraView()  # what this camera saw (the FrameDecoder's; start-up's budget weighs it)
        self.deps = {
            "camera_reader": dict(camera=self.camera),
            "frame_decoder": dict(codec=codec, session=room.session, node_names=self.ranks,
                                  transfers=transfer.TransferAssembler(), key=key,
                                  handshake=self.handshake, lens=cfg.lens_of(self.node), ladder=[c for c, _ in ladder],
                                  holds=[h for _, h in ladder], layout_cost=cost, view=self.camera_view),
            "screen_writer": dict(screen=screen, codec=codec, screen_w=cfg.screen.width, screen_h=cfg.screen.height,
                                  hold_s=hold_s, session=room.session, rank=self.rank, world=self.world,
                                  loss=col.loss, margin_frames=col.margin_frames, key=key,
                                  run_nonce=self.handshake.nonce, ladder=ladder, probe=schedule.at, names=self.ranks),
            "collectives": dict(rank=self.rank, world=self.world, timeout_s=self.timeout_s, names=self.ranks,
                                on_drained=self.end, algorithm=col.algorithm,
                                sight=Sight.complete(1, 1.0, 0.0) if self.world == 1 else None,
                                goodput=[link_goodput(cfg, c, h) for c, h in ladder],
                                latency_s=[ROUND_HOLDS * h for _, h in ladder]),
        }
        self._wire()

    async def _emit(self, msg: Message) -> None:
        if isinstance(msg, CollectiveDone):
            self.on_done(msg)
            return
        await super()._emit(msg)

    async def submit(self, req: CollectiveRequest | Drain) -> None:
        await self.mailboxes["collectives"].put(req)

    async def run(self) -> Any:
        if not self._built:
            self.build()
        watch = asyncio.ensure_future(self._watch_start())
        try:
            return await super().run()
        finally:
            watch.cancel()

    async def _watch_start(self) -> None:
        """Start-up's budget. At `startup_budget_s` a rank not yet greeted logs what it lacks and what its
        camera saw (`room_not_connected`, an error). It goes on while start-up still moves (a frame of a peer
        newly trusted, a row that changed, a layout newly measured: `startup_deadline`); once nothing moved
        for as long as measuring a layout can take, it gives up (`startup_gave_up`, naming each direction and
        what was read of it) and the node stops."""
        if self.world == 1:
            return
        from protocols.discovery import startup_budget_s

        structlog.contextvars.bind_contextvars(node=self.node)
        log = structlog.get_logger("wccl")
        clk = self.local_clock
        start = self.clock_origin_local
        budget = startup_budget_s(self.world)
        state, self.progress_at = None, start
        cap = start + getattr(self, "greet_timeout_s", math.inf)
        for target, at_budget in watch_times(start, budget):
            if self.handshake.complete:
                return
            await clk.sleep_until(target)
            now = clk.now()
            if self.handshake.complete:
                return
            seen = self._startup_state()
            if seen != state:
                state, self.progress_at = seen, now
            if at_budget:
                log.error("room_not_connected", problem=self.greet_problem(now - start))
            deadline = self.startup_deadline(start)
            # (at the node's own greeting timeout, the actors that wait for the greeting give up themselves)
            if deadline < cap and now >= deadline:
                self._give_up(self.greet_problem(now - start))
                return

    def _open_or_fail(self) -> None:
        """The handshake is complete: open the gate, unless the room's layout carries no collectives (no layout
        of the ladder read both ways well enough, and the choice fell back to the last: a run there would
        never sync or agree). Then start-up gives up, naming each direction and what was read of it."""
        st = self.handshake.sight
        if self.greeted.problem is not None or self.greeted.is_set():
            return
        if st is None or st.carries(self.layout_cost_of):
            self.greeted.set()
            return
        names = self.ranks
        edges = ", ".join(f"{names[r]}<-{names[s]} {100 * q:.0f} %" for (r, s), q in sorted(st.graph(
            st.room_layout()).items())) or "none"
        self._give_up(f"no layout of the ladder carries the collectives between these laptops: some direction "
                      f"reads too few frames in every layout (the last layout's edges: {edges})")

    def _give_up(self, problem: str) -> None:
        """Start-up gives up: say so with what each camera read (`startup_gave_up`) and fail the gate, so the
        node stops (and a backend rank's init_process_group raises it)."""
        directions = self.directions()
        structlog.get_logger("wccl").error("startup_gave_up", problem=problem, directions=directions)
        self.greeted.fail(problem + (f". What each camera read: {'; '.join(directions)}" if directions else ""))

    def _greeted_at(self) -> None:
        """Keep how long start-up took (room seconds from the node's start to its first complete handshake)."""
        self.results.setdefault("startup_s", round(self.local_clock.now() - self.clock_origin_local, 3))

    def _startup_state(self) -> tuple:
        """What start-up has learnt so far: the peers trusted and trusting, and every row's version."""
        hs, st = self.handshake, self.handshake.sight
        rows = tuple(r.version for r in st.rows) if st is not None else ()
        return tuple(sorted(hs.trusted.items())), tuple(sorted(hs.trusted_by)), tuple(sorted(hs.seen)), rows

    def startup_deadline(self, start: float) -> float:
        """When this rank gives up its start-up (node clock). At least `startup_budget_s` from its start; then
        as long as start-up moves: a grace after the last change (`progress_at`) as long as measuring the
        ladder and settling can take. A rank that never heard of some peer and whose camera found no code it
        cannot read waits for it as for a laptop not started yet (`[room] wait_for_nodes_s`). Never past the
        node's own greeting timeout (`greet_timeout_s`)."""
        from protocols.discovery import startup_budget_s

        budget = startup_budget_s(self.world)
        cap = getattr(self, "greet_timeout_s", math.inf)
        st = self.handshake.sight
        grace = st.watch_s + st.settle_s if st is not None else budget
        deadline = max(start + budget, self.progress_at + grace)
        echo = self.handshake.echo()
        silent = [r for r in range(self.world) if r != self.rank and not echo[r]
                  and (st is None or st.members() >> r & 1)]
        if silent and not self.camera_view.unread_elsewhere():
            deadline = max(deadline, start + self.config.room.wait_for_nodes_s + budget)
        return min(deadline, start + cap)

    def directions(self) -> list[str]:
        """What each camera read of each screen so far, in words (protocols.discovery.SightTable.directions)."""
        st = self.handshake.sight
        hs = self.handshake
        heard = {r for r in hs.seen if r not in hs.trusted}
        return [] if st is None else st.directions(self.ranks, self.ladder_words, heard)

    def _join_problem(self, st) -> str:
        """What a joining rank's admission waits for (protocols.discovery: its own row, the members')."""
        names, me = self.ranks, st.rows[self.rank]
        members = [r for r in range(len(names)) if st.members() >> r & 1]
        if not st.known:
            return "the room's rows have not all reached it"
        if not me.final:
            return "it is still watching the room's screens"
        if not me.reads & st.members():
            return "its camera reads no screen of the room's"
        waiting = [names[r] for r in members if not st.rows[r].watched >> self.rank & 1]
        if waiting:
            return f"{', '.join(waiting)} have not yet watched its screen (are they in view of its screen?)"
        if not any(st.rows[r].reads >> self.rank & 1 for r in members):
            return "no camera of the room's reads its screen"
        return f"the word of {self.config.room.server} (the room's server role, which admits it) has not reached it"

    def greet_problem(self, within_s: float) -> str:
        """What the run handshake (and discovery) still lacks after `within_s` room seconds, for the error of
        a rank that cannot start; with what its own camera saw (the FrameDecoder's camera_problem and
        camera_seen)."""
        hs, names = self.handshake, self.ranks
        w = f" in {round(within_s, 1):g} s"
        st = hs.sight
        key = (f"or they use another room key (this one's fingerprint: {self.key_fingerprint}; "
               "python -m wccl.keys fingerprint)")
        if st is not None and st.joining:
            return (f"could not join{w}: the room started without it (it had not started when "
                    f"{self.config.room.server}, the room's server role, stopped waiting: [room] wait_for_nodes_s) and "
                    "has not admitted it: "
                    f"{self._join_problem(st)}")
        peers = [r for r in range(len(names)) if r != self.rank and (st is None or st.members() >> r & 1)]
        silent = [names[r] for r in peers if not hs.echo()[r]]
        blind = self.results.get("camera_problem")  # (the FrameDecoder's: why its camera reads nothing)
        seen = self.results.get("camera_seen")  # (and what it saw: whose screens it reads, what else)
        if silent:
            return (f"never heard of {', '.join(silent)}{w}: no camera in the room reads their screens (or they "
                    f"did not start), {key}" + (f"; what this rank saw: {seen}" if seen else ""))
        if st is not None and not st.known:
            unread = [names[r] for r in peers if r not in hs.trusted]
            if not st.rows[self.rank].reads:
                heard = [names[r] for r in peers if r in hs.seen and r not in hs.trusted]
                if heard and not hs.trusted:
                    # Their frames arrive, but none echoes this rank's run nonce: they have not read its screen
                    # (a rank that started again is greeted by ranks that read it, in their status frames).
                    return (f"was never greeted back{w}: it reads {', '.join(heard)}, but no frame of theirs echoes "
                            f"its run nonce (their cameras do not read its screen), {key}")
                return (f"reads no screen{w}: {blind}" if blind else
                        f"reads no screen{w}: its camera decoded no frame of this run from {', '.join(unread)} ({key})")
            waiting = [names[r] for r in range(len(names)) if not st.rows[r].final]
            return (f"could not agree on which camera reads which screen{w}: no final word yet from "
                    f"{', '.join(waiting)} (every rank must read some screen, and their words travel "
                    "from camera to camera)")
        current = hs.current()
        if st is not None:
            missing = [names[r] for r in peers if (st.reads(self.rank, r) and r not in current)
                       or (st.reads(r, self.rank) and not hs.trusts_me(r))]
        else:
            missing = [names[r] for r in peers if r not in current or r not in hs.trusted_by]
        again = [names[r] for r in sorted(set(hs.newer) | set(hs.renewed))]
        if again:
            return (f"could not greet {', '.join(again)} again{w} after they started again (a new run nonce; "
                    f"still waiting for {', '.join(missing) or 'their new rows'}): their screens are not in "
                    f"view of this camera (or this one of theirs), {key}")
        return (f"could not greet {', '.join(missing)}{w}: their screens are not in view of this camera (or this "
                f"one of theirs), {key}")


def _thread_cpu_clock(ident: int) -> Callable[[], float]:
    """CPU seconds thread `ident` has used so far (readable from any thread)."""
    try:
        clk = time.pthread_getcpuclockid(ident)
    except (AttributeError, OSError):  # not on this platform: charge wall time instead
        return time.perf_counter
    return lambda: time.clock_gettime(clk)


COMPLETION_THREADS = 8  # futures completed at once (each may run a hook that waits for another collective)


class _Watched:
    """A thread, and whether it ran since last asked (CPU time advanced) or is running now."""

    def __init__(self, thread: threading.Thread) -> None:
        self.thread = thread
        self.cpu = _thread_cpu_clock(thread.ident)
        self.stat = Path(f"/proc/self/task/{thread.native_id}/stat")
        self.last = self.cpu()

    def busy(self) -> bool:
        if not self.thread.is_alive():
            return False
        cpu = self.cpu()
        advanced, self.last = cpu - self.last > 2e-4, cpu
        if advanced:
            return True
        try:
            return self.stat.read_text().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            return False


class RankNode:
    """One rank's node on its own thread; the rank's program submits collectives from any thread."""

    def __init__(self, config: WcclConfig, node: str, *, timeout_s: float, room_socket: str | None = None) -> None:
        self.config = config
        self.node = node
        self.timeout_s = timeout_s
        self.room_socket = room_socket
        self.log = structlog.get_logger("wccl")
        self._program = threading.current_thread()
        self._program_cpu = _thread_cpu_clock(self._program.ident)
        # Threads whose running keeps virtual time still: the program's, and those that complete
        # futures (a comm hook's callbacks run there, and may block waiting for the next collective:
        # never on the node's own thread, which must stay free to carry that collective).
        self._watched: list[_Watched] = [_Watched(self._program)]
        self._watch_lock = threading.Lock()
        self._completions = ThreadPoolExecutor(max_workers=COMPLETION_THREADS,
                                               thread_name_prefix=f"wccl-{node}-done",
                                               initializer=self._watch_this_thread)
        self._handles = itertools.count(1)
        self._callbacks: dict[int, Callable[[CollectiveDone], None]] = {}
        self._ready = threading.Event()
        self._greeted = threading.Event()  # the run handshake is complete
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sup: CollectiveNode | None = None
        self.result: Any = None
        self._local = threading.local()  # on a completion thread: (loop time, CPU time) its callback began
        self._mark_lock = threading.Lock()
        self._t_mark = 0.0  # loop time up to which the program's compute has been charged
        self._cpu_mark = 0.0  # the program thread's CPU time at that mark
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=f"wccl-{self.node}", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            # (the node's thread ended before its node ran, e.g. Esc while it paired: let it close its window and
            # camera first, or the program would exit while they close)
            self._thread.join()
            raise self._error

    def _main(self) -> None:
        try:
            loop, medium = self._make_loop()
        except BaseException as e:  # noqa: BLE001 - handed to the program's thread
            self._error = e
            self._ready.set()
            return
        self.loop = loop
        asyncio.set_event_loop(loop)
        try:
            self.result = loop.run_until_complete(self._run(medium))
            if self.result.stopped:  # Esc in the rank's window: no collective can be done any more
                self._error = RuntimeError("its window was closed (Esc)")
                self.log.warning("rank_node_stopped", node=self.node, reason="window_closed")
                self._fail_all(f"the rank's node stopped: {self._error}")
        except BaseException as e:  # noqa: BLE001
            self._error = e
            self.log.error("rank_node_failed", error=str(e))
            self._fail_all(f"the rank's node stopped: {e}")
        finally:
            self._ready.set()
            close = getattr(medium, "close", None)
            if close is not None:
                close()
            loop.close()

    def _make_loop(self) -> tuple[asyncio.AbstractEventLoop, Any]:
        cfg = self.config
        if cfg.room.medium == "simulated":
            if not self.room_socket:
                raise ConfigError("the simulated room runs as its own process: start the rank with "
                                  "`python -m wccl.launch` (it sets WCCL_ROOM), or run the room with "
                                  "`python -m wccl.room.serve` and set WCCL_ROOM to its socket")
            from wccl.room import remote

            medium, loop = remote.connect(self.room_socket, self.node, cfg.room.clock, busy=self._program_busy)
            return loop, medium
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        medium = REGISTRY.create("medium", cfg.room.medium, config=cfg)
        return loop, medium

    async def _run(self, medium: Any) -> Any:
        loop = asyncio.get_running_loop()
        structlog.contextvars.bind_contextvars(node=self.node)
        origin = 0.0 if self.config.room.clock == "virtual" else loop.time()
        stop = asyncio.Event()
        bind_stop = getattr(medium, "bind_stop", None)  # a real window's Esc stops the node, as in wccl.node
        if bind_stop is not None:
            bind_stop(stop.set)
        key, media = None, None  # the key the room names; the node's own camera and screen
        from wccl.keys import pairs

        if pairs(self.config):  # (a room with no key: its ranks pair over the light first)
            from wccl.distributed.pairing import pair, people_for

            from protocols.pairing import PairingError
            from wccl.runtime.supervisor import NodeResult

            people = people_for(self.config, self.config.room.ranks, stop, self.timeout_s)
            try:
                key, media = await pair(self.config, self.node, medium, people, CollectiveNode, clock_origin=origin,
                                        timeout_s=self.timeout_s, stop=stop)
            except PairingError:
                if stop.is_set():  # (Esc in its window while it paired: stopped, as a node is)
                    return NodeResult(self.node, stopped=True)
                raise
        self.sup = CollectiveNode(self.config, self.node, medium, timeout_s=self.timeout_s,
                                  on_done=self._done, clock_origin=origin, key=key, stop=stop, media=media)
        self.sup.build()
        if key is not None:
            from wccl.distributed.pairing import keep_once_greeted

            keep_once_greeted(self.sup, self.config, key)
        self.sup.handshake.on_complete.append(self._greeted.set)
        self._t_mark, self._cpu_mark = loop.time(), self._program_cpu()
        self._ready.set()
        return await self.sup.run()

    def wait_handshake(self, timeout_s: float) -> None:
        """Block until every peer and this rank trust each other's run nonce (protocols.security), as torch's
        own backends rendezvous in init_process_group; raise with what is missing after `timeout_s`
        (seconds of the room's time)."""
        sup = self.sup
        while not sup.handshake.complete:
            # Block, not poll: a program thread that keeps waking up counts as computing, and virtual
            # time stands still while it does.
            self._greeted.wait(0.05)
            if self._error is not None:
                raise RuntimeError(f"wccl: rank {self.node}'s node stopped: {self._error}")
            if sup.greeted.problem is not None:
                raise RuntimeError(f"wccl: rank {self.node} {sup.greeted.problem}")
            if self.loop.time() - self._t_mark > timeout_s:
                raise RuntimeError(f"wccl: rank {self.node} {self.sup.greet_problem(timeout_s)}")
        if sup.greeted.problem is not None:  # (complete, but its layout carries no collectives)
            raise RuntimeError(f"wccl: rank {self.node} {sup.greeted.problem}")
        self._t_mark = max(self._t_mark, self.loop.time())  # waiting for the handshake is not compute
        self._cpu_mark = self._program_cpu()

    def close(self) -> None:
        """Let peers read what they still need (until `drain_s`), then stop the node and its thread."""
        if self._closed or self._thread is None:
            return
        self._closed = True
        if self._thread.is_alive() and self.loop is not None and self.sup is not None:
            drain = Drain(sender=self.node, time=0.0, timeout_s=self.config.collectives.drain_s)
            sup = self.sup
            try:  # the coroutine is made on the loop's own thread: never left unawaited if the loop is closing
                self.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(sup.submit(drain)))
            except RuntimeError:
                pass  # the loop already closed
        self._thread.join()
        self._completions.shutdown(wait=False)

    # ------------------------------------------------------------------ program side
    def _watch_this_thread(self) -> None:
        with self._watch_lock:
            self._watched.append(_Watched(threading.current_thread()))

    def _program_busy(self) -> bool:
        """Is the rank's program (or a hook's callback) computing, so virtual time must stand still?"""
        with self._watch_lock:
            watched = list(self._watched)
        return any(w.busy() for w in watched)

    def submit(self, *, seq: int, op: str, dtype: str, numel: int, inputs: tuple[bytes, ...], root: int,
               callback: Callable[[CollectiveDone], None], reduce_op: str = "sum", tag: int = 0) -> None:
        """Issue a collective (or a send or recv: protocols.messages.P2P_OPS); `callback(CollectiveDone)` runs
        on one of the node's completion threads (a pool beside the node's loop) when it ends."""
        if self._error is not None or self.loop is None or self._closed:
            raise RuntimeError(f"wccl: rank {self.node}'s node is not running"
                               + (f": {self._error}" if self._error else ""))
        handle = next(self._handles)
        self._callbacks[handle] = callback
        loop = self.loop
        started = getattr(self._local, "started", None)
        if threading.current_thread() is self._program:
            cpu = self._program_cpu()
            charge = (cpu - self._cpu_mark) * self.config.collectives.compute_scale
            with self._mark_lock:
                self._t_mark, self._cpu_mark = self._t_mark + charge, cpu
                ready_loop = self._t_mark
        elif started is not None:  # a comm hook's callback on a completion thread: charged what it computed
            t_loop, cpu0 = started
            ready_loop = t_loop + (time.thread_time() - cpu0) * self.config.collectives.compute_scale
        else:
            ready_loop = loop.time()

        async def _put() -> None:
            clock = self.sup.local_clock
            ready = (max(ready_loop, loop.time()) - clock.origin) * clock.rate + clock.offset
            await self.sup.submit(CollectiveRequest(sender=self.node, time=clock.now(), seq=seq, op=op, dtype=dtype,
                                                    numel=numel, inputs=inputs, root=root, ready_at=ready,
                                                    reduce_op=reduce_op, tag=tag,
                                                    handle=handle))

        asyncio.run_coroutine_threadsafe(_put(), loop)

    def _done(self, msg: CollectiveDone) -> None:
        if not self._program_busy():
            # The program waited for this: its compute resumes from now.
            with self._mark_lock:
                self._t_mark = max(self._t_mark, self.loop.time())
                self._cpu_mark = self._program_cpu()
        cb = self._callbacks.pop(msg.handle, None)
        if cb is not None:
            self._completions.submit(self._complete, cb, msg, self.loop.time())

    def _complete(self, cb: Callable[[CollectiveDone], None], msg: CollectiveDone, t_loop: float) -> None:
        """Complete one collective's future on a completion thread, at loop time `t_loop` (room time stands
        still while this thread computes). What its callbacks compute (the outputs written, a comm hook's
        work, such as PowerSGD's orthogonalisation) is charged like the program's own compute: a collective
        a callback issues goes up that much later, and the program, waiting for the callbacks' result,
        resumes that much later (as if on the same core). Not charged: what a callback computes after it
        blocked on another collective, or while the program has already resumed (docs/limits.md)."""
        t_loop = max(t_loop, self.loop.time())  # (it may have waited in the pool's queue)
        cpu0 = time.thread_time()
        self._local.started = (t_loop, cpu0)
        try:
            cb(msg)
        finally:
            self._local.started = None
            charge = (time.thread_time() - cpu0) * self.config.collectives.compute_scale
            with self._mark_lock:
                self._t_mark = max(self._t_mark, t_loop + charge)

    def _fail_all(self, error: str) -> None:
        for handle in list(self._callbacks):
            cb = self._callbacks.pop(handle)
            cb(CollectiveDone(sender=self.node, time=0.0, seq=-1, handle=handle, error=error))

    @contextlib.contextmanager
    def uncharged(self) -> Iterator[None]:
        """Compute on the program thread that the rank's clock does not pay for (an observer's work,
        e.g. evaluating on the test set). Room time stands still meanwhile, as for any compute."""
        if threading.current_thread() is not self._program:
            raise RuntimeError("wccl: uncharged() is for the rank's program thread")
        cpu0 = self._program_cpu()
        try:
            yield
        finally:
            self._cpu_mark += self._program_cpu() - cpu0

    def sim_seconds(self) -> float:
        """The rank's time so far (seconds of the room's time, its program's compute charged)."""
        if self.loop is None:
            return 0.0
        charge = (self._program_cpu() - self._cpu_mark) * self.config.collectives.compute_scale
        return max(self.loop.time(), self._t_mark + charge) - (0.0 if self.config.room.clock == "virtual"
                                                                else self.sup.clock_origin)
