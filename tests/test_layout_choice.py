"""Start-up picks the layout: frames in every candidate layout, the densest that gets through wins."""

from __future__ import annotations

import json

import pytest

from conftest import make_config, run_room

TWO = [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"]}]


def _events(buf, name):
    return [e for e in (json.loads(line) for line in buf.getvalue().splitlines()) if e["event"] == name]


@pytest.mark.parametrize("profile, want", [("exact", 0), ("harsh", 1)])
def test_startup_picks_the_densest_layout_that_gets_through(profile, want, _quiet_logs):
    cfg = make_config(training={"steps": 3, "eval_every": 0}, link={"choose": "auto"},
                      room={"profile": profile, "nodes": TWO})
    result = run_room(cfg)
    chosen = _events(_quiet_logs, "layout_chosen")
    assert len(chosen) == 1 and chosen[0]["layout"] == want
    table = chosen[0]["candidates"]
    print(profile, [(t["uplink_frames_ok"], t["downlink_frames_ok"]) for t in table])  # BENCHMARKS.md (-s)
    assert len(table) == 2
    if profile == "harsh":  # the 12 px cells do not survive the harsh camera; 16 px in 4 colours does
        assert table[0]["uplink_frames_ok"] == 0.0
        assert min(table[1]["uplink_frames_ok"], table[1]["downlink_frames_ok"]) >= 0.5
    else:
        assert all(t["uplink_frames_ok"] > 0.5 for t in table)
    switched = {e["node"] for e in _events(_quiet_logs, "layout_switched") if e["layout"] == want}
    assert switched == ({"alice", "bob"} if want != 0 else set())  # both screens use it (0: they already did)
    # and the training runs over it
    assert result["applied"] == 3 and result["replicas_identical"]
    assert result["link"]["alice"]["tensors_grad"] == 3 and result["link"]["bob"]["tensors_avg"] == 3


def test_a_pinned_layout_is_used_as_it_is(_quiet_logs):
    cfg = make_config(training={"steps": 2, "eval_every": 0}, link={"choose": "pinned"}, room={"nodes": TWO})
    result = run_room(cfg)
    assert not _events(_quiet_logs, "layout_chosen") and not _events(_quiet_logs, "layout_switched")
    assert result["applied"] == 2 and result["replicas_identical"]


@pytest.mark.slow
def test_collectives_pick_the_layout_both_cameras_read(tmp_path):
    """Two webcam laptops 1 m apart (rooms/two-laptops-sim.toml moved apart): the 10 and 12 px cells of the
    collectives' ladder's first layouts do not read at that distance, the 16 px ones do.
    Discovery measures every layout of the ladder on every edge (none read well enough lets it stop early)
    and both ranks pick the same, readable one (the dense layout, pinned as collectives used it before, gives
    these cameras no screen to read)."""
    import re

    from test_distributed import EXAMPLES, ROOT, launch

    room = (ROOT / "rooms" / "two-laptops-sim.toml").read_text()
    room = re.sub(r'level = "warning"', 'level = "info"', room)
    room = room.replace('roles = ["worker"]', 'roles = ["worker"]\nchannel = { position_m = [0.0, 0.0, 0.5] }')
    room = re.sub(r'(roles = \["server", "worker"\].*)', r'\1\nchannel = { position_m = [0.0, 0.0, -0.5] }', room)
    assert room.count("position_m") == 2 and "\n[link]" not in room
    cfg = tmp_path / "far.toml"
    cfg.write_text(room)
    proc, lines = launch(cfg, EXAMPLES / "collectives_hello.py", timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [d["all_reduce"] for d in lines] == [[10.0, 12.0, 14.0, 16.0]] * 2
    known = [json.loads(x) for x in proc.stderr.splitlines() if '"event": "sight_known"' in x]
    assert sorted(e["node"] for e in known) == ["alice", "bob"]
    for e in known:
        assert (e["layout"], e["cell_px"]) == (4, 16)
        assert all(g == {} for g in e["ladder"][:4])  # the 10 and 12 px layouts: no edge at this distance
        assert e["measured"] == {"alice": 5, "bob": 5} and not e["second_round"]
        assert set(e["edges"]) == {"alice<-bob", "bob<-alice"}
    used = [json.loads(x) for x in proc.stderr.splitlines() if '"event": "layout_used"' in x]
    assert sorted((e["node"], e["cell_px"]) for e in used) == [("alice", 16), ("bob", 16)]
