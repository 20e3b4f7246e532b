"""Discovery: which screens each rank's camera reads, learnt over the light and agreed by every rank.

Each rank counts the frames it accepts from each peer (MAC checked, of this
run: protocols.security.Handshake) and measures, per peer and per layout of
the start-up ladder, the share of the frames that peer showed in that layout
that it read (`quality`): while the layout is not chosen, every rank shows
its status frames in each layout of the ladder in turn (densest first). That
is its *row*: the ranks it reads, their quality in each layout, the ranks it
trusts, and flags. Every status
frame carries the sender's table of rows (its own and the latest it has of
every other rank), so rows travel along the cameras' lines of sight: in a
ring where each camera sees one screen, every rank has every row after n-1
hops. A rank freezes its row (FINAL) once every rank is alive (its nonce
known), it has watched long enough for every layout to show a few frames,
and `settle_s` passed without a change in which screens it reads (in any
layout, at either threshold); when every row is
FINAL, every rank builds the same `Sight` graph (protocols.algorithms) from
the same rows, and picks the same layout (`choose_layout`: of those whose
graph of edges read at least `min_ok` of the time carries the collectives,
the one where they cost least). A rank sets COMPLETE in its row once its handshake is
complete, and keeps greeting (showing status frames) until every row is
COMPLETE, so the others' rows and echoes still pass through it.

Rows are relayed only from senders this rank trusts (their frames proven to
be of this run); a newer `version` replaces an older one. Pure: no I/O,
no asyncio; times are the caller's clock.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_RANKS = 8
MAX_LAYOUTS = 6  # layouts of the start-up ladder a row measures
QUALITY_LEVELS = 15  # a quality is sent in 4 bits: 0..15 fifteenths
# A row: version, flags, reads, trusts, then the quality of each rank in each layout measured (a nibble
# each: rank r, layout k at r * layouts + k). A table measures 1 to MAX_LAYOUTS layouts: its size says how
# many (a pinned layout's table is small enough for a coarse layout's frames).
ROW_HEAD = struct.Struct(">HBBB")


def row_bytes(layouts: int) -> int:
    return ROW_HEAD.size + MAX_RANKS * layouts // 2


def table_bytes(layouts: int) -> int:
    return MAX_RANKS * row_bytes(layouts)


TABLE_BYTES = table_bytes(MAX_LAYOUTS)  # the largest table
FINAL, COMPLETE = 0x01, 0x02
MIN_QUALITY = 0.25  # a screen read less often than this is not an edge of the sight graph
MIN_FRAMES = 4  # frames of a peer before its quality is measured


@dataclass(frozen=True)
class Row:
    version: int = 0
    flags: int = 0
    reads: int = 0
    trusts: int = 0
    # quality[r][k]: the share of rank r's frames in layout k read, in fifteenths (0: not read)
    quality: tuple[tuple[int, ...], ...] = ((0,) * MAX_LAYOUTS,) * MAX_RANKS

    def share(self, shown: int, layout: int = 0) -> float:
        return self.quality[shown][layout] / QUALITY_LEVELS

    @property
    def final(self) -> bool:
        return bool(self.flags & FINAL)

    @property
    def complete(self) -> bool:
        return bool(self.flags & COMPLETE)


EMPTY = Row()


def _pack_quality(q: tuple[tuple[int, ...], ...], layouts: int) -> bytes:
    flat = [min(QUALITY_LEVELS, max(0, per[k])) for per in q for k in range(layouts)]
    return bytes(flat[i] << 4 | flat[i + 1] for i in range(0, len(flat), 2))


def _unpack_quality(b: bytes, layouts: int) -> tuple[tuple[int, ...], ...]:
    flat = [v for byte in b for v in (byte >> 4, byte & 15)]
    return tuple(tuple(flat[r * layouts:(r + 1) * layouts]) + (0,) * (MAX_LAYOUTS - layouts)
                 for r in range(MAX_RANKS))


def pack_table(rows: tuple[Row, ...], layouts: int = MAX_LAYOUTS) -> bytes:
    """The table as shown in status frames, measuring `layouts` layouts (table_bytes(layouts) bytes)."""
    if not 1 <= layouts <= MAX_LAYOUTS:
        raise ValueError(f"a table measures 1 to {MAX_LAYOUTS} layouts, not {layouts}")
    rows = tuple(rows) + (EMPTY,) * (MAX_RANKS - len(rows))
    return b"".join(ROW_HEAD.pack(r.version & 0xFFFF, r.flags, r.reads, r.trusts) + _pack_quality(r.quality, layouts)
                    for r in rows)


def table_layouts(size: int) -> int | None:
    """How many layouts a table of `size` bytes measures (None: no table is that size)."""
    for k in range(1, MAX_LAYOUTS + 1):
        if table_bytes(k) == size:
            return k
    return None


def unpack_table(data: bytes) -> tuple[Row, ...]:
    layouts = table_layouts(len(data))
    if layouts is None:
        raise ValueError(f"no discovery table is {len(data)} bytes")
    n = row_bytes(layouts)
    out = []
    for i in range(MAX_RANKS):
        v, flags, reads, trusts = ROW_HEAD.unpack_from(data, i * n)
        out.append(Row(v, flags, reads, trusts, _unpack_quality(data[i * n + ROW_HEAD.size:(i + 1) * n], layouts)))
    return tuple(out)


def _newer(a: int, b: int) -> bool:
    """Is version `a` newer than `b` (u16, wrapping)?"""
    return a != b and (a - b) & 0xFFFF < 0x8000


@dataclass
class _Seen:
    first_us: int
    last_us: int
    frames: set = field(default_factory=set)


def level(q: float) -> int:
    """The fewest fifteenths that mean at least `q`."""
    return max(1, math.ceil(q * QUALITY_LEVELS - 1e-9))


@dataclass
class SightTable:
    """This rank's measurement and its copy of every rank's row (see the module docstring). `hold_s`: how
    long each frame stays up, per layout of the ladder (one float: one layout); while probing, every rank
    shows one status frame in each layout in turn, so each layout's frames come once every sum of holds."""

    rank: int
    world: int
    hold_s: float | tuple[float, ...]
    settle_s: float = 2.0
    min_ok: float = 0.5  # the share of frames a layout must get through on an edge to carry it (not the last)
    rows: list[Row] = field(default_factory=list)
    _seen: dict[tuple[int, int], _Seen] = field(default_factory=dict)
    _since: float | None = None  # when the set of ranks read or alive last changed
    _alive: int = 0
    _alive_new: bool = False  # a rank came alive since the last update
    _edges: tuple = ()  # the edges (per layout, per threshold) at the last update
    _first: float | None = None  # when this rank first read a frame of this run

    def __post_init__(self) -> None:
        if not self.rows:
            self.rows = [EMPTY] * self.world
        self._alive = 1 << self.rank
        self.holds = tuple(self.hold_s) if isinstance(self.hold_s, (tuple, list)) else (float(self.hold_s),)
        if not 1 <= len(self.holds) <= MAX_LAYOUTS:
            raise ValueError(f"discovery measures 1 to {MAX_LAYOUTS} layouts, not {len(self.holds)}")
        self.layouts = len(self.holds)
        self.cycle_s = sum(self.holds)  # a sender's frames in one layout come once a cycle while probing
        # how long to watch before a row may be final: MIN_FRAMES frames of a layout read min_ok of the time
        self.watch_s = MIN_FRAMES * self.cycle_s / max(self.min_ok, MIN_QUALITY) if self.layouts > 1 else 0.0

    # ---- what this rank sees
    def accepted(self, sender: int, shown_us: int, layout: int = 0) -> None:
        """A frame of `sender` (of this run) was read in `layout`, shown at `shown_us` on the sender's clock."""
        if not 0 <= layout < self.layouts:
            return
        s = self._seen.get((sender, layout))
        if s is None:
            s = self._seen[(sender, layout)] = _Seen(shown_us, shown_us)
        s.first_us, s.last_us = min(s.first_us, shown_us), max(s.last_us, shown_us)
        if len(s.frames) < 4096:
            s.frames.add(shown_us)

    def alive(self, ranks: int) -> None:
        """These ranks (a mask) are known to be running (their run nonce was heard, here or relayed)."""
        if ranks & ~self._alive:
            self._alive |= ranks
            self._alive_new = True

    def quality(self, sender: int, layout: int = 0) -> float:
        """The share of `sender`'s frames in `layout` read: frames read, per frame it showed in that layout
        since the first and up to the last frame read of it in any layout (0 until MIN_FRAMES were shown)."""
        s = self._seen.get((sender, layout))
        if s is None:
            return 0.0
        seen = [v for k in range(self.layouts) if (v := self._seen.get((sender, k))) is not None]
        if not seen:
            return 0.0
        first, last = min(v.first_us for v in seen), max(v.last_us for v in seen)
        shown = (last - first) / 1e6 / self.cycle_s + 1
        if shown < MIN_FRAMES:
            return 0.0
        return min(1.0, len(s.frames) / shown)

    def _reads(self) -> tuple[int, tuple[tuple[int, ...], ...]]:
        q = [[0] * MAX_LAYOUTS for _ in range(MAX_RANKS)]
        mask = 0
        for r in range(self.world):
            if r == self.rank:
                continue
            for k in range(self.layouts):
                share = self.quality(r, k)
                # the nibble sent says at least MIN_QUALITY exactly when the share measured does
                q[r][k] = max(round(QUALITY_LEVELS * share), level(MIN_QUALITY)) if share >= MIN_QUALITY else \
                    min(round(QUALITY_LEVELS * share), level(MIN_QUALITY) - 1)
                if share >= MIN_QUALITY:
                    mask |= 1 << r
        return mask, tuple(tuple(x) for x in q)

    # ---- rows
    def update(self, now: float, trusts: int, complete: bool) -> bool:
        """Refresh this rank's own row at time `now`; True if it changed (a new version to show)."""
        me = self.rows[self.rank]
        everyone = (1 << self.world) - 1
        if me.final:
            reads, quality = me.reads, me.quality
        else:
            reads, quality = self._reads()
            # the edges each layout would give: a row settles only once none of them moves
            edges = tuple(sum(1 << r for r in range(self.world) if quality[r][k] >= t)
                          for k in range(self.layouts) for t in (level(MIN_QUALITY), level(self.min_ok)))
            # (a new trust counts too: the frames of a peer just trusted are about to be counted)
            if (reads != me.reads or edges != self._edges or trusts != me.trusts or self._since is None
                    or self._alive_new):
                self._since = now
                self._alive_new = False
                self._edges = edges
        flags = me.flags
        # FINAL: every rank is up, this camera reads some screen, nothing changed for settle_s, and it has
        # watched long enough for a layout read min_ok of the time to show MIN_FRAMES frames (while probing a
        # ladder, each layout's frames come once a cycle)
        if self._seen and self._first is None:
            self._first = now
        watched = self._first is not None and now - self._first >= self.watch_s
        if (not me.final and self._alive & everyone == everyone and reads and watched
                and now - self._since >= self.settle_s):
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

    def graph(self, layout: int = 0, min_quality: float = MIN_QUALITY) -> dict[tuple[int, int], float]:
        """The edges read in `layout` at least `min_quality` of the time: (reader, shown) -> share read."""
        out = {}
        need = level(min_quality)
        for r in range(self.world):
            row = self.rows[r]
            for s in range(self.world):
                if s != r and row.quality[s][layout] >= need:
                    out[(r, s)] = row.share(s, layout)
        return out

    def goodput(self, nominal: float, layout: int = 0) -> dict[tuple[int, int], float]:
        """The graph's edges in `layout`, (reader, shown) -> bytes per second: `nominal` times the measured
        quality."""
        return {e: nominal * q for e, q in self.graph(layout).items()}

    def choose_layout(self, cost: Callable[[int, dict[tuple[int, int], float]], float | None]) -> tuple[int, dict]:
        """The layout every rank picks from the same FINAL rows, and its graph: of the layouts whose graph
        of edges read at least `min_ok` of the time can carry the collectives, the cheapest by `cost(layout,
        graph)` (seconds, or None: no algorithm fits this graph); ties go to the denser. The last layout
        counts every edge read at least MIN_QUALITY of the time. If none fits, the cheapest of the
        every-edge graphs, else the last layout (its collectives then fail, saying why)."""
        last = self.layouts - 1
        for strict in (True, False):
            best: tuple[float, int, dict] | None = None
            for k in range(self.layouts):
                g = self.graph(k, max(self.min_ok, MIN_QUALITY) if strict and k != last else MIN_QUALITY)
                c = cost(k, g) if g else None
                if c is not None and (best is None or c < best[0]):
                    best = (c, k, g)
            if best is not None:
                return best[1], best[2]
        return last, self.graph(last)
