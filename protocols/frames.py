"""The optical frame format and the packetisation of a tensor into frames.

A frame is a fixed number of bytes (what the cell grid carries):

    header (25 bytes, big endian)
      magic "WC" | version u8 | session u16 | sender u8 | stream u8 |
      step u32 | seq u16 | count u16 | total_len u32 | tensor_crc u32 |
      payload_len u16
    payload (payload_len bytes)
    crc32 over header + payload (4 bytes)
    zero padding up to the frame size

A tensor's bytes are cut into `count` frames (`seq` 0..count-1). The
receiver accepts a frame only if its CRC matches, and a tensor only when all
its frames arrived and the CRC of the reassembled bytes equals `tensor_crc`:
anything else is a counted loss, never a wrong tensor.
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from dataclasses import dataclass, field

from protocols.messages import StreamKind

MAGIC = b"WC"
VERSION = 1
_HEADER = struct.Struct(">2sBHBBIHHIIH")
HEADER_BYTES = _HEADER.size
CRC_BYTES = 4
OVERHEAD_BYTES = HEADER_BYTES + CRC_BYTES

STREAM_IDS: dict[StreamKind, int] = {"grad": 1, "avg": 2}
STREAM_NAMES: dict[int, StreamKind] = {v: k for k, v in STREAM_IDS.items()}


class FrameError(ValueError):
    """A frame that cannot be trusted; `reason` is a constant snake_case code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Packet:
    """One decoded frame."""

    session: int
    sender: int
    stream: StreamKind
    step: int
    seq: int
    count: int
    total_len: int
    tensor_crc: int
    payload: bytes


def payload_capacity(frame_bytes: int) -> int:
    cap = frame_bytes - OVERHEAD_BYTES
    if cap <= 0:
        raise ValueError(f"a frame of {frame_bytes} bytes cannot hold the {OVERHEAD_BYTES}-byte header and CRC")
    return min(cap, 0xFFFF)


def packetize(
    data: bytes, *, frame_bytes: int, session: int, sender: int, stream: StreamKind, step: int
) -> list[bytes]:
    """Cut `data` into frames of exactly `frame_bytes` bytes each."""
    cap = payload_capacity(frame_bytes)
    count = max(1, -(-len(data) // cap))
    if count > 0xFFFF:
        raise ValueError(f"{len(data)} bytes need {count} frames, more than a tensor may have (65535)")
    tensor_crc = zlib.crc32(data)
    frames = []
    for seq in range(count):
        chunk = data[seq * cap : (seq + 1) * cap]
        header = _HEADER.pack(
            MAGIC, VERSION, session, sender, STREAM_IDS[stream], step, seq, count, len(data), tensor_crc, len(chunk)
        )
        body = header + chunk
        frame = body + zlib.crc32(body).to_bytes(4, "big")
        frames.append(frame + bytes(frame_bytes - len(frame)))
    return frames


def parse_header(frame: bytes) -> tuple:
    """The header's fields, unverified (only the frame CRC vouches for them)."""
    if len(frame) < HEADER_BYTES:
        raise FrameError("short_frame", f"{len(frame)} bytes")
    fields = _HEADER.unpack_from(frame)
    if fields[0] != MAGIC:
        raise FrameError("bad_magic")
    if fields[1] != VERSION:
        raise FrameError("bad_version", str(fields[1]))
    return fields


def parse_frame(frame: bytes) -> Packet:
    """Check and decode one frame; raises FrameError for anything untrustworthy."""
    if len(frame) < OVERHEAD_BYTES:
        raise FrameError("short_frame", f"{len(frame)} bytes")
    _, _, session, sender, stream_id, step, seq, count, total_len, tensor_crc, plen = parse_header(frame)
    end = HEADER_BYTES + plen
    if end + CRC_BYTES > len(frame):
        raise FrameError("bad_length", f"payload_len {plen}")
    if zlib.crc32(frame[:end]) != int.from_bytes(frame[end : end + CRC_BYTES], "big"):
        raise FrameError("crc_mismatch")
    # Fields below are only meaningful once the CRC vouched for them.
    if stream_id not in STREAM_NAMES:
        raise FrameError("unknown_stream", str(stream_id))
    if count == 0 or seq >= count:
        raise FrameError("bad_sequence", f"seq {seq} of {count}")
    return Packet(
        session=session,
        sender=sender,
        stream=STREAM_NAMES[stream_id],
        step=step,
        seq=seq,
        count=count,
        total_len=total_len,
        tensor_crc=tensor_crc,
        payload=bytes(frame[HEADER_BYTES:end]),
    )


@dataclass
class Reassembler:
    """Collects packets into whole tensors.

    Consumes `Packet`s; `add` returns the tensor's bytes once every frame of it
    arrived and its CRC matches, else None. Duplicates are ignored (counted).
    Losses are counted in `losses` by reason.
    """

    max_pending: int = 64
    _parts: dict[tuple[int, str, int], dict[int, bytes]] = field(default_factory=dict)
    _meta: dict[tuple[int, str, int], tuple[int, int, int]] = field(default_factory=dict)
    _done: set[tuple[int, str, int]] = field(default_factory=set)
    losses: Counter = field(default_factory=Counter)
    duplicates: int = 0

    def seen(self, sender: int, stream: StreamKind, step: int, seq: int) -> bool:
        key = (sender, stream, step)
        return key in self._done or seq in self._parts.get(key, {})

    def add(self, p: Packet) -> bytes | None:
        key = (p.sender, p.stream, p.step)
        if key in self._done:
            self.duplicates += 1
            return None
        meta = (p.count, p.total_len, p.tensor_crc)
        if key in self._meta and self._meta[key] != meta:
            # Two different tensors claim the same (sender, stream, step): trust neither.
            self.losses["conflicting_frames"] += 1
            self._parts.pop(key, None)
            self._meta.pop(key, None)
            return None
        self._meta[key] = meta
        parts = self._parts.setdefault(key, {})
        if p.seq in parts:
            self.duplicates += 1
            return None
        parts[p.seq] = p.payload
        if len(parts) < p.count:
            self._evict()
            return None
        data = b"".join(parts[i] for i in range(p.count))
        del self._parts[key], self._meta[key]
        self._done.add(key)
        if len(data) != p.total_len or zlib.crc32(data) != p.tensor_crc:
            self.losses["tensor_crc_mismatch"] += 1
            return None
        return data

    def forget_before(self, step: int) -> int:
        """Drop incomplete tensors of steps before `step`; returns how many were incomplete."""
        stale = [k for k in self._parts if k[2] < step]
        for k in stale:
            del self._parts[k]
            self._meta.pop(k, None)
        self._done = {k for k in self._done if k[2] >= step}
        if stale:
            self.losses["incomplete_tensor"] += len(stale)
        return len(stale)

    def _evict(self) -> None:
        while len(self._parts) > self.max_pending:
            oldest = min(self._parts, key=lambda k: k[2])
            del self._parts[oldest]
            self._meta.pop(oldest, None)
            self.losses["evicted_incomplete"] += 1
