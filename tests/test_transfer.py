"""The collectives' transfer layer: frame v4, acknowledgements, the screen planner, and two ranks'
nodes moving collectives over a simulated room (in one virtual-time loop, sharing only the room)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import actors  # noqa: F401  (registers the actors)
from conftest import make_config, run_virtual
from protocols import frames, planner, transfer
from protocols.messages import CollectiveRequest, Drain
from protocols.planner import ScreenPlan
from wccl.distributed.rank_node import CollectiveNode
from wccl.room import SimulatedRoom

MSG = 1900


def _header(data: bytes, **kw) -> tuple[transfer.TransferHeader, frames.Transfer]:
    fields = dict(session=7, sender=1, tid=3, seq=11, op="allreduce", dtype="float32", numel=len(data) // 4,
                  length=0, digest=b"", part=0, dest=0b01)
    fields.update(kw)
    out = transfer.outgoing(transfer.TransferHeader(**fields), data, message_bytes=MSG, repair=2, sealed=True)
    return out.header, out.fountain


@settings(max_examples=40, deadline=None)
@given(data=st.binary(min_size=4, max_size=6000).map(lambda b: b[: len(b) // 4 * 4] or b"\0\0\0\0"),
       acks=st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)), min_size=0, max_size=8))
def test_transfer_frames_round_trip(data, acks):
    header, tr = _header(data)
    ack_t = tuple(transfer.Ack(c, m) for c, m in acks)
    asm = transfer.TransferAssembler()
    out = None
    for i in range(len(tr.packets)):
        msg = transfer.frame_message(header, tr, i, message_bytes=MSG, acks=ack_t, shown_us=123)
        assert len(msg) == MSG and transfer.is_transfer_message(msg)
        f = transfer.parse_message(msg)
        assert f.header == header and f.shown_us == 123
        # a rank acknowledged in nothing has no entry (None: no news), nor has a rank beyond the group
        assert f.acks[: len(ack_t)] == tuple(a if a != transfer.Ack() else None for a in ack_t)
        assert all(a is None for a in f.acks[len(ack_t):])
        got = asm.add(f)
        if got is not None and got is not transfer.DUPLICATE:
            out = got
            break
    assert out == data
    assert asm.ack_of(1).has(3) and not asm.ack_of(0).has(3)


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=8, max_size=800), pos=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_a_flipped_bit_is_never_trusted(data, pos, bit):
    header, tr = _header(data[: len(data) // 4 * 4] or b"abcd")
    msg = bytearray(transfer.frame_message(header, tr, 0, message_bytes=MSG, acks=()))
    body = transfer.HEADER_BYTES + len(tr.packets[0]) + frames.CHECK_BYTES
    msg[pos % body] ^= 1 << bit
    with pytest.raises(frames.FrameError):
        transfer.parse_message(bytes(msg))


def test_status_frames_carry_acknowledgements_only():
    acks = (transfer.Ack(5, 0b101), transfer.Ack(0, 0))
    f = transfer.parse_message(transfer.status_message(session=1, sender=0, acks=acks, message_bytes=MSG))
    assert f.header is None and f.acks[:2] == (acks[0], None) and f.packet == b""  # (nothing of rank 1: no entry)


def test_acknowledgement_sets():
    a = transfer.Ack.of({1, 2, 3, 5, 7, 40}, 0)
    assert (a.cum, [t for t in range(1, 45) if a.has(t)]) == (3, [1, 2, 3, 5, 7])  # 40 is past the window
    assert transfer.Ack.of(set(), 9).has(9) and not transfer.Ack.of(set(), 9).has(10)
    asm = transfer.TransferAssembler()
    for tid in (2, 1, 4):
        asm._mark(0, tid)
    assert asm.ack_of(0) == transfer.Ack(2, 0b1) and asm.has(0, 4) and not asm.has(0, 3)


def test_planner_books_by_size_and_loss_and_repairs_until_acknowledged():
    plan = ScreenPlan(loss=0.2, margin=1)
    b1 = plan.book(1, dest=0b10, source=3)  # ceil(3 / 0.8) + 1 = 5
    b2 = plan.book(2, dest=0b10, source=1)  # ceil(1 / 0.8) + 1 = 3
    assert (b1.budget, b2.budget) == (5, 3)
    shown = [plan.next() for _ in range(8)]
    assert shown == [(1, 0), (1, 1), (1, 2), (1, 3), (1, 4), (2, 0), (2, 1), (2, 2)]  # oldest first, to budget
    extra = {plan.next()[0] for _ in range(4)}
    assert extra == {1, 2}  # then fresh repair packets, taking turns
    assert plan.acknowledge(1, transfer.Ack(2, 0)) == [b1, b2]
    assert plan.next() is None and plan.pending == 0
    with pytest.raises(ValueError):
        plan.book(2, dest=1, source=1)  # numbers only grow


def test_a_background_transfer_takes_the_slots_the_others_leave_and_never_starves():
    plan = ScreenPlan(loss=0.0, margin=0)
    snap = plan.book(1, dest=0b10, source=4, background=True)
    assert [plan.next() for _ in range(2)] == [(1, 0), (1, 1)]  # an idle screen: the snapshot goes up
    word = plan.book(2, dest=0b10, source=1)  # a step's word, booked after it, goes first
    assert plan.next() == (2, 0)
    # Unacknowledged, the word keeps the screen (fresh repairs) but the snapshot gets one slot in eight.
    shown = [plan.next()[0] for _ in range(planner.BACKGROUND_EVERY * 2)]
    assert shown.count(1) == 2 and shown[planner.BACKGROUND_EVERY - 2] == 1, shown
    assert plan.acknowledge(1, transfer.Ack.of({2})) == [word]
    assert [plan.next() for _ in range(2)] == [(1, 4), (1, 5)]  # the word is home: the snapshot again
    assert plan.acknowledge(1, transfer.Ack.of({1, 2})) == [snap] and plan.next() is None


def test_an_overheard_transfer_lingers_in_idle_slots_once_its_readers_have_it():
    """A word observers overhear is shown `linger` frames more once its reader has it, in the slots nothing
    else wants, the one shown the fewest times first (then the oldest); a transfer no one overhears leaves at
    once."""
    plan = ScreenPlan(loss=0.0, margin=0)
    old = plan.book(1, dest=0b10, source=1, linger=2)
    assert plan.next() == (1, 0) and plan.acknowledge(1, transfer.Ack.of({1})) == [old]
    assert plan.next() is None and plan.lingering  # acknowledged: nothing is due, but it lingers
    word = plan.book(2, dest=0b10, source=1, linger=3)
    plain = plan.book(3, dest=0b10, source=1)
    assert plan.next_lingering() == (1, 1)  # (the caller asks only when the screen would be idle)
    assert [plan.next() for _ in range(2)] == [(2, 0), (3, 0)]
    assert plan.acknowledge(1, transfer.Ack.of({1, 2, 3})) == [word, plain]
    assert [b.tid for b in plan.bookings] == [1, 2] and plan.pending == 0  # the plain one is gone
    # The word shown once gets its second chance before the old one its third; then the oldest first.
    assert [plan.next_lingering() for _ in range(4)] == [(2, 1), (1, 2), (2, 2), (2, 3)]
    assert plan.lingered == [1, 2] and plan.bookings == [] and not plan.lingering
    assert plan.next_lingering() is None


def test_a_lingering_transfer_takes_turns_with_repairs_that_wait_for_acknowledgements():
    """A screen busy only with repair packets of transfers that used their budget (their readers'
    acknowledgements are on the way) still shows the words observers overhear: they take turns."""
    plan = ScreenPlan(loss=0.0, margin=0)
    word = plan.book(1, dest=0, source=1, linger=2)
    assert plan.next() == (1, 0) and word.done and plan.lingering  # for observers only: had once shown
    part = plan.book(2, dest=0b10, source=1)
    shown = [plan.next() for _ in range(4)]
    assert shown[0] == (2, 0) and shown.count((2, 0)) == 1, shown  # its budget first, then repairs ...
    assert [s for s in shown if s[0] == 1] == [(1, 1), (1, 2)], shown  # ... taking turns with the word
    assert plan.lingered == [1] and not plan.lingering
    assert plan.acknowledge(1, transfer.Ack.of({2})) == [part] and plan.next() is None


def test_a_transfer_for_observers_only_goes_up_in_full_in_its_turn_then_lingers():
    """dest 0 (no rank reads it: shown for observers): each source packet goes up once in its turn, among
    the transfers for ranks, then it lingers in idle slots; a transfer for nobody that nobody overhears is
    refused."""
    plan = ScreenPlan(loss=0.0, margin=0)
    word = plan.book(1, dest=0, source=2, linger=1)
    part = plan.book(2, dest=0b10, source=1)
    assert plan.pending == 2 and [plan.next() for _ in range(3)] == [(1, 0), (1, 1), (2, 0)]
    assert word.done and plan.pending == 1 and plan.lingering
    assert plan.next_lingering() == (1, 2) and plan.lingered == [1] and not plan.lingering
    assert plan.acknowledge(1, transfer.Ack.of({2})) == [part] and plan.next() is None
    with pytest.raises(ValueError, match="at least one reader"):
        plan.book(3, dest=0, source=1)


def test_transfers_whose_acknowledgements_never_come_hold_nothing_up_and_holdings_settle_them():
    """Rank 1's camera does not read rank 1's reader back (a one-way edge of the sight graph): its
    acknowledgements never arrive. The unacknowledged parts take turns with the next part, which still goes
    up within two slots a frame; once rank 1 is known to hold the collective (its holdings, relayed by
    other cameras), its parts are settled and leave the screen. A transfer of no collective is not."""
    plan = ScreenPlan(loss=0.0, margin=0)
    for tid in range(1, 6):  # five parts of collective 0, each shown once, never acknowledged
        plan.book(tid, dest=0b10, source=1, collective=0)
        assert plan.next() == (tid, 0)
    for _ in range(plan.repair_after + 1):
        plan.next()  # every one of them due for a repair from now on
    plan.book(6, dest=0b10, source=3, collective=0)
    shown = [plan.next()[0] for _ in range(6)]
    assert shown.count(6) == 3 and 6 in shown[:2], shown  # its three frames among the repairs, not after them
    other = plan.book(7, dest=0b10, source=1)  # not a collective's (a point-to-point message)
    done = plan.held(1, 1)
    assert [b.tid for b in done] == [1, 2, 3, 4, 5, 6] and [b.tid for b in plan.bookings] == [7]
    assert plan.held(1, 5) == [] and plan.bookings == [other]


def test_the_parts_of_void_collectives_leave_the_screen_and_what_comes_after_goes_up_at_once():
    """The group regrouped while this rank showed the parts of collective 3 (a step's gradient): every rank voids
    collectives before 8, so nobody will take those parts. They leave the screen at once, lingering or not;
    the regroup's broadcast (collective 8) and a message of no collective (the regroup itself, relayed) are
    kept, and the message goes up in the next slot instead of after the void parts' frames."""
    plan = ScreenPlan(loss=0.0, margin=0)
    plan.book(1, dest=0b110, source=6, collective=3)
    plan.book(2, dest=0b100, source=4, collective=3, linger=5)
    assert plan.next() == (1, 0)
    relayed = plan.book(3, dest=0b100, source=1)  # the lead's regroup, passed on
    broadcast = plan.book(4, dest=0b110, source=2, collective=8)
    gone = plan.void(8)
    assert [b.tid for b in gone] == [1, 2] and plan.bookings == [relayed, broadcast]
    assert plan.next() == (3, 0) and plan.next() == (4, 0)
    assert plan.void(8) == []


def test_planner_learns_the_loss_from_acknowledgements():
    plan = ScreenPlan(loss=0.0, margin=0)
    for tid in range(1, 6):
        plan.book(tid, dest=1, source=10)
        for _ in range(22):  # 20 frames to get 10 through, plus the acknowledgement's delay
            plan.next()
        plan.acknowledge(0, transfer.Ack(tid, 0))
    assert 0.3 < plan.loss < 0.5
    assert plan.book(9, dest=1, source=10).budget >= 15


# ---- two ranks over a room, in one process (they share nothing but the room) ------------------

ROOM2 = {"nodes": [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"]}]}


def _run_ranks(profile: str, script, timeout_s: float = 20.0, link: dict | None = None):
    cfg = make_config(room=dict(ROOM2, profile=profile), link=link or {"choose": "pinned"})

    async def go():
        room = SimulatedRoom.from_config(cfg)
        done: dict[str, list] = {"alice": [], "bob": []}
        nodes = {}
        for n in ("alice", "bob"):
            nodes[n] = CollectiveNode(cfg.model_copy(deep=True), n, room, timeout_s=timeout_s,
                                      on_done=done[n].append)
            nodes[n].build()
        async with asyncio.TaskGroup() as tg:
            for s in nodes.values():
                tg.create_task(s.run())
            await script(nodes, done)
            for n, s in nodes.items():
                await s.submit(Drain(sender=n, time=0.0, timeout_s=5.0))
        return nodes, done

    return run_virtual(go)


def _req(node, seq, op, data: bytes, dtype="uint8", root=0, numel=None):
    return CollectiveRequest(sender=node.node, time=0.0, seq=seq, op=op, dtype=dtype,
                             numel=len(data) if numel is None else numel, inputs=(data,), root=root,
                             ready_at=node.local_clock.now(), handle=seq)


async def _until(done, n):
    while sum(len(v) for v in done.values()) < n:
        await asyncio.sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["exact", "webcam"])
def test_two_ranks_all_reduce_and_broadcast_over_the_room(profile):
    async def script(nodes, done):
        a, b = nodes["alice"], nodes["bob"]
        await a.submit(_req(a, 0, "allreduce", b"A" * 3000))
        await asyncio.sleep(0.4)  # bob issues later: alice's transfer waits for him
        await b.submit(_req(b, 0, "allreduce", b"B" * 3000))
        await a.submit(_req(a, 1, "broadcast", b"root!" * 10, root=0))
        await b.submit(_req(b, 1, "broadcast", bytes(50), root=0))
        await a.submit(_req(a, 2, "allreduce", b"", numel=0))
        await b.submit(_req(b, 2, "allreduce", b"", numel=0))
        await _until(done, 6)

    nodes, done = _run_ranks(profile, script)
    for n, other in (("alice", b"B"), ("bob", b"A")):
        by_seq = {m.seq: m for m in done[n]}
        assert all(m.error is None for m in done[n])
        assert by_seq[0].parts == ((b"A" * 3000,), (b"B" * 3000,))
        assert by_seq[1].parts == ((b"root!" * 10,), (b"root!" * 10,))
        assert by_seq[2].parts == ((b"",), (b"",))
    # bob never showed anything for the broadcast; the empty all_reduce sent nothing at all
    assert nodes["bob"].results["collectives"]["transfers_posted"] == 1
    assert nodes["alice"].results["collectives"]["transfers_posted"] == 2


@pytest.mark.slow
def test_a_mismatched_call_fails_on_both_ranks_with_both_calls_named():
    async def script(nodes, done):
        a, b = nodes["alice"], nodes["bob"]
        await a.submit(_req(a, 0, "allreduce", bytes(16), dtype="float32", numel=4))
        await b.submit(_req(b, 0, "allgather", bytes(16), dtype="float32", numel=4))
        await _until(done, 2)

    _, done = _run_ranks("exact", script)
    for n in ("alice", "bob"):
        (m,) = done[n]
        assert m.parts == () and "every rank must issue the same collectives" in m.error
        assert "allreduce" in m.error and "allgather" in m.error


@pytest.mark.slow
def test_a_silent_peer_times_out_with_a_clear_error():
    async def script(nodes, done):
        a = nodes["alice"]
        await a.submit(_req(a, 0, "allreduce", bytes(100)))
        await _until(done, 1)

    _, done = _run_ranks("exact", script, timeout_s=3.0)
    (m,) = done["alice"]
    assert m.parts == () and "timed out after 3 s" in m.error and "rank 1 (bob)" in m.error


def test_a_small_transfer_behind_a_large_one_still_gets_repairs():
    plan = ScreenPlan(loss=0.0, margin=0)
    plan.book(1, dest=1, source=1)
    plan.book(2, dest=1, source=500)
    slots = [plan.next()[0] for _ in range(40)]
    assert slots[0] == 1 and slots.count(1) >= 6  # a repair of the small one every few slots
    assert max(len(run) for run in "".join(map(str, slots)).split("1")) <= plan.repair_after + 1
    plan.acknowledge(0, transfer.Ack(1, 0))
    assert {plan.next()[0] for _ in range(20)} == {2}


def test_every_frame_is_filled_to_look_random_and_its_filler_is_checked():
    # Two status frames that say almost the same (only their shown times differ) differ in nearly every
    # byte: the filler after the check follows the check. A capture of the screen while one replaced the
    # other reads as neither, as it would for two frames of a tensor (discovery measures layouts with them).
    a = transfer.status_message(session=7, sender=1, acks=(), message_bytes=MSG, shown_us=1_000)
    b = transfer.status_message(session=7, sender=1, acks=(), message_bytes=MSG, shown_us=51_000)
    tail = slice(400, None)  # past the header, acknowledgements and discovery table they share
    same = sum(x == y for x, y in zip(a[tail], b[tail]))
    assert same < 0.02 * len(a[tail])  # (random bytes agree 1 time in 256)
    assert transfer.parse_message(a).shown_us == 1_000
    zeroed = bytearray(a)
    zeroed[-40:] = bytes(40)  # the old zero padding, or anything else after the check: refused
    with pytest.raises(frames.FrameError) as e:
        transfer.parse_message(bytes(zeroed))
    assert e.value.reason == "bad_padding"


def test_a_frame_gives_entries_only_to_the_ranks_it_speaks_of_and_takes_turns_when_they_do_not_fit():
    """Eight ranks, frames that acknowledge two of them and ask one: three entries, not eight (the others
    come out None: no news). A transfer cut for frames with room for two entries carries them in turn where
    they do not fit; one whose sender acknowledges five ranks carries as many as fit in each frame, in turn: every rank's goes up within
    three frames (a receiver takes a frame without its entry as no news, protocols.receiver)."""
    acks = (transfer.Ack(),) * 2 + (transfer.Ack(3, 0),) + (transfer.Ack(),) * 4 + (transfer.Ack(1, 1),)
    asks = (transfer.NO_ASK,) * 5 + (2,) + (transfer.NO_ASK,) * 2
    data = bytes(range(200)) * 4
    out = transfer.outgoing(transfer.TransferHeader(session=1, sender=0, tid=1, seq=0, op="allgather",
                                                    dtype="uint8", numel=len(data), length=0, digest=b"", dest=2),
                            data, message_bytes=MSG, ranks=8, present=2, repair=4, sealed=True)
    assert out.fountain.packet_size == transfer.packet_size_for(MSG, 8, 2) > transfer.packet_size_for(MSG, 8)
    union: set[int] = set()
    for i in range(3):
        f = transfer.parse_message(out.message(i, message_bytes=MSG, acks=acks, asks=asks))
        have = {r for r in range(8) if f.acks[r] is not None}
        assert 2 <= len(have) <= 3 and have <= {2, 5, 7}  # (room for two beside the packet, or three)
        assert all(f.asks[r] == asks[r] for r in have) and all(f.asks[r] == transfer.NO_ASK for r in range(8)
                                                                if r not in have)
        union |= have
    assert union == {2, 5, 7} and f.acks[2] in (None, transfer.Ack(3, 0))
    or_two = transfer.parse_message(transfer.frame_message(out.header, out.fountain, 0, message_bytes=MSG,
                                                           acks=acks[:3] + (transfer.Ack(),) * 5))
    assert [r for r in range(8) if or_two.acks[r] is not None] == [2]
    five = tuple(transfer.Ack(10 + r, 0) if r else transfer.Ack() for r in range(6)) + (transfer.Ack(),) * 2
    seen: dict[int, transfer.Ack] = {}
    for i in range(3):
        g = transfer.parse_message(out.message(i, message_bytes=MSG, acks=five))
        got = {r: a for r, a in enumerate(g.acks) if a is not None}
        assert 1 <= len(got) <= 3
        seen.update(got)
    assert seen == {r: transfer.Ack(10 + r, 0) for r in range(1, 6)}


def test_a_transfer_whose_bytes_go_farther_goes_up_first():
    """Three transfers booked in turn, the last with readers that relay it on (priority 2): it goes up
    first, then the others oldest first; one booked later with the same priority waits its turn."""
    from protocols.planner import ScreenPlan

    plan = ScreenPlan(loss=0.0, margin=0)
    plan.book(1, 0b10, 2)
    plan.book(2, 0b10, 2)
    plan.book(3, 0b10, 2, priority=2)
    order = [plan.next()[0] for _ in range(4)]
    plan.book(4, 0b10, 2, priority=2)
    order += [plan.next()[0] for _ in range(2)]
    assert order == [3, 3, 1, 1, 4, 4]  # (then 2, taking turns with repairs of those not yet acknowledged)
    assert 2 in [plan.next()[0] for _ in range(2)]
