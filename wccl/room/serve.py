"""The simulated room as its own process, one node process per laptop around it.

    python -m wccl.room.serve --config FILE --socket PATH [--clock virtual|realtime]
                              [--nodes a,b,...] [--authkey-env NAME] [--supervised]

`RoomServer` owns a `SimulatedRoom` (wccl/room/room.py) and serves it on a
local Unix-domain socket (never TCP/IP) to node processes, which reach it
through `RemoteRoom` (wccl/room/remote.py; the wire protocol is described
there). Only pixels cross: screen images come in, camera images go out. The
room keeps each camera's capture schedule (jitter, drops, stalls, missed
slots, delivery delay) exactly as `RoomCamera` does in process; a node sleeps
on its own loop until a capture's delivery and then asks for its image, so
the captures are byte-identical to an in-process run with the same shows.

Virtual time (`--clock virtual`, the config's room.clock by default): the
room keeps the one time T of all processes (seconds from 0.0). Each
connected node is running or idle with a deadline (wccl/room/vtime.py
sends `idle`); once every node named by `--nodes` (default: all of the room
file's) has said hello and every connected node is idle, T moves to the
earliest deadline and every idle node is told `now T`. When no node has a
deadline the room is deadlocked: it logs `room_deadlock` and exits 1.
Realtime: no time protocol; nodes run on `time.monotonic()` and the room
never reads a clock (it only hands out its start as the nodes' origin).

Consumes: the room config; each node's hello, shows, camera requests and
idle/busy messages. Emits: hello answers (clock offset and drift, camera
rate, profile, screen size, origin), camera slots and images, `now T`;
logs `room_ready`, `room_client_joined`, `room_time_started`,
`room_client_left`, `room_request_failed`, `room_deadlock`, `room_empty`,
`room_stopped`. `room_client_left` is a warning when a node leaves without
saying goodbye, except under `--supervised` (python -m wccl.launch, which
reports each rank's exit itself and stops the ranks it tears down): info.

Exit status: 0 when every node has left (after at least one came) or on
SIGTERM/SIGINT; 1 on a deadlock; 2 on a bad config or command line (one line
on stderr).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import selectors
import signal
import socket
import stat
import struct
import sys
import time
from pathlib import Path

import numpy as np
import structlog

from wccl.room.remote import (
    AUTHKEY_ENV, BUSY, BYE, CAM_CLOSE, CAM_OPEN, F_CAM, F_CAM_ID, F_IDLE, F_NEXT, F_NOW, F_RENDER, F_SHOW,
    HELLO, IDLE, MAGIC, NEXT, NONCE_BYTES, R_ERROR, R_HELLO, R_IMAGE, R_NEXT, R_NOW, RENDER, SHOW, VERSION,
    Channel, ProtocolError, image_fixed,
)
from wccl.room.room import SimulatedRoom
from wccl.room.timing import CaptureSchedule, capture_rng
from wccl.cli import command_parser

AUTH_TIMEOUT_S = 5.0


class _Camera:
    """One camera's schedule in the room: `RoomCamera.recv` split into `next` (the slot) and `render`."""

    def __init__(self, room: SimulatedRoom, node: str, now: float) -> None:
        self.room, self.node = room, node
        room.camera_started(now)
        fps = room.camera_fps(node)
        self.period = 1.0 / fps
        self.index = room.nodes.index(node)
        phase = (self.index * 0.37 + room.seed * 0.11) % 1.0
        self.start = now + phase * self.period
        self.k = 0
        self.missed = 0
        self.dropped = 0
        self.schedule = None
        self._pending: tuple[int, np.random.Generator] | None = None
        if not room.exact:
            self.schedule = CaptureSchedule(room.params[node], fps, self.start, room._seed_seq, self.index)

    def next(self, now: float) -> tuple[int, float, float]:
        """(k, start of capture k, its delivery) for a camera asked at true time `now`."""
        if self.schedule is None:
            late = int((now - self.start) / self.period) - self.k
            if late > 0:
                self.missed += late
                self.k += late
            t = self.start + self.k * self.period
            self.k += 1
            return self.k - 1, t, t
        sched = self.schedule
        wait = sched.deliver_delay()
        while True:
            self.k, late = sched.slot(self.k, now, self.room)
            self.missed += late
            k = self.k
            self.k += 1
            t, delivered, rng = sched.draw(k)
            if not delivered:
                self.dropped += 1
                continue
            self._pending = (k, rng)
            return k, t, t + wait

    def render(self, k: int, t: float) -> np.ndarray:
        if self.schedule is None:
            return self.room._view(self.node, t)
        if self._pending is not None and self._pending[0] == k:
            rng = self._pending[1]
        else:  # not the slot just handed out: the generator of capture k, past its timing draws
            rng = capture_rng(self.room._seed_seq, self.index, k)
            rng.standard_normal(), rng.random()
        self._pending = None
        return self.room._render(self.node, t, rng, stream=True)


