"""Collectives: a rank's collectives, carried out as transfers over the light.

Consumes: `CollectiveRequest` (from the rank's program, through
wccl.distributed: a collective, or a send or recv), `SendTensor` (a point-to-point tensor of the built-in
run, protocols.streams: one transfer to the ranks named, posted once the
layout is chosen; relayed where it must, in chunks past one hop: `_send_tensors`), `TransferArrived`
(a peer's transfer, rebuilt and checked), `PeerAcks` (what each peer has of this rank's transfers), `HoldsKnown`
(how many collectives each rank is known to hold), `VoidCollectives` (the
group changed: the program goes on from a later collective), `Drain` (the
program is done). Emits: `PostTransfer` (to the screen), `HoldsKnown` (this rank's
own count), `TensorReceived` (a tensor of the built-in run relayed here by
other ranks), and `CollectiveDone` with every rank's parts in rank order, or
an error.

Every rank issues the same collectives in the same order (torch's rule), so
the k-th request of every rank is collective `seq` k. Each request starts
when its rank's program issued it (`ready_at`: the program's compute is
charged to the node's clock). How its bytes move is an algorithm of
protocols.algorithms (all_see_all, ring, star, tree), the same on every rank:
chosen by the cost model on the room's sight graph for the op and size, or
the configured one; its plan says which transfers to show (each to the ranks
that must read it) and when it has what it needs. Every rank ends with the
same bytes (see protocols.algorithms). A peer's transfer
that disagrees with this rank's own call (another op, dtype or size) fails
the collective with a message naming both; one that does not arrive within
`timeout_s` fails it with what was and was not received. Nothing partial is
ever handed on.

Agreement: a rank that has every part of collective `seq` *holds* it, and
says so in every frame it shows (a count: it holds every collective before
`count`); frames relay what each rank is known to hold, camera to camera. A
rank hands a collective's result on only once every rank is known to hold it,
so a frame that reached some cameras and not others (a hand over a camera,
someone walking by) delays the collective on every rank, and a camera lost
for longer than the timeout fails it on every rank: never applied by some
ranks and not by others. (Whether the *last* news reached every rank before
a camera went dark cannot be known by any protocol (the two generals): a rank
that holds a collective but never learns that the others do fails it with
that reason.) After a failed collective the group is broken, as NCCL's is
after a timeout: every later collective fails at once, saying why.

The group: the ranks a collective runs over. It is every rank, or in a room
that started without some (the built-in run's `[training] quorum`) the ranks
in it from the start (`SightKnown`: not absent, not joined later). A
collective's plan runs on the group's part of the sight graph, numbered
within the group; its `CollectiveDone` has every rank's parts in rank order,
none for a rank outside the group, and only the group's holds agree it.

When a rank's node restarts and rejoins the built-in run, or a rank joins
it late (actors.rank_worker), every rank's program voids the collectives
before an agreed number (`VoidCollectives`): one still running here is
dropped unapplied, its transfers count as delivered, and this rank counts
every collective before that number as held, so the next one is agreed as
usual. From that number on the collectives run over the group it names;
they wait until this rank's sight graph has every rank of it (a rank that
joined is in it once discovery let it in here, which may come later than
the void).
"""

from __future__ import annotations

import asyncio
import functools
import zlib
from collections import deque
from dataclasses import dataclass

import structlog

from protocols import streams, transfer
from protocols.algorithms import AlgorithmError, Plan, Sight, choose, chunks
from protocols.algorithms.tree import broadcast_chunks
from protocols.messages import (P2P_OPS, CollectiveDone, CollectiveRequest, Drain, HoldsKnown, PeerAcks,
                                PostTransfer, SendTensor, SightKnown, TransferArrived, VoidCollectives)
from wccl.runtime.actor import Actor, ActorContext, Overflow
from protocols.registry import REGISTRY

# The reduce ops, by the name a request gives (`CollectiveRequest.reduce_op`), as torch's element-wise
# functions: the one table the algorithms' folds and the backend's reductions (wccl.distributed.backend) use.
# "avg" folds as a sum (the backend divides at the end).
REDUCE_OPS = {"sum": "add", "avg": "add", "product": "mul", "min": "minimum", "max": "maximum",
              "band": "bitwise_and", "bor": "bitwise_or", "bxor": "bitwise_xor"}


