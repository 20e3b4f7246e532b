"""The optical frame format, and a tensor's bytes <-> frames (fountain coded).

A tensor's bytes are cut by a RaptorQ fountain code (RFC 6330) into
`packet_size`-byte packets: the K source packets, then as many repair
packets as the sender has time to show. Any K (rarely K+1 or K+2) distinct
packets rebuild the tensor, whichever frames were lost.

One frame carries one packet. The frame's message (what the inner
Reed-Solomon code protects, see `fec`) is:

    header (55 bytes, big endian)
      magic 0xC7 | version u8 | session u16 | sender u8 | stream u8 | epoch u16 | step u32 | base u32 |
      transfer_len u32 | digest (8 bytes: BLAKE2b-64 of the whole tensor) | packet_size u16 |
      shown_us i64 | echo_peer u8 | echo_shown_us i64 | echo_captured_us i64
    packet (packet_size bytes: RaptorQ payload id + symbol)
    check (8 bytes: BLAKE2b-64 of header + packet, keyed with the room key: protocols.security)
    zero padding up to the message size

`epoch` is the parameter server's incarnation (it grows each time the server
resumes from a checkpoint) and `base` the number of updates the model state
behind the tensor had seen: a gradient computed on another state, or an
average meant for another state, is recognised as such. The timing fields
are the clock sync's (wccl.sync): when the sender's screen showed this
frame (its own clock, microseconds), and an echo of one frame it saw from
`echo_peer` (that frame's `shown_us`, and when the sender's camera caught
it, on the sender's clock); `echo_peer` 255 means none.

A frame is trusted only if its check matches (after error correction); a
tensor only if its rebuilt bytes match the digest. Everything else is a
counted loss, never a wrong tensor.
"""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from dataclasses import dataclass, field

import raptorq

from protocols.messages import StreamKind
from protocols.security import NO_KEY, RoomKey

MAGIC = 0xC7
VERSION = 3
_HEADER = struct.Struct(">BBHBBHIII8sHqBqq")
HEADER_BYTES = _HEADER.size  # 55
NO_PEER = 0xFF
CHECK_BYTES = 8
PAYLOAD_ID_BYTES = 4
OVERHEAD_BYTES = HEADER_BYTES + CHECK_BYTES
SYMBOL_ALIGN = 8
MIN_SYMBOL = 64  # the raptorq package pads smaller packets beyond the size asked for

STREAM_IDS: dict[StreamKind, int] = {"grad": 1, "avg": 2, "params": 3, "sync": 4}
STREAM_NAMES: dict[int, StreamKind] = {v: k for k, v in STREAM_IDS.items()}


