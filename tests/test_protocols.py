"""Round trips and rejection of every codec layer in protocols/."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols import cells, fec, frames, layout, link, steps, tensors, transfer
from protocols.security import NO_KEY, RoomKey


@given(colours=st.sampled_from(cells.SUPPORTED_COLOURS), data=st.binary(max_size=400))
def test_cells_round_trip(colours, data):
    n_cells = -(-len(data) * 8 // cells.bits_per_cell(colours)) + 3
    sym = cells.bytes_to_symbols(data, colours, n_cells)
    assert sym.max(initial=0) < colours
    assert cells.symbols_to_bytes(sym, colours, len(data)) == data


def test_cells_reject_overflow_and_bad_colours():
    with pytest.raises(ValueError, match="do not fit"):
        cells.bytes_to_symbols(b"abc", 8, 7)
    with pytest.raises(ValueError, match="colours must be one of"):
        cells.bits_per_cell(16)
    with pytest.raises(ValueError, match="out of range"):
        cells.symbols_to_bytes(np.array([5]), 4)


def test_classify_picks_nearest_palette_colour_with_confidence():
    pal = cells.palette_bgr(8)
    noisy = pal.astype(np.int16) + np.array([20, -20, 10])
    sym, conf = cells.classify(np.clip(noisy, 0, 255), pal)
    assert list(sym) == list(range(8))
    assert (conf > 0.5).all()
    _, conf_mid = cells.classify(np.array([[128, 128, 128]]), pal)
    assert conf_mid[0] < 0.05


frame_args = st.fixed_dictionaries(
    {
        "session": st.integers(0, 0xFFFF),
        "sender": st.integers(0, transfer.MAX_RANKS - 1),
        "stream": st.sampled_from(["grad", "avg", "params", "sync"]),
        "step": st.integers(0, 2**32 - 1),
        "epoch": st.integers(0, 0xFFFF),
        "base": st.integers(0, 2**32 - 1),
        "shown_us": st.integers(-2**63, 2**63 - 1),
        "clock_echo": st.tuples(st.integers(0, 255), st.integers(-2**63, 2**63 - 1), st.integers(-2**63, 2**63 - 1)),
    }
)
MSG = 600


def _parse(m: bytes, key=NO_KEY) -> transfer.TransferFrame:
    return transfer.parse_message(m, key)


@given(half=st.binary(min_size=1, max_size=2500), meta=frame_args, message_bytes=st.integers(250, 1500),
       drop=st.integers(0, 5), seed=st.integers(0, 1000), keyed=st.booleans())
@settings(max_examples=60, deadline=None)
def test_step_frames_round_trip_whatever_frames_are_lost(half, meta, message_bytes, drop, seed, keyed):
    data = half * 2  # a whole bfloat16 tensor for grad/avg
    key = RoomKey(bytes(range(32))) if keyed else NO_KEY
    k = frames.source_packets(len(data) + steps.OVERHEAD, transfer.packet_size_for(message_bytes, 0))
    msgs = steps.frame_messages(data, message_bytes=message_bytes, count=k + drop + 3, key=key, **meta)
    assert all(len(m) == message_bytes for m in msgs)
    keep = np.random.default_rng(seed).permutation(len(msgs))[drop:]  # any `drop` frames lost, any order
    r = steps.StepAssembler(key)
    out = None
    for i in keep:
        f = _parse(msgs[i], key)
        h = f.header
        assert (f.session, f.sender, h.op, h.seq, f.shown_us, f.clock_echo) == (
            meta["session"], meta["sender"], meta["stream"], meta["step"], meta["shown_us"], meta["clock_echo"])
        assert h.numel == len(data) // steps.ITEM_BYTES[h.dtype]
        out = r.add(f) or out
    assert (out.stream, out.step, out.epoch, out.base, out.payload) == (
        meta["stream"], meta["step"], meta["epoch"], meta["base"], data)


def test_too_few_frames_deliver_nothing():
    data = bytes(range(256)) * 20
    k = frames.source_packets(len(data) + steps.OVERHEAD, transfer.packet_size_for(MSG, 0))
    msgs = steps.frame_messages(data, message_bytes=MSG, count=k + 2, session=1, sender=1, stream="grad", step=0)
    r = steps.StepAssembler()
    assert all(r.add(_parse(m)) is None for m in msgs[: k - 1])
    assert r.forget_before(1) == 1 and r.losses["incomplete_tensor"] == 1
    assert r.add(_parse(msgs[k - 1])) is None  # a late frame of a forgotten tensor rebuilds nothing


def test_a_snapshot_is_kept_longer_than_a_gradient():
    r = steps.StepAssembler()
    grad = steps.frame_messages(b"g" * 2000, message_bytes=MSG, count=1, session=1, sender=1, stream="grad", step=5)
    snap = steps.frame_messages(b"p" * 2000, message_bytes=MSG, count=1, session=1, sender=1, stream="params", step=5,
                                run_nonce=1)
    r.add(_parse(grad[0]))
    r.add(_parse(snap[0]))  # (another transfer of the same sender: it numbers them; here both are its first)
    assert r.losses["conflicting_frames"] == 1  # one number, two transfers: neither trusted
    sender = steps.StepSender(1, 1)
    r = steps.StepAssembler()
    for stream in ("grad", "params"):
        head, sealed = sender.transfer(stream, 5, b"x" * 2000)
        psize = transfer.packet_size_for(MSG, 0)
        t = frames.fountain(sealed, message_bytes=MSG, count=1, packet_size=psize)
        r.add(_parse(transfer.frame_message(head, t, 0, message_bytes=MSG, acks=(), run_nonce=sender.run_nonce)))
    assert r.forget_before(7) == 1  # the gradient; the snapshot may still be shown
    assert r.forget_before(5 + steps.SLOW_OPS["params"] + 1) == 1


@given(data=st.binary(min_size=1, max_size=400), pos=st.integers(0, 10_000), flip=st.integers(1, 255))
@settings(max_examples=200)
def test_any_corrupted_byte_of_a_message_is_rejected(data, pos, flip):
    msg = steps.frame_messages(data * 2, message_bytes=900, count=1, session=1, sender=1, stream="grad", step=3)[0]
    end = transfer.header_bytes(0) + transfer.packet_size_for(900, 0) + frames.CHECK_BYTES
    bad = bytearray(msg)
    bad[pos % end] ^= flip  # within header, packet or check
    with pytest.raises(frames.FrameError):
        _parse(bytes(bad))


def test_step_assembler_counts_duplicates_restarts_and_wrong_payloads():
    data = bytes(range(256)) * 10
    msgs = steps.frame_messages(data, message_bytes=MSG, count=8, session=1, sender=2, stream="avg", step=7)
    r = steps.StepAssembler()
    f0 = _parse(msgs[0])
    assert r.add(f0) is None
    assert r.add(f0) is None and r.duplicates == 1
    out = None
    for m in msgs[1:]:
        out = r.add(_parse(m)) or out
    assert out.payload == data
    assert r.add(f0) is None  # a tensor already delivered is not delivered twice
    # The sender started again (a new run nonce): its transfer 1 is a new tensor.
    again = steps.frame_messages(data[::-1], message_bytes=MSG, count=8, session=1, sender=2, stream="avg", step=8,
                                 run_nonce=2)
    out = None
    for m in again:
        out = r.add(_parse(m)) or out
    assert out.payload == data[::-1] and out.step == 8 and r.restarts[2] == 1
    # A collective's transfer, or a tensor whose bytes are not what its header says: never delivered.
    head = transfer.TransferHeader(1, 2, 1, 3, "allreduce", "float32", 1, 0, b"")
    assert steps.StepAssembler().add(transfer.TransferFrame(1, 2, head, b"", transfer.NO_ACKS)) is None
    sender = steps.StepSender(1, 2, run_nonce=5)
    head, sealed = sender.transfer("grad", 1, b"ab" * 100)
    lie = replace(head, numel=99)
    psize = transfer.packet_size_for(MSG, 0)
    t = frames.fountain(sealed, message_bytes=MSG, count=2, packet_size=psize)
    r = steps.StepAssembler()
    assert all(r.add(_parse(transfer.frame_message(lie, t, i, message_bytes=MSG, acks=(), run_nonce=5))) is None
               for i in range(2))
    assert r.losses["bad_step_payload"] == 1


def test_a_step_tensor_sealed_under_another_key_is_never_delivered():
    key, other = RoomKey(bytes(32)), RoomKey(bytes([1] * 32))
    msgs = steps.frame_messages(b"ab" * 300, message_bytes=MSG, count=4, session=1, sender=1, stream="grad", step=1,
                                key=key)
    with pytest.raises(frames.FrameError, match="check_mismatch"):
        _parse(msgs[0], other)
    r = steps.StepAssembler(key)
    assert any(r.add(_parse(m, key)) for m in msgs)
    # Encrypted: the tensor's bytes do not appear in the frames.
    assert all(b"ab" * 8 not in m for m in msgs)


def test_frame_errors_have_reasons():
    good = steps.frame_messages(b"hello!", message_bytes=300, count=1, session=1, sender=1, stream="sync", step=0)[0]
    with pytest.raises(frames.FrameError) as e:
        _parse(b"\x00" + good[1:])
    assert e.value.reason == "bad_magic"
    with pytest.raises(frames.FrameError) as e:
        _parse(good[:10])
    assert e.value.reason == "short_frame"
    bad = bytearray(good)
    bad[30] ^= 1
    with pytest.raises(frames.FrameError) as e:
        _parse(bytes(bad))
    assert e.value.reason == "check_mismatch"


@given(rate=st.sampled_from([0.5, 0.7, 0.8, 0.9, 1.0]), frame_bytes=st.integers(40, 3000), seed=st.integers(0, 99))
@settings(max_examples=40, deadline=None)
def test_reed_solomon_corrects_below_capacity_and_never_miscorrects_silently(rate, frame_bytes, seed):
    code = fec.FrameCode(frame_bytes, rate)
    rng = np.random.default_rng(seed)
    msg = rng.integers(0, 256, code.capacity, dtype=np.uint8).tobytes()
    frame = code.encode(msg)
    assert len(frame) == frame_bytes
    assert code.decode(frame) == (msg, 0)
    if not code.nsym:
        return
    # Below capacity: t errors and s erasures per block with 2t + s <= nsym, all corrected.
    order = code._order()
    bad = np.frombuffer(frame, np.uint8).copy()
    erasures = np.zeros(frame_bytes, bool)
    t = code.nsym // 4
    s = code.nsym - 2 * t
    for b in range(code.blocks):
        pos = rng.choice(order[b], t + s, replace=False)
        bad[pos] ^= rng.integers(1, 256, len(pos), dtype=np.uint8)
        erasures[pos[t:]] = True
    out, corrected = code.decode(bad.tobytes(), erasures)
    assert out == msg and corrected == code.blocks * (t + s)


def test_link_codec_detects_what_it_cannot_correct():
    """Far above capacity: RS fails or the check catches a miscorrection; never a wrong packet."""
    g = layout.GridLayout(38, 40, 4, 4)
    codec = link.LinkCodec(g, 0.8)
    data = bytes(range(60))
    assert codec.frames_needed(len(data) + steps.OVERHEAD) == 1
    sym = cells.bytes_to_symbols(codec.encode(data, count=1, session=1, sender=1, stream="grad", step=1)[0],
                                 4, g.n_data)
    rng = np.random.default_rng(1)
    outcomes = {"corrected": 0, "detected": 0}
    for trial in range(200):
        noisy = sym.copy()
        n = int(rng.integers(1, g.n_data // 3))
        idx = rng.choice(g.n_data, n, replace=False)
        noisy[idx] = (noisy[idx] + rng.integers(1, 4, n)) % 4
        try:
            p, _ = codec.decode(noisy)
        except (fec.UncorrectableFrame, frames.FrameError):
            outcomes["detected"] += 1
            continue
        assert steps.StepAssembler().add(p).payload == data  # whatever is accepted is exactly right
        outcomes["corrected"] += 1
    assert outcomes["corrected"] > 10 and outcomes["detected"] > 10


def test_link_codec_round_trip_with_erasures():
    g = layout.GridLayout(40, 70, 8, 16)
    codec = link.LinkCodec(g, 0.8)
    data = bytes(range(256)) * 5
    msgs = codec.encode(data, count=codec.frames_needed(len(data) + steps.OVERHEAD), session=3, sender=1,
                        stream="avg", step=2)
    r = steps.StepAssembler()
    out = None
    for m in msgs:
        sym = cells.bytes_to_symbols(m, 8, g.n_data)
        conf = np.ones(g.n_data, np.float32)
        conf[::60] = 0.0  # doubtful cells become erasures...
        sym[::60] ^= 5  # ...and are indeed wrong
        p, wrong = codec.decode(sym, conf)
        assert wrong == len(sym[::60])
        out = r.add(p) or out
    assert out.payload == data


def test_render_and_layout_geometry():
    g = layout.GridLayout(rows=8, cols=24, colours=4, cell_px=3)
    roles = g.roles
    assert (roles == layout.SENDER).sum() == 2 * layout.SENDER_BITS
    assert (roles == layout.MARK).sum() == (roles == layout.ANTI).sum() == 2 * len(g.parity_rows)
    assert g.frame_bytes == g.n_data * 2 // 8 and g.n_data == (roles == layout.DATA).sum()
    img = layout.render(bytes(range(g.frame_bytes)), g, 96, 48, sender=5, parity=1)
    assert img.shape == (48, 96, 3) and img.dtype == np.uint8
    grid = layout.render_cells(bytes(g.frame_bytes), g, sender=5, parity=1)
    assert (grid[0] == 255).all() and (grid[:, 0] == 255).all()  # the white locator ring
    flat = grid[1:-1, 1:-1].reshape(-1, 3)
    assert (flat[g.index(layout.MARK)] == 255).all() and (flat[g.index(layout.ANTI)] == 0).all()
    bits = (flat[g.index(layout.SENDER)][:, 0] > 0).astype(int)
    assert list(bits[:8]) == [0, 0, 0, 0, 0, 1, 0, 1] and list(bits[8:]) == list(bits[:8])
    with pytest.raises(ValueError, match="needs"):
        layout.GridLayout(40, 70, 8, 16).check_fits(640, 480)


@given(values=st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=100))
def test_bf16_bytes_round_trip(values):
    t = torch.tensor(values, dtype=torch.float32).to(torch.bfloat16)
    back = tensors.bytes_to_bf16(tensors.bf16_to_bytes(t), len(values))
    assert torch.equal(back.view(torch.int16), t.view(torch.int16))


def test_bf16_bytes_checks():
    with pytest.raises(TypeError):
        tensors.bf16_to_bytes(torch.zeros(3))
    with pytest.raises(ValueError):
        tensors.bytes_to_bf16(b"abc")
    with pytest.raises(ValueError, match="expected 4"):
        tensors.bytes_to_bf16(b"ab", 4)
