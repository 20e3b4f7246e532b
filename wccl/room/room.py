"""The simulated room and its per-node screens and cameras.

Profile `exact`: a camera sees every other node's screen pixel for pixel,
side by side in room order (a perfect camera). The realistic channel
(geometry, optics, sensor, timing, compression) replaces `_view` per profile.

Consumes: images shown on each node's screen (with the true time they went
up). Emits: for each camera capture, one image of what that camera sees.
"""

from __future__ import annotations

import asyncio
import bisect

import numpy as np

from protocols.layout import blank
from wccl.timebase import NodeClock


class SimulatedRoom:
    HISTORY = 8  # screen images kept per node: enough for any exposure window

    def __init__(self, node_names: list[str], screen_w: int, screen_h: int, fps: float,
                 profile: str = "exact", seed: int = 0) -> None:
        if profile != "exact":
            raise ValueError(f"unknown room profile {profile!r}")
        if len(set(node_names)) != len(node_names):
            raise ValueError("node names must be unique")
        self.profile = profile
        self.nodes = list(node_names)
        self.screen_w, self.screen_h = screen_w, screen_h
        self.fps = fps
        self.seed = seed
        black = blank(screen_w, screen_h)
        black.setflags(write=False)
        # Per node: times (ascending) and the images shown from those times on.
        self._times: dict[str, list[float]] = {n: [float("-inf")] for n in self.nodes}
        self._images: dict[str, list[np.ndarray]] = {n: [black] for n in self.nodes}
        self.captures = 0

    @classmethod
    def from_config(cls, config) -> SimulatedRoom:
        """The room a `WcclConfig` describes; ValueError names a bad profile or override."""
        return cls([n.name for n in config.room.nodes], config.screen.width, config.screen.height,
                   config.camera.fps, profile=config.room.profile, seed=config.room.seed)

    @staticmethod
    def now() -> float:
        """The room's true time."""
        return asyncio.get_running_loop().time()

    def screen(self, node: str) -> RoomScreen:
        self._check(node)
        return RoomScreen(self, node)

    def camera(self, node: str, clock: NodeClock) -> RoomCamera:
        self._check(node)
        return RoomCamera(self, node, clock)

    def _check(self, node: str) -> None:
        if node not in self.nodes:
            raise KeyError(f"node {node!r} is not in the room ({', '.join(self.nodes)})")

    def _show(self, node: str, image: np.ndarray) -> None:
        if image.shape != (self.screen_h, self.screen_w, 3) or image.dtype != np.uint8:
            raise ValueError(
                f"screen of {node} is {self.screen_w}x{self.screen_h} BGR uint8, got {image.shape} {image.dtype}"
            )
        frozen = image.copy()  # the room owns its copy: the sender may reuse its array
        frozen.setflags(write=False)
        times, images = self._times[node], self._images[node]
        t = self.now()
        if times[-1] == t:
            images[-1] = frozen
        else:
            times.append(t)
            images.append(frozen)
        if len(times) > self.HISTORY:
            del times[0], images[0]

    def screen_at(self, node: str, t: float) -> np.ndarray:
        """What `node`'s screen showed at true time `t` (read-only)."""
        times = self._times[node]
        i = bisect.bisect_right(times, t) - 1
        return self._images[node][max(i, 0)]

    def visible_from(self, node: str) -> list[str]:
        return [n for n in self.nodes if n != node]

    def _view(self, node: str, t: float) -> np.ndarray:
        shown = [self.screen_at(n, t) for n in self.visible_from(node)]
        self.captures += 1
        if len(shown) == 1:
            return shown[0].copy()
        return np.concatenate(shown, axis=1)


class RoomScreen:
    """A node's screen in the room."""

    def __init__(self, room: SimulatedRoom, node: str) -> None:
        self._room, self._node = room, node

    def show(self, image: np.ndarray) -> None:
        self._room._show(self._node, image)


class RoomCamera:
    """A node's camera in the room: captures at the room's fps, timestamped on the node's clock."""

    def __init__(self, room: SimulatedRoom, node: str, clock: NodeClock) -> None:
        self._room, self._node, self._clock = room, node, clock
        self._period = 1.0 / room.fps
        # Cameras start at different phases: their captures do not line up with screen changes.
        phase = (room.nodes.index(node) * 0.37 + room.seed * 0.11) % 1.0
        self._start = room.now() + phase * self._period
        self._k = 0
        self.missed = 0  # capture slots skipped because nobody asked in time
        self.closed = False

    async def recv(self) -> tuple[np.ndarray, float]:
        if self.closed:
            raise RuntimeError("camera is closed")
        now = self._room.now()
        late = int((now - self._start) / self._period) - self._k
        if late > 0:  # a real camera keeps running while nobody reads it
            self.missed += late
            self._k += late
        t = self._start + self._k * self._period
        self._k += 1
        delay = t - now
        if delay > 0:
            await asyncio.sleep(delay)
        image = self._room._view(self._node, t)
        return image, self._clock.now()

    def close(self) -> None:
        self.closed = True
