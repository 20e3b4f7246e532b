"""The `webcam` profile against real photos (../shared/realcaps; those tests skip when it is absent)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from wccl.room import realcaps as rc
from wccl.room.params import resolve

FITTED = Path(__file__).resolve().parent.parent / "wccl" / "room" / "fitted.json"
ROOT = rc.realcaps_dir()
needs_photos = pytest.mark.skipif(ROOT is None, reason="../shared/realcaps is absent")


def test_fitted_json_says_the_webcam_profile_is_not_easier_than_the_photos():
    doc = json.loads(FITTED.read_text())
    assert doc["profile"] == "webcam" and len(doc["photos"]) == len(rc.PAIRS)
    for p in doc["photos"]:
        assert p["sim_error_rate"] >= p["colour_error_rate"], p["photo"]
        assert abs(p["sim_px_per_cell"] - p["px_per_cell"]) < 0.1
    med, web = doc["median"], resolve("webcam")
    assert web.blur_sigma_px >= med["max_blur_sigma_camera_px"]
    assert web.shading >= med["shading"]
    assert np.allclose(web.crosstalk, med["crosstalk_rgb"], atol=0.02)
    assert np.allclose(web.black_level, med["black_level_rgb"], atol=0.1)
    assert np.allclose(web.flare, med["flare_rgb"], atol=0.002)
    assert abs(web.camera_gamma - med["camera_gamma"]) < 0.01
    for p in doc["photos"]:  # the simulator's captures, measured like the photos, are not cleaner
        m = p["sim_measured"]
        assert m["blur_sigma_camera_px"] >= p["blur_sigma_camera_px"]
        assert m["noise_lit_sigma_dn"] >= med["noise_lit_sigma_dn"]


@needs_photos
def test_anchors_and_alignment_on_a_raw_photo():
    gt, photo = rc.load_pair(ROOT, "4color/4color_ecc30_fountain_0.png", "4color/4_30_f0_627.jpg")
    anchors = rc.find_anchors(photo)
    assert anchors.shape == (4, 2)
    al = rc.align(gt, photo, "raw")
    assert al.residual_px < 0.1
    assert 7.6 < al.cam_px_per_px * rc.PITCH < 8.0
    labels = rc.cell_labels(gt)
    assert (labels >= 0).sum() == 12400
    x, y = rc.sample_points()
    rate, _, _ = rc.colour_error_rate(rc.cell_features(photo, *al.to_photo(x, y)), labels)
    assert rate < 0.02


@pytest.mark.slow
@needs_photos
def test_simulated_webcam_is_at_least_as_hard_as_the_photo():
    from wccl.room.fit import sim_error

    gt, photo = rc.load_pair(ROOT, "b/tr_0.png", "b/scan2434.jpg")
    al = rc.align(gt, photo, "raw")
    labels = rc.cell_labels(gt)
    x, y = rc.sample_points()
    real, _, _ = rc.colour_error_rate(rc.cell_features(photo, *al.to_photo(x, y)), labels)
    sim, got, _, _ = sim_error(gt, "webcam", al.cam_px_per_px * rc.PITCH, captures=1)
    assert abs(got - al.cam_px_per_px * rc.PITCH) < 0.1
    assert sim >= real
