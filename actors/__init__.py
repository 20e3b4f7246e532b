"""The actors of a node, one per file; each registers itself as `actor.<role>` / "standard"
(protocols.registry), and this package's import registers them all.

Actors never import each other: they talk only through messages, wired by
the supervisor (wccl.runtime.supervisor).
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

__all__ = ["CameraReader", "Clock", "Collectives", "FrameDecoder", "Intruder", "ScreenWriter", "Observer", "ParameterServer",
           "RankWorker", "Worker"]
