"""Ring: around a cycle of sight (each rank's screen read by the next rank's camera; every camera needs one
screen only, read at full resolution). all_reduce is a reduce-scatter then an all-gather, 2(n-1) rounds of
1/n of the tensor each (bandwidth-optimal); all_gather and barrier forward each rank's part n-1 times;
broadcast pipelines the root's tensor, cut in chunks, down the ring. reduce_scatter runs as an all_reduce
(each rank keeps its slice; 2x the bytes of a ring reduce-scatter: simpler, and still one camera per rank).

Every chunk of a reduction is folded once around the ring, starting at the rank that owns it, by the
ranks in ring order; the rank that finishes it shows it to the others: the same bytes everywhere."""

from __future__ import annotations

from protocols.algorithms import Plan, Send, Sight, chunks
from protocols.registry import REGISTRY


@REGISTRY.part("algorithm")
class Ring(Plan):
    name = "ring"

    @classmethod
    def feasible(cls, sight: Sight, op: str, root: int = 0) -> str | None:
        if sight.ring() is None:
            return "no cycle of sight through every rank (each camera reading the screen of the one before)"
        return None

    @classmethod
    def _slowest(cls, sight: Sight) -> float:
        ring = sight.ring()
        n = len(ring)
        return min(sight.rate(ring[(i + 1) % n], ring[i]) for i in range(n))

    @classmethod
    def estimate(cls, sight: Sight, op: str, nbytes: int, root: int = 0) -> float:
        n, g, lat = sight.world, cls._slowest(sight), sight.latency_s
        if op in ("allreduce", "reduce_scatter"):
            return 2 * (n - 1) * (lat + nbytes / n / g)
        if op == "broadcast":
            k = n
            return (n - 1) * lat + (n - 1 + k - 1) * nbytes / k / g
        return (n - 1) * (lat + nbytes / g)  # allgather, barrier

    def __init__(self, *a, **k) -> None:
        super().__init__(*a, **k)
        self.ring = self.sight.ring()
        n = self.world
        self.pos = self.ring.index(self.rank)
        self.succ, self.pred = self.ring[(self.pos + 1) % n], self.ring[(self.pos - 1) % n]
        self.to_succ = 1 << self.succ
        self.inbox: dict[int, bytes] = {}  # part -> payload from pred, not yet used
        self.next_part = 0  # the next part this rank uses from pred
        if self.op in ("allreduce", "reduce_scatter"):
            isz = self.itemsize
            self.cuts = [(s * isz, (s + c) * isz) for s, c in chunks(self.numel, n)]
            self.acc = [self.payload[a:b] for a, b in self.cuts]
            self.total = 2 * (n - 1)
        elif self.op == "broadcast":
            self.k = max(1, min(n, self.numel))
            isz = self.itemsize
            self.cuts = [(s * isz, (s + c) * isz) for s, c in chunks(self.numel, self.k)]
            self.got: dict[int, bytes] = {}
            self.total = 0 if self.rank == self.root else self.k
        else:  # allgather, barrier
            self.parts: dict[int, bytes] = {self.rank: self.payload}
            self.total = n - 1

    # ---- what to show
    def _reducing(self) -> bool:
        return self.op in ("allreduce", "reduce_scatter")

    def _chunk_in(self, k: int) -> int:
        """The chunk this rank gets from its predecessor at step k (reduce-scatter, then all-gather)."""
        n, pos = self.world, self.pos
        return (pos - k - 1) % n if k < n - 1 else (pos - (k - (n - 1))) % n

    def _send_step(self, k: int) -> list[Send]:
        n, pos = self.world, self.pos
        if self._reducing():
            if k >= self.total:
                return []
            idx = (pos - k) % n if k < n - 1 else (pos + 1 - (k - (n - 1))) % n
            if self.cuts[idx][0] == self.cuts[idx][1]:
                return []  # an empty chunk (fewer elements than ranks): both ends skip it
            return [Send(k, self.to_succ, self.acc[idx])]
        if self.op == "broadcast":
            return []
        if k >= self.total:
            return []
        return [Send(k, self.to_succ, self.parts[self.ring[(pos - k) % n]])]

    def start(self) -> list[Send]:
        if self.op == "broadcast":
            if self.rank != self.root:
                return []
            return [Send(j, self.to_succ, self.payload[a:b]) for j, (a, b) in enumerate(self.cuts)]
        return self._send_step(0) + self._advance()

    def received(self, origin: int, part: int, payload: bytes) -> list[Send]:
        if origin != self.pred or part < self.next_part or part in self.inbox:
            return []
        if self.op == "broadcast":
            if self.rank == self.root or part >= self.k:
                return []
            self.got[part] = payload
            self.next_part = 0
            return [Send(part, self.to_succ, payload)] if self.succ != self.root else []
        if part >= self.total:
            return []
        self.inbox[part] = payload
        return self._advance()

    def _advance(self) -> list[Send]:
        """Use pred's parts in order (an empty chunk's step needs no transfer); returns the sends due."""
        out: list[Send] = []
        n, pos = self.world, self.pos
        while self.next_part < self.total:
            k = self.next_part
            if k in self.inbox:
                data = self.inbox.pop(k)
            elif self._reducing() and self.cuts[self._chunk_in(k)][0] == self.cuts[self._chunk_in(k)][1]:
                data = b""
            else:
                break
            if self._reducing():
                if k < n - 1:  # reduce-scatter: fold pred's partial sum of this chunk with ours
                    idx = (pos - k - 1) % n
                    self.acc[idx] = self.fold(data, self.acc[idx])
                else:  # all-gather: a finished chunk
                    self.acc[(pos - (k - (n - 1))) % n] = data
            else:
                self.parts[self.ring[(pos - 1 - k) % n]] = data
            self.next_part = k + 1
            out += self._send_step(k + 1)
        return out

    @property
    def done(self) -> bool:
        if self.op == "broadcast":
            return len(self.got) == self.total
        return self.next_part >= self.total

    def waiting_for(self) -> set[int]:
        return set() if self.done else {self.pred}

    def result(self):
        if self.op in ("allreduce", "reduce_scatter"):
            return (), b"".join(self.acc)
        if self.op == "broadcast":
            data = self.payload if self.rank == self.root else b"".join(self.got[j] for j in range(self.k))
            return tuple((data,) for _ in range(self.world)), None
        return tuple((self.parts[r],) for r in range(self.world)), None
