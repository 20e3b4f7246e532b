"""Rooms of many laptops (issue 14): aiming a laptop at a node, lids hiding screens, the shipped rooms."""

from __future__ import annotations

import numpy as np
import pytest

from wccl.config import load_config
from wccl.room import SimulatedRoom

W, H = 320, 180


def room(node_channels, nodes=("alice", "bob", "carol"), channel=None) -> SimulatedRoom:
    return SimulatedRoom(list(nodes), W, H, 30.0, profile="webcam", channel=channel, node_channels=node_channels)


def centre_px(r: SimulatedRoom, viewer: str, shown: str) -> np.ndarray:
    return r.project(viewer, shown, [[(W - 1) / 2, (H - 1) / 2]])[0]


def test_aim_turns_a_laptop_to_face_the_named_screen():
    # Three laptops in a row facing a fourth; alice aims at carol (beside her), not at the others' middle.
    pos = {"alice": [-0.4, 0, 0], "bob": [0.0, 0, 0.6], "carol": [0.4, 0, 0]}
    base = [{"position_m": pos[n], "yaw_deg": 0.0, "pitch_deg": 0.0, "roll_deg": 0.0} for n in ("alice", "bob", "carol")]
    aimed = [dict(base[0], aim="carol"), base[1], base[2]]
    r = room(aimed)
    cam = r.cams["alice"].camera
    c = centre_px(r, "alice", "carol")
    # Near the image centre: centred across; a little low, as the camera sits in the top bezel above the screen.
    assert abs(c[0] - (cam.width - 1) / 2) < 25 and 0 <= c[1] - (cam.height - 1) / 2 < 150
    assert "carol" in r.visible_from("alice")
    # The others keep their default aim; without `aim` alice faces the middle of bob and carol.
    r0 = room(base)
    assert np.allclose(r0.bodies["bob"].R, r.bodies["bob"].R)
    assert not np.allclose(r0.bodies["alice"].R, r.bodies["alice"].R)


def test_aim_with_yaw_on_top():
    pos = [{"position_m": [0, 0, 0], "aim": "bob", "yaw_deg": 10.0, "pitch_deg": 0.0, "roll_deg": 0.0},
           {"position_m": [0, 0, 0.6]}]
    r = SimulatedRoom(["alice", "bob"], W, H, 30.0, profile="webcam", node_channels=pos)
    fwd = r.bodies["alice"].R[:, 2]
    assert np.degrees(np.arccos(fwd @ np.array([0, 0, 1.0]))) == pytest.approx(10.0, abs=0.1)


@pytest.mark.parametrize("aim", ["zed", "alice"])
def test_aim_at_an_unknown_node_or_oneself_is_a_config_error(aim):
    with pytest.raises(ValueError, match=r"room\.nodes\[0\]\.channel\.aim: alice aims at .*known: bob, carol"):
        room([{"aim": aim}, {}, {}])
    with pytest.raises(ValueError, match="aim: expected a node's name"):
        room([{"aim": 3}, {}, {}])


def test_a_screen_behind_another_laptop_is_hidden_and_a_partly_hidden_one_loses_that_part():
    # alice looks at carol straight ahead; bob's lid stands between them.
    chans = [{"position_m": [0, 0, 0], "aim": "carol", "yaw_deg": 0.0, "pitch_deg": 0.0, "roll_deg": 0.0},
             {"position_m": [0, 0, 0.4], "aim": "alice", "yaw_deg": 180.0, "pitch_deg": 0.0, "roll_deg": 0.0},
             {"position_m": [0, 0, 0.8], "aim": "alice", "yaw_deg": 0.0, "pitch_deg": 0.0, "roll_deg": 0.0}]
    r = room(chans)
    assert r.hidden_from("alice")["carol"] == "hidden by bob"
    assert "carol" not in r.visible_from("alice")
    assert "bob" in r.hidden_from("alice")  # bob faces away (we see the back of his lid)
    # Shift bob sideways by most of a lid: carol's centre shows, part of her screen is behind bob.
    chans[1] = dict(chans[1], position_m=[0.15, 0, 0.4])
    r = room(chans, nodes=("alice", "bob", "carol"))
    assert r.visible_from("alice") == ["carol"]
    white = np.full((H, W, 3), 255, np.uint8)
    r.show_at("carol", white, 0.0)
    img = r.capture_at("alice", 1.0).astype(float).mean(axis=2)
    pts = r.project("alice", "carol", [[W * 0.05, H / 2], [W * 0.95, H / 2]])
    (x0, y0), (x1, y1) = np.round(pts).astype(int)
    # One end of carol's screen is lit, the other end is behind bob's dark lid.
    ends = sorted([img[y0 - 2:y0 + 3, x0 - 2:x0 + 3].mean(), img[y1 - 2:y1 + 3, x1 - 2:x1 + 3].mean()])
    assert ends[1] > 3 * ends[0] + 20, ends


