"""Transfer frames: the one frame format (version 20) of collectives and of the built-in run.

A collective (all_reduce, broadcast, ...) moves tensors between ranks as
*transfers*: one tensor's bytes from one sender, fountain coded over as many
frames as it takes (protocols.frames.fountain). Each sender numbers its
transfers 1, 2, 3, ... (`tid`); every frame also names the collective the
transfer belongs to (`seq`, the group's collective sequence number, which
every rank counts the same way because every rank issues the same collectives
in the same order), its op, the tensor's dtype and element count, and which
part of the sender's contribution it is. Nothing else gives a frame meaning:
no step number, no fixed stream names. The built-in run (wccl.node) sends its
tensors the same way (protocols.streams): its ops name what a transfer is
for (a worker's gradient, the server's average, a snapshot, a sync payload)
and `seq` the step.

Every frame also carries the sender's *acknowledgements*: for each peer rank
whose transfers it has rebuilt some of, which (`Ack`: all tids up to `cum`,
plus a bitmap of the 32 after `cum + 1`; a peer it has none of, whose screen
it does not read, and of which it asks nothing takes no room: `present` says
which ranks have an entry, and a rank without one in a frame is no news). A sender keeps showing a transfer
(source packets, then fresh repair packets) until every rank it is meant for
acknowledges it, so no schedule has to guess how many frames a camera will
lose. Every frame also carries what the sender knows of every rank's
*holdings* (`holds`: how many of the group's collectives, 0 .. n-1, that rank
has every part of; its own count, and the others' as read from their frames,
relayed camera to camera): a rank applies collective `seq` only once every
rank is known to hold it (actors.collectives), so a frame that reached some
cameras and not others never leaves the ranks disagreeing. And every frame says, for each peer, which
layout of the start-up ladder the sender asks that peer to show its frames to it in (`asks`: the sender's
camera reads the peer's screen best there, protocols.adapt; NO_ASK: nothing asked), and which layouts of
the ladder the sender's screen shows frames in now (`showing`, one bit a layout; 0: not said), so that a
camera tries those. A *status* frame
(no transfer: a header of its own) carries acknowledgements, the sender's
echo of every rank's run nonce (the handshake of protocols.security), its
discovery table: which screens each rank reads (protocols.discovery), and
the sender's *floor*: every transfer of its numbered up to it is acknowledged
by every rank it was meant for and will not be shown again. A reader counts
the transfers up to the floor as had (`TransferAssembler.settle`), so one
that started after they went by (a rank that started again), or that never
read a frame of a transfer meant for others, acknowledges the later ones
without a gap.

Every frame carries the clock sync's timestamps: when the sender showed it
(`shown_us`, its own clock) and an echo of one frame it read from a peer
(that frame's `shown_us` and when the sender's camera caught it; wccl.runtime.clocksync).

Every frame names the sender's run nonce (random, drawn when its node
started) and the ranks whose nonces it trusts; its check is a MAC under the
room key (protocols.security), and the tensor bytes of a transfer are sealed
(AEAD) before they are fountain coded: `transfer_len` and `digest` are the
sealed bytes'.

    header (big endian)
      magic 0xC7 | version 20 | session u16 | sender u8 | flags u8 | n u8 | tid u32 | seq u32 | op u8 |
      dtype u8 | part u32 | dest u16 | transfer_len u32 | numel u32 | digest (8: BLAKE2b-64 of the sent bytes,
      frames.digest) | packet_size u16 | shown_us i64 | run_nonce u64 | trusts u16 | echo_peer u8 |
      echo_shown_us i64 | echo_captured_us i64 | entries
    entries: present u16 (the ranks with an entry, a bit each) | holds: n x u32 | showing u8 |
      for each rank in `present`, in rank order: cum u32 | mask u32 | ask u8
    (n: the group's size, 0 to 16; `dest` and `trusts` one bit a rank; any flag bit but 0x01 and 0x02 is refused;
    a rank has an entry when the sender acknowledges some of its transfers or asks it for a layout; where the
    entries do not all fit beside the transfer's packet, the frame carries as many as fit, in turn)
    packet (packet_size bytes: RaptorQ payload id + symbol)

    a status frame's header (flag 0x01; no transfer, so none of a transfer's fields)
      magic 0xC7 | version 20 | session u16 | sender u8 | flags u8 | n u8 | floor u32 | layouts u8 (1 to 8: L,
      what its discovery table measures) | page u16 (first row << 8 | rows) | shown_us i64 | run_nonce u64 |
      trusts u16 | echo_peer u8 | echo_shown_us i64 | echo_captured_us i64 | entries as above, but
      `showing` and each entry's `ask` only with flag 0x02 (a status frame carries them where they leave
      room for a row of the discovery table: not while a ladder is measured)
    packet (its size follows from n, L and the page: status_packet): the echo, n x u64 run nonces, then
      that page of the discovery table, 7 + (n x L + 1) / 2 bytes a row (the qualities of the n ranks)
    check (8 bytes: keyed BLAKE2b-64 of header + packet)
    filler up to the message size: SHAKE-128 of the check (`filler`), so that every frame's cells look
    random and differ from the last frame's, however little it carries (a status frame, a short packet):
    the frames discovery measures a layout with are as hard to read as a tensor's, and a capture filmed
    while the screen changed is not a read of the frame before

Pure functions and frozen dataclasses: no I/O, no asyncio, no torch.
"""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

