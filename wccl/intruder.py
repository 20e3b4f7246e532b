"""An intruder's laptop in the simulated room: `python -m wccl.intruder` (started by wccl.launch).

A node with `roles = ["intruder"]` has a camera and a screen in the room and
no room key: it films the ranks' screens and shows forged, random, replayed
and bit-flipped frames (actors/intruder.py) until the launcher stops it.
The room's ranks must end exactly as they would without it.

Environment (set by wccl.launch): WCCL_CONFIG, WCCL_NODE, WCCL_ROOM (the
room's socket), WCCL_ROOM_AUTHKEY; optional WCCL_INTRUDER_RECORD (save what
it filmed) and WCCL_INTRUDER_REPLAY (show frames filmed in an earlier run).
"""

from __future__ import annotations

import asyncio
import os
import sys

import structlog

from wccl.config import ConfigError, WcclConfig, load_config
from wccl.runtime.hostos import stop_on_signals
from wccl.runtime.supervisor import NodeSupervisor


class IntruderNode(NodeSupervisor):
    """A node with a camera, a screen and the Intruder actor; it runs until stopped. What the Intruder
    films is one list of the node's, handed to each instance, so a restart of the actor loses none of it."""

    def actor_names(self) -> list[str]:
        return ["camera_reader", "intruder"]

    def build(self) -> None:
        from wccl.distributed.rank_node import collective_layout

        cfg = self.config
        screen = self._media()
        codec, hold_s = collective_layout(cfg)
        self.deps = {
            "camera_reader": dict(camera=self.camera),
            "intruder": dict(screen=screen, codec=codec, screen_w=cfg.screen.width, screen_h=cfg.screen.height,
                             hold_s=hold_s, session=cfg.room.session, world=len(cfg.room.ranks),
                             seed=cfg.room.seed, replay_window_s=cfg.room.replay_window_s,
                             record_to=os.environ.get("WCCL_INTRUDER_RECORD"),
                             replay_from=os.environ.get("WCCL_INTRUDER_REPLAY"), filmed=[]),
        }
        self._wire()


async def _run(cfg: WcclConfig, node: str, medium) -> None:
    structlog.contextvars.bind_contextvars(node=node)
    sup = IntruderNode(cfg, node, medium)
    loop = asyncio.get_running_loop()
    with stop_on_signals(loop, sup.stop.set):
        await sup.run()


def main() -> int:
    from wccl.runtime.logs import configure_logging
    from wccl.room import remote

    try:
        cfg = load_config(os.environ["WCCL_CONFIG"])
        node = os.environ["WCCL_NODE"]
        if node not in cfg.room.intruders:
            raise ConfigError(f"{node!r} is not an intruder node of the room")
    except (KeyError, ConfigError) as e:
        print(f"wccl.intruder: {e}", file=sys.stderr)
        return 2
    configure_logging(cfg.logging.format, cfg.logging.level, stream=sys.stderr)
    medium, loop = remote.connect(os.environ["WCCL_ROOM"], node, cfg.room.clock, busy=lambda: False)
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_run(cfg, node, medium))
    finally:
        close = getattr(medium, "close", None)
        if close is not None:
            close()
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
