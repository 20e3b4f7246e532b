"""The built-in run's node when every node is a rank (`[training] exchange = "collectives"`).

`TrainingRank` is a rank's node of wccl.distributed (CameraReader,
FrameDecoder, TransferWriter, Collectives: discovery at start-up, the
algorithms, agreement) with a RankWorker (actors/rank_worker.py) in place of
the user's program: it trains the run's model and all-gathers each step's
gradient over the light. No parameter server, no step schedule, no clock
sync: a step goes up when every rank's gradient is ready, as in a
torch.distributed run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from protocols.messages import Message
from wccl.config import ConfigError, WcclConfig
from wccl.distributed.runtime import CollectiveNode
from wccl.supervisor import NodeSupervisor

MIN_GREET_S = 60.0  # a rank gives up when the run handshake and discovery are not done in this long (room seconds)


def check(cfg: WcclConfig) -> None:
    """What a room needs to train with exchange = "collectives" (a ConfigError naming the key otherwise)."""
    room = cfg.room
    if room.observers:
        raise ConfigError(f"room.nodes: observer {room.observers[0]!r} watches a parameter server's screen; with "
                          f"exchange = \"collectives\" ({cfg.training.exchange!r} in a room of {len(room.nodes)} "
                          "nodes) there is none: drop the observer or set [training] exchange = \"server\"")
    idle = [n for n in room.ranks if n not in room.workers]
    if idle:
        raise ConfigError(f"room.nodes: {idle[0]!r} does not train; with exchange = \"collectives\" every node is a "
                          "rank and trains (give it the 'worker' role)")
    if cfg.recovery.resume:
        raise ConfigError("recovery.resume: with exchange = \"collectives\" there is no server checkpoint to resume")


class TrainingRank(CollectiveNode):
    """A rank of the built-in run: a CollectiveNode whose program is a RankWorker."""

    def __init__(self, config: WcclConfig, node: str, medium: Any, stop: asyncio.Event | None = None,
                 clock_origin: float = 0.0, monitor: Any = None, run_key: bytes | None = None) -> None:
        from wccl.keys import room_key

        super().__init__(config, node, medium, timeout_s=config.collectives.timeout_s, on_done=lambda _: None,
                         stop=stop, clock_origin=clock_origin, key=room_key(config, ephemeral=run_key))
        self.monitor = monitor

    def actor_names(self) -> list[str]:
        return [*super().actor_names(), "rank_worker"]

    def build(self) -> None:
        from wccl.training.data import load_dataset
        from wccl.training.exchange import codec_from_config
        from wccl.training.replica import Replica

        super().build()
        cfg, room, tr = self.config, self.config.room, self.config.training
        dataset = load_dataset(tr.dataset, seed=tr.data_seed, test_size=tr.test_size)  # this laptop's own copy
        replica = Replica(model_name=tr.model, init=tr.init, seed=tr.seed, optimizer=tr.optimizer, lr=tr.lr,
                          momentum=tr.momentum, dataset=dataset, rank=room.workers.index(self.node),
                          world=len(room.workers), batch_size=tr.batch_size, data_seed=tr.data_seed, split=tr.split)
        greeted = asyncio.Event()
        self.handshake.on_complete.append(greeted.set)
        if self.handshake.complete:
            greeted.set()
        col = cfg.collectives
        self.deps["rank_worker"] = dict(
            replica=replica, codec=codec_from_config(tr), names=self.ranks, steps=tr.steps, greeted=greeted,
            greet_problem=self.greet_problem, greet_timeout_s=max(col.timeout_s, MIN_GREET_S), quorum=cfg.quorum,
            eval_every=tr.eval_every, compute_scale=col.compute_scale, drain_s=col.drain_s)

    async def _emit(self, msg: Message) -> None:
        await NodeSupervisor._emit(self, msg)  # CollectiveDone goes to the RankWorker, like any message
