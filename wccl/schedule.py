"""The step schedule: absolute deadlines, never repeated sleeps.

Step k starts at `t0 + k * period`; each phase starts at a fixed offset into
the step. Pure arithmetic: the Clock actor turns it into ticks.
"""

from __future__ import annotations

from dataclasses import dataclass


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

    def step_at(self, t: float) -> int:
        """The step running at time `t` (negative before t0)."""
        return int((t - self.t0) // self.period)
