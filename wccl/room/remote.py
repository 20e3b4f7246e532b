"""The room in another process, as a node sees it: the client side of `python -m wccl.room.serve`.

A node process reaches the room (wccl/room/serve.py) over a local Unix-domain
socket; nothing else is shared. `RemoteRoom` offers what the node runtime
needs from a medium, as `SimulatedRoom` does in process: the node's clock
(`clock_for`), its screen (`screen(node).show(image)`), its camera
(`await camera(node, clock).recv()`) and the camera's rate. `connect()` also
builds the event loop the node must run on: `RoomTimeLoop` (wccl/room/vtime.py)
in virtual mode, where the room's time only moves when every node process
waits, or a plain asyncio loop on `time.monotonic()` in realtime mode.

Consumes: images a node shows (H x W x 3 uint8 BGR) and the loop's time.
Emits: camera captures (with the node-clock time of their delivery), the
node's clock parameters, and the room's virtual time.

Wire protocol (both directions; little-endian; no pickle):

    header   <BHQ  op, length of the fixed part, length of the payload
    fixed    a struct (or UTF-8 JSON for hello and errors)
    payload  raw image bytes (uint8, C order); when present, the fixed part
             ends with <III (height, width, channels)

A connection starts with a challenge: the room sends MAGIC and 32 random
bytes, the node answers HMAC-SHA256(authkey, those bytes), the room answers
one byte 1 (an empty authkey is a key too). Requests of one connection are
handled in order; a connection speaks for the one node named in its hello.

    request                      fixed part            reply
    HELLO      node, version     JSON                  R_HELLO (JSON) or R_ERROR
    SHOW       t, image          <d + <III + payload   none
    CAM_OPEN   camera id, now    <Id                   none
    NEXT       camera id, now    <Id                   R_NEXT <qddqq  k, t_start, t_deliver, missed, dropped
    RENDER     camera id, k, t   <Iqd                  R_IMAGE <III + payload
    CAM_CLOSE  camera id         <I                    none
    IDLE       deadline|None     <?d                   R_NOW <d (when the room's time moves, or on BUSY)
    BUSY                         -                     R_NOW <d, only to a pending IDLE
    BYE                          -                     none (the room closes the connection)

A request the room cannot serve (or the failure of an earlier one that had no
reply, such as a SHOW) comes back as R_ERROR {"kind", "message"}; the client
raises KeyError, ValueError or RuntimeError with that message.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import socket
import struct
import time
from typing import Any, Callable

import numpy as np

from wccl.runtime.timebase import NodeClock

MAGIC = b"WCCLROOM1"
VERSION = 1
NONCE_BYTES = 32
AUTHKEY_ENV = "WCCL_ROOM_AUTHKEY"  # where `connect` and the server look for the authkey by default

# Requests.
HELLO, SHOW, CAM_OPEN, NEXT, RENDER, CAM_CLOSE, IDLE, BUSY, BYE = range(1, 10)
# Replies.
R_ERROR, R_HELLO, R_NOW, R_NEXT, R_IMAGE = range(0x80, 0x85)

HEADER = struct.Struct("<BHQ")
DIMS = struct.Struct("<III")
F_SHOW = struct.Struct("<d")
F_CAM = struct.Struct("<Id")
F_NEXT = struct.Struct("<qddqq")
F_RENDER = struct.Struct("<Iqd")
F_CAM_ID = struct.Struct("<I")
F_IDLE = struct.Struct("<?d")
F_NOW = struct.Struct("<d")

MAX_PAYLOAD = 1 << 30  # 1 GiB: far above any screen or camera image

ERROR_KINDS: dict[str, type[Exception]] = {"KeyError": KeyError, "ValueError": ValueError,
                                          "RuntimeError": RuntimeError}


class ProtocolError(Exception):
    """The other side sent something this protocol does not allow."""


class RoomClosedError(ConnectionError):
    """The room (or the connection to it) is gone: the node cannot go on."""


class Channel:
    """Framed messages over a connected stream socket (blocking), with a small read buffer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()

    def fileno(self) -> int:
        return self.sock.fileno()

    def buffered(self) -> bool:
        """Whether bytes of a next message were already read (a readiness check would miss them)."""
        return bool(self._buf)

    def send(self, op: int, fixed: bytes = b"", payload: np.ndarray | None = None) -> None:
        n = 0 if payload is None else payload.nbytes
        self.sock.sendall(HEADER.pack(op, len(fixed), n) + fixed)
        if n:
            self.sock.sendall(memoryview(np.ascontiguousarray(payload)).cast("B"))

    def read_exact(self, n: int) -> bytes:
        buf = self._buf
        while len(buf) < n:
            chunk = self.sock.recv(max(65536, n - len(buf)))
            if not chunk:
                raise EOFError("connection closed")
            buf += chunk
        out = bytes(buf[:n])
        del buf[:n]
        return out

    def recv(self) -> tuple[int, bytes, np.ndarray | None]:
        """The next message: (op, fixed part, image payload or None)."""
        op, nfixed, npay = HEADER.unpack(self.read_exact(HEADER.size))
        fixed = self.read_exact(nfixed) if nfixed else b""
        if not npay:
            return op, fixed, None
        if npay > MAX_PAYLOAD or len(fixed) < DIMS.size:
            raise ProtocolError(f"bad payload of {npay} bytes for op {op}")
        h, w, c = DIMS.unpack_from(fixed, len(fixed) - DIMS.size)
        if h * w * c != npay:
            raise ProtocolError(f"payload of {npay} bytes is not an image of {h}x{w}x{c}")
        image = np.empty((h, w, c), np.uint8)
        view = memoryview(image).cast("B")
        got = min(len(self._buf), npay)
        if got:
            view[:got] = self._buf[:got]
            del self._buf[:got]
        while got < npay:
            n = self.sock.recv_into(view[got:], npay - got)
            if not n:
                raise EOFError("connection closed")
            got += n
        return op, fixed, image

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def image_fixed(prefix: bytes, image: np.ndarray) -> bytes:
    h, w, c = image.shape
    return prefix + DIMS.pack(h, w, c)


