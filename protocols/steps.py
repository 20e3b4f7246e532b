"""The built-in run's tensors as transfers (protocols.transfer, frame version 9).

The built-in run (`python -m wccl.node`: a parameter server and its workers
on a step schedule, actors.clock) sends four kinds of tensors, each one
transfer whose op says what it is for:

- `grad`: a worker's gradient of step `seq`, encoded by the run's codec
  (protocols.codecs; bf16 by default: 2 bytes a value; uint8 on the wire)
- `avg`: the server's average of step `seq` (the same codec)
- `params`: a snapshot of the server's training state (protocols.snapshot,
  uint8; `seq`: the number of updates it holds)
- `sync`: an `Announce` or a `Hello` (protocols.sync, uint8; `seq`: the
  sender's count of them)

Which model state a tensor belongs to (the server's `epoch`, and `base`, the
number of updates that state had seen) is the training protocol's business,
not the link's: it travels sealed with the tensor, in the payload's first 6
bytes (epoch u16, base u32, big endian), and the whole payload is sealed
under the room key (AEAD, protocols.security) like a collective's.

Each sender numbers its transfers 1, 2, 3, ... under its run nonce (random,
drawn when its node starts), so AEAD nonces never repeat; the numbering
outlives an actor's restart (`StepSender` lives in the node's supervisor). A
reader that sees a sender's run nonce change forgets what it had of it: the
node started again and numbers its transfers from 1.

Freshness: every frame echoes the run nonce its sender last saw of each node
(the low 32 bits; protocols.transfer's FLAG_ECHOES entries), and a node
trusts a peer's nonce only once a frame of it echoes this node's own current
nonce (protocols.security.Handshake, as the collectives' status frames do),
so frames filmed in another run are refused (`other_run`), and frames of
this run shown again more than the replay window later (`replayed_old`).

`StepSender` is the sending side (a tensor -> its header and sealed bytes),
`StepAssembler` the reading side (trusted frames -> `StepTensor`s). Pure: no
I/O, no asyncio, no torch.
"""

from __future__ import annotations

import struct
from collections import Counter, OrderedDict
from dataclasses import dataclass

from protocols import frames, transfer
from protocols.frames import digest
from protocols.security import NO_KEY, TAG_BYTES, Handshake, RoomKey, new_run_nonce

DTYPES = {"grad": "uint8", "avg": "uint8", "params": "uint8", "sync": "uint8"}  # the ops, and their dtypes
ITEM_BYTES = {"uint8": 1}
_STATE = struct.Struct(">HI")
OVERHEAD = _STATE.size + TAG_BYTES  # bytes a sealed step payload adds to the tensor's, at most
# Tensors that may be shown over several steps (a snapshot, sync payloads): kept this many steps longer.
SLOW_OPS = {"params": 64, "sync": 64}
_KEEP = 32  # recent transfers a sender remembers (a snapshot is shown over several windows)


@dataclass(frozen=True)
class StepTensor:
    """A tensor rebuilt from trusted frames: who sent it, what for, and the state it belongs to."""

    sender: int
    stream: str
    step: int
    epoch: int
    base: int
    payload: bytes
    frames: int  # packets it took


