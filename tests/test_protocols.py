"""Round trips and rejection of every codec layer in protocols/."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols import cells, fec, frames, layout, link, streams, transfer
from protocols.security import NO_KEY, TAG_BYTES, RoomKey


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


stream_args = st.fixed_dictionaries(
    {
        "session": st.integers(0, 0xFFFF),
        "sender": st.integers(0, transfer.MAX_RANKS - 1),
        "stream": st.sampled_from(streams.STREAMS),
        "step": st.integers(0, 2**32 - 1),
        "epoch": st.integers(0, 0xFFFF),
        "base": st.integers(0, 2**32 - 1),
        "run_nonce": st.integers(0, 2**64 - 1),
        "tid": st.integers(1, 2**32 - 1),
    }
)
CODEC = link.LinkCodec(layout.GridLayout(40, 70, 8, 16), 0.8)
LAYOUTS = [layout.GridLayout(24, 40, 8, 10), layout.GridLayout(38, 40, 4, 4), CODEC.layout]


def _symbols(fb: bytes, codec: link.LinkCodec = CODEC) -> np.ndarray:
    return cells.bytes_to_symbols(fb, codec.layout.colours, codec.layout.n_data)


def _read(fb: bytes, codec: link.LinkCodec = CODEC, key=NO_KEY) -> transfer.TransferFrame:
    """A frame's bytes (LinkCodec.encode) read back as its cells: corrected, checked and parsed."""
    return codec.decode(_symbols(fb, codec), key=key)[0]


def _message(fb: bytes, codec: link.LinkCodec = CODEC) -> bytes:
    """A frame's corrected message, not checked yet."""
    return codec.decode_message(_symbols(fb, codec))[0]


def _parse(m: bytes, key=NO_KEY) -> transfer.TransferFrame:
    return transfer.parse_message(m, key)


def _delivered(asm: transfer.TransferAssembler, f: transfer.TransferFrame, key=NO_KEY) -> bytes | None:
    got = asm.add(f, key)
    return got if isinstance(got, bytes) else None


@given(data=st.binary(min_size=1, max_size=3000), meta=stream_args, grid=st.sampled_from(LAYOUTS),
       drop=st.integers(0, 5), seed=st.integers(0, 1000), keyed=st.booleans())
@settings(max_examples=60, deadline=None)
def test_stream_tensors_round_trip_whatever_frames_are_lost(data, meta, grid, drop, seed, keyed):
    codec = link.LinkCodec(grid, 0.8)
    key = RoomKey(bytes(range(32))) if keyed else NO_KEY
    k = codec.frames_needed(len(data) + streams.OVERHEAD + (TAG_BYTES if keyed else 0))
    fbs = codec.encode(data, count=k + drop + 3, key=key, **meta)
    assert all(len(fb) == grid.frame_bytes for fb in fbs)
    keep = np.random.default_rng(seed).permutation(len(fbs))[drop:]  # any `drop` frames lost, any order
    asm = transfer.TransferAssembler()
    out = None
    for i in keep:
        f = _read(fbs[i], codec, key)
        h = f.header
        assert (f.session, f.sender, f.run_nonce, h.op, h.seq, h.tid, h.dtype, h.numel, h.dest) == (
            meta["session"], meta["sender"], meta["run_nonce"], meta["stream"], meta["step"], meta["tid"], "uint8",
            len(data) + streams.OVERHEAD, 0)
        out = out or _delivered(asm, f, key)
    assert streams.unwrap(out) == (meta["epoch"], meta["base"], data)
    assert asm.has(meta["sender"], meta["tid"])


def test_too_few_frames_deliver_nothing():
    data = bytes(range(256)) * 20
    k = CODEC.frames_needed(len(data) + streams.OVERHEAD)
    fbs = CODEC.encode(data, count=k + 2, session=1, sender=1, stream="grad", step=0)
    asm = transfer.TransferAssembler()
    assert all(asm.add(_read(fb)) is None for fb in fbs[: k - 1])
    assert asm.forget(lambda seq, op: seq < 1) == 1 and asm.losses["incomplete_tensor"] == 1
    assert asm.add(_read(fbs[k - 1])) is transfer.DUPLICATE  # a late frame of a forgotten tensor rebuilds nothing


