"""The link lab's bench, end to end in the simulated room."""

from __future__ import annotations

import json
import subprocess
import sys

from wccl.lab.bench import run_bench, with_overrides

from conftest import ROOT, make_config


def test_bench_delivers_every_tensor_exactly_on_the_exact_profile():
    cfg = with_overrides(make_config(), "exact", {"rows": 40, "cols": 70, "cell_px": 16, "hold_s": 0.2})
    r = run_bench(cfg, nbytes=20_000, tensor_bytes=5_000)
    assert r["tensors_sent"] == 4 and r["tensors_delivered"] == 4 and r["undetected_errors"] == 0
    assert r["raw_cell_error_rate"] == 0.0 and r["captures_mixed"] == 0
    # goodput is what arrived over the link time, no more
    assert 0 < r["goodput_kBps"] <= r["bytes_sent"] / r["sim_seconds"] / 1000 + 0.001


def test_bench_cli_prints_one_json_object():
    p = subprocess.run([sys.executable, "-m", "wccl.lab", "bench", "--config", "config.toml", "--profile", "exact",
                        "--bytes", "3000", "--tensor-bytes", "1500", "--set", "hold_s=0.2", "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    for key in ("goodput_kBps", "raw_cell_error_rate", "frames_shown", "frames_decoded", "tensors_sent",
                "tensors_delivered", "undetected_errors", "sim_seconds", "wall_seconds"):
        assert key in out
    assert out["tensors_delivered"] == 2


def test_bench_rejects_a_bad_override():
    p = subprocess.run([sys.executable, "-m", "wccl.lab", "bench", "--set", "colours=5"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "link.colours" in p.stderr and "Traceback" not in p.stderr


def test_sync_bench_reports_clock_residuals_and_lockstep():
    from wccl.lab.syncbench import run_sync_bench

    r = run_sync_bench(make_config(), steps=3)
    # one residual per step for bob (alice is the reference), measured against the room's truth
    assert r["residual_samples"] == 3 and 0 <= r["residual_p50_ms"] <= r["residual_p95_ms"] <= r["residual_max_ms"] < 15
    assert r["applied"] == {"alice": 3, "bob": 3} and r["replicas_identical"]
    assert r["step_period_s"] <= 2.0 and abs(r["estimated_clocks"]["bob"]["offset_s"]) > 1.0


def test_the_bench_says_why_nothing_got_through():
    # The shipped room places carol beside bob, turned to alice's screen: carol's camera never sees bob's.
    cfg = with_overrides(make_config(), "exact", {"hold_s": 0.2})
    ok = run_bench(cfg, nbytes=3000, tensor_bytes=1500, sender="alice", receiver="bob")
    assert ok["tensors_delivered"] == 2 and ok["zero_reason"] is None
    blurred = with_overrides(make_config(), "webcam", {"rows": 90, "cols": 160, "cell_px": 7, "hold_s": 0.2})
    r = run_bench(blurred, nbytes=3000, tensor_bytes=1500)
    assert r["goodput_kBps"] == 0 and r["tensors_delivered"] == 0
    assert "decoded no frame" in r["zero_reason"] and "cells" in r["zero_reason"], r["zero_reason"]
    p = subprocess.run([sys.executable, "-m", "wccl.lab", "bench", "--config", "config.toml", "--sender", "zed"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--sender zed: not a node of the room (alice, bob, carol)" in p.stderr