class FrameError(ValueError):
    """A frame that cannot be trusted; `reason` is a constant snake_case code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=8).digest()


PERSON = b"wccl-frame"


def packet_size_for(message_bytes: int, overhead: int = OVERHEAD_BYTES) -> int:
    """The largest packet (payload id + aligned symbol) a message of `message_bytes` holds, after
    `overhead` bytes of header and check (default: this frame version's)."""
    symbol = (message_bytes - overhead - PAYLOAD_ID_BYTES) // SYMBOL_ALIGN * SYMBOL_ALIGN
    if symbol < MIN_SYMBOL:
        raise ValueError(f"a frame message of {message_bytes} bytes is too small for a packet "
                         f"(at least {overhead + PAYLOAD_ID_BYTES + MIN_SYMBOL} bytes)")
    return min(symbol + PAYLOAD_ID_BYTES, 0xFFFF)


@dataclass(frozen=True, slots=True)
class Timing:
    """A frame's clock-sync fields (microseconds on the node clocks named)."""

    shown_us: int = 0  # the sender's clock when its screen showed the frame
    echo_peer: int = NO_PEER  # the node whose frame is echoed (NO_PEER: none)
    echo_shown_us: int = 0  # that frame's shown_us (the peer's clock)
    echo_captured_us: int = 0  # when the sender's camera caught it (the sender's clock)


@dataclass(frozen=True, slots=True)
class Packet:
    """One trusted frame's content."""

    session: int
    sender: int
    stream: StreamKind
    step: int
    transfer_len: int
    digest: bytes
    packet: bytes
    epoch: int = 0
    base: int = 0
    timing: Timing = Timing()

    @property
    def packet_id(self) -> int:
        return int.from_bytes(self.packet[:PAYLOAD_ID_BYTES], "big")


def source_packets(transfer_len: int, packet_size: int) -> int:
    """K: how many packets a tensor of `transfer_len` bytes needs at the least."""
    symbol = packet_size - PAYLOAD_ID_BYTES
    return max(1, -(-transfer_len // symbol))


@dataclass(frozen=True, slots=True)
class Transfer:
    """A tensor cut into fountain packets (source packets first, then repair)."""

    length: int
    digest: bytes
    packet_size: int
    packets: tuple[bytes, ...]


def fountain(data: bytes, *, message_bytes: int, count: int, packet_size: int | None = None) -> Transfer:
    """`count` fountain packets for `data` (fewer if `count` < K: then it cannot be rebuilt).

    `packet_size` (payload id + symbol): default, the largest a version-3 frame of `message_bytes` holds.
    """
    if not data:
        raise ValueError("cannot send an empty tensor")
    psize = packet_size_for(message_bytes) if packet_size is None else packet_size
    k = source_packets(len(data), psize)
    enc = raptorq.Encoder.with_defaults(data, psize)
    packets = [bytes(p) for p in enc.get_encoded_packets(max(0, count - k))][:count]
    for p in packets:
        if len(p) != psize:
            raise RuntimeError(f"fountain packet of {len(p)} bytes, expected {psize}")
    return Transfer(len(data), digest(data), psize, tuple(packets))


def frame_message(transfer: Transfer, index: int, *, message_bytes: int, session: int, sender: int,
                  stream: StreamKind, step: int, epoch: int = 0, base: int = 0,
                  timing: Timing = Timing(), key: RoomKey = NO_KEY) -> bytes:
    """The frame message (header, packet `index`, check (a MAC under `key`), padding) for one frame of `transfer`."""
    head = _HEADER.pack(MAGIC, VERSION, session, sender, STREAM_IDS[stream], epoch, step, base, transfer.length,
                        transfer.digest, transfer.packet_size, timing.shown_us, timing.echo_peer,
                        timing.echo_shown_us, timing.echo_captured_us)
    body = head + transfer.packets[index]
    msg = body + key.check(body, PERSON)
    return msg + bytes(message_bytes - len(msg))


def encode_tensor(data: bytes, *, message_bytes: int, count: int, session: int, sender: int,
                  stream: StreamKind, step: int, epoch: int = 0, base: int = 0,
                  timing: Timing = Timing(), key: RoomKey = NO_KEY) -> list[bytes]:
    """`count` frame messages for `data`: the source packets first, then repair packets.

    If `count` is smaller than the number of source packets, the first `count`
    are returned (the receiver cannot rebuild the tensor from them alone).
    """
    t = fountain(data, message_bytes=message_bytes, count=count)
    return [frame_message(t, i, message_bytes=message_bytes, session=session, sender=sender, stream=stream,
                          step=step, epoch=epoch, base=base, timing=timing, key=key) for i in range(len(t.packets))]


def parse_message(msg: bytes, key: RoomKey = NO_KEY) -> Packet:
    """Check and decode one frame message; raises FrameError for anything untrustworthy."""
    if len(msg) < OVERHEAD_BYTES + PAYLOAD_ID_BYTES:
        raise FrameError("short_frame", f"{len(msg)} bytes")
    if len(msg) < HEADER_BYTES + CHECK_BYTES:
        raise FrameError("short_frame", f"{len(msg)} bytes")
    (magic, version, session, sender, stream_id, epoch, step, base, tlen, dig, psize, shown, peer, echo_shown,
     echo_captured) = _HEADER.unpack_from(msg)
    end = HEADER_BYTES + psize
    if magic != MAGIC:
        raise FrameError("bad_magic")
    if end + CHECK_BYTES > len(msg) or psize <= PAYLOAD_ID_BYTES:
        raise FrameError("bad_length", f"packet_size {psize}")
    if not key.verify(msg[:end], PERSON, msg[end : end + CHECK_BYTES]):
        raise FrameError("check_mismatch")
    if msg[end + CHECK_BYTES:].count(0) != len(msg) - end - CHECK_BYTES:
        raise FrameError("bad_padding")  # the check does not cover the padding: it must be zeros
    # Fields below are only meaningful once the check vouched for them.
    if version != VERSION:
        raise FrameError("bad_version", str(version))
    if stream_id not in STREAM_NAMES:
        raise FrameError("unknown_stream", str(stream_id))
    if tlen == 0:
        raise FrameError("bad_length", "empty tensor")
    return Packet(session, sender, STREAM_NAMES[stream_id], step, tlen, dig, bytes(msg[HEADER_BYTES:end]),
                  epoch, base, Timing(shown, peer, echo_shown, echo_captured))


@dataclass
class Reassembler:
    """Rebuilds tensors from packets (any K distinct ones suffice).

    Consumes `Packet`s; `add` returns the tensor's bytes once they can be
    rebuilt and match the digest, else None. Repeated packets are counted in
    `duplicates`; losses are counted in `losses` by reason.
    """

    max_pending: int = 64
    _decoders: dict[tuple[int, str, int, int], tuple[tuple[int, bytes, int], object, set[int]]] = field(
        default_factory=dict)
    _done: dict[tuple[int, str, int, int], bytes] = field(default_factory=dict)
    losses: Counter = field(default_factory=Counter)
    duplicates: int = 0
    last_packets: int = 0  # packets the last rebuilt tensor took

    def add(self, p: Packet) -> bytes | None:
        key = (p.sender, p.stream, p.step, p.epoch)
        if key in self._done:
            self.duplicates += 1
            return None
        meta = (p.transfer_len, p.digest, len(p.packet))
        entry = self._decoders.get(key)
        if entry is not None and entry[0] != meta:
            # Two different tensors claim the same (sender, stream, step): trust neither.
            self.losses["conflicting_frames"] += 1
            del self._decoders[key]
            return None
        if entry is None:
            entry = (meta, raptorq.Decoder.with_defaults(p.transfer_len, len(p.packet)), set())
            self._decoders[key] = entry
            self._evict()
        _, decoder, seen = entry
        if p.packet_id in seen:
            self.duplicates += 1
            return None
        seen.add(p.packet_id)
        data = decoder.decode(p.packet)
        if data is None:
            return None
        del self._decoders[key]
        self.last_packets = len(seen)
        data = bytes(data)
        self._done[key] = p.digest
        if len(data) != p.transfer_len or digest(data) != p.digest:
            self.losses["tensor_digest_mismatch"] += 1
            return None
        return data

    def packets_seen(self, sender: int, stream: str, step: int, epoch: int = 0) -> int:
        entry = self._decoders.get((sender, stream, step, epoch))
        return len(entry[2]) if entry else 0

    # Streams whose tensors may be shown over several steps: kept this many steps longer.
    SLOW_STREAMS = {"params": 64, "sync": 64}

    def forget_before(self, step: int) -> int:
        """Drop unfinished tensors of steps before `step`; returns how many there were.

        A snapshot ("params") is numbered by the state it holds and shown over
        the following steps, so it is kept longer.
        """
        def old(k: tuple) -> bool:
            return k[2] < step - self.SLOW_STREAMS.get(k[1], 0)

        stale = [k for k in self._decoders if old(k)]
        for k in stale:
            del self._decoders[k]
        self._done = {k: v for k, v in self._done.items() if not old(k)}
        if stale:
            self.losses["incomplete_tensor"] += len(stale)
        return len(stale)

    def _evict(self) -> None:
        while len(self._decoders) > self.max_pending:
            oldest = min(self._decoders, key=lambda k: k[2])
            del self._decoders[oldest]
            self.losses["evicted_incomplete"] += 1
