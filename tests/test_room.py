"""The simulated room's channel: exactness, determinism, time mixing, geometry, profiles, record/replay."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from conftest import make_config, run_virtual
from wccl.room import SimulatedRoom
from wccl.room.params import PROFILE_NAMES, resolve
from wccl.runtime.timebase import NodeClock

W, H = 320, 192  # small screens keep the tests fast; the camera stays 1280x720 unless a test says otherwise
QUIET = {"disable": ["noise", "compression", "shading", "auto_exposure", "moire", "jitter", "drops", "stalls"]}


def pattern(seed: int = 0, w: int = W, h: int = H, cell: int = 8) -> np.ndarray:
    """A grid of RGB-corner colours on black, like a code."""
    rng = np.random.default_rng(seed)
    g = (rng.integers(0, 2, (h // cell, w // cell, 3)) * 255).astype(np.uint8)
    img = np.repeat(np.repeat(g, cell, 0), cell, 1)
    out = np.zeros((h, w, 3), np.uint8)
    out[: img.shape[0], : img.shape[1]] = img
    return out


def room(profile: str = "webcam", seed: int = 0, nodes=("alice", "bob"), channel=None, node_channels=None,
         w: int = W, h: int = H) -> SimulatedRoom:
    return SimulatedRoom(list(nodes), w, h, 30.0, profile=profile, seed=seed, channel=channel,
                         node_channels=node_channels)


# ---- exact -----------------------------------------------------------------------------------------

def test_exact_profile_is_pixel_exact_side_by_side():
    r = room("exact", nodes=("a", "b", "c"))
    shown = {n: pattern(i) for i, n in enumerate(r.nodes)}
    for n, img in shown.items():
        r.show_at(n, img, 1.0)
    cap = r.capture_at("a", 2.0)
    assert cap.shape == (H, 2 * W, 3)
    assert np.array_equal(cap, np.concatenate([shown["b"], shown["c"]], axis=1))
    assert np.array_equal(r.capture_at("b", 0.5), np.zeros((H, 2 * W, 3), np.uint8))  # before anything was shown
    assert np.array_equal(r.project("a", "c", [[3.0, 4.0]]), [[W + 3.0, 4.0]])


def test_exact_camera_timing_is_unchanged():
    async def go():
        r = room("exact")
        loop = asyncio.get_running_loop()
        r.screen("alice").show(pattern(1))
        cam = r.camera("bob", NodeClock())
        out = []
        for _ in range(3):
            img, t = await cam.recv()
            out.append((img, t, loop.time()))
        return r, cam, out

    r, cam, out = run_virtual(go)
    period = 1 / 30
    phase = (1 * 0.37) % 1.0 * period
    for k, (img, t, now) in enumerate(out):
        assert t == pytest.approx(phase + k * period) and now == pytest.approx(t)
        assert np.array_equal(img, pattern(1))


# ---- determinism ------------------------------------------------------------------------------------

def _captures(seed: int, order=("alice", "bob")) -> dict[str, bytes]:
    r = room("webcam", seed=seed)
    r.show_at("alice", pattern(1), 0.0)
    r.show_at("bob", pattern(2), 0.0)
    return {n: r.capture_at(n, 2.0, k=7).tobytes() for n in order}


def test_same_seed_same_bytes_different_seed_differs_any_order():
    a = _captures(1)
    b = _captures(1, order=("bob", "alice"))
    c = _captures(2)
    assert a == b
    assert a["bob"] != c["bob"]


def test_capture_index_changes_the_noise_not_the_picture():
    r = room("webcam", seed=3)
    r.show_at("alice", pattern(1), 0.0)
    x = r.capture_at("bob", 2.0, k=1).astype(int)
    y = r.capture_at("bob", 2.0, k=2).astype(int)
    assert not np.array_equal(x, y)
    assert np.abs(x - y).mean() < 6


# ---- time: mixing, rolling shutter ----------------------------------------------------------------------

def _screen_rows(r: SimulatedRoom, viewer: str, shown: str) -> tuple[int, int, int, int]:
    corners = r.project(viewer, shown, [[0, 0], [W - 1, 0], [W - 1, H - 1], [0, H - 1]])
    x0, y0 = np.ceil(corners.min(axis=0)).astype(int) + 3
    x1, y1 = np.floor(corners.max(axis=0)).astype(int) - 3
    return x0, y0, x1, y1


@pytest.mark.parametrize("readout_ms", [30.0, 0.0])
def test_a_capture_straddling_a_screen_change_mixes_frames_row_by_row(readout_ms):
    ch = dict(QUIET, readout_ms=readout_ms, exposure_ms=10.0, screen_scanout=0.0, screen_refresh_hz=0.0,
              disable=[*QUIET["disable"], "viewing_angle", "glare"],
              yaw_deg=0.0, pitch_deg=0.0, roll_deg=0.0, shading=0.0, vignette=0.0, blur_sigma_px=0.0)
    r = room("webcam", channel=ch)
    white, black = np.full((H, W, 3), 255, np.uint8), np.zeros((H, W, 3), np.uint8)
    r.show_at("alice", white, 0.0)
    t_change = 1.0
    r.show_at("alice", black, t_change)
    x0, y0, x1, y1 = _screen_rows(r, "bob", "alice")
    e, ro = 0.010, readout_ms * 1e-3
    # Start the exposure so that the screen's middle row integrates half of each frame.
    y_mid = (y0 + y1) / 2
    t = t_change - e / 2 - y_mid / 720 * ro
    cap = r.capture_at("bob", t).astype(float)
    rows = cap[y0:y1, x0:x1].mean(axis=(1, 2))
    pure_white = r.capture_at("bob", 0.5)[y0:y1, x0:x1].mean()
    pure_black = r.capture_at("bob", 1.5)[y0:y1, x0:x1].mean()
    assert pure_black + 20 < rows.mean() < pure_white - 20  # a mix of the two frames
    if readout_ms:
        # Early rows start before the change (mostly white), late rows after it (mostly black).
        assert rows[:5].mean() > rows[-5:].mean() + 40
        assert np.all(np.diff(rows) <= 1.0)
    else:
        assert rows.max() - rows.min() < 3  # global shutter: every row sees the same mix
    assert r.cams["bob"].stats["mixed"] == 1


def test_vsync_delays_a_show_to_the_next_refresh():
    r = room("webcam")
    sm = r.screens["alice"]
    up = sm.display_time(1.0)
    assert 1.0 <= up < 1.0 + 1 / 60 + 1e-9
    assert sm.display_time(up) == pytest.approx(up)


# ---- geometry ---------------------------------------------------------------------------------------

def test_a_screen_out_of_view_is_not_seen():
    # bob turned away from alice: alice's camera sees bob's back; bob's camera looks away.
    r = room("webcam", channel=QUIET, node_channels=[{}, {"yaw_deg": 180.0}])
    assert r.visible_from("alice") == [] and r.visible_from("bob") == []
    assert "facing away" in r.hidden_from("alice")["bob"]
    before = r.capture_at("alice", 1.0)
    r.show_at("bob", np.full((H, W, 3), 255, np.uint8), 1.5)
    assert np.array_equal(before, r.capture_at("alice", 2.0))
    assert np.isnan(r.project("alice", "bob", [[0.0, 0.0]])).all()


def test_a_screen_beside_the_field_of_view_is_not_seen_and_the_frame_is_cheap():
    r = room("webcam", channel=QUIET, node_channels=[{"yaw_deg": 60.0}, {}])
    assert "bob" not in r.visible_from("alice")
    assert "field of view" in r.hidden_from("alice")["bob"]
    assert r.cams["alice"].candidates == []  # nothing to render but the room


def test_several_screens_each_at_its_own_place_and_size():
    # Three laptops on a 1 m circle; a wide camera sees both others.
    r = room("webcam", nodes=("a", "b", "c"), channel=dict(QUIET, distance_m=1.0, hfov_deg=110.0, yaw_deg=0.0))
    assert r.visible_from("a") == ["b", "c"]
    pb = r.project("a", "b", [[W / 2, H / 2]])[0]
    pc = r.project("a", "c", [[W / 2, H / 2]])[0]
    assert abs(pb[0] - pc[0]) > 200  # side by side, not on top of each other
    r.show_at("b", np.full((H, W, 3), 255, np.uint8), 0.0)
    cap = r.capture_at("a", 1.0).astype(int)
    lum = cap.sum(axis=2)
    assert lum[int(pb[1]), int(pb[0])] > lum[int(pc[1]), int(pc[0])] + 150  # b lit, c dark


def test_geometry_of_the_webcam_profile():
    r = room("webcam", w=1280, h=720)
    v = r.views[("bob", "alice")]
    corners = r.project("bob", "alice", [[0, 0], [1279, 0], [1279, 719], [0, 719]])
    span = (corners[:, 0].max() - corners[:, 0].min()) / 1280
    assert 0.35 <= span <= 0.45                 # the screen spans ~40 % of the image width
    assert 10 <= v.angle_deg <= 20              # turned 10-20 degrees
    assert 0.55 <= v.distance_m <= 0.65
    assert (corners[:, 0] > 0).all() and (corners[:, 0] < 1280).all()
    assert (corners[:, 1] > 0).all() and (corners[:, 1] < 720).all()


# ---- profiles and overrides -------------------------------------------------------------------------

@pytest.mark.parametrize("profile", PROFILE_NAMES)
def test_every_profile_renders_a_camera_image(profile):
    r = room(profile)
    r.show_at("alice", pattern(3), 0.0)
    img = r.capture_at("bob", 1.0)
    assert img.dtype == np.uint8 and img.ndim == 3
    if profile != "exact":
        p = r.params["bob"]
        assert img.shape == (p.camera_height, p.camera_width, 3)
        assert img.std() > 3  # the screen shows up


def test_room_wide_and_per_node_overrides():
    r = room("webcam", channel={"jpeg_quality": 90, "yaw_deg": 5.0}, node_channels=[{"yaw_deg": 0.0}, {}])
    assert r.params["alice"].jpeg_quality == 90 and r.params["bob"].jpeg_quality == 90
    assert r.params["alice"].yaw_deg == 0.0 and r.params["bob"].yaw_deg == 5.0
    p = resolve("webcam", {"disable": ["noise"]}, {"disable": ["blur"]})
    assert p.read_noise == 0 and p.blur_sigma_px == 0 and p.jpeg_quality == resolve("webcam").jpeg_quality


def test_from_config_reads_the_channel_tables():
    cfg = make_config(room={"profile": "webcam", "channel": {"exposure_ms": 8.0},
                            "nodes": [{"name": "alice", "roles": ["server", "worker"], "channel": {"fps": 20.0}},
                                      {"name": "bob", "roles": ["worker"]}]})
    r = SimulatedRoom.from_config(cfg)
    assert r.params["alice"].exposure_ms == 8.0 and r.camera_fps("alice") == 20.0 and r.camera_fps("bob") == 30.0


@pytest.mark.parametrize("profile,channel,nodes,match", [
    ("nope", None, None, r"room\.profile: unknown profile 'nope'"),
    ("webcam", {"exposure_msx": 1}, None, r"room\.channel\.exposure_msx: unknown channel parameter"),
    ("webcam", None, [{}, {"exposure_ms": -3}], r"room\.nodes\[1\]\.channel\.exposure_ms: must be >= 0"),
    ("webcam", None, [{"crosstalk": [[1, 0], [0, 1]]}, {}], r"room\.nodes\[0\]\.channel\.crosstalk: expected a 3x3"),
    ("webcam", {"codec": "vp9"}, None, r"room\.channel\.codec: expected 'none', 'mjpeg' or 'h264'"),
    ("webcam", {"disable": ["wobble"]}, None, r"room\.channel\.disable: unknown stage"),
    ("webcam", {"auto_exposure": 1}, None, r"room\.channel\.auto_exposure: expected true or false"),
    ("exact", {"blur_sigma_px": 1.0}, None, r"room\.channel: the 'exact' profile takes no channel parameters"),
    ("exact", None, [{}, {"yaw": 1}], r"room\.nodes\[1\]\.channel\.yaw: unknown channel parameter"),
])
def test_bad_profiles_and_keys_name_themselves(profile, channel, nodes, match):
    with pytest.raises(ValueError, match=match):
        room(profile, channel=channel, node_channels=nodes)


# ---- camera behaviour over time ---------------------------------------------------------------------------

def test_auto_exposure_reacts_with_lag_to_what_the_screen_shows():
    r = room("webcam", channel={"ae_drift": 0.0})
    ex = r.exposures["bob"]
    dark = ex.gain(0.5)
    r.show_at("alice", np.full((H, W, 3), 255, np.uint8), 1.0)
    soon, later = ex.gain(1.05), ex.gain(4.0)
    assert dark > soon > later  # a bright screen turns the gain down, gradually
    assert ex.gain(1.0) == pytest.approx(dark)
    tau = r.params["bob"].ae_tau_s
    mid = ex.gain(1.0 + tau)
    assert np.log(dark / mid) == pytest.approx((1 - np.exp(-1)) * np.log(dark / later), rel=0.02)


def test_room_camera_skips_drops_and_stamps_delivery_time():
    async def go():
        r = room("webcam", channel={"drop_prob": 0.3, "jitter_ms": 3.0})
        loop = asyncio.get_running_loop()
        cam = r.camera("bob", NodeClock())
        out = []
        for _ in range(20):
            img, t = await cam.recv()
            out.append((t, loop.time(), img.shape))
        return r, cam, out

    r, cam, out = run_virtual(go)
    ts = [t for t, _, _ in out]
    assert all(b > a for a, b in zip(ts, ts[1:]))
    assert all(t == pytest.approx(now) for t, now, _ in out)  # stamped when delivered
    assert cam.dropped > 0
    p = r.params["bob"]
    assert ts[0] >= (p.exposure_ms + p.readout_ms + p.latency_ms) * 1e-3


def test_h264_codec_renders():
    r = room("harsh", w=W, h=H)
    r.show_at("alice", pattern(4), 0.0)
    a = r.capture_at("bob", 1.0, k=1)
    b = r.capture_at("bob", 1.0, k=1)
    assert np.array_equal(a, b) and a.shape == (720, 1280, 3)


# ---- record and replay ---------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix,codec", [(".nut", "ffv1"), (".mkv", "ffv1"), (".nut", "x264rgb")])
def test_a_recorded_stream_replays_identically(tmp_path, suffix, codec):
    from wccl.room.record import FileCamera, RecordingCamera, read_recording

    path = tmp_path / f"bob{suffix}"

    async def record():
        r = room("webcam", channel={"camera_width": 320, "camera_height": 240, "hfov_deg": 40.0})
        r.screen("alice").show(pattern(5))
        cam = RecordingCamera(r.camera("bob", NodeClock(offset=3.0)), path, codec=codec)
        got = [await cam.recv() for _ in range(5)]
        cam.close()
        return got

    async def replay():
        loop = asyncio.get_running_loop()
        cam = FileCamera(path, NodeClock(offset=3.0), at_end="raise")
        got = []
        for _ in range(5):
            img, t = await cam.recv()
            got.append((img, t, loop.time()))
        with pytest.raises(EOFError):
            await cam.recv()
        cam.close()
        return got

    recorded = run_virtual(record)
    replayed = run_virtual(replay)
    tol = 1e-6 if suffix == ".nut" else 1e-3  # Matroska keeps milliseconds only
    for (a, ta), (b, tb, now) in zip(recorded, replayed):
        assert np.array_equal(a, b)
        assert tb == pytest.approx(ta, abs=tol)
        assert now + 3.0 == pytest.approx(tb, abs=1e-9)  # paced on the node clock
    assert len(read_recording(path)) == 5


def test_file_camera_loops_or_waits_at_the_end(tmp_path):
    from wccl.room.record import FileCamera, StreamRecorder

    path = tmp_path / "two.nut"
    with StreamRecorder(path) as rec:
        rec.write(pattern(1), 1.0)
        rec.write(pattern(2), 1.1)

    async def go():
        looped = FileCamera(path, NodeClock(), at_end="loop")
        ts = [(await looped.recv())[1] for _ in range(4)]
        waiting = FileCamera(path, NodeClock(), at_end="wait")
        await waiting.recv(), await waiting.recv()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(waiting.recv(), timeout=10.0)
        looped.close(), waiting.close()
        return ts

    assert run_virtual(go) == pytest.approx([1.0, 1.1, 1.2, 1.3])


# ---- changes while the run goes -------------------------------------------------------------------------

def _mean_screen(r: SimulatedRoom, viewer: str, shown: str, t: float, k: int) -> float:
    """The mean of `viewer`'s capture k at `t` over where it sees `shown`'s screen."""
    x0, y0, x1, y1 = _screen_rows(r, viewer, shown)
    return float(r.capture_at(viewer, t, k)[y0:y1, x0:x1].mean())


def test_a_lamp_switched_on_mid_run_brightens_the_room_then_auto_exposure_darkens_the_screen():
    """A lamp over bob's camera at 1 s (room light and glare up): captures before it are as in a room
    without it, byte for byte; at the change the frame jumps brighter, then auto exposure turns the gain
    down and alice's screen comes out darker than before the lamp. The change is logged as it begins."""
    import structlog

    plain, lit = room("webcam"), room("webcam")
    lit.change("bob", 1.0, {"ambient": 0.6, "glare": 0.08})
    for r in (plain, lit):
        r.camera_started(0.0)
        r.show_at("alice", np.full((H, W, 3), 200, np.uint8), 0.0)
    assert np.array_equal(plain.capture_at("bob", 0.9, 27), lit.capture_at("bob", 0.9, 27))
    before = _mean_screen(lit, "bob", "alice", 0.9, 27)
    with structlog.testing.capture_logs() as logs:
        frame_at_once = float(lit.capture_at("bob", 1.02, 30).mean())
    assert [(e["event"], e["node"], e["at_s"]) for e in logs] == [("room_changed", "bob", 1.0)]
    assert frame_at_once > float(plain.capture_at("bob", 1.02, 30).mean()) + 10
    assert _mean_screen(lit, "bob", "alice", 4.0, 120) < _mean_screen(plain, "bob", "alice", 4.0, 120) - 10
    assert _mean_screen(lit, "bob", "alice", 4.0, 120) < before - 10
    assert lit.exposures["bob"].gain(4.0) < plain.exposures["bob"].gain(4.0) / 1.5
    assert lit.params["bob"].ambient == 0.6 and lit.params["alice"] == plain.params["alice"]


