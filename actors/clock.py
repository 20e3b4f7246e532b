"""Clock: optical clock sync, the start-up handshake, and the step schedule's ticks.

Consumes: `FrameTiming` (the timestamps of every frame read from a peer),
`TensorReceived` on the "sync" stream (the server's `Announce`, the other
nodes' `Hello`; protocols.sync).
Emits: `Show` (this node's sync frames during start-up, and the server's
announcement at the start of every uplink), `ScheduleKnown` once the
schedule is known, `Tick` at the absolute start of every phase of every step
this node takes part in, and `ScheduleDone` after the last step.

The parameter server's clock is the room's reference. The server announces
the schedule (step 0 at `t0` on its clock, the phases, the steps); with the
`auto` preset it sizes the phases from the tensors' frame counts, the share
of frames that got through in each direction during start-up, and the
workers' clock error. Every other node estimates its clock against the
server's from the frames' timestamps (wccl.clocksync: the server's frames it
reads, and the server's echoes of its own), sets its `SyncedClock`, and
keeps re-estimating while training (every frame carries timestamps). A
node that starts (or restarts) after step 0 joins at the next step: it asks
for a snapshot of the training state in its hello frames.

In the simulated room, each `clock_synced` log also gives the residual error
against the true server clock (the room's truth, used for that log only).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import structlog

from protocols import sync
from protocols.messages import FrameTiming, ScheduleDone, ScheduleKnown, Show, TensorReceived, Tick
from wccl.actor import Actor, ActorContext, GiveUp
from wccl.clocksync import OffsetEstimator
from wccl.schedule import Schedule

SYNC_WINDOW_S = 1.0  # start-up frames are asked for in windows this long
FIX_LEAD_S = 2.0  # an auto schedule is fixed this long before step 0, so every node reads it in time


class _Rx:
    """Which frames of one sender got through: distinct frames read against frames shown."""

    def __init__(self) -> None:
        self.shown: set[float] = set()

    def add(self, shown: float) -> None:
        self.shown.add(shown)

    def rate(self, hold_s: float) -> float | None:
        if len(self.shown) < 3:
            return None
        span = max(self.shown) - min(self.shown)
        return min(1.0, len(self.shown) / (span / hold_s + 1))


class Clock(Actor):
    consumes = (FrameTiming, TensorReceived)

    def __init__(self, ctx: ActorContext, *, role: str, node_names: list[str], server: str, steps: int,
                 preset: str, phases: list[tuple[str, float]], start_s: float, hold_s: float,
                 frames_needed: dict[str, int], margin_frames: int, work_s: float, min_guard_s: float,
                 sync_cfg: Any, resume: dict | None = None,
                 truth: Callable[[float], float] | None = None,
                 ladder: list[tuple[float, dict[str, int], int]] | None = None, min_frames_ok: float = 0.5) -> None:
        super().__init__(ctx)
        self.role = role
        self.is_server = role == "server"
        self.names = node_names
        self.server = server
        self.steps = steps
        self.preset = preset
        self.fixed_phases = tuple((n, float(s)) for n, s in phases)
        self.start_s = start_s
        self.hold_s = hold_s
        self.frames_needed = frames_needed
        self.margin_frames = margin_frames
        self.work_s = work_s
        self.min_guard_s = min_guard_s
        self.cfg = sync_cfg
        self.resume = resume
        self.truth = truth
        self.estimator = OffsetEstimator(sync_cfg.window_s, sync_cfg.bin_s, sync_cfg.min_samples)
        # The candidate layouts: (hold_s, frames each stream needs, payload bytes per frame). One: pinned.
        self.ladder = ladder or [(hold_s, frames_needed, 0)]
        self.min_frames_ok = min_frames_ok
        self.layout: int | None = 0 if len(self.ladder) == 1 else None  # None: still probing the ladder
        self._measured: dict[int, tuple[float, float]] = {}  # layout -> frames ok (up, down), from the probe
        self.cycle_s = sum(h for h, _, _ in self.ladder)  # one frame in each layout, while probing
        self.rx: dict[tuple[str, int], _Rx] = {}
        self._measuring = True
        self.hellos: dict[str, sync.Hello] = {}
        self.announce: sync.Announce | None = None
        self._announced = asyncio.Event()
        self._synced = asyncio.Event()
        self._seq = 0
        self.wants_snapshot = False
        # Kept in the node's results: a restarted Clock continues the schedule it announced.
        self.state = ctx.results.setdefault("clock", {"residuals_ms": [], "syncs": 0})

    # ------------------------------------------------------------------ inbox
    async def handle(self, msg: FrameTiming | TensorReceived) -> None:
        if isinstance(msg, FrameTiming):
            if self._measuring:  # the link is measured at start-up only (the rates size the schedule)
                self.rx.setdefault((msg.origin, msg.layout), _Rx()).add(msg.shown)
            if not self.is_server and msg.origin == self.server:
                self.estimator.add_down(msg.shown, msg.captured)
                if msg.echo_peer == self.ctx.node:
                    self.estimator.add_up(msg.echo_shown, msg.echo_captured)
                if not self._synced.is_set() and self.estimator.ready():
                    self._update_estimate()
                    self._synced.set()
            return
        if msg.stream != "sync":
            return
        try:
            payload = sync.decode(msg.payload)
        except sync.SyncError as e:
            self.log.warning("sync_payload_rejected", origin=msg.origin, error=str(e))
            return
        if isinstance(payload, sync.Announce) and msg.origin == self.server and not self.is_server:
            if payload != self.announce:
                self.announce = payload
                self.log.info("schedule_announced", t0=round(payload.t0_us / 1e6, 3), steps=payload.steps,
                              epoch=payload.epoch, final=payload.final,
                              phases={n: round(s, 3) for n, s in payload.phases})
            if payload.final:
                if self.layout is None:
                    self.layout = payload.layout
                self._announced.set()
        elif isinstance(payload, sync.Hello) and self.is_server:
            first = msg.origin not in self.hellos
            self.hellos[msg.origin] = payload
            if first or payload.wants_snapshot:
                self.log.info("hello_seen", origin=msg.origin, wants_snapshot=payload.wants_snapshot,
                              rx_per_mille=payload.rx_per_mille, sync_err_ms=payload.sync_err_us / 1000)

    # ---------------------------------------------------------------- program
    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            inbox = tg.create_task(super().run())
            try:
                await self._program()
            finally:
                inbox.cancel()

    async def _program(self) -> None:
        if self.is_server:
            schedule, join = await self._server_startup()
        else:
            schedule, join = await self._node_startup()
        await self._tick(schedule, join)

    def _schedule_of(self, a: sync.Announce) -> Schedule:
        return Schedule(t0=a.t0_us / 1e6, phases=a.phases)

    async def _known(self, a: sync.Announce, join: int) -> None:
        await self.emit(ScheduleKnown(sender=self.ctx.node, step=join, time=self.clock.now(), t0=a.t0_us / 1e6,
                                      phases=a.phases, steps=a.steps, epoch=a.epoch, applied=a.applied,
                                      join_step=join, layout=a.layout))

    async def _server_startup(self) -> tuple[Schedule, int]:
        now = self.clock.now()
        kept = self.state.get("announce")
        if kept is not None:  # this actor restarted: the schedule stands
            a = kept
        elif self.resume is not None:
            a = sync.Announce(self.resume["t0_us"], tuple(tuple(p) for p in self.resume["phases"]),
                              self.steps, self.resume["epoch"] + 1, self.resume["applied"],
                              layout=self.resume.get("layout", 0))
            self.layout = a.layout
            self.log.info("schedule_resumed", epoch=a.epoch, applied=a.applied)
        else:
            measuring = self.preset == "auto" or self.layout is None
            a = sync.Announce(round((now + self.start_s) * 1e6), self._phases(final=False), self.steps, 0, 0,
                              final=not measuring)
        schedule = self._schedule_of(a)
        t_fix = schedule.t0 - FIX_LEAD_S
        if kept is None and self.resume is None and not a.final and now < t_fix:
            await self._show_sync(a, now, t_fix)
        if self.layout is None:
            self.layout = self._choose_layout() if kept is None and self.resume is None else a.layout
        if not a.final or a.layout != self.layout:
            a = sync.Announce(a.t0_us, self._phases(final=True), a.steps, a.epoch, a.applied, layout=self.layout)
            schedule = self._schedule_of(a)
        self.announce = a
        self.state["announce"] = a
        self.state["epoch"] = a.epoch
        now = self.clock.now()
        join = 0 if now < schedule.t0 else max(0, schedule.step_at(now) + 1)
        self.log.info("schedule_fixed", t0=round(schedule.t0, 3), period_s=round(schedule.period, 3),
                      phases={n: round(s, 3) for n, s in a.phases}, steps=a.steps, join_step=join, epoch=a.epoch)
        await self._known(a, join)
        if now < schedule.t0:
            await self._show_sync(a, self.clock.now(), schedule.t0 - self._hold())
        return schedule, join

    async def _node_startup(self) -> tuple[Schedule, int]:
        start = self.clock.local.now()
        deadline = start + self.cfg.timeout_s
        # Show hello frames until this node's clock is synced and the schedule is known, then on until
        # step 0 (the server measures the link on them).
        while not (self._synced.is_set() and self._announced.is_set()):
            t = self.clock.local.now()
            if t > deadline:
                up, down = self.estimator.counts()
                self.log.error("sync_timeout", waited_s=round(t - start, 1), echoes=up, server_frames=down,
                               announced=self._announced.is_set())
                raise GiveUp(f"no clock sync with the server {self.server!r} after {self.cfg.timeout_s:g} s "
                             f"({up} echoes of this node's frames, {down} of the server's frames read): is its screen "
                             "in view of this camera, and this screen in view of its camera?")
            await self._show_sync(self._hello(), t, t + SYNC_WINDOW_S, local=True)
        self._update_estimate(log=True)
        a = self.announce
        schedule = self._schedule_of(a)
        now = self.clock.now()
        join = 0 if now < schedule.t0 - self._hold() else schedule.step_at(now) + 1
        if join > 0:
            self.wants_snapshot = True
            self.log.info("joining_late", join_step=join, epoch=a.epoch)
        await self._known(a, join)
        until = schedule.t0 if join == 0 else schedule.window(join, "compute").start
        await self._show_sync(self._hello(), now, until - self._hold())
        return schedule, join

    def _hold(self) -> float:
        """How long a frame stays up: in the chosen layout, or the longest while probing."""
        return self.ladder[self.layout][0] if self.layout is not None else max(h for h, _, _ in self.ladder)

    def _rate(self, origin: str, k: int) -> float | None:
        """The share of `origin`'s frames in layout `k` this node read."""
        rx = self.rx.get((origin, k))
        return rx.rate(self.cycle_s if self.layout is None else self.ladder[k][0]) if rx else None

    def _hello(self) -> sync.Hello:
        rate = self._rate(self.server, self.layout or 0)
        est = self.estimator.estimate(self.clock.local.now()) if self.estimator.ready() else None
        layouts = tuple(round(1000 * (self._rate(self.server, k) or 0.0)) for k in range(len(self.ladder))) \
            if self.layout is None else ()
        return sync.Hello(self.wants_snapshot, -1, self.state.get("epoch", 0),
                          round(1000 * rate) if rate is not None else 0,
                          min(0xFFFF, round(est.err * 1e6)) if est else 0, layouts)

    def _choose_layout(self) -> int:
        """The densest layout whose frames got through both ways often enough (the server, at start-up)."""
        workers = [n for n in self.names if n != self.ctx.node]
        table = []
        for k, (hold, _, payload) in enumerate(self.ladder):
            up = min((self._rate(w, k) or 0.0 for w in workers if w in self.hellos), default=0.0)
            down = min((h.rx_layouts[k] / 1000 for h in self.hellos.values() if len(h.rx_layouts) > k), default=0.0)
            ok = min(up, down)
            table.append(dict(layout=k, uplink_frames_ok=round(up, 3), downlink_frames_ok=round(down, 3),
                              goodput_kBps=round(payload * ok / hold / 1000, 2)))
            self._measured[k] = (up, down)
        good = [t for t in table if min(t["uplink_frames_ok"], t["downlink_frames_ok"]) >= self.min_frames_ok]
        if not self.hellos:
            best = len(self.ladder) - 1
            self.log.warning("layout_unmeasured", layout=best, reason="no worker was heard at start-up")
        elif good:
            best = max(good, key=lambda t: t["goodput_kBps"])["layout"]
            self.log.info("layout_chosen", layout=best, candidates=table)
        else:
            best = max(table, key=lambda t: min(t["uplink_frames_ok"], t["downlink_frames_ok"]))["layout"]
            self.log.warning("layout_weak", layout=best, candidates=table, min_frames_ok=self.min_frames_ok)
        return best

    async def _show_sync(self, payload: sync.Announce | sync.Hello, start: float, end: float,
                         local: bool = False) -> None:
        """Show `payload` on this screen from `start` to `end` (schedule time, or local time before
        the node is synced), one window at a time, and wait until it has been shown."""
        t = start
        while end - t >= self._hold():
            w_end = min(end, t + SYNC_WINDOW_S)
            if isinstance(payload, sync.Hello):
                payload = self._hello()
            self._seq += 1
            await self.emit(Show(sender=self.ctx.node, step=self._seq, time=self.clock.now(), stream="sync",
                                 payload=payload.encode(), start=t, end=w_end, epoch=self.state.get("epoch", 0),
                                 local=local, probe=self.layout is None))
            if local:
                await self.clock.local.sleep_until(w_end)
            else:
                await self.clock.sleep_until(w_end)
            t = w_end
            if local:
                return  # the caller checks whether it is synced after every window

    def _phases(self, final: bool) -> tuple[tuple[str, float], ...]:
        if self.preset != "auto":
            return self.fixed_phases
        workers = [n for n in self.names if n != self.ctx.node]
        lay = self.layout or 0
        hold, needed, _ = self.ladder[lay]
        if lay in self._measured:  # measured while probing the ladder
            up, down = [self._measured[lay][0]], [self._measured[lay][1]]
        else:
            up = [r for n in workers if (r := self._rate(n, lay)) is not None]
            down = [h.rx_per_mille / 1000 for h in self.hellos.values() if h.rx_per_mille > 0]
        errs = [h.sync_err_us / 1e6 for h in self.hellos.values()]
        p_up = max(0.25, min(up)) if up else 0.5
        p_down = max(0.25, min(down)) if down else 0.5

        def window(stream: str, p: float) -> float:
            k = needed[stream]
            frames = math.ceil((k + 1 + self.margin_frames) / p)
            return round((frames + 1) * hold, 4)  # +1: the last frame must reach the camera too

        guard = max(self.min_guard_s, 4 * max(errs, default=0.0), hold / 2)
        phases = (("compute", self.work_s), ("uplink", window("grad", p_up)), ("reduce", self.work_s),
                  ("downlink", window("avg", p_down)), ("apply", self.work_s), ("guard", round(guard, 4)))
        if final:
            self.log.info("schedule_sized", uplink_frames_ok=round(p_up, 3), downlink_frames_ok=round(p_down, 3),
                          workers_heard=sorted(self.hellos), sync_err_ms=round(1000 * max(errs, default=0.0), 2),
                          period_s=round(sum(s for _, s in phases), 3))
        return phases

    def _update_estimate(self, log: bool = False, step: int = -1) -> None:
        if self.is_server:
            return
        t = self.clock.local.now()
        est = self.estimator.estimate(t)
        if est is None:
            return
        self.clock.set_estimate(est.offset, est.skew, est.pivot)
        self.state.update(offset_s=est.offset, drift_ppm=est.skew * 1e6)
        fields: dict[str, Any] = dict(offset_s=round(est.offset, 6), drift_ppm=round(est.skew * 1e6, 1),
                                      err_ms=round(est.err * 1000, 2), echoes=est.up, server_frames=est.down)
        if self.truth is not None:
            residual = self.clock.to_reference(t) - self.truth(t)
            fields["residual_ms"] = round(residual * 1000, 3)
            if step >= 0:
                self.state["residuals_ms"].append(residual * 1000)
        self.state["syncs"] += 1
        if log:
            self.log.info("clock_synced", **fields)

    async def _tick(self, schedule: Schedule, join: int) -> None:
        self._measuring = False
        now = self.clock.now()
        first = max(join, schedule.step_at(now))
        a = self.announce
        for step in range(max(0, first), self.steps):
            for w in schedule.windows(step):
                if w.start < self.clock.now() - 1e-6:
                    continue  # already past (a restart mid-step)
                await self.clock.sleep_until(w.start)
                structlog.contextvars.bind_contextvars(step=step)
                if w.phase == "compute":
                    self._update_estimate(log=step % self.cfg.log_every == 0, step=step)
                if w.phase == "uplink" and self.is_server:
                    # The announcement rides at the start of every uplink: nodes that join late read it.
                    await self.emit(Show(sender=self.ctx.node, step=self._next_seq(), time=self.clock.now(),
                                         stream="sync", payload=a.encode(), start=w.start,
                                         end=w.start + 2 * self._hold(), epoch=a.epoch))
                await self.emit(Tick(sender=self.ctx.node, step=step, time=self.clock.now(),
                                     phase=w.phase, start=w.start, end=w.end))
        end = schedule.t0 + self.steps * schedule.period
        await self.clock.sleep_until(end)
        await self.emit(ScheduleDone(sender=self.ctx.node, step=self.steps - 1, time=self.clock.now(),
                                     steps=self.steps))
        res = self.state["residuals_ms"]
        if res:
            s = sorted(abs(r) for r in res)
            self.state["residual_p95_ms"] = s[min(len(s) - 1, int(0.95 * len(s)))]
            self.state["residual_max_ms"] = s[-1]
        self.log.info("schedule_done", steps=self.steps, **({"residual_p95_ms": round(self.state["residual_p95_ms"], 3)}
                                                             if res else {}))

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq
