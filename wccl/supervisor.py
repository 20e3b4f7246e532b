"""The supervisor of one node: builds its actors, wires them, runs and stops them.

It builds every part from config through the registry (actors as
`actor.<role>`, the camera and the screen by name), gives each actor a
bounded mailbox with a named overflow policy, routes every emitted message
to the mailboxes of the actors that consume its type, and owns the node's
only TaskGroup. An actor that raises is restarted with a fresh instance and
the same mailbox and dependencies, up to `max_restarts` within `window_s`
(config); past that the node fails with `NodeFailed`. The run ends when the
Clock's schedule is done (or on `stop`): mailboxes are closed, actors drain
and finish, sources are cancelled.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Any

import structlog

from protocols.frames import PAYLOAD_ID_BYTES
from protocols.security import Handshake
from protocols.steps import OVERHEAD as STEP_OVERHEAD, StepAssembler, StepSender
from protocols.messages import Message
from wccl.actor import Actor, ActorContext, GiveUp, Mailbox, MailboxClosed, Overflow
from wccl.config import WcclConfig
from wccl.media import parts as _parts  # noqa: F401  (registers media, cameras, screens)
from wccl.registry import REGISTRY
from wccl.config import ConfigError
from wccl.timebase import NodeClock, SyncedClock

# Mailbox sizes and overflow policies, per actor.
MAILBOXES: dict[str, tuple[int, Overflow]] = {
    "clock": (16, Overflow.BLOCK),
    "camera_reader": (1, Overflow.BLOCK),
    "frame_decoder": (8, Overflow.DROP_OLDEST),  # camera frames: stale ones are worthless
    "screen_writer": (8, Overflow.BLOCK),
    "worker": (64, Overflow.BLOCK),
    "parameter_server": (256, Overflow.BLOCK),
    "observer": (64, Overflow.BLOCK),
    "collectives": (256, Overflow.BLOCK),
    "rank_worker": (16, Overflow.BLOCK),
    "intruder": (2, Overflow.DROP_OLDEST),  # what it films: only the latest matters
}
SOURCES = ("camera_reader",)  # actors that loop on a source, not on their inbox: cancelled at the end


class ActorFailed(Exception):
    def __init__(self, actor: str, restarts: int, reason: str | None = None) -> None:
        super().__init__(reason or f"actor {actor} failed {restarts + 1} times within its restart window")
        self.actor = actor
        self.reason = reason


def _gave_up(e: BaseException) -> GiveUp | None:
    """The GiveUp in `e` (an actor's own task group may have wrapped it), if any."""
    if isinstance(e, GiveUp):
        return e
    if isinstance(e, BaseExceptionGroup):
        for sub in e.exceptions:
            found = _gave_up(sub)
            if found is not None:
                return found
    return None


class NodeFailed(Exception):
    """The node could not go on (an actor exhausted its restart policy)."""


@dataclass
class NodeResult:
    node: str
    results: dict[str, Any] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    stopped: bool = False


class NodeSupervisor:
    def __init__(self, config: WcclConfig, node: str, medium: Any, stop: asyncio.Event | None = None,
                 clock_origin: float = 0.0, monitor: Any = None, run_key: bytes | None = None) -> None:
        self.config = config
        self.spec = config.room.node(node)
        self.node = node
        self.medium = medium
        self.clock_origin = clock_origin
        self.run_key = run_key  # a simulated room's ephemeral key (wccl.keys), if it names none
        self.stop = stop or asyncio.Event()
        self.results: dict[str, Any] = {}
        self.restarts: dict[str, int] = collections.Counter()
        self.mailboxes: dict[str, Mailbox] = {}
        self.routes: dict[type[Message], list[Mailbox]] = collections.defaultdict(list)
        self.actor_classes: dict[str, type[Actor]] = {}
        self.deps: dict[str, dict[str, Any]] = {}
        self.clock: NodeClock | None = None
        self.camera: Any = None
        self._schedule_done = asyncio.Event()
        self._built = False
        # A one-way tap for the dashboard (wccl.dashboard.Hub): it is shown every message, never answers.
        self.monitor = monitor

    # ------------------------------------------------------------------ build
    def actor_names(self) -> list[str]:
        if "observer" in self.spec.roles:
            # An observer only watches: no schedule, nothing on its screen; its run ends with the Observer's.
            return ["camera_reader", "frame_decoder", "observer"]
        names = ["clock", "camera_reader", "frame_decoder", "screen_writer"]
        if "worker" in self.spec.roles:
            names.append("worker")
        if "server" in self.spec.roles:
            names.append("parameter_server")
        return names

    def _media(self) -> Any:
        """Set the node's own clock (in the simulated room: its laptop's), a SyncedClock over it, and the
        camera; return the screen. For nodes without a schedule (ranks, intruders)."""
        clock_for = getattr(self.medium, "clock_for", None)
        self.local_clock = clock_for(self.node, self.clock_origin) if clock_for else NodeClock(origin=self.clock_origin)
        self.clock = SyncedClock(self.local_clock)
        kw = dict(medium=self.medium, node=self.node, clock=self.local_clock, config=self.config)
        self.camera = REGISTRY.create("camera", self.spec.camera, **kw)
        return REGISTRY.create("screen", self.spec.screen, **kw)

    def build(self) -> None:
        """Create engines, mailboxes and routes (no I/O beyond loading data)."""
        from wccl.training.data import load_dataset  # torch: imported when a node is built
        from wccl.training.exchange import codec_from_config
        from wccl.training.replica import Replica

        cfg, room, tr = self.config, self.config.room, self.config.training
        # The node's own clock (in the simulated room: its laptop's offset and drift, which it does not
        # know), and the schedule's clock: the server's, as the Clock actor estimates it over the light.
        clock_for = getattr(self.medium, "clock_for", None)
        self.local_clock = clock_for(self.node, self.clock_origin) if clock_for else NodeClock(origin=self.clock_origin)
        self.clock = SyncedClock(self.local_clock)
        truth = None
        reading = getattr(self.medium, "true_reading", None)
        if reading is not None and "server" not in self.spec.roles:
            # For logs only: what the server's clock truly reads when this node's clock reads t.
            server_reading = reading(room.server, self.clock_origin)
            mine = self.local_clock
            truth = lambda t: server_reading(mine.to_loop_time(t))  # noqa: E731
        kw = dict(medium=self.medium, node=self.node, clock=self.local_clock, config=cfg)
        self.camera = REGISTRY.create("camera", self.spec.camera, **kw)
        if self.spec.record_to:
            from wccl.room.record import RecordingCamera

            self.camera = RecordingCamera(self.camera, self.spec.record_to, codec="x264rgb")
        screen = REGISTRY.create("screen", self.spec.screen, **kw)
        names = [n.name for n in room.nodes]
        from wccl.keys import log_key, room_key

        key = room_key(cfg, ephemeral=self.run_key)
        log_key(structlog.get_logger("wccl"), key)
        replica = None
        if "worker" in self.spec.roles or "observer" in self.spec.roles:
            # Each node loads its own copy of the data: nodes share nothing but the room.
            dataset = load_dataset(tr.dataset, seed=tr.data_seed, test_size=tr.test_size)
            replica = Replica(
                model_name=tr.model, init=tr.init, seed=tr.seed, optimizer=tr.optimizer, lr=tr.lr,
                momentum=tr.momentum, dataset=dataset,
                rank=room.workers.index(self.node) if "worker" in self.spec.roles else 0,
                world=len(room.workers),
                batch_size=tr.batch_size, data_seed=tr.data_seed, split=tr.split,
            )
        numel = replica.numel if replica is not None else None
        resume, ckpt_path, server_replica = None, None, None
        if "server" in self.spec.roles:
            from wccl.recovery import CheckpointError, checkpoint_path, load_checkpoint

            ckpt_path = checkpoint_path(cfg.recovery.checkpoint_dir, room.session, self.node)
            if cfg.recovery.resume:
                try:
                    resume = load_checkpoint(ckpt_path, room.session, key)
                except CheckpointError as e:
                    raise ConfigError(f"recovery.resume: {e}") from None
            # The server's own copy of the training state (snapshots, checkpoints): no data shard needed.
            server_replica = Replica(
                model_name=tr.model, init=tr.init, seed=tr.seed, optimizer=tr.optimizer, lr=tr.lr,
                momentum=tr.momentum, dataset=replica.dataset if replica is not None else
                load_dataset(tr.dataset, seed=tr.data_seed, test_size=tr.test_size),
                rank=0, world=len(room.workers), batch_size=tr.batch_size, data_seed=tr.data_seed)
        numel = numel or _param_count(tr)
        from protocols import snapshot as snap

        role = "server" if "server" in self.spec.roles else "worker"
        state_bytes = len(snap.encode_snapshot(snap.Snapshot(0, 0, (replica or server_replica).export_state()))) \
            if (replica or server_replica) is not None else 0
        # The layouts this node may use: the pinned one, or the ladder start-up chooses from (densest first).
        ladder = cfg.link.ladder_codecs()
        codec, hold_s = ladder[0]

        grad_codec = codec_from_config(tr)  # what gradients and averages travel as (wccl.training.exchange)

        def needs(c) -> dict[str, int]:
            k = c.frames_needed(grad_codec.encoded_size(numel) + STEP_OVERHEAD, len(names), echoes=True)
            return {"grad": k, "avg": k}

        frames_needed = needs(codec)
        # The run handshake (protocols.steps): this node's run nonce, and which of its peers' it trusts. An
        # observer shows no frame a peer could echo: it has none. A camera that replays a recording shows
        # frames of another run by definition: then no node of the room checks freshness (said loudly).
        replaying = [n.name for n in room.nodes if n.camera == "file"]
        handshake = (Handshake(names.index(self.node), len(names), window_s=room.replay_window_s)
                     if "observer" not in self.spec.roles and not replaying else None)
        if replaying:
            structlog.get_logger("wccl").warning(
                "run_handshake_off", replaying=replaying,
                reason="a camera replays a recording: frames of another run are used as this run's")
        sched = cfg.schedule
        self.deps = {
            "clock": dict(role=role, node_names=names, server=room.server, steps=tr.steps, preset=sched.preset,
                          phases=sched.resolved(), start_s=sched.start_s, hold_s=hold_s,
                          frames_needed=frames_needed, margin_frames=sched.margin_frames, work_s=sched.work_s,
                          min_guard_s=sched.min_guard_s, sync_cfg=cfg.sync,
                          resume=dict(resume[0], epoch=resume[1].epoch, applied=resume[1].applied) if resume else None,
                          truth=truth, ladder=[(h, needs(c), c.packet_size_for(len(names), True) - PAYLOAD_ID_BYTES)
                                               for c, h in ladder],
                          min_frames_ok=cfg.link.min_frames_ok),
            "camera_reader": dict(camera=self.camera),
            "frame_decoder": dict(codec=codec, session=room.session, node_names=names, assembler=StepAssembler(key),
                                  handshake=handshake,
                                  ladder=[c for c, _ in ladder], key=key, lens=cfg.camera.lens,
                                  **({"ticks": False} if "observer" in self.spec.roles else {})),
            "screen_writer": dict(screen=screen, codec=codec, screen_w=cfg.screen.width, screen_h=cfg.screen.height,
                                  hold_s=hold_s, session=room.session, sender_id=names.index(self.node),
                                  node_names=names, ladder=ladder, key=key,
                                  steps=StepSender(room.session, names.index(self.node), key,
                                                   handshake.nonce if handshake is not None else None)),
            "worker": dict(replica=replica, server=room.server, eval_every=tr.eval_every, codec=grad_codec),
            "parameter_server": dict(workers=room.workers, quorum=cfg.quorum, numel=numel, codec=grad_codec,
                                     replica=server_replica, hold_s=hold_s,
                                     snapshot_frames=codec.frames_needed(state_bytes + STEP_OVERHEAD, len(names), True),
                                     ladder=[(h, c.frames_needed(state_bytes + STEP_OVERHEAD, len(names), True))
                                             for c, h in ladder],
                                     snapshot_every=cfg.recovery.snapshot_every,
                                     checkpoint_every=cfg.recovery.checkpoint_every, checkpoint=ckpt_path,
                                     session=room.session, resume=resume, key=key),
            "observer": dict(replica=replica, server=room.server, steps=tr.steps, codec=grad_codec),
        }
        self._wire()

    def _wire(self, impl: dict[str, str] | None = None) -> None:
        """Each actor's class from the registry (`impl` overrides the node's choice), its mailbox, and
        the routes of the message types it consumes."""
        for name in self.actor_names():
            cls = REGISTRY.get(f"actor.{name}", (impl or {}).get(name, self.spec.actor_impl(name)))
            self.actor_classes[name] = cls
            capacity, overflow = MAILBOXES[name]
            box = Mailbox(f"{self.node}.{name}", capacity, overflow)
            self.mailboxes[name] = box
            for msg_type in cls.consumes:
                self.routes[msg_type].append(box)
        self._built = True

    async def _emit(self, msg: Message) -> None:
        if self.monitor is not None:
            self.monitor.on_message(self.node, msg)
        for box in self.routes.get(type(msg), ()):
            try:
                await box.put(msg)
            except MailboxClosed:
                self.results.setdefault("undelivered_at_shutdown", 0)
                self.results["undelivered_at_shutdown"] += 1

    # -------------------------------------------------------------------- run
    async def run(self) -> NodeResult:
        structlog.contextvars.bind_contextvars(node=self.node)
        log = structlog.get_logger("wccl")
        if not self._built:
            self.build()
        tasks: dict[str, asyncio.Task] = {}
        log.info("node_started", roles=self.spec.roles, actors=self.actor_names(), camera=self.spec.camera,
                 screen=self.spec.screen)
        stopped = False
        try:
            async with asyncio.TaskGroup() as tg:
                for name in self.actor_names():
                    tasks[name] = tg.create_task(self._supervise(name), name=f"{self.node}.{name}")
                done_wait = tg.create_task(self._schedule_done.wait())
                stop_wait = tg.create_task(self.stop.wait())
                await asyncio.wait({done_wait, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                stopped = not self._schedule_done.is_set()
                done_wait.cancel()
                stop_wait.cancel()
                if stopped:
                    log.warning("node_stopping", reason="stop_requested")
                    if "clock" in tasks:
                        tasks["clock"].cancel()
                for name in SOURCES:
                    if name in tasks:
                        tasks[name].cancel()
                for box in self.mailboxes.values():
                    await box.close()
        except* ActorFailed as eg:
            failed = [e for e in eg.exceptions if isinstance(e, ActorFailed)]
            log.error("node_failed", actors=[e.actor for e in failed])
            reasons = [f"{e.actor}: {e.reason}" for e in failed if e.reason]
            if reasons:
                raise NodeFailed(f"node {self.node}: " + "; ".join(reasons)) from None
            raise NodeFailed(f"node {self.node}: actor(s) {', '.join(e.actor for e in failed)} exhausted their "
                             "restart policy") from None
        finally:
            close = getattr(self.camera, "close", None)
            if close is not None:
                close()
        log.info("node_finished", stopped=stopped)
        return NodeResult(self.node, self.results, dict(self.restarts), stopped)

    async def _supervise(self, name: str) -> None:
        structlog.contextvars.bind_contextvars(node=self.node, actor=name)
        log = structlog.get_logger("wccl")
        policy = self.config.supervision.policy(name)
        crashes: collections.deque[float] = collections.deque()
        while True:
            ctx = ActorContext(node=self.node, actor=name, clock=self.clock, inbox=self.mailboxes[name],
                               emit=self._emit, results=self.results)
            actor = self.actor_classes[name](ctx, **self.deps[name])
            try:
                await actor.run()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # an actor's failure is the supervisor's business
                gave_up = _gave_up(e)
                if gave_up is not None:
                    log.error("actor_gave_up", error=str(gave_up))
                    raise ActorFailed(name, self.restarts[name], str(gave_up)) from e
                now = self.clock.now()
                crashes.append(now)
                while crashes and crashes[0] < now - policy.window_s:
                    crashes.popleft()
                if len(crashes) > policy.max_restarts:
                    log.error("actor_failed", error=repr(e), crashes=len(crashes),
                              max_restarts=policy.max_restarts, exc_info=True)
                    raise ActorFailed(name, self.restarts[name]) from e
                self.restarts[name] += 1
                log.warning("actor_restarted", error=repr(e), restarts=self.restarts[name],
                            max_restarts=policy.max_restarts, window_s=policy.window_s)
                continue
            if name in ("clock", "observer"):
                self._schedule_done.set()
            return

    def end(self) -> None:
        """End the node's run as finished, not stopped (an observer, once the room's trainers are done)."""
        self._schedule_done.set()


def _param_count(training: Any) -> int:
    from wccl.training.model import build_model, param_count

    return param_count(build_model(training.model, "default", 0))
