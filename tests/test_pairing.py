"""Pairing over the light (protocols.pairing, wccl.distributed.pairing): ranks with no key agree on one, and
a screen that speaks for a rank during the pairing leaves the codes different, so nobody confirms."""

from __future__ import annotations

import asyncio
import os

import pytest

from protocols.pairing import LEADER, PairingError, Pairing, commitment
from wccl.distributed.pairing import Table


def _ranks(world: int) -> list[Pairing]:
    return [Pairing(r, world, os.urandom(32), os.urandom(16), os.urandom(32) if r == LEADER else None,
                    names=tuple(f"n{i}" for i in range(world))) for r in range(world)]


def _run(ps: list[Pairing], commits=None, reveals=None) -> list[bytes]:
    commits = commits or [p.commitment() for p in ps]
    reveals = reveals or [p.reveal() for p in ps]
    for p in ps:
        p.take(list(commits), list(reveals))
    sealed = ps[LEADER].sealed()
    return [p.open(sealed) for p in ps]


@pytest.mark.parametrize("world", [2, 3, 8])
def test_honest_ranks_get_one_key_and_show_one_code(world):
    ps = _ranks(world)
    keys = _run(ps)
    assert len(set(keys)) == 1 and keys[0] == ps[LEADER].room_key
    assert len({p.code for p in ps}) == 1 and len(ps[0].code) == 7  # "482 913"


def test_a_screen_speaking_for_a_rank_leaves_the_codes_different():
    """Mallory puts her own key in bob's place towards alice (committed before anyone reveals, so its
    commitment matches): alice's code differs from bob's, and the key alice sealed for 'bob' opens for
    mallory, not bob."""
    alice, bob = _ranks(2)
    mallory = Pairing(1, 2, os.urandom(32), os.urandom(16), names=("n0", "n1"))
    # what alice reads: mallory's values as bob's; what bob reads: the truth
    alice.take([alice.commitment(), mallory.commitment()], [alice.reveal(), mallory.reveal()])
    bob.take([alice.commitment(), bob.commitment()], [alice.reveal(), bob.reveal()])
    assert alice.code != bob.code
    with pytest.raises(PairingError, match="does not open"):
        bob.open(alice.sealed())
    table = Table(["alice", "bob"])

    async def both():
        return await asyncio.gather(table.confirm("alice", alice.code), table.confirm("bob", bob.code))

    assert asyncio.run(both()) == [False, False]


def test_a_reveal_that_does_not_match_its_commitment_names_the_rank():
    ps = _ranks(3)
    reveals = [p.reveal() for p in ps]
    reveals[2] = os.urandom(32) + reveals[2][32:]
    with pytest.raises(PairingError, match="n2's key does not match what n2 committed to"):
        ps[0].take([p.commitment() for p in ps], reveals)


def test_a_rank_that_reads_another_key_as_its_own_says_so():
    ps = _ranks(2)
    other = Pairing(1, 2, os.urandom(32), os.urandom(16))
    with pytest.raises(PairingError, match="another key as n1's"):
        ps[1].take([ps[0].commitment(), other.commitment()], [ps[0].reveal(), other.reveal()])


def test_a_replayed_pairing_gives_no_key():
    """A recorded pairing shown again: its sealed key was sealed to another run's key pair."""
    old = _ranks(2)
    _run(old)
    now = _ranks(2)
    for p in now:
        p.take([q.commitment() for q in now], [q.reveal() for q in now])
    with pytest.raises(PairingError, match="does not open"):
        now[1].open(old[LEADER].sealed())


def test_a_rank_whose_pairing_failed_is_confirmed_by_nobody():
    table = Table(["a", "b", "c"])

    async def three():
        return await asyncio.gather(table.confirm("a", "123 456"), table.confirm("b", None, "no key"),
                                    table.confirm("c", "123 456"))

    assert asyncio.run(three()) == [False, False, False]


def test_commitments_bind_key_and_salt():
    k, s = os.urandom(32), os.urandom(16)
    assert commitment(k, s) != commitment(k, os.urandom(16)) and len(commitment(k, s)) == 32
    with pytest.raises(ValueError):
        Pairing(1, 2, os.urandom(32), os.urandom(16), room_key=os.urandom(32))  # only the leader brings a key


