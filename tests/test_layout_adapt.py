"""While the run goes, each reader asks each screen it reads for a layout (protocols.adapt): down when reads
fall, up when they have been good, back down when a denser try fails; the asks ride in every frame; a
sender shows each transfer in the most robust layout its readers asked for, cut again when that changes."""

from __future__ import annotations

import pytest

from protocols import adapt, discovery, frames, planner, transfer
from protocols.adapt import LayoutAdapter

MSG = 1900


def _feed(a: LayoutAdapter, sender: int, read: float, t0: float, t1: float, fps: float = 30.0):
    """Captures of `sender`'s screen from t0 until t1 or the first change asked, a share `read` of them read:
    (the change or None, the time it stopped)."""
    n, t = 0, t0
    while t < t1:
        n += 1
        a.outcome(sender, int(n * read) != int((n - 1) * read), t)
        changes = a.decide(t)
        if changes:
            assert len(changes) == 1
            return changes[0], t
        t += 1.0 / fps
    return None, t


def test_reads_that_fall_ask_for_the_next_more_robust_layout_once_the_sender_had_time_to_switch():
    a = LayoutAdapter(5)
    a.start(0, 1, now=0.0, best=1)  # (no denser than the start: it only falls)
    assert _feed(a, 0, 0.9, 0.0, 20.0)[0] is None
    down, t = _feed(a, 0, 0.1, 20.0, 30.0)
    assert (down.layout, down.was, down.why) == (2, 1, "worse") and down.share < adapt.DOWN_BELOW
    assert t - 20.0 < adapt.WINDOW_S  # the window's share fell under the line within it
    # the next ask waits until the sender had time to switch and the new layout was judged
    again, t2 = _feed(a, 0, 0.1, t, t + 10.0)
    assert again.layout == 3 and t2 - t >= adapt.SETTLE_S
    # at the ladder's last layout it stays
    last, t3 = _feed(a, 0, 0.0, t2, t2 + 10.0)
    assert last.layout == 4 and _feed(a, 0, 0.0, t3, t3 + 30.0)[0] is None
    assert a.asks(3, transfer.NO_ASK) == (4, transfer.NO_ASK, transfer.NO_ASK)


def test_a_screen_not_found_changes_nothing():
    a = LayoutAdapter(4)
    a.start(2, 0, now=0.0)
    assert a.decide(30.0) == [] and a.asked(2) == 0  # no captures of it at all: a hand, not a layout


def test_good_reads_try_a_denser_layout_and_a_failed_try_waits_twice_as_long():
    a = LayoutAdapter(4)
    a.start(1, 2, now=0.0, best=0)
    up, t = _feed(a, 1, 1.0, 0.0, 60.0)
    assert (up.layout, up.why) == (1, "better") and t >= adapt.SETTLE_S + adapt.UP_AFTER_S
    back, t = _feed(a, 1, 0.0, t, t + 10.0)
    assert (back.layout, back.was, back.why) == (2, 1, "back")
    # the next try comes after twice the wait
    up2, t2 = _feed(a, 1, 1.0, t, t + 60.0)
    assert up2.layout == 1 and t2 - t >= adapt.SETTLE_S + 2 * adapt.UP_AFTER_S
    # a try that holds stays
    assert _feed(a, 1, 1.0, t2, t2 + adapt.SETTLE_S + adapt.PROBE_S + 1.0)[0] is None and a.asked(1) == 1


