"""The link lab's sweep: resume, the best-layout snippet in the node's config, a small grid end to end."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import tomllib

import pytest
from conftest import ROOT, shipped_config_dict

from wccl.config import parse_config
from wccl.lab.sweep import (
    BEST_TOML,
    CSV_NAME,
    PLOTS,
    RESULTS,
    SUMMARY,
    best_point,
    grid_for,
    make_points,
    margin_of,
    run_sweep,
)

SMALL = dict(screen_w=1280, screen_h=720, border=1, margin=1, nbytes=6000, tensor_bytes=3000, repair=0.25, extra=2,
             seed=0)


def _cfg_data() -> dict:
    return parse_config(shipped_config_dict(), "test").model_dump()


def test_grid_fills_the_screen_and_fits():
    assert grid_for(16, 1280, 720, 1, 1) == (41, 76)
    assert grid_for(8, 1280, 720, 1, 0) == (88, 158)  # the dense `ideal` layout the link lab found
    pts = make_points(["exact"], [8, 10, 12, 16, 24, 32], [2, 4, 8], [0.1], [0.8], **SMALL)
    # 32 px cells in 2 or 4 colours (20x37 cells of 1 or 2 bits) and 24 px cells in 2 colours cannot carry
    # one frame header and packet: left out
    assert sum(p.hackathon for p in pts) == 1 and len(pts) == 1 + 6 * 3 - 3
    assert not any((p.cell_px == 32 and p.colours < 8) or (p.cell_px == 24 and p.colours == 2) for p in pts)
    data = shipped_config_dict()
    for p in pts:
        data["link"] = {**data["link"], **p.link()}
        parse_config(data, "grid point")  # every derived layout fits the screen and the codec
    # the margin can be swept too; each point knows the margin it was derived with
    two = make_points(["exact"], [10], [8], [0.1], [0.8], **{**SMALL, "margin": [1, 6]})
    assert [(p.rows, p.cols) for p in two if not p.hackathon] == [(68, 124), (58, 114)]
    assert [margin_of(p.__dict__, 1280, 720, 1) for p in two] == [None, 1, 6]


@pytest.mark.slow
def test_sweep_resumes_without_redoing_finished_points(tmp_path):
    cfg = _cfg_data()
    two = make_points(["exact"], [16], [8], [0.1], [0.8], hackathon=False, **SMALL) + \
        make_points(["exact"], [12], [8], [0.1], [0.8], hackathon=False, **SMALL)
    err = io.StringIO()
    r1 = run_sweep(cfg, two, tmp_path, jobs=1, inline=True, progress_stream=err)
    assert (r1["ran"], r1["skipped"]) == (2, 0)
    lines1 = (tmp_path / RESULTS).read_text().splitlines()
    assert len(lines1) == 2
    three = two + make_points(["exact"], [10], [8], [0.1], [0.8], hackathon=False, **SMALL)
    r2 = run_sweep(cfg, three, tmp_path, jobs=1, inline=True, progress_stream=err)
    assert (r2["ran"], r2["skipped"]) == (1, 2)
    lines2 = (tmp_path / RESULTS).read_text().splitlines()
    assert lines2[:2] == lines1 and len(lines2) == 3  # old points untouched, the new one appended
    assert json.loads(lines2[2])["cell_px"] == 10
    # a different seed is a different point
    other = make_points(["exact"], [16], [8], [0.1], [0.8], hackathon=False, **{**SMALL, "seed": 1})
    assert run_sweep(cfg, other, tmp_path, jobs=1, inline=True, progress_stream=err)["ran"] == 1
    assert "[3/3] 100%" in err.getvalue() and "eta" in err.getvalue()
    # a line cut short by a kill is ignored (its point is run again)
    with open(tmp_path / RESULTS, "a") as f:
        f.write('{"profile": "exa')
    assert run_sweep(cfg, three, tmp_path, jobs=1, inline=True, progress_stream=err)["ran"] == 0


def test_best_layout_snippet_loads_into_the_node_config(tmp_path):
    cfg = _cfg_data()
    pts = make_points(["exact"], [12, 16], [8], [0.1], [0.8], hackathon=False, **SMALL)
    res = run_sweep(cfg, pts, tmp_path, jobs=1, inline=True, progress_stream=io.StringIO())
    best = res["best"]
    assert best is not None and best["tensors_delivered"] == best["tensors_sent"] and best["undetected_errors"] == 0
    assert best["goodput_kBps"] == max(r["goodput_kBps"] for r in res["records"])
    snippet = (tmp_path / BEST_TOML).read_text()
    link = tomllib.loads(snippet)["link"]
    assert {"rows", "cols", "colours", "cell_px", "hold_s", "code_rate"} <= set(link)
    # the shipped config.toml with its [link] table replaced by the snippet, as text
    text = (ROOT / "config.toml").read_text()
    head, _, rest = text.partition("\n[link]\n")
    tail = rest[rest.index("\n[", 0):]  # the next table
    data = tomllib.loads(head + "\n" + snippet + tail)
    node_cfg = parse_config(data, "config.toml + best_link.toml")
    assert (node_cfg.link.rows, node_cfg.link.cols, node_cfg.link.cell_px) == (best["rows"], best["cols"], 12)
    assert node_cfg.link.hold_s == best["hold_s"] and node_cfg.link.code_rate == best["code_rate"]


def test_budget_excludes_lost_tensors_and_undetected_errors():
    base = dict(error="", tensor_loss=0.0, undetected_errors=0, raw_cell_error_rate=0.01, cell_px=10)
    recs = [dict(base, goodput_kBps=9.0, tensor_loss=0.25), dict(base, goodput_kBps=8.0, undetected_errors=1),
            dict(base, goodput_kBps=5.0), dict(base, goodput_kBps=0.0, error="too small")]
    assert best_point(recs, 0.0)["goodput_kBps"] == 5.0
    assert best_point(recs, 0.25)["goodput_kBps"] == 9.0
    assert best_point(recs[:2], 0.0) is None


@pytest.mark.slow
def test_small_sweep_end_to_end_through_the_cli(tmp_path):
    out = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "wccl.lab", "sweep", "--config", "config.toml", "--profiles", "exact",
           "--cell-px", "12,16", "--colours", "4,8", "--hold", "0.1", "--bytes", "6000", "--tensor-bytes", "3000",
           "--jobs", "2", "--out", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "[5/5] 100%" in p.stderr
    rows = list(csv.DictReader(open(out / CSV_NAME)))
    assert len(rows) == 5  # 2 cell sizes x 2 colour counts + the hackathon layout
    hack = [r for r in rows if r["hackathon"] == "True"]
    assert len(hack) == 1 and (hack[0]["rows"], hack[0]["cols"], hack[0]["code_rate"]) == ("40", "70", "1.0")
    for r in rows:
        assert r["tensors_delivered"] == r["tensors_sent"] == "2" and r["undetected_errors"] == "0"
        assert float(r["goodput_kBps"]) > 0 and r["camera_px_per_cell"] == str(float(r["cell_px"]))
    for name in PLOTS:
        assert (out / name).stat().st_size > 5000
    summary = (out / SUMMARY).read_text()
    assert "Best layout within the budget" in summary and "hackathon" in summary.lower()
    assert (out / BEST_TOML).exists()
    # same command again: nothing to run, same CSV
    p2 = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p2.returncode == 0 and "0 run, 5 resumed" in p2.stderr
    assert list(csv.DictReader(open(out / CSV_NAME))) == rows


def test_sweep_rejects_a_bad_grid(tmp_path):
    p = subprocess.run([sys.executable, "-m", "wccl.lab", "sweep", "--colours", "5", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
