"""All-see-all: every rank shows its whole input once, every camera reads every other screen, and every
rank reduces the parts itself, in rank order. One round: the fastest where every camera reads every screen
well (small rooms, small tensors)."""

from __future__ import annotations

from protocols.algorithms import Plan, Send, Sight
from protocols.registry import REGISTRY


@REGISTRY.part("algorithm")
class AllSeeAll(Plan):
    name = "all_see_all"

    @classmethod
    def _edges(cls, sight: Sight, op: str, root: int) -> list[tuple[int, int]]:
        n = sight.world
        if op == "broadcast":
            return [(r, root) for r in range(n) if r != root]
        return [(r, s) for r in range(n) for s in range(n) if r != s]

    @classmethod
    def feasible(cls, sight: Sight, op: str, root: int = 0) -> str | None:
        blind = [(r, s) for r, s in cls._edges(sight, op, root) if not sight.reads(r, s)]
        if blind:
            return "needs every camera to read " + ("the root's screen" if op == "broadcast" else "every screen") \
                + "; " + ", ".join(f"rank {r} does not read rank {s}" for r, s in blind[:4]) \
                + (" ..." if len(blind) > 4 else "")
        return None

    @classmethod
    def estimate(cls, sight: Sight, op: str, nbytes: int, root: int = 0) -> float:
        edges = cls._edges(sight, op, root)
        if not edges:
            return 0.0
        return sight.latency_s + max(nbytes / sight.rate(r, s) for r, s in edges)

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        others = [r for r in range(self.world) if r != self.rank]
        self.parts: dict[int, bytes] = {self.rank: self.payload}
        if self.op == "broadcast":
            self.needed = set() if self.rank == self.root else {self.root}
        else:
            self.needed = set(others)
        self.dest = sum(1 << r for r in others)

    def start(self) -> list[Send]:
        if self.op == "broadcast" and self.rank != self.root:
            return []
        return [Send(0, self.dest, self.payload)]

    def received(self, origin: int, part: int, payload: bytes) -> list[Send]:
        if origin in self.needed and part == 0:
            self.needed.discard(origin)
            self.parts[origin] = payload
        return []

    @property
    def done(self) -> bool:
        return not self.needed

    def waiting_for(self) -> set[int]:
        return set(self.needed)

    def result(self):
        if self.op == "broadcast":
            root = self.parts[self.root]
            return tuple((root,) for _ in range(self.world)), None
        return tuple((self.parts[r],) for r in range(self.world)), None
