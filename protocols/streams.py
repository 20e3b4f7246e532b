"""The built-in run's tensors as point-to-point transfers, and the state each belongs to.

The built-in run (`python -m wccl.node`: a parameter server, its workers and
observers, on a step schedule) moves four kinds of tensors, each one
acknowledged transfer (protocols.transfer) whose op names its stream and
whose `seq` is the training step it belongs to:

- `grad`: a worker's gradient, encoded by the run's codec (wccl.compression)
- `avg`: the server's word on a step: its average (the same codec), or empty
  when the step was skipped (too few usable gradients: the state stays)
- `params`: a snapshot of the server's training state (protocols.snapshot)
- `sync`: an `Announce` or a `Hello` (protocols.sync)

Which model state a tensor belongs to is the training protocol's business,
not the link's: the server's `epoch` (it grows when the server resumes from a
checkpoint) and `base` (how many updates that state had seen) travel in the
payload's first 6 bytes (epoch u16, base u32, big endian), sealed with it
under the room key like every transfer's bytes. Pure: no I/O.
"""

from __future__ import annotations

import struct

from protocols.messages import TensorReceived, TransferArrived

STREAMS = ("grad", "avg", "params", "sync")
_STATE = struct.Struct(">HI")
OVERHEAD = _STATE.size  # bytes the envelope adds to a tensor


class StreamError(ValueError):
    """Bytes too short to hold a stream's envelope."""


def wrap(epoch: int, base: int, payload: bytes) -> bytes:
    """The transfer's bytes: the state the tensor belongs to, then the tensor."""
    return _STATE.pack(epoch, base) + payload


def unwrap(data: bytes) -> tuple[int, int, bytes]:
    """(epoch, base, tensor bytes) of a transfer's bytes."""
    if len(data) < _STATE.size:
        raise StreamError(f"a stream's transfer of {len(data)} bytes holds no envelope")
    epoch, base = _STATE.unpack_from(data)
    return epoch, base, bytes(data[_STATE.size:])


def received(t: TransferArrived, data: bytes, stream: str, origin: str, node: str, now: float) -> TensorReceived:
    """The tensor `t` brought this node (`data`: its bytes, the envelope first; `origin`: the node that sent
    it), for the actors that train; StreamError if `data` holds no envelope."""
    epoch, base, payload = unwrap(data)
    return TensorReceived(sender=node, step=t.seq, time=now, origin=origin, stream=stream, payload=payload,
                          frames=max(1, t.frames), epoch=epoch, base=base)
