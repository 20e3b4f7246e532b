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
import mmap
import os
import socket
import struct
import sys
import time
from typing import Any, Callable

import numpy as np

from wccl.timebase import NodeClock

MAGIC = b"WCCLROOM1"
VERSION = 1
NONCE_BYTES = 32
AUTHKEY_ENV = "WCCL_ROOM_AUTHKEY"  # where `connect` and the server look for the authkey by default

# Requests.
HELLO, SHOW, CAM_OPEN, NEXT, RENDER, CAM_CLOSE, IDLE, BUSY, BYE, SHOW_SLOT = range(1, 11)
# Replies.
R_ERROR, R_HELLO, R_NOW, R_NEXT, R_IMAGE, R_COMPOSE, R_SHM_IMAGE = range(0x80, 0x87)

HEADER = struct.Struct("<BHQ")
DIMS = struct.Struct("<III")
F_SHOW = struct.Struct("<d")
F_CAM = struct.Struct("<Id")
F_NEXT = struct.Struct("<qddqq")
F_RENDER = struct.Struct("<Iqd")
F_CAM_ID = struct.Struct("<I")
F_IDLE = struct.Struct("<?d")
F_NOW = struct.Struct("<d")
F_SHOW_SLOT = struct.Struct("<dIQ")      # t, slot, claim
F_COMPOSE = struct.Struct("<IIII")       # height, width of one screen, channels, pieces
F_PIECE = struct.Struct("<qQ40s")        # slot (-1: black), claim, ring segment name
F_SHM_IMAGE = struct.Struct("<Q40s")     # sequence number, capture segment name (then DIMS)

# Shared memory (the room creates, owns and unlinks every segment; see the module docstring).
RING_SLOTS = 16          # screen images per node: the room's history (8) and captures lent out, with room to spare
RING_HEADER = 4096       # claimed[RING_SLOTS] (uint64, the node writes) at 0, released[RING_SLOTS] (the room) at 2048
CAPTURE_HEADER = 64      # the capture buffer's sequence number (uint64) at 0, the image from 64 on
SHM_ENV = "WCCL_ROOM_SHM"  # "0": a node asks for no shared memory (every image on the socket)

MAX_PAYLOAD = 1 << 30  # 1 GiB: far above any screen or camera image

ERROR_KINDS: dict[str, type[Exception]] = {"KeyError": KeyError, "ValueError": ValueError,
                                          "RuntimeError": RuntimeError}


class ProtocolError(Exception):
    """The other side sent something this protocol does not allow."""


class RoomClosedError(ConnectionError):
    """The room (or the connection to it) is gone: the node cannot go on."""


class CaptureOverwrittenError(RuntimeError):
    """A capture's shared memory changed while this process copied it out: the copy is not the image."""


# ---- shared memory ---------------------------------------------------------------------------------

def slot_bytes(height: int, width: int) -> int:
    """Bytes of one screen slot of a ring (page aligned)."""
    return -(-height * width * 3 // 4096) * 4096


def ring_bytes(height: int, width: int) -> int:
    return RING_HEADER + RING_SLOTS * slot_bytes(height, width)


class Segment:
    """A shared-memory segment, mapped: created here (`create=True`: this process owns and must `unlink`
    it; the resource tracker unlinks it should this process die) or one the room created, mapped by name
    (never tracked here: the room unlinks it)."""

    def __init__(self, name: str, size: int = 0, create: bool = False) -> None:
        self.name = name
        self._shm = None
        if create:
            from multiprocessing.shared_memory import SharedMemory

            self._shm = SharedMemory(name=name, create=True, size=size)
            self.buf = self._shm.buf
            self.size = self._shm.size
            return
        try:
            import _posixshmem
        except ImportError:  # no POSIX shared memory: the standard class, untracked by hand
            from multiprocessing import resource_tracker
            from multiprocessing.shared_memory import SharedMemory

            self._shm = SharedMemory(name=name)
            resource_tracker.unregister(self._shm._name, "shared_memory")
            self.buf = self._shm.buf
            self.size = self._shm.size
            return
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            self.size = os.fstat(fd).st_size
            self._mmap = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._mmap)

    def array(self, shape: tuple[int, ...], dtype, offset: int) -> np.ndarray:
        return np.ndarray(shape, dtype, self.buf, offset)

    def close(self) -> None:
        """Unmap (arrays onto it must be gone; if some are left the mapping goes with them)."""
        try:
            if self._shm is not None:
                self._shm.close()
            else:
                self.buf.release()
                self._mmap.close()
        except (BufferError, ValueError):
            pass

    def unlink(self) -> None:
        if self._shm is not None:
            try:
                self._shm.unlink()
            except FileNotFoundError:
                pass


