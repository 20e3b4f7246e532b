"""Point-to-point messages between two laptops that do not read each other's screens go through laptops
that do: a send from alice to carol, whose camera does not see alice's screen, is shown to bob (bob and
alice read each other, and so do bob and carol) and passed on by him; carol receives it as alice's, in
alice's order. Her answer to alice goes round by bob too: alice reads carol's screen, but carol could
never read alice's acknowledgement.

Three ranks in one virtual-time loop share nothing but an exact room in which carol's camera is kept from
alice's screen (SimulatedRoom.hide): discovery finds that, and the route follows the sight graph it found.
"""

from __future__ import annotations

import asyncio
import zlib

from conftest import make_config, run_virtual

from actors.collectives import Collectives
from protocols import streams, transfer
from protocols.algorithms import Sight
from protocols.messages import CollectiveRequest, Drain, PostTransfer, SendTensor, TensorReceived, TransferArrived
from wccl.runtime.actor import ActorContext, Mailbox
from wccl.runtime.timebase import NodeClock
from wccl.distributed.rank_node import CollectiveNode
from wccl.room import SimulatedRoom

NAMES = ("alice", "bob", "carol")
ROOM3 = {"nodes": [{"name": n, "roles": ["server", "worker"] if i == 0 else ["worker"]} for i, n in enumerate(NAMES)],
         "session": 6, "profile": "exact"}


def test_a_route_takes_the_fewest_hops_over_screens_read_both_ways_then_the_widest():
    both = {(1, 0): 10.0, (0, 1): 10.0, (2, 1): 9.0, (1, 2): 9.0, (3, 0): 10.0, (0, 3): 10.0,
            (2, 3): 1.0, (3, 2): 1.0}  # a square 0-1-2-3-0, the 2-3 side slow
    s = Sight(4, both, 0.1)
    assert s.route(0, 1) == [1]  # direct
    assert s.route(0, 2) == [1, 2]  # two hops either way; through 1, whose edge to 2 is faster
    assert s.route(3, 1) == [0, 1]
    assert s.route(2, 0) == [1, 0]
    one_way = Sight(4, {**both, (2, 0): 50.0}, 0.1)  # 2 reads 0, but 0 does not read 2: no hop
    assert one_way.route(0, 2) == [1, 2] and not one_way.both_ways(0, 2)
    assert Sight(3, {(1, 0): 1.0, (0, 1): 1.0, (2, 0): 1.0}, 0.1).route(0, 2) is None  # 0 never sees 2's acks


def _p2p(node, op: str, seq: int, peer: int, tag: int, data: bytes = b"", numel: int = 0, handle: int = 0):
    return CollectiveRequest(sender=node.node, time=0.0, seq=seq, op=op, dtype="uint8", numel=numel or len(data),
                             inputs=(data,) if data else (), root=peer, tag=tag, ready_at=node.local_clock.now(),
                             handle=handle)


def test_a_send_to_a_camera_that_does_not_read_this_screen_is_relayed():
    cfg = make_config(room=ROOM3, link={"choose": "pinned"})
    first, second, back = bytes(range(256)) * 12, b"second message" * 40, b"straight back" * 10

    async def go():
        room = SimulatedRoom.from_config(cfg)
        room.hide("carol", "alice")  # carol's camera never sees alice's screen
        done: dict[str, list] = {n: [] for n in NAMES}
        nodes = {n: CollectiveNode(cfg.model_copy(deep=True), n, room, timeout_s=30.0, on_done=done[n].append)
                 for n in NAMES}

        async def until(node, handle):
            while not any(m.handle == handle for m in done[node]):
                await asyncio.sleep(0.01)
            return next(m for m in done[node] if m.handle == handle)

        for s in nodes.values():
            s.build()
        async with asyncio.TaskGroup() as tg:
            for s in nodes.values():
                tg.create_task(s.run())
            a, c = nodes["alice"], nodes["carol"]
            # alice: two messages to carol with tag 3; carol: one recv from alice, one from any source
            await a.submit(_p2p(a, "send", 0, 2, 3, first, handle=1))
            await a.submit(_p2p(a, "send", 1, 2, 3, second, handle=2))
            await c.submit(_p2p(c, "recv", 0, 0, 3, numel=len(first), handle=1))
            await c.submit(_p2p(c, "recv", 0, -1, 3, numel=len(second), handle=2))
            await c.submit(_p2p(c, "send", 0, 0, 0, back, handle=3))  # (alice's acks: carol cannot read them)
            await a.submit(_p2p(a, "recv", 0, 2, 0, numel=len(back), handle=3))
            got = {(n, h): await until(n, h) for n, h in (("alice", 1), ("alice", 2), ("carol", 1), ("carol", 2),
                                                          ("carol", 3), ("alice", 3))}
            for n, s in nodes.items():
                await s.submit(Drain(sender=n, time=0.0, timeout_s=5.0))
        return got, {n: s.results for n, s in nodes.items()}

    got, results = run_virtual(go)
    assert all(m.error is None for m in got.values()), {k: m.error for k, m in got.items() if m.error}
    assert got[("carol", 1)].parts == ((first,),) and got[("carol", 1)].source == 0
    assert got[("carol", 2)].parts == ((second,),) and got[("carol", 2)].source == 0
    assert got[("alice", 3)].parts == ((back,),) and got[("alice", 3)].source == 2
    # bob passed on alice's two messages and carol's one (alice reads carol, but carol could never read
    # alice's acknowledgement); nobody else relayed anything
    assert [results[n]["collectives"]["relayed"] for n in NAMES] == [0, 3, 0]
    assert [results[n]["collectives"]["relay_refused"] for n in NAMES] == [0, 0, 0]


