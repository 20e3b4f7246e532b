"""PyTorch's own distributed tests (torch/testing/_internal/distributed/distributed_test.py, unchanged) on
the `wccl` backend, through tests/torch_suite/runner.py: each test spawns its ranks as torch's
`TestDistBackend` does, in a simulated `exact` room of its own.

The slow tier (`--slow`, as CI runs it) takes a sample that covers broadcast, all-reduce and send/recv
(one pytest process for all of them, about 20 s of wall time per test on two cores).

    WCCL_TORCH_SUITE=all python -m pytest tests/test_torch_suite.py --slow -k suite_on_wccl

runs every test of the suite instead (half an hour at 2 ranks on two cores) and fails if a test that
docs/torch-tests.md records as passed does not pass; WCCL_TORCH_SUITE_OUT names a JSON-lines file for
its results (printed as the table of docs/torch-tests.md; a run given a file that holds results goes on
from there), WCCL_TORCH_SUITE_WORLD_SIZE its world size (2 by default).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import IN_CI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "torch_suite"))
import runner

SAMPLE = ["test_broadcast", "test_all_reduce_sum", "test_send_recv"]
DOC = ROOT / "docs" / "torch-tests.md"

# torch's test helpers import expecttest (the `test` extra): missing, the suite cannot run at all
needs_expecttest = pytest.mark.skipif(importlib.util.find_spec("expecttest") is None and not IN_CI,
                                      reason="expecttest not installed (pip install -e '.[test]')")


@pytest.mark.slow  # (about 50 s: each of torch's tests spawns its ranks and a room)
@needs_expecttest
def test_torch_distributed_tests_pass_on_wccl():
    """The sample in one pytest process: one test item, so that `-n 2` does not run the sample twice."""
    results = {r.test: r for r in runner.run_batch(SAMPLE, world_size=2, timeout_s=90)}
    wrong = [f"{t}: {results[t].outcome} {results[t].detail}" if t in results
             else f"{t}: no result (the pytest process running the sample was killed)"
             for t in SAMPLE if t not in results or results[t].outcome != "passed"]
    assert not wrong, "\n".join(wrong)


def documented_passes(world_size: int) -> set[str]:
    """The tests docs/torch-tests.md records as passed at `world_size` ranks."""
    text = DOC.read_text()
    head = next((line for line in text.splitlines() if line.startswith("| test |")), "")
    cols = [c.strip() for c in head.strip("|").split("|")]
    if f"{world_size} ranks" not in cols:
        return set()
    i = cols.index(f"{world_size} ranks")
    out = set()
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| test_") and len(cells) > i and cells[i].startswith("passed"):
            out.add(cells[0])
    return out


def test_the_sample_is_among_the_documented_passes():
    assert set(SAMPLE) <= documented_passes(2)


def test_documented_passes_are_read_from_the_table():
    assert re.search(r"^\| test_broadcast \| passed", DOC.read_text(), re.MULTILINE)
    assert "test_broadcast" in documented_passes(2)


@needs_expecttest
@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("WCCL_TORCH_SUITE") != "all",
                    reason="the whole of torch's suite takes half an hour or more: WCCL_TORCH_SUITE=all runs it")
def test_torch_distributed_suite_on_wccl(tmp_path, capsys):
    world_size = int(os.environ.get("WCCL_TORCH_SUITE_WORLD_SIZE", "2"))
    out = Path(os.environ.get("WCCL_TORCH_SUITE_OUT", tmp_path / "results.jsonl"))
    runner.main(["--world-size", str(world_size), "--out", str(out)])
    results = {r.test: r for r in runner.load(out) if r.world_size == world_size}
    with capsys.disabled():
        print(runner.table(list(results.values())))
    regressed = [f"{t}: {results[t].outcome if t in results else 'not run'} {results[t].detail if t in results else ''}"
                 for t in sorted(documented_passes(world_size))
                 if t not in results or results[t].outcome != "passed"]
    assert not regressed, "documented as passed, not passing now:\n" + "\n".join(regressed)
