"""Time for a node: a virtual-time event loop and the clocks actors read.

`VirtualTimeLoop` is an asyncio selector loop whose clock only moves when
every task waits: when the loop would block until its next timer, it jumps
straight to it instead. Work done in the loop costs no virtual time, so a
simulated run takes as long as its CPU work and is reproducible. I/O still
works (signals, sockets): the loop polls the real selector without blocking
before it jumps, and blocks for real only while executor jobs are running
(their completion must not be skipped over) or when nothing is scheduled.

`NodeClock` is what actors get: `now()` and `sleep_until()` with absolute
deadlines, on the node's own timeline (the loop's time, plus an offset and a
drift that the simulated room may give a node). Actors never call
`time.time()` or `loop.time()` themselves.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


class WrappedSelector(selectors.BaseSelector):
    """A selector that delegates to the real one; subclasses decide what a blocking `select` does."""

    def __init__(self) -> None:
        self._real = selectors.DefaultSelector()

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self):  # type: ignore[override]
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()


class _JumpingSelector(WrappedSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None):  # type: ignore[override]
        events = self._real.select(0)
        if events or (timeout is not None and timeout <= 0):
            return events
        loop = self.loop
        if loop is None or loop._executor_jobs > 0 or timeout is None:
            return self._real.select(timeout)
        loop._jump(timeout)
        return []


class CountsExecutorJobs(asyncio.SelectorEventLoop):
    """A loop that counts its running executor jobs: virtual time must not skip over their completion."""

    _executor_jobs = 0

    def run_in_executor(self, executor, func, *args):  # type: ignore[override]
        self._executor_jobs += 1
        fut = super().run_in_executor(executor, func, *args)

        def _done(_: asyncio.Future) -> None:
            self._executor_jobs -= 1

        fut.add_done_callback(_done)
        return fut


class VirtualTimeLoop(CountsExecutorJobs):
    """An event loop on virtual time (seconds from 0.0 at creation)."""

    def __init__(self) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = 0.0

    def time(self) -> float:
        return self._virtual_now

    def _jump(self, seconds: float) -> None:
        self._virtual_now = max(self._virtual_now, self._virtual_now + seconds)


def new_loop(mode: str) -> asyncio.AbstractEventLoop:
    """A fresh event loop for `mode` ("virtual" or "realtime")."""
    if mode == "virtual":
        return VirtualTimeLoop()
    if mode == "realtime":
        return asyncio.new_event_loop()
    raise ValueError(f"unknown clock mode {mode!r} (expected 'virtual' or 'realtime')")


class NodeClock:
    """A node's view of time: `loop time * (1 + drift) + offset`, in seconds.

    The room knows the truth (`loop.time()`); a node only ever sees its own
    clock. With offset 0 and drift 0 every node reads the room's time.
    """

    def __init__(self, offset: float = 0.0, drift_ppm: float = 0.0, origin: float | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self.offset = offset
        self.rate = 1.0 + drift_ppm * 1e-6
        self.origin = self._loop.time() if origin is None else origin

    def now(self) -> float:
        return (self._loop.time() - self.origin) * self.rate + self.offset

    def to_loop_time(self, t: float) -> float:
        return (t - self.offset) / self.rate + self.origin

    async def sleep_until(self, t: float) -> None:
        """Return once the node clock reads at least `t` (an absolute deadline)."""
        target = self.to_loop_time(t)
        while True:
            delay = target - self._loop.time()
            if delay <= 0:
                return
            await asyncio.sleep(delay)


class SyncedClock:
    """The schedule's time on a node: the reference node's clock (the parameter server's), as this
    node estimates it from its own clock.

    `reference = local + offset + skew * (local - pivot)`. The Clock actor sets the estimate
    (`set_estimate`) as the optical clock sync refines it; until then the mapping is the
    identity and `synced` is False. On the reference node it stays the identity. `local` is the
    node's own clock: cameras stamp captures and screens stamp frames with it.
    """

    def __init__(self, local: NodeClock) -> None:
        self.local = local
        self.offset = 0.0
        self.skew = 0.0
        self.pivot = 0.0
        self.synced = False

    def set_estimate(self, offset: float, skew: float = 0.0, pivot: float | None = None) -> None:
        self.offset, self.skew = offset, skew
        self.pivot = self.local.now() if pivot is None else pivot
        self.synced = True

    def to_reference(self, t_local: float) -> float:
        return t_local + self.offset + self.skew * (t_local - self.pivot)

    def to_local(self, t_ref: float) -> float:
        return (t_ref - self.offset + self.skew * self.pivot) / (1.0 + self.skew)

    def now(self) -> float:
        return self.to_reference(self.local.now())

    async def sleep_until(self, t: float) -> None:
        """Return once the reference time (as estimated) reads at least `t`.

        The estimate may move while waiting: the deadline is checked again on waking.
        """
        while True:
            if self.now() >= t:
                return
            await self.local.sleep_until(max(self.to_local(t), self.local.now() + 1e-6))
