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
    """Real devices with no key: the launcher's ranks pair (`pairs`); the built-in run, which does not pair,
    stops with a one-line error that says what to do; `key = "none"` is the one way to run unkeyed."""
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
    with pytest.raises(ConfigError, match='key = "none"'):
        room_key(real)
    assert room_key(room('key = "none"')) is NO_KEY and not pairs(room('key = "none"'))
    assert not pairs(room("", "simulated")) and pairs(room('key = "pair"', "simulated"))
    with pytest.raises(ConfigError, match="give the room's key one way"):
        room('key = "none"\nkey_file = "room.key"')
