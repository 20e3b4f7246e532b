"""Many laptops end to end (issue 14), each rank a process and the room one more. Eight ranks in
rooms/table-8.toml (two rows of four, the `webcam` camera): discovery over the light must find exactly the
screens each camera reads (across and the two diagonals), every rank the same graph; the cost model must
send the small tensors down the trees of sight (no camera reads every screen, no laptop sees everyone: a
part reaches everyone in 3-4 hops, against 7 round the ring); every result must be right (and agreed: each
commit's news passes from camera to camera). Four ranks in rooms/circle-4.toml: every camera reads all
three other screens through its fitted wide lens, and the collectives run all-see-all."""

from __future__ import annotations

import json
import re

import pytest

from test_distributed import ROOT, launch


def _events(stderr: str, event: str) -> list[dict]:
    out = []
    for line in stderr.splitlines():
        if f'"event": "{event}"' in line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


# The layout start-up picks at the eight-laptop table (`python -m wccl.lab startup --config
# rooms/table-8.toml`), pinned in the test's copy: measuring the whole ladder there takes four more minutes.
TABLE_LINK = ('\n[link]\nchoose = "pinned"\nrows = 40\ncols = 73\ncolours = 8\ncell_px = 17\nhold_s = 0.083\n'
              'code_rate = 0.8\n')


def _collectives(tmp_path, room_file: str, n: int, link: str = ""):
    """tests/dist_scripts/table.py (an all_reduce and a broadcast: the collectives_hello example's first two;
    its others add a minute at the eight-laptop table) in a shipped room (logging at info, `link` added):
    checks every rank's results."""
    room = re.sub(r'level = "warning"', 'level = "info"', (ROOT / "rooms" / room_file).read_text()) + link
    assert 'level = "info"' in room
    cfg = tmp_path / room_file
    cfg.write_text(room)
    proc, lines = launch(cfg, ROOT / "tests" / "dist_scripts" / "table.py", timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [d["rank"] for d in lines] == list(range(n))
    for d in lines:
        assert d["all_reduce"] == [sum(10 * r + i for r in range(n)) for i in range(4)]
        assert d["broadcast"] == [42, 7]
    return proc


@pytest.mark.slow
def test_eight_laptops_at_a_table_discover_their_ring_and_agree(tmp_path):
    proc = _collectives(tmp_path, "table-8.toml", 8, TABLE_LINK)
    names = ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]
    row = {n: n[0] for n in names}
    col = {n: int(n[1]) for n in names}
    want = {f"{r}<-{s}" for r in names for s in names if row[r] != row[s] and abs(col[r] - col[s]) <= 1}
    known = _events(proc.stderr, "sight_known")
    assert sorted(e["node"] for e in known) == sorted(names)
    for e in known:
        assert set(e["edges"]) == want, (e["node"], sorted(set(e["edges"]) ^ want))
    chosen = {(e["node"], e["op"]): e["algorithm"] for e in _events(proc.stderr, "algorithm_chosen")}
    assert {chosen[(n, "allreduce")] for n in names} == {"tree"}  # 16 bytes (a 100 KB one: the ring)


@pytest.mark.slow
def test_four_laptops_on_a_circle_all_see_all_through_their_wide_lenses(tmp_path):
    """rooms/circle-4.toml: 128-degree lenses bend the neighbours' grids; each camera fits its lens from
    the codes' edges. Discovery must find all 12 edges, and the collectives run all-see-all."""
    proc = _collectives(tmp_path, "circle-4.toml", 4)
    names = ["alice", "bob", "carol", "dave"]
    want = {f"{r}<-{s}" for r in names for s in names if r != s}
    known = _events(proc.stderr, "sight_known")
    assert sorted(e["node"] for e in known) == names
    for e in known:
        assert set(e["edges"]) == want, (e["node"], sorted(set(e["edges"]) ^ want))
    chosen = {(e["node"], e["op"]): e["algorithm"] for e in _events(proc.stderr, "algorithm_chosen")}
    assert {chosen[(n, "allreduce")] for n in names} == {"all_see_all"}
    # every camera chose how to read after trying both ways; at least one reads through its fitted lens
    lens = _events(proc.stderr, "lens_chosen")
    assert {e["node"] for e in lens} == set(names) and any(e["lens"] == "fit" for e in lens)