def test_a_real_room_that_names_no_key_pairs_and_never_runs_unkeyed(tmp_path):
    """Real devices with no key pair (`pairs`): they have no key before their ranks pair; `key = "none"` is
    the one way to run unkeyed."""
    from wccl.config import ConfigError, load_config
    from wccl.keys import pairs, room_key
    from protocols.security import NO_KEY

    def room(extra: str, medium: str = "hardware"):
        path = tmp_path / "room.toml"
        parts = '\ncamera = "webcam"\nscreen = "window"\n' if medium == "hardware" else "\n"
        path.write_text(f'[room]\nmedium = "{medium}"\nclock = "realtime"\n{extra}\n'
                        f'[[room.nodes]]\nname = "a"\nroles = ["server", "worker"]{parts}'
                        f'[[room.nodes]]\nname = "b"\nroles = ["worker"]{parts}')
        return load_config(path)

    real = room("")
    assert pairs(real)
    with pytest.raises(ConfigError, match="pairing over the light"):
        room_key(real)  # (no key before the ranks pair)
    assert room_key(room('key = "none"')) is NO_KEY and not pairs(room('key = "none"'))
    assert not pairs(room("", "simulated")) and pairs(room('key = "pair"', "simulated"))
    with pytest.raises(ConfigError, match="give the room's key one way"):
        room('key = "none"\nkey_file = "room.key"')
    with pytest.raises(ConfigError, match="a paired key is not a passphrase"):
        room('key = "pair"\nkey_env = "K"')
    assert pairs(room('key = "pair"\nkey_file = "kept.key"'))  # (until a pairing keeps its key there)
    (tmp_path / "kept.key").write_bytes(os.urandom(32))
    assert not pairs(room('key = "pair"\nkey_file = "kept.key"'))


TWO = [{"name": "alice", "roles": ["server", "worker"]}, {"name": "bob", "roles": ["worker"]}]


@pytest.mark.slow
def test_the_built_in_run_pairs_then_trains_under_the_paired_key(_quiet_logs, tmp_path):
    """`key = "pair"` in the simulated room: the built-in run's two nodes pair over the light (the room's
    people confirm the code both screens show), then run every step under that key, replicas identical.
    With a key_file the paired key is kept there, and the next run reads it instead of pairing."""
    import json

    from conftest import make_config, run_room
    from protocols.security import RoomKey

    kept = tmp_path / "room.key"
    cfg = make_config(room={"nodes": TWO, "key": "pair", "profile": "exact", "key_file": str(kept)},
                      training={"steps": 3, "eval_every": 0})
    result = run_room(cfg)
    assert result["applied"] == 3 and result["replicas_identical"] is True, result
    events = [json.loads(x) for x in _quiet_logs.getvalue().splitlines() if x.startswith("{")]
    codes = {e["node"]: e["code"] for e in events if e["event"] == "pairing_code"}
    paired = {e["node"]: e["fingerprint"] for e in events if e["event"] == "paired"}
    used = [e for e in events if e["event"] == "room_key"]
    assert set(codes) == {"alice", "bob"} and len(set(codes.values())) == 1, codes
    assert set(paired) == {"alice", "bob"} and len(set(paired.values())) == 1, paired
    assert len(used) == 2 and all(e["source"] == f"paired over the light (code {codes['alice']})"
                                  and e["fingerprint"] == paired["alice"] for e in used), used
    assert kept.stat().st_mode & 0o777 == 0o600 and RoomKey(kept.read_bytes()).fingerprint == paired["alice"]
    _quiet_logs.seek(0)
    _quiet_logs.truncate()
    again = run_room(cfg.model_copy(update={"training": cfg.training.model_copy(update={"steps": 1})}))
    assert again["applied"] == 1, again
    events = [json.loads(x) for x in _quiet_logs.getvalue().splitlines() if x.startswith("{")]
    assert not [e for e in events if e["event"].startswith("pairing")]
    assert {(e["source"], e["fingerprint"]) for e in events if e["event"] == "room_key"} == {
        (f"file {kept}", paired["alice"])}


def test_a_room_with_an_observer_does_not_pair(tmp_path):
    from conftest import make_config
    from wccl.config import ConfigError
    from wccl.node import RoomRun

    cfg = make_config(room={"key": "pair"})  # the shipped room: carol observes

    async def make():
        RoomRun(cfg)

    with pytest.raises(ConfigError, match="'carol' is an observer, which only listens and cannot pair"):
        asyncio.run(make())


@pytest.mark.parametrize("answer, confirmed", [("y\n", True), ("yes\n", True), ("n\n", False), ("\n", False),
                                               ("", None)])
def test_a_real_laptops_person_confirms_on_its_console(monkeypatch, capsys, answer, confirmed):
    """y or yes confirms; anything else does not; a console with nothing to read says so (not a no)."""
    import io
    import sys

    from wccl.distributed.pairing import ConsolePeople

    monkeypatch.setattr(sys, "stdin", io.StringIO(answer))
    if confirmed is None:
        with pytest.raises(PairingError, match="no console to answer on"):
            asyncio.run(ConsolePeople().confirm("alice", "482 913"))
    else:
        assert asyncio.run(ConsolePeople().confirm("alice", "482 913")) is confirmed
    assert "482 913" in capsys.readouterr().err
    assert asyncio.run(ConsolePeople().confirm("alice", None, "no key")) is False  # nothing to confirm