class _Client:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.chan = Channel(sock)
        self.nonce = os.urandom(NONCE_BYTES)
        self.authed = False
        self.alive = True
        self.node: str | None = None
        self.idle = False
        self.deadline: float | None = None
        self.cams: dict[int, _Camera] = {}
        self.error: tuple[str, str] | None = None  # the failure of a request without a reply, for the next reply


class _Leave(Exception):
    pass


class RoomServer:
    """Serves `room` on the Unix socket `socket_path`; `serve()` returns the exit status."""

    def __init__(self, room: SimulatedRoom, socket_path: str | Path, mode: str = "virtual",
                 nodes: list[str] | None = None, authkey: bytes = b"", deadlock_grace_s: float = 0.5,
                 supervised: bool = False) -> None:
        if mode not in ("virtual", "realtime"):
            raise ValueError(f"unknown clock mode {mode!r} (expected 'virtual' or 'realtime')")
        expected = list(room.nodes if nodes is None else nodes)
        unknown = [n for n in expected if n not in room.nodes]
        if unknown:
            raise ValueError(f"--nodes: {', '.join(unknown)} not in the room ({', '.join(room.nodes)})")
        self.room = room
        self.socket_path = str(socket_path)
        self.mode = mode
        self.expected = set(expected)
        self.supervised = supervised  # a launcher reports the nodes' exits: a node gone without bye is info
        self.authkey = authkey
        self.grace = deadlock_grace_s
        self.now = 0.0  # the room's virtual time
        self.origin = 0.0
        self.started = False  # virtual time moves once every expected node has said hello
        self._joined: set[str] = set()
        self._clients: list[_Client] = []
        self._sel = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._deadlock_since: float | None = None
        self.log = structlog.get_logger("wccl.room.serve")

    # ---- the socket ----------------------------------------------------------------------------

    def listen(self) -> None:
        """Create the listening socket (its file appears now); log `room_ready`."""
        path = self.socket_path
        if os.path.lexists(path):
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise ValueError(f"--socket {path}: exists and is not a socket")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # a stale socket of a room that died
            else:
                raise ValueError(f"--socket {path}: another room is serving there")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # only this user may connect
        try:
            sock.bind(path)
        except OSError as e:
            sock.close()
            raise ValueError(f"--socket {path}: cannot bind ({e})") from None
        finally:
            os.umask(old)
        sock.listen(64)
        sock.setblocking(False)
        self._listener = sock
        self._sel.register(sock, selectors.EVENT_READ, None)
        if self.mode == "realtime":
            self.origin = time.monotonic()
        self.log.info("room_ready", socket=path, clock=self.mode, profile=self.room.profile,
                      nodes=sorted(self.expected))

    def close(self) -> None:
        """Close every connection and the listener, and remove the socket file (idempotent)."""
        for c in list(self._clients):
            self._drop(c, "room_closed", quiet=True)
        if self._listener is not None:
            try:
                self._sel.unregister(self._listener)
            except (KeyError, ValueError):
                pass
            self._listener.close()
            self._listener = None
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
        self._sel.close()

    # ---- the loop ------------------------------------------------------------------------------

    def serve(self) -> int:
        if self._listener is None:
            self.listen()
        while True:
            timeout = None
            if self._deadlock_since is not None:
                timeout = max(0.0, self._deadlock_since + self.grace - time.monotonic())
            for key, _ in self._sel.select(timeout):
                if key.data is None:
                    self._accept()
                elif key.data.alive:
                    self._service(key.data)
            # Empty once every expected node came and went (a node still starting up may yet come).
            if self.expected <= self._joined and not any(c.node for c in self._clients):
                self.log.info("room_empty", **self._t())
                return 0
            self._advance()
            if self._deadlock_since is not None and time.monotonic() - self._deadlock_since >= self.grace:
                self.log.error("room_deadlock", nodes=sorted(c.node for c in self._clients if c.node),
                               **self._t())
                return 1

    def _t(self) -> dict:
        return {"t": round(self.now, 6)} if self.mode == "virtual" else {}

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(True)
        sock.settimeout(AUTH_TIMEOUT_S)
        c = _Client(sock)
        try:
            sock.sendall(MAGIC + c.nonce)
        except OSError:
            sock.close()
            return
        self._clients.append(c)
        self._sel.register(sock, selectors.EVENT_READ, c)

    def _service(self, c: _Client) -> None:
        """Handle what `c` sent: every complete message already read, in order."""
        try:
            if not c.authed:
                mac = c.chan.read_exact(32)
                want = hmac.new(self.authkey, c.nonce, hashlib.sha256).digest()
                if not hmac.compare_digest(mac, want):
                    self.log.warning("room_auth_failed")
                    self._drop(c, "auth", quiet=True)
                    return
                c.sock.sendall(b"\x01")
                c.sock.settimeout(None)
                c.authed = True
                if not c.chan.buffered():
                    return
            while True:
                op, fixed, payload = c.chan.recv()
                self._handle(c, op, fixed, payload)
                if not c.alive or not c.chan.buffered():
                    return
        except _Leave:
            self._drop(c, "bye")
        except (EOFError, OSError) as e:
            self._drop(c, "closed" if isinstance(e, EOFError) else f"error: {e}")
        except (ProtocolError, struct.error, ValueError, KeyError, TypeError) as e:  # a malformed message
            self.log.warning("room_protocol_error", node=c.node, error=str(e))
            self._drop(c, f"protocol error: {e}")
        except Exception as e:  # noqa: BLE001 - one bad request must not take the room down
            self.log.exception("room_request_failed", node=c.node, error=repr(e))
            self._drop(c, f"error: {e!r}")

    def _drop(self, c: _Client, reason: str, quiet: bool = False) -> None:
        if not c.alive:
            return
        c.alive = False
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.chan.close()
        self._clients.remove(c)
        if c.node is not None and not quiet:
            level = self.log.info if reason == "bye" or self.supervised else self.log.warning
            level("room_client_left", node=c.node, reason=reason, **self._t())

    def _error(self, c: _Client, kind: str, message: str) -> None:
        c.chan.send(R_ERROR, json.dumps({"kind": kind, "message": message}).encode())

    # ---- requests ------------------------------------------------------------------------------

    def _handle(self, c: _Client, op: int, fixed: bytes, payload: np.ndarray | None) -> None:
        if op == BYE:
            raise _Leave
        if c.node is None:
            if op != HELLO:
                raise ProtocolError(f"request {op} before hello")
            self._hello(c, fixed)
            return
        if c.idle and op not in (IDLE, BUSY):
            self._wake(c)  # a running node sent it: answer its idle first (it will read the answer first)
        if op == SHOW:
            (t,) = F_SHOW.unpack_from(fixed)
            if payload is None:
                raise ProtocolError("show without an image")
            try:
                self.room.show_at(c.node, payload, t)
            except (ValueError, KeyError) as e:
                self.log.warning("room_request_failed", node=c.node, request="show", error=str(e))
                c.error = (type(e).__name__, str(e))
        elif op == CAM_OPEN:
            cid, now = F_CAM.unpack(fixed)
            c.cams[cid] = _Camera(self.room, c.node, now)
        elif op == CAM_CLOSE:
            (cid,) = F_CAM_ID.unpack(fixed)
            c.cams.pop(cid, None)
        elif op in (NEXT, RENDER):
            if c.error is not None:
                self._error(c, *c.error)
                c.error = None
                return
            if op == NEXT:
                cid, now = F_CAM.unpack(fixed)
            else:
                cid, k, t = F_RENDER.unpack(fixed)
            cam = c.cams.get(cid)
            if cam is None:
                self._error(c, "RuntimeError", f"camera {cid} of {c.node} is not open")
                return
            try:
                if op == NEXT:
                    k, t0, t1 = cam.next(now)
                else:
                    image = cam.render(k, t)
            except Exception as e:  # noqa: BLE001 - the node gets the error; the room goes on
                self.log.exception("room_request_failed", node=c.node, request="next" if op == NEXT else "render",
                                   error=repr(e))
                self._error(c, "RuntimeError", f"the room failed to {'schedule' if op == NEXT else 'render'} "
                                               f"a capture of {c.node}: {e!r}")
                return
            if op == NEXT:
                c.chan.send(R_NEXT, F_NEXT.pack(k, t0, t1, cam.missed, cam.dropped))
            else:
                c.chan.send(R_IMAGE, image_fixed(b"", image), image)
        elif op == IDLE:
            if c.error is not None:
                self._error(c, *c.error)
                c.error = None
                return
            if self.mode != "virtual":
                self._error(c, "RuntimeError", "the room runs on real time: there is no idle")
                return
            if c.idle:
                raise ProtocolError("idle while already idle")
            has, deadline = F_IDLE.unpack(fixed)
            c.idle, c.deadline = True, (deadline if has else None)
        elif op == BUSY:
            if c.idle:
                self._wake(c)
        else:
            raise ProtocolError(f"unknown request {op}")

    def _hello(self, c: _Client, fixed: bytes) -> None:
        info = json.loads(fixed)
        node = info.get("node")
        room = self.room
        if info.get("version") != VERSION:
            self._error(c, "ValueError", f"room protocol version {VERSION}, node speaks {info.get('version')}")
            return
        if node not in room.nodes:
            self._error(c, "KeyError", f"node {node!r} is not in the room ({', '.join(room.nodes)})")
            return
        if any(o.node == node for o in self._clients):
            self._error(c, "ValueError", f"node {node!r} is already connected to the room")
            return
        c.node = node
        self._joined.add(node)
        clocks = getattr(room, "clocks", {})
        reply = {
            "node": node, "nodes": room.nodes, "mode": self.mode,
            "now": self.now if self.mode == "virtual" else None, "origin": self.origin,
            "offset_s": clocks.get(node, (0.0, 0.0))[0], "drift_ppm": clocks.get(node, (0.0, 0.0))[1],
            "clocks": {n: list(clocks.get(n, (0.0, 0.0))) for n in room.nodes},
            "camera_fps": room.camera_fps(node), "profile": room.profile,
            "screen": [room.screen_w, room.screen_h], "seed": room.seed,
        }
        c.chan.send(R_HELLO, json.dumps(reply).encode())
        self.log.info("room_client_joined", node=node, **self._t())
        if self.mode == "virtual" and not self.started and self.expected <= self._joined:
            self.started = True
            self.log.info("room_time_started", nodes=sorted(self._joined), **self._t())

    # ---- virtual time --------------------------------------------------------------------------

    def _wake(self, c: _Client) -> None:
        c.idle, c.deadline = False, None
        c.chan.send(R_NOW, F_NOW.pack(self.now))

    def _advance(self) -> None:
        """If every node waits, move time to the earliest deadline and wake them all."""
        if self.mode != "virtual" or not self.started:
            self._deadlock_since = None
            return
        active = [c for c in self._clients if c.node is not None]
        if not active or not all(c.idle for c in active):
            self._deadlock_since = None
            return
        deadlines = [c.deadline for c in active if c.deadline is not None]
        if not deadlines:
            if self._deadlock_since is None:
                self._deadlock_since = time.monotonic()
            return
        self._deadlock_since = None
        self.now = max(self.now, min(deadlines))
        for c in active:
            try:
                self._wake(c)
            except OSError as e:
                self._drop(c, f"error: {e}")