# ---- the built-in run (python -m wccl.node) with every node a rank: [training] exchange = "collectives" ----

RANKS3 = [{"name": n, "roles": ["server", "worker"] if i == 0 else ["worker"]}
          for i, n in enumerate(("alice", "bob", "carol"))]


def _ranks_config(**over):
    from conftest import make_config

    sections = dict(room={"nodes": RANKS3, "profile": "exact"},
                    training={"steps": 6, "eval_every": 0, "exchange": "collectives", "codec": "topk_ef",
                              "topk_ratio": 0.25})
    for k, v in over.items():
        sections[k] = {**sections.get(k, {}), **v}
    return make_config(**sections)


def _run(cfg, cover_s: float | None = None):
    """RoomRun over the config; with `cover_s`, a hand over carol's camera for that long, from the moment
    alice has applied two steps."""
    import asyncio

    from conftest import run_virtual
    from wccl.node import RoomRun

    async def go():
        run = RoomRun(cfg)

        async def hand():
            alice = next(s for s in run.supervisors if s.node == "alice")
            while alice.results.get("worker", {}).get("applied", 0) < 2:
                await asyncio.sleep(0.01)
            room = run.medium
            start = room.now() - room.cameras_started_at
            room.cover("carol", start, start + cover_s)

        if cover_s is None:
            return await run.run()
        task = asyncio.create_task(hand())
        try:
            return await run.run()
        finally:
            task.cancel()

    return run_virtual(go)


def test_exchange_auto_is_the_server_up_to_three_nodes_and_collectives_beyond():
    from conftest import make_config
    from wccl.config import load_config

    assert make_config().exchange == "server"  # config.toml: alice, bob and the observer carol
    assert load_config(ROOT / "rooms" / "table-8.toml").exchange == "collectives"
    assert load_config(ROOT / "rooms" / "circle-4.toml").exchange == "collectives"
    assert _ranks_config().exchange == "collectives"  # named
    assert _ranks_config(training={"exchange": "auto"}).exchange == "server"


@pytest.mark.slow
# Until 2026-12-03 a camera could stop reading one screen for good (edges kept from a frame that misled the
# search: actors/frame_decoder.py forgets them now when a read fails), and a collective timed out after
# 60 s, in about 1 run of 4 to 8. One rerun stays while CI has not yet shown that gone.
@pytest.mark.flaky(reruns=1)
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_the_built_in_run_on_the_collectives_is_bit_exact_with_its_reference(algorithm):
    """Three ranks, no parameter server: each step's compressed gradients go round a ring or down the trees
    (forced), every rank reduces them as the server would, and every replica ends with the in-process
    reference's bits (the server's run of the same workers gives the same)."""
    from wccl.compression import get_codec
    from test_node import _reference_sha

    cfg = _ranks_config(collectives={"algorithm": algorithm})
    result = _run(cfg)
    assert result["applied"] == 6 and result["replicas_identical"]
    shas = {n: r["worker"]["params_sha256"] for n, r in result["nodes"].items()}
    assert set(shas) == {"alice", "bob", "carol"} and set(shas.values()) == {_reference_sha(cfg)}
    size = get_codec("topk_ef", ratio=0.25).encoded_size(670)
    for r in result["nodes"].values():
        w = r["worker"]
        assert w["algorithms"] == {algorithm: 6} and w["bytes_sent"] == 6 * size and w["skipped"] == 0
        # and what went round came through the cameras: each rank read the other two ranks' parts
        assert r["collectives"]["bytes_received"] >= 6 * 2 * size


