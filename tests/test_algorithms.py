"""The collective algorithms (protocols.algorithms) as pure plans: every rank of every algorithm ends with
the right result and the same bytes, whatever order transfers arrive in, showing only to cameras that read
it; the cost model's choices; a configured algorithm the room cannot carry is a clear error."""

from __future__ import annotations

import functools
import random

import pytest
import torch

from actors.collectives import fold
from protocols.algorithms import AlgorithmError, Sight, choose, estimates
from protocols.registry import REGISTRY

ALGORITHMS = REGISTRY.parts("algorithm")
from protocols.algorithms.star import hub_of


def run(cls, sight: Sight, op: str, inputs: list[torch.Tensor], root: int = 0, reduce_op: str = "sum",
        seed: int = 0):
    """Every rank's plan, transfers delivered one at a time in a random order to the ranks that must read
    them (and to every other rank whose camera reads the sender, as a real camera would film them)."""
    n = sight.world
    dtype = str(inputs[0].dtype).removeprefix("torch.")
    numel = inputs[0].numel()
    plans = [cls(r, n, op, dtype, numel, inputs[r].contiguous().view(torch.uint8).numpy().tobytes(), root,
                 reduce_op, sight, functools.partial(fold, dtype=dtype, reduce_op=reduce_op)) for r in range(n)]
    rng = random.Random(seed)
    in_flight = []  # (sender, part, dest, payload)

    def post(r, sends):
        for s in sends:
            assert s.dest and not s.dest >> r & 1, "a rank shows a transfer to itself or to nobody"
            assert s.payload, "an empty transfer (unkeyed, it cannot be fountain coded)"
            for d in range(n):
                if s.dest >> d & 1:
                    assert sight.reads(d, r), f"rank {r} shows to rank {d}, whose camera does not read it"
            in_flight.append((r, s.part, s.dest, s.payload))

    for r, p in enumerate(plans):
        post(r, p.start())
    steps = 0
    while in_flight:
        steps += 1
        assert steps < 10_000
        sender, part, dest, payload = in_flight.pop(rng.randrange(len(in_flight)))
        for d in range(n):
            if d != sender and sight.reads(d, sender):
                post(d, plans[d].received(sender, part, payload))
    assert all(p.done for p in plans), [p.waiting_for() for p in plans]
    return [p.result() for p in plans]


def _tensor(parts, reduced, dtype, r):
    if reduced is not None:
        return torch.frombuffer(bytearray(reduced), dtype=torch.uint8).view(dtype)
    return [torch.frombuffer(bytearray(p[0]), dtype=torch.uint8).view(dtype) for p in parts]


def ring_sight(n: int, g: float = 20_000.0) -> Sight:
    """A ring of sight: rank r's camera reads rank r-1's screen only."""
    return Sight(n, {(r, (r - 1) % n): g for r in range(n)}, 0.3)


def hub_sight(n: int, hub: int = 0, g: float = 20_000.0) -> Sight:
    return Sight(n, {**{(hub, r): g for r in range(n) if r != hub}, **{(r, hub): g for r in range(n) if r != hub}},
                 0.3)


SIGHTS = {"complete": lambda n: Sight.complete(n, 20_000.0, 0.3), "ring": ring_sight, "hub": hub_sight}


@pytest.mark.parametrize("n", [2, 3, 5, 8])
@pytest.mark.parametrize("graph", list(SIGHTS))
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_algorithm_is_right_and_agrees_on_every_rank(name, graph, n):
    cls = ALGORITHMS[name]
    sight = SIGHTS[graph](n)
    for op in ("allreduce", "allgather", "broadcast", "reduce_scatter", "barrier"):
        if cls.feasible(sight, op, root=n - 1) is not None:
            continue
        for numel, seed in ((1, 1), (n - 1 or 1, 2), (37, 3), (1000, 4)):
            gens = [torch.Generator().manual_seed(100 * seed + r) for r in range(n)]
            inputs = [torch.randn(numel, generator=g) for g in gens]
            out = run(cls, sight, op, inputs, root=n - 1, seed=seed)
            got = [_tensor(parts, red, torch.float32, r) for r, (parts, red) in enumerate(out)]
            if op in ("allreduce", "reduce_scatter"):
                want = sum(inputs[1:], inputs[0].clone())
                for g in got:
                    t = g if isinstance(g, torch.Tensor) else sum(g[1:], g[0].clone())
                    assert torch.allclose(t, want, atol=1e-5), (name, graph, n, op, numel)
                flat = [g if isinstance(g, torch.Tensor) else None for g in got]
                if all(f is not None for f in flat):
                    assert len({f.numpy().tobytes() for f in flat}) == 1, "ranks disagree"
            elif op == "broadcast":
                for g in got:
                    assert all(torch.equal(x, inputs[n - 1]) for x in g)
            else:
                for g in got:
                    assert all(torch.equal(x, inputs[r]) for r, x in enumerate(g)), (name, graph, n, op)


