"""The reader on camera-like images, and the decoder's filters."""

from __future__ import annotations


import cv2
import numpy as np
import pytest

from actors.frame_decoder import FrameDecoder
from protocols import cells, streams, transfer
from protocols.layout import GridLayout, render, render_idle
from protocols.link import LinkCodec
from protocols.messages import Capture, TensorReceived
from protocols.security import Handshake
from wccl.runtime.harness import ActorHarness
from wccl.imaging import reader
from wccl.config import with_values
from wccl.lab.bench import run_bench
from wccl.keys import new_run_nonce

from conftest import make_config, run_virtual

GRID = GridLayout(40, 70, 8, 12)
CODEC = LinkCodec(GRID, 0.8)


def _frame(i: int, sender: int = 1, session: int = 1, data: bytes | None = None) -> tuple[bytes, np.ndarray]:
    data = data or bytes(np.random.default_rng(i).integers(0, 256, 500, dtype=np.uint8))
    fb = CODEC.encode(data, count=1, session=session, sender=sender, stream="grad", step=i)[0]
    return fb, render(fb, GRID, 1280, 720, sender=sender, parity=i & 1)


def _camera(screen: np.ndarray, seed: int = 0) -> np.ndarray:
    """Perspective, blur, colour crosstalk, a brightness gradient and noise."""
    H = cv2.getPerspectiveTransform(np.float32([[0, 0], [1280, 0], [1280, 720], [0, 720]]),
                                    np.float32([[420, 180], [990, 215], [975, 520], [430, 505]]))
    img = cv2.warpPerspective(screen, H, (1280, 720), flags=cv2.INTER_AREA).astype(np.float32)
    img = cv2.GaussianBlur(img, (0, 0), 1.0)
    m = np.array([[0.85, 0.12, 0.05], [0.1, 0.8, 0.15], [0.05, 0.2, 0.9]], np.float32)
    ramp = np.linspace(0.75, 1.0, 1280, dtype=np.float32)[None, :, None]
    img = (img @ m.T) * ramp * 0.85 + 18
    img += np.random.default_rng(seed).normal(0, 3, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def test_reads_a_code_through_perspective_blur_colour_cast_and_noise():
    fb, screen = _frame(3, sender=1)
    img = _camera(screen)
    quads = reader.find_quads(img, GRID)
    assert len(quads) == 1
    code = reader.read_quad(img, quads[0], GRID)
    assert code.sender == 1 and code.parity == 1 and not code.mixed
    truth = cells.bytes_to_symbols(fb, GRID.colours, GRID.n_data)
    assert (code.symbols != truth).mean() < 0.01
    packet, wrong = CODEC.decode(code.symbols, code.confidence)
    assert (packet.sender, packet.header.seq) == (1, 3)


def test_two_screens_in_one_image_are_both_found_with_their_senders():
    _, a = _frame(1, sender=1)
    _, b = _frame(2, sender=2)
    img = np.zeros((720, 1280, 3), np.uint8)
    img[100:460, 20:660] = cv2.resize(a, (640, 360), interpolation=cv2.INTER_AREA)
    img[300:660, 660:1260] = cv2.resize(b, (600, 360), interpolation=cv2.INTER_AREA)
    codes = reader.read_codes(img, GRID)
    assert [c.sender for c in codes] == [1, 2]


def test_a_frame_seen_pixel_for_pixel_reads_as_its_full_colour_fit_does():
    """An exact capture is explained by the pilots' fit alone (the refits are skipped): the same symbols,
    full confidence, as the decision-directed fit gives."""
    fb, screen = _frame(6)
    quad = reader.find_quads(screen, GRID)[0]
    model = reader.ColourModel(GRID)
    values, _ = reader.sample(screen, quad, GRID)
    first = model.correct(values)
    noisy = values + np.random.default_rng(0).normal(0, 12, values.shape).astype(np.float32)  # off the palette
    refit = model.correct(noisy)
    assert reader._on_palette(first) and not reader._on_palette(refit)
    sym_a, conf_a = reader.classify(first[model.data_idx], GRID.colours)
    sym_b, _ = reader.classify(refit[model.data_idx], GRID.colours)
    truth = cells.bytes_to_symbols(fb, GRID.colours, GRID.n_data)
    assert (sym_a == truth).all() and (sym_b == truth).all() and conf_a.min() > 0.8


def test_codes_found_again_in_an_unchanged_image_are_the_same_and_a_changed_one_is_searched_again():
    _, screen = _frame(7)
    img = _camera(screen)
    first = reader.find_quads(img, GRID)
    again = reader.find_quads(img.copy(), GRID)
    assert len(first) == 1 and again[0] is first[0]  # the cached answer: the same pixels, the same code
    with pytest.raises(ValueError):
        first[0].corners[0, 0] = 0  # shared by every caller: read-only
    moved = np.zeros_like(img)
    moved[:, 40:] = img[:, :-40]
    found = reader.find_quads(moved, GRID)
    assert len(found) == 1 and abs(float(found[0].corners[0, 0] - first[0].corners[0, 0]) - 40) < 1.5


@pytest.mark.parametrize("kind", ["blend", "rolling_shutter"])
def test_mixed_captures_are_flagged(kind):
    _, a = _frame(4)  # parity 0
    _, b = _frame(5)  # parity 1
    if kind == "blend":
        screen = ((a.astype(np.uint16) + b) // 2).astype(np.uint8)
    else:  # rows above 400 still show frame a, rows below already frame b
        screen = a.copy()
        screen[400:] = b[400:]
    img = _camera(screen)
    code = reader.read_codes(img, GRID)[0]
    assert code.mixed
    if kind == "rolling_shutter":  # (a blend leaves the marks' order: read_quad finds it by their contrast)
        assert not reader.marks_agree(reader.sample(img, code.quad, GRID)[0], GRID)


def test_marks_read_raw_agree_in_a_frame_and_not_through_another_layouts_grid():
    _, screen = _frame(8)
    img = _camera(screen)
    quad = reader.find_quads(img, GRID)[0]
    assert reader.marks_agree(reader.sample(img, quad, GRID)[0], GRID)
    other = GridLayout(28, 50, 8, 22)  # the same code sampled through a coarser grid: marks on data
    assert not reader.marks_agree(reader.sample(img, quad, other)[0], other)


def test_idle_screen_is_recognised_not_decoded():
    img = _camera(render_idle(GRID, 1280, 720))
    quads = reader.find_quads(img, GRID)
    assert len(quads) == 1
    values, _ = reader.sample(img, quads[0], GRID)
    assert reader.is_idle(values, GRID)
    _, screen = _frame(6)
    v2, _ = reader.sample(_camera(screen), reader.find_quads(_camera(screen), GRID)[0], GRID)
    assert not reader.is_idle(v2, GRID)


def _decode_captures(images: list[np.ndarray], node_names=("alice", "bob"), me="alice"):
    """A rank's decoder (`me`) whose run handshake already trusts bob's frames (run nonce 1, as
    LinkCodec.encode makes them)."""
    rank = list(node_names).index(me)
    hs = Handshake(rank, len(node_names), new_run_nonce())
    hs.heard(1, 1, tuple(hs.nonce if r == rank else 1 for r in range(len(node_names))), 0, 0)

    async def go():
        async with ActorHarness(FrameDecoder, node=me, codec=CODEC, session=1, node_names=list(node_names),
                                transfers=transfer.TransferAssembler(), handshake=hs) as dec:
            for i, img in enumerate(images):
                await dec.send(Capture(sender=me, time=float(i), image=img, seq=i))
            await dec.settle()
        return dec.of_type(TensorReceived), dec.results["link"]

    return run_virtual(go)


def test_a_frame_of_a_finer_layout_is_not_idle_through_a_coarser_grid():
    """Sampled through a grid of about twice its cells, a frame's pilots land on the frame's own pilots
    (all alike): the screen is not idle unless all its cells are."""
    fine, coarse = GridLayout(42, 78, 4, 16), GridLayout(20, 37, 8, 32)
    codec = LinkCodec(fine, 0.8)
    for i in range(5):
        data = bytes(np.random.default_rng(i).integers(0, 256, codec.message_bytes, dtype=np.uint8))
        img = cv2.GaussianBlur(_camera(render(codec.encode_message(data), fine, 1280, 720, sender=1, parity=0), seed=i),
                               (0, 0), 3.0)
        quad = reader.find_quads(img, coarse)[0]
        assert not reader.is_idle(reader.sample(img, quad, coarse)[0], coarse)


def test_a_code_even_in_one_layout_of_the_ladder_is_read_in_another(monkeypatch):
    """While the layout is not chosen, a code that looks idle in the layout tried first is tried in the
    others; it is an idle screen only if none reads it."""
    coarse = LinkCodec(GridLayout(20, 35, 8, 24), 0.8)
    even = reader.is_idle
    monkeypatch.setattr(reader, "is_idle", lambda values, layout: layout.cell_px == 24 or even(values, layout))
    hs = Handshake(0, 2, new_run_nonce())
    hs.heard(1, 1, (hs.nonce, 1), 0, 0)
    data = bytes(range(200))
    _, frame = _frame(12, sender=1, data=data)

    async def go():
        async with ActorHarness(FrameDecoder, node="alice", codec=coarse, session=1, node_names=["alice", "bob"],
                                transfers=transfer.TransferAssembler(), handshake=hs,
                                ladder=[coarse, CODEC]) as dec:
            for i, img in enumerate((_camera(render_idle(GRID, 1280, 720)), _camera(frame))):
                await dec.send(Capture(sender="alice", time=float(i), image=img, seq=i))
            await dec.settle()
        return dec.of_type(TensorReceived), dec.results["link"]

    got, link = run_virtual(go)
    assert len(got) == 1 and got[0].payload == data
    assert link["idle_screens"] == 1


def test_a_screen_too_small_for_the_first_layouts_cells_is_found_and_read_in_the_coarsest():
    """Far off, a screen fills fewer camera pixels than the ladder's first layout needs to be found at all;
    while the layout is not chosen the decoder still finds it, and reads it in the coarsest layout."""
    fine = LinkCodec(GridLayout(68, 124, 8, 10), 0.8)
    coarse = LinkCodec(GridLayout(20, 37, 8, 32), 0.8)
    hs = Handshake(0, 2, new_run_nonce())
    hs.heard(1, 1, (hs.nonce, 1), 0, 0)
    data = bytes(range(40))
    (fb,) = coarse.encode(data, count=1, session=1, sender=1, stream="grad", step=3)
    screen = cv2.resize(render(fb, coarse.layout, 1280, 720, sender=1, parity=1), (160, 90),
                        interpolation=cv2.INTER_AREA)
    img = np.full((720, 1280, 3), 20, np.uint8)
    img[300:390, 540:700] = screen
    img = cv2.GaussianBlur(img, (0, 0), 0.6)
    assert reader.find_quads(img, fine.layout) == []  # the first layout's cells would not find it

    async def go():
        async with ActorHarness(FrameDecoder, node="alice", codec=fine, session=1, node_names=["alice", "bob"],
                                transfers=transfer.TransferAssembler(), handshake=hs,
                                ladder=[fine, coarse]) as dec:
            await dec.send(Capture(sender="alice", time=1.0, image=img, seq=0))
            await dec.settle()
        return dec.of_type(TensorReceived)

    got = run_virtual(go)
    assert len(got) == 1 and got[0].payload == data


def test_frames_of_another_session_or_an_unknown_sender_are_ignored():
    data = bytes(range(200))
    _, foreign = _frame(7, sender=1, session=2, data=data)
    _, stranger = _frame(8, sender=5, data=data)
    _, own = _frame(9, sender=0, data=data)  # alice's own frame, seen in a mirror
    got, link = _decode_captures([foreign, stranger, own])
    assert got == []
    assert link["frames_foreign_session"] == 1 and link["frames_unknown_sender"] == 2
    _, good = _frame(10, sender=1, data=data)
    got, link = _decode_captures([good])
    assert len(got) == 1 and got[0].payload == data and got[0].origin == "bob"


@pytest.mark.slow
def test_dropped_frames_are_covered_by_the_fountain_code():
    """A camera that loses a third of its captures still gets every tensor, exactly."""
    cfg = with_values(make_config(room={"channel": {"drop_prob": 0.35}}), room={"profile": "ideal"},
                      link={"rows": 40, "cols": 70, "cell_px": 16, "hold_s": 0.1})
    r = run_bench(cfg, nbytes=30_000, tensor_bytes=6_000, repair=1.0, extra=2)
    assert r["tensors_delivered"] == r["tensors_sent"] == 5 and r["undetected_errors"] == 0
    assert r["captures"] < 0.75 * r["sim_seconds"] * 30  # captures really were lost


def test_tracker_follows_codes_and_searches_again_when_one_is_lost():
    _, a = _frame(11, sender=1)
    img = _camera(a)
    tracker = reader.QuadTracker(GRID, redetect_every=100)
    first = tracker(img)
    assert len(first) == 1 and tracker.full_searches == 1
    moved = np.zeros_like(img)
    moved[:, 6:] = img[:, :-6]  # the screen moved 6 px to the right
    again = tracker(moved)
    assert tracker.full_searches == 1  # found near where it was
    assert np.allclose(again[0].corners, first[0].corners + [6, 0], atol=1.0)
    # A second screen appears far away: found at the next full search; the tracked one is kept meanwhile.
    both = moved.copy()
    both[:200, :400] = cv2.resize(img[150:550, 400:1000], (400, 200), interpolation=cv2.INTER_AREA)
    tracker.redetect_every = 3
    tracker(both)
    assert len(tracker(both)) == 2
    # The screen goes away: lost, so the whole image is searched again.
    n = tracker.full_searches
    assert tracker(np.zeros_like(img)) == [] and tracker.full_searches == n + 1


@pytest.mark.parametrize("colours", [2, 4, 8])
def test_every_colour_count_reads_through_the_camera(colours):
    grid = GridLayout(40, 70, colours, 12)
    codec = LinkCodec(grid, 0.8)
    data = bytes(range(60))  # one frame even with 2 colours
    fb = codec.encode(data, count=1, session=1, sender=1, stream="avg", step=1)[0]
    img = _camera(render(fb, grid, 1280, 720, sender=1, parity=1))
    code = reader.read_codes(img, grid)[0]
    assert not code.mixed and code.sender == 1
    packet, _ = codec.decode(code.symbols, code.confidence)
    assert streams.unwrap(transfer.TransferAssembler().add(packet))[2] == data


def test_cells_are_classified_in_the_metric_of_their_frames_noise():
    """Noise the channels share (a camera's colour matrix, JPEG's brightness) moves a cell along a diagonal
    of the colour cube: the nearest corner in the frame's noise metric reads fewer cells wrong than a
    threshold per channel, and its confidence is about 1 at a corner, 0 half-way between two."""
    rng = np.random.default_rng(0)
    truth = rng.integers(0, 8, 20000)
    corners = (cells.palette_bgr(8) > 127).astype(np.float32)
    cov = 0.035 * np.array([[1.0, 0.7, 0.7], [0.7, 1.0, 0.7], [0.7, 0.7, 1.0]])
    corrected = (corners[truth] + rng.multivariate_normal(np.zeros(3), cov, len(truth))).astype(np.float32)
    bits = corrected > 0.5
    by_threshold = (bits[:, 2] * 4 + bits[:, 1] * 2 + bits[:, 0]) != truth
    symbols, confidence = reader.classify(corrected, 8)
    wrong = symbols != truth
    assert wrong.mean() < 0.6 * by_threshold.mean(), (wrong.mean(), by_threshold.mean())
    assert confidence[wrong].mean() < confidence[~wrong].mean()
    # clean corners: confidence about 1 (the metric is about the identity's when the noise is alike in every
    # channel; from a few cells' noise it is a little off in some direction)
    flat = np.tile(corners, (40, 1)) + rng.normal(0, 0.01, (320, 3)).astype(np.float32)
    sym, conf = reader.classify(flat, 8)
    assert (sym == np.tile(np.arange(8), 40)).all() and conf.min() > 0.8
    # too few sure cells: no metric, a threshold per channel; cells read as NaN are never sure, and a frame
    # of them reads (as nothing sure) without an error
    assert reader.noise_metric(flat[:40]) is None
    with_nan = np.concatenate([flat, np.full((10, 3), np.nan, np.float32)])
    assert reader.noise_metric(with_nan) is not None
    assert (reader.classify(with_nan, 8)[0][:320] == sym).all()
    reader.classify(np.full((100, 3), np.nan, np.float32), 8)


def test_the_decode_bench_says_how_many_cells_read_wrong_and_which_the_reader_doubted():
    import contextlib
    import io
    import json
    from pathlib import Path

    from wccl.imaging.bench import main

    room = Path(__file__).resolve().parent.parent / "rooms" / "two-laptops-sim.toml"
    out, threads = io.StringIO(), cv2.getNumThreads()
    try:
        with contextlib.redirect_stdout(out):
            assert main(["--config", str(room), "--captures", "3", "--json"]) == 0
    finally:
        cv2.setNumThreads(threads)  # (the bench times one core; this test process goes on with its own)
    r = json.loads(out.getvalue())
    assert r["clean_reads"] == 3 and r["decoded"] == 3
    assert 0 < r["cell_error_rate"] < 0.05 and 0.3 < r["wrong_cells_doubted"] <= 1 and r["right_cells_doubted"] < 0.05
    assert len(r["bit_error_rate_bgr"]) == 3 and sum(r["bit_error_rate_bgr"]) >= r["cell_error_rate"]
