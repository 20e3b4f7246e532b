"""Registry entries for media, cameras and screens (kinds "medium", "camera", "screen").

Factories take keyword arguments: a medium gets `config`; a camera or a
screen gets `medium`, `node` (its name), `clock` and `config`.
"""

from __future__ import annotations

from wccl.media.fake import FakeCamera, RecordingScreen
from wccl.media import desktop as _desktop, hardware as _hardware
from protocols.registry import REGISTRY
from wccl.room import SimulatedRoom


def _simulated(*, config):
    return SimulatedRoom.from_config(config)


def _is_room(medium) -> bool:
    """The simulated room, in this process or reached in its own (wccl.room.remote)."""
    from wccl.room.remote import RemoteRoom

    return isinstance(medium, (SimulatedRoom, RemoteRoom))


def _room_camera(*, medium, node, clock, config):
    if not _is_room(medium):
        raise TypeError("camera 'room' needs the simulated room medium")
    return medium.camera(node, clock)


def _room_screen(*, medium, node, clock, config):
    if not _is_room(medium):
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

# Real devices: fullscreen windows and webcams, or real windows filmed on one X display.
# These modules import OpenCV and PyAV only when a part is created.
REGISTRY.register("medium", "hardware", _hardware.HardwareMedium.from_config, replace=True)
REGISTRY.register("medium", "desktop", _desktop.DesktopMedium.from_config, replace=True)
REGISTRY.register("camera", "webcam", _hardware.webcam_camera, replace=True)
REGISTRY.register("camera", "x11grab", _desktop.x11grab_camera, replace=True)
REGISTRY.register("screen", "window", _hardware.window_screen, replace=True)