class Ring:
    """A node's screen images in shared memory: RING_SLOTS slots of height x width x 3 uint8 after a
    header of two counters per slot, `claimed` (written by the node as it starts writing a slot) and
    `released` (written by the room when it holds the slot's image no more). A slot is the node's to
    write while the two are equal."""

    def __init__(self, seg: Segment, height: int, width: int) -> None:
        self.seg = seg
        self.claimed = seg.array((RING_SLOTS,), np.uint64, 0)
        self.released = seg.array((RING_SLOTS,), np.uint64, RING_HEADER // 2)
        step = slot_bytes(height, width)
        self.images = [seg.array((height, width, 3), np.uint8, RING_HEADER + i * step) for i in range(RING_SLOTS)]

    def close(self) -> None:
        self.claimed = self.released = None
        self.images = []
        self.seg.close()


class _CaptureView:
    """A camera's capture buffer (the room writes it), mapped to copy captures out of."""

    def __init__(self, name: str) -> None:
        self.seg = Segment(name)
        self.seq = self.seg.array((1,), np.uint64, 0)

    def close(self) -> None:
        self.seq = None
        self.seg.close()


def checked_copy(dst: np.ndarray, src: np.ndarray, stamp: np.ndarray, index: int, want: int) -> None:
    """Copy `src` into `dst` if `stamp[index]` (the writer's counter) reads `want` before and after the
    copy; else CaptureOverwrittenError (the source was rewritten: `dst` is not the image)."""
    if int(stamp[index]) != want:
        raise CaptureOverwrittenError(f"shared image changed before it was copied (stamp {int(stamp[index])}, "
                                      f"expected {want})")
    np.copyto(dst, src)
    if int(stamp[index]) != want:
        raise CaptureOverwrittenError(f"shared image changed while it was copied (stamp {int(stamp[index])}, "
                                      f"expected {want})")


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

    POOL = 4  # capture arrays kept for reuse once nobody else holds them

    def __init__(self, socket_path: str, node: str, authkey: bytes | str | None = None,
                 connect_timeout_s: float = 10.0, shm: bool | None = None) -> None:
        if authkey is None:
            authkey = os.environ.get(AUTHKEY_ENV, "")
        if isinstance(authkey, str):
            authkey = authkey.encode()
        if shm is None:
            shm = os.environ.get(SHM_ENV, "1") != "0"
        self.socket_path = str(socket_path)
        self.node = node
        self.closed = False
        self._idle_pending = False
        self._next_cam = 0
        self._ring: Ring | None = None       # this node's screen slots (it writes them)
        self._rings: dict[str, Ring] = {}    # other nodes' screen slots, as the room named them in captures
        self._captures: dict[int, _CaptureView] = {}  # per camera: the buffer the room renders into
        self._claims = 0
        self._pool: list[np.ndarray] = []
        sock = _connect_unix(self.socket_path, connect_timeout_s)
        self.chan = Channel(sock)
        try:
            answer_challenge(self.chan, authkey)
            self.chan.send(HELLO, json.dumps({"node": node, "version": VERSION, "shm": bool(shm)}).encode())
            info = json.loads(self._reply(R_HELLO))
            if info.get("shm"):
                w, h = info["screen"]
                self._screen_hw = (h, w)
                self._ring = Ring(Segment(info["shm"]["ring"]), h, w)
        except BaseException:
            self.closed = True
            self.chan.close()
            self._unmap()
            raise
        self.info: dict[str, Any] = info
        self.mode: str = info["mode"]
        self.now: float = info["now"] if info["now"] is not None else 0.0

    @property
    def shared_memory(self) -> bool:
        """Whether images go through shared memory (else all of them cross the socket)."""
        return self._ring is not None

    def fileno(self) -> int:
        return self.chan.fileno()

    # ---- plumbing ------------------------------------------------------------------------------

    def _closed_error(self, why: object = None) -> RoomClosedError:
        self.closed = True
        self.chan.close()
        self._unmap()
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

    def _reply(self, want: int | tuple[int, ...], image: bool = False):
        op, fixed, payload = self._recv()
        if op == R_ERROR:
            err = json.loads(fixed)
            raise ERROR_KINDS.get(err.get("kind"), RuntimeError)(err.get("message", "room error"))
        if op != want and not (isinstance(want, tuple) and op in want):
            raise ProtocolError(f"expected reply {want} from the room, got {op:#x}")
        if isinstance(want, tuple):
            return op, fixed, payload
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
        ring = self._ring
        if ring is not None and image.shape == ring.images[0].shape and image.dtype == np.uint8:
            free = np.flatnonzero(ring.claimed == ring.released)
            if free.size:  # else every slot is still the room's: this image crosses the socket
                s = int(free[0])
                self._claims += 1
                ring.claimed[s] = self._claims  # first: whoever copies the slot now sees it changed
                np.copyto(ring.images[s], image)
                self._send(SHOW_SLOT, F_SHOW_SLOT.pack(t, s, self._claims))
                return
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
        """Capture `k` of camera `cid` (row 0 at room time `t`): an array this process owns."""
        for attempt in range(2):
            self._send(RENDER, F_RENDER.pack(cid, k, t))
            op, fixed, payload = self._reply((R_IMAGE, R_COMPOSE, R_SHM_IMAGE))
            if op == R_IMAGE:
                return payload
            try:
                if op == R_COMPOSE:
                    return self._compose(fixed)
                return self._from_buffer(cid, fixed)
            except FileNotFoundError:
                # A segment named in the reply is gone (its node left before this process mapped it):
                # ask again; the room now renders from its own copies.
                if attempt:
                    raise RuntimeError(f"capture {k} of camera {cid}: the room's shared memory is gone") from None
        raise AssertionError("unreachable")

    def _alloc(self, shape: tuple[int, int, int]) -> np.ndarray:
        """An array for a capture: one of the pool that nothing else refers to any more, or a new one."""
        for a in self._pool:
            # References: the pool, `a`, getrefcount's argument. A view, a memoryview or a queue holding it adds one.
            if a.shape == shape and sys.getrefcount(a) <= 3:
                return a
        a = np.empty(shape, np.uint8)
        self._pool.append(a)
        if len(self._pool) > self.POOL:
            del self._pool[0]
        return a

    def _compose(self, fixed: bytes) -> np.ndarray:
        """An exact capture from the screens' slots the room named (screens side by side)."""
        h, w, c, n = F_COMPOSE.unpack_from(fixed)
        if len(fixed) != F_COMPOSE.size + n * F_PIECE.size:
            raise ProtocolError(f"capture of {n} screens in {len(fixed)} bytes")
        pieces = [F_PIECE.unpack_from(fixed, F_COMPOSE.size + j * F_PIECE.size) for j in range(n)]
        out = self._alloc((h, w * n, c))
        for j, (slot, claim, name) in enumerate(pieces):
            dst = out[:, j * w:(j + 1) * w]
            if slot < 0:
                dst[...] = 0
                continue
            ring = self._map_ring(name.rstrip(b"\0").decode())
            if not 0 <= slot < RING_SLOTS or ring.images[0].shape != (h, w, c):
                raise ProtocolError(f"capture names slot {slot} of a ring of {RING_SLOTS} {ring.images[0].shape}")
            checked_copy(dst, ring.images[slot], ring.claimed, slot, claim)
        return out

    def _map_ring(self, name: str) -> Ring:
        ring = self._rings.get(name)
        if ring is None:
            ring = self._rings[name] = Ring(Segment(name), *self._screen_hw)
        return ring

    def _from_buffer(self, cid: int, fixed: bytes) -> np.ndarray:
        """A capture the room wrote into this camera's buffer."""
        seq, name = F_SHM_IMAGE.unpack_from(fixed)
        h, w, c = DIMS.unpack_from(fixed, F_SHM_IMAGE.size)
        name = name.rstrip(b"\0").decode()
        view = self._captures.get(cid)
        if view is None or view.seg.name != name:
            if view is not None:
                view.close()
                del self._captures[cid]
            view = self._captures[cid] = _CaptureView(name)
        if CAPTURE_HEADER + h * w * c > view.seg.size:
            raise ProtocolError(f"capture of {h}x{w}x{c} in a buffer of {view.seg.size} bytes")
        out = self._alloc((h, w, c))
        checked_copy(out, view.seg.array((h, w, c), np.uint8, CAPTURE_HEADER), view.seq, 0, seq)
        return out

    def close_camera(self, cid: int) -> None:
        view = self._captures.pop(cid, None)
        if view is not None:
            view.close()
        if not self.closed:
            self._send(CAM_CLOSE, F_CAM_ID.pack(cid))

    def _unmap(self) -> None:
        for m in [self._ring, *self._rings.values(), *self._captures.values()]:
            if m is not None:
                m.close()
        self._ring = None
        self._rings.clear()
        self._captures.clear()

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
        self._unmap()


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