def fold(acc: bytes, x: bytes, dtype: str, reduce_op: str) -> bytes:
    """`acc` `reduce_op` `x`, element-wise, two tensors of `dtype` as bytes (torch's arithmetic, the
    backend's: the same bits whichever rank computes it)."""
    import torch

    fn = getattr(torch, REDUCE_OPS[reduce_op])
    tdt = getattr(torch, dtype)
    a = torch.frombuffer(bytearray(acc), dtype=torch.uint8).view(tdt)
    b = torch.frombuffer(bytearray(x), dtype=torch.uint8).view(tdt)
    return fn(a, b).contiguous().view(torch.uint8).numpy().tobytes()


LINGER_S = 1.0  # after draining, keep the screen up this long: peers read the last acknowledgements
MAX_PARTIAL_STREAMS = 32  # relayed tensors waiting for their other chunks; beyond, the oldest is dropped


@dataclass
class _PointToPoint:
    """A send waiting for its peer's acknowledgement, or a recv waiting for its message."""

    req: CollectiveRequest
    deadline: float
    tid: int = 0  # a send's transfer
    hop: int = -1  # a send's first reader: its peer, or the first rank relaying it there


@dataclass
class _Pending:
    req: CollectiveRequest
    deadline: float
    plan: Plan
    ranks: list[int]  # the group's ranks, in order: the plan numbers them 0, 1, ...
    held: bool = False  # this rank has every part (it waits for every rank to hold it too)


