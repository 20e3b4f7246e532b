"""A rank's status lines for `python -m wccl.launch`, which renders them on its terminal.

The launcher gives each rank's process the write end of a pipe and names it
in WCCL_STATUS_FD; `from_env()` opens it (None without the launcher, and
then nothing here runs). One JSON object a line, `kind` first:

    joined       the rank's node is in the room; init_process_group greets its peers
    layout       the layout its node picked at start-up (from the `sight_known` and `layout_used`
                 log events): rows, cols, colours, cell_px, hold_s, reads (peer: share of its frames
                 this rank's camera reads), t (room seconds)
    ready        init_process_group returned: t (room seconds)
    collectives  the program's collectives and point-to-point messages so far: count (collectives),
                 messages (sends and receives of the world group), failed (of either), bytes (tensor
                 bytes this rank handed in or took out), t (the rank's room seconds at the last one, and
                 at shutdown its room seconds then); at most every UPDATE_S wall seconds, and once more
                 at shutdown

The rank never waits for the launcher: the pipe does not block, and a line
that does not fit is dropped (each collectives line carries totals).
The rank's logging lets this tap see the node's info events whatever the
log's level (`wccl.runtime.logs.configure_logging(taps_level="info")`).
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import threading
import time
from typing import Any

ENV = "WCCL_STATUS_FD"
UPDATE_S = 0.25  # the most often a collectives line is written (wall seconds)


class StatusChannel:
    """The write end of the launcher's status pipe for one rank (any thread may write)."""

    def __init__(self, fd: int, node: str) -> None:
        self.fd: int | None = fd
        self.node = node
        self._lock = threading.Lock()
        self._sight: dict[str, Any] | None = None
        self.count = self.messages = self.failed = self.nbytes = 0
        self.t = 0.0
        self._sent_at = 0.0
        self._dirty = False
        self._closing = False  # the rank's time at its node's close was counted
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)

    def send(self, kind: str, **fields: Any) -> None:
        line = (json.dumps({"kind": kind, **fields}, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self.fd is None:
                return
            try:
                os.write(self.fd, line)  # under PIPE_BUF: whole or not at all
            except BlockingIOError:
                pass  # the launcher is behind: drop this line
            except OSError:
                self._close_locked()  # the launcher is gone

    def tap(self, event: dict[str, Any]) -> None:
        """A structlog tap (wccl.runtime.logs.add_tap): the layout the node picked at start-up."""
        name = event.get("event")
        if name == "sight_known":
            prefix = f"{self.node}<-"
            self._sight = {"rows": event.get("rows"), "cols": event.get("cols"), "colours": event.get("colours"),
                           "cell_px": event.get("cell_px"),
                           "reads": {k[len(prefix):]: q for k, q in (event.get("edges") or {}).items()
                                     if k.startswith(prefix)}}
        elif name == "layout_used" and not event.get("reader"):  # (not a reader's ask mid-run)
            sight = self._sight or {k: event.get(k) for k in ("rows", "cols", "colours", "cell_px")}
            self.send("layout", **sight, hold_s=event.get("hold_s"), t=event.get("t"))

    def collective_done(self, nbytes: int, ok: bool, t: float) -> None:
        """Count one finished collective (any thread); write the totals at most every UPDATE_S."""
        self._done("count", nbytes, ok, t)

    def message_done(self, nbytes: int, ok: bool, t: float) -> None:
        """Count one finished send or receive of the world group (any thread), as collective_done."""
        self._done("messages", nbytes, ok, t)

    def _done(self, what: str, nbytes: int, ok: bool, t: float) -> None:
        now = time.monotonic()
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)
            self.failed += 0 if ok else 1
            self.nbytes += nbytes
            self.t = max(self.t, t)
            due = now - self._sent_at >= UPDATE_S
            if due:
                self._sent_at = now
            self._dirty = not due
        if due:
            self._send_totals()

    def flush(self, t: float | None = None) -> None:
        """Write the totals if a collective finished since they were last written, or if `t` (the rank's
        room seconds as its node closes: the first such `t` counts, not the drain after it) moves its
        time on."""
        with self._lock:
            due, self._dirty = self._dirty, False
            if t is not None and not self._closing:
                self._closing = True
                if t > self.t:
                    self.t, due = t, True
        if due:
            self._send_totals()

    def _send_totals(self) -> None:
        with self._lock:
            fields = {"count": self.count, "messages": self.messages, "failed": self.failed, "bytes": self.nbytes, "t": round(self.t, 3)}
        self.send("collectives", **fields)

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


def from_env(node: str) -> StatusChannel | None:
    """The launcher's status pipe for this rank, or None when it named none (or it is not open)."""
    raw = os.environ.pop(ENV, None)  # the program's own child processes are not the launcher's ranks
    if not raw:
        return None
    try:
        fd = int(raw)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
    except (ValueError, OSError):
        return None
    return StatusChannel(fd, node)
