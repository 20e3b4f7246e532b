"""Telling a diverging run from a slow one, from the training loss alone.

A run diverges when its step size is too large for its model and data (an
lr too high, a codec whose error the optimizer amplifies: Adam rescales each
coordinate, so a compressed gradient's noise can move the parameters as far
as its signal). What it looks like: the training loss becomes NaN or Inf, or
it climbs well above the lowest it reached (a codec's error that grows with
each step undoes what the run learnt, back to the untrained model's loss).
`DivergenceWatch` sees each step's loss and says so once, with the reason,
so a run that stops learning is explained instead of silently wrong.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["DivergenceWatch", "HINT"]

HINT = ("lower [training] lr, or use a codec that keeps more of each tensor "
        "(bf16, int8, topk_ef with a larger topk_ratio), or local steps (docs/compression.md)")


class DivergenceWatch:
    """`observe(loss)` per step: None while the run looks sane, else (once) why it is diverging.

    Rules: a loss that is not finite; a loss over `spike` times the first step's (the untrained model's:
    the parameters jumped); or the mean of the last `window` losses above `factor` times the lowest
    such mean so far *and* above it by `rise` times the first step's loss (training losses are noisy step
    to step, not window to window: a healthy run's window means fall, then level off; a loss near zero,
    e.g. a laptop's own five classes, may double without meaning anything)."""

    def __init__(self, window: int = 5, factor: float = 1.5, spike: float = 10.0, rise: float = 0.2) -> None:
        if window < 1 or factor <= 1 or spike <= 1 or rise <= 0:
            raise ValueError("window must be >= 1, factor and spike > 1, rise > 0")
        self.window, self.factor, self.spike, self.rise = window, factor, spike, rise
        self.first: float | None = None
        self.recent: deque[float] = deque(maxlen=window)
        self.best: tuple[float, int] | None = None  # the lowest window mean, and the step it ended at
        self.steps = 0
        self.reason: str | None = None

    def observe(self, loss: float) -> str | None:
        if self.reason is not None:
            return None
        self.steps += 1
        if not math.isfinite(loss):
            self.reason = f"the training loss is {loss} at step {self.steps}"
            return self.reason
        if self.first is None:
            self.first = loss
        elif loss > self.spike * self.first:
            self.reason = f"the training loss jumped from {self.first:.3g} at step 1 to {loss:.3g} at step {self.steps}"
            return self.reason
        self.recent.append(loss)
        if len(self.recent) < self.window:
            return None
        now = sum(self.recent) / len(self.recent)
        if self.best is not None and now > self.factor * self.best[0] and now - self.best[0] > self.rise * self.first:
            self.reason = (f"the training loss rose from {self.best[0]:.3g} (mean of {self.window} steps to step "
                           f"{self.best[1]}) to {now:.3g} (mean of the {self.window} to step {self.steps})")
            return self.reason
        if self.best is None or now < self.best[0]:
            self.best = (now, self.steps)
        return None
