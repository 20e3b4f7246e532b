"""The step schedule: absolute deadlines, never repeated sleeps.

Step k starts at `t0 + (k - first_step) * period`; each phase starts at a
fixed offset into the step. A schedule changed while the run goes (the
server re-sizes its phases when the layouts in use change: actors/clock.py)
is a chain: the steps from `first_step` on follow this one's phases, the
steps before it the schedule it replaced (`before`), so every step's
windows and deadline stay where they were announced. Pure arithmetic: the
Clock actor turns it into ticks.
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
    t0: float  # when `first_step` starts
    phases: tuple[tuple[str, float], ...]
    first_step: int = 0
    before: Schedule | None = None  # the steps before `first_step` (None: this one's phases, extended back)

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError("a schedule needs at least one phase")
        if any(s <= 0 for _, s in self.phases):
            raise ValueError("phase durations must be positive")
        names = [n for n, _ in self.phases]
        if len(set(names)) != len(names):
            raise ValueError("phase names must be unique")
        if self.before is not None and self.before.first_step >= self.first_step:
            raise ValueError("a schedule's earlier part must start before it")

    def then(self, first_step: int, t0: float, phases: tuple[tuple[str, float], ...]) -> Schedule:
        """This schedule up to `first_step`, and from it on `phases`, `first_step` starting at `t0` (a part of
        this one from `first_step` on is replaced)."""
        before: Schedule | None = self
        while before is not None and before.first_step >= first_step:
            before = before.before
        return Schedule(t0, tuple(phases), first_step, before)

    def _part(self, step: int) -> Schedule:
        part = self
        while step < part.first_step and part.before is not None:
            part = part.before
        return part

    def start(self, step: int) -> float:
        """When `step` starts."""
        part = self._part(step)
        return part.t0 + (step - part.first_step) * part.period

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
        part = self._part(step)
        duration = dict(part.phases)[phase]
        start = self.start(step) + part.offset(phase)
        return PhaseWindow(step, phase, start, start + duration)

    def windows(self, step: int) -> list[PhaseWindow]:
        return [self.window(step, name) for name, _ in self._part(step).phases]

    def deadline(self, step: int) -> float:
        """When the server stops waiting for `step`'s gradients: the reduce tick DEADLINE_STEPS steps later
        (the start of that step, for a schedule without a reduce phase)."""
        later = step + DEADLINE_STEPS
        phases = dict(self._part(later).phases)
        return self.window(later, "reduce").start if "reduce" in phases else self.start(later)

    def step_at(self, t: float) -> int:
        """The step running at time `t` (negative before step 0)."""
        part = self
        while t < part.t0 and part.before is not None:
            part = part.before
        return part.first_step + int((t - part.t0) // part.period)
