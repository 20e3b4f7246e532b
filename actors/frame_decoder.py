"""FrameDecoder: turns camera captures back into tensors.

Consumes: `Capture` (its mailbox drops the oldest when decoding falls
behind). Emits: for a rank, `TransferArrived` for every transfer rebuilt
from frames whose checks passed and whose bytes match the transfer's digest
(or, for the built-in run's streams, protocols.streams, `TensorReceived`),
`PeerAcks` (what a peer has of this rank's transfers), `AcksChanged` (what
this rank has of theirs, and the handshake's echo), `HoldsKnown`,
`LayoutChosen` (the room's layout: when the sight is known, or for a rank
the room started without, as soon as it has the room's rows and asks to
join), `SightKnown` (discovery is done: the layout and the sight graph; again
each time a rank joins the room), and
`FrameTiming` for every trusted frame from a peer (its timestamps, for the
clock sync; the capture time is the camera's, on this node's own clock),
and `CodeSeen` for every capture with a code in it (for the CameraReader's
camera, which may set its exposure on the code). A node that only listens
(an observer, `listen=True`) shows nothing: it rebuilds every transfer its
camera sees whoever it was meant for, trusts what the room key vouches for
(it has no run nonce a peer could echo), and emits `TensorReceived` for the
built-in run's streams only.

Per capture: find every code (wccl.imaging.reader; tracked near where it
was, the whole image searched again when one is lost), reject captures that mix
two frames (parity marks), skip frames identical to one already decoded from
the same screen, then error-correct, check and reassemble (protocols.link,
protocols.receiver: the room key's MAC, the run handshake, the sealed
payload). Until discovery chooses the layout every layout of the start-up
ladder is tried, and the camera's capture period is measured for discovery
(which counts layouts held too briefly for it as unread). Once it is chosen, a
rank's camera judges each screen it reads capture by capture and asks it for
another layout of the ladder when its reads call for it (protocols.adapt:
`layout_asked`, in words; `LayoutAsks` for the ScreenWriter to show, and
`LayoutAsked` when a peer's frames ask this node's screen); a code is tried
in the layout last read at its place, then in the one asked of its sender,
then, after SEARCH_AFTER_S without a read there, in every layout; and where the
code's shape is a part of the screen's (protocols.layout.PARTS), in that part.
A screen this camera has not read for CUT_AFTER_S whose code runs out of the
image on one side is asked for its layout on the part of the screen in view
(`layout_asked` with why "part in view"), and for the whole again once that
part reads with room for the rest beside it. A capture that is
not an H x W x 3 uint8 image is a counted loss. A camera that has read no
frame `BLIND_WARN_S` after its first capture says what it saw
(`camera_reads_nothing`: no code, or codes too small to read), and keeps
that sentence in the node's results (`camera_problem`) for the error of a
rank that cannot start. Once the run goes, a screen whose frames it read and
then stopped reading for `LOST_S` is named with what to do (`screen_lost`: no
code where it was; `screen_unread`: found there but nothing reads;
`ScreenWatch`), and `screen_found_again` says when it reads again. Per
sender, layout and outcome it tallies the frames decoded and lost (`tally`,
wccl doctor's replay). Frames from another session or run, from this node itself or from an
unknown sender are ignored and counted; frames that fail are counted by
reason, never delivered; at the end the node logs its link figures
(`link_totals`) and `frames_refused` (a warning if any frame that read
cleanly was refused: a wrong key, a replay).
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from itertools import pairwise

import numpy as np

from protocols import adapt, discovery, fec, layout, streams, transfer
from protocols.link import LinkCodec
from protocols.messages import (AcksChanged, Capture, CodeSeen, FrameTiming, HoldsKnown, LayoutAsked, LayoutAsks,
                                LayoutChosen, PeerAcks, SightKnown, TensorReceived, TransferArrived)
from protocols.receiver import TransferReceiver
from protocols.security import NO_KEY, Handshake, RoomKey
from wccl.runtime.actor import Actor, ActorContext, Overflow
from protocols.registry import REGISTRY
from wccl.imaging import reader
from wccl.keys import new_run_nonce
from wccl.imaging.lens import LensFit

SAME_FRAME = 0.97  # share of identical data cells above which a read is the frame already decoded
REPORT_S = 1.0  # the link's figures are logged every this many seconds (node clock), `link_report`
COMBINE_S = 0.1  # two uncorrectable reads of a screen at most this far apart may be combined (_decode)
CAPTURES_FOR_PERIOD = 16  # the camera's capture period: over this many latest captures, by the camera's count
BLIND_WARN_S = 10.0  # a camera that read no frame this long after its first capture says what it sees (once)
# Once the layout is chosen: a place where no frame read for this long has every layout of the ladder tried
# (its screen may have changed layout for another reader's sake, or this listener's sender for its readers')
SEARCH_AFTER_S = 0.5
RECENT_S = 5.0  # ... and first the layouts read there in this long, latest first (a transfer stays in its own)
# Once the run goes: a screen this camera read whose frames have not been read for this long is named, with
# what to do (`screen_lost`: no code where it was; `screen_unread`: found there, but nothing reads).
LOST_S = 3.0
# A screen this camera has not read for this long whose code runs out of the image is asked for the part in view
# (protocols.adapt), looked for at most every CUT_EVERY_S; a part's share of the whole grid is at most the
# share in view less PART_MARGIN, and the whole is asked again once the rest of it fits with WHOLE_ROOM to spare
CUT_AFTER_S = 0.5
CUT_MIN_PX = 32  # (camera px across both ways: smaller bright outlines are not looked at)
CUT_EVERY_S = 0.25
PART_MARGIN = 0.05
WHOLE_ROOM = 1.15
# Refusals of frames that read cleanly: made without the room key, replayed, or bent (not noise).
SUSPECT = ("check_mismatch", "bad_padding", "other_run", "replayed_old", "bad_version", "bad_flags",
           "unknown_op", "unknown_dtype", "bad_length", "unknown_sender")


@dataclasses.dataclass
class CameraView:
    """What one camera has seen so far: captures, captures with a code in them, frames read, and the
    largest code found (its bounding box's width and height in camera pixels, and the image's); `cells`:
    the codes' widths in cells (border included) in the layouts it tries; the ranks whose frames of this run
    it read under the room key (`read_from`: accepted, or waiting for their sender's echo), where in the
    image it read codes (`read_at`: their centres, one per place) and the latest codes that read in no
    layout (`unread_at`: centre, width and height)."""

    captures: int = 0
    with_code: int = 0
    frames_ok: int = 0
    largest: tuple[int, int] = (0, 0)
    image: tuple[int, int] = (0, 0)
    rejected: Counter = dataclasses.field(default_factory=Counter)
    cells: tuple[int, ...] = (1,)
    read_from: set[int] = dataclasses.field(default_factory=set)
    read_at: list[np.ndarray] = dataclasses.field(default_factory=list)
    unread_at: deque = dataclasses.field(default_factory=lambda: deque(maxlen=64))

    def unread_elsewhere(self) -> list[tuple[int, int]]:
        """The sizes (w, h) of the codes it found that read in no layout, away from every place it reads a
        screen at (a screen it cannot read, not a failed read of one it reads)."""
        return [(w, h) for c, w, h in self.unread_at
                if not any(np.abs(r - c).max() < max(w, h) / 2 for r in self.read_at)]

    def read_code(self, centre: np.ndarray, size: int) -> None:
        if len(self.read_at) < 16 and not any(np.abs(c - centre).max() < size / 2 for c in self.read_at):
            self.read_at.append(centre)

    def unread_code(self, centre: np.ndarray, w: int, h: int) -> None:
        self.unread_at.append((centre, w, h))

    def _per_cell(self, w: int) -> str:
        return " to ".join(f"{w / n:.1f}" for n in sorted({max(self.cells), min(self.cells)}, reverse=True))

    def seen(self, names: list[str]) -> str:
        """What this camera saw, in a person's words: why it reads nothing, or whose screens it reads and
        what else it found (a code it cannot read, or none: the screens it does not read are out of view)."""
        problem = self.problem()
        if problem is not None:
            return problem
        read = ", ".join(names[r] for r in sorted(self.read_from))  # (a frame read is from a known rank)
        # codes that read in no layout, away from every place this camera reads a screen at
        other = self.unread_elsewhere()
        if not other:
            return (f"its camera reads the screens of {read} and found no other code: a screen it does not read "
                    "is out of its view, faces away, or is too small or slanted to find (python -m wccl.aim "
                    "shows what it sees)")
        w, h = max(other, key=lambda s: s[0] * s[1])
        return (f"its camera reads the screens of {read}; it also found, away from those, a code it could not "
                f"read, the largest {w}x{h} camera px, "
                f"{100 * w / max(1, self.image[0]):.0f} % of the image's width ({self._per_cell(w)} camera px a "
                "cell in the layouts it tries): too small, too oblique or too blurred to read; bring that laptop "
                "closer or turn its screen toward this one")

    def problem(self) -> str | None:
        """Why this camera reads nothing, in a person's words (None once it has read a frame of this run)."""
        if self.frames_ok or self.read_from:
            return None
        if not self.captures:
            return "its camera delivered no image"
        if not self.with_code:
            return (f"its camera found no code in {self.captures} captures: no screen of the room is in its "
                    "view, or none near enough to find (turn this laptop toward the others' screens, or bring "
                    "it closer; python -m wccl.aim shows what it sees)")
        w, h = self.largest
        per_cell = self._per_cell(w)
        why = ", ".join(f"{n} {k.removeprefix('captures_').replace('_', ' ')}"
                        for k, n in self.rejected.most_common(3))
        return (f"its camera found codes in {self.with_code} of {self.captures} captures but read no frame of "
                f"them (its reads: {why or 'none made it to a grid of cells'}); the largest was {w}x{h} camera px, "
                f"{100 * w / max(1, self.image[0]):.0f} % of the image's width ({per_cell} camera px a cell in "
                "the layouts it tries): too small, too oblique or too blurred to read; bring the laptops "
                "closer or face the screens")


@dataclasses.dataclass
class ScreenWatch:
    """The screens one camera reads, while the run goes: per sender, where its frames were read (centre and
    size in camera pixels), when its last frame was read, and when a code was last found at that place (any,
    and one that read as an idle screen: in view and well). A sender whose frames stopped for LOST_S is
    named once (until one is read again): `lost` when no code was found where it was (the screen left the
    view, or something covers it), `unread` when codes are found there but neither a frame nor an idle
    screen reads (the light, a dimmed screen, a turn)."""

    place: dict[int, tuple[np.ndarray, int]] = dataclasses.field(default_factory=dict)
    frame_at: dict[int, float] = dataclasses.field(default_factory=dict)
    seen_at: dict[int, float] = dataclasses.field(default_factory=dict)
    idle_at: dict[int, float] = dataclasses.field(default_factory=dict)
    named: dict[int, float] = dataclasses.field(default_factory=dict)  # sender -> when its last frame was read

    def read(self, sender: int, centre: np.ndarray, size: int, t: float) -> float | None:
        """A frame of `sender` read at `centre` at time `t`; how long it was gone if it had been named lost
        or unread (else None)."""
        self.place[sender] = (centre, size)
        self.frame_at[sender] = t
        gone = self.named.pop(sender, None)
        return None if gone is None else t - gone

    def sender_near(self, centre: np.ndarray) -> int | None:
        """The sender whose frames were last read nearest `centre`, within half its code's size (None: none)."""
        near = [(float(np.abs(c - centre).max()), s) for s, (c, size) in self.place.items()
                if np.abs(c - centre).max() < size / 2]
        return min(near)[1] if near else None

    def code_at(self, centre: np.ndarray, t: float, idle: bool) -> None:
        """A code found at `centre` at time `t` (read as an idle screen, or not)."""
        for sender, (c, size) in self.place.items():
            if np.abs(c - centre).max() < size / 2:
                self.seen_at[sender] = t
                if idle:
                    self.idle_at[sender] = t

    def check(self, now: float, image: tuple[int, int], names: list[str], me: str) -> list[tuple[int, str, str]]:
        """The senders to name now: (sender, "lost" or "unread", what happened and what to do, in words)."""
        out = []
        for sender, last in self.frame_at.items():
            if sender in self.named or now - last < LOST_S:
                continue
            peer = names[sender]
            gone = round(now - last, 1)
            if now - max(last, self.seen_at.get(sender, last)) >= LOST_S:
                (x, y), (w, h) = self.place[sender][0], (max(1, image[0]), max(1, image[1]))
                edge = ("left" if x < 0.2 * w else "right" if x > 0.8 * w else
                        "top" if y < 0.2 * h else "bottom" if y > 0.8 * h else None)
                where = f"at the {edge} edge of its view" if edge else "in its view"
                out.append((sender, "lost", f"{me}'s camera has not found {peer}'s screen for {gone} s (it was "
                            f"{where}): the screen left the camera's view or something covers one of them; turn "
                            f"{me}'s laptop and {peer}'s back toward each other (python -m wccl.aim shows what "
                            "each camera sees)"))
            elif now - max(last, self.idle_at.get(sender, last)) >= LOST_S:
                out.append((sender, "unread", f"{me}'s camera still finds {peer}'s screen but has read none of "
                            f"its frames for {gone} s: a lamp or glare on the screen or the camera, a dimmed "
                            f"screen, or a screen turned further away; python -m wccl.aim shows what it sees"))
            else:
                continue
            self.named[sender] = last
        return out


class FrameDecoder(Actor):
    consumes = (Capture,)
    mailbox = (8, Overflow.DROP_OLDEST)  # camera frames: stale ones are worthless

    def __init__(self, ctx: ActorContext, codec: LinkCodec, session: int, node_names: list[str],
                 transfers: transfer.TransferAssembler, ladder: list[LinkCodec] | None = None,
                 key: RoomKey = NO_KEY, handshake: Handshake | None = None, lens: str = "pinhole",
                 layout_cost=None, listen: bool = False, view: CameraView | None = None,
                 holds: list[float] | None = None) -> None:
        """`node_names`: the ranks in rank order (frames name their sender by rank); `transfers`: the
        assembler, given by the supervisor so that it outlives a restart of this actor; `view`: what the
        camera saw (the node's, which weighs it for start-up's budget; default: this actor's own); `holds`: how
        long each layout of the ladder holds a frame (for the log's words)."""
        super().__init__(ctx)
        # With a start-up ladder: what collectives would cost in a layout on its sight graph (seconds,
        # None: they cannot run there), for discovery's choice; without one, the densest wins.
        self.layout_cost = layout_cost or (lambda k, edges, ranks: float(k))
        self.lens_mode = lens
        self.lens: LensFit | None = None  # lens "fit": this camera's, made at its first capture
        self._vote: tuple[float, float] | None = None  # the lens trial's reads of the code in the layout tried
        self._place_vote: tuple | None = None  # the same at a place on trial (LensFit.place_vote)
        self._idle = False  # the code being read looked like an idle screen in some layout tried
        self._even = False  # the code looked even (idle) in the layout just tried
        self.ladder = ladder or [codec]
        self.holds = holds
        self.models: dict[int, reader.ColourModel] = {}  # per layout read (an ask's byte: layout and part)
        # None: the layout is not chosen yet (start-up with an auto layout): every candidate is tried.
        self.current: int | None = 0 if len(self.ladder) == 1 else None
        # candidates to try: the last that worked, then the layouts after it in ladder order (the order the
        # probe schedule shows them in, protocols.discovery.ProbeSchedule)
        self._order = list(range(len(self.ladder)))
        # ... and per place in the image (a screen's code, by its centre to 32 px): the layout last read
        # there first (each screen shows the ladder in turn, on its own schedule)
        self._read_at: dict[tuple[int, int], int] = {}
        self._read_when: dict[tuple[int, int], float] = {}  # per place: when a frame last read there
        self._recent: dict[tuple[int, int], dict[int, float]] = {}  # per place: layout -> when last read there
        self._searched: dict[tuple[int, int], float] = {}  # per place: when every layout was last tried there
        self._sender_at: dict[tuple[int, int], int] = {}  # per place: the sender last read there
        self._showing: dict[int, int] = {}  # per sender: the layouts its latest frame says its screen shows
        self._whole_at: dict[int, tuple[int, int, int, int]] = {}  # per sender: its whole grid's bbox as last read
        self._cuts_at = -1e9  # when codes running out of the image were last looked for
        self._cut_seen: dict[int, int] = {}  # per sender: the part its code's cut called for at the last look
        self._trial = self.current is None  # the layout being tried may not be the code's (see _read)
        self._defer_idle = self._trial  # an even look is only noted: other layouts are still to try
        # Once the layout is chosen, a rank's camera asks each screen it reads for a layout (protocols.adapt)
        self.adapter: adapt.LayoutAdapter | None = None
        self._use(0)  # sets codec, grid, model and the layout being read
        # Codes are looked for down to the size of the coarsest layout's (the fewest cells): a screen too far
        # off for the ladder's first layout to be found at all may still be read in its last.
        self.tracker = reader.QuadTracker(min((c.layout for c in self.ladder), key=lambda lay: min(lay.outer_cells)))
        self.session = session
        self.node_names = node_names
        self.listen = listen
        self.last: dict[int | None, np.ndarray] = {}  # per sender strip: symbols of the last decoded frame
        self.previous: list[tuple[np.ndarray, int, np.ndarray]] = []  # (quad centre, layout, cell samples) last capture
        # Per sender strip: its last read that could not be corrected, its layout and when (see _decode).
        self._failed: dict[int | None, tuple[reader.ReadCode, int, float]] = {}
        self.stats: Counter = Counter()
        # Per (sender, layout, outcome): frames whose error correction held ("decoded": before any check of
        # the room key) and those lost ("uncorrectable", "mixed": filmed while the screen changed), by the
        # sender its marks name (wccl doctor's replay prints them)
        self.tally: Counter = Counter()
        # What this camera saw; while it reads nothing, why, in words, for the error of a rank that cannot
        # start (`camera_problem` in the node's results, refreshed with every `link_report`)
        self.view = view if view is not None else CameraView()
        self.view.cells = tuple(c.layout.outer_cells[1] for c in self.ladder)
        self._warned_blind = False
        self._reported: Counter = Counter()  # the figures at the last `link_report`
        self._reported_at: float | None = None
        self._first_at = 0.0  # this actor's first capture (node clock)
        self._captures: deque[tuple[int, float]] = deque(maxlen=CAPTURES_FOR_PERIOD)  # the latest (seq, time)
        self._timings: list[FrameTiming] = []  # clock-sync fields of the frames of this capture
        self.transfers = transfers
        self.key = key
        # The receive path: a rank's, with the run handshake it keeps, or a listener's (protocols.receiver)
        rank = None if listen else node_names.index(ctx.node)
        if rank is not None and handshake is None:  # (a reader alone, e.g. a test's: a run of its own)
            handshake = Handshake(rank, len(node_names), new_run_nonce())
        self.receiver = TransferReceiver(rank, len(node_names), session, key, handshake, transfers)
        self._layout_sent = False
        self._members_sent = 0  # the room's members in the SightKnown sent last (0: none sent)
        # Per sender whose frames this camera read: where in the image (centre, size), when its last frame was
        # read, when a code was last found there, when one read there as an idle screen; and the senders
        # named lost or unread (ScreenWatch).
        self.watch = ScreenWatch()
        self._at: tuple[np.ndarray, int, float] | None = None  # the code being read: centre, size, capture time
        self._quad: reader.Quad | None = None  # ... and its outline

    async def handle(self, msg: Capture) -> None:
        self.stats["captures"] += 1
        self._captures.append((msg.seq, msg.time))
        sight = None if self.listen else self.receiver.handshake.sight
        if (sight is not None and (not sight.known or not sight.member or sight.welcoming)
                and self.receiver.tick(self.clock.now())):
            # (time passing: a rank that reads nothing still decides, and still says what it read of a rank
            # that joins)
            await self._handshake_changed(None)
        if sight is not None and not sight.known and len(self._captures) >= CAPTURES_FOR_PERIOD:
            # (discovery counts a layout held for too few of this camera's periods as unread). By the
            # camera's own count: captures this decoder had no time for are not a slower camera.
            steps = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in pairwise(self._captures) if s1 > s0]
            if steps:
                sight.camera_period_s = float(np.median(steps))
        bad = reader.image_problem(msg.image)
        if bad is not None:
            # A camera (or a recording) that hands over something that is not a colour image: a counted
            # loss, never a crash.
            self.stats[f"captures_rejected_{bad}"] += 1
            return
        previous, self.previous = self.previous, []
        if self.lens_mode == "fit":
            h, w = msg.image.shape[:2]
            if self.lens is None or (self.lens.lens.width, self.lens.lens.height) != (w, h):
                self.lens = LensFit(w, h)
        quads = self.tracker(msg.image)
        view = self.view
        view.captures += 1
        view.image = (msg.image.shape[1], msg.image.shape[0])
        if quads:  # (for a camera that sets its exposure on the code: CameraReader)
            view.with_code += 1
            _, _, w, h = quads[0].bbox
            if w * h > view.largest[0] * view.largest[1]:
                view.largest = (w, h)
            await self.emit(CodeSeen(sender=self.ctx.node, time=msg.time, bbox=quads[0].bbox, image=msg.image,
                                     seq=msg.seq))
        for quad in quads:
            self.stats["codes_seen"] += 1
            place = tuple(int(v) // 32 for v in quad.corners.mean(axis=0))
            if self.current is not None:
                order = self._order_chosen(place, quad, msg.time)
            elif place in self._read_at:
                k = self._read_at[place]
                order = list(range(k, len(self.ladder))) + list(range(k))
            else:
                order = list(self._order)
            done = self._idle = False
            self._at = (quad.corners.mean(axis=0), max(quad.bbox[2:]), msg.time)
            self._quad = quad
            even_all = True
            for i, k in enumerate(order):
                self._use(k)
                self._vote = self._place_vote = None
                # (a layout on trial may not be the code's; with others to try, an even look is only noted)
                self._trial = self.current is None or i > 0
                self._defer_idle = len(order) > 1
                self._read_sender = None
                done = await self._read(msg, quad, previous)
                even_all = even_all and self._even
                if done:
                    self._read_at[place] = k
                    self._read_when[place] = msg.time
                    self._recent.setdefault(place, {})[k] = msg.time
                    if self._read_sender is not None:
                        self._sender_at[place] = self._read_sender
                    if self.current is None and self._order[0] != k:
                        self._order = list(range(k, len(self.ladder))) + list(range(k))
                    if self._vote is not None:
                        self._lens_vote(*self._vote)
                    if self._place_vote is not None:
                        self._lens_place_vote(*self._place_vote)
                    break
            blank = done and self._even  # (read as an idle screen in the only layout tried)
            if not done and (self._idle if self.current is None else even_all):
                # even in a layout tried: an idle screen (once the layout is chosen: even in every layout tried;
                # a denser layout's frame sampled through a coarser grid can look even, the more so the less
                # contrast the camera sees, and in its own grid it does not)
                self.stats["idle_screens"] += 1
                done = blank = True
            if self.adapter is not None:
                sender = self._sender_of(place, quad.corners.mean(axis=0))
                if sender is not None:
                    # (an idle screen is in view, but says nothing of whether its layout reads)
                    self.adapter.outcome(sender, None if blank else done, msg.time)
            centre, (_, _, w, h) = quad.corners.mean(axis=0), quad.bbox
            self.watch.code_at(centre, msg.time, idle=done and self._idle)
            if done:
                view.read_code(centre, max(w, h))
            else:
                # Found again in the next capture, not taken from this one: edges found in a frame that
                # misled the search would otherwise be sampled through for as long as the screen holds still.
                self._forget_edges(quad)
                view.unread_code(centre, w, h)
        if self.adapter is not None:
            self._look_for_cuts(msg)
            await self._adapt(msg.time)
        if self._reported_at is None:
            self._reported_at = self._first_at = msg.time
        elif msg.time - self._reported_at >= REPORT_S:
            self._report(msg.time)
            view.frames_ok = max(view.frames_ok, self.stats["frames_ok"])
            view.rejected = Counter({k.removeprefix("frames_rejected_"): v for k, v in self.stats.items()
                                     if k.startswith(("frames_rejected_", "captures_mixed"))})
            problem = self.ctx.results["camera_problem"] = view.problem()
            self.ctx.results["camera_seen"] = view.seen(self.node_names)
            if sight is None or sight.known:
                for sender, kind, problem in self.watch.check(msg.time, view.image, self.node_names, self.ctx.node):
                    self.log.warning(f"screen_{kind}", direction=f"{self.node_names[sender]} -> {self.ctx.node}",
                                     problem=problem)
            if not self._warned_blind and msg.time - self._first_at >= BLIND_WARN_S:
                self._warned_blind = True
                if problem is not None:
                    self.log.warning("camera_reads_nothing", problem=problem)

    def _sender_of(self, place: tuple[int, int], centre: np.ndarray) -> int | None:
        """The sender last read at `place`; for a screen that moved, the one read nearest `centre`, within
        half its size (None: none)."""
        sender = self._sender_at.get(place)
        return sender if sender is not None else self.watch.sender_near(centre)

    def _order_chosen(self, place: tuple[int, int], quad: reader.Quad, now: float) -> list[int]:
        """The layouts (asks' bytes: layout and part) to try the code `quad` at `place` in once the room's is
        chosen: those read there in the last RECENT_S, latest first (else the room's), then the one this camera
        asked its sender for, then those its sender's latest frame says its screen shows; every other once
        nothing read there for SEARCH_AFTER_S (its sender changed layout for another reader, or as this camera
        asked), at once at a place a screen moved to; last, those layouts on the part of the screen whose shape
        the code has, if any (its sender shows them so for a reader that sees only that part)."""
        centre = quad.corners.mean(axis=0)
        recent = {k: t for k, t in self._recent.get(place, {}).items() if now - t < RECENT_S}
        self._recent[place] = recent
        order = sorted(recent, key=recent.get, reverse=True) or [self.current]
        sender = self._sender_of(place, centre)
        asked = None if self.adapter is None or sender is None else self.adapter.asked(sender)
        if asked is not None and asked not in order:
            order.append(asked)
        showing = self._showing.get(sender, 0) if sender is not None else 0
        order += [k for k in range(len(self.ladder)) if showing >> k & 1 and k not in order]
        # (a place never read at, where a screen read elsewhere has moved to, is searched at once)
        last = self._read_when.get(place, now if sender is None else -SEARCH_AFTER_S)
        if (len(self.ladder) > len(order) and now - last >= SEARCH_AFTER_S
                and now - self._searched.get(place, -SEARCH_AFTER_S) >= SEARCH_AFTER_S):
            self._searched[place] = now  # (at most once every SEARCH_AFTER_S there: a screen that reads seldom)
            order += [k for k in range(len(self.ladder)) if k not in order]
        return order + [c for c in self._shaped(quad, order, sender) if c not in order]

    def _shaped(self, quad: reader.Quad, order: list[int], sender: int | None) -> list[int]:
        """For each ladder layout in `order`: that layout on the parts of the screen whose grid's shape (width
        over height, against the whole grid's) is nearer the code's than the whole grid's is, nearest first
        (left and right, top and bottom read alike: one of each). The code's shape is taken against its
        sender's whole grid as this camera last read it, which the camera's angle to the screen has already
        squeezed (else against the whole grid's own)."""
        x, y, w, h = quad.bbox
        out = []
        for k in dict.fromkeys(adapt.split(c)[0] for c in order):
            whole = self._shape(adapt.ask(k))
            read = self._whole_at.get(sender)
            seen = np.log(w / max(1, h) / (whole if read is None else read[2] / max(1, read[3])))
            near = sorted((abs(np.log(self._shape(adapt.ask(k, p)) / whole) - seen), p) for p in (1, 3, 5, 7))
            out += [adapt.ask(k, p) for gap, p in near if gap < abs(seen)]
        return out

    def _shape(self, code: int) -> float:
        r, c = self.layout_of(code).layout.outer_cells
        return c / r

    def layout_of(self, code: int) -> LinkCodec:
        """The codec of a layout this camera reads (an ask's byte: a ladder layout, on its part of the screen;
        the whole where that part is too small)."""
        k, part = adapt.split(code)
        return self.ladder[min(k, len(self.ladder) - 1)].in_part(part)

    def _start_asking(self, st: discovery.SightTable, k: int) -> LayoutAsks | None:
        """The room's layout is k: ask every screen this camera reads for it, each no denser than the
        densest this camera read it in at start-up (protocols.adapt)."""
        if self.listen or len(self.ladder) < 2:
            return None
        me, now = st.rank, self.clock.now()
        holds = self.holds or [1.0] * len(self.ladder)
        world = len(self.node_names)
        self.adapter = adapt.LayoutAdapter(len(self.ladder), tuple(
            transfer.packet_size_for(c.message_bytes, world) / h for c, h in zip(self.ladder, holds)))
        graphs = [st.graph(j, st.min_ok) for j in range(len(self.ladder))]
        for s in range(len(self.node_names)):
            if s != me and st.reads(me, s):
                self.adapter.start(s, k, now, best=min((j for j, g in enumerate(graphs) if (me, s) in g), default=k))
        return LayoutAsks(sender=self.ctx.node, time=now, asks=self._asks())

    def _asks(self) -> tuple[int, ...]:
        return self.adapter.asks(len(self.node_names), transfer.NO_ASK)

    async def _adapt(self, now: float) -> None:
        """Ask a screen for another layout where its reads call for it (protocols.adapt), in words."""
        changes = self.adapter.decide(now)
        for ch in changes:
            was, new = self.layout_of(adapt.ask(ch.was, ch.was_part)), self.layout_of(adapt.ask(ch.layout, ch.part))
            holds = self.holds
            self.log.info("layout_asked", direction=f"{self.node_names[ch.sender]} -> {self.ctx.node}",
                          layout=new.layout.words(None if holds is None else holds[ch.layout]),
                          was=was.layout.words(None if holds is None else holds[ch.was]),
                          read=f"{ch.share:.0%}", why=ch.why)
            self.stats["layouts_asked"] += 1
        if changes:
            await self.emit(LayoutAsks(sender=self.ctx.node, time=now, asks=self._asks()))

    def _look_for_cuts(self, msg: Capture) -> None:
        """A screen this camera read and has not for CUT_AFTER_S whose code runs out of the image on one side:
        ask for its layout on the largest part of the screen that fits what is in view (PART_MARGIN to spare),
        against the side in view, once two looks in a row call for the same part (`_part_for`)."""
        now = msg.time
        if now - self._cuts_at < CUT_EVERY_S:
            return
        senders = [s for s in self._whole_at if self.adapter.unread_for(s, now) >= CUT_AFTER_S]
        if not senders:
            self._cut_seen.clear()
            return
        self._cuts_at = now
        seen: dict[int, int] = {}
        for cut in reader.cut_codes(msg.image, CUT_MIN_PX):
            for sender in senders:
                part = self._part_for(cut, self._whole_at[sender])
                if part is not None and sender not in seen:
                    seen[sender] = part
                    if self._cut_seen.get(sender) == part:
                        self.adapter.in_view(sender, part)
        self._cut_seen = seen

    @staticmethod
    def _part_for(cut: reader.Cut, whole: tuple[int, int, int, int]) -> int | None:
        """The part of the screen (protocols.layout.PARTS) to draw on for a camera that sees `cut` of a code it
        last read whole at `whole` (bbox), or None if no part fits or `cut` does not look like that code moved
        a little: as tall (across, for a cut at the top or bottom) within a quarter, centred within a quarter
        of that, its inner edge within three quarters of the code's width of where it was. The share in view:
        the cut outline's width over height against the whole code's."""
        x, y, w, h = whole
        cx, cy, cw, ch = cut.bbox
        across = cut.side in ("left", "right")
        # (along the cut: the size across it, where its middle is, where its inner edge is)
        size, got = (h, ch) if across else (w, cw)
        mid, got_mid = (y + h / 2, cy + ch / 2) if across else (x + w / 2, cx + cw / 2)
        inner, got_inner = {"right": (x, cx), "left": (x + w, cx + cw), "bottom": (y, cy), "top": (y + h, cy + ch)}[cut.side]
        if not (0.75 * size <= got <= 1.33 * size and abs(got_mid - mid) <= 0.25 * size
                and abs(got_inner - inner) <= 0.75 * (w if across else h)):
            return None
        share = cut.aspect / (w / max(1, h)) if across else (w / max(1, h)) / cut.aspect
        side = {"right": "left", "left": "right", "bottom": "top", "top": "bottom"}[cut.side]
        return next((p for p, (most, at) in enumerate(layout.PARTS) if at == side and most <= share - PART_MARGIN),
                    None)

    def _whole_fits(self, sender: int, image: tuple[int, int]) -> None:
        """A frame of `sender` read on part of its screen (this camera asked for it): once the rest of the
        whole grid would fit beside it in the image (WHOLE_ROOM to spare), ask for the whole again."""
        share, side = layout.PARTS[self.grid.part]
        x, y, w, h = self._quad.bbox
        more = (w if side in ("left", "right") else h) * (1 / share - 1) * WHOLE_ROOM
        fits = {"left": x + w + more < image[0], "right": x - more > 0, "top": y + h + more < image[1],
                "bottom": y - more > 0}[side]
        if fits:
            self.adapter.in_view(sender, 0)

    def _read_from(self, sender: int) -> None:
        """A frame of this run from `sender` read under the room key (accepted, or still waiting for its
        sender to echo this rank's nonce). The first from a rank updates what this camera saw at once (the
        rest waits for the next report), so that a rank that has heard of a peer never says its camera read
        no frame of it."""
        view = self.view
        if self._quad is not None and self.grid.part == 0:
            self._whole_at[sender] = self._quad.bbox
        elif self._quad is not None and self.adapter is not None and adapt.split(self.adapter.asked(sender) or 0)[1]:
            self._whole_fits(sender, view.image)
        if self._at is not None:
            found = self.watch.read(sender, *self._at)
            if found is not None:
                self.log.info("screen_found_again", direction=f"{self.node_names[sender]} -> {self.ctx.node}",
                              after_s=round(found, 1))
        if sender not in view.read_from:
            view.read_from.add(sender)
            self.ctx.results["camera_problem"] = None
            self.ctx.results["camera_seen"] = view.seen(self.node_names)

    def _report(self, now: float) -> None:
        """Log the link's figures since the last report (`link_report`, detail: debug on a console)."""
        d = self.stats - self._reported
        self._reported = Counter(self.stats)
        rejected = {k.removeprefix("frames_rejected_"): v for k, v in d.items() if k.startswith("frames_rejected_")}
        self.log.info("link_report", seconds=round(now - self._reported_at, 3), captures=d["captures"],
                      frames_ok=d["frames_ok"], frames_repeated=d["frames_repeated"], frames_rejected=rejected,
                      captures_mixed=d["captures_mixed"], cells_wrong=d["cells_wrong"], cells_read=d["cells_read"],
                      tensors=d["tensors"], tensor_bytes=d["tensor_bytes"])
        self._reported_at = now

    def _use(self, k: int) -> None:
        """Read in layout k (an ask's byte: a ladder layout on its part of the screen)."""
        self._layout = k
        self.codec = self.layout_of(k)
        self.grid = self.codec.layout
        if k not in self.models:
            self.models[k] = reader.ColourModel(self.grid)
        self.model = self.models[k]

    def _sample(self, image: np.ndarray, quad: reader.Quad) -> tuple[np.ndarray, float]:
        """The code's cells: through a pinhole, or (lens "fit") through this camera's fitted lens once it
        has read better than the way before it on trial, and once the fits are done, the way the code's
        place chose on its own trial (wccl.imaging.lens.LensFit)."""
        fit = self.lens
        if fit is None or (fit.used is False and fit.settled):
            return reader.sample(image, quad, self.grid)
        sides = fit.edges(image, quad.corners, self.grid)
        if sides is None or fit.used is False:
            return reader.sample(image, quad, self.grid)
        pixels = fit.pixels(sides, self.grid, image.shape)
        if pixels is None:
            return reader.sample(image, quad, self.grid)
        through = reader.sample(image, quad, self.grid, pixels)
        if fit.used:
            use = fit.place_use(quad.corners) if fit.settled else True
            if use is not None:
                return through if use else reader.sample(image, quad, self.grid)
            # Its place is on trial: read through the lens and through a pinhole, and vote for the place (a
            # way that does not read: 0).
            pinhole = reader.sample(image, quad, self.grid)
            a = reader.read_quad(image, quad, self.grid, self.model, sampled=through)
            b = reader.read_quad(image, quad, self.grid, self.model, sampled=pinhole)
            ca, cb = (0.0 if r is None else float(r.confidence.mean()) for r in (a, b))
            self._place_vote = (quad.corners, ca, cb)
            return through if ca >= cb else pinhole
        kept = None if fit.kept is None else fit.pixels(sides, self.grid, image.shape, fit.kept)
        before = reader.sample(image, quad, self.grid, kept)
        a = reader.read_quad(image, quad, self.grid, self.model, sampled=through)
        b = reader.read_quad(image, quad, self.grid, self.model, sampled=before)
        if a is None or b is None:
            return before if a is None else through
        ca, cb = float(a.confidence.mean()), float(b.confidence.mean())
        self._vote = (ca, cb)  # cast once the layout is known to explain the code (a wrong one's is noise)
        return through if ca >= cb else before

    def _lens_vote(self, with_lens: float, before: float) -> None:
        fit = self.lens
        fit.vote(with_lens, before)
        if fit.used is not None:
            self.log.info("lens_chosen", lens="fit" if fit.used else "pinhole", a=round(fit.lens.a, 4),
                          b=round(fit.lens.b, 4), fits=fit.fits)

    def _lens_place_vote(self, corners, with_lens: float, pinhole: float) -> None:
        use = self.lens.place_vote(corners, with_lens, pinhole)
        if use is not None:
            self.log.info("lens_chosen_at", place=list(self.lens.place(corners)), lens="fit" if use else "pinhole")

    def _forget_edges(self, quad: reader.Quad) -> None:
        """A code no layout read in this capture: its edges are found again in the next capture, not taken
        from an earlier one."""
        if self.lens is not None:
            self.lens.forget(quad.corners)

    async def _read(self, msg: Capture, quad: reader.Quad, previous: list) -> bool:
        """Read one code in the current layout; True if this layout explains it (idle, repeated, read).

        A layout on trial (`_trial`: the layout is not chosen yet, or this is not the first layout tried at the
        code's place) skips a read whose parity marks disagree or that is mixed, and a False sends the caller
        on to the next candidate layout; while others are still to try (`_defer_idle`) an idle look only
        marks the code (`_idle`), and the caller decides whether it is an idle screen.
        """
        sampled = self._sample(msg.image, quad)
        self._even = reader.is_idle(sampled[0], self.grid)
        if self._even:
            if self._trial or self._defer_idle:
                # Not yet: a frame of another layout of the ladder sampled through this grid can look even
                # (fine cells averaged into big ones, under blur); idle only if no layout reads it.
                self._idle = True
                return False
            self._idle = True
            self.stats["idle_screens"] += 1
            return True
        centre = quad.corners.mean(axis=0)
        # A screen holds each frame for several captures: once a frame was decoded, an unchanged
        # sampling of the same screen is not read again (a failed read is retried on the next capture).
        k = self._layout
        if any(lk == k and np.abs(c - centre).max() < 8 and reader.same_frame(v, sampled[0])
               for c, lk, v in previous):
            self.stats["frames_repeated"] += 1
            self.previous.append((centre, k, sampled[0]))
            self._idle = True  # (a screen that holds its frame is in view and reads, as an idle one: ScreenWatch)
            return True
        if self._trial and not reader.marks_agree(sampled[0], self.grid):
            # A layout on trial whose marks disagree before any colour fit: read_quad would call the read
            # mixed, and a mixed read does not choose a layout (below); the fit is skipped.
            self.stats["captures_mixed"] += 1
            return False
        code = reader.read_quad(msg.image, quad, self.grid, self.model, sampled=sampled)
        if code is None:
            self.stats["frames_rejected_unreadable"] += 1
            return False
        if code.mixed:
            self.stats["captures_mixed"] += 1
            if self._trial:
                return False  # in a wrong layout the parity marks are noise: try the others
            # A rolling shutter filmed the screen while it changed: the rows of one frame are sure, the
            # rest a blend. Such a read rarely corrects alone, but it can with the screen's next or last
            # read of the frame (_decode combines them, cell by cell); the frame check refuses a blend.
        delivered = await self._accept(code, msg.time)
        if delivered is not False:
            self.previous.append((centre, k, sampled[0]))
            self._read_sender = code.sender
        for timing in self._timings:
            await self.emit(timing)
        self._timings.clear()
        if delivered:
            await self.emit(delivered)
        return delivered is not False

    def _decode(self, code: reader.ReadCode, captured: float) -> tuple[bytes, int, reader.ReadCode]:
        """The frame's error-corrected message, the cells it corrected, and the read it came from. A read
        that cannot be corrected is kept; when the same screen's next read of a frame of the same parity
        (at most COMBINE_S later, most likely the same frame) cannot be either, the two are combined, each
        cell taken from the read more sure of it, and tried once more (`captures_combined`). Two reads of
        different frames combine into cells the frame check refuses, like any damaged frame."""
        try:
            message, corrected = self.codec.decode_message(code.symbols, code.confidence)
            return message, corrected, code
        except fec.UncorrectableFrame:
            kept = self._failed.get(code.sender)
            self._failed[code.sender] = (code, self._layout, captured)
            if kept is None:
                raise
            old, layout, when = kept
            if (layout != self._layout or old.parity != code.parity or old.symbols.shape != code.symbols.shape
                    or not 0 < captured - when <= COMBINE_S):
                raise
            take = code.confidence >= old.confidence
            both = dataclasses.replace(code, symbols=np.where(take, code.symbols, old.symbols),
                                       confidence=np.maximum(code.confidence, old.confidence))
            message, corrected = self.codec.decode_message(both.symbols, both.confidence)
            self.stats["captures_combined"] += 1
            del self._failed[code.sender]
            return message, corrected, both

    async def _accept(self, code: reader.ReadCode, captured: float) -> TransferArrived | TensorReceived | None | bool:
        """The transfer this frame completes, None if none (frame used or ignored), False if it failed."""
        last = self.last.get(code.sender)
        if (last is not None and last.shape == code.symbols.shape
                and np.count_nonzero(last == code.symbols) >= SAME_FRAME * last.size):
            self.stats["frames_repeated"] += 1
            return None
        try:
            message, corrected, code = self._decode(code, captured)
        except fec.UncorrectableFrame:
            # (a mixed capture that does not correct is already counted as mixed)
            self.stats["captures_mixed_uncorrectable" if code.mixed else "frames_rejected_uncorrectable"] += 1
            self.tally[(code.sender, self._layout, "mixed" if code.mixed else "uncorrectable")] += 1
            return False
        self.tally[(code.sender, self._layout, "decoded")] += 1
        arrived = await self._accept_transfer(message, code, corrected, captured)
        if isinstance(arrived, TransferArrived) and arrived.op in streams.STREAMS:
            return self._tensor(arrived)
        return arrived

    def _tensor(self, t: TransferArrived) -> TensorReceived | None:
        """One of the built-in run's tensors (protocols.streams), for the actors that train."""
        try:
            tensor = streams.received(t, t.payload, t.op, self.node_names[t.origin], self.ctx.node, self.clock.now())
        except streams.StreamError:
            self.stats["frames_rejected_bad_length"] += 1
            return None
        self.stats[f"tensors_{t.op}"] += 1
        return tensor

    def _timing(self, f: transfer.TransferFrame, captured: float) -> None:
        """Keep a trusted frame's clock-sync fields (`captured`: the capture's time, this node's clock),
        emitted after the capture is read."""
        tm, names = f.timing, self.node_names
        self._timings.append(FrameTiming(sender=self.ctx.node, time=self.clock.now(), origin=names[f.sender],
                                         shown=tm.shown_us / 1e6, captured=captured,
                                         echo_peer=names[tm.echo_peer] if tm.echo_peer < len(names) else None,
                                         echo_shown=tm.echo_shown_us / 1e6, echo_captured=tm.echo_captured_us / 1e6,
                                         layout=self._layout))

    async def _handshake_changed(self, peer: str | None) -> None:
        """The run handshake or the discovery table changed (a frame of `peer`, or time passing: None): log it,
        pass on the acknowledgements; once the room's layout is known show and read it (`LayoutChosen`),
        and once this rank is in the room say what the sight is (`SightKnown`; again when a rank joins)."""
        hs = self.receiver.handshake
        self.log.info("handshake", peer=peer, trusted=sorted(hs.trusted),
                      trusted_by=sorted(hs.trusted_by), complete=hs.complete)
        st = hs.sight
        if st is None or not st.known:
            await self.emit(self._acks_message(news=True))
            return
        if not self._layout_sent:
            # The room's layout, before the rows go up again: this screen shows them in it. A rank the room
            # started without learns it from the room's rows, and shows and reads only it while it joins.
            self._layout_sent = True
            k = st.room_layout()
            if st.joining:
                absent = self._absent(st)
                self.log.info("joining_room", layout=k, members=[name for r, name in enumerate(self.node_names)
                                                               if r not in absent])
            await self.emit(LayoutChosen(sender=self.ctx.node, time=self.clock.now(), layout=k))
            if self.current != k:
                self.current = k
                self._use(k)
            self._read_at.clear()  # (the layouts read there while probing)
            self._recent.clear()
            asks = self._start_asking(st, k)
            if asks is not None:
                await self.emit(asks)
        await self.emit(self._acks_message(news=True))
        if not st.member or st.members() == self._members_sent:
            return
        if self._members_sent:
            await self._sight_changed(st)
            return
        self._members_sent = st.members()
        k, graph = st.choose_layout(self.layout_cost)
        edges = tuple((r_, s_, q) for (r_, s_), q in sorted(graph.items()))
        names = self.node_names
        lay = self.ladder[k].layout
        # how many layouts of the ladder each rank measured (discovery stops where the rest could not
        # change the choice), and how many rounds of measurement it took
        measured = {names[r_]: st.layouts - st.rows[r_].unmeasured for r_ in range(len(names))
                    if st.rows[r_].stage == 0}
        rounds = 1 + max(row.round for row in st.rows)
        adopted = st.adopted > 0  # this rank started again: it took the room's table
        absent = self._absent(st)
        self.log.info("sight_known", edges={f"{names[r_]}<-{names[s_]}": round(q, 2) for r_, s_, q in edges},
                      layout=k, rows=lay.rows, cols=lay.cols, colours=lay.colours, cell_px=lay.cell_px,
                      **({"ladder": [{f"{names[r_]}<-{names[s_]}": round(q, 2) for (r_, s_), q in
                                      sorted(st.graph(j).items())} for j in range(len(self.ladder))],
                          "measured": measured, "rounds": rounds}
                         if len(self.ladder) > 1 else {}), **({"adopted": True} if adopted else {}),
                      **({"started_without": [names[r_] for r_ in absent]} if absent else {}),
                      **({"joined": True} if st.rows[st.rank].admitted else {}))
        self.ctx.results["discovery"] = dict(layout=k, measured=measured, rounds=rounds, adopted=adopted,
                                             edges={f"{names[r_]}<-{names[s_]}": round(q, 2)
                                                    for r_, s_, q in edges},
                                             captures=self.stats["captures"])
        await self.emit(SightKnown(sender=self.ctx.node, time=self.clock.now(), edges=edges, layout=k,
                                   absent=absent, joined=self._joined(st)))

    def _absent(self, st: discovery.SightTable) -> tuple[int, ...]:
        """The ranks not in the room."""
        members = st.members()
        return tuple(r for r in range(len(self.node_names)) if not members >> r & 1)

    @staticmethod
    def _joined(st: discovery.SightTable) -> tuple[int, ...]:
        """The ranks in the room that joined after it started."""
        joined = st.members() & ~st.started_with()
        return tuple(r for r in range(len(st.rows)) if joined >> r & 1)

    async def _sight_changed(self, st: discovery.SightTable) -> None:
        """A rank joined the room: the sight graph again, with its edges (the layout stays the room's)."""
        joined = st.members() & ~self._members_sent
        self._members_sent = st.members()
        k, graph = st.choose_layout(self.layout_cost)
        edges = tuple((r_, s_, q) for (r_, s_), q in sorted(graph.items()))
        names = self.node_names
        self.log.info("rank_joined", joined=[names[r] for r in range(len(names)) if joined >> r & 1],
                      edges={f"{names[r_]}<-{names[s_]}": round(q, 2) for r_, s_, q in edges})
        self.ctx.results.setdefault("discovery", {})["edges"] = {f"{names[r_]}<-{names[s_]}": round(q, 2)
                                                                 for r_, s_, q in edges}
        await self.emit(SightKnown(sender=self.ctx.node, time=self.clock.now(), edges=edges, layout=k,
                                   absent=self._absent(st), joined=self._joined(st)))

    async def _accept_transfer(self, message: bytes, code: reader.ReadCode, corrected: int,
                               captured: float) -> TransferArrived | None | bool:
        """A frame through the receive path of protocols.receiver: a rank passes on its sender's
        acknowledgements of this rank, and the transfer once rebuilt; a listener (which shows nothing: it
        acknowledges nothing and greets no one) every transfer it rebuilds, whoever it was meant for. False if
        the frame failed its check."""
        r = self.receiver.receive(message, now=self.clock.now(), layout=adapt.split(self._layout)[0],
                                  margin=self.codec.margin(corrected))
        if r.frame is None:
            self.stats[f"frames_rejected_{r.refused}"] += 1
            return False
        f = r.frame
        self._count_cells(code, corrected)
        self.last[code.sender] = code.symbols
        if r.restarted:
            # A new incarnation of the peer (it started again): its earlier transfers are forgotten.
            self.stats["peer_restarts"] += 1
            self.log.info("peer_restarted", peer=self.node_names[f.sender],
                          restarts=self.receiver.restarts.get(f.sender, 0))
        if r.handshake_changed:
            await self._handshake_changed(self.node_names[f.sender])
        if r.refused == "unconfirmed_sender":
            self._read_from(f.sender)  # (its screen reads: it has not read this rank's nonce yet)
        if r.refused:
            self.stats[f"frames_rejected_{r.refused}" if r.refused not in ("foreign_session", "unknown_sender")
                       else f"frames_{r.refused}"] += 1
            return None
        self.stats["frames_ok"] += 1
        self._read_from(f.sender)
        if f.showing:
            self._showing[f.sender] = f.showing
        if not self.listen:  # (a listener shows nothing: no clock echo, no acknowledgement)
            self._timing(f, captured)
        if r.holds_changed:
            await self.emit(HoldsKnown(sender=self.ctx.node, time=self.clock.now(), holds=self.receiver.holds))
        if r.peer_ack is not None:
            await self.emit(PeerAcks(sender=self.ctx.node, time=self.clock.now(), origin=f.sender,
                                     ack=(r.peer_ack.cum, r.peer_ack.mask)))
        if r.asked is not None:
            await self.emit(LayoutAsked(sender=self.ctx.node, time=self.clock.now(), origin=f.sender,
                                        layout=r.asked))
        if f.header is None:
            self.stats["status_frames"] += 1
            if (r.acks_changed or r.behind) and not r.handshake_changed:
                # its floor settled transfers: show the acknowledgement; it lacks this rank's row: show that
                await self.emit(self._acks_message(news=r.behind))
            return None
        if self.listen and self.current is None:
            self.current = self._layout  # the ranks chose this one: transfers go up in it (or as readers ask)
            self._read_at.clear()
            self._recent.clear()
        if r.duplicate:
            # The sender still shows a transfer this rank has: it has not seen the acknowledgement yet.
            if not self.listen:
                await self.emit(self._acks_message())
            return None
        data = r.data
        if data is None:
            return None
        h = f.header
        self.stats["tensors"] += 1
        self.stats["tensor_bytes"] += len(data)
        if not self.listen:
            await self.emit(self._acks_message())
        return TransferArrived(sender=self.ctx.node, time=self.clock.now(), origin=h.sender, tid=h.tid,
                               seq=h.seq, op=h.op, dtype=h.dtype, numel=h.numel, part=h.part, payload=data,
                               frames=self.transfers.last_packets)

    def _acks_message(self, news: bool = False) -> AcksChanged:
        acks = self.transfers.acks(len(self.node_names))
        hs = self.receiver.handshake
        return AcksChanged(sender=self.ctx.node, time=self.clock.now(), acks=tuple((a.cum, a.mask) for a in acks),
                           news=news, echo=hs.echo(), trusts=hs.trust_mask(), greeting=hs.greeting,
                           rows=discovery.pack_table(hs.sight.table()) if hs.sight is not None else b"")

    def _count_cells(self, code: reader.ReadCode, corrected: int) -> None:
        self.stats["cells_wrong"] += corrected
        self.stats["cells_doubtful"] += int((code.confidence < fec.ERASE_BELOW).sum())
        self.stats["cells_read"] += code.symbols.size

    async def finish(self) -> None:
        link = dict(self.stats)
        link.update({f"loss_{k}": v for k, v in self.transfers.losses.items()})
        link["captures_dropped"] = self.ctx.inbox.dropped
        self.ctx.results["link"] = link
        rejected = {k.removeprefix("frames_rejected_"): v for k, v in link.items() if k.startswith("frames_rejected_")}
        self.log.info("link_totals", captures=link.get("captures", 0), codes_seen=link.get("codes_seen", 0),
                      frames_ok=link.get("frames_ok", 0), frames_repeated=link.get("frames_repeated", 0),
                      frames_rejected=rejected, cells_wrong=link.get("cells_wrong", 0),
                      cells_read=link.get("cells_read", 0), tensors=link.get("tensors", 0),
                      tensor_bytes=link.get("tensor_bytes", 0), captures_dropped=link["captures_dropped"],
                      losses=dict(self.transfers.losses))
        refused = {k: v for k, v in rejected.items() if k in SUSPECT}
        refused.update({k.removeprefix("frames_"): v for k, v in link.items()
                        if k in ("frames_foreign_session", "frames_unknown_sender")})
        # Frames that read cleanly and were refused: a wrong key, a replay, another room. Worth a warning.
        (self.log.warning if any(refused.values()) else self.log.info)(
            "frames_refused", frames_ok=link.get("frames_ok", 0), **refused, losses=dict(self.transfers.losses))


REGISTRY.register("actor.frame_decoder", "standard", FrameDecoder)