def test_two_transfers_claiming_one_number_are_neither_trusted():
    asm = transfer.TransferAssembler()
    grad = CODEC.encode(b"g" * 2000, count=3, session=1, sender=1, stream="grad", step=5)
    snap = CODEC.encode(b"p" * 2000, count=3, session=1, sender=1, stream="params", step=5)  # its tid 1 too
    assert asm.add(_read(grad[0])) is None and asm.add(_read(snap[0])) is None
    assert asm.losses["conflicting_frames"] == 1
    assert not any(_delivered(asm, _read(fb)) for fb in (grad[1], snap[1]))


@given(data=st.binary(min_size=1, max_size=400), pos=st.integers(0, 10_000), flip=st.integers(1, 255))
@settings(max_examples=200)
def test_any_corrupted_byte_of_a_message_is_rejected(data, pos, flip):
    msg = _message(CODEC.encode(data, count=1, session=1, sender=1, stream="grad", step=3)[0])
    end = transfer.header_bytes(0) + CODEC.packet_size(0) + frames.CHECK_BYTES
    bad = bytearray(msg)
    bad[pos % end] ^= flip  # within header, packet or check
    with pytest.raises(frames.FrameError):
        _parse(bytes(bad))


def test_an_assembler_counts_duplicates_and_forgets_a_sender_that_started_again():
    data = bytes(range(256)) * 10
    fbs = CODEC.encode(data, count=8, session=1, sender=2, stream="avg", step=7)
    asm = transfer.TransferAssembler()
    f0 = _read(fbs[0])
    assert asm.add(f0) is None
    assert asm.add(f0) is None and asm.duplicates == 1
    out = None
    for fb in fbs[1:]:
        out = out or _delivered(asm, _read(fb))
    assert streams.unwrap(out) == (0, 0, data)
    assert asm.add(f0) is transfer.DUPLICATE  # a tensor already delivered is not delivered twice
    # The sender started again (a listener sees its run nonce change): its transfer 1 is a new tensor.
    asm.forget_sender(2)
    out = None
    for fb in CODEC.encode(data[::-1], count=8, session=1, sender=2, stream="avg", step=8, run_nonce=2):
        out = out or _delivered(asm, _read(fb))
    assert streams.unwrap(out) == (0, 0, data[::-1])
    with pytest.raises(streams.StreamError):
        streams.unwrap(b"abc")  # too short for the envelope: never a tensor


def test_a_stream_tensor_whose_header_lies_is_never_delivered():
    key = RoomKey(bytes(32))
    payload = streams.wrap(0, 0, b"ab" * 300)
    true = transfer.TransferHeader(1, 1, 1, 1, "grad", "uint8", len(payload), 0, b"")
    tr = transfer.outgoing(true, payload, message_bytes=CODEC.message_bytes, ranks=0, key=key, run_nonce=5,
                           count=3).fountain
    # The seal covers the header: the bytes open only under the header they were sealed with.
    lie = replace(true, numel=99, length=tr.length, digest=tr.digest)
    asm = transfer.TransferAssembler()
    for i in range(3):
        msg = transfer.frame_message(lie, tr, i, message_bytes=CODEC.message_bytes, run_nonce=5, key=key)
        assert _delivered(asm, _parse(msg, key), key) is None
    assert asm.losses["payload_not_authentic"] >= 1 and not asm.has(1, 1)


def test_a_stream_tensor_sealed_under_another_key_is_never_delivered():
    key, other = RoomKey(bytes(32)), RoomKey(bytes([1] * 32))
    fbs = CODEC.encode(b"ab" * 300, count=4, session=1, sender=1, stream="grad", step=1, key=key)
    with pytest.raises(frames.FrameError, match="check_mismatch"):
        _read(fbs[0], key=other)
    asm = transfer.TransferAssembler()
    assert any(_delivered(asm, _read(fb, key=key), key) for fb in fbs)
    # Encrypted: the tensor's bytes do not appear in the frames' messages.
    assert all(b"ab" * 8 not in _message(fb) for fb in fbs)


