"""Many laptops end to end (issue 14), each rank a process and the room one more. Eight ranks in
rooms/table-8.toml (two rows of four, the `webcam` camera): discovery over the light must find exactly the
screens each camera reads (across and the two diagonals), every rank the same graph; the cost model must
pick the ring (no camera reads every screen, no laptop sees everyone); every result must be right (and
agreed: each commit's news goes round the ring). Four ranks in rooms/circle-4.toml: every camera reads all
three other screens through its fitted wide lens, and the collectives run all-see-all."""

from __future__ import annotations

import json
import re

import pytest

from test_distributed import EXAMPLES, ROOT, launch


def _events(stderr: str, event: str) -> list[dict]:
    out = []
    for line in stderr.splitlines():
        if f'"event": "{event}"' in line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def _hello(tmp_path, room_file: str, n: int):
    """examples/collectives_hello.py in a shipped room (logging at info): checks every rank's results."""
    room = re.sub(r'level = "warning"', 'level = "info"', (ROOT / "rooms" / room_file).read_text())
    assert 'level = "info"' in room
    cfg = tmp_path / room_file
    cfg.write_text(room)
    proc, lines = launch(cfg, EXAMPLES / "collectives_hello.py", timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [d["rank"] for d in lines] == list(range(n))
    for d in lines:
        assert d["all_reduce"] == [sum(10 * r + i for r in range(n)) for i in range(4)]
        assert d["broadcast"] == [42, 7]
        assert d["all_gather"] == [[r] * 3 for r in range(n)]
    return proc


@pytest.mark.slow
def test_eight_laptops_at_a_table_discover_their_ring_and_agree(tmp_path):
    proc = _hello(tmp_path, "table-8.toml", 8)
    names = ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]
    row = {n: n[0] for n in names}
    col = {n: int(n[1]) for n in names}
    want = {f"{r}<-{s}" for r in names for s in names if row[r] != row[s] and abs(col[r] - col[s]) <= 1}
    known = _events(proc.stderr, "sight_known")
    assert sorted(e["node"] for e in known) == sorted(names)
    for e in known:
        assert set(e["edges"]) == want, (e["node"], sorted(set(e["edges"]) ^ want))
    chosen = {(e["node"], e["op"]): e["algorithm"] for e in _events(proc.stderr, "algorithm_chosen")}
    assert {chosen[(n, "allreduce")] for n in names} == {"ring"}


@pytest.mark.slow
def test_four_laptops_on_a_circle_all_see_all_through_their_wide_lenses(tmp_path):
    """rooms/circle-4.toml: 128-degree lenses bend the neighbours' grids; each camera fits its lens from
    the codes' edges. Discovery must find all 12 edges, and the collectives run all-see-all."""
    proc = _hello(tmp_path, "circle-4.toml", 4)
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
