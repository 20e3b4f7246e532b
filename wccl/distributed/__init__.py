"""`import wccl.distributed` registers the `wccl` backend of torch.distributed.

    import torch.distributed as dist
    import wccl.distributed
    dist.init_process_group("wccl")        # rank, world size and room from `python -m wccl.launch`
    # or, without the launcher:
    dist.init_process_group("wccl", init_method="wccl://rooms/two-laptops-sim.toml?node=alice")
    # or with the rank naming the node (rank r is the room's r-th training node):
    dist.init_process_group("wccl", init_method="wccl://rooms/two-laptops-sim.toml", rank=0, world_size=2)

Rank order is the room file's node order (observers excluded). No network is
used, for rendezvous or anything else: the launcher's environment (RANK,
WORLD_SIZE, WCCL_CONFIG, WCCL_NODE, and WCCL_ROOM: the simulated room's
socket) says everything; `env://` gets a process-local store when WCCL_CONFIG
is set and MASTER_ADDR is not, and `wccl://` always does. The store is never
used to talk to other ranks. `init_process_group("wccl")` in a process that
neither the launcher nor torchrun started (no WCCL_CONFIG, no MASTER_ADDR)
raises a ConfigError saying how to start it, instead of torch's "environment
variable RANK expected".

The launcher also sets WCCL_LOG_LEVEL and WCCL_LOG_FORMAT (they override the
room file's [logging]) and WCCL_STATUS_FD, a pipe on which the rank reports
its start-up and its collectives' totals (wccl.distributed.status).

Each rank runs its node (camera, screen, decoder, collectives) on a thread of
its own process (wccl.distributed.rank_node); the process group
(wccl.distributed.backend) hands it every collective.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import sys
import urllib.parse
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from wccl.config import ConfigError, WcclConfig, load_config, with_values

_rdzv = importlib.import_module("torch.distributed.rendezvous")  # the module (the package exports a function)
BACKEND = "wccl"
_pending: dict = {}  # what the rendezvous learned, for the backend's creator
_nodes: list = []
_groups: list = []  # this process's world group (subgroups travel over its node)
_subgroups: dict[tuple[int, ...], int] = {}  # members -> groups made of them so far (wccl.distributed.backend.group_tag)
_status: list = []  # this process's status channel to the launcher (wccl.distributed.status), if any
NOT_LAUNCHED = ("wccl: this script needs its ranks started by the launcher: python -m wccl.launch --config "
                "ROOM.toml script.py (or pass init_method='wccl://ROOM.toml?node=NAME')")


def _room_from_env() -> tuple[WcclConfig, str]:
    path, node = os.environ.get("WCCL_CONFIG"), os.environ.get("WCCL_NODE")
    if not path or not node:
        raise ConfigError(f"{NOT_LAUNCHED}; WCCL_CONFIG and WCCL_NODE are not both set")
    return load_config(Path(path)), node


def _init_backend() -> str | None:
    """The backend of the `init_process_group` call running this rendezvous (torch hands a rendezvous
    handler no backend; the call's frame has it), or None when no such call is found."""
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return None
        if frame.f_code.co_name == "init_process_group" and "backend" in frame.f_locals:
            backend = frame.f_locals["backend"]
            return str(backend).lower() if backend is not None else None
        frame = frame.f_back
    return None


def _check_rank(cfg: WcclConfig, node: str, rank: int | None, world: int | None, source: str) -> tuple[int, int]:
    ranks = cfg.room.ranks
    if node not in ranks:
        raise ConfigError(f"{source}: node {node!r} is not a training node of the room ({', '.join(ranks)})")
    r, w = ranks.index(node), len(ranks)
    if world is not None and world != -1 and world != w:
        raise ConfigError(f"{source}: world size {world} does not match the room's {w} training nodes "
                          f"({', '.join(ranks)})")
    if rank is not None and rank != -1 and rank != r:
        raise ConfigError(f"{source}: rank {rank} does not match node {node!r}, which is rank {r} "
                          "(rank order is the room file's node order)")
    return r, w


def _wccl_rendezvous(url: str, rank: int = -1, world_size: int = -1, **kwargs):
    """`wccl://ROOM.toml?node=NAME`: the room file names the ranks; the node says which one this is.
    Without `node` (and without WCCL_NODE) the rank passed to `init_process_group` picks the node: rank r
    is the room's r-th training node."""
    parsed = urllib.parse.urlparse(url)
    path = (parsed.netloc + parsed.path) if parsed.netloc not in ("", "localhost") else parsed.path
    query = dict(urllib.parse.parse_qsl(parsed.query))
    cfg = load_config(Path(path))
    # torch puts init_process_group's rank and world_size into the URL's query
    rank = int(query.get("rank", rank))
    world_size = int(query.get("world_size", world_size))
    node = query.get("node") or os.environ.get("WCCL_NODE")
    if not node:
        ranks = cfg.room.ranks
        if not 0 <= rank < len(ranks):
            raise ConfigError(f"{url}: name this laptop's node (wccl://ROOM.toml?node=NAME) or pass "
                              f"init_process_group a rank from 0 to {len(ranks) - 1}")
        node = ranks[rank]
    r, w = _check_rank(cfg, node, rank, world_size, url.split("?")[0])
    _pending.update(config=cfg, node=node)
    yield dist.HashStore(), r, w
    raise RuntimeError("wccl: rendezvous cannot be repeated")


_env_handler = _rdzv._rendezvous_handlers["env"]


def _env_rendezvous(url: str, timeout: timedelta = dist.default_pg_timeout, **kwargs):
    """env:// as torchrun sets it, unless this process was started by `python -m wccl.launch`."""
    if os.environ.get("WCCL_CONFIG") and not os.environ.get("MASTER_ADDR"):
        cfg, node = _room_from_env()
        rank = int(os.environ.get("RANK", "-1"))
        world = int(os.environ.get("WORLD_SIZE", "-1"))
        r, w = _check_rank(cfg, node, rank, world, f"WCCL_CONFIG={os.environ['WCCL_CONFIG']}")
        _pending.update(config=cfg, node=node)
        yield dist.HashStore(), r, w
        return
    if not os.environ.get("MASTER_ADDR") and _init_backend() == BACKEND:
        # Neither the launcher nor torchrun started this process: torch would ask for RANK.
        raise ConfigError(NOT_LAUNCHED)
    yield from _env_handler(url, timeout=timeout, **kwargs)


def _create(opts, backend_options=None):
    """The backend's creator (torch's extended API): the world group first, then any subgroup of it."""
    from wccl.distributed.backend import WcclProcessGroup, WcclSubgroup
    from wccl.distributed.rank_node import RankNode

    rank, world, timeout = opts.group_rank, opts.group_size, opts.timeout
    members = list(opts.global_ranks_in_group)
    if _groups and members:
        key = tuple(members)
        index = _subgroups.get(key, 0)
        _subgroups[key] = index + 1
        sub = WcclSubgroup(_groups[0], members, rank, index)
        sub._set_group_name(opts.group_id)  # torch names the groups it makes, but not those a backend returns
        return sub
    if not _pending:
        cfg, node = _room_from_env()  # a store was passed: the environment still names the room
        _check_rank(cfg, node, rank, world, "init_process_group")
    else:
        cfg, node = _pending["config"], _pending["node"]
    if _nodes:
        raise RuntimeError("wccl: init_process_group twice in one process (destroy the first)")
    clock = os.environ.get("WCCL_CLOCK")
    if clock:
        if clock not in ("virtual", "realtime"):
            raise ConfigError(f"WCCL_CLOCK={clock}: expected 'virtual' or 'realtime'")
        cfg = with_values(cfg, "WCCL_CLOCK", room={"clock": clock})
    from wccl.distributed import status
    from wccl.runtime.logs import add_tap, configure_logging

    level = os.environ.get("WCCL_LOG_LEVEL") or cfg.logging.level
    fmt = os.environ.get("WCCL_LOG_FORMAT") or cfg.logging.format
    if level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"WCCL_LOG_LEVEL={level}: expected debug, info, warning or error")
    if fmt not in ("auto", "console", "json"):
        raise ConfigError(f"WCCL_LOG_FORMAT={fmt}: expected auto, console or json")
    channel = status.from_env(node)
    # stdout is the program's; the status tap reads the node's start-up events (info) whatever the level
    configure_logging(fmt, level, stream=sys.stderr, taps_level="info" if channel is not None else None)
    if channel is not None:
        add_tap(channel.tap)
        _status.append(channel)
    node_rt = RankNode(cfg, node, timeout_s=timeout.total_seconds(), room_socket=os.environ.get("WCCL_ROOM"))
    node_rt.start()
    if channel is not None:
        channel.send("joined", world=world)
    try:
        node_rt.wait_handshake(timeout.total_seconds())
    except RuntimeError:
        node_rt.close()
        raise
    _nodes.append(node_rt)
    if channel is not None:
        channel.send("ready", t=round(node_rt.sim_seconds(), 3))
    group = WcclProcessGroup(rank, world, node_rt, status=channel)
    group._set_group_name(opts.group_id)
    _groups.append(group)
    return group