def test_a_nudge_glides_over_its_ramp_and_a_screen_turned_out_of_view_comes_back():
    """Bob's lid turned from 13 to 93 degrees over 1 s from 1 s, then back at 3 s: the yaw moves in steps
    (RAMP_STEP_S) and ends where asked; alice's screen leaves bob's view (logged) and comes back (logged).
    """
    import structlog

    r = room("webcam", channel=QUIET)
    r.change("bob", 1.0, {"yaw_deg": 93.0}, ramp_s=1.0)
    r.change("bob", 3.0, {"yaw_deg": 13.0})
    r.camera_started(0.0)
    r.show_at("alice", pattern(1), 0.0)
    yaws = []
    with structlog.testing.capture_logs() as logs:
        for k, t in enumerate((0.5, 1.1, 1.3, 1.6, 2.5, 3.1)):
            r.capture_at("bob", t, k)
            yaws.append(r.params["bob"].yaw_deg)
    assert yaws == [13.0, 13.0, 33.0, 53.0, 93.0, 13.0]
    events = [(e["event"], e["camera"], e["screen"]) for e in logs if e["event"] != "room_changed"]
    # (bob's screen turned with his lid: alice's camera loses it and finds it again too)
    assert sorted(events) == sorted([("room_screen_not_visible", "bob", "alice"), ("room_screen_not_visible", "alice", "bob"),
                                     ("room_screen_visible", "bob", "alice"), ("room_screen_visible", "alice", "bob")])
    assert "alice" in r.visible_from("bob")


