"""Tree: every rank's input spreads at once down its own tree of sight (a broadcast tree per rank, the
fewest hops from it to every other rank), and every camera that reads a screen reads what it relays.

Where cameras read several screens but not all (two rows across a table: across and the diagonals), a ring
uses one of each camera's screens and needs n-1 rounds to carry everyone's part everywhere; these trees use
every screen a camera reads, so a part arrives in as many rounds as the graph is wide (3 at the eight-laptop
table) and each screen shows fewer parts (its own, and those it relays to the ranks that read it first).
all_gather, barrier and broadcast gather the inputs; all_reduce and reduce_scatter gather them too and
every rank folds them itself in rank order (as all-see-all does): the same bytes on every rank. That is
as many rounds as the graph is wide against the ring's 2(n-1), for whole tensors against the ring's
slices: the cost model takes the trees for small tensors and keeps the ring for big ones.

Each tree is a breadth-first search from its root over the sight graph (`trees`), the same on every rank:
a rank reached in hop k takes as its parent the rank of hop k-1 it reads fastest (ties: the one relaying
fewest parts so far, then the lowest rank), so relaying is shared out."""

from __future__ import annotations

from protocols.algorithms import Plan, Send, Sight


def trees(sight: Sight, roots: list[int]) -> dict[int, dict[int, int]] | None:
    """For each root, every other rank's parent in its tree (`parent[root][rank]`); None if some rank cannot
    be reached from some root (no chain of cameras leads from its screen to that rank)."""
    n = sight.world
    load = [0] * n  # parts each rank relays (or shows) so far: parents are chosen to share it out
    out: dict[int, dict[int, int]] = {}
    for root in roots:
        parent: dict[int, int] = {}
        reached, level = {root}, [root]
        relays: set[int] = set()
        while level:
            nxt: list[int] = []
            for r in range(n):
                if r in reached:
                    continue
                cands = [s for s in level if sight.reads(r, s)]
                if not cands:
                    continue
                p = min(cands, key=lambda s: (-sight.rate(r, s), load[s] + (s not in relays), s))
                parent[r] = p
                if p not in relays:
                    relays.add(p)
                    load[p] += 1
                nxt.append(r)
            reached.update(nxt)
            level = nxt
        if len(reached) < n:
            return None
        out[root] = parent
    return out


class Tree(Plan):
    name = "tree"

    @staticmethod
    def _roots(sight: Sight, op: str, root: int) -> list[int]:
        return [root] if op == "broadcast" else list(range(sight.world))

    @classmethod
    def feasible(cls, sight: Sight, op: str, root: int = 0) -> str | None:
        if trees(sight, cls._roots(sight, op, root)) is None:
            return ("some rank is out of reach: no chain of cameras carries "
                    + ("the root's screen" if op == "broadcast" else "every screen") + " to every rank")
        return None

    @classmethod
    def estimate(cls, sight: Sight, op: str, nbytes: int, root: int = 0) -> float:
        """Rounds (the deepest tree) x latency, plus the busiest screen's bytes: each part it shows, at the
        rate of the slowest camera that must read it."""
        roots = cls._roots(sight, op, root)
        tr = trees(sight, roots)
        depth = 0
        busy = [0.0] * sight.world
        for r0, parent in tr.items():
            for r in parent:
                d, x = 0, r
                while x != r0:
                    x, d = parent[x], d + 1
                depth = max(depth, d)
            for s in set(parent.values()):
                kids = [c for c, p in parent.items() if p == s]
                busy[s] += nbytes / min(sight.rate(c, s) for c in kids)
        return depth * sight.latency_s + max(busy)

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        roots = self._roots(self.sight, self.op, self.root)
        self.children: dict[int, int] = {}  # root -> the ranks this rank relays its part to (a bit mask)
        self.needed: dict[int, int] = {}  # root -> the parent this rank reads its part from
        for r0, parent in trees(self.sight, roots).items():
            self.children[r0] = sum(1 << c for c, p in parent.items() if p == self.rank)
            if self.rank != r0:
                self.needed[r0] = parent[self.rank]
        self.parts: dict[int, bytes] = {self.rank: self.payload}

    def _relay(self, r0: int) -> list[Send]:
        dest = self.children.get(r0, 0)
        return [Send(r0, dest, self.parts[r0])] if dest else []

    def start(self) -> list[Send]:
        return self._relay(self.rank) if self.rank in self.children else []

    def received(self, origin: int, part: int, payload: bytes) -> list[Send]:
        # A part is its root's input verbatim, whoever relays it: the first copy this camera reads will do.
        if part not in self.needed or part in self.parts:
            return []
        self.parts[part] = payload
        return self._relay(part)

    @property
    def done(self) -> bool:
        return all(r0 in self.parts for r0 in self.needed)

    def waiting_for(self) -> set[int]:
        return {p for r0, p in self.needed.items() if r0 not in self.parts}

    def result(self):
        if self.op == "broadcast":
            root = self.parts[self.root]
            return tuple((root,) for _ in range(self.world)), None
        return tuple((self.parts[r],) for r in range(self.world)), None
