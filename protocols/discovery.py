"""Discovery: which screens each rank's camera reads, learnt over the light and agreed by every rank.

Each rank counts the frames it accepts from each peer (MAC checked, of this
run: protocols.security.Handshake) and measures, per peer and per layout of
the start-up ladder, the share of the frames that peer showed in that layout
that it read (`quality`). While the layout is not chosen, every rank shows
its status frames in the layouts of the ladder on a timetable of its own
clock (`ProbeSchedule`): a run of frames in the first layout (the fastest,
the one most rooms pick), then a couple in each of the others, over and
over; a reader knows from the shown times of the frames it read how many
frames of each layout their sender showed between them. That is its *row*:
the ranks it reads, their quality in each layout it has measured, the ranks
it trusts, and flags. Every status frame carries the sender's table of rows
(its own and the latest it has of every other rank; a frame of a layout too
small for all of them, a page of them in turn), so rows travel along the
cameras' lines of sight: in a ring where each camera sees one screen, every
rank has every row after n-1 hops.

A layout is *measured* once every peer read showed enough frames in it
between the first and the last frame read of it (`need`: enough for a
layout read `min_ok` of the time to give MIN_FRAMES reads; or MIN_FRAMES
none of which was read: clearly unreadable), every peer never read has been
alive long enough to have shown that many, or the rank has watched for
`watch_s` (the longest the schedule takes to show `need` frames of every
layout) since its first frame read and since the last rank came alive (a
rank that starts late is watched as long as the others were). A row
measures the ladder from its first layout on (its qualities beyond are 0,
and its flags say how many layouts it left out). A rank
freezes its row (FINAL) once every rank is alive (its nonce known) and it
reads some screen, and either the rows it has decide without the layouts
not measured (`decide`: the layout chosen from the layouts every row
measured costs no more than any other would cost read whole on every edge,
the bound by which the link bench skips a layout that could not beat the
best so far, so measuring the rest could not change the choice), or it has
measured every layout and nothing it reads changed for `settle_s`.

When every row is FINAL, every rank builds the same `Sight` graph
(protocols.algorithms) from the same rows, and picks the same layout
(`choose_layout`: of those whose graph of edges read at least `min_ok` of
the time carries the collectives, the one where they cost least). A row
frozen early was frozen on what the others had measured then; if the FINAL
rows of this first round do not decide after all, or the layout they choose
does not carry the collectives (some direction read too few frames in every
layout), every rank sees it from the same rows and starts another round
(`Row.round`): every row measures the whole ladder and is frozen again,
from the third round on only after watching the ladder again as long as it
first took, so each round's qualities rest on more frames than the last.
The choice is made from the first round's rows that carry, or from the last
round's (ROUNDS) whatever they carry: a room no layout reads then gives up,
naming each direction. A rank sets COMPLETE in its row once its handshake
is complete, and keeps greeting (showing status frames) until every row is
COMPLETE, so the others' rows and echoes still pass through it.

Rows are relayed only from senders this rank trusts (their frames proven to
be of this run); a newer `version` replaces an older one.

A rank that starts again (a new process: an empty table) cannot redo the
discovery alone: the others show only the chosen layout by then. It does
not have to: a restart moves no camera. The first table it takes from a
trusted peer has every rank's row, its own as its earlier incarnation left
it; if the rows it then holds, with that copy of its own, decide the choice
(`known`) while its own row does not, it takes that copy (`adopted`): the
same FINAL rows, so the same sight graph and layout every rank got. The
others keep their rows (a FINAL row never changes what it reads). Its row
then goes on from a version newer than the copy, not COMPLETE until its
handshake is. A copy of its own row newer than its own (an earlier
incarnation's, during start-up) makes its numbering continue after it.
COMPLETE is cleared while a rank's handshake is incomplete again (a peer
started again: protocols.security.Handshake), so every rank greets until the
new incarnation is greeted both ways.

A room may start without a rank that has not started: the lead (the rank
given `start_without`, the parameter server's in the built-in run) waits
`wait_s` from its own start for every rank to come alive; then, if
`start_without` allows the room to go on without the ranks still not alive,
it writes each of them a row of its own: ABSENT (FINAL, reading nothing) at
version ABSENT_VERSION, newer than any row that rank can have made by then.
Every rank relays it and lets it replace any other row of that rank, so the
ranks agree on who is in (`members`): discovery, the sight graph, the
layout's cost and the handshake go on over the members alone. A rank that
finds its own row ABSENT in a trusted peer's table was left out.

Such a rank joins later. It takes the room's layout from the rows of the
ranks in from the start (they decide it as they did: `room_layout`), shows
and reads only that layout, and makes its own row JOINING (versions after
the ABSENT one's). While a rank asks to join (`welcoming`: its JOINING row
reached this rank, for up to WELCOME_S), every rank greets: its screen shows
a frame every hold, so a camera counts the frames a screen showed by the
hold. The joining rank watches every rank
in the room, and each of them watches it (`_watch`: the share of its frames
read, once `need` of them were shown between the first and the last read,
or after JOIN_HOLDS holds); each row then keeps that column for good and
says so in its `watched` mask, and the joining row becomes FINAL. Once its
row is FINAL, every member's row has watched it, it reads a member's
screen and a member reads its own, the lead admits it: its row, ADMITTED.
A rank counts an admitted rank among the `members` once every other
member's row it holds has watched it, so every rank builds the same graph
with its edges; the layout stays the room's (a rank that joined later
never changes the choice). The admitted rank takes the ADMITTED row as its
own (as a rank that starts again takes its row) and goes on from it; a
rank in the room keeps watching the ranks that join after it. Pure: no I/O,
no asyncio; times are the caller's clock.
"""

from __future__ import annotations

import bisect
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field, replace

MAX_RANKS = 16
MAX_LAYOUTS = 8  # layouts of the start-up ladder a row measures (a frame's `showing` has a bit for each)
QUALITY_LEVELS = 15  # a quality is sent in 4 bits: 0..15 fifteenths
# A row: version, flags, reads, trusts, then the quality of each rank in each layout measured (a nibble
# each: rank r, layout k at r * layouts + k; on a frame, the group's ranks only, to a whole byte). A table
# measures 1 to MAX_LAYOUTS layouts (a pinned layout's table is small enough for a coarse layout's
# frames); a status frame too small for every row of the table shows it a page of consecutive rows at a
# time (protocols.transfer.status_message).
# (What a row reads is not sent: a rank reads another exactly when its quality in some layout is at least
# MIN_QUALITY, and the receiver works it out from the qualities.)
ROW_HEAD = struct.Struct(">HBBHH")  # version, flags, round, watched and trusts (a bit a rank)


