"""A camera read by its own thread, handed to the event loop through a small ring buffer.

Consumes: images from a blocking source (a webcam's driver, the x11grab
helper's pipe), read in a daemon thread by a subclass's `_read()`. Emits:
through `async recv()`, each image with the node-clock time it was captured,
oldest first. The ring holds `buffer` images; when the event loop falls
behind, the oldest is dropped and counted (`dropped`), so what the decoder
gets is always recent. The event loop never blocks on the device.

Capture times: `_read()` stamps each image with `time.monotonic()` (the
clock every process on the machine shares, and the one asyncio's own loop
runs on); `recv()` turns that into the node's clock (`NodeClock`) by
subtracting the image's age from `clock.now()`. Real devices need a real-time
loop (room.clock = "realtime"); the media refuse virtual time.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

import numpy as np
import structlog


class CameraLost(RuntimeError):
    """The device stopped delivering images (unplugged, the helper died): the reader's restart policy decides."""


class ThreadedCamera:
    """Base class: subclasses open the device in `__init__`, call `_start()`, and implement `_read()`."""

    name = "camera"

    def __init__(self, clock, buffer: int = 4, node: str | None = None) -> None:
        if buffer < 1:
            raise ValueError("buffer must be >= 1")
        self._clock = clock
        self._loop = asyncio.get_running_loop()
        self._ring: deque[tuple[np.ndarray, float]] = deque()
        self._buffer = buffer
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._ended = False
        self._error: BaseException | None = None
        self._closed = False
        self.captured = 0  # images the device delivered
        self.dropped = 0  # of those, dropped from the ring before the loop took them
        self.delivered = 0  # returned by recv()
        self._t_first: float | None = None
        self._t_last: float | None = None
        self.log = structlog.get_logger("wccl").bind(**({"node": node} if node else {}), actor="camera")

    # -- the thread ------------------------------------------------------------------------------
    def _read(self) -> tuple[np.ndarray, float] | None:
        """Block until the next image; return (BGR image, time.monotonic() of its capture), or None at the end."""
        raise NotImplementedError

    def _release(self) -> None:
        """Release the device (called in the capture thread when it ends)."""

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"{self.name}-capture", daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def _run(self) -> None:
        try:
            while not self._halt.is_set():
                item = self._read()
                if item is None:
                    break
                with self._lock:
                    if len(self._ring) >= self._buffer:
                        self._ring.popleft()
                        self.dropped += 1
                    self._ring.append(item)
                    self.captured += 1
                    if self._t_first is None:
                        self._t_first = item[1]
                    self._t_last = item[1]
                self._wake()
        except BaseException as e:  # reported by recv(), in the event loop
            self._error = e
        finally:
            self._ended = True
            try:
                self._release()
            finally:
                self._wake()

    # -- the event loop side ---------------------------------------------------------------------
    def _to_node_time(self, t_mono: float) -> float:
        rate = getattr(self._clock, "rate", 1.0)
        return self._clock.now() - (time.monotonic() - t_mono) * rate

    async def recv(self) -> tuple[np.ndarray, float]:
        while True:
            with self._lock:
                item = self._ring.popleft() if self._ring else None
            if item is not None:
                self.delivered += 1
                image, t_mono = item
                return image, self._to_node_time(t_mono)
            if self._ended or self._closed:
                why = repr(self._error) if self._error is not None else "the stream ended"
                raise CameraLost(f"{self.name}: no more images ({why})")
            self._ready.clear()
            await self._ready.wait()

    @property
    def ended(self) -> bool:
        """The capture thread has stopped (the device ended, failed, or was closed)."""
        return self._ended

    def stats(self) -> dict:
        with self._lock:
            span = (self._t_last - self._t_first) if self._t_first is not None and self._t_last is not None else 0.0
            fps = (self.captured - 1) / span if span > 0 and self.captured > 1 else 0.0
            return dict(captured=self.captured, dropped=self.dropped, delivered=self.delivered, fps=round(fps, 2))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._halt.set()
        self._stop_source()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self.log.info("camera_closed", camera=self.name, **self.stats())

    def _stop_source(self) -> None:
        """Unblock a `_read()` that may be waiting on the device (called from the loop's thread)."""
