"""The node runtime: wires any set of actors, runs them, restarts them by policy, stops them.

A `NodeSupervisor` subclass is one assembly, one kind of node: it names its
actors (`actor_names`, each built from the registry as `actor.<name>`, the
node's config choosing the implementation) and their dependencies (`deps`,
set by `build()`, which also makes the node's clock, camera and screen:
`_media`). The runtime gives each actor a bounded mailbox with the policy
the actor declares (`Actor.mailbox`), routes every emitted message to the
mailboxes of the actors that consume its type, and owns the node's only
TaskGroup. Actors that run on the schedule (`Actor.on_schedule`) get the
synced clock, the others the node's own. An actor that raises is restarted
with a fresh instance and the same mailbox and dependencies, up to
`max_restarts` within `window_s` (`[supervision]`, per actor or by
default); past that, or when it gives up (`GiveUp`), the node fails with
`NodeFailed`. The run ends when an actor that `ends_node` returns, when the
assembly calls `end()`, or on `stop`: mailboxes are closed, actors drain
and finish, sources are cancelled.
"""

from __future__ import annotations

import asyncio
import collections
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import structlog

from protocols.messages import Message
from wccl.runtime.actor import Actor, ActorContext, GiveUp, Mailbox, MailboxClosed
from wccl.config import WcclConfig
from protocols.registry import REGISTRY
from wccl.runtime.timebase import NodeClock, SyncedClock


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


class NodeSupervisor(ABC):
    def __init__(self, config: WcclConfig, node: str, medium: Any, stop: asyncio.Event | None = None,
                 clock_origin: float = 0.0, monitor: Any = None, key: Any = None, media: tuple | None = None,
                 keep_media: bool = False) -> None:
        self.config = config
        self.spec = config.room.node(node)
        self.node = node
        self.medium = medium
        self.clock_origin = clock_origin
        self.key = key  # the room key (protocols.security.RoomKey); None: the one the room names (wccl.keys)
        # (camera, screen) of a node that ran before on this laptop (the pairing's), else made here; and
        # whether to leave the camera open at the end, for the node that comes next.
        self.media, self.keep_media = media, keep_media
        self.stop = stop or asyncio.Event()
        self.results: dict[str, Any] = {}
        self.restarts: dict[str, int] = collections.Counter()
        self.mailboxes: dict[str, Mailbox] = {}
        self.routes: dict[type[Message], list[Mailbox]] = collections.defaultdict(list)
        self.actor_classes: dict[str, type[Actor]] = {}
        self.deps: dict[str, dict[str, Any]] = {}
        self.clock: NodeClock | None = None
        self.camera: Any = None
        self.screen: Any = None
        self._schedule_done = asyncio.Event()
        self._built = False
        # A one-way tap for the dashboard (wccl.dashboard.Hub): it is shown every message, never answers.
        self.monitor = monitor

    # ------------------------------------------------------------------ build
    @abstractmethod
    def actor_names(self) -> list[str]:
        """The actors of this kind of node (the assembly's)."""

    @abstractmethod
    def build(self) -> None:
        """Make the node's parts and every actor's dependencies (`deps`), then `_wire()` (no I/O beyond
        loading data)."""

    def _media(self) -> Any:
        """Set the node's own clock (in the simulated room: its laptop's offset and drift, which it does not
        know), the schedule's SyncedClock over it, and the camera (recording what it films when the node
        says `record_to`); return the screen."""
        clock_for = getattr(self.medium, "clock_for", None)
        self.local_clock = clock_for(self.node, self.clock_origin) if clock_for else NodeClock(origin=self.clock_origin)
        self.clock = SyncedClock(self.local_clock)
        if self.media is not None:
            self.camera, self.screen = self.media
            return self.screen
        kw = dict(medium=self.medium, node=self.node, clock=self.local_clock, config=self.config)
        self.camera = REGISTRY.create("camera", self.spec.camera, **kw)
        if self.spec.record_to:
            from wccl.room.record import RecordingCamera

            self.camera = RecordingCamera(self.camera, self.spec.record_to, codec="x264rgb")
        self.screen = REGISTRY.create("screen", self.spec.screen, **kw)
        return self.screen

    def room_key(self) -> Any:
        """The node's room key: the one it was given, else the one the room names (wccl.keys.room_key)."""
        if self.key is None:
            from wccl.keys import room_key

            self.key = room_key(self.config)
        return self.key

    def _wire(self, impl: dict[str, str] | None = None) -> None:
        """Each actor's class from the registry (`impl` overrides the node's choice), its mailbox, and
        the routes of the message types it consumes (the dependencies are read when an actor starts)."""
        self.mailboxes.clear()
        self.routes.clear()
        for name in self.actor_names():
            cls = REGISTRY.get(f"actor.{name}", (impl or {}).get(name, self.spec.actor_impl(name)))
            self.actor_classes[name] = cls
            capacity, overflow = cls.mailbox
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
                    for name, cls in self.actor_classes.items():
                        if cls.on_schedule and not cls.ends_node:
                            tasks[name].cancel()  # (the schedule's ticks stop here)
                for name, cls in self.actor_classes.items():
                    if cls.source:
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
            if close is not None and not self.keep_media:
                close()
        log.info("node_finished", stopped=stopped)
        return NodeResult(self.node, self.results, dict(self.restarts), stopped)

    async def _supervise(self, name: str) -> None:
        structlog.contextvars.bind_contextvars(node=self.node, actor=name)
        log = structlog.get_logger("wccl")
        policy = self.config.supervision.policy(name)
        crashes: collections.deque[float] = collections.deque()
        while True:
            cls = self.actor_classes[name]
            ctx = ActorContext(node=self.node, actor=name, clock=self.clock if cls.on_schedule else self.local_clock,
                               inbox=self.mailboxes[name], emit=self._emit, results=self.results)
            actor = cls(ctx, **self.deps[name])
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
            if cls.ends_node:
                self._schedule_done.set()
            return

    def end(self) -> None:
        """End the node's run as finished, not stopped (its work is done, or the room's trainers are)."""
        self._schedule_done.set()