def test_a_denser_try_whose_frames_never_read_goes_back_however_idle_the_screen_is_between_them():
    """Four captures in five of an idle screen between transfers: in view, read as idle, but no measure of
    the layout. The try's frames (one capture in five) never read, so it goes back after settling; idle
    stretches longer than LOST_S are a screen in view, not one found again."""
    a = LayoutAdapter(4)
    a.start(1, 2, now=0.0, best=0)
    up, t = _feed(a, 1, 1.0, 0.0, 60.0)
    assert (up.layout, up.why) == (1, "better")
    n, back = 0, None
    while back is None and n < 300:
        n += 1
        t += 1 / 30
        a.outcome(1, None if n % 5 else False, t)  # (counted as read, the share would be 80 %: kept)
        back = (a.decide(t) or [None])[0]
    assert back is not None and (back.layout, back.why) == (2, "back") and back.share == 0.0
    start = t
    for i in range(60):  # two seconds of an idle screen, then reads: no "found again" ask
        a.outcome(1, None, start + i / 30)
        assert a.decide(start + i / 30) == []
    assert _feed(a, 1, 1.0, start + 2.0, start + 5.0)[0] is None and a.asked(1) == 2


def test_a_screen_found_again_after_it_was_gone_is_asked_for_its_last_good_layout_at_once():
    """A lid turned away and back: the screen reads badly on its way out (the ask falls), is gone for a
    while, and once found again is asked for the layout it read well in before, not climbed back to."""
    a = LayoutAdapter(5)
    a.start(0, 0, now=0.0)
    assert _feed(a, 0, 1.0, 0.0, 5.0)[0] is None
    down, t = _feed(a, 0, 0.0, 5.0, 10.0)
    assert down.layout == 1
    down, t = _feed(a, 0, 0.0, t, t + 10.0)
    assert down.layout == 2
    back, t2 = _feed(a, 0, 0.5, t + 20.0, t + 30.0)  # (20 s without a capture of it)
    assert (back.layout, back.was, back.why) == (0, 2, "found again") and t2 - (t + 20.0) < 0.1
    assert _feed(a, 0, 1.0, t2, t2 + 5.0)[0] is None and a.asked(0) == 0
    # found all along but read in no layout (part of it out of view) for long after the last ask, then read:
    # the same
    down, t = _feed(a, 0, 0.0, t2, t2 + 10.0)
    assert down.layout == 1
    _, t = _feed(a, 0, 0.0, t, t + 1.2)
    down, t = _feed(a, 0, 0.0, t, t + 10.0)
    assert down.layout == 2
    back, t = _feed(a, 0, 1.0, t + 20.0, t + 30.0)
    assert (back.layout, back.was, back.why) == (0, 2, "found again")


def test_a_screen_found_again_goes_back_to_the_layout_it_started_in_even_if_it_never_read_well_enough_to_climb():
    a = LayoutAdapter(4)
    a.start(0, 0, now=0.0)
    _feed(a, 0, 0.8, 0.0, 5.0)  # (a room whose captures read 80 %: never UP_ABOVE)
    down, t = _feed(a, 0, 0.0, 5.0, 10.0)
    assert down.layout == 1
    back, _ = _feed(a, 0, 0.8, t + 10.0, t + 20.0)
    assert (back.layout, back.why) == (0, "found again")


def test_a_screen_coming_back_into_view_is_not_judged_on_the_way_in():
    """Captures of a lid turning back (found at the edge of the view, not read) ask for nothing."""
    a = LayoutAdapter(4)
    a.start(0, 0, now=0.0)
    _feed(a, 0, 1.0, 0.0, 5.0)
    assert _feed(a, 0, 0.0, 15.0, 15.0 + adapt.SETTLE_S - 0.05)[0] is None  # (10 s without a capture)
    assert _feed(a, 0, 1.0, 16.0, 30.0)[0] is None and a.asked(0) == 0


def test_reads_that_come_back_after_an_ask_are_the_asks_doing_not_a_screen_found_again():
    """A lamp: the screen reads in no layout until the ask for a more robust one takes effect; it then stays
    there (a denser try comes only after good reads for a while)."""
    a = LayoutAdapter(4)
    a.start(0, 0, now=0.0)
    _feed(a, 0, 1.0, 0.0, 5.0)
    down, t = _feed(a, 0, 0.0, 5.0, 10.0)
    assert down.layout == 1
    _, t = _feed(a, 0, 0.0, t, t + adapt.SETTLE_S - 0.1)  # (the sender switches: nothing reads meanwhile)
    assert _feed(a, 0, 1.0, t, t + adapt.UP_AFTER_S)[0] is None and a.asked(0) == 1


