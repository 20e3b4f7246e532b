"""FrameDecoder: turns camera captures back into tensors.

Consumes: `Capture` (its mailbox drops the oldest when decoding falls
behind), `Tick` and `ScheduleDone` (to report and reset the link figures
each step). A node without a schedule (an observer, `ticks=False`) gets no
ticks: it reports a step's figures when frames of a later step arrive, and
the last step's when it finishes.
Emits: `TensorReceived` (or `TransferArrived`, `PeerAcks`, `AcksChanged`) for every tensor rebuilt from frames whose checks
passed and whose bytes match the tensor's digest, and `FrameTiming` for
every trusted frame from a peer (its timestamps, for the clock sync; the
capture time is the camera's, on this node's own clock).

Per capture: find every code (wccl.imaging.reader; tracked near where it
was, the whole image searched again when one is lost), reject captures that mix
two frames (parity marks), skip frames identical to one already decoded from
the same screen, then error-correct, check and reassemble (protocols.link,
protocols.transfer). The built-in run's frames are rebuilt into its tensors
by protocols.steps (sealed under the room key, numbered per sender and run
nonce). A rank's (wccl.distributed, with `transfers` set) go through protocols.receiver (the
room key's MAC, the run handshake, the sealed payload) and are rebuilt into
`TransferArrived`, their acknowledgements passed on: `PeerAcks` (what a peer
has of this rank's transfers) and `AcksChanged` (what this rank has of
theirs, and the handshake's echo). A capture that is not an H x W x 3 uint8
image is a counted loss. Frames from another session or run, from this node
itself or from an unknown sender are ignored and counted; frames that fail
are counted by reason, never delivered; at the end a rank logs
`frames_refused` (a warning if any frame that read cleanly was refused: a
wrong key, a replay).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import structlog

from protocols import discovery, fec, frames, steps, transfer
from protocols.steps import StepAssembler
from protocols.link import LinkCodec
from protocols.messages import (AcksChanged, Capture, FrameTiming, HoldsKnown, PeerAcks, ScheduleDone, ScheduleKnown, SightKnown,
                                TensorReceived, Tick, TransferArrived)
from protocols.receiver import TransferReceiver
from protocols.security import NO_KEY, Handshake, RoomKey
from wccl.actor import Actor, ActorContext
from wccl.imaging import reader
from wccl.imaging.lens import LensFit

SAME_FRAME = 0.97  # share of identical data cells above which a read is the frame already decoded
COMBINE_S = 0.1  # two uncorrectable reads of a screen at most this far apart may be combined (_decode)
# Refusals of frames that read cleanly: made without the room key, replayed, or bent (not noise).
SUSPECT = ("check_mismatch", "bad_padding", "other_run", "replayed_old", "bad_version", "bad_flags",
           "unknown_op", "unknown_dtype", "bad_length", "unknown_sender")


class FrameDecoder(Actor):
    consumes = (Capture, Tick, ScheduleDone, ScheduleKnown)

    def __init__(self, ctx: ActorContext, codec: LinkCodec, session: int, node_names: list[str],
                 assembler: StepAssembler | None = None, ticks: bool = True, ladder: list[LinkCodec] | None = None,
                 transfers: transfer.TransferAssembler | None = None, key: RoomKey = NO_KEY,
                 handshake: Handshake | None = None, lens: str = "pinhole", layout_cost=None) -> None:
        super().__init__(ctx)
        # Collectives with a start-up ladder: what collectives would cost in a layout on its sight graph
        # (seconds, None: they cannot run there), for discovery's choice; without one, the densest wins.
        self.layout_cost = layout_cost or (lambda k, edges: float(k))
        self.lens_mode = lens
        self.lens: LensFit | None = None  # lens "fit": this camera's, made at its first capture
        self.ladder = ladder or [codec]
        self.models = [reader.ColourModel(c.layout) for c in self.ladder]
        # None: the layout is not chosen yet (start-up with an auto layout): every candidate is tried.
        self.current: int | None = 0 if len(self.ladder) == 1 else None
        # candidates to try: the last that worked, then the layouts after it in ladder order (the order the
        # probe schedule shows them in, protocols.discovery.ProbeSchedule)
        self._order = list(range(len(self.ladder)))
        self._use(0)  # sets codec, grid, model and the layout being read
        self.tracker = reader.QuadTracker(self.ladder[0].layout)
        self.session = session
        self.node_names = node_names
        self.me = node_names.index(ctx.node)
        # The built-in run's tensors (protocols.steps); given by the supervisor, so it outlives a restart.
        self.reassembler = assembler if assembler is not None else StepAssembler(key)
        self.last: dict[int | None, np.ndarray] = {}  # per sender strip: symbols of the last decoded frame
        self.previous: list[tuple[np.ndarray, int, np.ndarray]] = []  # (quad centre, layout, cell samples) last capture
        # Per sender strip: its last read that could not be corrected, its layout and when (see _decode).
        self._failed: dict[int | None, tuple[reader.ReadCode, int, float]] = {}
        self.stats: Counter = Counter()
        self.totals: Counter = Counter()
        self.ticks = ticks
        self._frame_step = -1  # without ticks: the latest step seen in a frame
        self._timings: list[FrameTiming] = []  # clock-sync fields of the frames of this capture
        # Collectives (a rank of wccl.distributed): transfer frames are rebuilt here and acknowledged.
        self.transfers = transfers
        self.key = key
        # Collectives only: the receive path of transfer frames, with the run handshake it keeps.
        self.receiver = (TransferReceiver(self.me, len(node_names), session, key, handshake, transfers)
                         if transfers is not None else None)
        # The built-in run's handshake (None: an observer, which shows no frame to be echoed, trusts every
        # frame the room key vouches for).
        self.handshake = handshake if transfers is None else None
        self.steps_rx = steps.StepReceiver(self.me, len(node_names), session, key, self.handshake, self.reassembler)
        self._sight_sent = False

    async def handle(self, msg: Capture | Tick | ScheduleDone | ScheduleKnown) -> None:
        if isinstance(msg, ScheduleKnown):
            if msg.layout < len(self.ladder) and self.current != msg.layout:
                self.current = msg.layout
                self._use(msg.layout)
            return
        if isinstance(msg, ScheduleDone):
            self._report(msg.steps - 1)
            return
        if isinstance(msg, Tick):
            if msg.phase == "compute":
                self._report(msg.step - 1)
                self.reassembler.forget_before(msg.step - 1)
            return
        self.stats["captures"] += 1
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
        for quad in self.tracker(msg.image):
            self.stats["codes_seen"] += 1
            order = [self.current] if self.current is not None else list(self._order)
            for k in order:
                self._use(k)
                done = await self._read(msg, quad, previous)
                if done:
                    if self.current is None and self._order[0] != k:
                        self._order = list(range(k, len(self.ladder))) + list(range(k))
                    break

    def _use(self, k: int) -> None:
        self._layout = k
        self.codec = self.ladder[k]
        self.grid = self.codec.layout
        self.model = self.models[k]

    def _sample(self, image: np.ndarray, quad: reader.Quad) -> tuple[np.ndarray, float]:
        """The code's cells: through a pinhole, or (lens "fit") through this camera's fitted lens once it
        has read better than the pinhole on trial (wccl.imaging.lens.LensFit)."""
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
            return through
        pinhole = reader.sample(image, quad, self.grid)
        a = reader.read_quad(image, quad, self.grid, self.model, sampled=through)
        b = reader.read_quad(image, quad, self.grid, self.model, sampled=pinhole)
        if a is None or b is None:
            return pinhole if a is None else through
        ca, cb = float(a.confidence.mean()), float(b.confidence.mean())
        fit.vote(ca, cb)
        if fit.used is not None:
            self.log.info("lens_chosen", lens="fit" if fit.used else "pinhole", a=round(fit.lens.a, 4),
                          b=round(fit.lens.b, 4), fits=fit.fits)
        return through if ca >= cb else pinhole

    async def _read(self, msg: Capture, quad: reader.Quad, previous: list) -> bool:
        """Read one code in the current layout; True if this layout explains it (idle, repeated, read).

        While the layout is not chosen, a False sends the caller on to the next candidate layout.
        """
        sampled = self._sample(msg.image, quad)
        if reader.is_idle(sampled[0], self.grid):
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
            return True
        code = reader.read_quad(msg.image, quad, self.grid, self.model, sampled=sampled)
        if code is None:
            self.stats["frames_rejected_unreadable"] += 1
            return False
        if code.mixed:
            self.stats["captures_mixed"] += 1
            if self.current is None:
                return False  # in a wrong layout the parity marks are noise: try the others
            # A rolling shutter filmed the screen while it changed: the rows of one frame are sure, the
            # rest a blend. Such a read rarely corrects alone, but it can with the screen's next or last
            # read of the frame (_decode combines them, cell by cell); the frame check refuses a blend.
        delivered = await self._accept(code, msg.time)
        if delivered is not False:
            self.previous.append((centre, k, sampled[0]))
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

    async def _accept(self, code: reader.ReadCode, captured: float) -> TensorReceived | None | bool:
        """The tensor this frame completes, None if none (frame used or ignored), False if it failed."""
        last = self.last.get(code.sender)
        if (last is not None and last.shape == code.symbols.shape
                and np.count_nonzero(last == code.symbols) >= SAME_FRAME * last.size):
            self.stats["frames_repeated"] += 1
            return None
        try:
            message, corrected, code = self._decode(code, captured)
            if self.transfers is not None:
                return await self._accept_transfer(message, code, corrected)
        except fec.UncorrectableFrame:
            # (a mixed capture that does not correct is already counted as mixed)
            self.stats["captures_mixed_uncorrectable" if code.mixed else "frames_rejected_uncorrectable"] += 1
            return False
        f, refused = self.steps_rx.parse(message)
        if f is None:
            self.stats[f"frames_rejected_{refused}"] += 1
            return False
        h = f.header
        if (not self.ticks and f.session == self.session and h is not None and h.op in ("grad", "avg")
                and h.seq > self._frame_step):
            self._step_from_frames(h.seq)
        self._count_cells(code, corrected)
        self.last[code.sender] = code.symbols
        if refused is not None:  # another session, an unknown sender or this node itself
            self.stats[f"frames_{refused}"] += 1
            return None
        # The run handshake (protocols.steps): only frames of this run, shown recently, are used.
        r = self.steps_rx.accept(f)
        hs = self.handshake
        if r.handshake_changed:
            self.log.info("handshake", peer=self.node_names[f.sender],
                          trusted=sorted(self.node_names[k] for k in hs.trusted))
            await self.emit(AcksChanged(sender=self.ctx.node, time=self.clock.now(), acks=(), echo=hs.echo(),
                                        trusts=hs.trust_mask()))
        if r.refused:
            self.stats[f"frames_rejected_{r.refused}"] += 1
            return None
        self.stats["frames_ok"] += 1
        tm = f.timing
        peer = self.node_names[tm.echo_peer] if tm.echo_peer < len(self.node_names) else None
        self._timings.append(FrameTiming(sender=self.ctx.node, time=self.clock.now(),
                                         origin=self.node_names[f.sender], shown=tm.shown_us / 1e6,
                                         captured=captured, echo_peer=peer, echo_shown=tm.echo_shown_us / 1e6,
                                         echo_captured=tm.echo_captured_us / 1e6, layout=self._layout))
        t = r.tensor
        if t is None:
            return None
        self.stats["tensors"] += 1
        self.stats[f"tensors_{t.stream}"] += 1
        self.stats["tensor_bytes"] += len(t.payload)
        return TensorReceived(sender=self.ctx.node, step=t.step, time=self.clock.now(),
                              origin=self.node_names[t.sender], stream=t.stream, payload=t.payload,
                              frames=t.frames, epoch=t.epoch, base=t.base)

    async def _accept_transfer(self, message: bytes, code: reader.ReadCode,
                               corrected: int) -> TransferArrived | None | bool:
        """A transfer frame (collectives), through the receive path of protocols.receiver: pass on its
        sender's acknowledgements of this rank, and the transfer once rebuilt. False if it failed its check."""
        r = self.receiver.receive(message, now=self.clock.now(), layout=self._layout)
        if r.frame is None:
            self.stats[f"frames_rejected_{r.refused}"] += 1
            return False
        f = r.frame
        self._count_cells(code, corrected)
        self.last[code.sender] = code.symbols
        if r.handshake_changed:
            hs = self.receiver.handshake
            self.log.info("handshake", peer=self.node_names[f.sender], trusted=sorted(hs.trusted),
                          trusted_by=sorted(hs.trusted_by), complete=hs.complete)
            await self.emit(self._acks_message())
            if hs.sight is not None and hs.sight.known and not self._sight_sent:
                self._sight_sent = True
                st = hs.sight
                k, graph = st.choose_layout(self.layout_cost)
                edges = tuple((r_, s_, q) for (r_, s_), q in sorted(graph.items()))
                names = self.node_names
                lay = self.ladder[k].layout
                # how many layouts of the ladder each rank measured (discovery stops where the rest could not
                # change the choice), and whether it took a second round
                measured = {names[r_]: st.layouts - st.rows[r_].unmeasured for r_ in range(len(names))}
                second = any(row.full for row in st.rows)
                self.log.info("sight_known", edges={f"{names[r_]}<-{names[s_]}": round(q, 2) for r_, s_, q in edges},
                              layout=k, rows=lay.rows, cols=lay.cols, colours=lay.colours, cell_px=lay.cell_px,
                              **({"ladder": [{f"{names[r_]}<-{names[s_]}": round(q, 2) for (r_, s_), q in
                                              sorted(st.graph(j).items())} for j in range(len(self.ladder))],
                                  "measured": measured, "second_round": second}
                                 if len(self.ladder) > 1 else {}))
                if self.current != k:
                    self.current = k
                    self._use(k)
                self.ctx.results["discovery"] = dict(layout=k, measured=measured, second_round=second,
                                                     edges={f"{names[r_]}<-{names[s_]}": round(q, 2)
                                                            for r_, s_, q in edges},
                                                     captures=self.stats["captures"] + self.totals["captures"])
                await self.emit(SightKnown(sender=self.ctx.node, time=self.clock.now(), edges=edges, layout=k))
        if r.refused:
            self.stats[f"frames_rejected_{r.refused}" if r.refused not in ("foreign_session", "unknown_sender")
                       else f"frames_{r.refused}"] += 1
            return None
        self.stats["frames_ok"] += 1
        if r.holds_changed:
            await self.emit(HoldsKnown(sender=self.ctx.node, time=self.clock.now(), holds=self.receiver.holds))
        if r.peer_ack is not None:
            await self.emit(PeerAcks(sender=self.ctx.node, time=self.clock.now(), origin=f.sender,
                                     ack=(r.peer_ack.cum, r.peer_ack.mask)))
        if f.header is None:
            self.stats["status_frames"] += 1
            return None
        if r.duplicate:
            # The sender still shows a transfer this rank has: it has not seen the acknowledgement yet.
            await self.emit(self._acks_message(repeat=True))
            return None
        data = r.data
        if data is None:
            return None
        h = f.header
        self.stats["tensors"] += 1
        self.stats["tensor_bytes"] += len(data)
        await self.emit(self._acks_message())
        return TransferArrived(sender=self.ctx.node, time=self.clock.now(), origin=h.sender, tid=h.tid,
                               seq=h.seq, op=h.op, dtype=h.dtype, numel=h.numel, part=h.part, payload=data,
                               frames=self.transfers.last_packets)

    def _acks_message(self, repeat: bool = False) -> AcksChanged:
        acks = self.transfers.acks(len(self.node_names))
        hs = self.receiver.handshake
        return AcksChanged(sender=self.ctx.node, time=self.clock.now(), acks=tuple((a.cum, a.mask) for a in acks),
                           repeat=repeat, echo=hs.echo(), trusts=hs.trust_mask(), greeting=hs.greeting,
                           rows=discovery.pack_table(hs.sight.table()) if hs.sight is not None else b"")

    def _count_cells(self, code: reader.ReadCode, corrected: int) -> None:
        self.stats["cells_wrong"] += corrected
        self.stats["cells_doubtful"] += int((code.confidence < 0.15).sum())
        self.stats["cells_read"] += code.symbols.size

    def _report(self, step: int) -> None:
        """Log the link figures since the last report: of `step`, or of the start-up (step -1)."""
        if step < 0 and not self.stats:
            return
        losses = dict(self.reassembler.losses)
        self.reassembler.losses.clear()
        if step >= 0:
            structlog.contextvars.bind_contextvars(step=step)
        rejected = {k.removeprefix("frames_rejected_"): v for k, v in self.stats.items()
                    if k.startswith("frames_rejected_")}
        self.log.info("link_step" if step >= 0 else "link_startup", captures=self.stats["captures"], codes_seen=self.stats["codes_seen"],
                      idle_screens=self.stats["idle_screens"],
                      captures_mixed=self.stats["captures_mixed"], frames_ok=self.stats["frames_ok"],
                      frames_repeated=self.stats["frames_repeated"], frames_rejected=rejected,
                      cells_wrong=self.stats["cells_wrong"], cells_read=self.stats["cells_read"], tensors=self.stats["tensors"],
                      tensor_bytes=self.stats["tensor_bytes"],
                      captures_dropped=self.ctx.inbox.dropped - self.totals["captures_dropped"], losses=losses)
        self.totals.update(self.stats)
        self.totals["captures_dropped"] = self.ctx.inbox.dropped
        for k, v in losses.items():
            self.totals[f"loss_{k}"] += v
        self.stats.clear()

    def _step_from_frames(self, step: int) -> None:
        """No schedule on this node: a frame of a later step closes the figures of the last one."""
        self._report(self._frame_step)
        self.reassembler.forget_before(step - 1)
        self._frame_step = step

    async def finish(self) -> None:
        if not self.ticks:
            self._report(self._frame_step)
        self.totals.update(self.stats)
        self.stats.clear()
        self.ctx.results["link"] = dict(self.totals)
        if self.receiver is not None or self.handshake is not None:
            losses = self.transfers.losses if self.transfers is not None else self.reassembler.losses
            refused = {k.removeprefix("frames_rejected_"): v for k, v in self.totals.items()
                       if k.startswith("frames_rejected_") and k.removeprefix("frames_rejected_") in SUSPECT}
            refused.update({k.removeprefix("frames_"): v for k, v in self.totals.items()
                            if k in ("frames_foreign_session", "frames_unknown_sender")})
            # Frames that read cleanly and were refused: a wrong key, a replay, another room. Worth a warning.
            (self.log.warning if any(refused.values()) else self.log.info)(
                "frames_refused", frames_ok=self.totals["frames_ok"], **refused, losses=dict(losses))
            if self.transfers is not None:  # (the built-in run's losses are reported each step)
                self.ctx.results["link"].update({f"loss_{k}": v for k, v in losses.items()})