def test_all_see_all_and_star_fold_in_rank_order_as_the_backend_does():
    n = 4
    inputs = [torch.randn(50, generator=torch.Generator().manual_seed(r)) * 1e3 for r in range(n)]
    want = inputs[0].clone()
    for x in inputs[1:]:
        want = want + x
    (_, red), *_ = run(ALGORITHMS["star"], hub_sight(n, hub=2), "allreduce", inputs)
    assert torch.frombuffer(bytearray(red), dtype=torch.float32).numpy().tobytes() == want.numpy().tobytes()


@pytest.mark.parametrize("op_name,fn", [("max", torch.maximum), ("min", torch.minimum), ("product", torch.mul)])
def test_ring_reduces_with_the_reduce_op(op_name, fn):
    n = 5
    inputs = [torch.randint(1, 4, (23,), generator=torch.Generator().manual_seed(r)).to(torch.int64)
              for r in range(n)]
    want = inputs[0].clone()
    for x in inputs[1:]:
        want = fn(want, x)
    for _, red in run(ALGORITHMS["ring"], ring_sight(n), "allreduce", inputs, reduce_op=op_name):
        assert torch.equal(torch.frombuffer(bytearray(red), dtype=torch.uint8).view(torch.int64), want)


def test_the_ring_follows_the_cameras():
    # rank r reads r+2 (mod 5): the ring must go 0 <- 2 <- 4 <- 1 <- 3 <- 0 (data flows to the reader)
    s = Sight(5, {(r, (r + 2) % 5): 1.0 for r in range(5)}, 0.1)
    ring = s.ring()
    assert sorted(ring) == list(range(5))
    for i in range(5):
        assert s.reads(ring[(i + 1) % 5], ring[i])
    assert Sight(3, {(0, 1): 1.0, (1, 0): 1.0, (2, 0): 1.0}, 0.1).ring() is None  # nobody reads 2


def test_the_cost_model_picks_what_the_cameras_allow():
    # all see all: one round wins for small and large tensors alike
    assert choose(Sight.complete(4, 20_000.0, 0.3), "allreduce", 2048).name == "all_see_all"
    assert choose(Sight.complete(8, 20_000.0, 0.3), "allreduce", 100_000).name == "all_see_all"
    # a ring of sight: only the ring can carry it
    assert choose(ring_sight(8), "allreduce", 100_000).name == "ring"
    # a hub that sees everyone and is seen by everyone: the star
    assert choose(hub_sight(5, hub=3), "allreduce", 2048).name == "star"
    assert hub_of(hub_sight(5, hub=3)) == 3
    # all see all, but one camera reads a screen slowly: a big tensor goes round the fast ring instead
    s = Sight.complete(4, 20_000.0, 0.3)
    slow = dict(s.goodput)
    for (r, t) in slow:
        if (r - t) % 4 != 1:
            slow[(r, t)] = 1_000.0  # only the ring edges r-1 -> r are fast
    s2 = Sight(4, slow, 0.3)
    assert choose(s2, "allreduce", 100_000).name == "ring"
    assert choose(s2, "allreduce", 4).name == "all_see_all"  # tiny: one round is still cheaper
    est = estimates(s2, "allreduce", 100_000)
    assert est["ring"] < est["all_see_all"]


def test_a_configured_algorithm_the_room_cannot_carry_is_a_clear_error():
    with pytest.raises(AlgorithmError, match="all_see_all.*cannot carry allreduce.*rank 0 does not read rank 1"):
        choose(ring_sight(3), "allreduce", 100, want="all_see_all")
    with pytest.raises(AlgorithmError, match="unknown collective algorithm 'mesh'"):
        choose(ring_sight(3), "allreduce", 100, want="mesh")
    with pytest.raises(AlgorithmError, match="no collective algorithm can carry"):
        choose(Sight(3, {(0, 1): 1.0}, 0.1), "allreduce", 100)


def test_the_config_refuses_an_unknown_algorithm(tmp_path):
    from wccl.config import ConfigError, load_config

    p = tmp_path / "r.toml"
    p.write_text('[room]\n[[room.nodes]]\nname = "a"\nroles = ["server", "worker"]\n[[room.nodes]]\nname = "b"\n'
                 'roles = ["worker"]\n[collectives]\nalgorithm = "mesh"\n')
    with pytest.raises(ConfigError, match="collectives.algorithm: 'mesh' is not an algorithm"):
        load_config(p)


