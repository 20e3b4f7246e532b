"""Round trips and rejection of every codec layer in protocols/."""

from __future__ import annotations

import zlib
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols import cells, frames, layout, tensors


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
        "sender": st.integers(0, 255),
        "stream": st.sampled_from(["grad", "avg"]),
        "step": st.integers(0, 2**32 - 1),
    }
)


@given(data=st.binary(max_size=5000), meta=frame_args, frame_bytes=st.integers(40, 1200))
@settings(max_examples=60)
def test_frames_round_trip(data, meta, frame_bytes):
    packets = frames.packetize(data, frame_bytes=frame_bytes, **meta)
    assert all(len(p) == frame_bytes for p in packets)
    r = frames.Reassembler()
    out = None
    for p in reversed(packets):  # order does not matter
        pk = frames.parse_frame(p)
        assert (pk.session, pk.sender, pk.stream, pk.step) == (meta["session"], meta["sender"], meta["stream"], meta["step"])
        out = r.add(pk)
    assert out == data


@given(data=st.binary(min_size=1, max_size=800), pos=st.integers(0, 10_000), flip=st.integers(1, 255))
@settings(max_examples=200)
def test_any_corrupted_byte_is_rejected(data, pos, flip):
    frame = frames.packetize(data, frame_bytes=1050, session=1, sender=1, stream="grad", step=3)[0]
    end = frames.HEADER_BYTES + min(len(data), 1050 - frames.OVERHEAD_BYTES) + frames.CRC_BYTES
    i = pos % end  # corrupt within header, payload or CRC
    bad = bytearray(frame)
    bad[i] ^= flip
    with pytest.raises(frames.FrameError):
        frames.parse_frame(bytes(bad))


def test_reassembler_counts_duplicates_conflicts_and_stale():
    data = bytes(range(256)) * 10
    fs = [frames.parse_frame(p) for p in frames.packetize(data, frame_bytes=500, session=1, sender=2, stream="avg", step=7)]
    r = frames.Reassembler()
    assert r.add(fs[0]) is None
    assert r.add(fs[0]) is None and r.duplicates == 1
    assert r.seen(2, "avg", 7, 0) and not r.seen(2, "avg", 7, 1)
    for f in fs[1:]:
        out = r.add(f)
    assert out == data
    assert r.add(fs[0]) is None  # a tensor already delivered is not delivered twice
    other = [frames.parse_frame(p) for p in frames.packetize(b"x" * 900, frame_bytes=500, session=1, sender=2, stream="avg", step=8)]
    third = [frames.parse_frame(p) for p in frames.packetize(b"y" * 900, frame_bytes=500, session=1, sender=2, stream="avg", step=8)]
    r.add(other[0])
    assert r.add(third[1]) is None  # same (sender, stream, step), different tensor: neither trusted
    assert r.losses["conflicting_frames"] == 1
    r.add(other[0])
    assert r.forget_before(9) == 1 and r.losses["incomplete_tensor"] == 1


def test_tensor_digest_mismatch_is_a_counted_loss():
    # Two packets of different tensors that agree on their metadata: each frame is valid, the whole is not.
    a = frames.packetize(b"a" * 900, frame_bytes=500, session=1, sender=1, stream="grad", step=1)
    b = frames.packetize(b"b" * 900, frame_bytes=500, session=1, sender=1, stream="grad", step=1)
    pa, pb = frames.parse_frame(a[0]), frames.parse_frame(b[1])
    forged = replace(pb, tensor_crc=pa.tensor_crc)
    r = frames.Reassembler()
    assert r.add(pa) is None
    assert r.add(forged) is None
    assert r.losses["tensor_crc_mismatch"] == 1


def test_frame_errors_have_reasons():
    good = frames.packetize(b"hello", frame_bytes=64, session=1, sender=1, stream="grad", step=0)[0]
    with pytest.raises(frames.FrameError) as e:
        frames.parse_frame(b"XX" + good[2:])
    assert e.value.reason == "bad_magic"
    with pytest.raises(frames.FrameError) as e:
        frames.parse_frame(good[:10])
    assert e.value.reason == "short_frame"
    assert zlib.crc32(b"") == 0


def test_render_and_layout_geometry():
    g = layout.GridLayout(rows=4, cols=6, colours=4, cell_px=3)
    assert g.frame_bytes == 4 * 6 * 2 // 8
    img = layout.render(bytes(range(g.frame_bytes)), g, 64, 64)
    assert img.shape == (64, 64, 3) and img.dtype == np.uint8
    h, w = g.size_px
    assert (img.max(axis=2) > 0).sum() > 0 and h == 18 and w == 24
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
