"""Clock: optical clock sync, the schedule's announcement, and the step schedule's ticks.

Consumes: `FrameTiming` (the timestamps of every frame read from a peer),
`SightKnown` (discovery's layout and sight graph), `StepSkipped` (the
server's: a step to make up), `TensorReceived` on the
"sync" stream (the server's `Announce`, the other nodes' `Hello`;
protocols.sync), `LayoutAsks` and `LayoutAsked` (the layouts in use: this
camera's asks of each screen, and each reader's of this one; protocols.adapt).
Emits: `SendTensor` (an announcement or a hello), `ScheduleKnown` once the
schedule is known, `ScheduleChanged` when the server changed it while the
run goes (its phases, or its steps: the server makes up the steps its
ParameterServer skipped, `StepSkipped`, with as many more at the end),
`Tick` at the absolute start of every phase of every step this node takes
part in, `ScheduleDone` at the last step's deadline
(wccl.runtime.schedule.DEADLINE_STEPS), then `Drain` (the node ends once its peers
acknowledged what it sent).

The parameter server's clock is the room's reference. Once the room has
greeted (the run handshake and discovery, protocols.security and
protocols.discovery: `greeted`), the server fixes the schedule (step 0 at
`t0` on its clock, the phases, the steps) and sends it to every node as an
acknowledged transfer; with the `auto` preset it sizes the phases from the
tensors' frame counts in the layout discovery chose, the share of frames
each camera reads of the server's screen and the server's of theirs, and
how long a frame takes from screen to camera (the round trip it measures to
each worker from the frames' timestamps, wccl.runtime.clocksync.FlightTimes), hop
by hop along each worker's way to the server on the sight graph (where the
server and a worker do not read each other's screens, their tensors go
through laptops that do: each hop's screen queues the tensors it passes
on), and step 0 comes `start_s` after the greeting for each hop of the
longest way. While the run goes, when the layouts in use call for a period
GROW_ABOVE longer or SHRINK_BELOW shorter (a camera asked a screen for a
more robust layout, or a denser one), the server sizes the phases again in
them and announces them from CHANGE_LEAD_STEPS steps on (the next
`revision`; the steps before keep their times, wccl.runtime.schedule), and
every node ticks them from there. Every other node says hello to the server when it has greeted
(again when it joins after step 0, asking for a snapshot of the training
state), estimates its clock against the server's from the frames'
timestamps (wccl.runtime.clocksync: the server's frames it reads, and the server's
echoes of its own), sets its `SyncedClock`, and keeps re-estimating while
training (every frame carries timestamps). A node whose camera and the
server's do not read each other's screens syncs the same way against the
first laptop on its way to the server (`clock_sync_via`), which sends it its
own estimate of the server's clock (`sync.ClockMap`, again whenever that
moved by PUBLISH_S, and in answer to a hello), and composes the two. After
the last step the reduce ticks go on up to the last step's deadline (steps
`steps` .. `steps + DEADLINE_STEPS - 1`, reduce phase only), so the last
steps are awaited as long as every other. The server answers every hello
with the announcement, so a node that starts (or restarts) late learns the
schedule and joins at the next step.

In the simulated room, each `clock_synced` log also gives the residual error
against the true server clock (the room's truth, used for that log only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from protocols import adapt, sync
from protocols.algorithms import Sight, chunks
from protocols.algorithms.tree import broadcast_chunks
from protocols.messages import (Drain, FrameTiming, LayoutAsked, LayoutAsks, ScheduleChanged, ScheduleDone,
                                ScheduleKnown, SendTensor, SightKnown, StepSkipped, TensorReceived, Tick)
from protocols.link import in_ladder
from protocols.transfer import NO_ASK
from wccl.runtime.actor import Actor, ActorContext, GiveUp, Overflow
from protocols.registry import REGISTRY
from wccl.runtime.clocksync import FlightTimes, OffsetEstimator
from wccl.runtime.schedule import DEADLINE_STEPS, Schedule

ROUND_HOLDS = 1  # the least a frame's flight (screen to camera, read) is booked at, in frame holds
# The share of frames booked as read on a hop in a layout other than the room's (a reader asked for it while
# the run goes, protocols.adapt: it keeps a layout that reads at least DOWN_BELOW of the captures)
OTHER_LAYOUT_SHARE = 0.75
# The server changes the schedule when the layouts in use call for a period this much longer, or this much
# shorter, than the one it runs; from the step CHANGE_LEAD_STEPS after the one running (every node hears of it
# before it comes)
GROW_ABOVE = 1.05
SHRINK_BELOW = 0.8
CHANGE_LEAD_STEPS = 2
# The server announces the steps it makes up (for steps it skipped) once the run's last step is this many steps
# away: every node hears of them before they come, in one announcement
MAKE_UP_AHEAD_STEPS = 8
PUBLISH_S = 0.0005  # a node others sync against sends its estimate again once it moved this much


class Clock(Actor):
    consumes = (FrameTiming, SightKnown, TensorReceived, LayoutAsks, LayoutAsked, StepSkipped)
    on_schedule = True
    mailbox = (16, Overflow.BLOCK)

    def __init__(self, ctx: ActorContext, *, server: str, ranks: list[str], steps: int, phases: list | None,
                 start_s: float, work_s: float, margin_frames: int, sync_cfg: Any, greeted: asyncio.Event,
                 greet_problem: Callable[[float], str], greet_timeout_s: float, ladder: list, tensor_bytes: int,
                 resume: dict | None = None, truth: Callable[[float], float] | None = None,
                 drain_s: float = 10.0, observed: bool = False) -> None:
        """`ranks`: every node of the room but observers, in rank order; `phases`: fixed phases, or None to size them
        (`auto`) from `tensor_bytes` (a gradient's and an average's bytes on the wire) in the layout of
        `ladder` ((codec, hold_s) each) that discovery chooses; `observed`: the room has observers (the
        server's announcements of steps made up linger on its screen for them)."""
        super().__init__(ctx)
        self.is_server = ctx.node == server
        self.server = server
        self.ranks = ranks
        self.others = [n for n in ranks if n != ctx.node]  # (once the sight is known: those in the room)
        self.steps = steps  # the run's steps: the announced schedule's (more when the server makes steps up)
        self.planned = steps  # the steps the run started with
        self.observed = observed
        self.fixed_phases = tuple((n, float(s)) for n, s in phases) if phases else None
        self.start_s = start_s
        self.work_s = work_s
        self.margin_frames = margin_frames
        self.cfg = sync_cfg
        self.greeted = greeted
        self.greet_problem = greet_problem
        self.greet_timeout_s = greet_timeout_s
        self.ladder = ladder
        self.tensor_bytes = tensor_bytes
        self.resume = resume
        self.truth = truth
        self.drain_s = drain_s
        self.estimator = OffsetEstimator(sync_cfg.window_s, sync_cfg.bin_s, sync_cfg.min_samples)
        # Whose frames the estimate follows: the server's, or (this camera and the server's do not read each
        # other's screens) the next laptop's on the sight graph's way to it, composed with that laptop's own
        # estimate of the server's clock (`ref_map`). `downstream`: the nodes that sync against this one.
        self.ref = server
        self.ref_map: sync.ClockMap | None = None
        self.downstream: tuple[str, ...] = ()
        self._published: sync.ClockMap | None = None
        self._err = 0.0
        # The server's: how long its frames take to each worker's camera and theirs back (sizing, `_phases`)
        self.flights: dict[str, FlightTimes] = {n: FlightTimes() for n in self.others} if self.is_server else {}
        self.sight: SightKnown | None = None
        self.graph: Sight | None = None  # the sight graph over the ranks (reader, shown): each edge's share read
        self._sight = asyncio.Event()
        self.announce: sync.Announce | None = None
        self.schedule: Schedule | None = None  # the one ticking (changed while the run goes: ScheduleChanged)
        # The layouts in use (asks' bytes, protocols.adapt): this camera's asks of each rank's screen, and each rank's
        # asks of this screen (protocols.adapt); a direction not in them shows the room's layout
        self.asks_of: dict[int, int] = {}
        self.asked_by: dict[int, int] = {}
        self._announced = asyncio.Event()
        self._synced = asyncio.Event()
        self.wants_snapshot = False
        # Kept in the node's results: a restarted Clock continues the schedule it announced, and still owes the
        # steps the server skipped (`owed`: added at the end, `_announce_made_up`).
        self.state = ctx.results.setdefault("clock", {"residuals_ms": [], "syncs": 0, "owed": 0})

    # ------------------------------------------------------------------ inbox
    async def handle(self, msg: FrameTiming | SightKnown | TensorReceived | LayoutAsks | LayoutAsked | StepSkipped
                     ) -> None:
        if isinstance(msg, StepSkipped):
            await self._make_up(msg.step)
        elif isinstance(msg, LayoutAsks):
            asks = {r: k for r, k in enumerate(msg.asks) if k != NO_ASK}
            if asks != self.asks_of:
                self.asks_of = asks
                await self._layouts_changed()
        elif isinstance(msg, LayoutAsked):
            if self.asked_by.get(msg.origin) != msg.layout:
                self.asked_by[msg.origin] = msg.layout
                await self._layouts_changed()
        elif isinstance(msg, SightKnown):
            self.sight = msg
            n = len(self.ranks)
            self.graph = Sight(n, {(r, c): q for r, c, q in msg.edges if r < n and c < n and q > 0}, 0.0)
            self.others = [m for i, m in enumerate(self.ranks) if m != self.ctx.node and i not in msg.absent]
            self._sight.set()
            await self._sync_tree()
        elif isinstance(msg, FrameTiming):
            if (flight := self.flights.get(msg.origin)) is not None:
                flight.add_in(msg.shown, msg.captured)
                if msg.echo_peer == self.ctx.node:
                    flight.add_out(msg.echo_shown, msg.echo_captured)
            if not self.is_server and msg.origin == self.ref:
                self.estimator.add_down(msg.shown, msg.captured)
                if msg.echo_peer == self.ctx.node:
                    self.estimator.add_up(msg.echo_shown, msg.echo_captured)
                self._check_synced()
        elif msg.stream == "sync":
            await self._sync_payload(msg)

    def _check_synced(self) -> None:
        mapped = self.ref == self.server or self.ref_map is not None
        if not self._synced.is_set() and self.estimator.ready() and mapped:
            self._synced.set()

    def _way(self, src: str, dst: str) -> list[str] | None:
        """The laptops a message from `src` passes through to `dst`, ending with it (Sight.route: just `dst`
        where the two read each other's screens), or None."""
        way = self.graph.route(self.ranks.index(src), self.ranks.index(dst))
        return None if way is None else [self.ranks[r] for r in way]

    async def _sync_tree(self) -> None:
        """Whom each node syncs against (the first laptop on its way to the server): this node's `ref`, and
        the nodes that sync against it. A node whose camera and the server's do not read each other's screens
        syncs against that laptop and composes its estimate with that laptop's (a ClockMap it sends)."""
        if self.is_server or self.server not in self.ranks or self.ctx.node not in self.ranks:
            return
        refs = {n: (way[0] if (way := self._way(n, self.server)) else self.server)
                for n in self.ranks if n != self.server and (n in self.others or n == self.ctx.node)}
        self.downstream = tuple(n for n, r in refs.items() if r == self.ctx.node)
        if refs[self.ctx.node] == self.ref:
            return
        self.ref = refs[self.ctx.node]
        self.estimator = OffsetEstimator(self.cfg.window_s, self.cfg.bin_s, self.cfg.min_samples)
        self.log.info("clock_sync_via", via=self.ref, way=self._way(self.ctx.node, self.server))
        await self._send(self._hello(), (self.ref,))

    async def _sync_payload(self, msg: TensorReceived) -> None:
        try:
            payload = sync.decode(msg.payload)
        except sync.SyncError as e:
            self.log.warning("sync_payload_rejected", origin=msg.origin, error=str(e))
            return
        if isinstance(payload, sync.Announce) and msg.origin == self.server and not self.is_server:
            old = self.announce
            if old is not None and (payload.epoch, payload.revision) < (old.epoch, old.revision):
                return  # (an older word, overtaken)
            if payload != old:
                self.announce = payload
                self.log.info("schedule_announced", t0=round(payload.t0_us / 1e6, 3), steps=payload.steps,
                              epoch=payload.epoch, phases={n: round(s, 3) for n, s in payload.phases},
                              **({"first_step": payload.first_step, "revision": payload.revision}
                                 if payload.revision else {}))
                if self.schedule is not None and old is not None and payload.epoch == old.epoch:
                    await self._change(payload)  # (the schedule changed while it ticks)
            self._announced.set()
        elif isinstance(payload, sync.Hello) and self.is_server:
            self.log.info("hello_seen", origin=msg.origin, wants_snapshot=payload.wants_snapshot,
                          sync_err_ms=payload.sync_err_us / 1000)
            if self.announce is not None:  # (before the schedule is fixed, the announcement goes to all)
                await self._send(self.announce, (msg.origin,))
        elif isinstance(payload, sync.Hello) and msg.origin in self.downstream and self._published is not None:
            await self._send(self._published, (msg.origin,))  # (it started again: it needs the map)
        elif isinstance(payload, sync.ClockMap) and msg.origin == self.ref != self.server:
            self.ref_map = payload
            self._check_synced()

    # ---------------------------------------------------------------- program
    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            inbox = tg.create_task(super().run())
            try:
                await self._program()
            finally:
                inbox.cancel()

    async def _program(self) -> None:
        try:
            await asyncio.wait_for(self.greeted.wait(), self.greet_timeout_s)
        except TimeoutError:
            raise GiveUp(self.greet_problem(self.greet_timeout_s)) from None
        if self.is_server:
            self.schedule, join = await self._server_startup()
        else:
            self.schedule, join = await self._node_startup()
        await self._tick(join)

    async def _send(self, payload: sync.Announce | sync.Hello | sync.ClockMap, to: tuple[str, ...],
                    overheard: bool = False) -> None:
        await self.emit(SendTensor(sender=self.ctx.node, time=self.clock.now(), stream="sync", to=to,
                                   payload=payload.encode(), epoch=self.state.get("epoch", 0), overheard=overheard))

    @staticmethod
    def _schedule_of(a: sync.Announce) -> Schedule:
        return Schedule(t0=a.t0_us / 1e6, phases=a.phases, first_step=a.first_step)

    async def _change(self, a: sync.Announce) -> None:
        """Follow the server's changed schedule from its `first_step` on (the steps before keep theirs), to its
        last step."""
        self.schedule = self.schedule.then(a.first_step, a.t0_us / 1e6, a.phases)
        self.steps = a.steps
        await self.emit(ScheduleChanged(sender=self.ctx.node, step=a.first_step, time=self.clock.now(),
                                        first_step=a.first_step, t0=a.t0_us / 1e6, phases=a.phases, steps=a.steps))

    async def _make_up(self, skipped: int) -> None:
        """The server's: a step it skipped (its quorum's gradients did not come: a camera covered, a screen out
        of view) is owed one more step at the run's end, so the run applies the steps it was asked for (never
        more than it started with: a worker gone for good costs at most twice the run's time)."""
        if not self.is_server or self.schedule is None or self.announce is None:
            return
        if self.announce.steps + self.state["owed"] < 2 * self.planned:
            self.state["owed"] += 1
            self.log.info("step_owed", skipped=skipped, owed=self.state["owed"])
        await self._announce_made_up()

    async def _announce_made_up(self) -> None:
        """The server's: once the run's last step is MAKE_UP_AHEAD_STEPS steps away or less, the steps it owes
        are added and announced to every node (the next `revision`, its phases unchanged): one announcement for
        every step skipped so far, not one each, which would queue on its screen for a camera that reads
        nothing. Not when the first step added would come within CHANGE_LEAD_STEPS steps (the nodes would
        hear of it too late)."""
        owed = self.state["owed"]
        if not owed or self.schedule is None:
            return
        now, period, old = self.clock.now(), self.schedule.period, self.announce
        ahead = self.schedule.start(old.steps) - now
        if ahead > MAKE_UP_AHEAD_STEPS * period:
            return
        if ahead < CHANGE_LEAD_STEPS * period:
            self.log.warning("steps_not_made_up", owed=owed, steps=old.steps,
                             why="skipped too close to the run's end for every node to hear of more steps")
            self.state["owed"] = 0
            return
        a = sync.Announce(old.t0_us, old.phases, old.steps + owed, old.epoch, old.applied, old.first_step,
                          old.revision + 1)
        self.state["owed"] = 0
        self.announce = a
        self.state.update(announce=a)
        self.log.info("steps_made_up", steps=a.steps, made_up=a.steps - self.planned, was=old.steps)
        await self._change(a)
        await self._send(a, tuple(self.others), overheard=self.observed)

    async def _layouts_changed(self) -> None:
        """The server's: where the layouts in use call for another period (longer: a reader asked a screen
        for a more robust layout; shorter: for a denser one), size the phases again and announce them from
        CHANGE_LEAD_STEPS steps on."""
        if not self.is_server or self.fixed_phases is not None or self.schedule is None or self.announce is None:
            return
        now = self.clock.now()
        first = max(0, self.schedule.step_at(now)) + CHANGE_LEAD_STEPS
        if first >= self.steps:
            return
        phases = self._phases(log=False)
        period, was = sum(x for _, x in phases), self.schedule.period
        if SHRINK_BELOW * was <= period <= GROW_ABOVE * was:
            return
        old = self.announce
        a = sync.Announce(round(self.schedule.start(first) * 1e6), phases, old.steps, old.epoch, old.applied, first,
                          old.revision + 1)
        self.announce = a
        self.state.update(announce=a)
        self.log.info("schedule_changed", first_step=first, period_s=round(period, 3), was_s=round(was, 3),
                      layouts=self._layouts_words(), revision=a.revision)
        await self._change(a)
        await self._send(a, tuple(self.others))

    def _layouts_words(self) -> dict[str, str]:
        """The layouts in use that differ from the room's, by direction, in words (for the log)."""
        me, room = self.ctx.node, self.sight.layout

        def words(k: int) -> str:
            codec, hold = in_ladder(self.ladder, k)
            return codec.layout.words(hold)

        out = {f"{self.ranks[r]} -> {me}": words(k) for r, k in self.asks_of.items()
               if k != room and r < len(self.ranks)}
        out.update({f"{me} -> {self.ranks[r]}": words(k) for r, k in self.asked_by.items()
                    if k != room and r < len(self.ranks)})
        return out

    def _layout(self, shown: str, reader: str, readers: set[str]) -> int:
        """The layout (an ask's byte, protocols.adapt) `shown`'s screen shows a transfer to `reader` in, as this
        node knows: this camera's ask of a screen it reads; for this node's screen, the most robust any of its
        `readers` in the phase asked for (actors/screen_writer.py); the room's elsewhere."""
        room, me = self.sight.layout, self.ctx.node
        if reader == me:
            return self.asks_of.get(self.ranks.index(shown), room)
        if shown == me:
            return adapt.shared([self.asked_by.get(self.ranks.index(r), room) for r in sorted(
                readers, key=self.ranks.index)], room)
        return room

    async def _known(self, a: sync.Announce, join: int) -> None:
        await self.emit(ScheduleKnown(sender=self.ctx.node, step=join, time=self.clock.now(), t0=a.t0_us / 1e6,
                                      phases=a.phases, steps=a.steps, epoch=a.epoch, applied=a.applied,
                                      join_step=join, first_step=a.first_step,
                                      absent=tuple(self.ranks[r] for r in self.sight.absent)
                                      if self.sight is not None else ()))

    async def _server_startup(self) -> tuple[Schedule, int]:
        a = self.state.get("announce")
        if a is None and self.resume is not None:
            # A server resumed from its checkpoint keeps the schedule it wrote there: the workers, who kept
            # ticking it, go on in step; its epoch is the next.
            r = self.resume
            a = sync.Announce(r["t0_us"], tuple((n, float(s)) for n, s in r["phases"]), self.steps, r["epoch"] + 1,
                              r["applied"], r.get("first_step", 0))
            self.log.info("schedule_resumed", epoch=a.epoch, applied=a.applied)
        elif a is None:  # (a restarted Clock keeps the schedule it announced)
            if self.fixed_phases is None:
                await self._sight.wait()  # (sizing needs the layout and what the cameras read)
            # Step 0 comes `start_s` after the greeting for each hop of the longest way to the server: a node
            # that syncs through others waits for their estimates first.
            start = self.start_s * self._depth()
            a = sync.Announce(round((self.clock.now() + start) * 1e6), self._phases(), self.steps, 0, 0)
        self.announce = a
        self.steps = a.steps
        self.state.update(announce=a, epoch=a.epoch)
        schedule = self._schedule_of(a)
        now = self.clock.now()
        join = max(0, schedule.step_at(now) + 1)
        self.log.info("schedule_fixed", t0=round(schedule.t0, 3), period_s=round(schedule.period, 3),
                      phases={n: round(s, 3) for n, s in a.phases}, steps=a.steps, join_step=join, epoch=a.epoch)
        await self._send(a, tuple(self.others))
        await self._known(a, join)
        return schedule, join

    async def _node_startup(self) -> tuple[Schedule, int]:
        await self._send(self._hello(), (self.server,))
        start = self.clock.local.now()
        try:
            async with asyncio.timeout(self.cfg.timeout_s):
                await self._announced.wait()
                await self._synced.wait()
        except TimeoutError:
            up, down = self.estimator.counts()
            self.log.error("sync_timeout", waited_s=round(self.clock.local.now() - start, 1), echoes=up,
                           server_frames=down, announced=self._announced.is_set())
            if self.ref == self.server:
                raise GiveUp(f"no clock sync with the server {self.server!r} after {self.cfg.timeout_s:g} s "
                             f"({up} echoes of this node's frames, {down} of the server's frames read; "
                             f"schedule {'known' if self._announced.is_set() else 'not announced'}): is its "
                             "screen in view of this camera, and this screen in view of its camera?") from None
            raise GiveUp(f"no clock sync with the server {self.server!r} through {self.ref!r} (this camera and "
                         f"the server's do not read each other's screens) after {self.cfg.timeout_s:g} s ({up} "
                         f"echoes of this node's frames, {down} of {self.ref}'s frames read; {self.ref}'s "
                         f"estimate of the server's clock {'known' if self.ref_map else 'not received'}; "
                         f"schedule {'known' if self._announced.is_set() else 'not announced'})") from None
        self._update_estimate(log=True)
        await self._publish()
        a = self.announce
        self.steps = a.steps
        self.state["epoch"] = a.epoch
        schedule = self._schedule_of(a)
        now = self.clock.now()
        join = max(0, schedule.step_at(now) + 1)
        if join > 0:
            self.wants_snapshot = True
            self.log.info("joining_late", join_step=join, epoch=a.epoch)
            await self._send(self._hello(), (self.server,))
        await self._known(a, join)
        return schedule, join

    def _hello(self) -> sync.Hello:
        return sync.Hello(self.wants_snapshot, -1, self.state.get("epoch", 0),
                          min(0xFFFF, round(self._err * 1e6)) if self.clock.synced else 0)

    def _depth(self) -> int:
        """The most hops from a worker to the server on the sight graph (1 where every worker reads the
        server's screen and it theirs, or before the sight graph is known)."""
        if self.graph is None:
            return 1
        return max([1] + [len(way) for w in self.others if (way := self._way(w, self.server))])

    def _phases(self, log: bool = True) -> tuple[tuple[str, float], ...]:
        """The fixed phases, or (auto) the uplink and downlink each sized for its tensors in the layouts in use
        (at first the one discovery chose; then each direction's, as its reader asks, `_layout`): along each
        worker's way to the server (and back), per hop, the tensors that screen shows in the phase times their
        frames in the hop's layout, divided by the share of frames the next camera reads of it (measured at
        start-up in the room's layout, OTHER_LAYOUT_SHARE in another), plus `margin_frames`, in frame holds,
        plus a frame's flight (half the slowest worker's measured round trip, at least ROUND_HOLDS holds); the
        phase is the slowest way's time (Sight.route's ways, as the tensors take them). Where every worker and
        the server read each other's screens, one hop each way. A way of several hops carries its tensors in
        chunks, each passed on as it arrives (actors/collectives.py): the first chunk's time on every hop,
        then the others', each at the pace of the way's slowest hop."""
        if self.fixed_phases is not None:
            return self.fixed_phases
        room = min(self.sight.layout, len(self.ladder) - 1)
        sight, me = self.graph, self.ctx.node
        index = {n: i for i, n in enumerate(self.ranks)}
        # A frame's way from a screen to the other camera, each way: half the slowest worker's measured round
        # trip, and never less than ROUND_HOLDS holds.
        trips = [t for f in self.flights.values() if (t := f.round_trip()) is not None]
        half_trip = max(trips) / 2 if trips else 0.0
        ranks = len(self.ranks)
        ups = {w: [w] + (self._way(w, me) or [me]) for w in self.others}
        downs = {w: [me] + (self._way(me, w) or [w]) for w in self.others}

        def phase(ways: dict[str, list[str]], shows: dict[str, int]) -> tuple[float, float]:
            """The slowest way's time (hop by hop, each screen's queue of `shows` tensors), and the lowest
            share of frames read on any hop."""
            mine = {way[1] for way in ways.values() if way[0] == me}  # (this screen's readers in the phase)
            # (no way at all, where the room started without every other worker: one hop read whole, for the
            # observers the word is shown to)
            codec, hold = self.ladder[room]
            worst = 0.0 if ways else ((codec.frames_needed(self.tensor_bytes, ranks) + self.margin_frames) * hold
                                      + max(ROUND_HOLDS * hold, half_trip))
            low = 1.0
            for way in ways.values():
                k = broadcast_chunks(self.tensor_bytes, len(way) - 1, ranks)
                longest = chunks(self.tensor_bytes, k)[0][1]
                hops, flight = [], 0.0
                for a, b in zip(way, way[1:]):
                    layout = self._layout(a, b, mine)
                    codec, hold = in_ladder(self.ladder, layout)
                    q = sight.rate(index[b], index[a]) if layout == room else OTHER_LAYOUT_SHARE
                    low = min(low, q)
                    frames = codec.frames_needed(longest, ranks)
                    hops.append((shows[a] * frames / max(q, 0.25) + self.margin_frames) * hold)
                    flight = max(flight, ROUND_HOLDS * hold, half_trip)
                worst = max(worst, sum(hops) + (k - 1) * max(hops) + len(hops) * flight)
            return round(worst, 4), low

        # Uplink: each screen shows its own gradient and those it relays. Downlink: each screen on the ways to
        # workers that do not read the server's screen shows the word once for each next laptop on them
        # (actors/collectives.py), and the server once more for the workers that read it and pass it on to none.
        up_shows = {n: sum(n in way[:-1] for way in ups.values()) for n in self.ranks}
        relayed = {(a, b) for way in downs.values() if len(way) > 2 for a, b in zip(way, way[1:])}
        down_shows = {n: sum(a == n for a, _ in relayed) for n in self.ranks}
        down_shows[me] += any(len(way) == 2 and (me, w) not in relayed for w, way in downs.items())
        uplink, up = phase(ups, up_shows)
        downlink, down = phase(downs, down_shows)
        phases = (("compute", self.work_s), ("uplink", uplink), ("reduce", self.work_s),
                  ("downlink", downlink), ("apply", self.work_s))
        if log:
            self.log.info("schedule_sized", layout=self.sight.layout, uplink_frames_ok=round(up, 3),
                          downlink_frames_ok=round(down, 3), round_trip_s=round(max(trips), 3) if trips else None,
                          hops=self._depth(), period_s=round(sum(x for _, x in phases), 3))
        return phases

    def _update_estimate(self, log: bool = False, step: int = -1) -> None:
        if self.is_server:
            return
        t = self.clock.local.now()
        est = self.estimator.estimate(t)
        if est is None:
            return
        offset, skew, self._err = est.offset, est.skew, est.err
        if self.ref != self.server:  # the estimate against `ref`, then ref's against the server
            if self.ref_map is None:
                return
            offset, skew = self.ref_map.compose(offset, skew, est.pivot)
            self._err += self.ref_map.err_us / 1e6
        self.clock.set_estimate(offset, skew, est.pivot)
        self.state.update(offset_s=offset, drift_ppm=skew * 1e6)
        fields: dict[str, Any] = dict(offset_s=round(offset, 6), drift_ppm=round(skew * 1e6, 1),
                                      err_ms=round(self._err * 1000, 2), echoes=est.up, server_frames=est.down,
                                      **({"via": self.ref} if self.ref != self.server else {}))
        if self.truth is not None:
            residual = self.clock.to_reference(t) - self.truth(t)
            fields["residual_ms"] = round(residual * 1000, 3)
            if step >= 0:
                self.state["residuals_ms"].append(residual * 1000)
        self.state["syncs"] += 1
        if log:
            self.log.info("clock_synced", **fields)

    async def _publish(self) -> None:
        """Send the nodes that sync against this one its estimate of the server's clock, when it moved
        (by PUBLISH_S, now) from the one they have."""
        if not self.downstream or not self.clock.synced:
            return
        t, last = self.clock.local.now(), self._published
        if last is not None and abs(last.offset + last.skew * (t - last.pivot) - (self.clock.now() - t)) < PUBLISH_S:
            return
        self._published = sync.ClockMap(self.clock.offset, self.clock.skew, self.clock.pivot,
                                        min(0xFFFFFFFF, round(self._err * 1e6)))
        await self._send(self._published, self.downstream)

    async def _tick(self, join: int) -> None:
        step = max(0, join, self.schedule.step_at(self.clock.now()))
        # (`self.steps` grows when the server makes up a step it skipped, and the schedule changes while a
        # step waits: both are read again for every phase)
        while step < self.steps or ("reduce" in dict(self.schedule.phases) and step < self.steps + DEADLINE_STEPS):
            # The last steps' deadlines lie past the last step: their reduce ticks still come, so each of those
            # steps is awaited until its own deadline, as every other step is.
            phases = [w.phase for w in self.schedule.windows(step)] if step < self.steps else ["reduce"]
            for phase in phases:
                w = self.schedule.window(step, phase)
                if w.start < self.clock.now() - 1e-6:
                    continue  # already past (a restart mid-step)
                await self.clock.sleep_until(w.start)
                if w.phase == "compute":
                    self._update_estimate(log=step % self.cfg.log_every == 0, step=step)
                    await self._publish()
                    await self._announce_made_up()
                await self.emit(Tick(sender=self.ctx.node, step=step, time=self.clock.now(),
                                     phase=w.phase, start=w.start, end=w.end))
            step += 1
        schedule = self.schedule
        await self.clock.sleep_until(max(schedule.start(self.steps), schedule.deadline(self.steps - 1)))
        await self.emit(ScheduleDone(sender=self.ctx.node, step=self.steps - 1, time=self.clock.now(),
                                     steps=self.steps))
        # The node ends once its peers have what it sent (the last word, the last gradient).
        await self.emit(Drain(sender=self.ctx.node, time=self.clock.now(), timeout_s=self.drain_s))
        res = self.state["residuals_ms"]
        if res:
            s = sorted(abs(r) for r in res)
            self.state["residual_p95_ms"] = s[min(len(s) - 1, int(0.95 * len(s)))]
            self.state["residual_max_ms"] = s[-1]
        self.log.info("schedule_done", steps=self.steps,
                      **({"residual_p95_ms": round(self.state["residual_p95_ms"], 3)} if res else {}))


REGISTRY.register("actor.clock", "standard", Clock)