def answer_challenge(chan: Channel, authkey: bytes) -> None:
    head = chan.read_exact(len(MAGIC) + NONCE_BYTES)
    if not head.startswith(MAGIC):
        raise ProtocolError("this socket does not speak the WCCL room protocol")
    chan.sock.sendall(hmac.new(authkey, head[len(MAGIC):], hashlib.sha256).digest())
    try:
        ok = chan.read_exact(1)
    except EOFError:
        ok = b""
    if ok != b"\x01":
        raise PermissionError("the room refused this node's authkey")


class RoomClient:
    """One connection to the room, for one node: synchronous round trips, from the loop's thread only.

    `now` is the room's virtual time as this process last heard it (the RoomTimeLoop reads it).
    """

    def __init__(self, socket_path: str, node: str, authkey: bytes | str | None = None,
                 connect_timeout_s: float = 10.0) -> None:
        if authkey is None:
            authkey = os.environ.get(AUTHKEY_ENV, "")
        if isinstance(authkey, str):
            authkey = authkey.encode()
        self.socket_path = str(socket_path)
        self.node = node
        self.closed = False
        self._idle_pending = False
        self._next_cam = 0
        sock = _connect_unix(self.socket_path, connect_timeout_s)
        self.chan = Channel(sock)
        try:
            answer_challenge(self.chan, authkey)
            self.chan.send(HELLO, json.dumps({"node": node, "version": VERSION}).encode())
            info = json.loads(self._reply(R_HELLO))
        except BaseException:
            self.closed = True
            self.chan.close()
            raise
        self.info: dict[str, Any] = info
        self.mode: str = info["mode"]
        self.now: float = info["now"] if info["now"] is not None else 0.0

    def fileno(self) -> int:
        return self.chan.fileno()

    # ---- plumbing ------------------------------------------------------------------------------

    def _closed_error(self, why: object = None) -> RoomClosedError:
        self.closed = True
        self.chan.close()
        extra = f": {why}" if why else ""
        return RoomClosedError(f"the room closed (socket {self.socket_path}, node {self.node}){extra}")

    def _send(self, op: int, fixed: bytes = b"", payload: np.ndarray | None = None) -> None:
        if self.closed:
            raise RoomClosedError(f"the room connection of node {self.node} is closed")
        if self._idle_pending and op not in (BUSY,):
            self.settle()
        try:
            self.chan.send(op, fixed, payload)
        except OSError as e:
            raise self._closed_error(e) from None

    def _recv(self) -> tuple[int, bytes, np.ndarray | None]:
        try:
            return self.chan.recv()
        except (EOFError, OSError) as e:
            raise self._closed_error(e) from None

    def _reply(self, want: int, image: bool = False):
        op, fixed, payload = self._recv()
        if op == R_ERROR:
            err = json.loads(fixed)
            raise ERROR_KINDS.get(err.get("kind"), RuntimeError)(err.get("message", "room error"))
        if op != want:
            raise ProtocolError(f"expected reply {want:#x} from the room, got {op:#x}")
        return (fixed, payload) if image else fixed

    # ---- the time protocol (RoomTimeLoop) ------------------------------------------------------

    def send_idle(self, deadline: float | None) -> None:
        """Tell the room this process waits until `deadline` (room time; None: for an event only)."""
        self._send(IDLE, F_IDLE.pack(deadline is not None, 0.0 if deadline is None else deadline))
        self._idle_pending = True

    def send_busy(self) -> None:
        """Withdraw a pending idle (something happened here); its reply is still to be read."""
        self._send(BUSY)

    def recv_now(self) -> float:
        """Read the reply to the pending idle: the room's time, which `now` then holds."""
        (t,) = F_NOW.unpack(self._reply(R_NOW))
        self._idle_pending = False
        if t > self.now:
            self.now = t
        return self.now

    def settle(self) -> float:
        """If an idle is still pending (its wait was interrupted), withdraw it and read its reply."""
        if self._idle_pending:
            self._idle_pending = False  # _send must not settle again
            try:
                self.chan.send(BUSY)
            except OSError as e:
                raise self._closed_error(e) from None
            self._idle_pending = True
            self.recv_now()
        return self.now

    # ---- the medium's requests -----------------------------------------------------------------

    def show(self, t: float, image: np.ndarray) -> None:
        self._send(SHOW, image_fixed(F_SHOW.pack(t), image), image)

    def open_camera(self, now: float) -> int:
        cid = self._next_cam
        self._next_cam += 1
        self._send(CAM_OPEN, F_CAM.pack(cid, now))
        return cid

    def next_capture(self, cid: int, now: float) -> tuple[int, float, float, int, int]:
        self._send(NEXT, F_CAM.pack(cid, now))
        return F_NEXT.unpack(self._reply(R_NEXT))

    def render(self, cid: int, k: int, t: float) -> np.ndarray:
        self._send(RENDER, F_RENDER.pack(cid, k, t))
        _, image = self._reply(R_IMAGE, image=True)
        return image

    def close_camera(self, cid: int) -> None:
        if not self.closed:
            self._send(CAM_CLOSE, F_CAM_ID.pack(cid))

    def close(self) -> None:
        """Say goodbye (idempotent). A pending idle is withdrawn first."""
        if self.closed:
            return
        try:
            self._send(BYE)
        except (RoomClosedError, ProtocolError, OSError):
            pass
        self.closed = True
        self.chan.close()