@pytest.mark.slow
# The same intermittent as the test above (fixed 2026-12-03): one rerun while CI has not yet shown it gone.
@pytest.mark.flaky(reruns=1)
def test_a_camera_covered_midway_through_the_built_in_run_delays_every_rank_or_fails_them_all(_quiet_logs):
    """Carol's camera is covered in the middle of the run. For 4 s (less than the timeout): every rank waits
    for her and the run ends with the reference's bits, later; carol's node names each screen her camera
    lost (`screen_lost`, with what to do) and says when it found it again. For longer than the timeout: the
    step fails, the run fails saying why, and no rank applied that step (the agreement of
    actors/collectives.py)."""
    from test_node import _reference_sha
    from wccl.runtime.supervisor import NodeFailed

    cfg = _ranks_config()
    covered = _run(cfg, cover_s=4.0)
    assert covered["replicas_identical"] and covered["applied"] == 6
    assert {r["worker"]["params_sha256"] for r in covered["nodes"].values()} == {_reference_sha(cfg)}
    events = [json.loads(line) for line in _quiet_logs.getvalue().splitlines() if line.startswith("{")]
    lost = [e for e in events if e["event"].startswith("screen_") and e["event"] != "screen_found_again"]
    assert sorted((e["event"], e["direction"]) for e in lost) == [("screen_lost", "alice -> carol"),
                                                                  ("screen_lost", "bob -> carol")], lost
    assert all("turn carol's laptop" in e["problem"] and "python -m wccl.aim" in e["problem"] for e in lost)
    again = sorted(e["direction"] for e in events if e["event"] == "screen_found_again")
    assert again == ["alice -> carol", "bob -> carol"]
    for node in ("alice", "bob", "carol"):  # every rank waited: one step took the cover's time more than the rest
        at = sorted(e["t"] for e in events if e["event"] == "step_applied" and e["node"] == node)
        gaps = sorted(b - a for a, b in zip(at, at[1:]))
        assert len(at) == 6 and gaps[-1] > gaps[len(gaps) // 2] + 1.0, (node, gaps)

    _quiet_logs.truncate(0)
    _quiet_logs.seek(0)
    with pytest.raises(BaseExceptionGroup) as eg:
        _run(_ranks_config(collectives={"timeout_s": 3.0}), cover_s=60.0)
    failed = eg.value.subgroup(NodeFailed).exceptions
    assert failed and all("the gradient exchange failed on every rank" in str(e) for e in failed)
    events = [json.loads(line) for line in _quiet_logs.getvalue().splitlines() if line.startswith("{")]
    applied = {}
    for e in events:
        if e["event"] == "step_applied":
            applied.setdefault(e["node"], set()).add(e["step"])
    steps = {n: max(s) for n, s in applied.items()}
    # The run stopped at the covered step on every rank. Where the cover falls after every rank held that
    # step's exchange but before carol (blind now) learnt it, alice and bob applied it and carol failed it,
    # saying so (no protocol settles that moment: docs/limits.md); never more than that one step apart.
    assert set(steps) == {"alice", "bob", "carol"} and max(steps.values()) - min(steps.values()) <= 1, steps
    assert max(steps.values()) in (1, 2)



@pytest.mark.slow
def test_a_rank_whose_training_fails_fails_its_node_and_is_not_restarted(monkeypatch, _quiet_logs):
    from wccl.runtime.supervisor import NodeFailed
    from wccl.training.replica import Replica

    calls = [0]
    real = Replica.compute_gradient

    def flaky(self, step, raw=False):
        calls[0] += 1
        if calls[0] == 5:  # the second step of one of the three ranks
            raise RuntimeError("out of memory (simulated)")
        return real(self, step, raw=raw)

    monkeypatch.setattr(Replica, "compute_gradient", flaky)
    with pytest.raises(BaseExceptionGroup) as eg:
        _run(_ranks_config())
    failed = eg.value.subgroup(NodeFailed).exceptions
    assert len(failed) == 1 and "out of memory (simulated)" in str(failed[0])
    assert "a rank cannot rejoin its collectives midway" in str(failed[0])
    events = [json.loads(line) for line in _quiet_logs.getvalue().splitlines() if line.startswith("{")]
    assert not any(e["event"] == "actor_restarted" for e in events)
