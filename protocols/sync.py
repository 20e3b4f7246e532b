"""Payloads of the "sync" stream: what nodes tell each other about time and state.

The header of every frame already carries the clock-sync timestamps
(protocols.frames.Timing); these payloads carry the rest:

- `Announce` (the parameter server): the schedule every node follows, on the
  server's clock: step `first_step` starts at `t0_us`, the phases and their
  lengths from that step on (the steps before it keep the schedule announced
  before), the number of steps, the server's epoch (it grows when the server
  resumes from a checkpoint), how many updates its state has seen, and the
  revision (it grows each time the server changes the schedule while the
  run goes: a node keeps the latest).
- `Hello` (any other node): it is there, whether it wants a snapshot of the
  training state (it joins late or restarted), and its clock error as it
  estimates it.
- `Regroup` (with exchange = "collectives", the rank with the `server` role,
  answering a restarted rank's Hello): the group's collectives before
  `first_seq` are void; collective `first_seq` is that rank's broadcast of
  its training state (`state_bytes` long, protocols.snapshot), and every
  rank goes on from training step `step` with it.
- `ClockMap` (a node that reads the server only through other laptops syncs
  against the next of them on its way there): that node's own estimate of
  the server's clock, to compose with its estimate against it.

Layout (big endian): kind u8 (1 announce, 2 hello, 3 regroup, 4 clock map),
then the fields below.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

PHASES = ("compute", "uplink", "reduce", "downlink", "apply", "guard")
_ANNOUNCE = struct.Struct(">BqIHIIHB")
_PHASE = struct.Struct(">BI")
_HELLO = struct.Struct(">BBiHI")
_REGROUP = struct.Struct(">BIIIH")
_CLOCK_MAP = struct.Struct(">BdddI")


class SyncError(ValueError):
    """Bytes that are not a sync payload."""


@dataclass(frozen=True)
class Announce:
    t0_us: int
    phases: tuple[tuple[str, float], ...]
    steps: int
    epoch: int
    applied: int
    first_step: int = 0
    revision: int = 0

    def encode(self) -> bytes:
        out = [_ANNOUNCE.pack(1, self.t0_us, self.steps, self.epoch, self.applied, self.first_step, self.revision,
                              len(self.phases))]
        for name, seconds in self.phases:
            out.append(_PHASE.pack(PHASES.index(name), round(seconds * 1e6)))
        return b"".join(out)


@dataclass(frozen=True)
class Hello:
    wants_snapshot: bool
    applied: int  # updates the node's state has seen (-1: no state)
    epoch: int
    sync_err_us: int = 0  # this node's clock error bound against the server's, as it estimates it

    def encode(self) -> bytes:
        return _HELLO.pack(2, int(self.wants_snapshot), self.applied, self.epoch, self.sync_err_us)


@dataclass(frozen=True)
class Regroup:
    first_seq: int  # the group's next collective (the lead's state, broadcast): every one before it is void
    step: int  # the training step every rank goes on from
    state_bytes: int  # the size of that state (protocols.snapshot)
    group: int  # the ranks whose collectives these are from `first_seq` on (a bit a rank)

    def encode(self) -> bytes:
        return _REGROUP.pack(3, self.first_seq, self.step, self.state_bytes, self.group)


@dataclass(frozen=True)
class ClockMap:
    """A node's estimate of the server's clock: `server = local + offset + skew * (local - pivot)`, on its
    own `local` clock (the one its frames are stamped with), within `err_us`."""

    offset: float
    skew: float
    pivot: float
    err_us: int = 0

    def encode(self) -> bytes:
        return _CLOCK_MAP.pack(4, self.offset, self.skew, self.pivot, self.err_us)

    def compose(self, offset: float, skew: float, pivot: float) -> tuple[float, float]:
        """Another node's map to this node's clock (`this = local + offset + skew * (local - pivot)`) followed
        by this map: that node's map to the server's clock, as (offset at `pivot`, skew)."""
        here = pivot + offset
        server = here + self.offset + self.skew * (here - self.pivot)
        return server - pivot, (1.0 + skew) * (1.0 + self.skew) - 1.0


def decode(data: bytes) -> Announce | Hello | Regroup | ClockMap:
    if not data:
        raise SyncError("empty sync payload")
    try:
        if data[0] == 1:
            _, t0, steps, epoch, applied, first_step, revision, n = _ANNOUNCE.unpack_from(data)
            if len(data) != _ANNOUNCE.size + n * _PHASE.size:
                raise SyncError("announce: wrong length")
            phases = []
            for i in range(n):
                pid, us = _PHASE.unpack_from(data, _ANNOUNCE.size + i * _PHASE.size)
                if pid >= len(PHASES):
                    raise SyncError(f"announce: unknown phase {pid}")
                phases.append((PHASES[pid], us / 1e6))
            return Announce(t0, tuple(phases), steps, epoch, applied, first_step, revision)
        if data[0] == 2:
            if len(data) != _HELLO.size:
                raise SyncError("hello: wrong length")
            _, wants, applied, epoch, err = _HELLO.unpack(data)
            return Hello(bool(wants), applied, epoch, err)
        if data[0] == 3:
            if len(data) != _REGROUP.size:
                raise SyncError("regroup: wrong length")
            _, first_seq, step, state_bytes, group = _REGROUP.unpack(data)
            return Regroup(first_seq, step, state_bytes, group)
        if data[0] == 4:
            if len(data) != _CLOCK_MAP.size:
                raise SyncError("clock map: wrong length")
            _, offset, skew, pivot, err = _CLOCK_MAP.unpack(data)
            if not all(map(math.isfinite, (offset, skew, pivot))) or abs(skew) >= 0.01:
                raise SyncError("clock map: not a clock's estimate")
            return ClockMap(offset, skew, pivot, err)
    except struct.error as e:
        raise SyncError(f"malformed sync payload: {e}") from None
    raise SyncError(f"unknown sync payload kind {data[0]}")