def table_sight(g: float = 4_300.0) -> Sight:
    """rooms/table-8.toml's sight: two rows of four facing each other, each camera reading the screen across
    and the two diagonal ones (ranks a0, b0, a1, b1, ... in room order)."""
    names = ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]
    return Sight(8, {(i, j): g for i, r in enumerate(names) for j, s in enumerate(names)
                     if r[0] != s[0] and abs(int(r[1]) - int(s[1])) <= 1}, 0.166)


def test_the_trees_use_every_screen_a_camera_reads():
    from protocols.algorithms.tree import trees

    s = table_sight()
    tr = trees(s, list(range(8)))
    for root, parent in tr.items():
        assert sorted(parent) == [r for r in range(8) if r != root]
        for r, p in parent.items():
            assert s.reads(r, p)
        depth = max(len(_path(parent, r, root)) for r in parent)
        assert depth <= 4  # against 7 hops round the ring
    # the relaying shared out: each screen shows its own part and at most four others (built one root after
    # the other, the trees had two screens show six parts and 40 in all; a screen shows a part once whatever
    # number of its readers take it, so a rank moved onto a screen that relays that part already costs nothing)
    shows = [1 + sum(1 for root, parent in tr.items() if root != s_ and s_ in parent.values()) for s_ in range(8)]
    assert max(shows) <= 5 and sum(shows) <= 34, shows
    # small tensors go down the trees (fewer rounds), a big all_reduce round the ring (fewer bytes a screen)
    assert choose(s, "allgather", 1340).name == "tree"
    assert choose(s, "broadcast", 2680, root=3).name == "tree"
    assert choose(s, "allreduce", 100_000).name == "ring"
    est = estimates(s, "allgather", 1340)
    assert est["tree"] < est["ring"] and isinstance(est["star"], str) and isinstance(est["all_see_all"], str)
    # where every camera reads every screen, the trees are all-see-all's one round (which wins the tie)
    assert estimates(Sight.complete(4, 20_000.0, 0.3), "allreduce", 2048)["tree"] == \
        estimates(Sight.complete(4, 20_000.0, 0.3), "allreduce", 2048)["all_see_all"]
    # a screen nobody can reach: no tree
    assert "out of reach" in ALGORITHMS["tree"].feasible(Sight(3, {(0, 1): 1.0, (1, 0): 1.0, (2, 0): 1.0}, 0.1),
                                                          "allgather")


def _path(parent, r, root):
    out = [r]
    while out[-1] != root:
        out.append(parent[out[-1]])
    return out[1:]


def test_a_broadcast_down_a_deep_tree_goes_in_chunks_each_passed_on_as_it_arrives():
    """a0 -> b0 -> a1 (a0 and a1 do not read each other): the root shows its tensor in chunks, and b0 shows
    each chunk on to a1 as soon as it has it, before the next arrives (the hops work at once); where every
    camera reads the root, one transfer does."""
    line = Sight(3, {(0, 1): 1.0, (1, 0): 1.0, (1, 2): 1.0, (2, 1): 1.0}, 0.1)
    data = bytes(range(256)) * 32  # 8 KB
    tree = ALGORITHMS["tree"]
    root, relay, last = (tree(r, 3, "broadcast", "uint8", len(data), data if r == 0 else bytes(len(data)), 0,
                              "sum", line) for r in range(3))
    sent = root.start()
    assert len(sent) == 3 and all(s.dest == 0b010 for s in sent) and b"".join(s.payload for s in sent) == data
    for s in sent:
        on = relay.received(0, s.part, s.payload)
        assert on == [type(s)(s.part, 0b100, s.payload)]  # passed on at once
        assert last.received(1, s.part, s.payload) == []
    assert relay.done and last.done and last.result()[0][0] == (data,)
    assert len(tree(0, 3, "broadcast", "uint8", len(data), data, 0, "sum", Sight.complete(3, 1.0, 0.1)).start()) == 1


def test_algorithms_keep_the_order_of_their_sources_whatever_was_imported_first():
    """`choose` breaks a tie in cost by this order: a module imported before the others (a test, a tool)
    must not change which algorithm a room gets."""
    import importlib

    from protocols.registry import Registry

    reg = Registry()
    reg.sources("algorithm", *(f"protocols.algorithms.{m}" for m in ("all_see_all", "ring", "star", "tree")))
    tree = importlib.import_module("protocols.algorithms.tree").Tree
    reg.register("algorithm", "tree", tree)  # registered first, as when its module is imported first
    for name, cls in REGISTRY.parts("algorithm").items():
        reg.register("algorithm", name, cls, replace=True)
    assert list(reg.parts("algorithm")) == ["all_see_all", "ring", "star", "tree"]
    assert list(REGISTRY.parts("algorithm")) == ["all_see_all", "ring", "star", "tree"]
