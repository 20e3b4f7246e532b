"""Fountain coding of a tensor's bytes, and what every frame format shares.

A tensor's bytes are cut by a RaptorQ fountain code (RFC 6330) into
`packet_size`-byte packets: the K source packets, then as many repair
packets as the sender has time to show. Any K (rarely K+1 or K+2) distinct
packets rebuild the tensor, whichever frames were lost.

One frame carries one packet. The frame format itself (header, packet, a
keyed check, padding) is protocols.transfer's; this module holds the parts
of it that do not depend on the header: the magic byte, the check's size,
the clock-sync timing fields, and the error every untrustworthy frame
raises.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import raptorq

MAGIC = 0xC7
NO_PEER = 0xFF
CHECK_BYTES = 8
PAYLOAD_ID_BYTES = 4
SYMBOL_ALIGN = 8
# The smallest symbol a frame's packet carries (`raptorq_size`: the package makes symbols of 8 bytes and
# up); below 32 a frame's header outweighs its packet several times over.
MIN_SYMBOL = 32
MIN_PACKET = PAYLOAD_ID_BYTES + MIN_SYMBOL  # the smallest packet a frame carries


class FrameError(ValueError):
    """A frame that cannot be trusted; `reason` is a constant snake_case code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=8).digest()


@dataclass(frozen=True, slots=True)
class Timing:
    """A frame's clock-sync fields (microseconds on the node clocks named)."""

    shown_us: int = 0  # the sender's clock when its screen showed the frame
    echo_peer: int = NO_PEER  # the node whose frame is echoed (NO_PEER: none)
    echo_shown_us: int = 0  # that frame's shown_us (the peer's clock)
    echo_captured_us: int = 0  # when the sender's camera caught it (the sender's clock)


def raptorq_size(packet_size: int) -> int:
    """The size to give raptorq's `with_defaults` (encoder and decoder alike) for packets of `packet_size`
    bytes: their symbol. The package makes symbols of a size under 64 as asked and rounds a bigger one down
    to a multiple of 8, then adds the payload id; a symbol, a multiple of 8, is the one size it keeps at
    every size."""
    return packet_size - PAYLOAD_ID_BYTES


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


def fountain(data: bytes, *, message_bytes: int, count: int, packet_size: int) -> Transfer:
    """`count` fountain packets of `packet_size` bytes (payload id + symbol) for `data`, to go in frames
    of `message_bytes` (fewer if `count` < K: then it cannot be rebuilt)."""
    if not data:
        raise ValueError("cannot send an empty tensor")
    if packet_size > message_bytes:
        raise ValueError(f"a packet of {packet_size} bytes does not fit a message of {message_bytes}")
    psize = packet_size
    k = source_packets(len(data), psize)
    enc = raptorq.Encoder.with_defaults(data, raptorq_size(psize))
    packets = [bytes(p) for p in enc.get_encoded_packets(max(0, count - k))][:count]
    for p in packets:
        if len(p) != psize:
            raise RuntimeError(f"fountain packet of {len(p)} bytes, expected {psize}")
    return Transfer(len(data), digest(data), psize, tuple(packets))
