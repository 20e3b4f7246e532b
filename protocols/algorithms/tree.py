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

A broadcast goes down the root's tree in chunks (`broadcast_chunks`) where the tree is deeper than one
hop: a rank passes each chunk on as soon as it has it, so the hops work at once (a pipeline, as the ring's
broadcast) instead of each waiting for the whole tensor.

Each tree is a breadth-first search from its root over the sight graph (`trees`), the same on every rank:
a rank reached in hop k takes as its parent the rank of hop k-1 it reads fastest (ties: the one relaying
fewest parts so far, then the lowest rank); then ranks move to other parents of the same hop (`_balance`)
while that lowers the busiest screen's load: a screen shows each part it relays once, however many of its
readers take it, so the busiest screen sets the pace (at the eight-laptop table: at most five parts a
screen, 32 in all, against six and 40 for the trees built one root after the other)."""

from __future__ import annotations

from protocols.algorithms import Plan, Send, Sight, chunks
from protocols.registry import REGISTRY

MIN_CHUNK_BYTES = 512  # a broadcast's chunks are no smaller (each is a transfer: its frames, its round)


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
    _balance(sight, out)
    return out


RATE_SLACK = 0.9  # `_balance` moves a rank to a parent it reads at least this share as fast as its own


def _balance(sight: Sight, tr: dict[int, dict[int, int]]) -> None:
    """Share the relaying out more evenly (in place): a screen shows each part it relays once, so the
    busiest screen (its own part and every part it relays) sets the pace. While moving one rank of one
    tree to another parent at the same depth (one it reads about as fast) lowers the busiest screen's load
    or the loads' sum of squares, move it. The same on every rank: the search goes in rank order."""
    n = sight.world
    depth = {r0: {r: _depth(parent, r, r0) for r in parent} for r0, parent in tr.items()}
    load = [0] * n
    for r0, parent in tr.items():
        load[r0] += 1  # (its own part: every root shows it)
        for p in set(parent.values()):
            if p != r0:
                load[p] += 1
    improved = True
    while improved:
        improved = False
        for r0 in sorted(tr):
            parent, dep = tr[r0], depth[r0]
            for r in sorted(parent):
                p = parent[r]
                if p == r0:
                    continue
                kids_p = sum(1 for c in parent.values() if c == p)
                relays = set(parent.values())
                for q in range(n):
                    if q in (p, r) or not sight.reads(r, q) or dep.get(q, 0) != dep[r] - 1 \
                            or sight.rate(r, q) < RATE_SLACK * sight.rate(r, p):
                        continue
                    new = list(load)
                    if kids_p == 1:
                        new[p] -= 1
                    if q not in relays and q != r0:
                        new[q] += 1
                    if (max(new), sum(x * x for x in new)) < (max(load), sum(x * x for x in load)):
                        parent[r], load = q, new
                        improved = True
                        break


def _height(parent: dict[int, int], r: int) -> int:
    """The hops from `r` down to the farthest rank below it in the tree (0: a leaf)."""
    kids = [c for c, p in parent.items() if p == r]
    return 1 + max(_height(parent, c) for c in kids) if kids else 0


def _depth(parent: dict[int, int], r: int, root: int) -> int:
    """The hops from `root` down to `r`."""
    d = 0
    while r != root:
        r, d = parent[r], d + 1
    return d


def depth(parent: dict[int, int], root: int) -> int:
    """The hops from `root` to the rank of its tree farthest from it."""
    return max((_depth(parent, r, root) for r in parent), default=0)


def broadcast_chunks(nbytes: int, hops: int, world: int) -> int:
    """How many chunks a broadcast of `nbytes` goes in down a tree `hops` deep: one where every rank reads
    the root; else up to one per rank, none under MIN_CHUNK_BYTES."""
    return 1 if hops <= 1 else max(1, min(world, nbytes // MIN_CHUNK_BYTES))


@REGISTRY.part("algorithm")
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
        hops = max(depth(parent, r0) for r0, parent in tr.items())
        busy = [0.0] * sight.world
        for r0, parent in tr.items():
            for s in set(parent.values()):
                kids = [c for c, p in parent.items() if p == s]
                busy[s] += nbytes / min(sight.rate(c, s) for c in kids)
        fill = 0.0
        if op == "broadcast" and hops > 1:  # (its chunks: each hop waits for one chunk of the hop before it)
            slowest = min(sight.rate(c, p) for c, p in tr[root].items())
            fill = (hops - 1) * nbytes / broadcast_chunks(nbytes, hops, sight.world) / slowest
        return hops * sight.latency_s + max(busy) + fill

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        roots = self._roots(self.sight, self.op, self.root)
        self.children: dict[int, int] = {}  # root -> the ranks this rank relays its part to (a bit mask)
        self.needed: dict[int, int] = {}  # root -> the parent this rank reads its part from
        tr = trees(self.sight, roots)
        self.below: dict[int, int] = {}  # root -> the hops its part still goes beyond this rank's children
        for r0, parent in tr.items():
            self.children[r0] = sum(1 << c for c, p in parent.items() if p == self.rank)
            if self.rank != r0:
                self.needed[r0] = parent[self.rank]
            self.below[r0] = _height(parent, self.rank) - 1
        self.parts: dict[int, bytes] = {self.rank: self.payload}
        if self.op == "broadcast":
            # The root's tensor in chunks, each a part (its number), each passed on as soon as it arrives.
            k = broadcast_chunks(self.numel * self.itemsize, depth(tr[self.root], self.root), self.world)
            self.cuts = [(s * self.itemsize, (s + c) * self.itemsize) for s, c in chunks(self.numel, k)]
            self.down = self.children[self.root]
            self.up = self.needed.get(self.root)
            self.parts = ({j: self.payload[a:b] for j, (a, b) in enumerate(self.cuts)} if self.rank == self.root
                          else {})

    def _relay(self, r0: int) -> list[Send]:
        dest = self.children.get(r0, 0)
        return [Send(r0, dest, self.parts[r0], max(0, self.below[r0]))] if dest else []

    def start(self) -> list[Send]:
        if self.op == "broadcast":
            return [Send(j, self.down, self.parts[j]) for j in range(len(self.cuts))] \
                if self.rank == self.root and self.down else []
        return self._relay(self.rank) if self.rank in self.children else []

    def received(self, origin: int, part: int, payload: bytes) -> list[Send]:
        # A part is its root's input (or a chunk of the root's tensor) verbatim, whoever relays it: the first
        # copy this camera reads will do.
        if self.op == "broadcast":
            if self.rank == self.root or not 0 <= part < len(self.cuts) or part in self.parts:
                return []
            self.parts[part] = payload
            return [Send(part, self.down, payload)] if self.down else []
        if part not in self.needed or part in self.parts:
            return []
        self.parts[part] = payload
        return self._relay(part)

    @property
    def done(self) -> bool:
        if self.op == "broadcast":
            return len(self.parts) == len(self.cuts)
        return all(r0 in self.parts for r0 in self.needed)

    def waiting_for(self) -> set[int]:
        if self.op == "broadcast":
            return set() if self.done else {self.up}
        return {p for r0, p in self.needed.items() if r0 not in self.parts}

    def result(self):
        if self.op == "broadcast":
            root = b"".join(self.parts[j] for j in range(len(self.cuts)))
            return tuple((root,) for _ in range(self.world)), None
        return tuple((self.parts[r],) for r in range(self.world)), None