def test_frame_errors_have_reasons():
    good = _message(CODEC.encode(b"hello!", count=1, session=1, sender=1, stream="sync", step=0)[0])
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
    # A flag this version does not define (0x02: entries other than acknowledgements and holdings), with a
    # check that vouches for it: refused all the same.
    end = transfer.header_bytes(0) + CODEC.packet_size(0)
    flagged = bytearray(good)
    flagged[5] |= 0x02
    check = NO_KEY.check(bytes(flagged[:end]), transfer.PERSON)
    flagged[end:] = check + transfer.filler(check, len(flagged) - end - frames.CHECK_BYTES)
    with pytest.raises(frames.FrameError) as e:
        _parse(bytes(flagged))
    assert e.value.reason == "bad_flags"


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
    # Below capacity: t errors and s doubtful bytes (erasures) per block with 2t + s <= nsym, all corrected.
    order = code._order()
    bad = np.frombuffer(frame, np.uint8).copy()
    confidence = np.ones(frame_bytes, np.float32)
    t = code.nsym // 4
    s = code.nsym // 2
    for b in range(code.blocks):
        pos = rng.choice(order[b], t + s, replace=False)
        bad[pos] ^= rng.integers(1, 256, len(pos), dtype=np.uint8)
        confidence[pos[t:]] = 0.0
    out, corrected = code.decode(bad.tobytes(), confidence)
    assert out == msg and corrected == code.blocks * (t + s)


@given(frame_bytes=st.integers(600, 3000), seed=st.integers(0, 99))
@settings(max_examples=20, deadline=None)
def test_a_codeword_with_more_errors_than_it_corrects_decodes_when_the_reader_was_least_sure_of_them(frame_bytes, seed):
    """Generalised minimum distance decoding: 0.6 nsym wrong bytes a codeword (more than the nsym / 2 it
    corrects blind), none below the doubt threshold but each among its least sure bytes: a retry that erases
    those decodes it. The same errors on bytes the reader was sure of stay uncorrectable (detected)."""
    code = fec.FrameCode(frame_bytes, 0.8)
    rng = np.random.default_rng(seed)
    msg = rng.integers(0, 256, code.capacity, dtype=np.uint8).tobytes()
    bad = np.frombuffer(code.encode(msg), np.uint8).copy()
    confidence = rng.uniform(0.6, 1.0, frame_bytes).astype(np.float32)
    wrong = int(0.6 * code.nsym)
    for b in range(code.blocks):
        pos = rng.choice(code._order()[b], wrong, replace=False)
        bad[pos] ^= rng.integers(1, 256, wrong, dtype=np.uint8)
        confidence[pos] = rng.uniform(0.3, 0.5, wrong)  # unsure, but not below erase_below
    out, corrected = code.decode(bad.tobytes(), confidence)
    assert out == msg and corrected >= code.blocks * wrong
    with pytest.raises(fec.UncorrectableFrame):
        code.decode(bad.tobytes(), None)


def test_link_codec_detects_what_it_cannot_correct():
    """Far above capacity: RS fails or the check catches a miscorrection; never a wrong packet."""
    g = layout.GridLayout(38, 40, 4, 4)
    codec = link.LinkCodec(g, 0.8)
    data = bytes(range(60))
    assert codec.frames_needed(len(data) + streams.OVERHEAD) == 1
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
        assert streams.unwrap(transfer.TransferAssembler().add(p))[2] == data  # whatever is accepted is exactly right
        outcomes["corrected"] += 1
    assert outcomes["corrected"] > 10 and outcomes["detected"] > 10


def test_link_codec_round_trip_with_erasures():
    g = layout.GridLayout(40, 70, 8, 16)
    codec = link.LinkCodec(g, 0.8)
    data = bytes(range(256)) * 5
    msgs = codec.encode(data, count=codec.frames_needed(len(data) + streams.OVERHEAD), session=3, sender=1,
                        stream="avg", step=2)
    r = transfer.TransferAssembler()
    out = None
    for m in msgs:
        sym = cells.bytes_to_symbols(m, 8, g.n_data)
        conf = np.ones(g.n_data, np.float32)
        conf[::60] = 0.0  # doubtful cells become erasures...
        sym[::60] ^= 5  # ...and are indeed wrong
        p, wrong = codec.decode(sym, conf)
        assert wrong == len(sym[::60])
        out = out or _delivered(r, p)
    assert streams.unwrap(out)[2] == data