import raptorq

from protocols import discovery, frames
from protocols.frames import CHECK_BYTES, MAGIC, NO_PEER, PAYLOAD_ID_BYTES, FrameError, Timing, Transfer
from protocols.frames import digest as frame_digest
from protocols.security import NO_KEY, RoomKey

VERSION = 20
MAX_RANKS = 16
NO_ASK = 0xFF  # an `asks` entry: this sender asks that peer for no layout (it does not read it, or not yet)
_HEAD = struct.Struct(">BBHBBBIIBBIHII8sHqQHBqq")
_STATUS_HEAD = struct.Struct(">BBHBBBIBHqQHBqq")  # a status frame's: no transfer's fields
_FLAGS_AT = 5  # where the flags are in either header (and the group's size after them)
_ACK = struct.Struct(">II")
_PRESENT = struct.Struct(">H")
_NONCE = struct.Struct(">Q")


def status_packet(layouts: int = 1, rows: int = MAX_RANKS, ranks: int = MAX_RANKS) -> int:
    """A status frame's packet: the echo of `ranks` ranks' run nonces and `rows` rows of their discovery
    table measuring `layouts` layouts."""
    return ranks * _NONCE.size + rows * discovery.row_bytes(layouts, ranks)


_AAD = struct.Struct(">HBIIBBII")
PERSON = b"wccl-xfer"
_HOLD = 4  # one rank's holdings (u32)


def entry_bytes(ranks: int, present: int | None = None, adapt: bool = False) -> int:
    """The entries after the fixed header: which ranks have one, every rank's holdings, and an
    acknowledgement for each of `present` ranks (default: the most, every rank but the sender); with
    `adapt`, also the layouts shown and each present rank's ask."""
    p = max(0, ranks - 1) if present is None else present
    return _PRESENT.size + ranks * _HOLD + (1 + p if adapt else 0) + p * _ACK.size


def adapt_bytes(ranks: int) -> int:
    """What protocols.adapt adds to a frame of a group of `ranks` ranks where every rank but the sender has an
    entry: the layouts a screen shows and the layout asked of each."""
    return 1 + max(0, ranks - 1)


def header_bytes(ranks: int = MAX_RANKS, status: bool = False, adapt: bool = False,
                 present: int | None = None) -> int:
    """A transfer frame's header (with what protocols.adapt says) or a status frame's (shorter; with it if
    `adapt`) in a group of `ranks` ranks, `present` of them with an entry (default: every rank but the
    sender, the largest)."""
    if status:
        return _STATUS_HEAD.size + entry_bytes(ranks, present, adapt)
    return _HEAD.size + entry_bytes(ranks, present, adapt=True)


HEADER_BYTES = header_bytes()  # the largest
OVERHEAD_BYTES = HEADER_BYTES + CHECK_BYTES


