"""Collective algorithms: how one collective's bytes move between the ranks' screens and cameras.

A `Plan` is one rank's part in one collective, a pure state machine over
bytes: `start()` and `received(origin, part, payload)` return the transfers
this rank shows next (`Send`: a part number, the ranks that must read it, the
bytes); `done` and `result()` once it has what it needs. The Collectives
actor (actors/collectives.py) drives it: it posts the sends, feeds it the
transfers that arrive, and hands the result to the program.

Which camera reads which screen is a `Sight` graph (with each edge's goodput
and a round's fixed latency). Each algorithm says whether it can run on a
graph (`feasible`) and what a collective of a size would cost there
(`estimate`: rounds x latency + bytes / goodput per edge, the slowest rank's);
`choose` picks the cheapest feasible one, or the configured one.

Every algorithm ends every rank with the same bytes: a reduction is folded in
one fixed order (all_see_all and tree: rank order, on every rank; ring: each
chunk once around the ring, by the rank that finishes it, then copied; star:
by the hub, then copied).

Add an algorithm: write `protocols/algorithms/NAME.py` defining a `Plan`
subclass with `name = "NAME"`, registered with `@REGISTRY.part("algorithm")`
(protocols.registry), and list the module among the algorithm sources there.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from protocols.registry import REGISTRY

__all__ = ["Plan", "Send", "Sight", "choose", "estimates", "AlgorithmError"]

OPS = ("allreduce", "allgather", "broadcast", "reduce_scatter", "barrier")


class AlgorithmError(ValueError):
    """An algorithm that cannot run here (unknown, or the cameras do not see what it needs)."""


@dataclass(frozen=True)
class Send:
    """One transfer to show: its part number in the collective, the ranks that must read it, its bytes, and
    how many hops its bytes still go beyond those readers (`priority`: of the transfers waiting for the
    screen, the one with the most still to go goes up first; the oldest first among equals)."""

    part: int
    dest: int
    payload: bytes
    priority: int = 0


@dataclass(frozen=True)
class Sight:
    """Which screens each rank's camera reads: `goodput[(reader, shown)]` in bytes per second (an edge
    that is missing is not read), and `latency_s`, a round's fixed cost (a frame shown, filmed, decoded,
    acknowledged)."""

    world: int
    goodput: dict[tuple[int, int], float] = field(default_factory=dict)
    latency_s: float = 0.3

    @classmethod
    def complete(cls, world: int, goodput: float, latency_s: float) -> Sight:
        """Every camera reads every other screen at `goodput`."""
        return cls(world, {(r, s): goodput for r in range(world) for s in range(world) if r != s}, latency_s)

    def reads(self, reader: int, shown: int) -> bool:
        return self.goodput.get((reader, shown), 0.0) > 0

    def rate(self, reader: int, shown: int) -> float:
        return self.goodput.get((reader, shown), 0.0)

    def readers_of(self, shown: int) -> list[int]:
        return [r for r in range(self.world) if r != shown and self.reads(r, shown)]

    def both_ways(self, a: int, b: int) -> bool:
        """Each of `a` and `b` reads the other's screen: what one shows the other, it sees acknowledged."""
        return self.reads(a, b) and self.reads(b, a)

    def route(self, src: int, dst: int) -> list[int] | None:
        """The ranks a point-to-point message from `src` passes through to reach `dst`, ending with `dst`.
        Each hop joins two ranks that read each other's screens (a transfer is shown until its reader's
        acknowledgement is read back); the fewest hops, and of those the one whose slowest edge is fastest
        (ties: the lower ranks). None if no such chain leads there."""
        best: dict[int, tuple[int, float, list[int]]] = {src: (0, float("inf"), [])}
        frontier = [src]
        while frontier and dst not in best:
            nxt: list[int] = []
            for last in frontier:
                hops, slowest, path = best[last]
                for r in self.readers_of(last):
                    if not self.reads(last, r):
                        continue
                    cand = (hops + 1, min(slowest, self.rate(r, last)), path + [r])
                    old = best.get(r)
                    if old is None or (old[0] == cand[0] and (cand[1], [-x for x in cand[2]])
                                       > (old[1], [-x for x in old[2]])):
                        if old is None:
                            nxt.append(r)
                        best[r] = cand
            frontier = sorted(set(nxt))
        return best[dst][2] if dst in best and dst != src else None

    def ring(self) -> list[int] | None:
        """A cycle through every rank along which each rank's screen is read by the next (data flows
        forward): the best of the cycles found (the one whose slowest edge is fastest), or None."""
        return None if self._ring is None else list(self._ring)

    @functools.cached_property
    def _ring(self) -> tuple[int, ...] | None:  # searched once per graph (a frozen dataclass: cached here)
        n = self.world
        if n < 2:
            return tuple(range(n))
        best: tuple[float, list[int]] | None = None
        # Depth-first search for Hamiltonian cycles from rank 0 (n <= 8: small), widest edges first.
        limit = [20000]

        def dfs(path: list[int], seen: int, slowest: float) -> None:
            nonlocal best
            if limit[0] <= 0:
                return
            limit[0] -= 1
            if best is not None and slowest <= best[0]:
                return
            last = path[-1]
            if len(path) == n:
                if self.reads(path[0], last):
                    s = min(slowest, self.rate(path[0], last))
                    if best is None or s > best[0]:
                        best = (s, list(path))
                return
            nxt = sorted((r for r in range(n) if not seen >> r & 1 and self.reads(r, last)),
                         key=lambda r: -self.rate(r, last))
            for r in nxt:
                path.append(r)
                dfs(path, seen | 1 << r, min(slowest, self.rate(r, last)))
                path.pop()

        dfs([0], 1, float("inf"))
        return tuple(best[1]) if best else None


ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int16": 2,
            "int8": 1, "uint8": 1, "bool": 1}


