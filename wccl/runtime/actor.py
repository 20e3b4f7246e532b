"""The actor base: bounded mailboxes with a named overflow policy, and `Actor`.

A `Mailbox` holds two lanes: control messages (`Message.control`), which
never wait behind data, and data messages, bounded by `capacity` with one of
the `Overflow` policies. A mailbox ends by closing: readers drain what is
left and then stop (`async for` ends); writers to a closed mailbox get
`MailboxClosed`.

An `Actor` consumes the message types in `consumes`, handles each in
`handle()`, and emits messages through its context; the supervisor decides
who receives them. Each actor declares its mailbox (`mailbox`: capacity and
overflow policy), whether it is a `source` (it loops on a camera, not on its
inbox), whether it runs `on_schedule` (the schedule's synced clock rather
than the node's own) and whether its return `ends_node`. Its `__init__` takes its dependencies and does no I/O;
`run()` loops over the inbox until it is closed or the task is cancelled.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import structlog

from protocols.messages import Message
from wccl.runtime.timebase import NodeClock


class Overflow(enum.StrEnum):
    """What a full mailbox does with a new data message."""

    BLOCK = "block"  # the sender waits for room (back-pressure)
    DROP_OLDEST = "drop_oldest"  # the oldest waiting message is dropped and counted
    DROP_NEWEST = "drop_newest"  # the new message is dropped and counted


class GiveUp(Exception):
    """An actor's failure that no restart can fix (e.g. its node cannot sync with the server): the
    supervisor fails the node at once, with this message, instead of restarting the actor."""


class MailboxClosed(Exception):
    """The mailbox was closed: no more messages will come (or be accepted)."""


class Mailbox:
    CONTROL_LIMIT = 1024

    def __init__(self, name: str, capacity: int, overflow: Overflow | str) -> None:
        if capacity < 1:
            raise ValueError(f"mailbox {name}: capacity must be >= 1")
        self.name = name
        self.capacity = capacity
        self.overflow = Overflow(overflow)
        self.dropped = 0
        self._data: deque[Message] = deque()
        self._control: deque[Message] = deque()
        self._closed = False
        self._cond = asyncio.Condition()

    def __len__(self) -> int:
        return len(self._data) + len(self._control)

    @property
    def closed(self) -> bool:
        return self._closed

    async def put(self, msg: Message) -> None:
        async with self._cond:
            if self._closed:
                raise MailboxClosed(self.name)
            if msg.control:
                if len(self._control) >= self.CONTROL_LIMIT:
                    raise RuntimeError(f"mailbox {self.name}: {self.CONTROL_LIMIT} control messages unread")
                self._control.append(msg)
            elif len(self._data) < self.capacity:
                self._data.append(msg)
            elif self.overflow is Overflow.DROP_OLDEST:
                self._data.popleft()
                self._data.append(msg)
                self.dropped += 1
            elif self.overflow is Overflow.DROP_NEWEST:
                self.dropped += 1
                return
            else:
                await self._cond.wait_for(lambda: self._closed or len(self._data) < self.capacity)
                if self._closed:
                    raise MailboxClosed(self.name)
                self._data.append(msg)
            self._cond.notify_all()

    async def get(self) -> Message:
        async with self._cond:
            await self._cond.wait_for(lambda: self._control or self._data or self._closed)
            if self._control:
                msg = self._control.popleft()
            elif self._data:
                msg = self._data.popleft()
            else:
                raise MailboxClosed(self.name)
            self._cond.notify_all()
            return msg

    async def close(self) -> None:
        async with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __aiter__(self) -> Mailbox:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.get()
        except MailboxClosed:
            raise StopAsyncIteration from None


Emit = Callable[[Message], Awaitable[None]]


@dataclass
class ActorContext:
    """What the supervisor gives an actor: who it is, its clock, inbox and outlet."""

    node: str
    actor: str
    clock: NodeClock
    inbox: Mailbox
    emit: Emit
    results: dict[str, Any] = field(default_factory=dict)


class Actor:
    """Base of every actor. Subclasses set `consumes` and override `handle` (or `run`)."""

    consumes: ClassVar[tuple[type[Message], ...]] = ()
    # Its mailbox: capacity and what a full one does with a new data message.
    mailbox: ClassVar[tuple[int, Overflow]] = (64, Overflow.BLOCK)
    # A source loops on its input, not on its inbox: it is cancelled when the node ends.
    source: ClassVar[bool] = False
    # On the schedule's clock (the server's, as synced over the light) rather than the node's own.
    on_schedule: ClassVar[bool] = False
    # Its return ends the node's run (as finished, not stopped).
    ends_node: ClassVar[bool] = False

    def __init__(self, ctx: ActorContext) -> None:
        self.ctx = ctx
        self.log = structlog.get_logger("wccl")

    @property
    def clock(self) -> NodeClock:
        return self.ctx.clock

    async def emit(self, msg: Message) -> None:
        await self.ctx.emit(msg)

    def message_fields(self, step: int = -1) -> dict[str, Any]:
        """The fields every message needs: sender, step and the node-clock time."""
        return {"sender": self.ctx.node, "step": step, "time": self.clock.now()}

    async def run(self) -> None:
        try:
            async for msg in self.ctx.inbox:
                await self.handle(msg)
        finally:
            await self.finish()

    async def run_beside(self, *background) -> None:
        """`run()`'s inbox loop with background coroutines beside it (e.g. a presenter on a frame clock);
        they are cancelled when the inbox loop ends, however it ends."""
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(c) for c in background]
            try:
                await Actor.run(self)
            finally:
                for t in tasks:
                    t.cancel()

    async def handle(self, msg: Message) -> None:  # pragma: no cover - abstract
        raise NotImplementedError(f"{type(self).__name__} does not handle {type(msg).__name__}")

    async def finish(self) -> None:
        """Called once when `run` ends, however it ends."""