def test_render_and_layout_geometry():
    g = layout.GridLayout(rows=8, cols=24, colours=4, cell_px=3)
    roles = g.roles
    assert (roles == layout.SENDER).sum() == 2 * layout.SENDER_BITS
    assert (roles == layout.MARK).sum() == (roles == layout.ANTI).sum() == 2 * len(g.parity_rows)
    assert g.frame_bytes == g.n_data * 2 // 8 and g.n_data == (roles == layout.DATA).sum()
    img = layout.render(bytes(range(g.frame_bytes)), g, 96, 48, sender=5, parity=1)
    assert img.shape == (48, 96, 3) and img.dtype == np.uint8
    # every cell a 3 x 3 square of its colour, the code centred on black (odd margins: one more right, below)
    cells_of = layout.render_cells(bytes(range(g.frame_bytes)), g, sender=5, parity=1)
    drawn = np.repeat(np.repeat(cells_of, 3, axis=0), 3, axis=1)
    y0, x0 = (48 - drawn.shape[0]) // 2, (96 - drawn.shape[1]) // 2
    want = np.zeros_like(img)
    want[y0 : y0 + drawn.shape[0], x0 : x0 + drawn.shape[1]] = drawn
    assert drawn.shape == (30, 78, 3) and np.array_equal(img, want)
    grid = layout.render_cells(bytes(g.frame_bytes), g, sender=5, parity=1)
    assert (grid[0] == 255).all() and (grid[:, 0] == 255).all()  # the white locator ring
    flat = grid[1:-1, 1:-1].reshape(-1, 3)
    assert (flat[g.index(layout.MARK)] == 255).all() and (flat[g.index(layout.ANTI)] == 0).all()
    bits = (flat[g.index(layout.SENDER)][:, 0] > 0).astype(int)
    assert list(bits[:8]) == [0, 0, 0, 0, 0, 1, 0, 1] and list(bits[8:]) == list(bits[:8])
    with pytest.raises(ValueError, match="needs"):
        layout.GridLayout(40, 70, 8, 16).check_fits(640, 480)


def test_a_frames_margin_is_the_share_of_its_error_correction_left():
    codec = link.LinkCodec(layout.GridLayout(24, 40, 8, 10), code_rate=0.8)
    correctable = codec.code.blocks * (codec.code.nsym // 2)
    assert codec.margin(0) == 1.0
    assert codec.margin(correctable // 2) == pytest.approx(1 - (correctable // 2) / correctable)
    assert codec.margin(correctable) == 0.0


def test_frames_of_a_sixteen_rank_room_carry_every_ranks_fields():
    """A room of 16 laptops (transfer.MAX_RANKS): the sender 15, a transfer meant for rank 15 with a tag
    above 0xFFFF (a subgroup's), acknowledgements, holdings, trusts and run nonces of all 16, and a status
    frame's discovery rows about rank 15, all come back as sent; a 17th rank is refused."""
    from protocols import discovery

    n, key = transfer.MAX_RANKS, RoomKey(bytes(range(32)))
    assert n == 16
    data = bytes(range(256)) * 3
    fnt = frames.fountain(data, message_bytes=1500, count=2, packet_size=transfer.packet_size_for(1500, n))
    header = transfer.TransferHeader(session=3, sender=15, tid=9, seq=4, op="relay", dtype="uint8", numel=len(data),
                                     length=fnt.length, digest=fnt.digest, part=0x1F00A, dest=1 << 15)
    # every rank but the sender acknowledged in something: an entry each (none of its own)
    acks = tuple(transfer.Ack(cum=r + 1, mask=r << 3) for r in range(n - 1)) + (transfer.Ack(),)
    holds = tuple(100 + r for r in range(n))
    got = transfer.parse_message(transfer.frame_message(header, fnt, 0, message_bytes=1500, acks=acks, holds=holds,
                                                        trusts=0xFFFE, run_nonce=77, key=key), key)
    assert got.header == header and got.acks == acks[:-1] + (None,) and got.holds == holds and got.trusts == 0xFFFE
    assert transfer.peek(transfer.frame_message(header, fnt, 1, message_bytes=1500, run_nonce=77, key=key)) == (77, 9)
    q = tuple(tuple((r + k) % 16 for k in range(discovery.MAX_LAYOUTS)) for r in range(n))
    qs = [tuple(qr[:2] + (0,) * (discovery.MAX_LAYOUTS - 2) for qr in q) for _ in range(n)]
    rows = tuple(discovery.Row(1 + r, discovery.FINAL, discovery.reads_of(qs[r]), 0xFFFF ^ 1 << r, qs[r],
                               1 << (15 - r)) for r in range(n))
    status = transfer.parse_message(transfer.status_message(session=3, sender=15, acks=acks, holds=holds, rows=rows,
                                                            layouts=2, echo=tuple(range(1, n + 1)), trusts=0x8001,
                                                            message_bytes=1500, key=key), key)
    assert status.rows == rows and status.echo == tuple(range(1, n + 1)) and status.trusts == 0x8001
    with pytest.raises(ValueError, match="at most 16 ranks"):
        transfer.frame_message(header, fnt, 0, message_bytes=1500, acks=acks + (transfer.Ack(),), key=key)
