"""Where pixels go: the interface between actors and a medium.

A medium gives each node a *screen* (a sink: `show(image)`) and a *camera*
(a source: `await recv()` returns the next image and the node-clock time it
was captured). Actors only see these two small interfaces, so they never
know whether they run in the simulated room, on real hardware, or on a
recorded video. Media and camera/screen implementations are chosen by name
through the registry (kinds "medium", "camera", "screen").
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Screen(Protocol):
    def show(self, image: np.ndarray) -> float | None:
        """Put `image` (H x W x 3 uint8 BGR) on the screen, now.

        A real screen (wccl.media.window) returns the node-clock time the frame was presented,
        so the ScreenWriter can measure its lag; simulated and fake screens return None. A screen
        may also have `set_overlay(lines: list[str] | None)`: instructions shown during start-up,
        never over the code's cells.
        """


class Camera(Protocol):
    async def recv(self) -> tuple[np.ndarray, float]:
        """Wait for the next capture; return (image, node-clock time of the capture)."""

    def close(self) -> None:
        """Release the device (idempotent)."""