class StepSender:
    """One node's transfers: numbers them, seals them, and gives the same transfer again for the same
    tensor (a snapshot shown over several windows continues where it stopped)."""

    def __init__(self, session: int, sender: int, key: RoomKey = NO_KEY, run_nonce: int | None = None,
                 first_tid: int = 1) -> None:
        self.session, self.sender, self.key = session, sender, key
        self.run_nonce = run_nonce if run_nonce is not None else new_run_nonce()
        # What this node's frames echo of every node's run nonce, and whom it trusts (its handshake's).
        self.echo: tuple[int, ...] = ()
        self.trusts = 0
        self._tid = first_tid - 1
        self._recent: OrderedDict[tuple, tuple[transfer.TransferHeader, bytes]] = OrderedDict()

    def transfer(self, stream: str, step: int, payload: bytes, epoch: int = 0, base: int = 0,
                 variant: int = 0) -> tuple[transfer.TransferHeader, bytes]:
        """The header and sealed bytes of `payload` (`variant`: one transfer per layout it is shown in)."""
        if stream not in DTYPES:
            raise ValueError(f"unknown stream {stream!r}")
        item = ITEM_BYTES[DTYPES[stream]]
        if not payload or len(payload) % item:
            raise ValueError(f"a {stream} payload of {len(payload)} bytes is not a whole {DTYPES[stream]} tensor")
        ident = (stream, step, epoch, base, variant, len(payload), digest(payload))
        had = self._recent.get(ident)
        if had is not None:
            self._recent.move_to_end(ident)
            return had
        self._tid += 1
        if self._tid > 0xFFFFFFFF:
            raise OverflowError("a node's transfers ran out of numbers: start it again (new run nonce)")
        head = transfer.TransferHeader(self.session, self.sender, self._tid, step, stream, DTYPES[stream],
                                       len(payload) // item, 0, b"")
        sealed = self.key.seal(self.run_nonce, self._tid, _STATE.pack(epoch, base) + payload, transfer.aad(head))
        head = transfer.TransferHeader(self.session, self.sender, self._tid, step, stream, DTYPES[stream],
                                       head.numel, len(sealed), digest(sealed))
        self._recent[ident] = (head, sealed)
        while len(self._recent) > _KEEP:
            self._recent.popitem(last=False)
        return head, sealed


class StepAssembler:
    """Rebuilds the built-in run's tensors from trusted transfer frames (any sufficient set of packets),
    opens them under the room key, and checks they are what their header says. Losses by reason."""

    def __init__(self, key: RoomKey = NO_KEY, max_pending: int = 64) -> None:
        self.key = key
        self.assembler = transfer.TransferAssembler(max_pending=max_pending)
        self._nonces: dict[int, int] = {}
        self.restarts: Counter = Counter()  # per sender: run nonces seen change

    @property
    def losses(self) -> Counter:
        return self.assembler.losses

    @property
    def duplicates(self) -> int:
        return self.assembler.duplicates

    def add(self, f: transfer.TransferFrame) -> StepTensor | None:
        h = f.header
        if h is None or h.op not in DTYPES:
            self.losses["not_a_step_transfer"] += 1
            return None
        known = self._nonces.get(f.sender)
        if known != f.run_nonce:
            if known is not None:
                # The sender started again (a new run nonce): it numbers its transfers from 1 again.
                self.assembler.forget_sender(f.sender)
                self.restarts[f.sender] += 1
            self._nonces[f.sender] = f.run_nonce
        data = self.assembler.add(f, self.key)
        if data is None or data is transfer.DUPLICATE:
            return None
        item = ITEM_BYTES.get(h.dtype)
        if h.dtype != DTYPES[h.op] or len(data) != _STATE.size + h.numel * item:
            self.losses["bad_step_payload"] += 1  # sealed by a room laptop, yet not what it says: never used
            return None
        epoch, base = _STATE.unpack_from(data)
        return StepTensor(h.sender, h.op, h.seq, epoch, base, data[_STATE.size:], self.assembler.last_packets)

    def forget_before(self, step: int) -> int:
        """Drop unfinished tensors of steps before `step` (snapshots and sync payloads: `SLOW_OPS` steps
        later); returns how many there were (counted as `incomplete_tensor` losses)."""
        return self.assembler.forget(lambda seq, op: seq < step - SLOW_OPS.get(op, 0))


def frame_messages(data: bytes, *, message_bytes: int, count: int, session: int, sender: int, stream: str,
                   step: int, epoch: int = 0, base: int = 0, shown_us: int = 0,
                   clock_echo: tuple[int, int, int] = transfer.NO_ECHO, key: RoomKey = NO_KEY,
                   run_nonce: int = 1, nonce_echo: tuple[int, ...] = (), tid: int = 1) -> list[bytes]:
    """`count` frame messages (source packets first, then repair) of one tensor, as a sender's transfer
    `tid`: for tools and tests (a node's ScreenWriter frames each one just before it is shown)."""
    head, sealed = StepSender(session, sender, key, run_nonce, first_tid=tid).transfer(stream, step, data, epoch, base)
    psize = transfer.packet_size_for(message_bytes, len(nonce_echo), echoes=True)
    t = frames.fountain(sealed, message_bytes=message_bytes, count=count, packet_size=psize)
    return [transfer.frame_message(head, t, i, message_bytes=message_bytes, shown_us=shown_us, run_nonce=run_nonce,
                                   clock_echo=clock_echo, nonce_echo=tuple(nonce_echo), key=key)
            for i in range(len(t.packets))]


def full_echo(nonce_echo: tuple[int, ...] | None, handshake: Handshake) -> tuple[int, ...] | None:
    """A frame's echo (the low 32 bits of each node's run nonce as its sender last saw it) as the
    handshake's full nonces: this node's own where the bits match it, a peer's where they match the nonce
    this node knows of it, else 0 (nothing). A recording of another run matches this node's new nonce
    with a chance of 1 in 2^32 a frame."""
    if nonce_echo is None:
        return None
    out = []
    for r in range(handshake.world):
        v = nonce_echo[r] if r < len(nonce_echo) else 0
        known = (handshake.nonce if r == handshake.rank else
                 handshake.trusted.get(r, handshake.seen.get(r, handshake.relayed.get(r, 0))))
        out.append(known if known and v and known & 0xFFFFFFFF == v else 0)
    return tuple(out)


@dataclass(frozen=True)
class StepReceived:
    """What one frame message did: why it was refused (None: used), the frame (None if it failed its
    check), whether the handshake changed, and the tensor it completed, if any."""

    frame: transfer.TransferFrame | None
    refused: str | None = None
    handshake_changed: bool = False
    tensor: StepTensor | None = None


class StepReceiver:
    """The built-in run's whole receive path for one frame message, pure (the FrameDecoder runs it; the
    attack bench and the fuzzer feed it bytes they make up): the check under the room key, the session,
    the sender, the run handshake (None: an observer's, or a room replaying a recording: not checked),
    then the assembler. Never raises for bad input; every refusal has a reason."""

    def __init__(self, me: int, world: int, session: int, key: RoomKey = NO_KEY,
                 handshake: Handshake | None = None, assembler: StepAssembler | None = None) -> None:
        self.me, self.world, self.session, self.key = me, world, session, key
        self.handshake = handshake
        self.assembler = assembler if assembler is not None else StepAssembler(key)

    def parse(self, message: bytes) -> tuple[transfer.TransferFrame | None, str | None]:
        """The frame and, if it is not this room's, why (`foreign_session`, `unknown_sender`)."""
        try:
            f = transfer.parse_message(message, self.key)
        except frames.FrameError as e:
            return None, e.reason
        if f.session != self.session:
            return f, "foreign_session"
        if f.sender >= self.world or f.sender == self.me:
            return f, "unknown_sender"
        return f, None

    def receive(self, message: bytes) -> StepReceived:
        f, refused = self.parse(message)
        if refused is not None:
            return StepReceived(f, refused)
        return self.accept(f)

    def accept(self, f: transfer.TransferFrame) -> StepReceived:
        """A frame of this room (parsed, session and sender checked): the handshake, then its packet."""
        hs, changed = self.handshake, False
        if hs is not None:
            before = (hs.echo(), hs.trust_mask())
            refused = hs.heard(f.sender, f.run_nonce, full_echo(f.nonce_echo, hs), f.trusts, f.shown_us)
            changed = (hs.echo(), hs.trust_mask()) != before
            if refused:
                return StepReceived(f, refused, changed)
        return StepReceived(f, None, changed, self.assembler.add(f))
