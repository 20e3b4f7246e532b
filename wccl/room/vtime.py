"""Virtual time across processes: the event loop of a node process whose room runs elsewhere.

`RoomTimeLoop` is `wccl.runtime.timebase.VirtualTimeLoop` with the decision to jump
moved to the room (wccl/room/serve.py): when the loop would block until its
next timer, it tells the room `idle(deadline)` and waits for the room's
`now T`. The room answers once every node process waits, with the earliest
deadline among them, so all processes share one virtual time T (seconds from
0.0) that only moves when every one of them waits; work done in any process
costs no virtual time.

While it waits for the room, the loop still watches its own file
descriptors (its self-pipe: `call_soon_threadsafe` from another thread,
signals, sockets): when one is ready it withdraws its idle (`busy`), reads the
room's answer to the pending idle (every idle gets exactly one answer) and
runs the ready callbacks at the time the room gave. It blocks for real,
without telling the room it waits, while executor jobs run (counted as
VirtualTimeLoop does) or while `busy()` (a callable of the owner, e.g. "the
training thread computes") returns True.

Consumes: the room's `now T` answers over a `RoomClient` (wccl/room/remote.py).
Emits: `idle` and `busy` messages to the room; `time()` for the node's tasks.
"""

from __future__ import annotations

import selectors
from typing import Callable, Protocol

from wccl.runtime.timebase import CountsExecutorJobs, WrappedSelector

BUSY_POLL_S = 0.002  # while busy(): how long each real wait may block before busy() is asked again


class TimeClient(Protocol):
    """What the loop needs of the connection to the room (RoomClient)."""

    now: float
    closed: bool

    def fileno(self) -> int: ...
    def send_idle(self, deadline: float | None) -> None: ...
    def send_busy(self) -> None: ...
    def recv_now(self) -> float: ...
    def settle(self) -> float: ...


_ROOM = object()  # selector data of the room's socket while the loop waits for the room


class _RoomSelector(WrappedSelector):
    def __init__(self, client: TimeClient, busy: Callable[[], bool] | None) -> None:
        super().__init__()
        self._client = client
        self._busy = busy
        self.loop: RoomTimeLoop | None = None

    def select(self, timeout: float | None = None):  # type: ignore[override]
        events = self._real.select(0)
        if events or (timeout is not None and timeout <= 0):
            return events
        loop, client = self.loop, self._client
        if loop is None:
            return self._real.select(timeout)
        if client.closed:
            # This process has left the room: its time is its own, as in VirtualTimeLoop.
            if loop._executor_jobs > 0 or timeout is None:
                return self._real.select(timeout)
            client.now = max(client.now, client.now + timeout)
            return []
        if self._busy is not None and self._busy():
            return self._real.select(BUSY_POLL_S if timeout is None else min(timeout, BUSY_POLL_S))
        if loop._executor_jobs > 0:
            return self._real.select(timeout)  # an executor job's end wakes the loop (self-pipe)
        return self._wait_for_room(None if timeout is None else client.now + timeout)

    def _wait_for_room(self, deadline: float | None):
        client = self._client
        client.settle()
        client.send_idle(deadline)
        fd = client.fileno()
        self._real.register(fd, selectors.EVENT_READ, _ROOM)
        try:
            while True:
                ready = self._real.select(None)
                room = False
                events = []
                for key, mask in ready:
                    if key.data is _ROOM:
                        room = True
                    else:
                        events.append((key, mask))
                if room or events:
                    break
        finally:
            self._real.unregister(fd)
        if not room:
            client.send_busy()  # something to do here: the room answers the pending idle at once
        client.recv_now()
        return events


class RoomTimeLoop(CountsExecutorJobs):
    """An event loop on the room's virtual time, shared by every node process of the room.

    `client`: a connected RoomClient (after its hello), or a zero-argument callable returning one.
    `busy`: optional; while it returns True the room's time does not move (the loop polls it every
    2 ms of real time when it would otherwise wait). When it turns True from another thread while the
    loop may be waiting, wake the loop (`loop.call_soon_threadsafe(lambda: None)`) so the loop withdraws
    its idle. All requests to the room must come from the loop's thread.
    """

    def __init__(self, client: TimeClient | Callable[[], TimeClient], busy: Callable[[], bool] | None = None) -> None:
        if not hasattr(client, "send_idle"):
            client = client()  # a factory
        self.room_client = client
        selector = _RoomSelector(client, busy)
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self.room_client.now


__all__ = ["RoomTimeLoop", "BUSY_POLL_S"]
