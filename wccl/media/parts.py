"""Registry entries for media, cameras and screens (kinds "medium", "camera", "screen").

Factories take keyword arguments: a medium gets `config`; a camera or a
screen gets `medium`, `node` (its name), `clock` and `config`.
"""

from __future__ import annotations

from wccl.media.fake import FakeCamera, RecordingScreen
from wccl.registry import REGISTRY
from wccl.room import SimulatedRoom


def _simulated(*, config):
    return SimulatedRoom.from_config(config)


def _room_camera(*, medium, node, clock, config):
    if not isinstance(medium, SimulatedRoom):
        raise TypeError("camera 'room' needs the simulated room medium")
    return medium.camera(node, clock)


def _room_screen(*, medium, node, clock, config):
    if not isinstance(medium, SimulatedRoom):
        raise TypeError("screen 'room' needs the simulated room medium")
    return medium.screen(node)


def _fake_camera(*, medium, node, clock, config):
    return FakeCamera(clock, config.camera.fps, width=config.screen.width, height=config.screen.height)


def _file_camera(*, medium, node, clock, config):
    from wccl.room.record import FileCamera

    return FileCamera(config.room.node(node).camera_file, clock)


def _recording_screen(*, medium, node, clock, config):
    return RecordingScreen(clock)


REGISTRY.register("medium", "simulated", _simulated, replace=True)
REGISTRY.register("camera", "room", _room_camera, replace=True)
REGISTRY.register("camera", "fake", _fake_camera, replace=True)
REGISTRY.register("camera", "file", _file_camera, replace=True)
REGISTRY.register("screen", "room", _room_screen, replace=True)
REGISTRY.register("screen", "recording", _recording_screen, replace=True)
