"""Start-up picks the layout: frames in every candidate layout, the densest that gets through wins."""

from __future__ import annotations

import json

import pytest

from conftest import make_config, run_room

TWO = [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"]}]


def _events(buf, name):
    return [e for e in (json.loads(line) for line in buf.getvalue().splitlines()) if e["event"] == name]


@pytest.mark.parametrize("profile, want", [("exact", 0), ("harsh", 2)])
def test_startup_picks_the_densest_layout_that_gets_through(profile, want, _quiet_logs):
    cfg = make_config(training={"steps": 3, "eval_every": 0}, link={"choose": "auto"},
                      room={"profile": profile, "nodes": TWO})
    result = run_room(cfg)
    chosen = _events(_quiet_logs, "layout_chosen")
    assert len(chosen) == 1 and chosen[0]["layout"] == want
    table = chosen[0]["candidates"]
    print(profile, [(t["uplink_frames_ok"], t["downlink_frames_ok"]) for t in table])  # BENCHMARKS.md (-s)
    assert len(table) == 3
    if profile == "harsh":  # the 10 and 12 px cells do not survive the harsh camera; 16 px in 4 colours does
        assert table[0]["uplink_frames_ok"] == table[1]["uplink_frames_ok"] == 0.0
        assert min(table[2]["uplink_frames_ok"], table[2]["downlink_frames_ok"]) >= 0.5
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
