"""A small harness to drive one actor alone: feed it messages, collect what it emits.

    async with ActorHarness(FrameDecoder, node="bob", grid=..., ...) as h:
        await h.send(capture)
        await h.settle()
        h.outputs  # the messages it emitted, in order

The actor runs in its own task with a real mailbox, a NodeClock and the
context the supervisor would give it; nothing is mocked.
"""

from __future__ import annotations

import asyncio
from typing import Any

from protocols.messages import Message
from wccl.runtime.actor import Actor, ActorContext, Mailbox, Overflow
from wccl.runtime.timebase import NodeClock, SyncedClock


class ActorHarness:
    def __init__(self, actor_cls: type[Actor], /, node: str = "node", capacity: int = 64,
                 overflow: Overflow | str = Overflow.BLOCK, clock: NodeClock | None = None, **deps: Any) -> None:
        self.actor_cls = actor_cls
        self.node = node
        self.capacity, self.overflow = capacity, overflow
        self.deps = deps
        self.clock = clock
        self.outputs: list[Message] = []
        self.results: dict[str, Any] = {}
        self.task: asyncio.Task | None = None

    async def _emit(self, msg: Message) -> None:
        self.outputs.append(msg)

    async def __aenter__(self) -> ActorHarness:
        self.clock = self.clock or SyncedClock(NodeClock(origin=0.0))
        self.inbox = Mailbox(f"{self.node}.harness", self.capacity, self.overflow)
        self.ctx = ActorContext(node=self.node, actor=self.actor_cls.__name__, clock=self.clock,
                                inbox=self.inbox, emit=self._emit, results=self.results)
        self.actor = self.actor_cls(self.ctx, **self.deps)
        self.task = asyncio.create_task(self.actor.run(), name=f"harness.{self.actor_cls.__name__}")
        return self

    async def send(self, msg: Message) -> None:
        await self.inbox.put(msg)

    async def settle(self, rounds: int = 50) -> None:
        """Let the actor work through its inbox (yields to the loop until it is empty and idle)."""
        for _ in range(rounds):
            await asyncio.sleep(0)
            if len(self.inbox) == 0:
                await asyncio.sleep(0)
                if len(self.inbox) == 0:
                    return

    def of_type(self, cls: type[Message]) -> list[Any]:
        return [m for m in self.outputs if isinstance(m, cls)]

    async def stop(self) -> None:
        """Cancel the actor (for source actors, which do not read an inbox) and wait for it."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass

    async def close(self) -> None:
        """Close the inbox and wait for the actor to finish (re-raises its error)."""
        await self.inbox.close()
        if self.task is not None:
            await self.task

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self.task is None:
            return
        if exc_type is not None:
            self.task.cancel()
            try:
                await self.task
            except (asyncio.CancelledError, Exception):
                pass
            return
        if self.task.cancelled():
            return
        if not self.task.done():
            if self.inbox.closed:
                await self.task
            else:
                await self.close()
