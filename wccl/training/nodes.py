"""The built-in run's nodes: one assembly per kind (`python -m wccl.node`).

Every node that trains is a rank's node of wccl.distributed (CameraReader,
FrameDecoder, ScreenWriter, Collectives: the run handshake, discovery at
start-up, acknowledged transfers; wccl.distributed.rank_node.CollectiveNode)
with the run's own actors on top:

- `ServerRunNode` (`[training] exchange = "server"`): a Clock, and the
  ParameterServer and/or a Worker by the node's roles. Gradients go to the
  server and its word on each step (the average) comes back as
  point-to-point transfers (protocols.streams), on the step schedule the
  server announces and every Clock ticks off its synced clock.
- `TrainingRank` (`exchange = "collectives"`): a RankWorker, which
  all-gathers each step's gradients by the algorithm the room's sight fits.
  The rank with the `server` role shows each step's average and snapshots
  for the room's observers, and answers a rank that restarted mid-run.
- `ObserverNode`: a node that only listens (CameraReader, FrameDecoder in
  listening mode, Observer): it overhears the words and snapshots of the
  server's screen (the parameter server's, or with collectives the rank
  with the `server` role) and rebuilds the model; it shows nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from protocols.messages import Message
from wccl.config import ConfigError, WcclConfig
from wccl.distributed.rank_node import CollectiveNode, collective_ladder
from wccl.runtime.supervisor import NodeSupervisor

MIN_GREET_S = 60.0  # a node gives up when the run handshake and discovery are not done in this long (room seconds)


def check(cfg: WcclConfig) -> None:
    """What a room needs to train with exchange = "collectives" (a ConfigError naming the key otherwise)."""
    room = cfg.room
    idle = [n for n in room.ranks if n not in room.workers]
    if idle:
        raise ConfigError(f"room.nodes: {idle[0]!r} does not train; with exchange = \"collectives\" every node is a "
                          "rank and trains (give it the 'worker' role)")


def node_class(cfg: WcclConfig, node: str) -> type[NodeSupervisor]:
    """The assembly of one node of the built-in run."""
    if "observer" in cfg.room.node(node).roles:
        return ObserverNode
    return TrainingRank if cfg.exchange == "collectives" else ServerRunNode


def _replica(cfg: WcclConfig, node: str, dataset=None):
    """This node's replica (each laptop loads its own copy of the data: nodes share nothing but the room)."""
    from wccl.training.data import load_dataset
    from wccl.training.replica import Replica

    room, tr = cfg.room, cfg.training
    if dataset is None:
        dataset = load_dataset(tr.dataset, seed=tr.data_seed, test_size=tr.test_size)
    return Replica(model_name=tr.model, init=tr.init, seed=tr.seed, optimizer=tr.optimizer, lr=tr.lr,
                   momentum=tr.momentum, dataset=dataset,
                   rank=room.workers.index(node) if node in room.workers else 0, world=len(room.workers),
                   batch_size=tr.batch_size, data_seed=tr.data_seed, split=tr.split)


def _gradient_bytes(cfg: WcclConfig) -> int:
    """A gradient of the run's model as its codec sends it."""
    from wccl.training.exchange import codec_from_config
    from wccl.training.model import build_model, param_count

    return codec_from_config(cfg.training).encoded_size(param_count(build_model(cfg.training.model, "default", 0)))


class _TrainingNode(CollectiveNode):
    """A rank's node of the built-in run: the transport, the room key, and `greeted` for its actors."""

    def __init__(self, config: WcclConfig, node: str, medium: Any, stop: asyncio.Event | None = None,
                 clock_origin: float = 0.0, monitor: Any = None, key: Any = None, media: tuple | None = None) -> None:
        super().__init__(config, node, medium, timeout_s=config.collectives.timeout_s, on_done=lambda _: None,
                         stop=stop, clock_origin=clock_origin, key=key, media=media)
        self.monitor = monitor
        # The layout is judged by what the run moves every step: its gradient.
        self.layout_bytes = _gradient_bytes(config)

    def build(self) -> None:
        super().build()
        cfg, room = self.config, self.config.room
        self.greet_timeout_s = max(cfg.collectives.timeout_s, MIN_GREET_S)
        if self.node == room.server and self.handshake.sight is not None:
            # The server-role node leads start-up: after `wait_for_nodes_s` it starts without the workers not
            # started, if those started make the quorum (protocols.discovery); they may join later.
            def start_without(missing: int) -> bool:
                present = [w for w in room.workers if not missing >> self.ranks.index(w) & 1]
                return len(present) >= cfg.quorum

            self.handshake.sight.start_without = start_without
            self.handshake.sight.wait_s = room.wait_for_nodes_s
        if cfg.quorum < len(room.workers):
            self.greet_timeout_s += room.wait_for_nodes_s  # (the room may wait that long for every node first)

    async def _emit(self, msg: Message) -> None:
        await NodeSupervisor._emit(self, msg)  # CollectiveDone goes to the run's actors, like any message