@pytest.mark.parametrize("change,match", [
    ({"at_s": 5.0, "channel": {"camera_width": 640}}, "camera_width cannot change while the run goes"),
    ({"at_s": 5.0, "channel": {"ambientt": 0.5}}, "ambientt"),
    ({"at_s": -1.0, "channel": {"ambient": 0.5}}, "at_s"),
    ({"at_s": 5.0, "channel": {}}, "at least one channel parameter"),
])
def test_a_bad_change_in_a_room_file_names_itself(change, match):
    from wccl.config import ConfigError

    nodes = [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"], "changes": [change]}]
    with pytest.raises(ConfigError, match=match):
        make_config(room={"profile": "webcam", "nodes": nodes})
    with pytest.raises(ConfigError, match="the 'exact' profile has no channel to change"):
        make_config(room={"profile": "exact", "nodes": [
            nodes[0], {**nodes[1], "changes": [{"at_s": 5.0, "channel": {"ambient": 0.5}}]}]})


def test_changes_in_a_room_file_reach_the_room():
    cfg = make_config(room={"profile": "webcam", "nodes": [
        {"name": "alice", "roles": ["server", "worker"]},
        {"name": "bob", "roles": ["worker"], "changes": [{"at_s": 2.0, "ramp_s": 1.0, "channel": {"screen_brightness": 0.4}}]}]})
    r = SimulatedRoom.from_config(cfg)
    r.camera_started(0.0)
    r.capture_at("alice", 1.0, 0)
    assert r.params["bob"].screen_brightness == 1.0
    r.capture_at("alice", 3.5, 1)
    assert r.params["bob"].screen_brightness == pytest.approx(0.4)


def test_a_camera_slowed_to_15_fps_mid_run_captures_at_its_new_rate_and_back():
    """Bob's camera at 15 frames a second from 1 s to 3 s (a busy laptop), then 30 again: the captures it
    delivers are 1/30 s apart before, 1/15 s apart during, 1/30 s after."""
    async def go():
        r = room("webcam", channel={"jitter_ms": 0.0, "drop_prob": 0.0, "stall_rate_hz": 0.0})
        r.change("bob", 1.0, {"fps": 15.0})
        r.change("bob", 3.0, {"fps": 30.0})
        r.show_at("alice", pattern(1), 0.0)
        cam = r.camera("bob", NodeClock())
        loop = asyncio.get_running_loop()
        times = []
        while loop.time() < 4.5:
            await cam.recv()
            times.append(loop.time())
        return np.array(times)

    t = run_virtual(go)
    gaps = np.diff(t)
    assert np.allclose(gaps[(t[1:] > 0.3) & (t[1:] < 0.9)], 1 / 30, atol=1e-6)
    assert np.allclose(gaps[(t[1:] > 1.4) & (t[1:] < 2.9)], 1 / 15, atol=1e-6)
    assert np.allclose(gaps[(t[1:] > 3.4)], 1 / 30, atol=1e-6)
