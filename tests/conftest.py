"""Shared test helpers: configs built in code, and rooms run on virtual time."""

from __future__ import annotations

import asyncio
import copy
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from wccl.config import WcclConfig, parse_config
from wccl.runtime.timebase import VirtualTimeLoop

ROOT = Path(__file__).resolve().parent.parent
# Set by .ci/run: there a tool the tests need (Xvfb, xdotool) that is missing fails its tests, never skips them.
IN_CI = bool(os.environ.get("WCCL_CI"))


def needs_tools(*tools: str):
    """Skip (on a developer's machine, not in CI) a test whose programs are not installed."""
    missing = [t for t in tools if shutil.which(t) is None]
    return pytest.mark.skipif(bool(missing) and not IN_CI,
                              reason=f"{', '.join(missing)} not installed (.ci/run installs it)")
SHARED = ROOT.parent / "shared"


def shipped_config_dict() -> dict[str, Any]:
    return tomllib.loads((ROOT / "config.toml").read_text())


def deep_update(base: dict[str, Any], updates: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in updates.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_update(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def make_config(**sections: Any) -> WcclConfig:
    """The shipped config with sections overridden, e.g. make_config(training={"steps": 3})."""
    data = deep_update(shipped_config_dict(), sections)
    data.setdefault("logging", {})["format"] = "json"
    if "dashboard" not in sections:  # the shipped dashboard listens on a fixed port: tests ask for it
        data.setdefault("dashboard", {})["enabled"] = False
    return parse_config(data, "test-config", ROOT)


def run_virtual(coro_factory):
    """Run `coro_factory()` on a fresh virtual-time loop; return its result."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro_factory())


def run_room(cfg: WcclConfig, only: str | None = None) -> dict[str, Any]:
    from wccl.node import RoomRun

    async def go():
        return await RoomRun(cfg, only).run()

    return run_virtual(go)


@pytest.fixture(autouse=True)
def _quiet_logs():
    """Logs as JSON lines to a buffer, so tests can read them and output stays readable."""
    import io

    from wccl.runtime.logs import configure_logging

    buf = io.StringIO()
    configure_logging("json", "debug", stream=buf)
    yield buf


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the slow end-to-end tests (CI does)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        # The slow runs first (stable: otherwise in file order), so that with `-n 2` the short tests fill
        # the end of both workers' time instead of one long run finishing alone (with `--dist worksteal`,
        # pyproject.toml: an idle worker takes half of the other's queue).
        items.sort(key=lambda item: "slow" not in item.keywords)
        return
    skip = pytest.mark.skip(reason="slow end-to-end test: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def press_escape_until_exit(title: str, env: dict, proc: subprocess.Popen, presses: int, wait_s: float) -> None:
    """Press Escape in the window named `title` until `proc` exits (at most `presses` times, `wait_s`
    apart): a key sent while the window is still being mapped or focused can be lost (seen under load)."""
    for _ in range(presses):
        subprocess.run(["xdotool", "search", "--name", title, "windowfocus", "--sync", "key", "Escape"],
                       env=env, timeout=10)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
