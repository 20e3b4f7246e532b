"""The parameter server's snapshot of the training state, as bytes on the "params" stream.

A snapshot holds the state after `applied` updates of server epoch `epoch`:
the model's parameters and the optimiser's state, as named flat float32
arrays (exact: the receiver's replica continues bit for bit). Layout (big
endian): magic b"WSNP" | version u8 | epoch u16 | applied u32 | count u8,
then per array: name length u8 | name (ASCII) | numel u32 | numel float32.
The frame layer's digest vouches for the bytes; `decode_snapshot` still
checks the structure and raises `SnapshotError` for anything malformed.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"WSNP"
VERSION = 1
_HEAD = struct.Struct(">4sBHIB")
_ITEM = struct.Struct(">I")


class SnapshotError(ValueError):
    """Bytes that are not a snapshot this version can read."""


@dataclass(frozen=True)
class Snapshot:
    applied: int
    epoch: int
    arrays: dict[str, np.ndarray]

    def digest(self) -> str:
        return state_digest(self.arrays)


def state_digest(arrays: dict[str, np.ndarray]) -> str:
    """A short digest of a training state (names and exact float32 values)."""
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(arrays):
        h.update(name.encode())
        h.update(np.ascontiguousarray(arrays[name], dtype=">f4").tobytes())
    return h.hexdigest()


def encode_snapshot(s: Snapshot) -> bytes:
    if len(s.arrays) > 255:
        raise ValueError("a snapshot holds at most 255 arrays")
    out = [_HEAD.pack(MAGIC, VERSION, s.epoch, s.applied, len(s.arrays))]
    for name in sorted(s.arrays):
        raw = name.encode("ascii")
        a = np.ascontiguousarray(s.arrays[name], dtype=">f4").reshape(-1)
        out += [bytes([len(raw)]), raw, _ITEM.pack(a.size), a.tobytes()]
    return b"".join(out)


def decode_snapshot(data: bytes) -> Snapshot:
    if len(data) < _HEAD.size:
        raise SnapshotError("short snapshot")
    magic, version, epoch, applied, count = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise SnapshotError("not a snapshot")
    if version != VERSION:
        raise SnapshotError(f"snapshot version {version}, expected {VERSION}")
    pos, arrays = _HEAD.size, {}
    try:
        for _ in range(count):
            n = data[pos]
            name = data[pos + 1: pos + 1 + n].decode("ascii")
            pos += 1 + n
            (numel,) = _ITEM.unpack_from(data, pos)
            pos += _ITEM.size
            end = pos + 4 * numel
            if end > len(data):
                raise SnapshotError("truncated snapshot")
            arrays[name] = np.frombuffer(data[pos:end], dtype=">f4").astype(np.float32)
            pos = end
    except (IndexError, struct.error, UnicodeDecodeError) as e:
        raise SnapshotError(f"malformed snapshot: {e}") from None
    if pos != len(data):
        raise SnapshotError("trailing bytes after the snapshot")
    return Snapshot(applied, epoch, arrays)