class Collectives(Actor):
    consumes = (CollectiveRequest, SendTensor, TransferArrived, PeerAcks, Drain, SightKnown, HoldsKnown,
                VoidCollectives)
    mailbox = (256, Overflow.BLOCK)

    def __init__(self, ctx: ActorContext, rank: int, world: int, timeout_s: float,
                 names: list[str] | None = None, on_drained=None, sight: Sight | None = None,
                 algorithm: str = "auto", goodput: float | list[float] = 20_000.0,
                 latency_s: float | list[float] = 0.3) -> None:
        """`sight`: the sight graph, or None to wait for discovery's (`SightKnown`: each edge's quality
        times `goodput`, bytes per second, and `latency_s` a round; one each per layout of the start-up
        ladder, the layout discovery chose being `SightKnown.layout`)."""
        super().__init__(ctx)
        self.rank, self.world = rank, world
        self.sight = sight
        self.goodputs = goodput if isinstance(goodput, list) else [goodput]
        self.latencies = latency_s if isinstance(latency_s, list) else [latency_s] * len(self.goodputs)
        self._sight_known = asyncio.Event()
        if sight is not None:
            self._sight_known.set()
        self.algorithm = algorithm
        self._chosen: dict[str, str] = {}  # op -> the algorithm it last ran (logged when it changes)
        self._dests: dict[int, int] = {}  # tid -> the ranks that must acknowledge it
        self._collective_of: dict[int, int] = {}  # tid -> the collective (seq) it is a part of
        self.timeout_s = timeout_s
        self.names = names or [f"rank{r}" for r in range(world)]
        self.on_drained = on_drained
        self._queue: deque[CollectiveRequest] = deque()
        self._sends: list[SendTensor] = []  # point-to-point sends held until the layout is chosen
        self._passing: list[tuple] = []  # relayed transfers to pass on, held until the sight graph is known
        self._chunks: dict[tuple, dict[int, tuple[bytes, int]]] = {}  # a relayed tensor's chunks here: (bytes, frames)
        self._absent = 0  # the ranks the room started without (a bit a rank): a send to them goes nowhere
        self._group = (1 << world) - 1  # the ranks the collectives run over (a bit a rank)
        self._group_sight: tuple[int, Sight, Sight] | None = None  # (group, sight graph, the group's part of it)
        self._wake = asyncio.Event()
        self._pending: dict[int, _Pending] = {}
        self._early: dict[int, list[TransferArrived]] = {}
        self._sends_out: list[_PointToPoint] = []  # sends not yet acknowledged by their peer
        self._recvs: list[_PointToPoint] = []  # recvs not yet matched, in the order the program posted them
        self._inbox: list[TransferArrived] = []  # point-to-point messages not yet received, in arrival order
        self._recv_next: dict[tuple[int, int], int] = {}  # (source, tag) -> the number of its next message
        self._next_tid = 1
        self._acks: dict[int, transfer.Ack] = {}
        self._heard: dict[int, float] = {}  # rank -> node-clock time of its last transfer
        self._drain: Drain | None = None
        self._last_seq = -1  # the latest collective started here
        self._held: set[int] = set()  # collectives this rank has every part of, beyond `_count`
        self._count = 0  # this rank holds every collective before this one
        self._known = [0] * world  # how many collectives each rank is known to hold (from frames)
        self._broken: str | None = None  # why the group cannot agree any more (a collective failed here)
        self._drained = asyncio.Event()
        self.results = ctx.results.setdefault("collectives", {"done": 0, "failed": 0, "transfers_posted": 0,
                                                              "bytes_posted": 0, "bytes_received": 0,
                                                              "relayed": 0, "relay_refused": 0,
                                                              "relay_chunks_dropped": 0})

    async def run(self) -> None:
        await self.run_beside(self._post_when_ready(), self._watchdog())

    async def handle(self, msg) -> None:
        if isinstance(msg, CollectiveRequest):
            self._queue.append(msg)
            self._wake.set()
        elif isinstance(msg, TransferArrived):
            self._heard[msg.origin] = self.clock.now()
            self.results["bytes_received"] += len(msg.payload)
            if msg.op == "relay":
                await self._relayed(msg)
            elif msg.op == "relay_stream":
                await self._relayed_stream(msg)
            elif msg.op == "p2p":
                self._inbox.append(msg)
                await self._match()
            elif msg.seq in self._pending:
                await self._arrived(self._pending[msg.seq], msg)
            elif msg.seq > self._last_seq:
                self._early.setdefault(msg.seq, []).append(msg)  # a peer is ahead of this rank
        elif isinstance(msg, SendTensor):
            self._sends.append(msg)
            if self._sight_known.is_set():
                await self._send_tensors()
        elif isinstance(msg, PeerAcks):
            self._acks[msg.origin] = transfer.Ack(*msg.ack)
            await self._sends_acknowledged()
            self._check_drained()
        elif isinstance(msg, HoldsKnown):
            if any(b > a for a, b in zip(self._known, msg.holds)):
                self._known = [max(a, b) for a, b in zip(self._known, msg.holds)]
                await self._commit()
                self._check_drained()
        elif isinstance(msg, Drain):
            self._drain = msg
            self._wake.set()
        elif isinstance(msg, VoidCollectives):
            await self._void(msg.first_seq, msg.group)
        elif isinstance(msg, SightKnown):
            # (again when a rank joins the room: its edges, and sends to it from then on)
            known = self.sight is not None
            k = min(msg.layout, len(self.goodputs) - 1)
            self.sight = Sight(self.world, {(r, s): self.goodputs[k] * q for r, s, q in msg.edges},
                               self.latencies[k])
            self._absent = sum(1 << r for r in msg.absent)
            self._wake.set()  # (collectives held back for a group whose ranks were not all in the room)
            if not known:
                if msg.absent or msg.joined:
                    self._group &= ~sum(1 << r for r in (*msg.absent, *msg.joined))
                self._sight_known.set()
                await self._send_tensors()
                passing, self._passing = self._passing, []
                for args in passing:
                    await self._pass_on(*args)

    async def _send_tensors(self) -> None:
        """Post the point-to-point sends (the built-in run's tensors, protocols.streams): one transfer for
        the ranks named that read this screen and whose screens this camera reads and that pass it on to no
        other (a name that is not a rank, or this node, is nobody to wait for; a send to nobody is dropped
        unless nodes overhear it: observers), and one "relay_stream" transfer for each rank that is the first
        on the sight graph's routes (Sight.route) to others named, which takes it if it is named too and
        passes it on (`_pass_on`). A rank the room started without is nobody to wait for either."""
        sends, self._sends = self._sends, []
        for msg in sends:
            ranks = sum(1 << self.names.index(n) for n in msg.to if n in self.names and n != self.ctx.node)
            ranks &= ~self._absent
            hops = self._next_hops(ranks, "relay_stream", self.rank)  # (a rank read both ways: its own next hop)
            plain = sum(dests for hop, dests in hops.items() if dests == 1 << hop)
            step, payload = max(0, msg.step), streams.wrap(msg.epoch, msg.base, msg.payload)
            if plain or msg.overheard:
                await self._post_one(step, msg.stream, "uint8", len(payload), 0, plain, payload,
                                     background=msg.background, overheard=msg.overheard)
            for hop, dests in hops.items():
                if dests == 1 << hop:
                    continue
                far = max(len(self.sight.route(self.rank, d)) for d in range(self.world) if dests >> d & 1)
                k = broadcast_chunks(len(payload), far, self.world)
                check = zlib.crc32(payload)
                for i, (start, n) in enumerate(chunks(len(payload), k)):
                    await self._post_one(step, "relay_stream", "uint8", len(payload), transfer.OPS[msg.stream],
                                         1 << hop, transfer.RELAY_HEAD.pack(self.rank, dests)
                                         + transfer.RELAY_CHUNK.pack(check, i, k) + payload[start:start + n])

    def _next_hops(self, dests: int, op: str, source: int) -> dict[int, int]:
        """The ranks in `dests` (a bit a rank) by the next rank on the sight graph's route to each
        (Sight.route; a rank read both ways is its own): {next rank: the ranks its way leads to}. A rank no
        route leads to is refused and counted. Only once the sight graph is known."""
        hops: dict[int, int] = {}
        for dest in range(self.world):
            if not dests >> dest & 1:
                continue
            route = self.sight.route(self.rank, dest)
            if route is None:
                self.results["relay_refused"] += 1
                self.log.error("relay_refused", op=op, source=source, destination=dest,
                               reason="no chain of laptops that read each other's screens leads there from this one")
                continue
            hops[route[0]] = hops.get(route[0], 0) | 1 << dest
        return hops

    async def _pass_on(self, seq: int, op: str, dtype: str, numel: int, part: int, relayed: bytes, source: int,
                       dests: int) -> None:
        """Show a relayed transfer ("relay" or "relay_stream"; `relayed`: RELAY_HEAD, then the message) on to
        the ranks in `dests`: once to each next rank on the sight graph's routes to them, naming the ranks
        its way leads to (once the sight graph is known here: a peer may know it first)."""
        if self.sight is None:
            self._passing.append((seq, op, dtype, numel, part, relayed, source, dests))
            return
        for hop, ahead in self._next_hops(dests, op, source).items():
            if source != self.rank:
                self.results["relayed"] += 1
            await self._post_one(seq, op, dtype, numel, part, 1 << hop,
                                 transfer.RELAY_HEAD.pack(source, ahead) + relayed[transfer.RELAY_HEAD.size:])

    async def _post_when_ready(self) -> None:
        while True:
            if not self._queue:
                if self._drain is not None:
                    await self._finish_drain()
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            req = self._queue[0]
            await self._sight_known.wait()  # (discovery ends inside init_process_group: no wait in practice)
            if self._group & self._absent and req.op not in P2P_OPS:
                self._wake.clear()  # a rank of the group is not in the room here yet: wait for its SightKnown
                await self._wake.wait()
                continue
            await self.clock.sleep_until(req.ready_at)
            self._queue.popleft()
            await self._start(req)

    async def _start(self, req: CollectiveRequest) -> None:
        if req.op in P2P_OPS:
            await self._point_to_point(req)
            return
        self._last_seq = max(self._last_seq, req.seq)
        if self._broken is not None:
            self.results["failed"] += 1
            await self.emit(CollectiveDone(sender=self.ctx.node, time=self.clock.now(), seq=req.seq,
                                           handle=req.handle, error=f"collective #{req.seq} ({req.op}) not run: "
                                           f"{self._broken}; the ranks cannot agree on later collectives "
                                           "(destroy the process group and start again)"))
            return
        ranks = [r for r in range(self.world) if self._group >> r & 1]
        if len(ranks) == 1 or req.numel == 0:
            await self._hold(req.seq)  # nothing moves: every rank has it as soon as it asks
            await self._done(req, tuple(req.inputs if self._group >> r & 1 else () for r in range(self.world)))
            return
        payload = req.inputs[0] if len(req.inputs) == 1 else b"".join(req.inputs)
        sight = self._sight_of(ranks)
        try:
            if req.root not in ranks and req.op == "broadcast":
                raise AlgorithmError(f"broadcast from rank {req.root} ({self.names[req.root]}), which is not in "
                                     "the group")
            root = ranks.index(req.root) if req.root in ranks else 0
            cls = choose(sight, req.op, len(payload), root, self.algorithm)
        except AlgorithmError as e:
            # Every rank refuses it alike (the same sight graph, the same choice): nothing to agree on. It
            # counts as held, so the collectives after it are not held back waiting for it.
            self.results["failed"] += 1
            self.log.error("collective_failed", seq=req.seq, op=req.op, error=str(e))
            await self._hold(req.seq)
            await self.emit(CollectiveDone(sender=self.ctx.node, time=self.clock.now(), seq=req.seq,
                                           handle=req.handle, error=str(e)))
            return
        if self._chosen.get(req.op) != cls.name:
            self._chosen[req.op] = cls.name
            self.log.info("algorithm_chosen", op=req.op, bytes=len(payload), algorithm=cls.name,
                          configured=self.algorithm)
        plan = cls(ranks.index(self.rank), len(ranks), req.op, req.dtype, req.numel, payload, root, req.reduce_op,
                   sight, functools.partial(fold, dtype=req.dtype, reduce_op=req.reduce_op))
        pend = _Pending(req, self.clock.now() + self.timeout_s, plan, ranks)
        self._pending[req.seq] = pend
        await self._post(pend, plan.start())
        for early in self._early.pop(req.seq, []):
            if req.seq in self._pending:
                await self._arrived(pend, early)
        if plan.done and req.seq in self._pending and not pend.held:
            await self._has_all(pend)

    def _sight_of(self, ranks: list[int]) -> Sight:
        """The sight graph between the ranks of the group, numbered by their place in it (kept while the group
        and the graph stay)."""
        if len(ranks) == self.world:
            return self.sight
        kept = self._group_sight
        if kept is None or kept[0] != self._group or kept[1] is not self.sight:
            at = {r: i for i, r in enumerate(ranks)}
            part = Sight(len(ranks), {(at[a], at[b]): g for (a, b), g in self.sight.goodput.items()
                                      if a in at and b in at}, self.sight.latency_s)
            kept = self._group_sight = (self._group, self.sight, part)
        return kept[2]

    async def _post(self, pend: _Pending, sends) -> None:
        req = pend.req
        for s in sends:
            dest = sum(1 << r for i, r in enumerate(pend.ranks) if s.dest >> i & 1)
            await self._post_one(req.seq, req.op, req.dtype, req.numel, s.part, dest, s.payload, priority=s.priority)

    async def _post_one(self, seq: int, op: str, dtype: str, numel: int, part: int, dest: int, payload: bytes,
                        background: bool = False, overheard: bool = False, priority: int = 0) -> None:
        """Number one transfer (this node's next tid) and hand it to the screen until `dest` acknowledges it
        (`background`: in the screen time the others leave; `overheard`: lingering after, for observers;
        `priority`: the hops its bytes still go beyond `dest`, protocols.algorithms.Send)."""
        tid = self._next_tid
        self._next_tid += 1
        self._dests[tid] = dest
        if op in transfer.COLLECTIVE_OPS:
            self._collective_of[tid] = seq
        await self.emit(PostTransfer(sender=self.ctx.node, time=self.clock.now(), tid=tid, seq=seq, op=op,
                                     dtype=dtype, numel=numel, part=part, dest=dest, payload=payload,
                                     background=background, overheard=overheard, priority=priority))
        self.results["transfers_posted"] += 1
        self.results["bytes_posted"] += len(payload)

    async def _arrived(self, pend: _Pending, msg: TransferArrived) -> None:
        req = pend.req
        want = (req.op, req.dtype, req.numel)
        if (msg.op, msg.dtype, msg.numel) != want:
            await self._fail(pend, f"collective #{req.seq}: rank {msg.origin} ({self.names[msg.origin]}) called "
                                   f"{msg.op}({msg.dtype}, {msg.numel} elements) where this rank called "
                                   f"{req.op}({req.dtype}, {req.numel} elements): every rank must issue the same "
                                   "collectives in the same order")
            return
        if msg.origin not in pend.ranks:
            self.log.warning("transfer_outside_group", seq=req.seq, origin=msg.origin)
            return
        await self._post(pend, pend.plan.received(pend.ranks.index(msg.origin), msg.part, msg.payload))
        if pend.plan.done and req.seq in self._pending and not pend.held:
            await self._has_all(pend)

    async def _has_all(self, pend: _Pending) -> None:
        """This rank has every part of the collective: say so, and apply it once every rank holds it."""
        pend.held = True
        await self._hold(pend.req.seq)
        await self._commit()

    async def _void(self, first_seq: int, group: int) -> None:
        """Drop every collective before `first_seq`, running or queued, with no outcome, and count them held;
        run the later ones over `group`."""
        self._group = group
        void = sorted(seq for seq in self._pending if seq < first_seq)
        for seq in void:
            del self._pending[seq]
        self._queue = deque(r for r in self._queue if r.op in P2P_OPS or r.seq >= first_seq)
        self._early = {seq: early for seq, early in self._early.items() if seq >= first_seq}
        self._last_seq = max(self._last_seq, first_seq - 1)
        self.log.info("collectives_voided", first_seq=first_seq, running=void,
                      group=[self.names[r] for r in range(self.world) if group >> r & 1])
        if first_seq > self._count:
            self._held = {seq for seq in self._held if seq >= first_seq}
            self._count = first_seq - 1
            await self._hold(first_seq - 1)
        self._check_drained()

    async def _hold(self, seq: int) -> None:
        self._held.add(seq)
        count = self._count
        while count in self._held:
            self._held.discard(count)
            count += 1
        if count != self._count:
            self._count = count
            self._known[self.rank] = count
            await self.emit(HoldsKnown(sender=self.ctx.node, time=self.clock.now(), holds=tuple(self._known)))

    def _everyone_holds(self, seq: int) -> bool:
        """Every rank of the group holds collective `seq`."""
        return all(k > seq for r, k in enumerate(self._known) if self._group >> r & 1)

    async def _commit(self) -> None:
        for seq in sorted(self._pending):
            pend = self._pending.get(seq)
            if pend is not None and pend.held and self._everyone_holds(seq):
                await self._complete(pend)

    async def _complete(self, pend: _Pending) -> None:
        req = pend.req
        parts, reduced = pend.plan.result()
        if parts and len(pend.ranks) < self.world:
            at = {r: i for i, r in enumerate(pend.ranks)}
            parts = tuple(parts[at[r]] if r in at else () for r in range(self.world))
        del self._pending[req.seq]
        self.results["done"] += 1
        used = self.results.setdefault("algorithms", {})
        used[pend.plan.name] = used.get(pend.plan.name, 0) + 1
        await self.emit(CollectiveDone(sender=self.ctx.node, time=self.clock.now(), seq=req.seq,
                                       handle=req.handle, parts=parts, reduced=reduced,
                                       algorithm=pend.plan.name))

    async def _done(self, req: CollectiveRequest, parts) -> None:
        self.results["done"] += 1
        await self.emit(CollectiveDone(sender=self.ctx.node, time=self.clock.now(), seq=req.seq,
                                       handle=req.handle, parts=parts))

    async def _fail(self, pend: _Pending, error: str) -> None:
        self._pending.pop(pend.req.seq, None)
        if self._broken is None:
            self._broken = f"collective #{pend.req.seq} ({pend.req.op}) failed"
        self.results["failed"] += 1
        self.log.error("collective_failed", seq=pend.req.seq, op=pend.req.op, error=error)
        await self.emit(CollectiveDone(sender=self.ctx.node, time=self.clock.now(), seq=pend.req.seq,
                                       handle=pend.req.handle, error=error))

    # -- point to point (torch.distributed's send and recv) ----------------------------------------
    async def _point_to_point(self, req: CollectiveRequest) -> None:
        """A send: one transfer (op "p2p", `seq` its number to that peer with that tag, `part` the tag) shown
        until the peer acknowledges it, which completes it. Where the two do not read each other's screens
        (an acknowledgement shown where the sender's camera cannot read it never comes), the message goes
        as a "relay" transfer along the sight graph's route (Sight.route): each rank on the way shows it to
        the next, and the send completes once the first of them has it. A recv: matched with the first
        message from its source (any source: the first to arrive) and tag that no earlier recv took, in the
        sender's order."""
        deadline = self.clock.now() + self.timeout_s
        if req.op == "recv":
            self._recvs.append(_PointToPoint(req, deadline))
            await self._match()
            return
        if not 0 <= req.root < self.world or req.root == self.rank:
            await self._p2p_done(req, error=f"send to rank {req.root}: not another rank of the group (0..{self.world - 1})")
            return
        payload = req.inputs[0] if len(req.inputs) == 1 else b"".join(req.inputs)
        if self.sight is None or self.sight.both_ways(req.root, self.rank):
            self._sends_out.append(_PointToPoint(req, deadline, tid=self._next_tid, hop=req.root))
            await self._post_one(req.seq, "p2p", req.dtype, req.numel, req.tag, 1 << req.root, payload)
            return
        route = self.sight.route(self.rank, req.root)
        if route is None:
            await self._p2p_done(req, error=f"send to rank {req.root} ({self.names[req.root]}): no chain of "
                                            "laptops that read each other's screens leads there from this one "
                                            "(the room's sight graph)")
            return
        self._sends_out.append(_PointToPoint(req, deadline, tid=self._next_tid, hop=route[0]))
        self.log.debug("message_relayed", peer=req.root, tag=req.tag, route=route)
        await self._post_one(req.seq, "relay", req.dtype, req.numel, req.tag, 1 << route[0],
                             transfer.RELAY_HEAD.pack(self.rank, 1 << req.root) + payload)

    def _relay_head(self, msg: TransferArrived, single: bool) -> tuple[int, int]:
        """A relayed transfer's source and the ranks it is for (`single`: exactly one), or a ValueError: its
        frames passed the room key's check, so a rank that sent it is broken (nothing to pass on)."""
        head = transfer.RELAY_HEAD
        src, dests = head.unpack_from(msg.payload) if len(msg.payload) >= head.size else (-1, 0)
        if not 0 <= src < self.world or not 0 < dests < 1 << self.world or dests >> src & 1 \
                or single and dests & (dests - 1):
            raise ValueError(f"source {src}, destinations {dests:#x}")
        return src, dests

    def _refuse(self, msg: TransferArrived, reason: str) -> None:
        self.results["relay_refused"] += 1
        self.log.error("relay_refused", origin=msg.origin, op=msg.op, reason=reason, bytes=len(msg.payload))

    async def _relayed(self, msg: TransferArrived) -> None:
        """A message on its way from one rank to another: received here if it is this rank's, else shown to
        the next rank of its route."""
        try:
            src, dests = self._relay_head(msg, single=True)
        except ValueError as e:
            self._refuse(msg, str(e))
            return
        if dests == 1 << self.rank:
            self._inbox.append(msg.model_copy(update={"origin": src, "op": "p2p",
                                                      "payload": msg.payload[transfer.RELAY_HEAD.size:]}))
            await self._match()
            return
        await self._pass_on(msg.seq, "relay", msg.dtype, msg.numel, msg.part, msg.payload, src, dests)

    async def _relayed_stream(self, msg: TransferArrived) -> None:
        """A chunk of one of the built-in run's tensors on its way from one rank to others: shown on to the
        next ranks of the others' routes as soon as it is here, and once every chunk is, the tensor is handed
        to this node's actors if it is one of them (`TensorReceived`, as if read off the source's screen)."""
        stream = transfer.OP_NAMES.get(msg.part)
        head, chunk = transfer.RELAY_HEAD, transfer.RELAY_CHUNK
        try:
            src, dests = self._relay_head(msg, single=False)
            if stream not in streams.STREAMS:
                raise ValueError(f"op {msg.part} is not a stream's")
            if len(msg.payload) < head.size + chunk.size:
                raise ValueError("no chunk head")
            check, index, count = chunk.unpack_from(msg.payload, head.size)
            if not index < count:
                raise ValueError(f"chunk {index} of {count}")
        except ValueError as e:
            self._refuse(msg, str(e))
            return
        if dests & ~(1 << self.rank):
            await self._pass_on(msg.seq, "relay_stream", msg.dtype, msg.numel, msg.part, msg.payload, src,
                                dests & ~(1 << self.rank))
        if not dests >> self.rank & 1:
            return
        key = (src, msg.part, msg.seq, msg.numel, check, count)
        parts = self._chunks.pop(key, {})
        parts[index] = (msg.payload[head.size + chunk.size:], msg.frames)
        if len(parts) < count:
            self._chunks[key] = parts  # (the newest last: the oldest go first when too many wait)
            while len(self._chunks) > MAX_PARTIAL_STREAMS:
                self._drop_partial(next(iter(self._chunks)))
            return
        data = b"".join(parts[i][0] for i in range(count))
        try:
            if len(data) != msg.numel or zlib.crc32(data) != check:
                raise ValueError(f"{count} chunks joined into {len(data)} bytes that fail their check")
            tensor = streams.received(msg.model_copy(update={"frames": sum(f for _, f in parts.values())}), data,
                                      stream, self.names[src], self.ctx.node, self.clock.now())
        except ValueError as e:  # (streams.StreamError is one)
            self._refuse(msg, str(e))
            return
        await self.emit(tensor)

    def _drop_partial(self, key: tuple) -> None:
        """Give up a relayed tensor whose other chunks never came (its source started again, or sent others
        since): counted and logged."""
        parts = self._chunks.pop(key)
        self.results["relay_chunks_dropped"] += len(parts)
        self.log.warning("relay_chunks_dropped", source=key[0], seq=key[2], chunks=len(parts), of=key[5])

    async def _sends_acknowledged(self) -> None:
        for p in list(self._sends_out):
            if self._acks.get(p.hop, transfer.Ack()).has(p.tid):
                self._sends_out.remove(p)
                await self._p2p_done(p.req)

    async def _match(self) -> None:
        """Hand each waiting recv the message it is owed, if it has come."""
        for p in list(self._recvs):
            req = p.req
            for msg in self._inbox:
                if ((req.root in (-1, msg.origin)) and msg.part == req.tag
                        and msg.seq == self._recv_next.get((msg.origin, msg.part), 0)):
                    break
            else:
                continue
            self._inbox.remove(msg)
            self._recvs.remove(p)
            self._recv_next[(msg.origin, msg.part)] = msg.seq + 1
            if (msg.dtype, msg.numel) != (req.dtype, req.numel):
                await self._p2p_done(req, error=f"recv from rank {msg.origin} ({self.names[msg.origin]}), tag "
                                                f"{req.tag}: it sent {msg.dtype} x {msg.numel}, this rank expects "
                                                f"{req.dtype} x {req.numel}")
                continue
            await self._p2p_done(req, parts=((msg.payload,),), source=msg.origin)

    async def _p2p_done(self, req: CollectiveRequest, parts=(), source: int = -1, error: str | None = None) -> None:
        self.results["failed" if error else "done"] += 1
        if error:
            self.log.error("point_to_point_failed", op=req.op, peer=req.root, tag=req.tag, error=error)
        await self.emit(CollectiveDone(sender=self.ctx.node, time=self.clock.now(), seq=req.seq, handle=req.handle,
                                       parts=parts, source=source, error=error))

    async def _p2p_timeouts(self, now: float) -> None:
        for p in [p for p in self._sends_out if p.deadline <= now]:
            self._sends_out.remove(p)
            who = f"rank {p.req.root} ({self.names[p.req.root]})"
            by = "" if p.hop == p.req.root else f" by rank {p.hop} ({self.names[p.hop]}), the first on its way there,"
            await self._p2p_done(p.req, error=f"send to {who}, tag {p.req.tag}: not acknowledged{by} after "
                                              f"{self.timeout_s:g} s (does its camera read this screen?)")
        for p in [p for p in self._recvs if p.deadline <= now]:
            self._recvs.remove(p)
            src = "any rank" if p.req.root < 0 else f"rank {p.req.root} ({self.names[p.req.root]})"
            await self._p2p_done(p.req, error=f"recv from {src}, tag {p.req.tag}: nothing came within "
                                              f"{self.timeout_s:g} s")

    async def _watchdog(self) -> None:
        period = max(0.05, min(1.0, self.timeout_s / 10))
        while True:
            await self.clock.sleep_until(self.clock.now() + period)
            now = self.clock.now()
            await self._p2p_timeouts(now)
            for pend in [p for p in self._pending.values() if p.deadline <= now]:
                seq = pend.req.seq
                if pend.held:
                    unsure = [r for r in pend.ranks if self._known[r] <= seq]
                    who = ", ".join(f"rank {r} ({self.names[r]})" for r in unsure)
                    await self._fail(pend, f"collective #{seq} ({pend.req.op}) timed out after {self.timeout_s:g} s: "
                                           f"this rank has every part, but {who} never showed that it has them "
                                           "too, so it is not applied here (a rank applies a collective only "
                                           "once every rank has it)")
                    continue
                missing = sorted(pend.ranks[i] for i in pend.plan.waiting_for())
                who = ", ".join(f"rank {r} ({self.names[r]}): "
                                + (f"last transfer {now - self._heard[r]:.1f} s ago" if r in self._heard
                                   else "nothing received yet")
                                for r in missing)
                await self._fail(pend, f"collective #{seq} ({pend.req.op}) timed out after "
                                       f"{self.timeout_s:g} s waiting for {who}")

    def _check_drained(self) -> None:
        """Every transfer posted is acknowledged by its readers, or part of a collective they hold."""
        last = self._next_tid - 1
        if all(self._acks.get(r, transfer.Ack()).has(t) or 0 <= self._collective_of.get(t, -1) < self._known[r]
               for t in range(1, last + 1) for r in range(self.world) if self._dests.get(t, 0) >> r & 1):
            self._drained.set()

    async def _finish_drain(self) -> None:
        self._check_drained()
        log = structlog.get_logger("wccl")
        # Peers may still be reading a long queue: give up only after `timeout_s` without progress.
        seen = dict(self._acks)
        while not self._drained.is_set():
            try:
                async with asyncio.timeout(self._drain.timeout_s):
                    await self._drained.wait()
            except TimeoutError:
                if self._acks == seen:
                    log.warning("drain_incomplete", no_acknowledgement_for_s=self._drain.timeout_s,
                                last_transfer=self._next_tid - 1,
                                acknowledged={self.names[r]: a.cum for r, a in self._acks.items()})
                    break
                seen = dict(self._acks)
        await self.clock.sleep_until(self.clock.now() + LINGER_S)
        if self.on_drained is not None:
            self.on_drained()


REGISTRY.register("actor.collectives", "standard", Collectives)
