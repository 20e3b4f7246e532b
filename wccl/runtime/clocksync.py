"""Optical clock sync: a node's clock against the reference node's (the parameter server's).

Every frame carries the time its sender showed it, and an echo of one frame
the sender saw (when it was shown, when the sender's camera caught it); see
protocols.frames.Timing. A node thus collects two kinds of one-way samples
against the reference, with `theta = reference - local`:

    down: a reference frame it caught    d = captured_local - shown_ref = -theta + delay(ref -> me)
    up:   an echo of one of its frames   e = captured_ref - shown_local = +theta + delay(me -> ref)

A delay is the screen's latency plus the wait for the next clean camera
capture (uniform over a camera period, more when a capture was mixed) plus
the camera's latency. Its *minimum* is the same both ways when the laptops
are alike, so theta = (min e - min d) / 2, NTP's minimum filter. With clock
drift the minima move: the estimator takes the minimum per time bin (the
lower envelope) of each kind and fits a line through them, so it tracks
offset and drift together over a sliding window.

Pure and synchronous: the Clock actor feeds it and reads `estimate`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Estimate:
    offset: float  # theta at `pivot` (seconds): reference = local + offset + skew * (local - pivot)
    skew: float  # d theta / d local (dimensionless; 1e-6 = 1 ppm)
    pivot: float  # local time the offset refers to
    err: float  # a rough error bound (seconds), from the scatter of the envelopes
    up: int  # samples used
    down: int


class OffsetEstimator:
    def __init__(self, window_s: float = 90.0, bin_s: float = 3.0, min_samples: int = 6) -> None:
        self.window_s = window_s
        self.bin_s = bin_s
        self.min_samples = min_samples
        self._up: deque[tuple[float, float]] = deque()
        self._down: deque[tuple[float, float]] = deque()
        self._seen_up: set[float] = set()
        self._seen_down: set[float] = set()

    def add_down(self, shown_ref: float, captured_local: float) -> None:
        if shown_ref in self._seen_down:
            return
        self._seen_down.add(shown_ref)
        self._down.append((captured_local, captured_local - shown_ref))

    def add_up(self, shown_local: float, captured_ref: float) -> None:
        if shown_local in self._seen_up:
            return
        self._seen_up.add(shown_local)
        self._up.append((shown_local, captured_ref - shown_local))

    def counts(self) -> tuple[int, int]:
        return len(self._up), len(self._down)

    def ready(self) -> bool:
        return min(self.counts()) >= self.min_samples

    def _trim(self, now: float) -> None:
        for q, seen in ((self._up, self._seen_up), (self._down, self._seen_down)):
            while q and q[0][0] < now - self.window_s:
                q.popleft()
            if len(seen) > 4 * len(q) + 64:
                seen.clear()  # only guards against the same frame counted twice in a row

    def _envelope(self, q: deque[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
        a = np.array(q, dtype=np.float64)
        bins = np.floor(a[:, 0] / self.bin_s)
        ts, vs = [], []
        for b in np.unique(bins):
            sel = a[bins == b]
            i = int(np.argmin(sel[:, 1]))
            ts.append(sel[i, 0])
            vs.append(sel[i, 1])
        return np.array(ts), np.array(vs)

    @staticmethod
    def _line(t: np.ndarray, v: np.ndarray, pivot: float, span_min: float) -> tuple[float, float, float]:
        """(value at pivot, slope, residual scatter) of a line through the envelope points."""
        if len(t) >= 3 and t.max() - t.min() >= span_min:
            x = t - pivot
            xm, vm = x.mean(), v.mean()
            slope = float(((x - xm) * (v - vm)).sum() / ((x - xm) ** 2).sum())
            at = float(vm - slope * xm)
            resid = v - (at + slope * x)
            return at, slope, float(np.sqrt((resid ** 2).mean()))
        return float(v.min()), 0.0, float(np.ptp(v) / 2) if len(v) > 1 else 0.0

    def estimate(self, now_local: float) -> Estimate | None:
        self._trim(now_local)
        if not self.ready():
            return None
        tu, vu = self._envelope(self._up)
        td, vd = self._envelope(self._down)
        span = 4 * self.bin_s
        eu, su, ru = self._line(tu, vu, now_local, span)
        ed, sd, rd = self._line(td, vd, now_local, span)
        if (su == 0.0) != (sd == 0.0):  # one side has no slope yet: a constant both ways keeps them alike
            eu, su, ru = self._line(tu, vu, now_local, float("inf"))
            ed, sd, rd = self._line(td, vd, now_local, float("inf"))
        return Estimate(offset=(eu - ed) / 2, skew=(su - sd) / 2, pivot=now_local, err=(ru + rd) / 2,
                        up=len(self._up), down=len(self._down))


class FlightTimes:
    """How long frames take between this node's screen and one peer's camera and back, from the same
    timestamps: each of the peer's frames read here (`add_in`: shown on its clock, captured on ours) and
    each echo of one of ours (`add_out`: shown on ours, captured on its clock). Each kind alone holds the
    clocks' offset; the sum of their medians does not: it is the typical round trip of a frame (the
    screen's latency, the wait for a clean capture, the camera's latency, both ways)."""

    def __init__(self, keep: int = 256) -> None:
        self._in: deque[float] = deque(maxlen=keep)
        self._out: deque[float] = deque(maxlen=keep)
        self._seen_out: deque[float] = deque(maxlen=keep)

    def add_in(self, shown_peer: float, captured_local: float) -> None:
        self._in.append(captured_local - shown_peer)

    def add_out(self, shown_local: float, captured_peer: float) -> None:
        if shown_local in self._seen_out:  # (every frame of the peer echoes its latest capture: once each)
            return
        self._seen_out.append(shown_local)
        self._out.append(captured_peer - shown_local)

    def round_trip(self, min_samples: int = 6) -> float | None:
        """The median frame's delay there plus the median's back (seconds), None with too few samples."""
        if min(len(self._in), len(self._out)) < min_samples:
            return None
        return float(np.median(self._in) + np.median(self._out))
