"""A node's camera recorded in one run and replayed in the next decodes identically."""

from __future__ import annotations

import pytest
from conftest import make_config, run_room

FAST = {
    "schedule": {"preset": "custom", "start_s": 3.0, "phases": [
        {"name": "compute", "seconds": 0.1}, {"name": "uplink", "seconds": 0.4}, {"name": "reduce", "seconds": 0.05},
        {"name": "downlink", "seconds": 0.4}, {"name": "apply", "seconds": 0.05}]},
    "link": {"rows": 60, "cols": 110, "cell_px": 10, "hold_s": 0.083},
    "training": {"steps": 2},
}


def _nodes(key, **bob):
    # One room key for both runs: a recording is read with the key it was made under (each run of a
    # simulated room that names none draws a fresh one, and a fresh key refuses the old frames).
    return {"key_file": str(key),
            "nodes": [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"], **bob}]}


@pytest.mark.slow
def test_replayed_recording_decodes_identically(tmp_path):
    path = tmp_path / "bob.nut"
    key = tmp_path / "room.key"
    key.write_bytes(bytes(range(32)))
    live = \
        run_room(make_config(**FAST, room=_nodes(key, record_to=str(path))))
    assert path.stat().st_size > 0
    replay = run_room(make_config(**FAST, room=_nodes(key, camera="file", camera_file=str(path))))
    assert live["link"]["bob"]["tensors_avg"] == 2  # the live run really delivered through bob's camera
    # The replay is of another run by definition, so the room runs without the run handshake: the frames
    # that the live run refused before its handshake completed are used too; everything else is the same.
    a, b = dict(live["link"]["bob"]), dict(replay["link"]["bob"])
    unconfirmed = a.pop("frames_rejected_unconfirmed_sender", 0)
    assert b.pop("frames_ok") == a.pop("frames_ok") + unconfirmed and "frames_rejected_unconfirmed_sender" not in b
    assert b == a
    assert replay["nodes"]["bob"]["worker"] == live["nodes"]["bob"]["worker"]
    assert replay["replicas_identical"] and live["replicas_identical"]