def _connect_unix(path: str, timeout_s: float) -> socket.socket:
    """Connect to the room's socket, waiting up to `timeout_s` for it to appear."""
    deadline = time.monotonic() + timeout_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError) as e:
            sock.close()
            if time.monotonic() >= deadline:
                raise RoomClosedError(f"no room is serving on {path} ({e.strerror})") from None
            time.sleep(0.02)
        except BaseException:
            sock.close()
            raise


# ---- the medium ------------------------------------------------------------------------------------

class RemoteScreen:
    """A node's screen in the remote room: `show` sends the image with the loop's current time."""

    def __init__(self, room: RemoteRoom) -> None:
        self._room = room

    def show(self, image: np.ndarray) -> None:
        r = self._room
        if image.shape != (r.screen_h, r.screen_w, 3) or image.dtype != np.uint8:
            raise ValueError(
                f"screen of {r.node} is {r.screen_w}x{r.screen_h} BGR uint8, got {image.shape} {image.dtype}"
            )
        r.client.show(asyncio.get_running_loop().time(), image)


class RemoteCamera:
    """A node's camera in the remote room: the room keeps its schedule; this side sleeps on its own loop.

    Each `recv` asks the room for the next capture slot (after the slots that
    were dropped or missed), sleeps until its delivery, then asks for the
    image: the same captures, at the same times, as `RoomCamera` in process.
    """

    def __init__(self, room: RemoteRoom, clock: NodeClock) -> None:
        self._client = room.client
        self._clock = clock
        self._cid = self._client.open_camera(asyncio.get_running_loop().time())
        self.missed = 0   # capture slots skipped because nobody asked in time
        self.dropped = 0  # captures the camera lost (drops, stalls)
        self.closed = False

    async def recv(self) -> tuple[np.ndarray, float]:
        if self.closed:
            raise RuntimeError("camera is closed")
        loop = asyncio.get_running_loop()
        now = loop.time()
        k, t, t_deliver, self.missed, self.dropped = self._client.next_capture(self._cid, now)
        delay = t_deliver - now
        if delay > 0:
            await asyncio.sleep(delay)
        if self.closed:
            raise RuntimeError("camera is closed")
        image = self._client.render(self._cid, k, t)
        return image, self._clock.now()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._client.close_camera(self._cid)
            except (RoomClosedError, OSError):
                pass