def test_circle_4_every_camera_sees_the_three_others():
    r = SimulatedRoom.from_config(load_config("rooms/circle-4.toml"))
    for n in r.nodes:
        assert r.visible_from(n) == [m for m in r.nodes if m != n]
        assert r.hidden_from(n) == {}


def test_the_shipped_two_laptop_room_is_unchanged():
    r = SimulatedRoom.from_config(load_config("rooms/two-laptops-sim.toml"))
    assert r.visible_from("alice") == ["bob"] and r.visible_from("bob") == ["alice"]
    # Pose as before `aim` existed: bob straight ahead at 0.6 m, turned by the profile's yaw/pitch/roll.
    assert np.allclose(r.bodies["alice"].origin, [0, 0, -0.3]) and np.allclose(r.bodies["bob"].origin, [0, 0, 0.3])
    assert r.views[("alice", "bob")].distance_m == pytest.approx(0.6, abs=0.1)


def _rows(path: str):
    """The room of two facing rows, its rank order, and per camera the screens it should read (across, diagonal)."""
    r = SimulatedRoom.from_config(load_config(path))
    n = len(r.nodes) // 2
    want = {}
    for k in range(n):
        for row, other in (("a", "b"), ("b", "a")):
            want[f"{row}{k}"] = [f"{other}{j}" for j in (k - 1, k, k + 1) if 0 <= j < n]
    return r, want