def test_a_tensor_of_the_built_in_run_to_a_camera_that_does_not_read_this_screen_is_relayed():
    """The built-in run's tensors (protocols.streams) take the same way as a send: alice's word to bob and
    carol goes to bob, who takes it and passes it on to carol, whose camera does not see alice's screen
    (one transfer on alice's screen for both); carol's answer goes round by bob too. Each arrives as its
    sender's, with its step and state."""
    cfg = make_config(room=ROOM3, link={"choose": "pinned"})

    async def go():
        room = SimulatedRoom.from_config(cfg)
        room.hide("carol", "alice")
        got: dict[str, list[TensorReceived]] = {n: [] for n in NAMES}
        nodes = {n: CollectiveNode(cfg.model_copy(deep=True), n, room, timeout_s=30.0, on_done=lambda _: None)
                 for n in NAMES}
        for n, s in nodes.items():
            async def emit(msg, n=n, plain=s._emit):
                if isinstance(msg, TensorReceived):
                    got[n].append(msg)
                    return
                await plain(msg)
            s._emit = emit
            s.build()
        async with asyncio.TaskGroup() as tg:
            for s in nodes.values():
                tg.create_task(s.run())
            a, c = nodes["alice"], nodes["carol"]
            await a.mailboxes["collectives"].put(SendTensor(sender="alice", step=7, time=0.0, stream="sync",
                                                            to=("bob", "carol"), payload=b"word" * 100, epoch=2,
                                                            base=5))
            await c.mailboxes["collectives"].put(SendTensor(sender="carol", step=8, time=0.0, stream="grad",
                                                            to=("alice",), payload=b"answer" * 50))
            async with asyncio.timeout(30.0):
                while not (got["bob"] and got["carol"] and got["alice"]):
                    await asyncio.sleep(0.05)
            for n, s in nodes.items():
                await s.submit(Drain(sender=n, time=0.0, timeout_s=5.0))
        return got, {n: s.results for n, s in nodes.items()}

    got, results = run_virtual(go)
    word = [("alice", 7, "sync", b"word" * 100, 2, 5)]
    seen = {n: [(m.origin, m.step, m.stream, m.payload, m.epoch, m.base) for m in got[n]] for n in NAMES}
    assert seen == {"alice": [("carol", 8, "grad", b"answer" * 50, 0, 0)], "bob": word, "carol": word}, seen
    assert [results[n]["collectives"]["relayed"] for n in NAMES] == [0, 2, 0]
    assert [results[n]["collectives"]["transfers_posted"] for n in NAMES] == [1, 2, 1]
    assert [results[n]["collectives"]["relay_refused"] for n in NAMES] == [0, 0, 0]


def _four(pairs: list[tuple[int, int]]):
    """Ranks a, b, c, d whose cameras read each other's screens in `pairs` (both ways) and no other: a
    Collectives actor for each, and the messages it emits."""
    sight = Sight(4, {e: 1000.0 for a, b in pairs for e in ((a, b), (b, a))}, 0.1)
    names = ["a", "b", "c", "d"]

    def actor(rank: int):
        out: list = []

        async def emit(msg):
            out.append(msg)
        ctx = ActorContext(node=names[rank], actor="collectives", clock=NodeClock(), inbox=Mailbox("c", 64, "block"),
                           emit=emit)
        return Collectives(ctx, rank, 4, 10.0, names=names, sight=sight), out
    return [actor(r) for r in range(4)]


def _arrive(post: PostTransfer, payload: bytes | None = None) -> TransferArrived:
    """`post` as its reader's camera delivers it (`payload`: other bytes in its place), two frames' worth."""
    return TransferArrived(sender="x", time=0.0, origin="abcd".index(post.sender), tid=post.tid,
                           seq=post.seq, op=post.op, dtype=post.dtype, numel=post.numel, part=post.part,
                           payload=post.payload if payload is None else payload, frames=2)


