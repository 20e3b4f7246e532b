"""Discovery: which screens each rank's camera reads, learnt over the light and agreed by every rank.

Each rank counts the frames it accepts from each peer (MAC checked, of this
run: protocols.security.Handshake) and measures, per peer, the share of the
frames that peer showed that it read (`quality`). That is its *row*: the
ranks it reads, their quality, the ranks it trusts, and flags. Every status
frame carries the sender's table of rows (its own and the latest it has of
every other rank), so rows travel along the cameras' lines of sight: in a
ring where each camera sees one screen, every rank has every row after n-1
hops. A rank freezes its row (FINAL) once every rank is alive (its nonce
known) and `settle_s` passed without a new screen read; when every row is
FINAL, every rank builds the same `Sight` graph (protocols.algorithms) from
the same rows. A rank sets COMPLETE in its row once its handshake is
complete, and keeps greeting (showing status frames) until every row is
COMPLETE, so the others' rows and echoes still pass through it.

Rows are relayed only from senders this rank trusts (their frames proven to
be of this run); a newer `version` replaces an older one. Pure: no I/O,
no asyncio; times are the caller's clock.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

MAX_RANKS = 8
ROW = struct.Struct(f">HBBB{MAX_RANKS}B")  # version, flags, reads, trusts, quality per rank (0..255)
TABLE_BYTES = ROW.size * MAX_RANKS
FINAL, COMPLETE = 0x01, 0x02
MIN_QUALITY = 0.25  # a screen read less often than this is not an edge of the sight graph
MIN_FRAMES = 4  # frames of a peer before its quality is measured


@dataclass(frozen=True)
class Row:
    version: int = 0
    flags: int = 0
    reads: int = 0
    trusts: int = 0
    quality: tuple[int, ...] = (0,) * MAX_RANKS

    @property
    def final(self) -> bool:
        return bool(self.flags & FINAL)

    @property
    def complete(self) -> bool:
        return bool(self.flags & COMPLETE)


EMPTY = Row()


def pack_table(rows: tuple[Row, ...]) -> bytes:
    rows = tuple(rows) + (EMPTY,) * (MAX_RANKS - len(rows))
    return b"".join(ROW.pack(r.version & 0xFFFF, r.flags, r.reads, r.trusts, *r.quality) for r in rows)


def unpack_table(data: bytes) -> tuple[Row, ...]:
    out = []
    for i in range(MAX_RANKS):
        v, flags, reads, trusts, *q = ROW.unpack_from(data, i * ROW.size)
        out.append(Row(v, flags, reads, trusts, tuple(q)))
    return tuple(out)


def _newer(a: int, b: int) -> bool:
    """Is version `a` newer than `b` (u16, wrapping)?"""
    return a != b and (a - b) & 0xFFFF < 0x8000


@dataclass
class _Seen:
    first_us: int
    last_us: int
    frames: set = field(default_factory=set)


@dataclass
class SightTable:
    """This rank's measurement and its copy of every rank's row (see the module docstring)."""

    rank: int
    world: int
    hold_s: float
    settle_s: float = 2.0
    rows: list[Row] = field(default_factory=list)
    _seen: dict[int, _Seen] = field(default_factory=dict)
    _since: float | None = None  # when the set of ranks read or alive last changed
    _alive: int = 0
    _alive_new: bool = False  # a rank came alive since the last update

    def __post_init__(self) -> None:
        if not self.rows:
            self.rows = [EMPTY] * self.world
        self._alive = 1 << self.rank

    # ---- what this rank sees
    def accepted(self, sender: int, shown_us: int) -> None:
        """A frame of `sender` (of this run) was read, shown at `shown_us` on the sender's clock."""
        s = self._seen.get(sender)
        if s is None:
            s = self._seen[sender] = _Seen(shown_us, shown_us)
        s.first_us, s.last_us = min(s.first_us, shown_us), max(s.last_us, shown_us)
        if len(s.frames) < 4096:
            s.frames.add(shown_us)

    def alive(self, ranks: int) -> None:
        """These ranks (a mask) are known to be running (their run nonce was heard, here or relayed)."""
        if ranks & ~self._alive:
            self._alive |= ranks
            self._alive_new = True

    def quality(self, sender: int) -> float:
        s = self._seen.get(sender)
        if s is None or len(s.frames) < MIN_FRAMES:
            return 0.0
        # frames read after the first, per hold since it (the first and last are read by definition)
        shown = (s.last_us - s.first_us) / 1e6 / self.hold_s
        return min(1.0, (len(s.frames) - 1) / max(shown, 1.0))

    def _reads(self) -> tuple[int, tuple[int, ...]]:
        q = [0] * MAX_RANKS
        mask = 0
        for r in range(self.world):
            if r != self.rank:
                qr = self.quality(r)
                if qr >= MIN_QUALITY:
                    mask |= 1 << r
                    q[r] = max(1, round(255 * qr))
        return mask, tuple(q)

    # ---- rows
    def update(self, now: float, trusts: int, complete: bool) -> bool:
        """Refresh this rank's own row at time `now`; True if it changed (a new version to show)."""
        me = self.rows[self.rank]
        everyone = (1 << self.world) - 1
        if me.final:
            reads, quality = me.reads, me.quality
        else:
            reads, quality = self._reads()
            # (a new trust counts too: the frames of a peer just trusted are about to be counted)
            if reads != me.reads or trusts != me.trusts or self._since is None or self._alive_new:
                self._since = now
                self._alive_new = False
        flags = me.flags
        # FINAL: every rank is up, this camera reads some screen, and nothing changed for settle_s
        if not me.final and self._alive & everyone == everyone and reads and now - self._since >= self.settle_s:
            flags |= FINAL
        if complete:
            flags |= COMPLETE
        new = Row(me.version, flags, reads, trusts, quality)
        if new == me:
            return False
        self.rows[self.rank] = Row((me.version + 1) & 0xFFFF, flags, reads, trusts, quality)
        return True

    def relay(self, sender_rows: tuple[Row, ...]) -> bool:
        """Take the newer rows of a trusted sender's table; True if any changed."""
        changed = False
        for r in range(self.world):
            if r == self.rank:
                continue
            theirs = sender_rows[r]
            if theirs.version and (not self.rows[r].version or _newer(theirs.version, self.rows[r].version)):
                if self.rows[r].final and (theirs.reads, theirs.quality) != (self.rows[r].reads,
                                                                           self.rows[r].quality):
                    continue  # a FINAL row never changes what it reads: keep the first
                self.rows[r] = theirs
                changed = True
                self.alive(1 << r)
        return changed

    def table(self) -> tuple[Row, ...]:
        return tuple(self.rows)

    @property
    def known(self) -> bool:
        """Every rank's row is FINAL: the sight graph is the same on every rank."""
        return all(r.final for r in self.rows)

    @property
    def all_complete(self) -> bool:
        return all(r.complete for r in self.rows)

    def reads(self, reader: int, shown: int) -> bool:
        return bool(self.rows[reader].reads >> shown & 1)

    def trusts(self, truster: int, trusted: int) -> bool:
        return bool(self.rows[truster].trusts >> trusted & 1)

    def goodput(self, nominal: float) -> dict[tuple[int, int], float]:
        """The graph's edges, (reader, shown) -> bytes per second: `nominal` times the measured quality."""
        out = {}
        for r in range(self.world):
            row = self.rows[r]
            for s in range(self.world):
                if s != r and row.reads >> s & 1:
                    out[(r, s)] = nominal * row.quality[s] / 255
        return out
