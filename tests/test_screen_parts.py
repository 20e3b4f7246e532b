"""A screen partly out of a camera's view: its reader asks for the layout drawn on the part in view
(protocols.layout.PARTS, protocols.adapt), the sender draws it there, and every camera reads it."""

from __future__ import annotations

import asyncio
import json

import numpy as np

from actors.frame_decoder import FrameDecoder
from conftest import make_config, shipped_config_dict
from protocols import adapt, transfer
from protocols.layout import PARTS, GridLayout, render
from protocols.messages import Capture
from wccl.imaging import reader
from wccl.room import SimulatedRoom
from wccl.runtime.actor import ActorContext, Mailbox
from wccl.runtime.timebase import NodeClock

W, H = 1280, 720


def test_a_layout_on_part_of_the_screen_keeps_its_cells_and_sits_against_its_side():
    whole = GridLayout(68, 124, 8, 10)
    left, right, top, half = whole.in_part(1), whole.in_part(2), whole.in_part(3), whole.in_part(5)
    assert (left.rows, left.cols, left.cell_px, left.colours) == (68, 92, 10, 8) == (right.rows, right.cols, 10, 8)
    assert (top.rows, top.cols) == (50, 124) and (half.rows, half.cols) == (68, 61)
    assert left.in_part(0) == whole and whole.in_part(0) is whole
    assert left.words().endswith("on the left 3/4 of the screen") and whole.words() == "68x124 cells of 10 px, 8 colours"
    # drawn against its side of where the whole grid sits: the rest of the screen is black
    lit = [np.flatnonzero(render(b"\x55" * lay.frame_bytes, lay, W, H).max(axis=(0, 2))) for lay in (whole, left, right)]
    assert lit[1][0] == lit[0][0] and lit[1][-1] < 0.8 * W  # left: from the whole grid's left edge
    assert lit[2][-1] == lit[0][-1] and lit[2][0] > 0.2 * W  # right: to its right edge
    # a part too small for a code does not exist
    assert GridLayout(20, 37, 8, 32).in_part(5) is None


def test_an_ask_carries_the_part_beside_the_layout_and_frames_for_several_readers_meet_on_one():
    for k in range(8):
        for part in range(len(PARTS)):
            code = adapt.ask(k, part)
            assert adapt.split(code) == (k, part) and code != transfer.NO_ASK and code < 256
    # the most robust layout any reader asked for, on the part the first one asking for a part asked for
    assert adapt.shared([adapt.ask(1), adapt.ask(0, 5), adapt.ask(2, 2)], 0) == adapt.ask(2, 5)
    assert adapt.shared([], 3) == adapt.ask(3)


def test_a_reader_asks_for_the_part_in_view_and_for_the_whole_again():
    a = adapt.LayoutAdapter(4)
    a.start(1, 0, now=0.0)
    a.outcome(1, True, 0.0)
    assert a.unread_for(1, 2.0) == 2.0 and a.unread_for(3, 2.0) == 0.0
    a.in_view(1, 1)
    [ch] = a.decide(2.0)
    assert (ch.layout, ch.was, ch.part, ch.was_part, ch.why) == (0, 0, 1, 0, "part in view")
    assert a.asked(1) == adapt.ask(0, 1) and a.asks(2, transfer.NO_ASK) == (transfer.NO_ASK, adapt.ask(0, 1))
    a.in_view(1, 1)  # what is asked already: nothing new
    assert a.decide(3.0) == []
    a.in_view(1, 0)
    [back] = a.decide(4.0)
    assert (back.part, back.was_part) == (0, 1) and a.asked(1) == 0


def _room(yaw_change: float):
    """The shipped room (alice, bob, carol), bob's lid turned `yaw_change` degrees further at 2 s and back at 5 s."""
    data = shipped_config_dict()
    bob = next(n for n in data["room"]["nodes"] if n["name"] == "bob")
    yaw = bob["channel"]["yaw_deg"]
    bob["changes"] = [{"at_s": 2.0, "channel": {"yaw_deg": yaw + yaw_change}}, {"at_s": 5.0, "channel": {"yaw_deg": yaw}}]
    cfg = make_config(room=data["room"])
    room = SimulatedRoom.from_config(cfg)
    room.camera_started(0.0)  # (changes count from the cameras' start)
    return cfg, room


def test_a_code_that_runs_out_of_the_image_is_found_cut_on_that_side():
    cfg, room = _room(8.0)
    lay = cfg.link.layout()
    room.show_at("alice", render(bytes(lay.frame_bytes), lay, W, H), 0.0)
    assert reader.cut_codes(room.capture_at("bob", 1.0, k=30), 32) == []
    [cut] = reader.cut_codes(room.capture_at("bob", 3.0, k=90), 32)
    assert cut.side == "right" and cut.bbox[0] + cut.bbox[2] == W


