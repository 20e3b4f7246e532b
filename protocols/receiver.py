"""What a rank does with one transfer-frame message: the whole receive path, pure.

`TransferReceiver.receive(message)` checks the frame under the room key
(protocols.transfer.parse_message), refuses frames of another session, of
an unknown sender or of this rank itself, asks the run handshake
(protocols.security.Handshake) whether the frame belongs to this run and is
recent, and only then uses its acknowledgements and its packet
(TransferAssembler: a tensor is delivered once rebuilt, its digest matches
and its sealed bytes open under the key), and what it says of every rank's
holdings (`holds`: the most each rank is known to hold, from any frame of
this run: counts only grow, so an old frame read late tells nothing new). A
status frame's floor (protocols.transfer) settles the sender's transfers up
to it. The FrameDecoder actor calls it for every transfer frame it reads;
the attack bench and the fuzzer call exactly the same code with bytes they
make up.

A peer that started again (the handshake trusts a new run nonce of it,
proven fresh: `Received.restarted`) numbers its transfers from 1 again: its
earlier incarnation's transfers, unfinished and rebuilt, are forgotten (its
tid 1 is new, not a duplicate), and so is what that incarnation
acknowledged of this rank's (the new one's acknowledgements are passed on as
they come, from nothing). Frames of the earlier incarnation are refused
(`other_run`). Holdings are not reset: a rank's count is the group's
collective sequence, relayed camera to camera and only ever raised, so the
new incarnation is known to hold what its predecessor held (a collective
layer that lets a rank start again must carry on that sequence).

A listener (`rank` None: an observer, which shows nothing) has no
handshake: it takes every frame of the session that passes its check,
whoever the transfer is meant for, and tells a sender's new incarnation by
its run nonce: a frame of another nonce shown before the latest it read of
the sender is the earlier run's, filmed late (`other_run`); one shown after
it starts the sender's transfers afresh (`restarted`).

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
    or `duplicate` (a transfer this rank already has: show the acknowledgement again); whether the sender
    is a new incarnation, whether this rank's acknowledgement of it changed by its floor, and whether the
    sender reads this rank and its status frame shows an older row of this rank than this rank's own
    (`behind`: this rank's status frames have news for it)."""

    frame: transfer.TransferFrame | None
    refused: str | None = None
    peer_ack: transfer.Ack | None = None
    handshake_changed: bool = False
    data: bytes | None = None
    duplicate: bool = False
    holds_changed: bool = False
    restarted: bool = False  # the sender is a new incarnation (a new run nonce proven fresh): its old transfers forgotten
    acks_changed: bool = False  # this rank's acknowledgement of the sender changed without a transfer (a floor)
    behind: bool = False
    asked: int | None = None  # the layout the sender now asks this rank to show it (protocols.adapt), if changed


