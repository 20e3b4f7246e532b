"""`python -m wccl.node --config config.toml`: run the room's nodes (or one of them).

The composition root: the one module of `wccl` that imports `actors` (which
register themselves), builds the medium named in config, runs one
NodeSupervisor per node on one event loop (virtual or real time), and ends
with a `run_finished` event. Exit status: 0 done, 1 a node failed,
2 bad config or bad arguments, 3 no display (a window was asked for),
4 no camera, 130 interrupted (Ctrl-C / SIGTERM, or Esc in a node's window).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from wccl.cli import command_parser
from wccl.config import ConfigError, WcclConfig, load_config, with_values
from wccl.runtime.hostos import stop_on_signals
from wccl.runtime.logs import configure_logging, end_progress
from wccl.media.display import DeviceError
from protocols.registry import REGISTRY, UnknownPart
from wccl.runtime.timebase import new_loop

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130


@dataclass(frozen=True)
class Fault:
    """Kill `node` (as if its laptop crashed) `at_s` seconds into the room's run; with `down_s` set,
    start it again that much later: a fresh process that knows nothing (the parameter server, with
    `resume`, reads its checkpoint). At 0 the node does not start with the others: with `down_s`, it
    starts that late. For tests and demonstrations of recovery (`--kill`)."""

    node: str
    at_s: float
    down_s: float | None = None
    resume: bool = True


class RoomRun:
    """Runs the nodes of a room in this process; `result` holds what they reported."""

    def __init__(self, config: WcclConfig, only: str | None = None, faults: tuple[Fault, ...] = ()) -> None:
        from protocols.security import RoomKey
        from wccl.keys import new_ephemeral, pairs, room_key
        from wccl.training.nodes import node_class

        self.config = config
        names = [n.name for n in config.room.nodes]
        if only is not None and only not in names:
            raise ConfigError(f"--node {only}: not a node of the room ({', '.join(names)})")
        self.names = [only] if only else names
        self.stop = asyncio.Event()
        self.medium = REGISTRY.create("medium", config.room.medium, config=config)
        bind_stop = getattr(self.medium, "bind_stop", None)  # real windows: Esc stops the run
        if bind_stop is not None:
            bind_stop(self.stop.set)
        self.origin = origin = asyncio.get_running_loop().time()
        # The dashboard's hub watches every node (a one-way tap: it never answers them).
        self.monitor = None
        if config.dashboard.enabled:
            from wccl.dashboard import Hub

            self.monitor = Hub(config)
        # Each node's assembly by its roles and the run's exchange (wccl.training.nodes).
        self.node_class = {n: node_class(config, n) for n in self.names}
        # The room key: the one the room names; a simulated room that names none gets a fresh one for this run
        # (wccl.keys), as if copied to every laptop; a room that pairs gets it over the light when it runs
        # (`_pair`: then the nodes are made). Each node gets its own copy of the config, as each laptop reads
        # its own file.
        self.pairing = pairs(config)
        self.keys: dict[str, Any] = {}
        self.supervisors: list[Any] = []
        if self.pairing:
            watchers = [n for n in self.names if n not in config.room.ranks]
            if watchers:
                raise ConfigError(f"room.key: {watchers[0]!r} is an observer, which only listens and cannot pair "
                                  "over the light: give the room a key (key_file or key_env)")
        else:
            key = room_key(config, ephemeral=new_ephemeral() if config.room.medium == "simulated" else None)
            self._make_nodes({n: RoomKey(key.secret, key.source) for n in self.names})  # (a key each: no shared state)
        self.result: dict[str, Any] = {}
        self.faults = {f.node: f for f in faults}
        for f in faults:
            if f.node not in self.names:
                raise ConfigError(f"fault: {f.node!r} is not a node of this run")

    def _make_nodes(self, keys: dict[str, Any], media: dict[str, tuple] | None = None) -> None:
        """Each node, with its key (and the camera and screen its pairing used)."""
        self.keys = keys
        self.supervisors = [self.node_class[n](self.config.model_copy(deep=True), n, self.medium, self.stop,
                                               self.origin, monitor=self.monitor, key=keys[n],
                                               **({"media": media[n]} if media else {})) for n in self.names]

    async def _pair(self) -> bool:
        """The ranks here pair over the light (wccl.distributed.pairing), then their nodes are made with the key;
        False if the run was stopped meanwhile (Esc in a window, Ctrl-C). The people who confirm the code:
        this process's table when every rank runs here (they see every screen), else the person at this
        laptop."""
        from wccl.distributed.pairing import Table, pair, people_for
        from wccl.distributed.rank_node import CollectiveNode
        from wccl.runtime.supervisor import NodeFailed

        ranks = self.config.room.ranks
        people = (Table(self.names) if set(ranks) <= set(self.names)
                  else people_for(self.config, ranks, self.stop, self.config.sync.timeout_s))
        paired = await asyncio.gather(*(pair(self.config, n, self.medium, people, CollectiveNode,
                                             clock_origin=self.origin, stop=self.stop) for n in self.names),
                                      return_exceptions=True)
        done = [p for p in paired if not isinstance(p, BaseException)]
        if self.stop.is_set() or len(done) < len(paired):
            for _, (camera, _screen) in done:
                if hasattr(camera, "close"):
                    camera.close()
            if self.stop.is_set():
                return False
            why = "; ".join(f"{n}: {p}" for n, p in zip(self.names, paired) if isinstance(p, BaseException))
            raise NodeFailed(f"no room key: {why}")
        self._make_nodes({n: k for n, (k, _) in zip(self.names, paired)}, {n: m for n, (_, m) in zip(self.names, paired)})
        return True

    async def _node(self, sup: Any) -> Any:
        """Run one node; with a fault planned for it, kill it and start a fresh one as planned."""
        fault = self.faults.get(sup.node)
        if fault is None:
            return await sup.run()
        loop = asyncio.get_running_loop()
        log = structlog.get_logger("wccl")
        if fault.at_s > 0:
            try:
                async with asyncio.timeout_at(sup.clock_origin + fault.at_s):
                    return await sup.run()
            except TimeoutError:
                log.warning("node_killed", node=sup.node, at_s=fault.at_s)
        else:  # (killed at 0: it never ran; with `down_s`, it starts that late)
            log.warning("node_not_started", node=sup.node)
        if fault.down_s is None:
            return None
        await asyncio.sleep(max(0.0, sup.clock_origin + fault.at_s + fault.down_s - loop.time()))
        cfg = self.config.model_copy(deep=True)
        if fault.resume and fault.at_s > 0 and cfg.exchange == "server" and sup.node == cfg.room.server:
            # (the parameter server alone goes on from its checkpoint; a rank of the collectives rejoins)
            cfg = with_values(cfg, recovery={"resume": True})
        fresh = self.node_class[sup.node](cfg, sup.node, self.medium, self.stop, sup.clock_origin, monitor=self.monitor,
                                          key=self.keys[sup.node])
        self.supervisors[self.supervisors.index(sup)] = fresh
        log.warning("node_restarted", node=sup.node, down_s=fault.down_s)
        fresh.build()
        return await fresh.run()

    async def run(self) -> dict[str, Any]:
        dashboard = None
        if self.monitor is not None:
            from wccl.dashboard import DashboardServer

            dash = self.config.dashboard
            dashboard = DashboardServer(self.monitor, dash.host, dash.port)
            await dashboard.start()
            if dash.wait_for_page_s > 0:
                await dashboard.wait_for_page(self.stop, dash.wait_for_page_s)
                self.origin = asyncio.get_running_loop().time()  # the room starts now, not before the wait
                for sup in self.supervisors:
                    sup.clock_origin = self.origin
        try:
            result = await self._run()
            if dashboard is not None:
                await dashboard.linger(self.stop, self.config.dashboard.linger_s)
            return result
        finally:
            if dashboard is not None:
                await dashboard.close()

    async def _run(self) -> dict[str, Any]:
        log = structlog.get_logger("wccl")
        wall0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        log.info("run_started", nodes=self.names, clock=self.config.room.clock, medium=self.config.room.medium,
                 profile=self.config.room.profile, steps=self.config.training.steps,
                 exchange=self.config.exchange, schedule=self.config.schedule.preset)
        rec = self.config.recovery
        writers = [self.config.room.server] if self.config.exchange == "server" else self.config.room.ranks
        if rec.checkpoint_every and set(writers) & set(self.names):
            log.info("run_folder", path=rec.checkpoint_dir, holds=f"checkpoints every {rec.checkpoint_every} steps")
        interrupted = self.pairing and not await self._pair()  # (then no node runs)
        for sup in self.supervisors:
            sup.build()
            if self.pairing:
                from wccl.distributed.pairing import keep_once_greeted

                keep_once_greeted(sup, self.config, self.keys[sup.node])
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(self._node(sup), name=sup.node) for sup in self.supervisors]
            trainers = [t for t, s in zip(tasks, self.supervisors) if "observer" not in s.spec.roles]
            if trainers and len(trainers) < len(tasks):
                # Observers have no schedule: the run is over for them when every trainer here is done.
                await asyncio.wait(trainers)
                for sup in self.supervisors:
                    if "observer" in sup.spec.roles:
                        sup.end()
        results = {t.get_name(): t.result() for t in tasks if t.result() is not None}  # None: killed for good
        server = self.config.room.server
        acc_node = server if server in results and "worker" in self.config.room.node(server).roles else \
            next((n for n in results if "worker" in results[n].results), None)
        worker = results[acc_node].results.get("worker", {}) if acc_node else {}
        digests = {n: r.results.get("worker", {}).get("params_sha256") for n, r in results.items()}
        digests = {n: d for n, d in digests.items() if d}
        observed = {n: r.results["observer"] for n, r in results.items() if "observer" in r.results}
        announced = results[server].results.get("clock", {}).get("announce") if server in results else None
        if not worker and observed:  # only observers ran here (`--node carol`): theirs is the model we have
            worker = next(iter(observed.values()))
        self.result = dict(
            test_accuracy=round(worker.get("test_accuracy", float("nan")), 4),
            steps=self.config.training.steps,
            # the model's updates (a node that started again took some of them in a snapshot)
            applied=worker.get("state_applied", worker.get("applied", 0)),
            # steps the server skipped (a worker's gradient did not come) and made up at the end (actors/clock.py)
            made_up=announced.steps - self.config.training.steps if announced is not None else 0,
            sim_seconds=round(loop.time() - t0, 3),
            wall_seconds=round(time.perf_counter() - wall0, 2),
            replicas_identical=len(set(digests.values())) == 1 if len(digests) > 1 else None,
            # The observers' models, rebuilt from light alone: equal to the server's, bit for bit?
            observer_identical=(all(o.get("params_sha256") == digests[server] for o in observed.values())
                                if observed and server in digests else None),
            observer_accuracy={n: round(o.get("test_accuracy", float("nan")), 4) for n, o in observed.items()},
            observer_applied={n: o.get("applied", 0) for n, o in observed.items()},
            stopped=interrupted or any(r.stopped for r in results.values()),
            restarts={n: r.restarts for n, r in results.items() if r.restarts},
            link={n: r.results.get("link", {}) for n, r in results.items()},
            nodes={n: {k: v for k, v in r.results.items() if k != "link"} for n, r in results.items()},
        )
        if self.result["stopped"]:
            log.warning("run_interrupted", **{k: self.result[k] for k in ("steps", "sim_seconds", "wall_seconds")})
        else:
            log.info("run_finished", **{k: v for k, v in self.result.items() if k not in ("link", "nodes")},
                     params_sha256=digests.get(acc_node))
        return self.result


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("wccl.node", "Run WCCL nodes from a room config.")
    p.add_argument("--config", default="config.toml", help="room config file (default: config.toml)")
    p.add_argument("--node", help="run only this node of the room (default: all of them, in this process)")
    p.add_argument("--log-format", choices=["auto", "console", "json"], help="override [logging] format")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="override [logging] level")
    p.add_argument("--clock", choices=["virtual", "realtime"], help="override [room] clock")
    p.add_argument("--steps", type=int, help="override [training] steps")
    p.add_argument("--seed", type=int, help="override [training] seed (model initialisation)")
    p.add_argument("--resume", action="store_true",
                   help="the parameter server resumes from its checkpoint ([recovery] checkpoint_dir)")
    p.add_argument("--kill", action="append", default=[], metavar="NODE:AT_S[:DOWN_S]",
                   help="a simulated room only: kill NODE (as if its laptop crashed) AT_S room seconds into the run "
                        "and, with DOWN_S, start it again that much later knowing nothing (the parameter server "
                        "reads its checkpoint); once per node; AT_S 0: NODE starts DOWN_S late. To watch "
                        "recovery and late starts")
    p.add_argument("--aim-seconds", type=float, default=120.0,
                   help="on real devices (medium \"hardware\"), aim first (wccl aim) for at most this long; 0: "
                        "start at once")
    return p


def _override(cfg: WcclConfig, args: argparse.Namespace) -> WcclConfig:
    if args.steps is not None and args.steps < 1:
        raise ConfigError("--steps: must be >= 1")

    def given(**values):  # the options given (None: not given; a flag not set is False; 0 is a value)
        return {k: v for k, v in values.items() if v is not None and v is not False}

    return with_values(cfg, "the command line", room=given(clock=args.clock),
                       training=given(steps=args.steps, seed=args.seed), recovery=given(resume=args.resume),
                       logging=given(format=args.log_format, level=args.log_level))


def parse_kills(specs: list[str], cfg: WcclConfig, only: str | None) -> tuple[Fault, ...]:
    """`--kill NODE:AT_S[:DOWN_S]` as Faults, or a ConfigError saying what is wrong."""
    if specs and (cfg.room.medium != "simulated" or only is not None):
        raise ConfigError("--kill: only in a simulated room whose nodes all run in this process (no --node)")
    faults = []
    for spec in specs:
        parts = spec.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            node, at_s, down_s = parts[0], float(parts[1]), float(parts[2]) if len(parts) == 3 else None
        except ValueError:
            raise ConfigError(f"--kill {spec!r}: expected NODE:AT_S or NODE:AT_S:DOWN_S (seconds)") from None
        names = [n.name for n in cfg.room.nodes]
        if node not in names:
            raise ConfigError(f"--kill {spec!r}: {node!r} is not a node of the room ({', '.join(names)})")
        if at_s < 0 or (down_s is not None and down_s < 0):
            raise ConfigError(f"--kill {spec!r}: times are seconds from the start, not negative")
        if any(f.node == node for f in faults):
            raise ConfigError(f"--kill {spec!r}: {node} is killed once a run")
        faults.append(Fault(node, at_s, down_s))
    return tuple(faults)


def summary_table(result: dict[str, Any]) -> str:
    """The end of a run in a few lines, for a terminal: accuracy, steps, times, and per node what its
    screen sent and its camera read and lost (by reason). The same figures are in `run_finished`."""
    acc = result["test_accuracy"]
    # (a run stopped before its first evaluation has no accuracy to say)
    made_up = result.get("made_up", 0)
    lines = [f"run {'interrupted' if result['stopped'] else 'finished'}: {result['applied']} of {result['steps']} "
             "steps applied" + (f" ({made_up} skipped and made up at the end)" if made_up else "")
             + (f", test accuracy {acc:.3f}" if math.isfinite(acc) else
                ", no test accuracy yet" if result["stopped"] else ", test accuracy not measured")]
    same = {True: "identical", False: "DIFFERENT", None: "-"}
    lines.append(f"  replicas {same[result['replicas_identical']]}, observers {same[result['observer_identical']]}; "
                 f"{result['sim_seconds']:.1f} s room time, {result['wall_seconds']:.1f} s wall")
    if result["restarts"]:
        lines.append(f"  restarts: {', '.join(f'{n} {k}' for n, k in result['restarts'].items())}")
    rows = [("node", "frames shown", "bytes sent", "frames read", "frames lost (by reason)")]
    for name, actors in result["nodes"].items():
        link = result["link"].get(name, {})
        shown = sum(a.get("frames_shown", 0) for a in actors.values() if isinstance(a, dict))
        sent = sum(a.get("bytes_sent", 0) + a.get("bytes_posted", 0) for a in actors.values() if isinstance(a, dict))
        lost = {k.removeprefix("frames_rejected_"): v for k, v in link.items()
                if k.startswith("frames_rejected_") and v}
        lost_text = ", ".join(f"{k} {v}" for k, v in sorted(lost.items(), key=lambda kv: -kv[1])) or "none"
        rows.append((name, str(shown), str(sent), str(link.get("frames_ok", 0)), lost_text))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    return "\n".join(lines)


async def _main_async(cfg: WcclConfig, only: str | None, summary: bool = False, faults: tuple[Fault, ...] = ()) -> int:
    from wccl.runtime.supervisor import NodeFailed

    loop = asyncio.get_running_loop()
    run = RoomRun(cfg, only, faults)
    try:
        with stop_on_signals(loop, run.stop.set):
            result = await run.run()
    except NodeFailed as e:  # (before any node ran: the pairing gave no key)
        structlog.get_logger("wccl").error("run_failed", error=str(e))
        return EXIT_FAILED
    except BaseExceptionGroup as eg:
        failed, rest = eg.split(NodeFailed)
        if rest is not None or failed is None:
            raise
        for e in failed.exceptions:
            structlog.get_logger("wccl").error("run_failed", error=str(e))
        return EXIT_FAILED
    if summary:
        end_progress()
        print(summary_table(result), flush=True)
    return EXIT_INTERRUPTED if result["stopped"] else EXIT_OK


def builtin_run_check(cfg: WcclConfig) -> None:
    """The built-in run exchanges gradients every step (any codec, either split); local steps and the
    other keys of wccl.lab train run through wccl.distributed: say so instead of ignoring them."""
    tr = cfg.training
    odd = [f"{k} = {getattr(tr, k)!r}" for k, default in (("sync_every", 1), ("drift_correction", False),
                                                          ("overlap", False), ("ema", 0.0), ("augment", 0))
           if getattr(tr, k) != default]
    if cfg.exchange == "collectives":
        from wccl.training.nodes import check

        check(cfg)
    replaying = [n.name for n in cfg.room.nodes if n.camera == "file"]
    if replaying:
        raise ConfigError(f"room.nodes: {replaying[0]!r} has camera = \"file\": a recording cannot answer its peers "
                          "(every transfer is acknowledged); record a node's camera with record_to and read the "
                          "recording back with wccl.room.record.read_recording")
    if cfg.room.intruders:
        raise ConfigError(f"room.nodes: intruder {cfg.room.intruders[0]!r}: intruders attack the rooms of "
                          "wccl.distributed (python -m wccl.launch); the built-in run has none")
    if odd:
        raise ConfigError(f"training: {', '.join(odd)}: the built-in run (python -m wccl.node) exchanges gradients "
                          "every step (with any codec and either split); local steps run through "
                          "`python -m wccl.lab train` or wccl.distributed (docs/compression.md)")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = _override(load_config(Path(args.config)), args)
    except ConfigError as e:
        print(f"wccl: config error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        builtin_run_check(cfg)
        faults = parse_kills(args.kill, cfg, args.node)
    except ConfigError as e:
        print(f"wccl: config error: {args.config}: {e}", file=sys.stderr)
        return EXIT_CONFIG
    fmt = configure_logging(cfg.logging.format, cfg.logging.level, progress=True)
    if cfg.room.medium == "hardware" and args.aim_seconds > 0:
        from wccl.aim import aim_first

        status = aim_first(cfg, args.node, args.aim_seconds)
        if status is not None:
            return status
    import torch

    # One thread: the model is tiny, and gradients must not depend on the thread count (bit-exact replicas).
    torch.set_num_threads(1)
    try:
        with asyncio.Runner(loop_factory=lambda: new_loop(cfg.room.clock)) as runner:
            return runner.run(_main_async(cfg, args.node, summary=fmt == "console", faults=faults))
    except (ConfigError, UnknownPart) as e:
        print(f"wccl: config error: {args.config}: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except DeviceError as e:  # no display (3), no camera (4): say what to do, no traceback
        print(f"wccl: {e}", file=sys.stderr)
        return e.exit_status
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