def test_only_a_cut_outline_shaped_and_placed_like_the_code_last_read_asks_for_a_part():
    whole = (645, 322, 488, 276)  # bob's camera read alice's whole grid there (the shipped room)
    nudged = reader.Cut((794, 328, 486, 296), "right")  # the lid nudged 8 degrees: its right runs out
    assert FrameDecoder._part_for(nudged, whole) == 1  # the left 3/4 (about 93 % in view)
    assert FrameDecoder._part_for(reader.Cut((960, 328, 320, 296), "right"), whole) == 5  # 61 % of it: the left 1/2
    assert FrameDecoder._part_for(reader.Cut((1150, 328, 130, 296), "right"), whole) is None  # too little in view
    # a lamp's bright patch at the bottom edge, and a code seen edge-on after a big turn, are not that code
    assert FrameDecoder._part_for(reader.Cut((744, 660, 52, 60), "bottom"), whole) is None
    assert FrameDecoder._part_for(reader.Cut((1180, 300, 100, 150), "right"), whole) is None


async def _nowhere(msg):
    pass


def _decoder(cfg, node: str, listen: bool) -> FrameDecoder:
    ladder = [c for c, _ in cfg.link.ladder_codecs()]
    names = ["alice", "bob"]
    ctx = ActorContext(node, "frame_decoder", NodeClock(), Mailbox(node, 8, "drop_oldest"), _nowhere)
    dec = FrameDecoder(ctx, ladder[0], cfg.room.session, names, transfer.TransferAssembler(), ladder=ladder,
                       listen=listen)
    dec.current = 0  # (the room's layout chosen: the run goes)
    return dec


def test_a_camera_that_sees_part_of_a_screen_asks_for_that_part_and_every_camera_reads_it(_quiet_logs):
    """Bob's lid turns at 2 s and the right of alice's screen leaves his view: no layout reads it whole.
    Within a second his camera asks for the layout on the left 3/4 (the part in view); alice's frames
    drawn there read in bob's camera, and in carol's, who asked for nothing and sees the whole screen. Turned
    back at 5 s, he asks for the whole screen again, and reads it."""
    cfg, room = _room(8.0)
    header = transfer.TransferHeader(cfg.room.session, 0, 5, 1, "grad", "uint8", 3072, 0, b"", 0, 0b10)
    payload = bytes(range(256)) * 12
    bob = carol = None

    async def show(t0: float, t1: float) -> None:
        """Alice shows a transfer for bob in the layout he asks for now (as her ScreenWriter does), a frame every
        100 ms, each captured by bob's and carol's cameras."""
        i, t, codec = 0, t0, None
        while t < t1:
            if codec != bob.layout_of(bob.adapter.asked(0)):
                codec = bob.layout_of(bob.adapter.asked(0))
                out = transfer.outgoing(header, payload, message_bytes=codec.message_bytes, ranks=2)
            room.show_at("alice", render(codec.encode_message(out.message(i % out.source, message_bytes=codec.message_bytes)),
                                         codec.layout, W, H, sender=0, parity=i & 1), t)
            for node, dec in (("bob", bob), ("carol", carol)):
                seq = round(t / 0.1)
                await dec.handle(Capture(sender=node, time=t + 0.05, image=room.capture_at(node, t + 0.05, k=seq),
                                         seq=seq))
            i, t = i + 1, t + 0.1

    async def go():
        nonlocal bob, carol
        bob, carol = _decoder(cfg, "bob", False), _decoder(cfg, "carol", True)
        bob.adapter = adapt.LayoutAdapter(len(bob.ladder))
        bob.adapter.start(0, 0, 0.0)
        def decoded(dec: FrameDecoder, k: int) -> int:  # (a rank's frames of a peer it does not trust yet too)
            return dec.tally[(0, k, "decoded")]

        await show(0.0, 2.0)
        assert decoded(bob, 0) > 10 and decoded(carol, 0) > 10 and bob.adapter.asked(0) == 0
        await show(2.0, 3.5)  # turned: nothing reads, until bob asks for the part in view
        assert bob.adapter.asked(0) == adapt.ask(0, 1)
        assert [e["why"] for e in map(json.loads, _quiet_logs.getvalue().splitlines())
                if e.get("event") == "layout_asked"] == ["part in view"]
        await show(3.5, 5.0)
        assert decoded(bob, adapt.ask(0, 1)) >= 8 and decoded(carol, adapt.ask(0, 1)) >= 8
        was = decoded(bob, 0)
        await show(5.0, 6.5)  # turned back
        assert bob.adapter.asked(0) == 0 and decoded(bob, 0) - was >= 5

    asyncio.run(go())
