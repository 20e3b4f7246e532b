"""What a rank does with one transfer-frame message: the whole receive path, pure.

`TransferReceiver.receive(message)` checks the frame under the room key
(protocols.transfer.parse_message), refuses frames of another session, of
an unknown sender or of this rank itself, asks the run handshake
(protocols.security.Handshake) whether the frame belongs to this run and is
recent, and only then uses its acknowledgements and its packet
(TransferAssembler: a tensor is delivered once rebuilt, its digest matches
and its sealed bytes open under the key), and what it says of every rank's
holdings (`holds`: the most each rank is known to hold, from any frame of
this run: counts only grow, so an old frame read late tells nothing new). The FrameDecoder actor calls it
for every transfer frame it reads; the attack bench and the fuzzer call
exactly the same code with bytes they make up.

Every refusal has a reason (`Received.refused`), counted by the caller;
nothing partial or unproven is ever returned as data.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocols import transfer
from protocols.frames import FrameError
from protocols.security import NO_KEY, Handshake, RoomKey


@dataclass(frozen=True)
class Received:
    """The outcome of one frame: why it was refused (None: used), the sender's acknowledgement of this
    rank if it changed, whether the handshake changed, and the transfer it completed (bytes), if any,
    or `duplicate` (a transfer this rank already has: show the acknowledgement again)."""

    frame: transfer.TransferFrame | None
    refused: str | None = None
    peer_ack: transfer.Ack | None = None
    handshake_changed: bool = False
    data: bytes | None = None
    duplicate: bool = False
    holds_changed: bool = False


class TransferReceiver:
    def __init__(self, rank: int, world: int, session: int, key: RoomKey = NO_KEY,
                 handshake: Handshake | None = None, assembler: transfer.TransferAssembler | None = None) -> None:
        self.rank, self.world, self.session = rank, world, session
        self.key = key
        self.handshake = handshake or Handshake(rank, world)
        self.assembler = assembler or transfer.TransferAssembler()
        self._peer_acks: dict[int, transfer.Ack] = {}
        self.holds: tuple[int, ...] = (0,) * world  # how many collectives each rank is known to hold

    def receive(self, message: bytes, now: float | None = None, layout: int = 0) -> Received:
        """One frame message (after error correction) read in `layout` (its index in the start-up ladder),
        at `now` on this node's clock (None: time is not kept, no discovery). Never raises for bad input: a frame that fails its check or makes no sense
        comes back refused with the FrameError's reason."""
        try:
            f = transfer.parse_message(message, self.key)
        except FrameError as e:
            return Received(None, e.reason)
        if f.session != self.session:
            return Received(f, "foreign_session")
        if f.sender >= self.world or f.sender == self.rank:
            return Received(f, "unknown_sender")
        hs = self.handshake
        before = self._state()
        refused = hs.heard(f.sender, f.run_nonce, f.echo, f.trusts, f.shown_us, f.rows, layout)
        if now is not None:
            hs.tick(now)
        changed = self._state() != before
        if refused:
            # Another run's frame, a replay, or a peer whose proof of freshness has not arrived yet:
            # neither its transfer nor its acknowledgements are used (the sender shows them again).
            return Received(f, refused, handshake_changed=changed)
        ack = f.acks[self.rank]
        peer_ack = None
        if self._peer_acks.get(f.sender) != ack:
            self._peer_acks[f.sender] = peer_ack = ack
        holds = tuple(max(a, b) for a, b in zip(self.holds, f.holds))
        more = holds != self.holds
        self.holds = holds
        if f.header is None:
            return Received(f, None, peer_ack, changed, holds_changed=more)
        if f.header.dest and not f.header.dest >> self.rank & 1:
            # Meant for other readers (a camera films every screen in view): never delivered here, but
            # counted as had, so that a transfer this rank never needed leaves no gap in its
            # acknowledgement of the sender, which would hold back those of later transfers meant for it.
            self.assembler.skip(f.header.sender, f.header.tid)
            return Received(f, None, peer_ack, changed, holds_changed=more)
        data = self.assembler.add(f, self.key)
        if data is transfer.DUPLICATE:
            return Received(f, None, peer_ack, changed, duplicate=True, holds_changed=more)
        return Received(f, None, peer_ack, changed, data, holds_changed=more)

    def _state(self):
        hs = self.handshake
        return hs.echo(), hs.trust_mask(), hs.complete, hs.greeting, hs.sight.table() if hs.sight else None
