"""The dashboard's web server: a small HTTP/1.1 server on the run's own event loop.

Consumes: HTTP GET requests. Emits: the page (`/`, and its script and style
from `static/`), the run as server-sent events (`/events`: a `hello` record,
then every record of the hub's history in order, then each new one as it
comes, the cameras' latest thumbnails, and `end` when the server closes),
and the same history as one JSON document (`/state.json`).

No second process and no thread: `asyncio.start_server` on the loop the
nodes run on, so it works on the virtual-time loop too (the loop polls its
sockets before every jump). Every connection is closed after its answer
(`Connection: close`); an event stream stays open until the server closes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import structlog

from wccl.config import ConfigError
from wccl.dashboard.hub import Hub
from wccl.runtime.logs import add_tap, remove_tap
from wccl.runtime.timebase import VirtualTimeLoop

STATIC = Path(__file__).resolve().parent / "static"
POLL_S = 0.05  # how often a wall-time wait looks at its condition


async def wall_wait(done: Callable[[], bool], seconds: float) -> None:
    """Wait until `done()` or `seconds` of wall time, serving the loop's sockets meanwhile.

    On the virtual-time loop a timer would be jumped over, so the wait is made of short real sleeps
    in the executor: the loop never jumps while an executor job runs, it waits for it for real.
    """
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + seconds
    while not done() and (left := deadline - time.monotonic()) > 0:
        if isinstance(loop, VirtualTimeLoop):
            await loop.run_in_executor(None, time.sleep, min(POLL_S, left))
        else:
            await asyncio.sleep(min(POLL_S, left))


TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
MAX_REQUEST = 16 * 1024


class DashboardServer:
    def __init__(self, hub: Hub, host: str, port: int) -> None:
        self.hub = hub
        self.host, self.port = host, port
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        # The page's files, read once: only these names are served.
        self._files = {"/" + p.name: (p.read_bytes(), TYPES[p.suffix]) for p in STATIC.iterdir()
                       if p.suffix in TYPES}
        self._files["/"] = self._files["/index.html"]

    async def start(self) -> str:
        log = structlog.get_logger("wccl")
        try:
            self._server = await asyncio.start_server(self._client, self.host, self.port, limit=MAX_REQUEST)
        except OSError as e:
            if self.port == 0:
                raise ConfigError(f"dashboard.host: cannot listen on {self.host} ({e.strerror or e})") from None
            # The page is a view of the run, not part of it: a busy port must not stop the training.
            log.warning("dashboard_port_busy", port=self.port, error=e.strerror or str(e))
            try:
                self._server = await asyncio.start_server(self._client, self.host, 0, limit=MAX_REQUEST)
            except OSError as e2:
                raise ConfigError(f"dashboard.host: cannot listen on {self.host} ({e2.strerror or e2})") from None
        port = self._server.sockets[0].getsockname()[1]
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{port}/"
        add_tap(self.hub.on_event)
        log.info("dashboard_listening", url=self.url)
        return self.url

    async def wait_for_page(self, stop: asyncio.Event, seconds: float) -> None:
        """Hold the run until a page is watching (at most `seconds` of wall time, or until `stop`)."""
        if seconds <= 0 or self.hub.pages:
            return
        structlog.get_logger("wccl").info("dashboard_waiting_for_page", url=self.url, seconds=seconds)
        await wall_wait(lambda: stop.is_set() or self.hub.pages > 0, seconds)

    async def linger(self, stop: asyncio.Event, seconds: float) -> None:
        """Keep serving for `seconds` of wall time after the run, or until `stop` (Ctrl-C)."""
        if seconds <= 0 or stop.is_set():
            return
        structlog.get_logger("wccl").info("dashboard_lingering", url=self.url, seconds=seconds)
        await wall_wait(stop.is_set, seconds)

    async def close(self) -> None:
        remove_tap(self.hub.on_event)
        self.hub.close()  # open event streams send `end` and finish
        if self._server is not None:
            self._server.close()
        for _ in range(3):
            await asyncio.sleep(0)
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ HTTP
    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            path = urlsplit(target).path
            if method != "GET":
                self._answer(writer, 405, b"only GET\n", "text/plain", extra="Allow: GET\r\n")
            elif path == "/events":
                await self._events(writer)
            elif path == "/state.json":
                body = json.dumps({"hello": self.hub.hello(), "history": self.hub.history}).encode()
                self._answer(writer, 200, body, "application/json")
            elif path in self._files:
                body, ctype = self._files[path]
                self._answer(writer, 200, body, ctype)
            else:
                self._answer(writer, 404, b"not found\n", "text/plain")
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError):
            pass  # a client that went away or sent no HTTP: nothing to answer
        finally:
            writer.close()
            if task is not None:
                self._tasks.discard(task)

    @staticmethod
    def _answer(writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str, extra: str = "") -> None:
        reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                     f"Cache-Control: no-store\r\nConnection: close\r\n{extra}\r\n".encode() + body)

    @staticmethod
    def _send(writer: asyncio.StreamWriter, rec: dict[str, Any]) -> None:
        writer.write(b"data: " + json.dumps(rec, separators=(",", ":")).encode() + b"\n\n")

    async def _events(self, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
                     b"Connection: close\r\n\r\n")
        hub = self.hub
        self._send(writer, hub.hello())
        wake = hub.subscribe()
        hub.pages += 1
        sent, thumbs_sent = 0, {}
        try:
            while True:
                await wake.wait()
                wake.clear()
                new = hub.history[sent:]
                sent += len(new)
                for rec in new:
                    self._send(writer, rec)
                for node, th in list(hub.thumbs.items()):
                    if thumbs_sent.get(node) != th["v"]:
                        thumbs_sent[node] = th["v"]
                        self._send(writer, th)
                if hub.closed:
                    self._send(writer, {"event": "end"})
                    await writer.drain()
                    return
                await writer.drain()
        finally:
            hub.unsubscribe(wake)
