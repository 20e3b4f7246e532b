"""`python -m wccl.launch --config ROOM.toml script.py [args]`: one process per laptop, as torchrun does.

Starts one OS process per training node of the room file (rank order is the
room file's node order; observers are not ranks), each running `script.py`
with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, WCCL_CONFIG and
WCCL_NODE set, so that `dist.init_process_group("wccl")` needs no argument.
In the simulated room, the room itself runs as one more process
(`python -m wccl.room.serve`), reached by the ranks through a Unix socket
(WCCL_ROOM) and sharing nothing else with them. On real laptops,
`--node NAME` runs this laptop's rank only. No network is used.

Exit status: 0 when every rank exits 0; otherwise the first failing rank's
status (a rank that loses a peer fails its collectives with a clear error
after its timeout; once one rank has failed, the others get `--grace-s`
seconds to end on their own, then are stopped, as torchrun does); 2 for bad arguments or config (one line, no traceback);
130 on Ctrl-C or SIGTERM, after every process it started has stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wccl.cli import HelpFormatter
from wccl.config import ConfigError, load_config
from wccl.keys import RUN_KEY_ENV, new_ephemeral, room_key

EXIT_OK, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 2, 130
ROOM_START_S = 60.0  # how long the room process may take to open its socket
STOP_GRACE_S = 10.0  # after SIGTERM, how long a process may take before it is killed


class LaunchError(Exception):
    pass


def json_objects(text: str) -> list[dict]:
    """Every JSON object in the ranks' shared output, wherever the newlines fall: two processes write
    to one stream, and unbuffered (PYTHONUNBUFFERED) a print's newline is a write of its own, so one
    rank's object can be followed by another's on the same line."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while (i := text.find("{", i)) != -1:
        try:
            item, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(formatter_class=HelpFormatter, prog="python -m wccl.launch",
                                description="Run a PyTorch script on every laptop of a WCCL room (the 'wccl' backend).")
    p.add_argument("--config", required=True, help="the room file (its training nodes are the ranks, in order)")
    p.add_argument("--node", help="run only this laptop's rank (real laptops: one launcher per laptop)")
    p.add_argument("--clock", choices=["virtual", "realtime"], help="override [room] clock (simulated room)")
    p.add_argument("--grace-s", type=float, default=30.0,
                   help="once a rank fails, the others get this long (wall seconds) before they are stopped")
    p.add_argument("--room-log", help="write the room process's log to this file (default: this terminal)")
    p.add_argument("script", help="the training script (python file)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return p


def _stop(procs: list[subprocess.Popen], sig: int = signal.SIGTERM) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _start_room(config: Path, nodes: list[str], clock: str | None, env: dict, log) -> tuple[subprocess.Popen, str]:
    sock = os.path.join(tempfile.mkdtemp(prefix="wccl-room-"), "room.sock")
    cmd = [sys.executable, "-m", "wccl.room.serve", "--config", str(config), "--socket", sock,
           "--nodes", ",".join(nodes), "--authkey-env", "WCCL_ROOM_AUTHKEY"]
    if clock:
        cmd += ["--clock", clock]
    room = subprocess.Popen(cmd, env=env, stdout=log or sys.stderr, stderr=log or sys.stderr)
    deadline = time.monotonic() + ROOM_START_S
    while not os.path.exists(sock):
        if room.poll() is not None:
            raise LaunchError(f"the room process exited with status {room.returncode} before it was ready")
        if time.monotonic() > deadline:
            _stop([room])
            raise LaunchError(f"the room process did not open {sock} within {ROOM_START_S:g} s")
        time.sleep(0.05)
    return room, sock


def _wait(procs: list[subprocess.Popen], grace_s: float) -> int:
    """Wait for every rank; once one fails, the others get `grace_s` to end (their collectives fail with
    their own errors when their timeout is shorter), then are stopped, as torchrun stops a job."""
    first_failure: int | None = None
    failed_at = None
    while True:
        codes = [p.poll() for p in procs]
        for c in codes:
            if c not in (None, 0) and first_failure is None:
                first_failure, failed_at = c, time.monotonic()
        if all(c is not None for c in codes):
            return first_failure or EXIT_OK
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            print(f"wccl.launch: a rank exited with status {first_failure}; stopping the others after "
                  f"{grace_s:g} s", file=sys.stderr)
            _stop(procs)
            return first_failure
        time.sleep(0.1)


def launch(args: argparse.Namespace) -> int:
    config_path = Path(args.config).resolve()
    cfg = load_config(config_path)
    script = Path(args.script)
    if not script.is_file():
        raise LaunchError(f"{args.script}: no such script")
    ranks = cfg.room.ranks
    if args.node is not None and args.node not in ranks:
        raise LaunchError(f"--node {args.node}: not a training node of the room ({', '.join(ranks)})")
    simulated = cfg.room.medium == "simulated"
    room_key(cfg)  # a key file or passphrase that cannot be had: one line here, before anything starts
    if args.node is not None and simulated:
        raise LaunchError("--node runs one laptop's rank on real devices; the simulated room runs every rank "
                          "(leave out --node)")
    run = [args.node] if args.node else ranks
    base = dict(os.environ)
    base.pop("MASTER_ADDR", None)
    base.pop("MASTER_PORT", None)
    base.update(WORLD_SIZE=str(len(ranks)), LOCAL_WORLD_SIZE=str(len(run)), WCCL_CONFIG=str(config_path))
    if args.clock:
        base["WCCL_CLOCK"] = args.clock
    procs: list[subprocess.Popen] = []
    intruders: list[subprocess.Popen] = []
    room = None
    log = open(args.room_log, "w") if args.room_log else None  # noqa: SIM115 - closed below
    interrupted = False

    def _interrupt(signum, frame):
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if simulated:
            base["WCCL_ROOM_AUTHKEY"] = secrets.token_hex(16)
            if (cfg.room.key_file is None and cfg.room.key_env is None and cfg.room.security == "auto"
                    and not base.get(RUN_KEY_ENV)):
                base[RUN_KEY_ENV] = new_ephemeral().hex()  # the run's room key (wccl.keys): every rank's
            room, sock = _start_room(config_path, ranks + cfg.room.intruders, args.clock, base, log)
            base["WCCL_ROOM"] = sock
            # Intruders (a test of the room key): their own processes, without the run's key.
            bare = {k: v for k, v in base.items() if k != RUN_KEY_ENV}
            intruders += [subprocess.Popen([sys.executable, "-m", "wccl.intruder"], env=dict(bare, WCCL_NODE=n),
                                           stdout=log or sys.stderr, stderr=log or sys.stderr)
                          for n in cfg.room.intruders]
        for local, node in enumerate(run):
            env = dict(base, RANK=str(ranks.index(node)), LOCAL_RANK=str(local), WCCL_NODE=node)
            procs.append(subprocess.Popen([sys.executable, str(script), *args.args], env=env))
        return _wait(procs, args.grace_s)
    except KeyboardInterrupt:
        interrupted = True
        return EXIT_INTERRUPTED
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _stop(procs)
        _stop(intruders)
        if room is not None:
            _stop([room])
        if log is not None:
            log.close()
        if interrupted:
            print("wccl.launch: interrupted; every process it started has stopped", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return launch(args)
    except (ConfigError, LaunchError) as e:
        print(f"wccl.launch: {e}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
