"""Run PyTorch's own distributed tests on the `wccl` backend, a batch of tests per pytest process, and collect
what each did: passed, failed (with the end of its error), skipped (with torch's reason) or timed out.

    python tests/torch_suite/runner.py [--world-size 2] [--profile exact] [--timeout 90]
                                       [--batch 10] [--out results.jsonl] [--table] [TEST ...]

Without TEST names it runs every test of `DistributedTest._DistTestBase` (as collected from
tests/torch_suite/wccl_torch_tests.py). Each result is appended to --out as one JSON line as soon as
it is known (a batch's when its pytest process ends), and a run given the same --out skips the tests
it already holds. --table prints the results of --out as the Markdown table of docs/torch-tests.md
(without running anything).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

from wccl.config import NODE_NAMES

ROOT = Path(__file__).resolve().parents[2]
MODULE = Path(__file__).resolve().parent / "wccl_torch_tests.py"


def room_file(directory: Path, world_size: int, profile: str = "exact") -> Path:
    """A room of `world_size` laptops (the first the server), seen through the `profile` cameras."""
    if not 1 <= world_size <= len(NODE_NAMES):
        raise ValueError(f"world size {world_size}: the wccl backend runs 1 to {len(NODE_NAMES)} ranks")
    nodes = "".join(f'\n[[room.nodes]]\nname = "{name}"\nroles = {json.dumps(["server", "worker"] if i == 0 else ["worker"])}\n'
                    for i, name in enumerate(NODE_NAMES[:world_size]))
    path = directory / f"room{world_size}-{profile}.toml"
    path.write_text(f'[room]\nprofile = "{profile}"\nsession = 31\n{nodes}\n[logging]\nlevel = "warning"\n')
    return path


def suite_env(world_size: int, directory: Path, profile: str = "exact", timeout_s: int = 90) -> dict[str, str]:
    """The variables torch's distributed_test.py reads at import (BACKEND, WORLD_SIZE, INIT_METHOD, TEMP_DIR)
    for a wccl room of `world_size` ranks written into `directory`, and torch's per-test timeout."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tmp").mkdir(exist_ok=True)
    return {"BACKEND": "wccl", "WORLD_SIZE": str(world_size),
            "INIT_METHOD": f"wccl://{room_file(directory, world_size, profile)}",
            "TEMP_DIR": str(directory / "tmp"), "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(timeout_s)}


def _clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("WCCL_") and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK")}
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def collect(world_size: int = 2) -> list[str]:
    """The names of every test of the suite, in torch's order."""
    with tempfile.TemporaryDirectory(prefix="wccl-torch-suite-") as d:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                               str(MODULE)], check=False, capture_output=True, text=True, cwd=ROOT, timeout=300,
                              env=_clean_env(suite_env(world_size, Path(d))))
    names = re.findall(r"::TestWccl::(test_\w+)", proc.stdout)
    if not names:
        raise RuntimeError(f"no tests collected:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return names


@dataclass
class Result:
    test: str
    world_size: int
    outcome: str  # passed, failed, skipped or timeout
    seconds: float
    detail: str = ""  # the skip reason or the end of the failure


def _first_line(text: str) -> str:
    return next((line.strip() for line in (text or "").splitlines() if line.strip()), "")


_LOG_PREFIX = re.compile(r"^(\[rank\d+\]:)?[EWI]\d{4} [\d:.]+ \d+ \S+\] ")  # torch's C++-style log prefix


def _clean(line: str) -> str:
    return _LOG_PREFIX.sub("", line.strip())


def _failure_detail(text: str) -> str:
    """The most telling line of a failure: the last exception line of the ranks' or the test's output."""
    lines = [_clean(line) for line in (text or "").splitlines() if line.strip()]
    keys = ("Error:", "Error(", "Exception:", "AssertionError", "NotImplementedError", "Timeout", "timed out",
            "exited with")
    hits = [line for line in lines if any(k in line for k in keys) and not line.startswith("File ")]
    return (hits[-1] if hits else (lines[-1] if lines else ""))[:400]


def _case_result(case: ET.Element, world_size: int) -> Result:
    test = case.get("name", "")
    seconds = round(float(case.get("time", "0")), 1)
    for tag in ("skipped", "failure", "error"):
        el = case.find(tag)
        if el is None:
            continue
        if tag == "skipped":
            reason = el.get("message") or _first_line(el.text)
            return Result(test, world_size, "skipped", seconds, reason.removeprefix("SkipTest: ")[:300])
        text = "\n".join(filter(None, [el.get("message"), el.text, case.findtext("system-err")]))
        detail = _failure_detail(text)
        if "Timing out after" in text or ("Process " in detail and "timed out" in detail):
            return Result(test, world_size, "timeout", seconds, detail)
        return Result(test, world_size, "failed", seconds, detail)
    return Result(test, world_size, "passed", seconds)


def run_batch(tests: list[str], world_size: int = 2, profile: str = "exact", timeout_s: int = 90) -> list[Result]:
    """Run `tests` of torch's suite in one pytest process (each test its own room and ranks, torch's
    timeout of `timeout_s` each) and return the result of every test that pytest reported; the process is
    killed once it has taken `timeout_s` + 30 s per test, and then only a lone test gets a result (timeout)."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wccl-torch-suite-") as d:
        env = _clean_env(suite_env(world_size, Path(d), profile, timeout_s))
        xml = Path(d) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
               "-o", "junit_logging=all", *(f"{MODULE}::TestWccl::{t}" for t in tests)]
        try:
            proc = subprocess.run(cmd, check=False, capture_output=True, text=True, cwd=ROOT, env=env,
                                  timeout=(timeout_s + 30) * len(tests), start_new_session=True)
        except subprocess.TimeoutExpired as e:
            _kill_group(e)
            if len(tests) == 1:
                return [Result(tests[0], world_size, "timeout", round(time.monotonic() - start, 1),
                               f"no result within {timeout_s + 30} s")]
            return []
        cases = ET.parse(xml).getroot().iter("testcase") if xml.exists() else []
        results = [_case_result(case, world_size) for case in cases]
        if not results and len(tests) == 1:
            detail = _failure_detail(proc.stdout + proc.stderr) or f"pytest exit status {proc.returncode}"
            results = [Result(tests[0], world_size, "failed", round(time.monotonic() - start, 1), detail)]
        return results


def run_one(test: str, world_size: int = 2, profile: str = "exact", timeout_s: int = 90) -> Result:
    """Run one test of torch's suite in a pytest process of its own and return its result."""
    return run_batch([test], world_size, profile, timeout_s)[0]


def _kill_group(e: subprocess.TimeoutExpired) -> None:
    """subprocess.run has killed pytest; its ranks and room, in its session, are left to stop here."""
    pid = getattr(e, "pid", None)
    if pid:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def load(out: Path) -> list[Result]:
    if not out.exists():
        return []
    return [Result(**json.loads(line)) for line in out.read_text().splitlines() if line.strip()]


def table(results: list[Result]) -> str:
    """The results as a Markdown table, one row per test, a column per world size."""
    sizes = sorted({r.world_size for r in results})
    by = {(r.test, r.world_size): r for r in results}
    tests = list(dict.fromkeys(r.test for r in results))
    head = "| test | " + " | ".join(f"{n} ranks" for n in sizes) + " | detail |"
    rows = [head, "|" + "---|" * (len(sizes) + 2)]
    for t in tests:
        cells, details = [], []
        for n in sizes:
            r = by.get((t, n))
            cells.append(f"{r.outcome} ({r.seconds:.0f} s)" if r else "")
            if r and r.detail and _clean(r.detail) not in details:
                details.append(_clean(r.detail))
        detail = " / ".join(details).replace("|", "\\|").replace("\n", " ")
        rows.append(f"| {t} | " + " | ".join(cells) + f" | {detail} |")
    counts = {n: {o: sum(1 for r in results if r.world_size == n and r.outcome == o)
                  for o in ("passed", "failed", "timeout", "skipped")} for n in sizes}
    summary = "\n".join(f"- {n} ranks: " + ", ".join(f"{v} {k}" for k, v in c.items()) for n, c in counts.items())
    groups: dict[str, dict[str, str]] = {}
    for r in results:
        if r.outcome == "skipped":
            groups.setdefault(skip_kind(r.detail), {}).setdefault(r.test, _clean(r.detail))
    sections = []
    for kind, title in SKIP_KINDS.items():
        if kind in groups:
            items = "\n".join(f"- {t}: {why}" for t, why in groups[kind].items())
            sections.append(f"### Skipped: {title} ({len(groups[kind])})\n\n{items}\n")
    return summary + "\n\n" + "\n".join(rows) + "\n\n" + "\n".join(sections)


SKIP_KINDS = {
    "cpu": "does not apply to a CPU backend (CUDA, GPUs)",
    "list": "torch's per-backend feature lists do not name wccl (the test is not tried)",
    "other": "disabled upstream, a missing package, or the world size",
}


def skip_kind(reason: str) -> str:
    """Why torch skipped a test: `cpu` when it needs CUDA or GPUs; `list` when torch's own tables of which
    backend supports what leave wccl out (DistTestCases.backend_feature, `BACKEND in (...)` checks, whose
    subgroup message says "on CUDA devices" whatever the device); `other` for the rest (a test disabled
    upstream, a missing package, too small a world)."""
    low = reason.lower()
    if re.search(r"cuda|gpu|cudnn", low) and "creating subgroups on cuda devices" not in low:
        return "cpu"
    if "wccl" in low or re.search(r"\b(mpi|gloo|nccl|ucc)\b", low):
        return "list"
    return "other"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tests", nargs="*", help="test names (default: all of them)")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--profile", default="exact", help="the room's camera profile")
    ap.add_argument("--timeout", type=int, default=90, help="seconds per test (torch's own timeout)")
    ap.add_argument("--batch", type=int, default=10, help="tests per pytest process")
    ap.add_argument("--out", type=Path, help="append each result here as a JSON line; skip tests it holds")
    ap.add_argument("--table", action="store_true", help="print --out as a Markdown table and stop")
    args = ap.parse_args(argv)
    if args.table:
        print(table(load(args.out)), end="")
        return 0
    done = {(r.test, r.world_size) for r in load(args.out)} if args.out else set()
    todo = [t for t in (args.tests or collect(args.world_size)) if (t, args.world_size) not in done]
    failed = 0

    def record(r: Result) -> None:
        nonlocal failed
        failed += r.outcome in ("failed", "timeout")
        print(f"{r.test} [{r.world_size}] {r.outcome} {r.seconds:.1f}s {r.detail[:160]}", flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(asdict(r)) + "\n")

    for i in range(0, len(todo), args.batch):
        chunk = todo[i:i + args.batch]
        got = {r.test: r for r in run_batch(chunk, args.world_size, args.profile, args.timeout)}
        for t in chunk:  # a test without a result (its batch was killed) runs again alone
            record(got[t] if t in got else run_one(t, args.world_size, args.profile, args.timeout))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
