"""Camera time in the room: when captures happen, which are lost, and how exposure drifts.

Consumes: a camera's parameters, its start time and the room seed; for auto
exposure, the mean light each screen shows and when. Emits: capture start
times (with jitter), drop and stall decisions, and the exposure gain and
white balance at any true time.

Everything is a function of (seed, node, capture index) or of time, never
of call order: the capture k of node n looks the same whoever asked first.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from wccl.room.params import ChannelParams


def capture_rng(seed_seq: list[int], node_index: int, k: int) -> np.random.Generator:
    """The generator of capture `k` of node `node_index`: draw timing first (jitter, drop), then rendering."""
    return np.random.default_rng([*seed_seq, node_index, 0xCA9, k & 0xFFFFFFFFFFFF])


class CaptureSchedule:
    """Capture k starts at `start + k * period + jitter_k`; some are dropped, stalls lose runs of them."""

    def __init__(self, params: ChannelParams, fps: float, start: float, seed_seq: list[int], node_index: int):
        self.period = 1.0 / fps
        self.start = start
        self.p = params
        self.seed_seq, self.node_index = seed_seq, node_index
        self._stall_rng = np.random.default_rng([*seed_seq, node_index, 0x57A11])
        self._stalls: list[tuple[float, float]] = []  # (begin, end), generated lazily in time order
        self._stall_horizon = start

    def nominal(self, k: int) -> float:
        return self.start + k * self.period

    def retime(self, k: int, fps: float) -> None:
        """From capture k on, `fps` captures a second (a busy laptop's camera slows down): capture k stays
        where it was due, the ones after it follow at the new period."""
        t = self.nominal(k)
        self.period = 1.0 / fps
        self.start = t - k * self.period

    def slot(self, k: int, now: float, room) -> tuple[int, int]:
        """The capture to take next for a camera asked at true time `now` that would take capture k: past
        the slots gone by while nobody asked (their count: missed), at the camera's rate as the room's
        changes have it by then (`room`: SimulatedRoom). Returns (k, missed)."""
        room.follow_changes(now)
        node = room.nodes[self.node_index]
        self.p = room.params[node]
        fps = room.camera_fps(node)
        if abs(fps * self.period - 1.0) > 1e-9:
            self.retime(k, fps)
        late = int((now - self.deliver_delay() - self.start) / self.period) - k
        return (k + late, late) if late > 0 else (k, 0)

    def draw(self, k: int) -> tuple[float, bool, np.random.Generator]:
        """(start time of capture k, whether it is delivered, its generator positioned for rendering)."""
        rng = capture_rng(self.seed_seq, self.node_index, k)
        j = float(rng.standard_normal())
        drop = float(rng.random())
        t = self.nominal(k)
        if self.p.jitter_ms > 0:
            t += max(-0.4, min(0.4, j * self.p.jitter_ms * 1e-3 / self.period)) * self.period
        lost = drop < self.p.drop_prob or self.stalled(t)
        return t, not lost, rng

    def stalled(self, t: float) -> bool:
        if self.p.stall_rate_hz <= 0:
            return False
        while self._stall_horizon <= t:
            gap = float(self._stall_rng.exponential(1.0 / self.p.stall_rate_hz))
            lo, hi = self.p.stall_ms
            dur = float(self._stall_rng.uniform(lo, hi)) * 1e-3
            begin = self._stall_horizon + gap
            self._stalls.append((begin, begin + dur))
            self._stall_horizon = begin + dur
        i = bisect.bisect_right(self._stalls, (t, math.inf)) - 1
        return i >= 0 and self._stalls[i][0] <= t < self._stalls[i][1]

    def deliver_delay(self) -> float:
        """From a capture's start to its delivery: exposure, readout, then transfer latency."""
        return (self.p.exposure_ms + self.p.readout_ms + self.p.latency_ms) * 1e-3


class Drift:
    """A slow, smooth, deterministic wander in [-1, 1]: the mean of three sines with random periods and phases."""

    def __init__(self, period_s: float, rng: np.random.Generator):
        self.freqs = 1.0 / (period_s * rng.uniform(0.5, 1.6, 3))
        self.phases = rng.uniform(0, 2 * math.pi, 3)

    def __call__(self, t: float) -> float:
        return float(np.mean(np.sin(2 * math.pi * self.freqs * t + self.phases)))


class Exposure:
    """Auto exposure and white balance of one camera, as functions of true time.

    The AE meters the frame's mean light (the room plus each screen's share
    times the mean luminance it shows), wants the gain that brings it to the
    reference scene's level (within `ae_range`), and gets there with a lag
    (first order, `ae_tau_s`); a slow drift rides on top. The state is kept
    per screen change, so any time can be evaluated in any order.
    """

    def __init__(self, params: ChannelParams, weights: dict[str, float], room: float,
                 seed_seq: list[int], node_index: int):
        self.p = params
        self.weights = weights
        self.room = room
        rng = np.random.default_rng([*seed_seq, node_index, 0xAE])
        self.drift = Drift(params.drift_period_s, rng)
        self.wb_drift = [Drift(params.drift_period_s, rng) for _ in range(3)]
        self.lum = {name: 0.0 for name in weights}  # screens start black
        self.ref = room + sum(w * params.ae_reference for w in weights.values())
        target = self._target()
        self._events: list[tuple[float, float, float]] = [(-math.inf, target, target)]  # (t, log gain at t, target)

    def _target(self) -> float:
        p = self.p
        if not p.auto_exposure:
            return math.log(p.exposure_gain)
        scene = self.room + sum(w * self.lum[n] for n, w in self.weights.items())
        ratio = min(p.ae_range, max(1 / p.ae_range, self.ref / max(scene, 1e-6)))
        return math.log(p.exposure_gain * ratio)

    def _log_gain(self, t: float) -> float:
        i = bisect.bisect_right(self._events, (t, math.inf, math.inf)) - 1
        t0, g0, target = self._events[max(i, 0)]
        if t0 == -math.inf or t <= t0:
            return g0
        return target + (g0 - target) * math.exp(-(t - t0) / self.p.ae_tau_s)

    def screen_changed(self, name: str, t: float, luminance: float) -> None:
        """Screen `name` started showing an image of mean `luminance` at true time `t`."""
        if name not in self.weights or self.lum[name] == luminance:
            return
        g = self._log_gain(t)
        self.lum[name] = luminance
        ev = (t, g, self._target())
        if self._events[-1][0] == t:
            self._events[-1] = ev
        else:
            self._events.append(ev)
        if len(self._events) > 256:  # older events only matter to captures long gone
            del self._events[1:129]

    def relit(self, t: float, params: ChannelParams, weights: dict[str, float], room: float,
              lum: dict[str, float]) -> None:
        """The camera's parameters or what it meters changed at true time `t` (a lamp, a nudge, a screen's
        brightness: `lum`, each screen's mean luminance now): from the gain it has then, it heads for the gain
        the new scene wants, with its usual lag (its reference, the level it exposes for, stays: a brighter
        room darkens the screens in its captures). A change is taken from the latest event on (a screen may
        have changed since `t`, the capture's start), so the events stay in time order."""
        t = max(t, self._events[-1][0])
        g = self._log_gain(t)
        self.p, self.weights, self.room = params, weights, room
        self.lum = {name: lum.get(name, self.lum.get(name, 0.0)) for name in weights}
        ev = (t, g, self._target())
        if self._events[-1][0] == t:
            self._events[-1] = ev
        else:
            self._events.append(ev)

    def gain(self, t: float) -> float:
        g = math.exp(self._log_gain(t))
        if self.p.ae_drift > 0:
            g *= math.exp(self.p.ae_drift * self.drift(t))
        return g

    def white_balance_bgr(self, t: float) -> np.ndarray:
        if self.p.awb_drift <= 0:
            return np.ones(3)
        rgb = [math.exp(self.p.awb_drift * d(t)) for d in self.wb_drift]
        return np.array(rgb[::-1])


__all__ = ["CaptureSchedule", "Exposure", "Drift", "capture_rng"]
