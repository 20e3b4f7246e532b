"""`wccl doctor`: a bundle of what a node's camera filmed, its log, the room file and the versions; its replay."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest
from conftest import ROOT

from wccl import doctor


@pytest.mark.slow
def test_a_bundle_made_in_the_simulated_room_replays_and_says_what_the_camera_read(tmp_path):
    """Bob's camera for 3 room seconds of start-up in a two-laptop exact room: the bundle holds the room file
    as given, the recording, the log and the versions, never a key; replayed, it says how many frames of
    alice's screen decoded in the layouts she showed (start-up shows every layout of the ladder), and the
    command line prints it per layout."""
    room = tmp_path / "room.toml"
    room.write_text('[room]\nprofile = "exact"\n[[room.nodes]]\nname = "alice"\nroles = ["server", "worker"]\n'
                    '[[room.nodes]]\nname = "bob"\nroles = ["worker"]\n')
    out = tmp_path / "bundle.zip"
    about = doctor.make(room, "bob", 3.0, out)
    with zipfile.ZipFile(out) as z:
        assert sorted(z.namelist()) == sorted(doctor.BUNDLE_FILES)
        assert z.read("room.toml").decode() == room.read_text()
        log = [json.loads(line) for line in z.read("log.jsonl").decode().splitlines()]
        assert json.loads(z.read("about.json")) == about
    assert about["node"] == "bob" and about["versions"]["torch"].startswith("2.") and about["key_fingerprint"] is None
    assert {e["node"] for e in log if e["event"] == "node_started"} == {"alice", "bob"}
    r = doctor.replay(out)
    assert r["captures"] >= 60 and r["captures_without_code"] == 0, r
    assert set(r["read"]) - {"sender unread"} == {"alice"} and r["seen"] is None, r
    first = "68x124 cells of 10 px, 8 colours"
    assert r["read"]["alice"][first]["decoded"] >= 10 and len(r["read"]["alice"]) >= 3, r
    proc = subprocess.run([sys.executable, "-m", "wccl.doctor", "--replay", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert f"alice, {first}: {r['read']['alice'][first]['decoded']} frames decoded" in proc.stdout


def test_frames_whose_sender_marks_disagree_are_counted_apart():
    """A read whose two sender strips disagree has no sender (None): counted under "sender unread", never
    mixed into a rank's counts or a crash while sorting."""
    from collections import Counter

    tally = Counter({(1, 0, "decoded"): 4, (None, 0, "uncorrectable"): 2, (0, 1, "mixed"): 1, (1, 0, "mixed"): 3})
    got = doctor.by_sender(tally, ["alice", "bob"], ["fine", "coarse"].__getitem__)
    assert got == {"alice": {"coarse": {"mixed": 1}}, "bob": {"fine": {"decoded": 4, "mixed": 3}},
                   "sender unread": {"fine": {"uncorrectable": 2}}}
    assert list(got) == ["alice", "bob", "sender unread"]


@pytest.mark.parametrize("args,words", [
    (["--replay", "/no/such/bundle.zip"], "cannot read /no/such/bundle.zip: No such file or directory"),
    (["--config", "config.toml", "--node", "zed"], "--node zed: not a node of the room"),
    ([], "give --config and --node to make a bundle, or --replay BUNDLE to read one"),
])
def test_the_doctor_names_what_is_wrong_with_its_arguments(args, words):
    proc = subprocess.run([sys.executable, "-m", "wccl.doctor", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2 and words in proc.stderr, proc.stderr
