"""Payloads of the "sync" stream: what nodes tell each other about time and state.

The frame header of every frame already carries the clock-sync timestamps
(protocols.frames.Timing); these payloads carry the rest:

- `Announce` (the parameter server): the schedule every node follows, on the
  server's clock: step 0 starts at `t0_us`, the phases and their lengths, the
  number of steps, the server's epoch (it grows when the server resumes from
  a checkpoint) and how many updates its state has seen; `final` once the
  phases are fixed (an `auto` schedule is sized from the start-up frames).
- `Hello` (any other node): it is there, whether it wants a snapshot of the
  training state (it restarted), and the share of the server's frames it
  read (per mille) and its clock error as it estimates it: the server sizes
  an `auto` schedule from them.

Layout (big endian): kind u8 (1 announce, 2 hello), then the fields below.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

PHASES = ("compute", "uplink", "reduce", "downlink", "apply", "guard")
_ANNOUNCE = struct.Struct(">BqIHIBBB")
_PHASE = struct.Struct(">BI")
_HELLO = struct.Struct(">BBiHHI")


class SyncError(ValueError):
    """Bytes that are not a sync payload."""


@dataclass(frozen=True)
class Announce:
    t0_us: int
    phases: tuple[tuple[str, float], ...]
    steps: int
    epoch: int
    applied: int
    final: bool = True  # False while the server is still measuring the link (an auto schedule)
    layout: int = 0  # the layout of the ladder the run uses (protocol: an index into the shared config)

    def encode(self) -> bytes:
        out = [_ANNOUNCE.pack(1, self.t0_us, self.steps, self.epoch, self.applied, int(self.final), self.layout,
                              len(self.phases))]
        for name, seconds in self.phases:
            out.append(_PHASE.pack(PHASES.index(name), round(seconds * 1e6)))
        return b"".join(out)


@dataclass(frozen=True)
class Hello:
    wants_snapshot: bool
    applied: int  # updates the node's state has seen (-1: no state)
    epoch: int
    rx_per_mille: int  # share of the server's frames this node read lately (0..1000)
    sync_err_us: int = 0  # this node's clock error bound against the server's, as it estimates it
    rx_layouts: tuple[int, ...] = ()  # per layout of the ladder: share of the server's frames read (per mille)

    def encode(self) -> bytes:
        return _HELLO.pack(2, int(self.wants_snapshot), self.applied, self.epoch, self.rx_per_mille,
                           self.sync_err_us) + bytes([len(self.rx_layouts)]) + b"".join(
                               struct.pack(">H", r) for r in self.rx_layouts)


def decode(data: bytes) -> Announce | Hello:
    if not data:
        raise SyncError("empty sync payload")
    try:
        if data[0] == 1:
            _, t0, steps, epoch, applied, final, layout, n = _ANNOUNCE.unpack_from(data)
            if len(data) != _ANNOUNCE.size + n * _PHASE.size:
                raise SyncError("announce: wrong length")
            phases = []
            for i in range(n):
                pid, us = _PHASE.unpack_from(data, _ANNOUNCE.size + i * _PHASE.size)
                if pid >= len(PHASES):
                    raise SyncError(f"announce: unknown phase {pid}")
                phases.append((PHASES[pid], us / 1e6))
            return Announce(t0, tuple(phases), steps, epoch, applied, bool(final), layout)
        if data[0] == 2:
            if len(data) < _HELLO.size + 1 or len(data) != _HELLO.size + 1 + 2 * data[_HELLO.size]:
                raise SyncError("hello: wrong length")
            _, wants, applied, epoch, rx, err = _HELLO.unpack_from(data)
            n = data[_HELLO.size]
            layouts = struct.unpack_from(f">{n}H", data, _HELLO.size + 1)
            return Hello(bool(wants), applied, epoch, rx, err, tuple(layouts))
    except struct.error as e:
        raise SyncError(f"malformed sync payload: {e}") from None
    raise SyncError(f"unknown sync payload kind {data[0]}")
