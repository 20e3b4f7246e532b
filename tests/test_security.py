"""The room key: frame MACs, sealed payloads, the run handshake, key files, authenticated checkpoints."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import make_config
from protocols import frames, security, transfer
from protocols import snapshot as snap
from protocols.security import Handshake, RoomKey
from wccl.config import ConfigError, parse_config
from wccl.keys import room_key
from wccl.runtime.recovery import CheckpointError, load_checkpoint, save_checkpoint
from wccl.keys import new_run_nonce

MSG = 1900
KEY = RoomKey(bytes(range(32)), "test")
OTHER = RoomKey(bytes(range(1, 33)), "other")


def _transfer(data: bytes, key: RoomKey = KEY, nonce: int = 77, tid: int = 3):
    header = transfer.TransferHeader(7, 1, tid, 11, "allreduce", "float32", len(data) // 4, 0, b"", 0, 0b01)
    out = transfer.outgoing(header, data, message_bytes=MSG, key=key, run_nonce=nonce, repair=2)
    return out.header, out.fountain


def _rebuild(header, tr, key: RoomKey, nonce: int = 77):
    asm = transfer.TransferAssembler()
    for i in range(len(tr.packets)):
        f = transfer.parse_message(transfer.frame_message(header, tr, i, message_bytes=MSG, acks=(),
                                                          run_nonce=nonce, key=KEY), KEY)
        got = asm.add(f, key)
        if got is not None:
            return got, asm
    return None, asm


def test_payloads_are_sealed_and_open_only_under_their_key_nonce_and_header():
    data = np.arange(100, dtype=np.float32).tobytes()
    header, tr = _transfer(data)
    assert len(tr.packets[0]) and data not in b"".join(tr.packets)  # the tensor bytes never show in the clear
    got, asm = _rebuild(header, tr, KEY)
    assert got == data and asm.ack_of(1).has(3)
    for key, nonce in ((OTHER, 77), (KEY, 78)):
        got, asm = _rebuild(header, tr, key, nonce)
        assert got is None and asm.losses["payload_not_authentic"] >= 1 and not asm.ack_of(1).has(3)


@settings(max_examples=80, deadline=None)
@given(pos=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_a_frame_under_another_key_or_with_a_flipped_bit_is_refused(pos, bit):
    header, tr = _transfer(b"abcdefgh" * 20)
    msg = transfer.frame_message(header, tr, 0, message_bytes=MSG, acks=(), run_nonce=5, key=KEY)
    assert transfer.parse_message(msg, KEY).run_nonce == 5
    for key in (OTHER, security.NO_KEY):
        with pytest.raises(frames.FrameError, match="check_mismatch"):
            transfer.parse_message(msg, key)
    bad = bytearray(msg)
    bad[pos % (transfer.HEADER_BYTES + len(tr.packets[0]) + frames.CHECK_BYTES)] ^= 1 << bit
    with pytest.raises(frames.FrameError):
        transfer.parse_message(bytes(bad), KEY)


def test_the_built_in_runs_frames_are_keyed_and_sealed_too():
    from protocols import streams
    from protocols.layout import GridLayout
    from protocols.link import LinkCodec

    codec = LinkCodec(GridLayout(24, 40, 8, 10), 0.8)
    data = b"hello" * 40
    fbs = codec.encode(data, count=codec.frames_needed(len(data) + streams.OVERHEAD + security.TAG_BYTES) + 1,
                       session=1, sender=1, stream="params", step=0, key=KEY)
    msgs = [_message_of(codec, fb) for fb in fbs]
    assert transfer.parse_message(msgs[0], KEY).sender == 1
    with pytest.raises(frames.FrameError, match="check_mismatch"):
        transfer.parse_message(msgs[0], OTHER)
    assert not any(data[:16] in m for m in msgs)  # encrypted
    asm = transfer.TransferAssembler()
    got = [asm.add(transfer.parse_message(m, KEY), KEY) for m in msgs]
    assert any(isinstance(t, bytes) and streams.unwrap(t) == (0, 0, data) for t in got)


def _message_of(codec, fb: bytes) -> bytes:
    """The corrected message of a frame's bytes, as the camera reads its cells."""
    from protocols import cells

    return codec.decode_message(cells.bytes_to_symbols(fb, codec.layout.colours, codec.layout.n_data))[0]