@pytest.mark.parametrize("path", ["rooms/table-8.toml", "rooms/rows-6.toml"])
def test_two_rows_each_camera_reads_across_and_diagonally_not_its_own_row(path):
    r, want = _rows(path)
    assert r.nodes == [f"{row}{k}" for k in range(len(r.nodes) // 2) for row in "ab"]  # rank order a0, b0, a1, ...
    cfg = load_config(path)
    from wccl.distributed.rank_node import collective_ladder

    # the ladder's 22 px cells (start-up picks its 17 px cells here, which read a little smaller than the
    # placement table's 4.5 camera px on the diagonals' foreshortened sides: `python -m wccl.lab startup`)
    layout = next(c.layout for c, _ in collective_ladder(cfg) if c.layout.cell_px == 22)
    h, w = layout.size_px
    W, H = r.screen_w, r.screen_h
    grid = [[(W - w) / 2, (H - h) / 2], [(W + w) / 2, (H - h) / 2], [(W + w) / 2, (H + h) / 2], [(W - w) / 2, (H + h) / 2]]
    for n in r.nodes:
        seen = r.visible_from(n)
        assert set(want[n]) <= set(seen), (n, seen)
        assert not [m for m in seen if m[0] == n[0]], (n, seen)  # its own row shows it the backs of lids
        assert all(r.hidden_from(n)[m] == "facing away" for m in r.nodes if m != n and m[0] == n[0])
        cam = r.cams[n].camera
        for m in want[n]:  # the whole code is in the picture, at least 5 camera px per cell
            c = r.project(n, m, grid)
            assert (c[:, 0] > 2).all() and (c[:, 0] < cam.width - 3).all(), (n, m, c)
            assert (c[:, 1] > 2).all() and (c[:, 1] < cam.height - 3).all(), (n, m, c)
            assert np.linalg.norm(c[1] - c[0]) / (layout.cols + 2) > 5.0
        # Straight across: the screen facing it, near the image centre.
        across = want[n][1] if len(want[n]) == 3 else next(m for m in want[n] if m[1:] == n[1:])
        assert across[1:] == n[1:] and r.views[(n, across)].angle_deg < 20


@pytest.mark.parametrize("path", ["rooms/table-8.toml", "rooms/rows-6.toml", "rooms/rows-4-wide.toml",
                                  "rooms/classroom-16.toml"])
def test_two_rows_sight_has_a_ring_through_every_rank(path):
    from protocols.algorithms import Sight

    r, want = _rows(path)
    rank = {n: i for i, n in enumerate(r.nodes)}
    edges = {(rank[n], rank[m]): 1.0 for n in r.nodes for m in want[n]}
    ring = Sight(len(r.nodes), edges, 0.3).ring()
    assert ring is not None and sorted(ring) == list(range(len(r.nodes)))
    for a, b in zip(ring, ring[1:] + ring[:1]):
        assert (b, a) in edges  # b's camera reads a's screen, straight across or diagonally
    # Without the diagonals (straight across only) the pairs cannot be joined into one ring.
    straight = {(i, j): 1.0 for (i, j) in edges if r.nodes[i][1:] == r.nodes[j][1:]}
    assert Sight(len(r.nodes), straight, 0.3).ring() is None


def test_a_hand_over_a_camera_blacks_out_its_captures_for_that_time_only():
    from protocols.layout import GridLayout, render

    r = SimulatedRoom(["alice", "bob"], 1280, 720, 30.0, profile="exact")
    grid = GridLayout(28, 50, 8, 24)
    r.show_at("bob", render(bytes(grid.frame_bytes), grid, 1280, 720, sender=1, parity=0), 0.0)
    r.camera_started(10.0)  # covers count from the first camera's start
    r.cover("alice", 2.0, 3.0)
    assert r.capture_at("alice", 11.9).any()
    assert not r.capture_at("alice", 12.5).any()  # a black image, the room's size
    assert r.capture_at("alice", 12.5).shape == r.capture_at("alice", 13.0).shape
    assert r.capture_at("alice", 13.0).any() and r.capture_at("bob", 12.5) is not None
    with pytest.raises(ValueError, match="0 <= start < end"):
        r.cover("alice", 3.0, 2.0)


def test_covered_s_in_a_room_file_is_checked():
    from wccl.config import ConfigError, parse_config
    from conftest import shipped_config_dict

    data = shipped_config_dict()
    data["room"]["nodes"][1]["covered_s"] = [[5.0, 4.0]]
    with pytest.raises(ConfigError, match="covered_s needs"):
        parse_config(data, "t")
    data["room"]["nodes"][1]["covered_s"] = [[4.0, 5.0]]
    room = SimulatedRoom.from_config(parse_config(data, "t"))
    name = data["room"]["nodes"][1]["name"]
    room.camera_started(0.0)
    assert room.covered(name, 4.5) and not room.covered(name, 5.5)


def test_screens_far_apart_at_a_slant_read_in_the_ladders_biggest_cells_only():
    """rooms/far-slanted.toml (13.3-inch screens 1.2 m apart, each turned 30 degrees, 78-degree lenses):
    alice's camera reads bob's frames in 32 px cells, the ladder's last layout, and not in 22 px cells."""
    import cv2

    from protocols.layout import render
    from wccl.distributed.rank_node import collective_ladder
    from wccl.imaging import reader

    cv2.setNumThreads(1)
    cfg = load_config("rooms/far-slanted.toml")
    ladder = [c for c, _ in collective_ladder(cfg)]
    r = SimulatedRoom.from_config(cfg)
    rng = np.random.default_rng(0)
    read = {}
    for codec in (ladder[-2], ladder[-1]):
        grid, model, ok = codec.layout, reader.ColourModel(codec.layout), 0
        for i in range(4):
            frame = codec.encode(rng.bytes(codec.payload_per_frame), count=1, session=1, sender=1, stream="grad",
                                 step=i)[0]
            t = 10.0 * len(read) + i
            r.show_at("bob", render(frame, grid, cfg.screen.width, cfg.screen.height, sender=1, parity=i & 1), t)
            img = r.capture_at("alice", t + 0.5, k=i)
            for q in reader.find_quads(img, grid):
                code = reader.read_quad(img, q, grid, model)
                if code is not None and not code.mixed:
                    try:
                        codec.decode(code.symbols, code.confidence)
                        ok += 1
                    except ValueError:
                        pass
        read[grid.cell_px] = ok
    assert read == {22: 0, 32: 4}