def shutdown() -> None:
    """Drain and stop this process's node (peers first read what they still need), and write the last
    collectives' totals to the launcher. Idempotent; also runs at exit and from `destroy_process_group`
    through atexit."""
    t = _nodes[0].sim_seconds() if _nodes else None
    while _nodes:
        _nodes.pop().close()
    _groups.clear()
    _subgroups.clear()
    for channel in _status:
        channel.flush(t)


def sim_seconds() -> float:
    """This rank's time so far in the room (simulated seconds, its compute charged); 0 without a node."""
    return _nodes[0].sim_seconds() if _nodes else 0.0


@contextlib.contextmanager
def uncharged() -> Iterator[None]:
    """Run the block without charging its CPU time to this rank's clock: work a real run would leave to
    an observer, such as evaluating on the test set. Without a wccl node it does nothing."""
    if not _nodes:
        yield
        return
    with _nodes[0].uncharged():
        yield


def bytes_posted() -> int:
    """Tensor bytes this rank has handed to its screen so far (every collective's payload, as framed)."""
    if not _nodes or _nodes[0].sup is None:
        return 0
    return int(_nodes[0].sup.results.get("collectives", {}).get("bytes_posted", 0))


def algorithms_used() -> dict[str, int]:
    """How many collectives each algorithm (protocols.algorithms) has carried on this rank so far."""
    if not _nodes or _nodes[0].sup is None:
        return {}
    return dict(_nodes[0].sup.results.get("collectives", {}).get("algorithms", {}))


def node_results() -> dict:
    """What this rank's node counted (frames shown, transfers, link figures), for reports."""
    if not _nodes or _nodes[0].sup is None:
        return {}
    return dict(_nodes[0].sup.results)


_rdzv._rendezvous_handlers["env"] = _env_rendezvous
if "wccl" not in _rdzv._rendezvous_handlers:
    dist.register_rendezvous_handler("wccl", _wccl_rendezvous)
if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
atexit.register(shutdown)