def test_the_built_in_run_uses_only_frames_of_this_run(_quiet_logs):
    """Bob (a worker) reads Alice's screen: her frames count only once her status frame echoes Bob's run
    nonce; then a recording of another run (her nonce then, echoing Bob's nonce then) and a frame of this
    run shown again past the replay window are refused by reason, and nothing of them is delivered."""
    from actors.frame_decoder import FrameDecoder
    from conftest import run_virtual
    from protocols import streams
    from protocols.layout import GridLayout, render
    from protocols.link import LinkCodec
    from protocols.messages import AcksChanged, Capture, FrameTiming, TensorReceived
    from wccl.runtime.harness import ActorHarness

    codec = LinkCodec(GridLayout(40, 70, 8, 12), 0.8)
    hs = Handshake(1, 2, new_run_nonce(), window_s=4.0)
    alice, alice_then, bob_then = new_run_nonce(), new_run_nonce(), new_run_nonce()
    data = bytes(range(200))

    def tensor(k: int, nonce: int, shown_s: float) -> bytes:
        """Alice's word on step k (her transfer k + 1) as the built-in run's server shows it, to bob."""
        payload = streams.wrap(0, k, data)
        head = transfer.TransferHeader(1, 0, k + 1, k, "avg", "uint8", len(payload), 0, b"", 0, 0b10)
        out = transfer.outgoing(head, payload, message_bytes=codec.message_bytes, ranks=2, key=KEY, run_nonce=nonce,
                                count=1)
        return codec.encode_message(out.message(0, message_bytes=codec.message_bytes, shown_us=round(shown_s * 1e6),
                                                run_nonce=nonce, key=KEY))

    def status(nonce: int, echo: tuple[int, int], shown_s: float) -> bytes:
        return codec.encode_message(transfer.status_message(session=1, sender=0, acks=(),
                                                            message_bytes=codec.message_bytes,
                                                            shown_us=round(shown_s * 1e6), run_nonce=nonce, echo=echo,
                                                            key=KEY))

    frames_ = [
        tensor(0, alice, 1.0),  # she has not read Bob yet: unconfirmed
        status(alice, (alice, hs.nonce), 1.5),  # she echoes Bob's nonce: trusted from now on
        tensor(1, alice, 2.0),  # delivered
        status(alice_then, (alice_then, bob_then), 2.5),  # filmed in another run
        tensor(2, alice_then, 3.0),  # filmed in another run
        tensor(3, alice, 9.0),  # this run, later: delivered
        tensor(4, alice, 4.5),  # this run, shown again 4.5 s after its time: too old
    ]
    shows = [render(fb, codec.layout, 1280, 720, sender=0, parity=i & 1) for i, fb in enumerate(frames_)]

    async def go():
        async with ActorHarness(FrameDecoder, node="bob", codec=codec, session=1, node_names=["alice", "bob"],
                                key=KEY, handshake=hs, transfers=transfer.TransferAssembler()) as dec:
            for i, img in enumerate(shows):
                await dec.send(Capture(sender="bob", time=float(i), image=img, seq=i))
            await dec.settle()
        return dec

    dec = run_virtual(go)
    got = dec.of_type(TensorReceived)
    assert [(t.step, t.base, t.payload) for t in got] == [(1, 1, data), (3, 3, data)]
    link = dec.results["link"]
    assert (link["frames_rejected_unconfirmed_sender"], link["frames_rejected_other_run"],
            link["frames_rejected_replayed_old"], link["frames_ok"]) == (1, 2, 1, 3), link
    assert [m.shown for m in dec.of_type(FrameTiming)] == [1.5, 2.0, 9.0]  # the clock sync hears only this run
    echoes = dec.of_type(AcksChanged)
    assert echoes and echoes[-1].echo == (alice, hs.nonce) and echoes[-1].trusts == 0b01
    assert hs.trusted == {0: alice}


