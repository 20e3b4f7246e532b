"""A wide lens: fitted from the codes' own edges (wccl.imaging.lens), it reads grids a pinhole misplaces.

rooms/circle-4.toml: four laptops on a circle, 128-degree lenses; each camera sees its two neighbours'
screens at 47 degrees, where barrel distortion bends their grids by up to a cell or more.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from protocols.layout import GridLayout, render
from wccl.config import load_config
from wccl.imaging import lens, reader
from wccl.room import SimulatedRoom

ROOT = Path(__file__).resolve().parent.parent


def _circle4():
    cfg = load_config(ROOT / "rooms" / "circle-4.toml")
    room = SimulatedRoom.from_config(cfg)
    grid = GridLayout(cfg.link.rows, cfg.link.cols, cfg.link.colours, cfg.link.cell_px)
    rng = np.random.default_rng(5)
    truth = {}
    for i, n in enumerate(room.nodes):
        room.show_at(n, render(rng.bytes(grid.frame_bytes), grid, cfg.screen.width, cfg.screen.height, sender=i,
                               parity=0), 0.0)
        (code,) = reader.read_codes(np.ascontiguousarray(room.screen_at(n, 1.0)), grid)
        truth[i] = code.symbols
    return room, grid, truth


def _errors(code, truth) -> float:
    return min(float((code.symbols != t).mean()) for t in truth.values())


def test_the_lens_fitted_from_the_edges_reads_the_neighbours_a_pinhole_misreads():
    room, grid, truth = _circle4()
    captures = [room.capture_at("alice", 1.0 + 0.01 * k, k=k) for k in range(4)]
    h, w = captures[0].shape[:2]
    fit = lens.LensFit(w, h, fit_at=(6,))
    for image in captures:
        for quad in reader.find_quads(image, grid):
            fit.edges(image, quad.corners, grid)
    assert fit.fits == 1 and fit.lens.a < 0  # barrel distortion, as the room's lens has
    image = captures[-1]
    quads = reader.find_quads(image, grid)
    assert len(quads) == 3  # bob, carol (across) and dave
    neighbours = [q for q in quads if abs(q.corners[:, 0].mean() - w / 2) > w / 5]
    assert len(neighbours) == 2
    for quad in neighbours:
        pinhole = reader.read_quad(image, quad, grid, sampled=reader.sample(image, quad, grid))
        sides = fit.edges(image, quad.corners, grid)
        through = reader.read_quad(image, quad, grid, sampled=reader.sample(image, quad, grid,
                                                                       fit.pixels(sides, grid, image.shape)))
        assert _errors(through, truth) < 0.02 < 0.04 < _errors(pinhole, truth)
        assert through.confidence.mean() > pinhole.confidence.mean()


def test_a_lens_that_reads_worse_than_a_pinhole_is_not_used():
    fit = lens.LensFit(1280, 720, trial=4)
    for _ in range(3):
        fit.vote(0.5, 0.6)
    assert fit.used is None  # still on trial
    fit.vote(0.8, 0.6)
    assert fit.used is False  # worse on average


def test_straight_edges_through_an_undistorted_lens_fit_no_distortion():
    # A pinhole's view of a flat code: its edges are straight, and the fit finds nothing to undo.
    room = SimulatedRoom(["a", "b"], 1280, 720, 30.0, profile="ideal",
                         node_channels=[{"distortion_k1": 0.0, "distortion_k2": 0.0}] * 2)
    grid = GridLayout(28, 50, 8, 24)
    room.show_at("b", render(bytes(grid.frame_bytes), grid, 1280, 720, sender=1, parity=0), 0.0)
    image = room.capture_at("a", 1.0)
    (quad,) = reader.find_quads(image, grid)
    sides = lens.LensFit(image.shape[1], image.shape[0]).edges(image, quad.corners, grid)
    fitted = lens.fit(image.shape[1], image.shape[0], [sides] * 6)
    corners = lens.straight_corners(fitted, sides)
    assert abs(fitted.a) < 0.05 and abs(fitted.b) < 0.05
    assert np.abs(corners - quad.corners).max() < 2.0  # the same corners as the contour's, within 2 px


def test_a_later_fit_that_reads_worse_gives_way_to_the_lens_used_before(monkeypatch):
    good, worse = lens.Lens(1280, 720, -0.03, 0.01), lens.Lens(1280, 720, 0.02, 0.0)
    fits = iter([good, worse])
    monkeypatch.setattr(lens, "fit", lambda w, h, codes, start=None: next(fits))
    monkeypatch.setattr(lens.LensFit, "_find", staticmethod(lambda image, corners, layout: [np.zeros((6, 2))] * 4))
    fit = lens.LensFit(1280, 720, fit_at=(1, 2), trial=2)
    grid = GridLayout(28, 50, 8, 24)
    image = np.zeros((720, 1280, 3), np.uint8)
    fit.edges(image, np.zeros((4, 2)), grid)  # the first fit: on trial, then it reads better than a pinhole
    fit.vote(0.7, 0.5)
    fit.vote(0.7, 0.5)
    assert (fit.fits, fit.used, fit.lens) == (1, True, good)
    fit.edges(image, np.ones((4, 2)), grid)  # the second fit (a code elsewhere): on trial
    assert (fit.fits, fit.used, fit.lens, fit.kept) == (2, None, worse, good)
    fit.vote(0.4, 0.5)  # the new fit against the lens kept from the first
    fit.vote(0.4, 0.5)
    assert (fit.used, fit.lens) == (True, good)  # it lost: the first lens is read through again


def test_a_model_that_folds_the_image_over_is_no_lens():
    assert lens.plausible(lens.Lens(1280, 720, -0.03, 0.01))
    assert lens.plausible(lens.Lens(1280, 720, 0.0, 0.0))
    # What a fit to codes near the middle of the image once gave: straight sides there, nonsense beyond.
    assert not lens.plausible(lens.Lens(1280, 720, 2.82, -4.07))
    assert not lens.plausible(lens.Lens(1280, 720, 10.5, -10.7))


def test_edges_kept_for_a_still_screen_are_found_again_once_forgotten():
    """A code's edges are found once per layout while its screen holds still; the FrameDecoder forgets them
    once no layout read the code, so edges from a frame that misled the search are not sampled through for
    good. Edges found for one layout are not another's."""
    room, grid, truth = _circle4()
    image = room.capture_at("alice", 1.0, k=0)
    h, w = image.shape[:2]
    fit = lens.LensFit(w, h, fit_at=(6,))
    quad = reader.find_quads(image, grid)[0]
    sides = fit.edges(image, quad.corners, grid)
    wrong = [s + 7.0 for s in sides]  # as if found a cell off
    fit._last[0] = (fit._last[0][0], grid, wrong)
    assert fit.edges(image, quad.corners, grid) is wrong  # kept: the screen held still
    other = GridLayout(grid.rows + 2, grid.cols + 4, grid.colours, grid.cell_px)
    assert fit.edges(image, quad.corners, other) is not wrong  # found for that layout
    fit.forget(quad.corners)
    again = fit.edges(image, quad.corners, grid)
    assert again is not wrong and all(np.allclose(a, b) for a, b in zip(again, sides))


