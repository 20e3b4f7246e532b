"""Every command the README shows is run here (short ones fully, long ones with a few steps), so the README
cannot go stale. The two set-up commands are run exactly by .ci/run, in a fresh virtual environment."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

README = (ROOT / "README.md").read_text()
SETUP = 'pip install "torch==2.13.0" '


def readme_commands() -> list[str]:
    """The README's command lines: indented code lines that start with a program a user types."""
    return [m.group(1) for m in re.finditer(r"^    ((?:python|pip|torchrun|wccl) .*?)\s*(?:#.*)?$", README, re.M)]


def run_on_terminal(argv: list[str], cwd: Path, timeout: float, redraws: bool = False) -> tuple[int, str]:
    """Run `argv` with a pseudo-terminal as its stdout and stderr (as a user's shell would); its output, with
    the progress line's redraws ("\\r\\x1b[K") and colours taken out (`redraws`: with every redraw, each on
    a line of its own)."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "DISPLAY")}
    proc = subprocess.Popen(argv, cwd=cwd, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    out = bytearray()
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                proc.kill()
                raise AssertionError(f"{argv} printed nothing for {timeout} s")
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: the program ended
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
    code = proc.wait(timeout=60)
    text = out.decode(errors="replace").replace("\r\n", "\n")
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    if redraws:
        return code, text.replace("\r", "\n")
    return code, "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


def node_on_terminal(*args: str, timeout: float = 900) -> list[str]:
    code, text = run_on_terminal([sys.executable, "-m", "wccl.node", *args], ROOT, timeout)
    assert code == 0, text[-3000:]
    return [line for line in text.split("\n") if line.strip()]


def check_summary(lines: list[str], steps: int) -> float:
    """The run's closing table: every step applied, replicas and observer identical, each node's row."""
    (head,) = [line for line in lines if line.startswith("run finished:")]
    m = re.match(r"run finished: (\d+) of (\d+) steps applied, test accuracy ([0-9.]+)", head)
    assert m and int(m[1]) == int(m[2]) == steps, head
    assert any("replicas identical, observers identical" in line for line in lines), lines[-8:]
    rows = {line.split()[0] for line in lines[lines.index(head):] if line.startswith("  ")}
    assert {"alice", "bob", "carol"} <= rows, lines[-8:]
    return float(m[3])


def test_the_readme_shows_two_set_up_commands_and_ci_runs_them():
    setup = [c for c in readme_commands() if c.startswith(SETUP)]
    assert setup == [f'{SETUP}-e . && python -m wccl.node --config config.toml',
                     f'{SETUP}-e ".[test]" && python -m pytest --slow -n 2']
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv .venv" in ci and 'bash -c "${commands[0]}"' in ci and 'bash -c "${commands[1]}"' in ci


def test_the_readme_is_short_and_about_using_it():
    assert len(README.splitlines()) < 150
    for stale in (r"\bissues? \d", r"\bhere\b", r"this (2-core )?machine", r"wall time"):
        assert not re.search(stale, README, re.I), stale


# How this file runs each of the README's other commands (a test below for each).
COMMANDS = {
    'python -m wccl.launch --config rooms/two-laptops-sim.toml examples/ddp_mnist.py --steps 30': "ddp",
    'torchrun --standalone --nproc-per-node 2 examples/ddp_mnist.py --backend gloo --steps 30': "ddp",
    'python -m wccl.node --config rooms/two-laptops.toml --node alice': "real_laptop",
    'python -m wccl.node --config config.toml --steps 5': "few_steps",
    'python -m wccl.launch --config rooms/two-laptops-sim.toml examples/collectives_hello.py': "hello",
    'python -m wccl.devices': "devices",
    'python -m wccl.aim --config config.toml': "aim",
    'python -m wccl.keys new room.key': "keys",
    'python -m wccl.lab bench --config rooms/two-laptops-sim.toml --bytes 100000 --json': "bench",
    'python -m wccl.room.draw rooms/two-laptops-sim.toml': "draw",
}


def test_every_readme_command_is_run_by_this_file():
    shown = {c for c in readme_commands() if not c.startswith(SETUP)}
    assert shown == set(COMMANDS), (shown ^ set(COMMANDS))


@pytest.mark.slow
def test_a_few_steps_of_the_default_room_on_a_terminal_are_short_and_end_with_the_table():
    """The README's few-steps command as a user sees it: at most 25 lines, each said once, in words (the run's
    folder, the layout, the clocks), the start-up's phases named on the progress line as they come, and the
    closing table. (The whole default run, 30 steps to 0.84 or more, is the README's first command: .ci/run
    runs it and checks its last line.)"""
    code, text = run_on_terminal([sys.executable, "-m", "wccl.node", "--config", "config.toml", "--steps", "3"],
                                 ROOT, 900, redraws=True)
    assert code == 0, text[-3000:]
    progress = [line for line in text.split("\n") if line.startswith("wccl | ")]
    lines = [line for line in text.split("\n") if line.strip() and not line.startswith("wccl | ")]
    assert len(lines) <= 25, "\n".join(lines)
    said = [line.split("] ", 1)[-1] for line in lines if "] " in line]
    assert len(said) == len(set(said)), "\n".join(lines)  # (the room key of each node, a clock synced again...)
    check_summary(lines, 3)
    assert any("run folder runs/config" in line for line in lines)
    assert any("layout: 68x124 cells of 10 px, 8 colours; frames read: alice<-bob " in line for line in lines), lines
    assert any("bob's clock synced to the server's" in line for line in lines), lines
    assert not any("link_report" in line or "step_applied" in line for line in lines)  # detail: --log-level debug
    phases = [p.split(" | ")[2] if p.count(" | ") >= 2 else "" for p in progress]
    for phase in ("start-up: looking for the other screens", "start-up: measuring the layouts",
                  "start-up: layout chosen, syncing clocks", "training"):
        assert phase in phases, sorted(set(phases))


def test_a_real_laptops_node_without_a_display_says_what_to_do():
    code, text = run_on_terminal([sys.executable, "-m", "wccl.node", "--config", "rooms/two-laptops.toml",
                                  "--node", "alice"], ROOT, 120)
    assert code == 3 and "no display" in text and "desktop session" in text and "Xvfb" not in text, text


def test_devices_lists_what_it_finds():
    code, text = run_on_terminal([sys.executable, "-m", "wccl.devices"], ROOT, 60)
    assert code == 0 and "Cameras:" in text and "Displays:" in text, text


def test_aim_aims_the_default_room():
    code, text = run_on_terminal([sys.executable, "-m", "wccl.aim", "--config", "config.toml"], ROOT, 120)
    assert code == 0, text
    for name in ("alice", "bob", "carol"):
        assert f"{name}: aimed (aim_ok at" in text, text
    assert "aim done in" in text


def test_keys_new_writes_a_key(tmp_path):
    p = subprocess.run([sys.executable, "-m", "wccl.keys", "new", "room.key"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "room.key").stat().st_size > 0


@pytest.mark.slow
def test_your_own_script_over_the_launcher_equals_gloo():
    """The README's DDP pair, with 5 steps for 30: the same parameters, bit for bit."""
    from test_distributed import EXAMPLES, gloo_reference, launch

    proc, lines = launch(ROOT / "rooms" / "two-laptops-sim.toml", EXAMPLES / "ddp_mnist.py", "--steps", "5",
                         timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = gloo_reference(EXAMPLES / "ddp_mnist.py", 2, "--steps", "5")
    assert [d["params_sha256"] for d in lines] == [ref[0]["params_sha256"]] * 2


@pytest.mark.slow
def test_the_collectives_example_over_the_launcher():
    from test_distributed import EXAMPLES, launch

    proc, lines = launch(ROOT / "rooms" / "two-laptops-sim.toml", EXAMPLES / "collectives_hello.py", timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [d["all_reduce"] for d in lines] == [[10.0, 12.0, 14.0, 16.0]] * 2


@pytest.mark.slow
def test_the_link_bench_of_the_readme(tmp_path):
    argv = "python -m wccl.lab bench --config rooms/two-laptops-sim.toml --bytes 100000 --json".split()
    p = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["undetected_errors"] == 0 and out["tensors_delivered"] > 0 and out["goodput_kBps"] > 0, out


def test_the_room_drawing_of_the_readme(tmp_path):
    p = subprocess.run([sys.executable, "-m", "wccl.room.draw", str(ROOT / "rooms/two-laptops-sim.toml")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "bob -> alice: seen" in p.stdout and "alice -> bob: seen" in p.stdout
    assert (tmp_path / "two-laptops-sim.png").stat().st_size > 10_000