def _status(hs: Handshake, shown_us: int = 0) -> transfer.TransferFrame:
    msg = transfer.status_message(session=1, sender=hs.rank, acks=(), message_bytes=MSG, shown_us=shown_us,
                                  run_nonce=hs.nonce, trusts=hs.trust_mask(), echo=hs.echo(), key=KEY)
    return transfer.parse_message(msg, KEY)


def _hear(hs: Handshake, f: transfer.TransferFrame) -> str | None:
    return hs.heard(f.sender, f.run_nonce, f.echo, f.trusts, f.shown_us)


def test_the_handshake_trusts_only_this_runs_nonces():
    a, b = Handshake(0, 2, new_run_nonce()), Handshake(1, 2, new_run_nonce())
    old_b = Handshake(1, 2, new_run_nonce())  # bob in an earlier run, filmed: his frames echo an alice that no longer runs
    old_b.heard(0, 12345, None, 0, 0)
    recorded = _status(old_b)
    assert _hear(a, recorded) == "unconfirmed_sender"
    assert _hear(b, _status(a)) == "unconfirmed_sender"  # alice has not echoed bob's nonce yet
    assert _hear(a, _status(b)) is None and a.trusted == {1: b.nonce}  # bob echoes alice: fresh
    assert not a.complete  # alice trusts bob, but does not know yet that bob trusts her
    assert _hear(b, _status(a)) is None and b.complete  # alice echoes bob and trusts him: bob is done
    assert _hear(a, _status(b)) is None and a.complete
    assert _hear(a, recorded) == "other_run" and a.trusted == {1: b.nonce}  # replays change nothing
    # Within the run: a frame shown long before bob's latest is a replay.
    assert _hear(a, _status(b, shown_us=100_000_000)) is None
    assert _hear(a, _status(b, shown_us=100_000_000 - int(security.REPLAY_WINDOW_S * 1e6) - 1)) == "replayed_old"
    # Bob restarts: his new nonce is trusted once he echoes alice's again.
    b2 = Handshake(1, 2, new_run_nonce())
    b2.heard(0, a.nonce, None, 0, 0)
    assert _hear(a, _status(b2)) is None and a.trusted[1] == b2.nonce


