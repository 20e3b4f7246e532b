"""The step schedule: absolute deadlines, never repeated sleeps.

Step k starts at `t0 + k * period`; each phase starts at a fixed offset into
the step. Pure arithmetic: the Clock actor turns it into ticks.
"""

from __future__ import annotations

from dataclasses import dataclass

# A step's gradients are awaited until the reduce tick this many steps later (its deadline): a round slowed
# by a dip in what a camera reads costs time, and the workers catch up once it passes, not the step. The
# schedule ends at the last step's deadline.
DEADLINE_STEPS = 2


@dataclass(frozen=True, slots=True)
class PhaseWindow:
    step: int
    phase: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Schedule:
    t0: float
    phases: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError("a schedule needs at least one phase")
        if any(s <= 0 for _, s in self.phases):
            raise ValueError("phase durations must be positive")
        names = [n for n, _ in self.phases]
        if len(set(names)) != len(names):
            raise ValueError("phase names must be unique")

    @property
    def period(self) -> float:
        return sum(s for _, s in self.phases)

    def offset(self, phase: str) -> float:
        off = 0.0
        for name, seconds in self.phases:
            if name == phase:
                return off
            off += seconds
        raise KeyError(phase)

    def window(self, step: int, phase: str) -> PhaseWindow:
        duration = dict(self.phases)[phase]
        start = self.t0 + step * self.period + self.offset(phase)
        return PhaseWindow(step, phase, start, start + duration)

    def windows(self, step: int) -> list[PhaseWindow]:
        return [self.window(step, name) for name, _ in self.phases]

    def deadline(self, step: int) -> float:
        """When the server stops waiting for `step`'s gradients: the reduce tick DEADLINE_STEPS steps later
        (the start of that step, for a schedule without a reduce phase)."""
        later = step + DEADLINE_STEPS
        phases = dict(self.phases)
        return self.window(later, "reduce").start if "reduce" in phases else self.t0 + later * self.period

    def step_at(self, t: float) -> int:
        """The step running at time `t` (negative before t0)."""
        return int((t - self.t0) // self.period)