class RemoteRoom:
    """The medium of a node whose room runs in another process (`python -m wccl.room.serve`).

    Attributes from the room's hello: `mode` ("virtual" or "realtime"), `origin`
    (the loop time at which the room's time is 0: 0.0 in virtual mode, the
    room's `time.monotonic()` at start in realtime mode), `profile`, `nodes`,
    `screen_w`, `screen_h`.
    """

    def __init__(self, socket_path: str, node: str, authkey: bytes | str | None = None,
                 client: RoomClient | None = None, connect_timeout_s: float = 10.0) -> None:
        self.client = client if client is not None else RoomClient(socket_path, node, authkey, connect_timeout_s)
        info = self.client.info
        self.node = node
        self.mode: str = info["mode"]
        self.origin: float = info["origin"]
        self.profile: str = info["profile"]
        self.nodes: list[str] = list(info["nodes"])
        self.screen_w, self.screen_h = info["screen"]
        self.seed: int = info["seed"]
        self._fps: float = info["camera_fps"]
        self._clocks: dict[str, tuple[float, float]] = {n: tuple(v) for n, v in info["clocks"].items()}

    def _check(self, node: str) -> None:
        if node != self.node:
            raise KeyError(f"node {node!r}: this connection to the room is node {self.node!r}'s")

    def clock_for(self, node: str, origin: float) -> NodeClock:
        """`node`'s own clock (the room's true time is `loop.time() - origin`); needs a running loop."""
        self._check(node)
        off, ppm = self._clocks[node]
        return NodeClock(offset=off, drift_ppm=ppm, origin=origin)

    def true_reading(self, node: str, origin: float) -> Callable[[float], float]:
        """A function: `node`'s clock reading at a given true loop time (the room's truth, for logs only)."""
        off, ppm = self._clocks.get(node, (0.0, 0.0))
        return lambda loop_t: (loop_t - origin) * (1 + ppm * 1e-6) + off

    def screen(self, node: str) -> RemoteScreen:
        self._check(node)
        return RemoteScreen(self)

    def camera(self, node: str, clock: NodeClock) -> RemoteCamera:
        """`node`'s camera, starting now (the room draws its phase, as in process); needs a running loop."""
        self._check(node)
        return RemoteCamera(self, clock)

    def camera_fps(self, node: str) -> float:
        self._check(node)
        return self._fps

    def close(self) -> None:
        self.client.close()


def new_node_loop(mode: str, client: RoomClient, busy: Callable[[], bool] | None = None) -> asyncio.AbstractEventLoop:
    """The event loop a node process runs on: RoomTimeLoop (virtual) or a plain asyncio loop (realtime)."""
    if mode != client.mode:
        raise ValueError(f"the room runs on {client.mode} time but this node asked for {mode}")
    if mode == "virtual":
        from wccl.room.vtime import RoomTimeLoop

        return RoomTimeLoop(client, busy=busy)
    if mode == "realtime":
        return asyncio.new_event_loop()
    raise ValueError(f"unknown clock mode {mode!r} (expected 'virtual' or 'realtime')")


def connect(socket_path: str, node: str, mode: str, busy: Callable[[], bool] | None = None,
            authkey: bytes | str | None = None, connect_timeout_s: float = 10.0
            ) -> tuple[RemoteRoom, asyncio.AbstractEventLoop]:
    """Join the room as `node`: (the medium, the event loop to run the node on).

    `authkey` defaults to $WCCL_ROOM_AUTHKEY (or the empty key). `busy`: see RoomTimeLoop.
    Unknown node: KeyError naming the room's nodes; wrong mode: ValueError; no room: RoomClosedError.
    """
    client = RoomClient(socket_path, node, authkey, connect_timeout_s)
    try:
        loop = new_node_loop(mode, client, busy)
    except BaseException:
        client.close()
        raise
    return RemoteRoom(socket_path, node, client=client), loop


__all__ = ["RemoteRoom", "RemoteCamera", "RemoteScreen", "RoomClient", "RoomClosedError", "connect",
           "new_node_loop", "AUTHKEY_ENV"]