def chunks(numel: int, n: int) -> list[tuple[int, int]]:
    """`numel` elements cut into `n` runs as equal as possible (the first ones one longer): (start, count)."""
    base, extra = divmod(numel, n)
    out, start = [], 0
    for i in range(n):
        c = base + (1 if i < extra else 0)
        out.append((start, c))
        start += c
    return out


class Plan(ABC):
    """One rank's part in one collective (see the module's docstring)."""

    name: ClassVar[str] = ""

    def __init__(self, rank: int, world: int, op: str, dtype: str, numel: int, payload: bytes, root: int,
                 reduce_op: str, sight: Sight, fold: Callable[[bytes, bytes], bytes] | None = None) -> None:
        """`fold(acc, x)`: `acc` `reduce_op` `x` element-wise, as the caller computes it (the same bits
        whichever rank does: actors.collectives.fold); the algorithms that reduce on the way call it."""
        self.rank, self.world = rank, world
        self.op, self.dtype, self.numel = op, dtype, numel
        self.payload, self.root, self.reduce_op = payload, root, reduce_op
        self.sight = sight
        self.itemsize = ITEMSIZE.get(dtype, 1)
        self._fold = fold

    def fold(self, acc: bytes, x: bytes) -> bytes:
        """`acc` `reduce_op` `x`, element-wise (the caller's `fold`)."""
        if self._fold is None:
            raise AlgorithmError(f"{self.name}: a {self.op} folds on the way and was given no fold")
        return self._fold(acc, x) if acc else acc

    # ---- what an algorithm says of itself
    @classmethod
    @abstractmethod
    def feasible(cls, sight: Sight, op: str, root: int = 0) -> str | None:
        """None if this algorithm can carry `op` on `sight`, else why not."""

    @classmethod
    @abstractmethod
    def estimate(cls, sight: Sight, op: str, nbytes: int, root: int = 0) -> float:
        """Seconds the slowest rank needs for `op` of `nbytes` (each rank's input) on `sight`."""

    # ---- the state machine
    @abstractmethod
    def start(self) -> list[Send]:
        """The transfers to show as the collective begins."""

    @abstractmethod
    def received(self, origin: int, part: int, payload: bytes) -> list[Send]:
        """A transfer of this collective arrived (any rank's, any part: a plan ignores what it does not
        wait for); returns what to show next."""

    @property
    @abstractmethod
    def done(self) -> bool:
        """Everything this rank needs has arrived."""

    @abstractmethod
    def waiting_for(self) -> set[int]:
        """The ranks whose transfers this rank still waits for (for a timeout's message)."""

    @abstractmethod
    def result(self) -> tuple[tuple[tuple[bytes, ...], ...], bytes | None]:
        """(every rank's input in rank order, or () ; the reduced bytes, or None): what the backend needs
        to write the outputs. A reducing op gets one of the two; broadcast gets the root's in every slot."""




def estimates(sight: Sight, op: str, nbytes: int, root: int = 0) -> dict[str, float | str]:
    """Each algorithm's cost for `op` of `nbytes` on `sight` in seconds, or why it cannot run."""
    out: dict[str, float | str] = {}
    for name, cls in REGISTRY.parts("algorithm").items():
        why = cls.feasible(sight, op, root)
        out[name] = why if why is not None else cls.estimate(sight, op, nbytes, root)
    return out


def choose(sight: Sight, op: str, nbytes: int, root: int = 0, want: str = "auto") -> type[Plan]:
    """The algorithm for this collective: `want` if it is not "auto" (AlgorithmError if it cannot run
    here), else the cheapest feasible one by the cost model (ties: the order of the algorithm sources)."""
    algorithms = REGISTRY.parts("algorithm")
    if want != "auto":
        if want not in algorithms:
            raise AlgorithmError(f"unknown collective algorithm {want!r} (known: auto, {', '.join(algorithms)})")
        why = algorithms[want].feasible(sight, op, root)
        if why is not None:
            raise AlgorithmError(f"collective algorithm {want!r} cannot carry {op} in this room: {why}")
        return algorithms[want]
    costs = {n: c for n, c in estimates(sight, op, nbytes, root).items() if not isinstance(c, str)}
    if not costs:
        reasons = "; ".join(f"{n}: {c}" for n, c in estimates(sight, op, nbytes, root).items())
        raise AlgorithmError(f"no collective algorithm can carry {op} in this room ({reasons})")
    return algorithms[min(costs, key=lambda n: (costs[n], list(algorithms).index(n)))]