def test_each_place_reads_both_ways_until_it_chooses_its_own(monkeypatch):
    """Once the fits are done, each place in the image has its own trial: the lens won on the codes in the
    middle of the view, but a screen at the edge (one that lit up later) that reads only through a pinhole
    is read both ways for PLACE_TRIAL codes, and that place then keeps the pinhole (a way that did not read
    votes 0), while the middle keeps the lens."""
    monkeypatch.setattr(lens, "fit", lambda w, h, codes, start=None: lens.Lens(w, h, -0.02, -0.1))
    monkeypatch.setattr(lens.LensFit, "_find", staticmethod(lambda image, corners, layout: [np.zeros((6, 2))] * 4))
    fit = lens.LensFit(1280, 720, fit_at=(1,), trial=1)
    grid = GridLayout(28, 50, 8, 24)
    image = np.zeros((720, 1280, 3), np.uint8)
    middle = np.array([[600.0, 330.0], [680.0, 330.0], [680.0, 390.0], [600.0, 390.0]])
    fit.edges(image, middle, grid)  # the fit, from a code in the middle of the view
    fit.vote(0.8, 0.6)
    fit.edges(np.zeros_like(image), middle + 1.0, grid)  # (a later capture of it: the fits are done)
    assert fit.settled and fit.used
    edge = middle - np.array([560.0, 0.0])  # a screen at the left edge
    assert fit.place_use(middle) is None and fit.place_use(edge) is None  # both on trial
    for _ in range(lens.PLACE_TRIAL - 1):
        assert fit.place_vote(edge, 0.0, 0.7) is None  # through the lens it does not read
        assert fit.place_vote(middle, 0.8, 0.7) is None
    assert fit.place_vote(edge, 0.0, 0.7) is False and fit.place_use(edge) is False
    assert fit.place_vote(middle, 0.8, 0.7) is True and fit.place_use(middle) is True
