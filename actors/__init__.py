"""The actors of a node, one per file; each registers itself as `actor.<role>` / "standard".

Actors never import each other: they talk only through messages, wired by
the supervisor (wccl.supervisor).
"""

from actors.camera_reader import CameraReader
from actors.clock import Clock
from actors.collectives import Collectives
from actors.frame_decoder import FrameDecoder
from actors.intruder import Intruder
from actors.observer import Observer
from actors.parameter_server import ParameterServer
from actors.rank_worker import RankWorker
from actors.screen_writer import ScreenWriter
from actors.worker import Worker
from wccl.registry import REGISTRY

STANDARD = {
    "clock": Clock,
    "camera_reader": CameraReader,
    "frame_decoder": FrameDecoder,
    "screen_writer": ScreenWriter,
    "worker": Worker,
    "parameter_server": ParameterServer,
    "observer": Observer,
    "collectives": Collectives,
    "rank_worker": RankWorker,
    "intruder": Intruder,
}

for _role, _cls in STANDARD.items():
    REGISTRY.register(f"actor.{_role}", "standard", _cls, replace=True)

__all__ = ["CameraReader", "Clock", "Collectives", "FrameDecoder", "Intruder", "ScreenWriter", "Observer", "ParameterServer", "RankWorker", "Worker", "STANDARD"]