def status_rows(message_bytes: int, ranks: int, layouts: int, adapt: bool = False,
                present: int | None = None) -> int:
    """How many rows of a discovery table measuring `layouts` layouts a status frame of `message_bytes`
    in a group of `ranks` ranks, `present` of them with an entry (default: the most), has room for (with what
    protocols.adapt says, if `adapt`)."""
    room = (message_bytes - header_bytes(ranks, status=True, adapt=adapt, present=present) - CHECK_BYTES
            - ranks * _NONCE.size)
    return max(0, room // discovery.row_bytes(layouts, ranks))


def status_adapts(message_bytes: int, ranks: int, layouts: int, rows: int, present: int | None = None) -> bool:
    """Does a status frame of `message_bytes` with `rows` rows to page carry what protocols.adapt says (it
    leaves room for a row, or there is no row to show)?"""
    return rows == 0 or status_rows(message_bytes, ranks, layouts, adapt=True, present=present) >= 1


def present_mask(acks: tuple[Ack, ...], asks: tuple[int, ...] = ()) -> int:
    """The ranks a frame gives an entry (a bit each): those acknowledged in something, or asked for a layout."""
    mask = 0
    for r, a in enumerate(acks):
        if a.cum or a.mask:
            mask |= 1 << r
    for r, k in enumerate(asks):
        if k != NO_ASK:
            mask |= 1 << r
    return mask


@dataclass
class StatusPages:
    """Which row of the discovery table a sender's next status frame starts its page at. Frames of each
    size take the table in turn on their own: where the layouts of a ladder take turns on one screen, a
    camera that reads only some of them (the big cells of a far, slanted screen) still gets every row,
    which one turn shared by every size would not give it (a big frame's turn would start again at the
    first row after each frame that shows the whole table)."""

    _next: dict[int, int] = field(default_factory=dict)  # frame size -> the row its next page starts at

    def first(self, message_bytes: int, rows: int, ranks: int, layouts: int, adapt: bool = False,
              present: int | None = None) -> int:
        """The first row of the next frame of `message_bytes` (a table of `rows` rows, `present` of the
        `ranks` ranks with an entry, default the most; with what protocols.adapt says if `adapt` and it fits,
        `status_adapts`), and move on."""
        first = self._next.get(message_bytes, 0)
        first = first if first < rows else 0
        adapt = adapt and status_adapts(message_bytes, ranks, layouts, rows, present)
        self._next[message_bytes] = first + status_rows(message_bytes, ranks, layouts, adapt, present)
        return first


ACK_WINDOW = 32

FLAG_STATUS = 0x01  # acknowledgements only: no packet
FLAG_ADAPT = 0x02  # a status frame that says what protocols.adapt says (a transfer frame always does)

OPS = {"status": 0, "allreduce": 1, "broadcast": 2, "allgather": 3, "reduce_scatter": 4, "barrier": 5,
       # the built-in run's (protocols.streams): a worker's gradient, the server's average, a snapshot, sync
       "grad": 6, "avg": 7, "params": 8, "sync": 9,
       # torch.distributed's send/recv: `seq` numbers the sender's messages to one peer with one tag (`part`)
       "p2p": 10,
       # a send/recv message on its way through ranks whose cameras chain from its source to its destination:
       # the payload starts with its source and destination (RELAY_HEAD); `seq`, `part`, dtype and numel are
       # the message's
       "relay": 11,
       # one of the built-in run's tensors on such ways: the payload starts with RELAY_HEAD (its source, and
       # the ranks it is for: each rank on the way takes it if it is one of them and shows it on once for each
       # next rank on the others' ways), `seq` is its step and `part` its stream's op (grad, avg, params, sync);
       # then RELAY_CHUNK: a tensor for ranks more than one hop away goes in chunks, each passed on as it
       # arrives; numel is the whole tensor's bytes
       "relay_stream": 12}
RELAY_HEAD = struct.Struct(">BH")  # a relayed message's source rank, and the ranks it is for (a bit a rank)
# A relayed stream's chunk: the CRC-32 of the whole tensor's bytes (which chunks make one tensor, and its
# check once they are joined), the chunk's index and how many there are
RELAY_CHUNK = struct.Struct(">IBB")
OP_NAMES = {v: k for k, v in OPS.items()}
COLLECTIVE_OPS = frozenset({"allreduce", "broadcast", "allgather", "reduce_scatter", "barrier"})  # `seq`: the collective
DTYPES = {"float32": 1, "float16": 2, "bfloat16": 3, "int64": 4, "int32": 5, "uint8": 6, "float64": 7,
          "int8": 8, "int16": 9, "bool": 10}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def packet_size_for(message_bytes: int, ranks: int = MAX_RANKS, present: int | None = None) -> int:
    """The largest packet (payload id + aligned symbol) a transfer frame of `message_bytes` holds beside
    the entries of a group of `ranks` ranks, `present` of them with one (default: the most)."""
    overhead = header_bytes(ranks, present=present) + CHECK_BYTES
    symbol = (message_bytes - overhead - PAYLOAD_ID_BYTES) // frames.SYMBOL_ALIGN * frames.SYMBOL_ALIGN
    if symbol < frames.MIN_SYMBOL:
        raise ValueError(f"a frame message of {message_bytes} bytes is too small for a packet "
                         f"(at least {overhead + frames.MIN_PACKET} bytes)")
    return min(symbol + PAYLOAD_ID_BYTES, 0xFFFF)


@dataclass(frozen=True, slots=True)
class Ack:
    """Which of one peer's transfers a rank has rebuilt: every tid <= `cum`, and tid `cum + 2 + i`
    for each bit i of `mask` (tid `cum + 1` is by definition still missing)."""

    cum: int = 0
    mask: int = 0

    def has(self, tid: int) -> bool:
        if tid <= self.cum:
            return True
        i = tid - self.cum - 2
        return 0 <= i < ACK_WINDOW and bool(self.mask >> i & 1)

    @staticmethod
    def of(received: set[int] | frozenset[int], floor: int = 0) -> Ack:
        """The acknowledgement of a set of received tids (`floor`: every tid up to it was received)."""
        cum = floor
        while cum + 1 in received:
            cum += 1
        mask = 0
        for i in range(ACK_WINDOW):
            if cum + 2 + i in received:
                mask |= 1 << i
        return Ack(cum, mask)


NO_ACKS: tuple[Ack, ...] = (Ack(),) * MAX_RANKS


@dataclass(frozen=True, slots=True)
class TransferHeader:
    """What a transfer is: who sends it (`sender`, a rank), its number (`tid`), the collective (`seq`,
    `op`), the tensor (`dtype`, `numel`, `length` bytes, `digest`), which part of the sender's
    contribution (`part`), and the ranks that must read it (`dest`, a bitmask)."""

    session: int
    sender: int
    tid: int
    seq: int
    op: str
    dtype: str
    numel: int
    length: int
    digest: bytes
    part: int = 0
    dest: int = 0


NO_ECHO = (NO_PEER, 0, 0)  # a frame that echoes no peer's frame


@dataclass(frozen=True, slots=True)
class TransferFrame:
    """One trusted frame: its transfer's header (None for a status frame), its packet, the sender's
    acknowledgements (one per rank; None where the frame has no entry of the rank: no news), when the
    sender showed it (its own clock, microseconds), the
    sender's run nonce and trust mask, and (status frames) its echo of every rank's run nonce."""

    session: int
    sender: int
    header: TransferHeader | None
    packet: bytes
    acks: tuple[Ack | None, ...]
    shown_us: int = 0
    run_nonce: int = 0
    trusts: int = 0
    echo: tuple[int, ...] | None = None  # status frames: the sender's echo of each rank's run nonce
    rows: tuple | None = None  # status frames: the sender's discovery table (protocols.discovery.Row each)
    holds: tuple[int, ...] = (0,) * MAX_RANKS  # how many collectives each rank is known to hold
    asks: tuple[int, ...] = (NO_ASK,) * MAX_RANKS  # the ladder layout the sender asks each rank to show it
    showing: int = 0  # the ladder layouts the sender's screen shows frames in now, one bit each (0: not said)
    clock_echo: tuple[int, int, int] = NO_ECHO  # (echo_peer, echo_shown_us, echo_captured_us)
    floor: int = 0  # status frames: every transfer of the sender up to this one is settled (not shown again)

    @property
    def timing(self) -> Timing:
        """The frame's clock-sync fields."""
        return Timing(self.shown_us, *self.clock_echo)

    @property
    def packet_id(self) -> int:
        return int.from_bytes(self.packet[:PAYLOAD_ID_BYTES], "big")


def _entries(acks: tuple[Ack, ...], holds: tuple[int, ...], asks: tuple[int, ...] = (), at_least: int = 0,
             adapt: bool = True, showing: int = 0, most: int = MAX_RANKS, turn: int = 0) -> tuple[int, bytes]:
    """How many ranks a frame speaks of (as many as any gives, and at least `at_least`), and its entries
    packed: the ranks with one (`present_mask`; at most `most` of them, taking turns by `turn` where more
    have one), every rank's holdings, and with `adapt` what protocols.adapt says."""
    n = max(len(acks), len(holds), len(asks), at_least)
    if n > MAX_RANKS:
        raise ValueError(f"at most {MAX_RANKS} ranks")
    acks = tuple(acks) + NO_ACKS[len(acks):n]
    holds = tuple(holds) + (0,) * (n - len(holds))
    asks = (tuple(asks) + (NO_ASK,) * (n - len(asks)))[:n]
    mask = present_mask(acks, asks)
    ranks = [r for r in range(n) if mask >> r & 1]
    if len(ranks) > most:  # (acknowledgements and asks stand until changed: a frame without one is no news)
        at = turn * most % len(ranks)
        ranks = sorted((ranks + ranks)[at:at + max(0, most)])
        mask = sum(1 << r for r in ranks)
    out = [_PRESENT.pack(mask), struct.pack(f">{n}I", *holds)]
    if adapt:
        out.append(struct.pack(">B", showing))
    for r in ranks:
        out.append(_ACK.pack(acks[r].cum, acks[r].mask) + (struct.pack(">B", asks[r]) if adapt else b""))
    return n, b"".join(out)


def aad(header: TransferHeader) -> bytes:
    """The associated data a transfer's payload is sealed with: everything that gives it meaning."""
    return _AAD.pack(header.session, header.sender, header.tid, header.seq, OPS[header.op], DTYPES[header.dtype],
                     header.part, header.numel)


def filler(check: bytes, n: int) -> bytes:
    """The `n` bytes after a frame's check: SHAKE-128 of the check (see the module doc)."""
    return hashlib.shake_128(b"wccl filler" + check).digest(n) if n > 0 else b""


def _padded(body: bytes, check: bytes, message_bytes: int) -> bytes:
    return body + check + filler(check, message_bytes - len(body) - len(check))


@dataclass(frozen=True)
class Outgoing:
    """A transfer ready to show: its header (length and digest filled in) and its fountain packets."""

    header: TransferHeader
    fountain: Transfer

    @property
    def source(self) -> int:
        """The source packets: any this many distinct packets (rarely one or two more) rebuild it."""
        return frames.source_packets(self.fountain.length, self.fountain.packet_size)

    def message(self, index: int, *, message_bytes: int, **fields) -> bytes:
        """The message of the frame that shows packet `index` (taken in turn: repair packets repeat);
        `fields`: frame_message's (acks, shown_us, run_nonce, trusts, holds, clock_echo, key)."""
        return frame_message(self.header, self.fountain, index % len(self.fountain.packets),
                             message_bytes=message_bytes, **fields)


def outgoing(header: TransferHeader, payload: bytes, *, message_bytes: int, ranks: int = MAX_RANKS,
             present: int | None = None, key: RoomKey = NO_KEY, run_nonce: int = 0, count: int | None = None,
             repair: int | Callable[[int], int] = 0, sealed: bool = False) -> Outgoing:
    """The one way a transfer is made: `payload` sealed under `key` for the sender's run `run_nonce` (bound
    to what `header` says: `aad`; `sealed`: it already is, or is made up), cut by the fountain code into
    packets sized for frames of `message_bytes` that carry the entries of `ranks` ranks, `present` of them
    with one (default: the most; a frame where more have one carries them in turn), `count` of them
    (default: the source packets and `repair` more, or `repair(source packets)` more), and `header`
    completed with the length and digest the frames carry."""
    data = payload if sealed else key.seal(run_nonce, header.tid, payload, aad(header))
    psize = packet_size_for(message_bytes, ranks, present)
    if count is None:
        k = frames.source_packets(len(data), psize)
        count = k + (repair(k) if callable(repair) else repair)
    fountain = frames.fountain(data, message_bytes=message_bytes, count=count, packet_size=psize)
    return Outgoing(replace(header, length=fountain.length, digest=fountain.digest), fountain)


def frame_message(header: TransferHeader, transfer: Transfer, index: int, *, message_bytes: int,
                  acks: tuple[Ack, ...] = (), shown_us: int = 0, run_nonce: int = 0, trusts: int = 0,
                  holds: tuple[int, ...] = (), asks: tuple[int, ...] = (), showing: int = 0,
                  clock_echo: tuple[int, int, int] = NO_ECHO, key: RoomKey = NO_KEY) -> bytes:
    """The message (header, packet `index` of `transfer`, check, padding) of one transfer frame."""
    if header.length != transfer.length or header.digest != transfer.digest:
        raise ValueError("header and transfer disagree")
    n = max(len(acks), len(holds), len(asks))
    packet = transfer.packets[index]
    room = message_bytes - CHECK_BYTES - _HEAD.size - entry_bytes(n, 0, adapt=True) - len(packet)
    n, entries = _entries(acks, holds, asks, showing=showing, most=room // (_ACK.size + 1), turn=index)
    head = _HEAD.pack(MAGIC, VERSION, header.session, header.sender, 0, n, header.tid, header.seq,
                      OPS[header.op], DTYPES[header.dtype], header.part, header.dest, header.length, header.numel,
                      header.digest, transfer.packet_size, shown_us, run_nonce, trusts, *clock_echo)
    body = head + entries + packet
    if len(body) + CHECK_BYTES > message_bytes:
        raise ValueError(f"frame message of {len(body) + CHECK_BYTES} bytes exceeds {message_bytes}")
    return _padded(body, key.check(body, PERSON), message_bytes)


def status_message(*, session: int, sender: int, acks: tuple[Ack, ...], message_bytes: int,
                   shown_us: int = 0, run_nonce: int = 0, trusts: int = 0, echo: tuple[int, ...] = (),
                   rows: tuple = (), first: int = 0, holds: tuple[int, ...] = (), asks: tuple[int, ...] = (),
                   showing: int = 0, layouts: int = 1, clock_echo: tuple[int, int, int] = NO_ECHO, floor: int = 0, key: RoomKey = NO_KEY) -> bytes:
    """A status frame's message: acknowledgements, the echo of every rank's run nonce, the discovery
    table (`rows`, protocols.discovery.Row each, one per rank of the group) measuring `layouts` layouts of
    the start-up ladder, and the sender's `floor` (its transfers up to it are settled); what
    protocols.adapt says (`showing`, `asks`) when given and it fits (`status_adapts`). A frame too small
    for every row shows a page: as many rows as fit (`status_rows`) from row `first` on."""
    if len(echo) > MAX_RANKS or len(rows) > MAX_RANKS:
        raise ValueError(f"at most {MAX_RANKS} ranks")
    n = max(len(acks), len(holds), len(asks), len(echo), len(rows))
    present = present_mask(tuple(acks)[:n], tuple(asks)[:n]).bit_count()
    adapt = bool(asks or showing) and status_adapts(message_bytes, n, layouts, len(rows), present)
    count = min(status_rows(message_bytes, n, layouts, adapt, present), len(rows) - first) if rows else 0
    if rows and count < 1:
        raise ValueError(f"a status frame of {message_bytes} bytes holds no row of the discovery table")
    n, entries = _entries(acks, holds, asks, n, adapt=adapt, showing=showing)
    page = tuple(rows[first:first + count])
    head = _STATUS_HEAD.pack(MAGIC, VERSION, session, sender, FLAG_STATUS | (FLAG_ADAPT if adapt else 0), n, floor,
                             layouts, first << 8 | count, shown_us, run_nonce, trusts, *clock_echo)
    body = (head + entries + struct.pack(f">{n}Q", *(tuple(echo) + (0,) * (n - len(echo))))
            + (discovery.pack_rows(page, layouts, n) if page else b""))
    if len(body) + CHECK_BYTES > message_bytes:
        raise ValueError(f"status frame of {len(body) + CHECK_BYTES} bytes exceeds {message_bytes}")
    return _padded(body, key.check(body, PERSON), message_bytes)


def is_transfer_message(msg: bytes) -> bool:
    """Does this (corrected) frame message claim to be a transfer frame? (Only the check can vouch.)"""
    return len(msg) >= 2 and msg[0] == MAGIC and msg[1] == VERSION


def peek(msg: bytes) -> tuple[int, int]:
    """(run nonce, tid) of a frame message, unchecked (what anyone filming a frame can read off it: the
    check vouches for the header but hides nothing); (0, 0) for what is no transfer frame."""
    if not is_transfer_message(msg) or len(msg) < _STATUS_HEAD.size:
        return 0, 0
    if msg[_FLAGS_AT] & FLAG_STATUS:
        return _STATUS_HEAD.unpack_from(msg)[10], 0
    if len(msg) < _HEAD.size:
        return 0, 0
    fields = _HEAD.unpack_from(msg)
    return fields[17], fields[6]


def parse_message(msg: bytes, key: RoomKey = NO_KEY) -> TransferFrame:
    """Check and decode one transfer frame message; raises FrameError for anything untrustworthy."""
    if len(msg) < _STATUS_HEAD.size + CHECK_BYTES:
        raise FrameError("short_frame", f"{len(msg)} bytes")
    if msg[0] != MAGIC:
        raise FrameError("bad_magic")
    flags = msg[_FLAGS_AT]
    status = bool(flags & FLAG_STATUS)
    ranks = min(msg[_FLAGS_AT + 1], MAX_RANKS)  # (more is refused below, once the check vouched for it)
    if status:
        (_, version, session, sender, _, _, seq, dtype, part, shown, nonce, trusts, echo_peer, echo_shown,
         echo_captured) = _STATUS_HEAD.unpack_from(msg)
        first, count = part >> 8, part & 0xFF  # the page of the discovery table
        if not (1 <= dtype <= discovery.MAX_LAYOUTS and first + count <= ranks):
            raise FrameError("bad_length", f"status page {first}+{count} of {ranks} ranks, {dtype} layouts")
        psize = status_packet(dtype, count, ranks)
    else:
        if len(msg) < _HEAD.size + CHECK_BYTES:
            raise FrameError("short_frame", f"{len(msg)} bytes")
        (_, version, session, sender, _, _, tid, seq, op, dtype, part, dest, length, numel, dig, psize,
         shown, nonce, trusts, echo_peer, echo_shown, echo_captured) = _HEAD.unpack_from(msg)
    clock_echo = (echo_peer, echo_shown, echo_captured)
    head = _STATUS_HEAD.size if status else _HEAD.size
    adapt = not status or bool(flags & FLAG_ADAPT)
    if len(msg) < head + _PRESENT.size:
        raise FrameError("short_frame", f"{len(msg)} bytes")
    (mask,) = _PRESENT.unpack_from(msg, head)
    present = [r for r in range(ranks) if mask >> r & 1]
    start = head + entry_bytes(ranks, len(present), adapt)
    end = start + psize
    if end + CHECK_BYTES > len(msg) or (not status and psize <= PAYLOAD_ID_BYTES):
        raise FrameError("bad_length", f"packet_size {psize}")
    if not key.verify(msg[:end], PERSON, msg[end:end + CHECK_BYTES]):
        raise FrameError("check_mismatch")
    check = msg[end:end + CHECK_BYTES]
    if msg[end + CHECK_BYTES:] != filler(check, len(msg) - end - CHECK_BYTES):
        raise FrameError("bad_padding")  # the check does not cover the filler: it must be the check's
    # Fields below are only meaningful once the check vouched for them.
    if version != VERSION:
        raise FrameError("bad_version", str(version))
    if flags & ~(FLAG_STATUS | FLAG_ADAPT) or flags == FLAG_ADAPT or msg[_FLAGS_AT + 1] > MAX_RANKS:
        raise FrameError("bad_flags", f"{flags}, {msg[_FLAGS_AT + 1]} ranks")
    if mask >> ranks:
        raise FrameError("bad_flags", f"an entry of rank {mask.bit_length() - 1} in a group of {ranks}")
    if sender >= MAX_RANKS:
        raise FrameError("unknown_sender", str(sender))
    at = head + _PRESENT.size
    holds = struct.unpack_from(f">{ranks}I", msg, at) + (0,) * (MAX_RANKS - ranks)
    at += ranks * _HOLD
    showing = 0
    if adapt:
        showing = msg[at]
        at += 1
    acks: list[Ack | None] = [None] * MAX_RANKS  # (None: no entry, no news)
    asks = [NO_ASK] * MAX_RANKS
    for r in present:
        acks[r] = Ack(*_ACK.unpack_from(msg, at))
        at += _ACK.size
        if adapt:
            asks[r] = msg[at]
            at += 1
    acks, asks = tuple(acks), tuple(asks)
    if status:
        echo = struct.unpack_from(f">{ranks}Q", msg, start) + (0,) * (MAX_RANKS - ranks)
        rows = discovery.unpack_rows(msg[start + ranks * _NONCE.size:end], dtype, first, count, ranks)
        return TransferFrame(session, sender, None, b"", acks, shown, nonce, trusts, echo, rows, holds, asks,
                             showing, clock_echo, floor=seq)
    if op not in OP_NAMES or op == OPS["status"]:
        raise FrameError("unknown_op", str(op))
    if dtype not in DTYPE_NAMES:
        raise FrameError("unknown_dtype", str(dtype))
    if tid == 0 or length == 0:
        raise FrameError("bad_length", "empty transfer")
    header = TransferHeader(session, sender, tid, seq, OP_NAMES[op], DTYPE_NAMES[dtype], numel, length, dig,
                            part, dest)
    return TransferFrame(session, sender, header, bytes(msg[start:end]), acks, shown, nonce, trusts,
                         holds=holds, asks=asks, showing=showing, clock_echo=clock_echo)


@dataclass
class TransferAssembler:
    """Rebuilds transfers from trusted transfer frames and keeps this rank's acknowledgements.

    `add` returns the transfer's bytes once any sufficient set of its packets arrived, the bytes
    match the digest and open under the room key (else None); a frame of a transfer already rebuilt
    is counted in `duplicates` and flagged by `add` returning `DUPLICATE`, so the caller can show its acknowledgement again.
    A transfer whose packets change size (its sender cut it again for another layout) starts afresh.
    `acks()` is this rank's acknowledgement of every sender. Losses are counted by reason.
    """

    max_pending: int = 64
    _decoders: dict = field(default_factory=dict)
    _received: dict = field(default_factory=dict)  # sender -> (floor, set of tids above it)
    losses: Counter = field(default_factory=Counter)
    duplicates: int = 0
    recut: int = 0  # transfers started afresh because their sender cut them again for another layout
    last_packets: int = 0

    def has(self, sender: int, tid: int) -> bool:
        floor, above = self._received.get(sender, (0, set()))
        return tid <= floor or tid in above

    def add(self, f: TransferFrame, room_key: RoomKey = NO_KEY) -> bytes | None | object:
        h = f.header
        if h is None:
            return None
        if self.has(h.sender, h.tid):
            self.duplicates += 1
            return DUPLICATE
        key = (h.sender, h.tid)
        meta = (h.length, h.digest, len(f.packet), h.seq, h.op, h.dtype, h.numel, h.part)
        entry = self._decoders.get(key)
        if entry is not None and entry[0][:2] + entry[0][3:] == meta[:2] + meta[3:] and entry[0][2] != meta[2]:
            # The same transfer cut again for frames of another layout (the sender's layout changed): its
            # packets so far do not combine with the new ones; start afresh with these.
            self.recut += 1
            del self._decoders[key]
            entry = None
        if entry is not None and entry[0] != meta:
            self.losses["conflicting_frames"] += 1  # two different transfers claim one number: trust neither
            del self._decoders[key]
            return None
        if entry is None:
            entry = (meta, raptorq.Decoder.with_defaults(h.length, frames.raptorq_size(len(f.packet))), set())
            self._decoders[key] = entry
            while len(self._decoders) > self.max_pending:
                del self._decoders[min(self._decoders, key=lambda k: k[1])]
                self.losses["evicted_incomplete"] += 1
        _, decoder, seen = entry
        if f.packet_id in seen:
            self.duplicates += 1
            return None
        seen.add(f.packet_id)
        data = decoder.decode(f.packet)
        if data is None:
            return None
        del self._decoders[key]
        self.last_packets = len(seen)
        data = bytes(data)
        if len(data) != h.length or frame_digest(data) != h.digest:
            # Not acknowledged: the sender keeps showing it, and fresh packets rebuild it again.
            self.losses["tensor_digest_mismatch"] += 1
            return None
        opened = room_key.open(f.run_nonce, h.tid, data, aad(h))
        if opened is None:
            # Sealed under another key, nonce or header: never delivered, never acknowledged.
            self.losses["payload_not_authentic"] += 1
            return None
        self._mark(h.sender, h.tid)
        return opened

    def forget(self, stale) -> int:
        """Drop the unfinished transfers that `stale(seq, op)` says are no longer worth finishing, counted
        as `incomplete_tensor` losses (a late frame of one is then a duplicate); returns how many."""
        gone = [k for k, (meta, _, _) in self._decoders.items() if stale(meta[3], meta[4])]
        for k in gone:
            del self._decoders[k]
            self._mark(*k)
        if gone:
            self.losses["incomplete_tensor"] += len(gone)
        return len(gone)

    def forget_sender(self, sender: int) -> None:
        """Forget all of `sender`'s transfers (it started again: it numbers its transfers from 1 again)."""
        for k in [k for k in self._decoders if k[0] == sender]:
            del self._decoders[k]
        self._received.pop(sender, None)

    def settle(self, sender: int, floor: int) -> bool:
        """Count every transfer of `sender` up to `floor` as had (its status frame says none of them will be
        shown again: each was acknowledged by every rank it was meant for); True if the acknowledgement of
        `sender` changed."""
        have, above = self._received.get(sender, (0, set()))
        if floor <= have:
            return False
        for k in [k for k in self._decoders if k[0] == sender and k[1] <= floor]:
            del self._decoders[k]
        above = {t for t in above if t > floor}
        while floor + 1 in above:
            floor += 1
            above.discard(floor)
        self._received[sender] = (floor, above)
        return True

    def skip(self, sender: int, tid: int) -> None:
        """Count a transfer meant for other ranks as had (acknowledged, never delivered here)."""
        if not self.has(sender, tid):
            self._decoders.pop((sender, tid), None)
            self._mark(sender, tid)

    def _mark(self, sender: int, tid: int) -> None:
        floor, above = self._received.get(sender, (0, set()))
        above = set(above) | {tid}
        while floor + 1 in above:
            floor += 1
            above.discard(floor)
        self._received[sender] = (floor, above)

    def ack_of(self, sender: int) -> Ack:
        floor, above = self._received.get(sender, (0, set()))
        return Ack.of(frozenset(above), floor)

    def acks(self, world: int) -> tuple[Ack, ...]:
        return tuple(self.ack_of(r) for r in range(world))


DUPLICATE = object()  # TransferAssembler.add: a frame of a transfer already rebuilt