class TransferReceiver:
    def __init__(self, rank: int | None, world: int, session: int, key: RoomKey = NO_KEY,
                 handshake: Handshake | None = None, assembler: transfer.TransferAssembler | None = None) -> None:
        """`rank` None: a listener (see the module doc), with no handshake; else `handshake` is the rank's
        (its run nonce: the caller's)."""
        if (rank is None) != (handshake is None):
            raise ValueError("a rank's receive path takes its run handshake; a listener's none")
        self.rank, self.world, self.session = rank, world, session
        self.key = key
        self.handshake = handshake
        self._heard: dict[int, tuple[int, int]] = {}  # a listener's: sender -> (its run nonce, latest shown_us)
        self.assembler = assembler or transfer.TransferAssembler()
        self._peer_acks: dict[int, transfer.Ack] = {}
        self._asked: dict[int, int] = {}  # peer -> the layout it asks this rank for (protocols.adapt)
        self.holds: tuple[int, ...] = (0,) * world  # how many collectives each rank is known to hold
        self.restarts: dict[int, int] = {}  # peer -> new incarnations of it met

    def tick(self, now: float) -> bool:
        """Let the handshake's discovery measure up to `now` with no frame read; True if the handshake changed."""
        if self.handshake is None:
            return False
        before = self._state()
        self.handshake.tick(now)
        return self._state() != before

    def receive(self, message: bytes, now: float | None = None, layout: int = 0, margin: float = 1.0) -> Received:
        """One frame message (after error correction) read in `layout` (its index in the start-up ladder),
        at `now` on this node's clock (None: time is not kept, no discovery), with `margin` of its error
        correction to spare (LinkCodec.margin; discovery weighs its reads by it). Never raises for bad
        input: a frame that fails its check or makes no sense comes back refused with the FrameError's
        reason."""
        try:
            f = transfer.parse_message(message, self.key)
        except FrameError as e:
            return Received(None, e.reason)
        if f.session != self.session:
            return Received(f, "foreign_session")
        if f.sender >= self.world or f.sender == self.rank:
            return Received(f, "unknown_sender")
        if self.handshake is None:
            return self._overheard(f)
        hs = self.handshake
        before = self._state()
        was = hs.trusted.get(f.sender)
        refused = hs.heard(f.sender, f.run_nonce, f.echo, f.trusts, f.shown_us, f.rows, layout, margin)
        restarted = was is not None and hs.trusted.get(f.sender, was) != was
        if restarted:
            # A new incarnation of the sender: it numbers its transfers from 1 again, and knows nothing of
            # this rank's. Forget the old one's, and pass on its acknowledgements as new.
            self.assembler.forget_sender(f.sender)
            self._peer_acks.pop(f.sender, None)
            self.restarts[f.sender] = self.restarts.get(f.sender, 0) + 1
        if now is not None:
            hs.tick(now)
        changed = self._state() != before
        if refused:
            # Another run's frame, a replay, or a peer whose proof of freshness has not arrived yet:
            # neither its transfer nor its acknowledgements are used (the sender shows them again).
            return Received(f, refused, handshake_changed=changed, restarted=restarted)
        ack = f.acks[self.rank]
        if ack is None:  # (no entry of this rank in the frame: no news; none heard yet is none had)
            ack = self._peer_acks.get(f.sender, transfer.Ack())
        peer_ack = None
        if self._peer_acks.get(f.sender) != ack:
            self._peer_acks[f.sender] = peer_ack = ack
        holds = tuple(max(a, b) for a, b in zip(self.holds, f.holds))
        more = holds != self.holds
        self.holds = holds
        asked = f.asks[self.rank]
        if asked == transfer.NO_ASK or self._asked.get(f.sender) == asked:
            asked = None
        else:
            self._asked[f.sender] = asked
        if f.header is None:
            settled = self.assembler.settle(f.sender, f.floor)
            st = hs.sight
            behind = (f.rows is not None and st is not None and st.known and st.reads(f.sender, self.rank)
                      and st.lacks_mine(f.rows))
            return Received(f, None, peer_ack, changed, holds_changed=more, restarted=restarted,
                            acks_changed=settled, behind=behind, asked=asked)
        if f.header.dest and not f.header.dest >> self.rank & 1:
            # Meant for other readers (a camera films every screen in view): never delivered here, but
            # counted as had, so that a transfer this rank never needed leaves no gap in its
            # acknowledgement of the sender, which would hold back those of later transfers meant for it.
            self.assembler.skip(f.header.sender, f.header.tid)
            return Received(f, None, peer_ack, changed, holds_changed=more, restarted=restarted, asked=asked)
        data = self.assembler.add(f, self.key)
        if data is transfer.DUPLICATE:
            return Received(f, None, peer_ack, changed, duplicate=True, holds_changed=more, restarted=restarted,
                            asked=asked)
        return Received(f, None, peer_ack, changed, data, holds_changed=more, restarted=restarted, asked=asked)

    def _overheard(self, f: transfer.TransferFrame) -> Received:
        """A listener's frame (checked, of this session, from a rank of the room)."""
        nonce, latest = self._heard.get(f.sender, (f.run_nonce, f.shown_us))
        restarted = nonce != f.run_nonce
        if restarted and f.shown_us < latest:
            return Received(f, "other_run")  # the sender's earlier run, filmed late
        if restarted:
            self.assembler.forget_sender(f.sender)  # it started again: it numbers its transfers from 1 again
            self.restarts[f.sender] = self.restarts.get(f.sender, 0) + 1
        self._heard[f.sender] = (f.run_nonce, f.shown_us if restarted else max(latest, f.shown_us))
        if f.header is None:
            return Received(f, None, restarted=restarted)
        data = self.assembler.add(f, self.key)
        if data is transfer.DUPLICATE:
            return Received(f, None, duplicate=True, restarted=restarted)
        return Received(f, None, data=data, restarted=restarted)

    def _state(self):
        hs = self.handshake
        return hs.echo(), hs.trust_mask(), hs.complete, hs.greeting, hs.sight.table() if hs.sight else None