def row_bytes(layouts: int, ranks: int = MAX_RANKS) -> int:
    """A row measuring `layouts` layouts of a group of `ranks` ranks (the qualities of those ranks only)."""
    return ROW_HEAD.size + (ranks * layouts + 1) // 2


def table_bytes(layouts: int) -> int:
    return MAX_RANKS * row_bytes(layouts)


# Flags: FINAL (frozen), COMPLETE (handshake complete), in bits 2-5 how many layouts at the end of the ladder
# the row left out (0: it measured every layout), and in bits 6-7 the rank's stage (Row.stage): in the room from the start (0), ABSENT (the lead's row for a rank
# the room started without), JOINING (the row of such a rank, which now runs and asks to join) or ADMITTED
# (the lead's answer: the row of a rank that joined after the room started, and every later row of it).
FINAL, COMPLETE = 0x01, 0x02
# The rounds of measurement a room takes at most (Row.round): the first, which may freeze a row on part of the
# ladder, then rounds that measure all of it, each longer than the last, while the rows do not carry the
# collectives; the last round's rows are the room's choice whatever they carry.
ROUNDS = 4
STAGE_SHIFT, STAGE_MASK = 6, 0xC0
ABSENT, JOINING, ADMITTED = 1 << STAGE_SHIFT, 2 << STAGE_SHIFT, 3 << STAGE_SHIFT
ABSENT_VERSION = 0x4000  # an ABSENT row's version: newer than any a rank makes in its first hours
UNMEASURED_SHIFT, UNMEASURED_MASK = 2, 0x3C  # 0 to MAX_LAYOUTS
MIN_QUALITY = 0.25  # a screen read less often than this is not an edge of the sight graph
MIN_FRAMES = 4  # frames of a peer before its quality is measured
# A frame read with at least this share of its code's error correction to spare counts whole in a quality;
# one read nearer the edge counts less, down to nothing at the edge (LinkCodec.margin): a layout chosen on
# frames read only just would fail as the light drifts (exposure and white balance wander over minutes).
HEADROOM = 0.5
FIRST_FRAMES = 8  # frames of the ladder's first layout in a row, each period of the probe schedule
OTHER_FRAMES = 2  # and of each other layout
# A layout whose frames are held for less than this many of a camera's capture periods reads steadily only
# if the screen's changes sweep across the camera's captures: a hold near a whole number of periods beats
# with the camera, and for seconds at a time every capture straddles a change of frame (a 67 ms hold at 15
# frames a second reads for ten seconds, then nothing for three), so what start-up measured of it says
# nothing of the run. 1.5 periods (50 ms at 30 frames a second) reads steadily whatever the phase.
MIN_HOLD_PERIODS = 1.4
# Under that, a hold of at least STEADY_MIN_PERIODS periods whose changes move by at least STEADY_DRIFT of a
# period against the captures from one frame to the next (an 83 ms hold at 15 frames a second: a quarter
# period) sweeps every phase within a few frames: what start-up measured of it holds for the run.
STEADY_MIN_PERIODS = 1.1
STEADY_DRIFT = 0.15


def steady_hold(hold_s: float, period_s: float) -> bool:
    """Does a layout held `hold_s` read steadily on a camera that captures every `period_s` (0: not known
    yet, yes)? See MIN_HOLD_PERIODS."""
    if period_s <= 0 or hold_s >= MIN_HOLD_PERIODS * period_s:
        return True
    periods = hold_s / period_s
    drift = abs(periods - round(periods))
    return periods >= STEADY_MIN_PERIODS and drift >= STEADY_DRIFT
# A rank watches the screen of a rank that joins after the room started for at most this many holds of the
# room's layout (4 s at 100 ms) before its row says what it read of it (a screen read well is measured
# sooner: once `need` of its frames were shown between the first and the last read).
JOIN_HOLDS = 40
# The ranks greet for a rank that asks to join for at most this long from when its JOINING row reached them
# (a laptop that asked and then went away would otherwise keep every screen greeting for the rest of the
# run); it can still be let in later, on the status frames every rank shows when its acknowledgements change.
WELCOME_S = 60.0


def startup_budget_s(world: int) -> float:
    """The room seconds start-up (the greeting and discovery) has on a table of `world` ranks: 10 s for
    two, 20 s for eight, in proportion between and beyond (about 33 s for sixteen). A rank not started by
    then says what it lacks."""
    return 10.0 + 10.0 * max(0, world - 2) / 6


@dataclass(frozen=True)
class Row:
    version: int = 0
    flags: int = 0
    reads: int = 0  # the ranks whose quality in some layout is at least MIN_QUALITY (not sent: see ROW_HEAD)
    trusts: int = 0
    # quality[r][k]: the share of rank r's frames in layout k read, in fifteenths (0: not read, or layout k
    # not measured: see `unmeasured`)
    quality: tuple[tuple[int, ...], ...] = ((0,) * MAX_LAYOUTS,) * MAX_RANKS
    # the ranks whose columns this row has measured and keeps (set once the row is FINAL; a rank that joins
    # later is added once this rank has watched its screen)
    watched: int = 0
    round: int = 0  # the round of measurement (0: the first; see SightTable.update)

    def share(self, shown: int, layout: int = 0) -> float:
        return self.quality[shown][layout] / QUALITY_LEVELS

    @property
    def final(self) -> bool:
        return bool(self.flags & FINAL)

    @property
    def complete(self) -> bool:
        return bool(self.flags & COMPLETE)

    @property
    def full(self) -> bool:
        """Of a round after the first: measured over the whole ladder."""
        return self.round > 0

    @property
    def stage(self) -> int:
        """Where the rank stands: 0 in the room from the start, 1 absent, 2 joining, 3 admitted. A row of a
        later stage replaces any row of an earlier one (SightTable.relay)."""
        return (self.flags & STAGE_MASK) >> STAGE_SHIFT

    @property
    def absent(self) -> bool:
        """The lead's row for a rank the room started without."""
        return self.stage == 1

    @property
    def joining(self) -> bool:
        """The row of a rank the room started without, which now asks to join."""
        return self.stage == 2

    @property
    def admitted(self) -> bool:
        """A row of a rank that joined after the room started (the lead admitted it)."""
        return self.stage == 3

    @property
    def unmeasured(self) -> int:
        """How many layouts at the end of the ladder this row did not measure."""
        return (self.flags & UNMEASURED_MASK) >> UNMEASURED_SHIFT


EMPTY = Row()
LEFT_OUT = Row(ABSENT_VERSION, FINAL | ABSENT)  # a rank's row as the room's choice counts it when it joined later


def _kept(row: Row, columns: int) -> tuple:
    """What a row says of the ranks in `columns` (a bit a rank): what a FINAL row keeps."""
    cols = [c for c in range(MAX_RANKS) if columns >> c & 1]
    return row.reads & columns, tuple(row.quality[c] for c in cols), row.unmeasured


