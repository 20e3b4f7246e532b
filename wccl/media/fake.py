"""Fake cameras and screens: real classes with the medium interfaces, no optics.

`FakeCamera` delivers a fixed list of images in a loop at `fps` (a black image
by default: a camera with its lens cap on). `RecordingScreen` keeps what was
shown, in memory, for tests that look at a ScreenWriter alone.
"""

from __future__ import annotations

import itertools

import numpy as np

from wccl.runtime.timebase import NodeClock


class FakeCamera:
    def __init__(self, clock: NodeClock, fps: float, images: list[np.ndarray] | None = None,
                 width: int = 1280, height: int = 720) -> None:
        if fps <= 0:
            raise ValueError("fps must be positive")
        self._clock = clock
        self._period = 1.0 / fps
        self._images = images or [np.zeros((height, width, 3), dtype=np.uint8)]
        self._t0 = clock.now()
        self._k = itertools.count(1)
        self._i = itertools.cycle(range(len(self._images)))
        self.closed = False

    async def recv(self) -> tuple[np.ndarray, float]:
        t = self._t0 + next(self._k) * self._period
        await self._clock.sleep_until(t)
        return self._images[next(self._i)].copy(), t

    def close(self) -> None:
        self.closed = True


class RecordingScreen:
    def __init__(self, clock: NodeClock) -> None:
        self._clock = clock
        self.shown: list[tuple[float, np.ndarray]] = []

    def show(self, image: np.ndarray) -> None:
        self.shown.append((self._clock.now(), image.copy()))