def test_the_densest_asked_is_the_densest_start_up_read():
    a = LayoutAdapter(4)
    a.start(0, 3, now=0.0, best=2)
    up, t = _feed(a, 0, 1.0, 0.0, 60.0)
    assert up.layout == 2 and _feed(a, 0, 1.0, t, t + 120.0)[0] is None and a.asked(0) == 2
    with pytest.raises(ValueError):
        a.start(0, 4, now=0.0)


def test_every_frame_carries_the_layouts_its_sender_asks_of_each_rank():
    out = transfer.outgoing(transfer.TransferHeader(7, 1, 3, 11, "allreduce", "float32", 4, 0, b"", 0, 0b01),
                            b"abcd" * 40, message_bytes=MSG, repair=2, sealed=True)
    f = transfer.parse_message(out.message(0, message_bytes=MSG, asks=(2, transfer.NO_ASK, 0)))
    assert f.asks[:3] == (2, transfer.NO_ASK, 0) and set(f.asks[3:]) == {transfer.NO_ASK}
    s = transfer.parse_message(transfer.status_message(session=7, sender=0, acks=(), asks=(transfer.NO_ASK, 5),
                                                       message_bytes=MSG))
    assert s.asks[:2] == (transfer.NO_ASK, 5)
    assert transfer.parse_message(out.message(0, message_bytes=MSG)).asks == (transfer.NO_ASK,) * transfer.MAX_RANKS


def test_a_transfer_cut_again_for_another_layout_is_rebuilt_from_its_new_packets_alone():
    header = transfer.TransferHeader(7, 1, 3, 11, "allreduce", "float32", 1000, 0, b"", 0, 0b01)
    data = bytes(range(256)) * 16
    small, big = (transfer.outgoing(header, data, message_bytes=m, repair=4) for m in (700, 1900))
    assert small.header == big.header and small.fountain.packet_size != big.fountain.packet_size
    asm = transfer.TransferAssembler()
    assert asm.add(transfer.parse_message(big.message(0, message_bytes=1900))) is None
    got = None
    for i in range(len(small.fountain.packets)):
        got = asm.add(transfer.parse_message(small.message(i, message_bytes=700)))
        if got is not None:
            break
    assert got == data and asm.recut == 1 and not asm.losses


def test_a_recut_booking_is_shown_from_its_first_packet_with_a_new_budget():
    plan = planner.ScreenPlan(loss=0.0, margin=1)
    plan.book(1, 0b10, 4)
    assert [plan.next() for _ in range(3)] == [(1, 0), (1, 1), (1, 2)]
    plan.recut(1, 9)
    assert plan.next() == (1, 0) and plan.bookings[0].budget == 10
    with pytest.raises(KeyError):
        plan.recut(2, 3)