# ---- the command line ------------------------------------------------------------------------------

class _Stopped(BaseException):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stop(signum, _frame) -> None:
    raise _Stopped(signum)


def _fail(message: str) -> int:
    print(f"wccl.room.serve: {' / '.join(line.strip() for line in message.splitlines() if line.strip())}",
          file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    from wccl.config import ConfigError, load_config
    from wccl.runtime.logs import configure_logging

    p = command_parser("wccl.room.serve",
                       description="Serve the simulated room to node processes on a Unix socket.")
    p.add_argument("--config", required=True, help="the room config (TOML)")
    p.add_argument("--socket", required=True, help="the Unix-domain socket to listen on (created; removed on exit)")
    p.add_argument("--clock", choices=("virtual", "realtime"), default=None,
                   help="virtual: time moves when every node process waits; default: the config's room.clock")
    p.add_argument("--nodes", default=None,
                   help="comma-separated nodes that will connect (default: all); virtual time waits for them")
    p.add_argument("--authkey-env", default=None, metavar="NAME",
                   help=f"environment variable holding the authkey (default: {AUTHKEY_ENV} if set, else none)")
    p.add_argument("--deadlock-grace-s", type=float, default=0.5,
                   help="how long (real seconds) every node may wait without a deadline before it is a deadlock")
    p.add_argument("--supervised", action="store_true",
                   help="a launcher reports each node's exit: log a node that leaves without goodbye at info")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config)
        room = SimulatedRoom.from_config(cfg)
    except ConfigError as e:
        return _fail(str(e))
    except (ValueError, KeyError) as e:
        return _fail(f"{args.config}: {e}")
    if args.authkey_env is not None:
        if args.authkey_env not in os.environ:
            return _fail(f"--authkey-env {args.authkey_env}: not set in the environment")
        authkey = os.environ[args.authkey_env].encode()
    else:
        authkey = os.environ.get(AUTHKEY_ENV, "").encode()
    nodes = [n.strip() for n in args.nodes.split(",") if n.strip()] if args.nodes else None
    configure_logging(cfg.logging.format, cfg.logging.level)
    try:
        server = RoomServer(room, args.socket, mode=args.clock or cfg.room.clock, nodes=nodes, authkey=authkey,
                            deadlock_grace_s=args.deadlock_grace_s, supervised=args.supervised)
    except ValueError as e:
        return _fail(str(e))
    old = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            server.listen()
        except ValueError as e:
            return _fail(str(e))
        return server.serve()
    except _Stopped as s:
        server.log.info("room_stopped", signal=signal.Signals(s.signum).name)
        return 0
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        server.close()


if __name__ == "__main__":
    sys.exit(main())