def test_a_tensor_for_several_ranks_goes_once_to_each_next_laptop_which_takes_it_and_passes_it_on():
    """Rank 0 reads only rank 1's screen, and rank 1 reads ranks 2 and 3 (each both ways): rank 0's tensor for
    1, 2 and 3 goes up once, to rank 1, naming all three; rank 1 takes it and shows it on once to each of 2
    and 3, naming that one."""
    async def go():
        (a, out_a), (b, out_b), _, _ = _four([(0, 1), (1, 2), (1, 3)])
        await a.handle(SendTensor(sender="a", step=3, time=0.0, stream="avg", to=("b", "c", "d"), payload=b"w" * 40,
                                  epoch=1, base=2))
        (post,) = out_a
        await b.handle(_arrive(post))
        return post, out_b

    post, out_b = run_virtual(go)
    assert isinstance(post, PostTransfer) and post.op == "relay_stream" and post.dest == 0b0010
    assert transfer.RELAY_HEAD.unpack_from(post.payload) == (0, 0b1110)
    passed = sorted((m.dest, transfer.RELAY_HEAD.unpack_from(m.payload)) for m in out_b if isinstance(m, PostTransfer))
    assert passed == [(0b0100, (0, 0b0100)), (0b1000, (0, 0b1000))]
    assert all(m.payload[transfer.RELAY_HEAD.size:] == post.payload[transfer.RELAY_HEAD.size:]
               for m in out_b if isinstance(m, PostTransfer))
    (got,) = [m for m in out_b if isinstance(m, TensorReceived)]
    assert (got.origin, got.stream, got.step, got.payload, got.epoch, got.base) == ("a", "avg", 3, b"w" * 40, 1, 2)
    whole = streams.wrap(1, 2, b"w" * 40)  # 46 bytes: one chunk
    assert post.payload[transfer.RELAY_HEAD.size:] == transfer.RELAY_CHUNK.pack(zlib.crc32(whole), 0, 1) + whole


def test_a_tensor_for_ranks_hops_away_goes_in_chunks_each_passed_on_as_it_arrives():
    """a's 4 KB word for c and d (a line a - b - c - d) goes to b in chunks; b passes each on to c the moment
    it has it, and c on to d, before the next arrives (the hops work at once). c and d each hand over the
    whole tensor once its last chunk is in, and only then; b, for whom it is not, hands over nothing."""
    word = bytes(range(256)) * 16

    async def go():
        (a, out_a), (b, out_b), (c, out_c), (d, out_d) = _four([(0, 1), (1, 2), (2, 3)])  # a line
        await a.handle(SendTensor(sender="a", step=5, time=0.0, stream="avg", to=("c", "d"), payload=word,
                                  epoch=1, base=4))
        chunks = [m for m in out_a if isinstance(m, PostTransfer)]
        seen = []
        for post in chunks:
            for actor, out, nxt in ((b, out_b, c), (c, out_c, d)):
                n = len(out)
                await actor.handle(_arrive(post))
                (post,) = [m for m in out[n:] if isinstance(m, PostTransfer)]  # passed on at once
                if nxt is d:
                    seen.append(len([m for m in out_c if isinstance(m, TensorReceived)]))
            await d.handle(_arrive(post))
        return chunks, seen, out_b, out_c, out_d, d.results

    chunks, seen, out_b, out_c, out_d, res = run_virtual(go)
    whole = streams.wrap(1, 4, word)
    assert len(chunks) == 4 and all(m.dest == 0b0010 and m.op == "relay_stream" for m in chunks)  # 4 ranks
    assert b"".join(m.payload[transfer.RELAY_HEAD.size + transfer.RELAY_CHUNK.size:] for m in chunks) == whole
    assert seen == [0, 0, 0, 1]  # c took the tensor with the last chunk, not before
    assert not [m for m in out_b if isinstance(m, TensorReceived)]
    for out in (out_c, out_d):
        (got,) = [m for m in out if isinstance(m, TensorReceived)]
        assert (got.origin, got.stream, got.step, got.payload, got.epoch, got.base) == ("a", "avg", 5, word, 1, 4)
        assert got.frames == 8  # the chunks' frames
    assert res["relay_refused"] == 0


def test_chunks_that_do_not_join_into_their_tensor_are_refused_and_chunks_that_never_complete_are_dropped():
    """A chunk whose bytes were changed (a broken sender: the frames passed the room key's check) makes a
    tensor that fails its CRC-32: refused and counted, never handed over. Tensors whose last chunks never
    come are given up, the oldest first, counted and logged."""
    from actors import collectives

    word = bytes(range(256)) * 16

    async def go():
        (a, out_a), (b, out_b), (c, out_c), (d, out_d) = _four([(0, 1), (1, 2), (2, 3)])  # a line
        await a.handle(SendTensor(sender="a", step=5, time=0.0, stream="avg", to=("b", "c"), payload=word))
        chunks = [m for m in out_a if isinstance(m, PostTransfer)]
        bad = bytearray(chunks[1].payload)
        bad[-1] ^= 1
        for i, post in enumerate(chunks):
            await b.handle(_arrive(post, bytes(bad) if i == 1 else None))
        for step in range(collectives.MAX_PARTIAL_STREAMS + 3):  # only the first chunk of each
            await a.handle(SendTensor(sender="a", step=10 + step, time=0.0, stream="grad", to=("b", "c"),
                                      payload=word))
            await b.handle(_arrive([m for m in out_a if isinstance(m, PostTransfer)][-4]))
        return out_b, b.results, len(b._chunks)

    out_b, res, waiting = run_virtual(go)
    assert not [m for m in out_b if isinstance(m, TensorReceived)]
    assert res["relay_refused"] == 1
    assert waiting == collectives.MAX_PARTIAL_STREAMS and res["relay_chunks_dropped"] == 3