def _pack_quality(q: tuple[tuple[int, ...], ...], layouts: int, ranks: int) -> bytes:
    flat = [min(QUALITY_LEVELS, max(0, per[k])) for per in q[:ranks] for k in range(layouts)]
    flat += [0] * (len(flat) % 2)
    return bytes(flat[i] << 4 | flat[i + 1] for i in range(0, len(flat), 2))


def _unpack_quality(b: bytes, layouts: int, ranks: int) -> tuple[tuple[int, ...], ...]:
    flat = [v for byte in b for v in (byte >> 4, byte & 15)]
    return tuple(tuple(flat[r * layouts:(r + 1) * layouts]) + (0,) * (MAX_LAYOUTS - layouts) if r < ranks
                 else (0,) * MAX_LAYOUTS for r in range(MAX_RANKS))


def pack_table(rows: tuple[Row, ...], layouts: int = MAX_LAYOUTS) -> bytes:
    """The whole table (MAX_RANKS rows, empty ones where not given) measuring `layouts` layouts:
    table_bytes(layouts) bytes."""
    return pack_rows(tuple(rows) + (EMPTY,) * (MAX_RANKS - len(rows)), layouts, MAX_RANKS)


def pack_rows(rows: tuple[Row, ...], layouts: int, ranks: int = MAX_RANKS) -> bytes:
    """These rows, row_bytes(layouts, ranks) each, with the qualities of the group's `ranks` ranks: a page
    of the table as a status frame shows it."""
    if not 1 <= layouts <= MAX_LAYOUTS or not len(rows) <= ranks <= MAX_RANKS:
        raise ValueError(f"a page of a table of up to {MAX_RANKS} ranks measures 1 to {MAX_LAYOUTS} layouts and has "
                         f"a row per rank at most, not {layouts} layouts and {len(rows)} rows of {ranks} ranks")
    return b"".join(ROW_HEAD.pack(r.version & 0xFFFF, r.flags, r.round, r.watched, r.trusts)
                    + _pack_quality(r.quality, layouts, ranks) for r in rows)


def table_layouts(size: int) -> int | None:
    """How many layouts a whole table of `size` bytes measures (None: no table is that size)."""
    for k in range(1, MAX_LAYOUTS + 1):
        if table_bytes(k) == size:
            return k
    return None


def unpack_table(data: bytes) -> tuple[Row, ...]:
    """A whole table (`pack_table`)."""
    layouts = table_layouts(len(data))
    if layouts is None:
        raise ValueError(f"no discovery table is {len(data)} bytes")
    return unpack_rows(data, layouts, 0, MAX_RANKS)


def unpack_rows(data: bytes, layouts: int, first: int, count: int, ranks: int = MAX_RANKS) -> tuple[Row, ...]:
    """A page of the table (`pack_rows`) of a group of `ranks` ranks: rows first .. first + count - 1 of
    MAX_RANKS, the others EMPTY (version 0: `SightTable.relay` takes nothing from them)."""
    n = row_bytes(layouts, ranks)
    if (not 1 <= layouts <= MAX_LAYOUTS or not 0 <= ranks <= MAX_RANKS or first < 0 or count < 0
            or first + count > ranks or len(data) != n * count):
        raise ValueError(f"no page of {count} rows from row {first} of {ranks} ranks measuring {layouts} layouts "
                         f"is {len(data)} bytes")
    out = [EMPTY] * MAX_RANKS
    for i in range(count):
        v, flags, rnd, watched, trusts = ROW_HEAD.unpack_from(data, i * n)
        quality = _unpack_quality(data[i * n + ROW_HEAD.size:(i + 1) * n], layouts, ranks)
        out[first + i] = Row(v, flags, reads_of(quality), trusts, quality, watched, rnd)
    return tuple(out)


def reads_of(quality: tuple[tuple[int, ...], ...]) -> int:
    """The ranks (a bit a rank) a row's qualities say it reads: at least MIN_QUALITY in some layout."""
    return sum(1 << r for r, per in enumerate(quality) if max(per) >= level(MIN_QUALITY))


def _newer(a: int, b: int) -> bool:
    """Is version `a` newer than `b` (u16, wrapping)?"""
    return a != b and (a - b) & 0xFFFF < 0x8000


# A time this little before a slot of the probe schedule starts is in it: a sender's frame shown a little early
# (shown times are whole microseconds; a real screen's timer jitters) goes up in its slot's layout.
SLOT_EPS = 0.002


class ProbeSchedule:
    """The layout of the start-up ladder each status frame goes up in while probing, as a timetable on
    the sender's own clock that repeats every `period` seconds from time 0: `frames[k]` frames of layout k
    (each held for its own hold), layout after layout in ladder order. A frame's layout and the frames of
    each layout its sender showed between two times follow from the frames' shown times alone.

    By default (`frames` None) the first layout, the fastest and the one most rooms pick, gets FIRST_FRAMES
    frames in a row and every other layout OTHER_FRAMES: the first layout shows enough frames to be measured
    within about a period (1.3 s for the collectives' ladder), every layout within four."""

    def __init__(self, holds: tuple[float, ...], frames: tuple[int, ...] | None = None) -> None:
        self.holds = tuple(float(h) for h in holds)
        if not self.holds or min(self.holds) <= 0:
            raise ValueError(f"a probe schedule needs layouts held a positive time, not {self.holds}")
        if frames is None:
            frames = (FIRST_FRAMES,) + (OTHER_FRAMES,) * (len(self.holds) - 1) if len(self.holds) > 1 else (1,)
        if len(frames) != len(self.holds) or min(frames) < 1:
            raise ValueError(f"a probe schedule shows each of its {len(self.holds)} layouts at least once a "
                             f"period, not {frames}")
        self.frames = tuple(int(n) for n in frames)
        self.layout_of: list[int] = [k for k, n in enumerate(self.frames) for _ in range(n)]
        self.starts: list[float] = []
        t = 0.0
        for k in self.layout_of:
            self.starts.append(t)
            t += self.holds[k]
        self.period = t
        # before[i][k]: the slots of layout k among the first i slots of a period
        self.before = [[0] * len(self.holds)]
        for k in self.layout_of:
            row = list(self.before[-1])
            row[k] += 1
            self.before.append(row)

    def _slot(self, t: float) -> tuple[int, int]:
        """(period number, slot in the period) of the slot time `t` is in."""
        u = t + SLOT_EPS
        n = math.floor(u / self.period)
        i = bisect.bisect_right(self.starts, u - n * self.period) - 1
        return n, max(0, i)

    def at(self, t: float) -> tuple[int, float]:
        """The layout a frame shown at `t` goes up in, and when its slot ends (the next frame's time)."""
        n, i = self._slot(t)
        k = self.layout_of[i]
        return k, n * self.period + self.starts[i] + self.holds[k]

    def count(self, layout: int, a: float, b: float) -> int:
        """Frames of `layout` shown from the slot of time `a` to the slot of time `b`, both included."""
        if b < a:
            return 0
        slots = len(self.layout_of)

        def upto(n: int, i: int) -> int:  # slots of `layout` before slot i of period n
            return n * self.frames[layout] + self.before[i][layout]

        na, ia = self._slot(a)
        nb, ib = self._slot(b)
        ib += 1
        if ib == slots:
            nb, ib = nb + 1, 0
        return upto(nb, ib) - upto(na, ia)

    def span(self, layout: int, frames: int) -> float:
        """At most how long, from any time, until `frames` frames of `layout` have gone up."""
        return (math.ceil(frames / self.frames[layout]) + 1) * self.period