def test_esc_ends_the_consoles_question(monkeypatch):
    import sys
    import threading

    from wccl.distributed.pairing import ConsolePeople

    never = threading.Event()

    class Silent:  # a person who never answers
        def readline(self):
            never.wait(5)
            return "y\n"

    monkeypatch.setattr(sys, "stdin", Silent())

    async def go():
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.2, stop.set)
        return await asyncio.wait_for(ConsolePeople(stop).confirm("alice", "482 913"), 3)

    assert asyncio.run(go()) is False
    never.set()


def test_the_folder_of_people_hears_a_failure_at_once_and_waits_no_longer_than_its_deadline(tmp_path):
    from wccl.distributed.pairing import TableFolder

    async def go(wait_s):
        table = [TableFolder(str(tmp_path), ["a", "b", "c"], wait_s) for _ in range(3)]
        return await asyncio.wait_for(asyncio.gather(table[0].confirm("a", "123 456"),
                                                     table[1].confirm("b", None, "its camera did not open")), 5)

    assert asyncio.run(go(300.0)) == [False, False]  # (c never came: b's failure ends the wait)
    for f in tmp_path.iterdir():
        f.unlink()

    async def alone():
        return await asyncio.wait_for(TableFolder(str(tmp_path), ["a", "b"], 0.3)
                                      .confirm("a", "123 456"), 5)

    assert asyncio.run(alone()) is False  # b's process died: nothing noted


def test_a_key_that_no_laptop_draws_is_named_not_a_crash():
    """All zeros is a low-order point: X25519 refuses it; the pairing names the rank instead of failing."""
    ps = _ranks(2)
    reveals = [ps[0].reveal(), bytes(32) + ps[1].salt]
    commits = [ps[0].commitment(), commitment(bytes(32), ps[1].salt)]
    ps[0].take(commits, reveals)
    with pytest.raises(PairingError, match="n1's key is not one a laptop draws"):
        ps[0].sealed()


def test_the_code_stands_large_on_the_screen():
    from wccl.distributed.pairing import code_picture

    img = code_picture("482 913", 1280, 720)
    assert img.shape == (720, 1280, 3)
    rows = (img.min(axis=2) < 128).any(axis=1).nonzero()[0]
    assert rows.size and (img[rows.min():rows.min() + 100].min(axis=2) < 128).any(axis=0).sum() > 400  # wide digits
    assert (code_picture(None, 320, 180).min(axis=2) < 128).any()


@pytest.mark.slow
def test_codes_the_people_do_not_confirm_give_no_key_and_no_run(monkeypatch, _quiet_logs):
    """The people answer no (the screens showed different codes): every rank says so, no node runs."""
    import json

    from conftest import make_config, run_room
    from wccl.distributed import pairing
    from wccl.runtime.supervisor import NodeFailed

    async def no(self, node, code, why=""):
        return False

    monkeypatch.setattr(pairing.Table, "confirm", no)
    cfg = make_config(room={"nodes": TWO, "key": "pair", "profile": "exact"}, training={"steps": 1, "eval_every": 0})
    with pytest.raises(NodeFailed, match="did not confirm the code"):
        run_room(cfg)
    events = [json.loads(x) for x in _quiet_logs.getvalue().splitlines() if x.startswith("{")]
    assert {e["node"] for e in events if e["event"] == "pairing_failed"} == {"alice", "bob"}
    assert not [e for e in events if e["event"] == "room_key" or e.get("actor") in ("worker", "parameter_server")]


@pytest.mark.slow
def test_a_rank_whose_pairing_breaks_leaves_nobody_waiting(monkeypatch, _quiet_logs):
    """Any error in one rank's pairing (not only the protocol's own) is its word to the people: the other
    rank does not wait for ever, and the run stops with the reason."""
    from conftest import make_config, run_room
    from wccl.runtime.supervisor import NodeFailed

    real = Pairing.take

    def take(self, commitments, reveals):
        if self.rank == 1:
            raise RuntimeError("a bug")
        return real(self, commitments, reveals)

    monkeypatch.setattr(Pairing, "take", take)
    cfg = make_config(room={"nodes": TWO, "key": "pair", "profile": "exact"}, training={"steps": 1, "eval_every": 0})
    with pytest.raises(NodeFailed, match="RuntimeError: a bug"):
        run_room(cfg)
