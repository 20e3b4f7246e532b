"""No input from outside breaks a node: property tests per entry point, and a short run of the fuzzer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols import fec, frames, snapshot, transfer
from protocols.layout import GridLayout
from protocols.link import LinkCodec
from protocols.receiver import TransferReceiver
from protocols.security import Handshake, RoomKey

KEY = RoomKey(bytes(32))
PREFIX = st.sampled_from([b"", bytes([frames.MAGIC, transfer.VERSION]), bytes([frames.MAGIC, transfer.VERSION - 1])])


@settings(max_examples=400, deadline=None)
@given(prefix=PREFIX, body=st.binary(max_size=3000))
def test_any_bytes_as_a_transfer_frame_are_refused_with_a_reason(prefix, body):
    rx = TransferReceiver(1, 2, 1, KEY, Handshake(1, 2, 0x0B0B))
    r = rx.receive(prefix + body)
    assert r.refused and r.data is None


@settings(max_examples=400, deadline=None)
@given(prefix=PREFIX, body=st.binary(max_size=3000))
def test_any_bytes_as_a_listeners_frame_raise_only_frame_errors_and_deliver_nothing(prefix, body):
    # A listener (an observer's FrameDecoder) checks a frame and hands it to its assembler: no handshake.
    try:
        f = transfer.parse_message(prefix + body, KEY)
    except frames.FrameError:
        return
    assert not isinstance(transfer.TransferAssembler().add(f, KEY), bytes)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2000))
def test_any_bytes_as_a_snapshot_raise_only_snapshot_errors(data):
    try:
        snapshot.decode_snapshot(data)
    except snapshot.SnapshotError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 1200), hi=st.integers(1, 300), with_conf=st.booleans(), seed=st.integers(0, 2**31))
def test_any_cells_raise_only_uncorrectable(n, hi, with_conf, seed):
    codec = LinkCodec(GridLayout(rows=24, cols=40, colours=8, cell_px=10), code_rate=0.8)
    rng = np.random.default_rng(seed)
    sym = rng.integers(0, hi, n).astype(np.uint16 if hi > 255 else np.uint8)
    conf = rng.random(n).astype(np.float32) if with_conf else None
    try:
        codec.decode_message(sym, conf)
    except fec.UncorrectableFrame:
        pass


@pytest.mark.slow
def test_the_fuzzer_finds_nothing_in_a_short_run():
    from wccl.lab.fuzz import ENTRY_POINTS, fuzz

    r = fuzz(16.0, seed=1)
    assert set(r["entry_points"]) == set(ENTRY_POINTS)
    for name, v in r["entry_points"].items():
        assert v["executions"] > 20 and v["crashes"] == 0 and v["hangs"] == 0 and v["wrong_deliveries"] == 0, (name, v)
    # the real captures (fixed key and run nonces, so the same pixels every run) deliver alice's tensor
    assert r["entry_points"]["camera_images"]["tensors_delivered"] >= 1


def test_what_the_fuzzer_found_stays_fixed(tmp_path):
    """Each was a crash once: now a one-line error of the entry point's own kind."""
    import struct

    from protocols import snapshot as snap
    from wccl.runtime import recovery
    from conftest import shipped_config_dict
    from wccl.config import ConfigError, load_config, parse_config
    from wccl.imaging import reader
    from wccl.training.data import DataError, read_idx

    idx = tmp_path / "x-idx3-ubyte"
    idx.write_bytes(struct.pack(">HBB3I", 0, 8, 3, 0, 2**32 - 1, 2**32 - 1))  # a zero beside huge dims
    with pytest.raises(DataError, match="cannot be read"):
        read_idx(idx)
    ckpt = tmp_path / "c.ckpt"
    body = b'{"session": 1, "rng": "\\u00e9"}\n' + snap.encode_snapshot(snap.Snapshot(0, 0, {}))
    ckpt.write_bytes(KEY.tag(body, recovery.PERSON).hex().encode() + b"\n" + body)  # non-ASCII base64, tagged
    with pytest.raises(recovery.CheckpointError, match="corrupt"):
        recovery.load_checkpoint(ckpt, 1, KEY)
    data = shipped_config_dict()
    data["training"]["dataset"] = "a" * 5000  # a name the system refuses to look up
    with pytest.raises(ConfigError, match="no such folder"):
        parse_config(data, "c.toml", tmp_path)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / ("b" * 5000))
    assert reader.image_problem(np.zeros((720, 1280, 3), np.float32)) == "bad_dtype"
    assert reader.image_problem(np.zeros((720, 1280), np.uint8)) == "bad_shape"
    assert reader.image_problem(np.zeros((8, 8, 3), np.uint8)) == "too_small"
    tracker = reader.QuadTracker(LinkCodec(GridLayout(rows=24, cols=40, colours=8, cell_px=10)).layout)
    tracker.quads = [reader.Quad(np.array([[600, 300], [700, 300], [700, 400], [600, 400]], np.float32))]
    assert tracker(np.zeros((32, 32, 3), np.uint8)) == []  # a smaller image than the tracked code's place