class ServerRunNode(_TrainingNode):
    """A node of the parameter server's run: a Clock, and the ParameterServer and/or a Worker."""

    def actor_names(self) -> list[str]:
        roles = self.spec.roles
        return [*super().actor_names(), "clock", *(["worker"] if "worker" in roles else []),
                *(["parameter_server"] if "server" in roles else [])]

    def build(self) -> None:
        from protocols import streams
        from protocols.security import TAG_BYTES
        from wccl.training.exchange import codec_from_config

        super().build()
        cfg, room, tr, col = self.config, self.config.room, self.config.training, self.config.collectives
        self.greet_timeout_s = cfg.sync.timeout_s  # greeting and clock sync: `[sync] timeout_s`
        roles = self.spec.roles
        replica = _replica(cfg, self.node) if "worker" in roles else None
        grad_codec = codec_from_config(tr)  # what gradients and averages travel as (wccl.training.exchange)
        resume, ckpt_path, server_replica = None, None, None
        if "server" in roles:
            from wccl.runtime.recovery import CheckpointError, checkpoint_path, load_checkpoint

            ckpt_path = checkpoint_path(cfg.recovery.checkpoint_dir, room.session, self.node)
            if cfg.recovery.resume:
                try:
                    resume = load_checkpoint(ckpt_path, room.session, self.key)
                except CheckpointError as e:
                    raise ConfigError(f"recovery.resume: {e}") from None
            # The server's own copy of the training state (snapshots, checkpoints): no data shard needed.
            server_replica = _replica(cfg, room.server, replica.dataset if replica is not None else None)
        numel = (replica or server_replica).numel
        truth = None
        reading = getattr(self.medium, "true_reading", None)
        if reading is not None and "server" not in roles:
            # For logs only: what the server's clock truly reads when this node's clock reads t.
            server_reading = reading(room.server, self.clock_origin)
            mine = self.local_clock
            truth = lambda t: server_reading(mine.to_loop_time(t))  # noqa: E731
        sched = cfg.schedule
        self.deps.update(
            clock=dict(server=room.server, ranks=self.ranks, steps=tr.steps,
                       phases=None if sched.preset == "auto" else sched.resolved(), start_s=sched.start_s,
                       work_s=sched.work_s, margin_frames=sched.margin_frames, sync_cfg=cfg.sync,
                       greeted=self.greeted, greet_problem=self.greet_problem, greet_timeout_s=self.greet_timeout_s,
                       ladder=collective_ladder(cfg),
                       tensor_bytes=grad_codec.encoded_size(numel) + streams.OVERHEAD + TAG_BYTES,
                       resume=dict(resume[0], epoch=resume[1].epoch, applied=resume[1].applied) if resume else None,
                       truth=truth, drain_s=col.drain_s, observed=bool(room.observers)),
            worker=dict(replica=replica, server=room.server, eval_every=tr.eval_every, codec=grad_codec,
                        compute_scale=col.compute_scale),
            parameter_server=dict(workers=room.workers, quorum=cfg.quorum, numel=numel, codec=grad_codec,
                                  replica=server_replica, snapshot_every=cfg.recovery.snapshot_every,
                                  checkpoint_every=cfg.recovery.checkpoint_every, checkpoint=ckpt_path,
                                  session=room.session, resume=resume, key=self.key,
                                  compute_scale=col.compute_scale, observed=bool(room.observers)),
        )


class TrainingRank(_TrainingNode):
    """A rank of the built-in run with exchange = "collectives": a CollectiveNode whose program is a RankWorker."""

    def actor_names(self) -> list[str]:
        return [*super().actor_names(), "rank_worker"]

    def build(self) -> None:
        from wccl.runtime.recovery import checkpoint_path
        from wccl.training.exchange import codec_from_config

        super().build()
        cfg, tr, col, rec = self.config, self.config.training, self.config.collectives, self.config.recovery
        self.deps["rank_worker"] = dict(
            replica=_replica(cfg, self.node), codec=codec_from_config(tr), names=self.ranks, steps=tr.steps,
            greeted=self.greeted, greet_problem=self.greet_problem, greet_timeout_s=self.greet_timeout_s,
            quorum=cfg.quorum, eval_every=tr.eval_every, compute_scale=col.compute_scale, drain_s=col.drain_s,
            shows_observers=bool(cfg.room.observers) and self.node == cfg.room.server,
            snapshot_every=rec.snapshot_every, checkpoint_every=rec.checkpoint_every, resume=rec.resume,
            checkpoint=checkpoint_path(rec.checkpoint_dir, cfg.room.session, self.node), session=cfg.room.session,
            key=self.key, lead=cfg.room.server, joining=self._joins_running, start_group=self._start_group)

    def _joins_running(self) -> bool:
        """The others ran before this node started: it took its row of the room's sight from their frames (it
        started again), or it joined a room that started without it."""
        sight = self.handshake.sight
        return sight is not None and (sight.adopted > 0 or sight.rows[sight.rank].admitted)

    def _start_group(self) -> int:
        """The ranks the room started with (a bit a rank)."""
        sight = self.handshake.sight
        return (1 << len(self.ranks)) - 1 if sight is None else sight.started_with()


class ObserverNode(NodeSupervisor):
    """A node that only listens: it overhears the server's words and snapshots and rebuilds the model."""

    def actor_names(self) -> list[str]:
        return ["camera_reader", "frame_decoder", "observer"]

    def build(self) -> None:
        from protocols import transfer
        from wccl.keys import log_key
        from wccl.training.exchange import codec_from_config

        cfg, room = self.config, self.config.room
        self._media()  # (its screen shows nothing)
        key = self.room_key()
        log_key(structlog.get_logger("wccl"), key)
        ladder = collective_ladder(cfg)
        self.deps = {
            "camera_reader": dict(camera=self.camera),
            "frame_decoder": dict(codec=ladder[0][0], session=room.session, node_names=room.ranks,
                                  transfers=transfer.TransferAssembler(), ladder=[c for c, _ in ladder], key=key,
                                  lens=cfg.lens_of(self.node), listen=True),
            "observer": dict(replica=_replica(cfg, self.node), server=room.server, steps=cfg.training.steps,
                             codec=codec_from_config(cfg.training), stopped=self.stop.is_set),
        }
        self._wire()