def test_key_files_passphrases_and_errors(tmp_path, monkeypatch):
    path = tmp_path / "room.key"
    out = subprocess.run([sys.executable, "-m", "wccl.keys", "new", str(path)], capture_output=True, text=True)
    assert out.returncode == 0 and len(path.read_bytes()) == 32 and (path.stat().st_mode & 0o777) == 0o600
    again = subprocess.run([sys.executable, "-m", "wccl.keys", "new", str(path)], capture_output=True, text=True)
    assert again.returncode == 2 and "never overwritten" in again.stderr
    fp = RoomKey(path.read_bytes()).fingerprint
    raw = make_config().model_dump(mode="json")
    raw["room"]["key_file"] = "room.key"
    cfg = parse_config(raw, "t.toml", tmp_path)
    assert room_key(cfg).fingerprint == fp and room_key(cfg).authenticated
    (tmp_path / "hex.key").write_text(path.read_bytes().hex() + "\n")
    raw["room"]["key_file"] = "hex.key"
    assert room_key(parse_config(raw, "t.toml", tmp_path)).fingerprint == fp
    (tmp_path / "short.key").write_bytes(b"123")
    raw["room"]["key_file"] = "short.key"
    with pytest.raises(ConfigError, match="not a room key"):
        room_key(parse_config(raw, "t.toml", tmp_path))
    raw["room"]["key_file"] = "missing.key"
    with pytest.raises(ConfigError, match="python -m wccl.keys new"):
        room_key(parse_config(raw, "t.toml", tmp_path))
    del raw["room"]["key_file"]
    raw["room"]["key_env"] = "WCCL_TEST_PASSPHRASE"
    monkeypatch.delenv("WCCL_TEST_PASSPHRASE", raising=False)
    with pytest.raises(ConfigError, match="WCCL_TEST_PASSPHRASE is not set"):
        room_key(parse_config(raw, "t.toml", tmp_path))
    monkeypatch.setenv("WCCL_TEST_PASSPHRASE", "correct horse battery staple")
    k1 = room_key(parse_config(raw, "t.toml", tmp_path))
    assert k1.secret == security.key_from_passphrase("correct horse battery staple")
    monkeypatch.setenv("WCCL_TEST_PASSPHRASE", "correct horse battery stapler")
    assert room_key(parse_config(raw, "t.toml", tmp_path)).fingerprint != k1.fingerprint
    raw["room"]["key_file"] = "room.key"
    with pytest.raises(ConfigError, match="not both"):
        parse_config(raw, "t.toml", tmp_path)
    # A simulated room that names no key: the run's ephemeral key, else none.
    monkeypatch.delenv("WCCL_RUN_KEY", raising=False)
    plain = make_config()
    assert not room_key(plain).authenticated
    assert room_key(plain, ephemeral=os.urandom(32)).authenticated
    monkeypatch.setenv("WCCL_RUN_KEY", "zz")
    with pytest.raises(ConfigError, match="WCCL_RUN_KEY"):
        room_key(plain)


