"""PyTorch's own distributed tests (`DistributedTest._DistTestBase` of
torch/testing/_internal/distributed/distributed_test.py, unchanged) on the `wccl` backend.

Driven as upstream's test/distributed/test_distributed_spawn.py drives them for gloo: the
environment names the backend (BACKEND=wccl), the world size (WORLD_SIZE) and the init method
(INIT_METHOD=wccl://ROOM.toml, the rank picking its node) before torch's module is imported, and
`TestDistBackend` spawns one process per rank for each test. Each test gets a simulated room of its
own: setUp starts `python -m wccl.room.serve` on a fresh socket before torch spawns the ranks (they
find it through WCCL_ROOM), tearDown stops it.

Run by tests/torch_suite/runner.py, one test per pytest process; by hand:

    python -m pytest tests/torch_suite/wccl_torch_tests.py -k test_broadcast

(without BACKEND in the environment the module sets it up itself: 2 ranks, an `exact` room in a
temporary directory; WCCL_SUITE_WORLD_SIZE and WCCL_SUITE_PROFILE change that).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import runner

if "BACKEND" not in os.environ:  # started by hand: the runner's environment, in a directory of its own
    os.environ.update(runner.suite_env(int(os.environ.get("WCCL_SUITE_WORLD_SIZE", "2")),
                                       Path(tempfile.mkdtemp(prefix="wccl-torch-suite-")),
                                       os.environ.get("WCCL_SUITE_PROFILE", "exact")))

from torch.testing._internal.common_distributed import DistTestCases
from torch.testing._internal.common_utils import run_tests

# The features torch's tests gate on that the wccl backend has, declared before torch's module reads them
# (its decorators read these sets at import): DistributedDataParallel on CPU tensors, and subgroups.
# Not "gpu" or "cuda": wccl moves CPU tensors only.
DistTestCases.backend_feature["ddp"].add("wccl")
DistTestCases.backend_feature["subgroup"].add("wccl")

from torch.testing._internal.distributed.distributed_test import (
    INIT_METHOD,
    DistributedTest,
    TestDistBackend,
)

import wccl.distributed  # noqa: F401  (registers the backend, here and in every spawned rank)


class TestWccl(TestDistBackend, DistributedTest._DistTestBase):
    """Every test of `_DistTestBase`, each rank a process, the ranks meeting in a simulated room."""

    @property
    def init_method(self):
        # TestDistBackend's own is a file:// rendezvous; the wccl rendezvous reads the room file.
        return INIT_METHOD

    def setUp(self):
        super().setUp()  # torch's temporary directories, and INIT_METHOD pointed at a file:// rendezvous there
        os.environ["INIT_METHOD"] = INIT_METHOD  # back to the room, for the ranks' own import of torch's module
        self._room_log = tempfile.NamedTemporaryFile(prefix="wccl-room-", suffix=".log", delete=False)  # noqa: SIM115 (tearDown)
        self._room, sock = start_room(Path(INIT_METHOD.removeprefix("wccl://")), self._room_log)
        os.environ["WCCL_ROOM"] = str(sock)
        self._spawn_processes()

    def tearDown(self):
        try:
            super().tearDown()
        finally:
            code = stop_room(self._room)
            self._room_log.close()
            log = Path(self._room_log.name)
            text = log.read_text(errors="replace")
            log.unlink(missing_ok=True)
            if code not in (0, None) and text.strip():
                print(f"room exit status {code}; its log:\n{text[-4000:]}", file=sys.stderr)


def start_room(config: Path, log) -> tuple[subprocess.Popen, Path]:
    """Start the simulated room of `config` on a new Unix socket; return the process and the socket once
    the socket exists. The room's key is handed to the ranks through WCCL_ROOM_AUTHKEY."""
    sock = Path(tempfile.gettempdir()) / f"wccl-suite-{os.getpid()}-{secrets.token_hex(4)}.sock"
    os.environ["WCCL_ROOM_AUTHKEY"] = secrets.token_hex(16)
    room = subprocess.Popen([sys.executable, "-m", "wccl.room.serve", "--config", str(config), "--socket", str(sock),
                             "--authkey-env", "WCCL_ROOM_AUTHKEY"], stdout=log, stderr=log, cwd=runner.ROOT)
    deadline = time.monotonic() + 60
    while not sock.exists():
        if room.poll() is not None:
            raise RuntimeError(f"the room stopped before it listened (exit status {room.returncode})")
        if time.monotonic() > deadline:
            room.kill()
            raise RuntimeError("the room did not listen within 60 s")
        time.sleep(0.05)
    return room, sock


def stop_room(room: subprocess.Popen) -> int | None:
    """The room's exit status: it leaves by itself once every rank has; otherwise it is stopped."""
    try:
        return room.wait(timeout=5)
    except subprocess.TimeoutExpired:
        room.terminate()
        try:
            room.wait(timeout=10)
        except subprocess.TimeoutExpired:
            room.kill()
            room.wait()
        return None


if __name__ == "__main__":
    run_tests()