@dataclass
class _Seen:
    first_us: int
    last_us: int
    frames: dict = field(default_factory=dict)  # shown_us -> the frame's weight (its best read's headroom)


def level(q: float) -> int:
    """The fewest fifteenths that mean at least `q`."""
    return max(1, math.ceil(q * QUALITY_LEVELS - 1e-9))


# What the collectives cost in layout k on a graph of edges among `ranks` ranks numbered 0 .. ranks - 1 (the
# room's members in rank order), in seconds; None: they cannot run there.
Cost = Callable[[int, dict[tuple[int, int], float], int], "float | None"]


@dataclass
class SightTable:
    """This rank's measurement and its copy of every rank's row (see the module docstring). `hold_s`: how
    long each frame stays up, per layout of the ladder (one float: one layout); `schedule`: the timetable
    every rank's status frames follow while probing (default: ProbeSchedule(hold_s)); `cost`: what the
    collectives would cost in a layout on a graph of edges (seconds, None: they cannot run there), the same
    on every rank; without it every row measures the whole ladder before it is frozen."""

    rank: int
    world: int
    hold_s: float | tuple[float, ...]
    settle_s: float = 2.0
    min_ok: float = 0.5  # the share of frames a layout must get through on an edge to carry it (not the last)
    cost: Cost | None = None
    schedule: ProbeSchedule | None = None
    rows: list[Row] = field(default_factory=list)
    _seen: dict[tuple[int, int], _Seen] = field(default_factory=dict)
    _since: float | None = None  # when what this rank reads (or trusts, or the ranks alive) last changed
    _alive: int = 0
    _alive_new: bool = False  # a rank came alive since the last update
    _edges: tuple = ()  # what this camera read in every layout (ranks, edges per threshold) at the last update
    _first: float | None = None  # when this rank first read a frame of this run
    _alive_at: dict[int, float] = field(default_factory=dict)  # rank -> when this rank first knew it alive
    _costs: dict = field(default_factory=dict)  # (layout, edges) -> cost, as `cost` said
    adopted: int = 0  # times this rank took its own row from the room's table (it started again)
    camera_period_s: float = 0.0  # this rank's camera: seconds between captures (0: not known yet)
    # The lead's: whether the room may start without the ranks of a mask (None: it waits for every rank),
    # asked once `wait_s` passed since this rank's first update
    start_without: Callable[[int], bool] | None = None
    wait_s: float = math.inf
    _started: float | None = None
    _watch_from: dict[int, float] = field(default_factory=dict)  # joining rank -> when this rank began to watch it
    _asked_at: dict[int, float] = field(default_factory=dict)  # joining rank -> when its JOINING row reached this rank
    _now: float = 0.0  # the time of the latest update
    _room: tuple[int, float] | None = None  # the room's layout and the least share of its graph's edges: once `known`
    _round_at: float = 0.0  # when this rank's row began its round

    def __post_init__(self) -> None:
        if not self.rows:
            self.rows = [EMPTY] * self.world
        self._alive = 1 << self.rank
        self.holds = tuple(self.hold_s) if isinstance(self.hold_s, (tuple, list)) else (float(self.hold_s),)
        if not 1 <= len(self.holds) <= MAX_LAYOUTS:
            raise ValueError(f"discovery measures 1 to {MAX_LAYOUTS} layouts, not {len(self.holds)}")
        self.layouts = len(self.holds)
        if self.schedule is None:
            self.schedule = ProbeSchedule(self.holds)
        if self.schedule.holds != self.holds:
            raise ValueError(f"the probe schedule's holds {self.schedule.holds} are not the ladder's {self.holds}")
        # frames a layout shows before it counts as measured: enough for one read min_ok of the time to give
        # MIN_FRAMES reads (one layout: MIN_FRAMES, there is nothing to choose between)
        self.need = math.ceil(MIN_FRAMES / max(self.min_ok, MIN_QUALITY) - 1e-9) if self.layouts > 1 else MIN_FRAMES
        # and the longest a rank watches before every layout counts as measured, whatever it read: long
        # enough for the schedule to show `need` frames of each from any time
        self.watch_s = max(self.schedule.span(k, self.need) for k in range(self.layouts)) if self.layouts > 1 else 0.0

    # ---- what this rank sees
    def accepted(self, sender: int, shown_us: int, layout: int = 0, margin: float = 1.0) -> None:
        """A frame of `sender` (of this run) was read in `layout`, shown at `shown_us` on the sender's clock,
        with `margin` of its error correction to spare (LinkCodec.margin): it weighs min(1, margin / HEADROOM)
        in the quality."""
        if not 0 <= layout < self.layouts:
            return
        s = self._seen.get((sender, layout))
        if s is None:
            s = self._seen[(sender, layout)] = _Seen(shown_us, shown_us)
        s.first_us, s.last_us = min(s.first_us, shown_us), max(s.last_us, shown_us)
        if len(s.frames) < 4096:
            weight = min(1.0, max(0.0, margin / HEADROOM))
            s.frames[shown_us] = max(weight, s.frames.get(shown_us, 0.0))

    def alive(self, ranks: int) -> None:
        """These ranks (a mask) are known to be running (their run nonce was heard, here or relayed)."""
        if ranks & ~self._alive:
            self._alive |= ranks
            self._alive_new = True

    def _span(self, sender: int) -> tuple[float, float] | None:
        """The first and last frame read of `sender` in any layout (its clock, seconds), None if none."""
        seen = [v for k in range(self.layouts) if (v := self._seen.get((sender, k))) is not None]
        if not seen:
            return None
        return min(v.first_us for v in seen) / 1e6, max(v.last_us for v in seen) / 1e6

    def shown(self, sender: int, layout: int = 0) -> int:
        """Frames `sender` showed in `layout` from the first to the last frame read of it in any layout."""
        span = self._span(sender)
        return 0 if span is None else self.schedule.count(layout, *span)

    def quality(self, sender: int, layout: int = 0) -> float:
        """The share of `sender`'s frames in `layout` read with headroom: frames read (each weighed by its
        headroom, `accepted`), per frame it showed in that layout since the first and up to the last frame
        read of it in any layout (0 until MIN_FRAMES were shown, and in a layout that does not read steadily
        on this camera: `steady_hold`)."""
        s = self._seen.get((sender, layout))
        if s is None or not steady_hold(self.holds[layout], self.camera_period_s):
            return 0.0
        shown = self.shown(sender, layout)
        if shown < MIN_FRAMES:
            return 0.0
        return min(1.0, sum(s.frames.values()) / shown)

    def measured(self, now: float) -> int:
        """How many layouts, from the first, this rank has measured at time `now` (see the module
        docstring)."""
        # (watched since the first frame read and since the last rank came alive: a rank that starts late is
        # watched for as long as the others were)
        peers = [r for r in range(self.world) if r != self.rank and self.rows[r].stage == 0]
        last = max([self._first if self._first is not None else math.inf]
                   + [self._alive_at.get(r, math.inf) for r in peers])
        if now - last >= self.watch_s:
            return self.layouts
        m = 0
        for k in range(self.layouts):
            for r in peers:
                if self._span(r) is None:
                    # never read: long enough, since it came alive, that its frames would have been read
                    since = max(self._first if self._first is not None else math.inf, self._alive_at.get(r, math.inf))
                    if now - since < self.schedule.span(k, self.need):
                        return m
                    continue
                shown = self.shown(r, k)
                if shown < self.need and not (shown >= MIN_FRAMES and (r, k) not in self._seen):
                    return m
            m += 1
        return m

    def _reads(self, layouts: int) -> tuple[int, tuple[tuple[int, ...], ...]]:
        """The ranks read at least MIN_QUALITY of the time in the first `layouts` layouts, and the quality of
        each rank in each of them (the others 0), as a row says them."""
        q = [[0] * MAX_LAYOUTS for _ in range(MAX_RANKS)]
        mask = 0
        for r in range(self.world):
            if r == self.rank or self.rows[r].stage != 0:
                continue
            for k in range(layouts):
                share = self.quality(r, k)
                # the nibble sent says at least MIN_QUALITY exactly when the share measured does
                q[r][k] = max(round(QUALITY_LEVELS * share), level(MIN_QUALITY)) if share >= MIN_QUALITY else \
                    min(round(QUALITY_LEVELS * share), level(MIN_QUALITY) - 1)
                if share >= MIN_QUALITY:
                    mask |= 1 << r
        return mask, tuple(tuple(x) for x in q)

    # ---- in words
    def directions(self, names: list[str] | tuple[str, ...], layouts: list[str] | tuple[str, ...],
                   heard: frozenset[int] | set[int] = frozenset()) -> list[str]:
        """What each camera of the room read of each screen so far, one line a direction (`names`: the ranks'
        names; `layouts`: each layout of the ladder in words, e.g. "28x50 cells of 22 px"): this rank's own
        camera by its counts of frames read and shown per layout, the others' by the latest row of theirs
        that reached this rank. `heard`: the peers whose frames this camera read but that it does not trust
        yet (none echoes this rank: their cameras do not read its screen), whose frames the table does not
        count."""
        out = []
        members = self.members()
        for r in range(self.world):
            if not members >> r & 1:
                continue
            for s in range(self.world):
                if s == r or not members >> s & 1:
                    continue
                head = f"{names[s]} -> {names[r]}"
                if r == self.rank:
                    parts = []
                    for k in range(self.layouts):
                        seen = self._seen.get((s, k))
                        if seen is None:
                            continue
                        shown = max(self.shown(s, k), len(seen.frames))
                        part = f"{len(seen.frames)} of {shown} frames of {layouts[k]}"
                        if not steady_hold(self.holds[k], self.camera_period_s):
                            part += (f" (held {self.holds[k] * 1000:.0f} ms: too brief for a camera at "
                                     f"{1 / self.camera_period_s:.0f} frames a second)")
                        parts.append(part)
                    if parts:
                        out.append(f"{head}: read {', '.join(parts)}")
                    elif s in heard:
                        out.append(f"{head}: frames read, none echoing {names[r]} ({names[s]}'s camera does not "
                                   f"read {names[r]}'s screen)")
                    else:
                        out.append(f"{head}: no frame read")
                    continue
                row = self.rows[r]
                if not row.version:
                    out.append(f"{head}: no word yet from {names[r]}'s camera")
                    continue
                measured = self._measured_by(row)
                parts = [f"{100 * row.share(s, k):.0f} % of {layouts[k]}" for k in range(measured)
                         if row.quality[s][k]]
                out.append(f"{head}: reads {', '.join(parts)}" if parts else
                           f"{head}: no frame read in the {measured} layouts measured" if measured else
                           f"{head}: no layout measured yet")
        return out

    # ---- rows
    def update(self, now: float, trusts: int, complete: bool) -> bool:
        """Refresh this rank's own row at time `now`; True if it changed (a new version to show)."""
        if self._started is None:
            self._started = now
        self._now = now
        self._leave_out(now)
        self._admit()
        for r, row in enumerate(self.rows):
            if row.stage == 2:
                self._asked_at.setdefault(r, now)
        me = self.rows[self.rank]
        if me.stage == 2 or (me.final and self.known):
            return self._watch_joining(now, trusts, complete)
        members = self.members()
        for r in range(self.world):
            if self._alive >> r & 1:
                self._alive_at.setdefault(r, now)
        flags, rnd = me.flags, me.round
        later = max(r.round for r in self.rows)
        if me.final and self._spent():
            later = me.round + 1
        if later > rnd:
            # a new round: the frozen rows of this one do not make the choice (here, or as a row of the new
            # round shows, on another rank)
            flags, rnd = flags & ~FINAL, later
            self._since, self._round_at = None, now
        if flags & FINAL:
            reads, quality, unmeasured = me.reads, me.quality, me.unmeasured
        else:
            m = self.measured(now)
            unmeasured = self.layouts - m
            # what the row says: the layouts measured (the others 0)
            reads, quality = self._reads(m)
            # what this camera reads in every layout so far: a row that measured the whole ladder settles once
            # none of it moves
            seen_reads, seen = self._reads(self.layouts)
            edges = (seen_reads,) + tuple(sum(1 << r for r in range(self.world) if seen[r][k] >= t)
                                          for k in range(self.layouts) for t in (level(MIN_QUALITY), level(self.min_ok)))
            # (a new trust counts too: the frames of a peer just trusted are about to be counted)
            if edges != self._edges or trusts != me.trusts or self._since is None or self._alive_new:
                self._since = now
                self._alive_new = False
                self._edges = edges
            flags = (flags & ~UNMEASURED_MASK) | unmeasured << UNMEASURED_SHIFT
        # FINAL: every member is up and this camera reads some screen (or this rank is the only member); and
        # either it has measured the whole ladder and nothing changed for settle_s, or (first round) it has
        # measured enough of the ladder that the rows decide (`decide`: measuring the rest could not change
        # the choice)
        if self._seen and self._first is None:
            self._first = now
        if not flags & FINAL and self._alive & members == members and (reads or members == 1 << self.rank):
            if unmeasured == 0:
                # (from the third round on, each round watches the ladder again, for as long as measuring it
                # first took: the qualities then rest on twice, three times as many frames)
                final = now - self._since >= self.settle_s and (rnd < 2 or now - self._round_at >= self.watch_s)
            else:
                final = rnd == 0 and self._decides(Row(me.version + 1, flags, reads, trusts, quality))
            if final:
                flags |= FINAL
        flags = flags | COMPLETE if complete else flags & ~COMPLETE
        watched = members & ~(1 << self.rank) if flags & FINAL else 0
        return self._set_row(Row(me.version, flags, reads, trusts, quality, watched, rnd))

    def _set_row(self, new: Row) -> bool:
        """This rank's row says `new` (its version aside): True if that is news (a new version)."""
        me = self.rows[self.rank]
        if new == replace(me, version=new.version):
            return False
        self.rows[self.rank] = replace(new, version=(me.version + 1) & 0xFFFF)
        return True

    def _watch_joining(self, now: float, trusts: int, complete: bool) -> bool:
        """After the room started: this rank's row measures, in the room's layout, the screen of each rank
        that joins (a joining rank's own row: every rank in the room, then it is FINAL), each column once."""
        me = self.rows[self.rank]
        flags = me.flags | COMPLETE if complete else me.flags & ~COMPLETE
        if not self.known:
            return self._set_row(replace(me, flags=flags, trusts=trusts))  # (a joining rank waits for the rows)
        reads, watched = me.reads, me.watched
        todo = [r for r in range(self.world)
                if r != self.rank and not watched >> r & 1 and self.rows[r].version and self.rows[r].stage != 1]
        if not todo:  # (the common case, on every frame of a run: nobody joins)
            return self._set_row(replace(me, flags=flags, trusts=trusts))
        k = self.room_layout()
        quality = [list(q) for q in me.quality]
        for r in todo:
            q = self._watch(r, k, now)
            if q is None:
                continue
            quality[r][k] = max(round(QUALITY_LEVELS * q), level(MIN_QUALITY)) if q >= MIN_QUALITY else \
                min(round(QUALITY_LEVELS * q), level(MIN_QUALITY) - 1)
            reads = reads | 1 << r if q >= MIN_QUALITY else reads & ~(1 << r)
            watched |= 1 << r
        if me.stage == 2 and all(watched >> r & 1 for r in todo):
            flags |= FINAL
        return self._set_row(Row(me.version, flags, reads, trusts, tuple(tuple(q) for q in quality), watched))

    def _watch(self, r: int, k: int, now: float) -> float | None:
        """The share of rank `r`'s frames in layout k this camera reads, counted by the hold (the room's
        screens show a frame every hold while a rank joins: they greet), once measured (None: not yet):
        `need` of them shown between the first and the last read, or JOIN_HOLDS holds since this rank began
        to watch it (then 0 if fewer than MIN_FRAMES were shown)."""
        since = self._watch_from.get(r)
        if since is None:
            # (what this camera read of it before, in another layout of the ladder or with gaps, does not count)
            self._watch_from[r] = now
            for key in [key for key in self._seen if key[0] == r]:
                del self._seen[key]
            return None
        hold = self.holds[k]
        s = self._seen.get((r, k))
        shown = 0 if s is None else round((s.last_us - s.first_us) / 1e6 / hold) + 1
        if shown < self.need and now - since < JOIN_HOLDS * hold:
            return None
        if s is None or shown < MIN_FRAMES or not steady_hold(hold, self.camera_period_s):
            return 0.0
        return min(1.0, sum(s.frames.values()) / shown)

    def started_with(self) -> int:
        """The ranks the room started with (a bit a rank): every rank but those it started without, whether or
        not they joined later."""
        return sum(1 << r for r, row in enumerate(self.rows) if row.stage == 0)

    def members(self, rows: list[Row] | tuple[Row, ...] | None = None) -> int:
        """The ranks in the room (a bit a rank): those in it from the start, and each admitted rank whose
        screen the row of every other of them has watched (then every rank's graph has the same edges to
        it); not the ABSENT ones, nor those still joining."""
        rows = self.rows if rows is None else rows
        base = [r for r in range(self.world) if rows[r].stage in (0, 3)]
        return sum(1 << r for r in base
                   if not rows[r].admitted or all(rows[s].watched >> r & 1 for s in base if s != r))

    @property
    def member(self) -> bool:
        """This rank is in the room."""
        return bool(self.members() >> self.rank & 1)

    @property
    def joining(self) -> bool:
        """The room started without this rank, which asks to join (its row is JOINING)."""
        return self.rows[self.rank].joining

    @property
    def welcoming(self) -> bool:
        """A rank asks to join (its JOINING row reached this rank, less than WELCOME_S ago) or is admitted
        and not yet watched by every member. Every rank shows status frames meanwhile, a frame every hold.
        (A rank the room started without that runs but has not taken the room's rows yet gets the status
        frames every rank shows when its acknowledgements change: the echo of its nonce, and the rows.)"""
        members = self.members()
        return any(not members >> r & 1 and row.stage in (2, 3)
                   and self._now - self._asked_at.get(r, self._now) < WELCOME_S for r, row in enumerate(self.rows))

    def _admit(self) -> None:
        """The lead's: a joining rank whose row is FINAL, whose screen every member's row has watched, that
        reads a member's screen and whose screen a member reads, is admitted (its row, ADMITTED)."""
        if self.start_without is None:
            return
        members = self.members()
        for r, row in enumerate(self.rows):
            if row.stage != 2 or not row.final:
                continue
            base = [s for s in range(self.world) if s != r and self.rows[s].stage in (0, 3)]
            if (all(self.rows[s].watched >> r & 1 for s in base) and row.reads & members
                    and any(self.rows[s].reads >> r & 1 for s in base)):
                self.rows[r] = replace(row, version=(row.version + 1) & 0xFFFF,
                                       flags=row.flags & ~(STAGE_MASK | COMPLETE) | ADMITTED)

    def room_layout(self) -> int:
        """The layout the room chose (once `known`)."""
        return self._chosen()[0]

    def _chosen(self) -> tuple[int, float]:
        """The room's layout and the least share of its graph's edges, from the rows of the ranks in from
        the start (fixed once `known`)."""
        if self.known:
            return self._room
        k, _, least = self._decide_or_last(self.cost)
        return k, least

    def _leave_out(self, now: float) -> None:
        """The lead's choice, once `wait_s` passed since this rank's first update with some rank not alive:
        if `start_without` allows, an ABSENT row for each such rank (see the module docstring)."""
        everyone = (1 << self.world) - 1
        if (self.start_without is None or self._alive & everyone == everyone or now - self._started < self.wait_s
                or any(r.stage for r in self.rows)):
            return
        missing = everyone & ~self._alive
        if not self.start_without(missing):
            return
        for r in range(self.world):
            if missing >> r & 1:
                self.rows[r] = LEFT_OUT

    def relay(self, sender_rows: tuple[Row, ...]) -> bool:
        """Take the newer rows of a trusted sender's table; True if any changed. This rank's own row is
        never taken from another table, but for a rank that started again (see the module docstring): its
        row continues from a newer version than any of its rows the sender shows, and once the rows it has
        with the sender's copy of its own row decide the room's choice (`known`) while its own do not, it
        takes that copy (`adopted` counts how often)."""
        changed = False
        for r in range(self.world):
            if r == self.rank:
                continue
            theirs, mine = sender_rows[r], self.rows[r]
            if not theirs.version or theirs.stage < mine.stage:
                continue
            if theirs.stage > mine.stage:
                # The lead's ABSENT row over any row of the rank's own; the rank's JOINING row over ABSENT;
                # the lead's ADMITTED row over JOINING: whatever this rank had of it.
                self.rows[r] = theirs
                changed = True
                if theirs.stage >= 2:
                    self.alive(1 << r)
                continue
            if not mine.version or _newer(theirs.version, mine.version):
                if theirs.round < mine.round:
                    continue  # a row of an earlier round never replaces one of a later round
                if mine.final and theirs.round == mine.round and (
                        theirs.watched & mine.watched != mine.watched
                        or _kept(theirs, mine.watched) != _kept(mine, mine.watched)):
                    continue  # a FINAL row never changes a column it watched (but in a new round)
                self.rows[r] = theirs
                changed = True
                self.alive(1 << r)
        return self._own_row(sender_rows[self.rank]) or changed

    def _own_row(self, theirs: Row) -> bool:
        """A copy of this rank's own row in a trusted sender's table: in a room that started together it is
        one this rank made, never newer than its own. A newer one, or a FINAL one the room's choice rests
        on while this rank's table does not decide, was made by an earlier incarnation of this rank."""
        mine = self.rows[self.rank]
        if not theirs.version:
            return False
        version = theirs.version if _newer(theirs.version, mine.version) else mine.version
        if theirs.stage in (1, 2) and mine.stage in (0, 1):
            # The room started without this rank (or an earlier incarnation of it asked to join): ask to
            # join, watching the room's screens afresh.
            self.rows[self.rank] = Row((version + 1) & 0xFFFF, JOINING, 0, mine.trusts)
            self._seen.clear()
            self._watch_from.clear()
            return True
        if theirs.stage == 3 and mine.stage != 3:
            # Admitted (or an earlier incarnation was): the room's row of this rank, not COMPLETE until this
            # incarnation's handshake is.
            self.rows[self.rank] = replace(theirs, version=(version + 1) & 0xFFFF, flags=theirs.flags & ~COMPLETE,
                                           trusts=mine.trusts)
            self.adopted += mine.stage == 0
            return True
        if theirs.stage != mine.stage:
            return False
        if theirs.final and not self.known:
            rows = list(self.rows)
            rows[self.rank] = theirs
            if self.known_rows(rows):
                # The room chose its layout on that row: take it (what this camera reads does not change
                # with a restart), as a new version, not COMPLETE until this incarnation's handshake is.
                self.rows[self.rank] = replace(theirs, version=(version + 1) & 0xFFFF,
                                               flags=theirs.flags & ~COMPLETE, trusts=mine.trusts)
                self.adopted += 1
                return True
        if version != mine.version:
            # Rows of an earlier incarnation of this rank are still about: continue after them, so that
            # this incarnation's rows replace them (a FINAL one is kept by every rank; see above).
            self.rows[self.rank] = replace(mine, version=(version + 1) & 0xFFFF)
            return True
        return False

    def touch(self) -> None:
        """Show this rank's row again as a new version (what it says unchanged): a rank that started again
        counts the trusts of a row only from a version made after it took the room's table."""
        me = self.rows[self.rank]
        self.rows[self.rank] = replace(me, version=(me.version + 1) & 0xFFFF)

    def table(self) -> tuple[Row, ...]:
        return tuple(self.rows)

    # ---- the choice
    def _measured_by(self, row: Row) -> int:
        return 0 if not row.version else max(0, self.layouts - row.unmeasured)

    def _cost(self, cost: Cost, k: int, graph: dict[tuple[int, int], float], rows) -> float | None:
        """`cost` of layout k on `graph`, numbered among the members of `rows` (a room of one member: 0, there
        is nothing to move; a graph with no edge in a larger room: None)."""
        mask = self.members(rows)
        members = [r for r in range(self.world) if mask >> r & 1]
        if len(members) == 1:
            return 0.0
        if not graph:
            return None
        index = {r: i for i, r in enumerate(members)}
        mine = {(index[a], index[b]): q for (a, b), q in graph.items()}
        if cost is not self.cost:
            return cost(k, mine, len(members))
        key = (k, len(members), tuple(sorted(mine.items())))
        if key not in self._costs:
            if len(self._costs) > 256:
                self._costs.clear()
            self._costs[key] = cost(k, mine, len(members))
        return self._costs[key]

    def decide(self, rows: list[Row] | tuple[Row, ...] | None = None,
               cost: Cost | None = None) -> tuple[int, dict] | None:
        """The layout `rows` (default: this table's) choose, and its graph, if measuring the layouts some
        row left out could not change it: of the layouts every row measured, the cheapest by `cost`
        (default: the table's) whose graph of edges read at least `min_ok` of the time carries the
        collectives (the last layout: MIN_QUALITY), provided no layout left out would be cheaper even read
        whole on every edge (ties go to the denser, a measured one). None: they do not decide. Rows that
        measured the whole ladder always decide (`choose_layout`'s fallbacks included)."""
        chosen = self._decide(rows, cost)
        return None if chosen is None else chosen[:2]

    def _decide(self, rows, cost: Cost | None) -> tuple[int, dict, float] | None:
        """`decide`, with the least share of the graph's edges, over the rows of the ranks in the room from
        the start (a rank that joined later does not change the room's choice)."""
        rows = [LEFT_OUT if r.stage >= 2 else r for r in (self.rows if rows is None else rows)]
        cost = cost or self.cost
        m = min(self._measured_by(r) for r in rows if not r.absent)
        if m >= self.layouts:
            return self._choose(rows, cost)
        if cost is None or m == 0:
            return None
        last = self.layouts - 1
        best: tuple[float, int, dict, float] | None = None
        for k in range(m):
            least = max(self.min_ok, MIN_QUALITY) if k != last else MIN_QUALITY
            g = self.graph(k, least, rows)
            c = self._cost(cost, k, g, rows)
            if c is not None and (best is None or c < best[0]):
                best = (c, k, g, least)
        if best is None:
            return None
        members = self.members(rows)
        whole = {(r, s): 1.0 for r in range(self.world) for s in range(self.world)
                 if r != s and members >> r & 1 and members >> s & 1}
        for j in range(m, self.layouts):
            c = self._cost(cost, j, whole, rows)
            if c is not None and c < best[0]:
                return None
        return best[1:]

    def _decides(self, mine: Row) -> bool:
        rows = list(self.rows)
        rows[self.rank] = mine
        return self.decide(rows) is not None

    def _spent(self) -> bool:
        """Every row is frozen in this rank's round and they do not make the choice (`known_rows`): the next
        round is due (there is none after the last: ROUNDS)."""
        me = self.rows[self.rank]
        rows = [LEFT_OUT if r.stage >= 2 else r for r in self.rows]
        return (me.round + 1 < ROUNDS and all(r.final and r.round == me.round for r in rows if not r.absent)
                and not self.known_rows(self.rows))

    @property
    def known(self) -> bool:
        """Every rank's row is FINAL, of the same round, and they decide a layout that carries the collectives
        (or it is the last round): the sight graph and the layout are the same on every rank. Once known,
        always (those rows never change what they say), so the room's choice is kept then (`_room`) and not worked out again on every frame."""
        if self._room is None and self.known_rows(self.rows):
            k, _, least = self._decide_or_last(self.cost)
            self._room = (k, least)
        return self._room is not None

    def known_rows(self, rows: list[Row] | tuple[Row, ...]) -> bool:
        """Would these rows (one per rank) make the table `known`?"""
        rows = [LEFT_OUT if r.stage >= 2 else r for r in rows]  # (the ranks in the room from the start decide)
        rounds = {r.round for r in rows if not r.absent}
        if not all(r.final for r in rows) or len(rounds) != 1:
            return False
        chosen = self._decide(rows, self.cost)
        if chosen is None:
            return False
        k, graph, _ = chosen
        return rounds.pop() == ROUNDS - 1 or self._carried(k, graph, rows)

    @property
    def all_complete(self) -> bool:
        members = self.members()
        return all(row.complete for r, row in enumerate(self.rows) if members >> r & 1)

    def reads(self, reader: int, shown: int) -> bool:
        return bool(self.rows[reader].reads >> shown & 1)

    def lacks_mine(self, sender_rows: tuple[Row, ...]) -> bool:
        """Does a sender's table hold an older version of this rank's row than this rank's own (it has not
        read this rank's latest row yet)? A row the table does not show (version 0: another page) is not
        older."""
        theirs, mine = sender_rows[self.rank], self.rows[self.rank]
        return bool(theirs.version) and theirs.stage == mine.stage and _newer(mine.version, theirs.version)

    def trusts(self, truster: int, trusted: int) -> bool:
        return bool(self.rows[truster].trusts >> trusted & 1)

    def graph(self, layout: int = 0, min_quality: float = MIN_QUALITY,
              rows: list[Row] | tuple[Row, ...] | None = None) -> dict[tuple[int, int], float]:
        """The edges read in `layout` at least `min_quality` of the time: (reader, shown) -> share read."""
        rows = self.rows if rows is None else rows
        out = {}
        need = level(min_quality)
        members = self.members(rows)
        for r in range(self.world):
            row = rows[r]
            for s in range(self.world):
                if s != r and row.quality[s][layout] >= need and members >> r & 1 and members >> s & 1:
                    out[(r, s)] = row.share(s, layout)
        return out

    def goodput(self, nominal: float, layout: int = 0) -> dict[tuple[int, int], float]:
        """The graph's edges in `layout`, (reader, shown) -> bytes per second: `nominal` times the measured
        quality."""
        return {e: nominal * q for e, q in self.graph(layout).items()}

    def choose_layout(self, cost: Cost | None = None) -> tuple[int, dict]:
        """The layout every rank picks from the same FINAL rows, and its graph (`decide`, by `cost` or the
        table's): of the layouts whose graph of edges read at least `min_ok` of the time can carry the
        collectives, the cheapest by `cost(layout, graph)` (seconds, or None: no algorithm fits this graph);
        ties go to the denser. The last layout counts every edge read at least MIN_QUALITY of the time. If
        none fits, the cheapest of the every-edge graphs, else the last layout (its collectives then fail,
        saying why)."""
        k, g, least = self._decide_or_last(cost)
        if self.members() != self.members([LEFT_OUT if r.stage >= 2 else r for r in self.rows]):
            g = self.graph(k, least)  # (with the edges of the ranks admitted since, read as well)
        return k, g

    def carries(self, cost: Cost | None = None) -> bool:
        """Does the layout every rank chose (`choose_layout`) carry the collectives on its graph? False when no
        layout of the ladder did and the choice fell back to the last one (its graph lacks a direction)."""
        k, graph = self.choose_layout(cost)
        return self._carried(k, graph, self.rows, cost)

    def _carried(self, k: int, graph: dict, rows, cost: Cost | None = None) -> bool:
        """Do the collectives run in layout k on `graph` (by `cost`, or the table's; without either, on any
        graph with an edge)?"""
        return self._cost(cost or self.cost or (lambda j, edges, ranks: float(j)), k, graph, rows) is not None

    def _decide_or_last(self, cost: Cost | None) -> tuple[int, dict, float]:
        chosen = self._decide(None, cost)
        if chosen is None:
            return self.layouts - 1, self.graph(self.layouts - 1), MIN_QUALITY
        return chosen

    def _choose(self, rows: list[Row], cost: Cost | None) -> tuple[int, dict, float]:
        """`choose_layout` over rows that measured every layout."""
        cost = cost or (lambda k, edges, ranks: float(k))
        last = self.layouts - 1
        for strict in (True, False):
            best: tuple[float, int, dict, float] | None = None
            for k in range(self.layouts):
                least = max(self.min_ok, MIN_QUALITY) if strict and k != last else MIN_QUALITY
                g = self.graph(k, least, rows)
                c = self._cost(cost, k, g, rows)
                if c is not None and (best is None or c < best[0]):
                    best = (c, k, g, least)
            if best is not None:
                return best[1:]
        return last, self.graph(last, rows=rows), MIN_QUALITY