def test_checkpoints_are_refused_whole_when_truncated_altered_or_foreign(tmp_path):
    path = tmp_path / "c.ckpt"
    state = snap.Snapshot(5, 1, {"w": np.arange(6, dtype=np.float32)})
    save_checkpoint(path, {"session": 3, "node": "alice"}, state, b"rng!", KEY)
    meta, got, rng = load_checkpoint(path, 3, KEY)
    assert got.digest() == state.digest() and rng == b"rng!" and meta["node"] == "alice"
    raw = path.read_bytes()
    for bad in (raw[:-1], raw[: len(raw) // 2], raw[:-4] + b"\0\0\0\1", raw.replace(b'"alice"', b'"mallo"')):
        path.write_bytes(bad)
        with pytest.raises(CheckpointError, match="truncated or altered"):
            load_checkpoint(path, 3, KEY)
    path.write_bytes(raw)
    with pytest.raises(CheckpointError, match="another room key"):
        load_checkpoint(path, 3, OTHER)
    with pytest.raises(CheckpointError, match="session 3"):
        load_checkpoint(path, 4, KEY)


# ---- an intruder in the room (end to end: the launcher, the room process, two ranks, the intruder) ----


def _refused(stderr: str) -> dict[str, dict]:
    """Each node's frames refused by reason, summed over its nodes (the pairing's, then the run's)."""
    from wccl.launch import json_objects

    out: dict[str, dict] = {}
    for d in json_objects(stderr):
        if d.get("event") == "frames_refused":
            total = out.setdefault(d["node"], {"losses": {}})
            for k, v in d.items():
                if isinstance(v, int) and not isinstance(v, bool):
                    total[k] = total.get(k, 0) + v
            total["losses"].update(d.get("losses") or {})
    return out


@pytest.mark.slow
def test_an_intruder_changes_nothing(tmp_path):
    """The ranks pair over the light (the room names no key) with the intruder's frames on view, then run.
    Random, forged, replayed (this run's and a filmed earlier run's, its pairing included) and bit-flipped
    frames from a laptop without the key: every one refused by reason; each run pairs, both ranks showing
    the same code (and another code in the other run); the ranks end bit for bit as without the intruder (whose
    run ends as gloo's: the same data, the same collectives, the same result). The room's and the intruder's
    whole output goes to a log file (the launcher shows none of it once it stops them): the intruder's actors
    ran without a restart or failure, to the launcher's stop."""
    import shutil

    from test_distributed import EXAMPLES, ROOT, gloo_reference, launch
    from wccl.launch import json_objects

    rooms = tmp_path / "rooms"
    rooms.mkdir()
    text = (ROOT / "rooms" / "intruder.toml").read_text().replace('level = "warning"',
                                                                 'level = "warning"\nformat = "json"')
    # A short replay window (the room's default is 20 s) so that a short run outlasts it.
    text = text.replace("session = 12", "session = 12\nreplay_window_s = 1.0")
    (rooms / "intruder.toml").write_text(text)
    filmed = tmp_path / "filmed.txt"
    steps = ("--steps", "10")  # about 2 simulated seconds: longer than the 1 s replay window
    logs = [tmp_path / "room1.log", tmp_path / "room2.log"]
    proc1, first = launch(rooms / "intruder.toml", EXAMPLES / "ddp_mnist.py", *steps, timeout=600,
                          env={"WCCL_INTRUDER_RECORD": str(filmed)}, launcher_args=("--room-log", str(logs[0])))
    assert proc1.returncode == 0, proc1.stderr[-3000:]
    assert len(filmed.read_text().split()) > 100, logs[0].read_text()[-3000:]
    proc2, second = launch(rooms / "intruder.toml", EXAMPLES / "ddp_mnist.py", *steps, timeout=600,
                           env={"WCCL_INTRUDER_REPLAY": str(filmed)}, launcher_args=("--room-log", str(logs[1])))
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    for log in logs:
        events = [d.get("event") for d in json_objects(log.read_text()) if d.get("node") == "mallory"]
        assert not {"actor_restarted", "actor_failed", "node_failed"} & set(events), log.read_text()[-3000:]
    codes = []
    for proc in (proc1, proc2):
        shown = {d["node"]: d["code"] for d in json_objects(proc.stderr) if d.get("event") == "pairing_code"}
        assert set(shown) == {"alice", "bob"} and len(set(shown.values())) == 1, shown
        codes.append(shown["alice"])
    assert codes[0] != codes[1]  # (a one in a million chance that two runs' codes agree)
    reference = gloo_reference(EXAMPLES / "ddp_mnist.py", 2, *steps)
    shas = {d["params_sha256"] for d in first + second + reference}
    assert len(shas) == 1 and len(first) == len(second) == len(reference) == 2
    refused = _refused(proc2.stderr)
    assert set(refused) == {"alice", "bob"}
    for node, r in refused.items():
        assert r["check_mismatch"] > 30, r  # forged, random and bit-flipped frames
        # frames filmed in the first run: its pairing's (unkeyed) refused as another run's, its keyed
        # frames as made under another key (each run pairs a new key) among the check mismatches
        assert r.get("other_run", 0) > 0, r
        assert r.get("replayed_old", 0) > 0, r  # this run's frames, shown again after the window
        # the run's own frames got through beside the intruder's (2 ranks, 10 steps)
        assert r["frames_ok"] > 60 and not r["losses"].get("payload_not_authentic"), r


@pytest.mark.parametrize("path", ["collectives", "steps"])
def test_the_attack_bench_accepts_nothing(path):
    from wccl.lab.attack import KINDS, run_attack

    r = run_attack(400, seed=3, path=path)
    assert set(r["kinds"]) == set(KINDS)
    for kind, v in r["kinds"].items():
        assert v["tried"] == 400 and v["accepted"] == 0, (kind, v)
        assert sum(v["refused"].values()) == 400 and "accepted" not in v["refused"], (kind, v)
    assert r["kinds"]["forged"]["refused"] == {"check_mismatch": 400}
    assert r["kinds"]["replayed_old"]["refused"] == {"replayed_old": 400}
    assert r["kinds"]["foreign_session"]["refused"] == {"foreign_session": 400}
    assert r["tensors_wrong"] == 0 and r["handshake_complete"]
    assert r["tensors_delivered"] == r["tensors_sent"] > 100  # every acknowledged tensor, and nothing else