@pytest.mark.slow
def test_a_lamp_that_takes_the_layouts_edge_away_mid_run_costs_a_few_steps_not_the_rest(_quiet_logs):
    """The default room with a lamp switched on over bob's laptop 6 s in (rooms/lamp.toml's, sooner): bob's
    camera stops reading alice's frames in the layout start-up chose, asks her for a more robust one, she
    shows him her frames in it, and every step is applied, the replicas and the observer identical. (12
    steps from 4.2 s, about 0.45 s apart: about 5 before the lamp, the rest, at least 4, after alice switched.)"""
    import json
    import tomllib
    from pathlib import Path

    from conftest import ROOT, run_room
    from wccl.config import parse_config

    data = tomllib.loads((ROOT / "rooms" / "lamp.toml").read_text())
    bob = next(n for n in data["room"]["nodes"] if n["name"] == "bob")
    bob["changes"][0]["at_s"] = 6.0
    data["training"] = {"steps": 12, "eval_every": 0}
    data["logging"] = {"level": "info", "format": "json"}
    result = run_room(parse_config(data, "lamp-sooner", Path(ROOT)))
    events = [json.loads(line) for line in _quiet_logs.getvalue().splitlines()]
    asked = [e for e in events if e["event"] == "layout_asked"]
    assert asked and asked[0]["direction"] == "alice -> bob" and asked[0]["why"] == "worse", asked
    assert asked[0]["t"] > 6.0 and asked[0]["was"].startswith("68x124 cells of 10 px")
    shown = [e for e in events if e["event"] == "layout_used" and e.get("reader") == "bob"]
    assert shown and shown[0]["node"] == "alice" and shown[0]["was"].startswith("68x124 cells of 10 px")
    # the run went on in the new layout: bob applied several steps after alice switched
    after = [e for e in events if e["event"] == "step_applied" and e["node"] == "bob" and e["t"] > shown[0]["t"]]
    assert len(after) >= 4, after
    observed = [e for e in events if e["event"].startswith("observer_") and e["event"] != "observer_step"]
    assert result["applied"] == 12 and result["replicas_identical"] and result["observer_identical"], \
        ({k: result[k] for k in ("applied", "replicas_identical", "observer_identical", "observer_applied")}, observed)


def test_a_status_frame_says_what_adapt_says_only_where_it_leaves_room_for_a_row():
    """Start-up's status frames (no asks yet) are as small as ever: the ladder's big cells still hold a
    row of six ranks' table. Once asks are given, a status frame carries them where a row still fits."""
    rows = tuple(discovery.Row(1 + r, discovery.FINAL, 0, 0) for r in range(6))
    asks = (transfer.NO_ASK,) + (2,) * 5  # rank 0 asks each of the five others (each then has an entry)
    tight = transfer.header_bytes(6, status=True) + frames.CHECK_BYTES + transfer.status_packet(7, 1, 6)
    f = transfer.parse_message(transfer.status_message(session=1, sender=0, acks=(), rows=rows, layouts=7,
                                                       message_bytes=tight, asks=asks, showing=0b1))
    assert f.asks == (transfer.NO_ASK,) * transfer.MAX_RANKS and f.showing == 0 and f.rows[0].version == 1
    roomy = tight + transfer.adapt_bytes(6)
    f = transfer.parse_message(transfer.status_message(session=1, sender=0, acks=(), rows=rows, layouts=7,
                                                       message_bytes=roomy, asks=asks, showing=0b110))
    assert f.asks[:6] == asks and f.showing == 0b110 and f.rows[0].version == 1
    pages = transfer.StatusPages()
    assert [pages.first(roomy, 6, 6, 7, adapt=True) for _ in range(3)] == [0, 1, 2]


def test_a_denser_layout_that_carries_less_is_never_asked_for():
    """A big room's ladder where layout 1 (finer cells held longer) carries less than layout 2: a screen
    read well in layout 2 is asked for layout 0 once it has been good a while, never for layout 1; with
    layout 0 out of reach (start-up read it only in 1 and 2), it stays in 2."""
    rates = (9000.0, 2000.0, 3000.0, 1000.0)
    a = LayoutAdapter(4, rates)
    a.start(1, 2, 0.0, best=0)
    asked = []
    for i in range(1, 60 * 30):
        t = i / 30
        a.outcome(1, True, t)
        asked += [c.layout for c in a.decide(t)]
    assert asked and asked[0] == 0 and 1 not in asked, asked
    b = LayoutAdapter(4, rates)
    b.start(1, 2, 0.0, best=1)
    for i in range(1, 60 * 30):
        b.outcome(1, True, i / 30)
        assert b.decide(i / 30) == []
    assert b.asked(1) == 2
