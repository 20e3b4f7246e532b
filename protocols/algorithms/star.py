"""Star: one hub reads every screen and every camera reads the hub (the built-in run's parameter server).
Everyone shows its input to the hub; the hub reduces in rank order (or gathers) and shows the result to
all. Two rounds; it needs one laptop that sees everyone and is seen by everyone, not all pairs."""

from __future__ import annotations

from protocols.algorithms import Plan, Send, Sight
from protocols.registry import REGISTRY


def hub_of(sight: Sight) -> int | None:
    """The rank that reads every screen and is read by every camera, the one with the fastest slowest
    edge (ties: the lowest rank); None if there is none."""
    best: tuple[float, int] | None = None
    for h in range(sight.world):
        others = [r for r in range(sight.world) if r != h]
        if all(sight.reads(h, r) and sight.reads(r, h) for r in others):
            slow = min([sight.rate(h, r) for r in others] + [sight.rate(r, h) for r in others], default=1.0)
            if best is None or slow > best[0]:
                best = (slow, h)
    return None if best is None else best[1]


@REGISTRY.part("algorithm")
class Star(Plan):
    name = "star"

    @classmethod
    def feasible(cls, sight: Sight, op: str, root: int = 0) -> str | None:
        if hub_of(sight) is None:
            return "no rank both reads every screen and is read by every camera"
        return None

    @classmethod
    def estimate(cls, sight: Sight, op: str, nbytes: int, root: int = 0) -> float:
        h, n = hub_of(sight), sight.world
        others = [r for r in range(n) if r != h]
        g_in = min(sight.rate(h, r) for r in others)
        g_out = min(sight.rate(r, h) for r in others)
        lat = sight.latency_s
        if op == "broadcast":
            return (0 if root == h else lat + nbytes / sight.rate(h, root)) + lat + nbytes / g_out
        back = nbytes if op in ("allreduce", "reduce_scatter") else nbytes * n
        return 2 * lat + nbytes / g_in + back / g_out

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.hub = hub_of(self.sight)
        n = self.world
        self.others = [r for r in range(n) if r != self.hub]
        self.parts: dict[int, bytes] = {self.rank: self.payload}
        self.final: bytes | None = None
        if self.op == "broadcast" and self.rank == self.root:
            self.final = self.payload

    def _hub_result(self) -> bytes:
        if self.op in ("allreduce", "reduce_scatter"):
            acc = self.parts[0]
            for r in range(1, self.world):
                acc = self.fold(acc, self.parts[r])
            return acc
        return b"".join(self.parts[r] for r in range(self.world))  # allgather, barrier

    def _to_all_but(self, *skip: int) -> int:
        return sum(1 << r for r in range(self.world) if r not in skip and r != self.rank)

    def start(self) -> list[Send]:
        if self.op == "broadcast":
            if self.rank != self.root:
                return []
            if self.rank == self.hub:
                return [Send(1, self._to_all_but(), self.payload)]
            return [Send(0, 1 << self.hub, self.payload)]
        if self.rank != self.hub:
            return [Send(0, 1 << self.hub, self.payload)]
        return self._hub_check()

    def _hub_check(self) -> list[Send]:
        if self.final is None and len(self.parts) == self.world:
            self.final = self._hub_result()
            return [Send(1, self._to_all_but(), self.final)]
        return []

    def received(self, origin: int, part: int, payload: bytes) -> list[Send]:
        if self.op == "broadcast":
            if self.final is not None:
                return []
            if self.rank == self.hub and origin == self.root and part == 0:
                self.final = payload
                dest = self._to_all_but(self.root)
                return [Send(1, dest, payload)] if dest else []
            if origin == self.hub and part == 1:
                self.final = payload
            return []
        if self.rank == self.hub:
            if part == 0 and origin in self.others and origin not in self.parts:
                self.parts[origin] = payload
                return self._hub_check()
            return []
        if origin == self.hub and part == 1 and self.final is None:
            self.final = payload
        return []

    @property
    def done(self) -> bool:
        return self.final is not None

    def waiting_for(self) -> set[int]:
        if self.done:
            return set()
        if self.rank == self.hub:
            return set(self.others) - set(self.parts) if self.op != "broadcast" else {self.root}
        return {self.hub}

    def result(self):
        data = self.final
        if self.op in ("allreduce", "reduce_scatter"):
            return (), data
        if self.op == "broadcast":
            return tuple((data,) for _ in range(self.world)), None
        per = len(data) // self.world
        return tuple((data[r * per:(r + 1) * per],) for r in range(self.world)), None
