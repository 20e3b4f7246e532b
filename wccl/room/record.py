"""Record any camera's stream to a video file, and replay it as a camera.

Consumes: (image, node-clock time) pairs, from any camera. Emits: a video
file (PyAV, lossless: FFV1 by default, or x264 RGB at qp 0) whose frame
timestamps are the capture times; and, on replay, the same images
(byte-identical) and times.

Container and time base: `.nut` (the default and the recommended one)
keeps timestamps in microseconds; `.mkv` works too but FFmpeg's Matroska
muxer rounds timestamps to milliseconds. Node-clock times are stored as
integer microseconds (pts = round(t * 1e6)), so replayed times equal the
recorded ones to within 0.5 us.

`RecordingCamera` wraps a camera and records what passes through `recv()`;
`FileCamera` has the camera interface (`async recv() -> (image, t)`,
`close()`) and paces frames by their recorded times on the node clock it is
given. Encoding and decoding run off the event loop (`asyncio.to_thread`).
"""

from __future__ import annotations

import asyncio
from fractions import Fraction
from pathlib import Path

import numpy as np

US = Fraction(1, 1_000_000)
_FORMATS = {".nut": "nut", ".mkv": "matroska"}


def _format_for(path: Path) -> str:
    fmt = _FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: record to .nut (microsecond timestamps) or .mkv (millisecond), "
                         f"not {path.suffix or 'no suffix'}")
    return fmt


_CODECS = {  # name -> (FFmpeg encoder, pixel format, options); both lossless
    "ffv1": ("ffv1", "bgr0", {}),
    "x264rgb": ("libx264rgb", "bgr24", {"qp": "0", "preset": "ultrafast"}),  # ~3x faster than FFV1
}


class StreamRecorder:
    """Writes BGR uint8 images with their times to a lossless video file. Use as a context manager or close().

    `codec`: "ffv1" (default) or "x264rgb" (lossless H.264 in RGB: as exact, ~5 ms instead of ~15 ms per
    720p frame here; about the same size, ~0.4 MB per noisy 720p capture).
    """

    def __init__(self, path: str | Path, width: int | None = None, height: int | None = None,
                 codec: str = "ffv1") -> None:
        import av

        if codec not in _CODECS:
            raise ValueError(f"codec must be one of {', '.join(_CODECS)}, got {codec!r}")
        self.codec = codec
        self.path = Path(path)
        self._container = av.open(str(self.path), "w", format=_format_for(self.path))
        self._stream = None
        self._size = (width, height) if width and height else None
        self._last_pts: int | None = None
        self.frames = 0
        self._av = av

    def _open_stream(self, width: int, height: int) -> None:
        encoder, pix_fmt, options = _CODECS[self.codec]
        s = self._container.add_stream(encoder, rate=30)
        s.width, s.height = width, height
        s.pix_fmt = pix_fmt
        s.time_base = US
        s.codec_context.time_base = US
        if options:
            s.options = dict(options)
        self._stream = s

    def write(self, image: np.ndarray, t: float) -> None:
        """Append one capture taken at node-clock time `t` (times must increase by at least 1 us)."""
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"expected an H x W x 3 uint8 BGR image, got {image.shape} {image.dtype}")
        h, w = image.shape[:2]
        if self._stream is None:
            if self._size and self._size != (w, h):
                raise ValueError(f"recorder is {self._size[0]}x{self._size[1]}, image is {w}x{h}")
            self._open_stream(w, h)
        elif (self._stream.width, self._stream.height) != (w, h):
            raise ValueError(f"recorder is {self._stream.width}x{self._stream.height}, image is {w}x{h}")
        pts = int(round(t * 1e6))
        if self._last_pts is not None and pts <= self._last_pts:
            raise ValueError(f"capture times must increase: {t} after {self._last_pts * 1e-6}")
        frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="bgr24")
        if self._stream.pix_fmt != "bgr24":
            frame = frame.reformat(format=self._stream.pix_fmt)
        frame.pts = pts
        frame.time_base = US
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        self._last_pts = pts
        self.frames += 1

    def close(self) -> None:
        if self._container is None:
            return
        try:
            if self._stream is not None:
                for packet in self._stream.encode():
                    self._container.mux(packet)
        finally:
            self._container.close()
            self._container = None

    def __enter__(self) -> StreamRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RecordingCamera:
    """A camera that records every capture of the camera it wraps (same interface)."""

    def __init__(self, camera, path: str | Path, codec: str = "ffv1") -> None:
        self.camera = camera
        self.recorder = StreamRecorder(path, codec=codec)
        self.closed = False

    async def recv(self) -> tuple[np.ndarray, float]:
        image, t = await self.camera.recv()
        await asyncio.to_thread(self.recorder.write, image, t)
        return image, t

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.camera.close()
            finally:
                self.recorder.close()


def read_recording(path: str | Path) -> list[tuple[np.ndarray, float]]:
    """All (image, time) pairs of a recording, in order (for tests and tools; FileCamera streams)."""
    return list(iter_recording(path))


def iter_recording(path: str | Path):
    """The (image, time) pairs of a recording, one at a time (a long recording does not fit in memory)."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        tb = stream.time_base
        for frame in container.decode(stream):
            yield frame.to_ndarray(format="bgr24"), float(frame.pts * tb)


class FileCamera:
    """Replays a recording as a camera: frame i is delivered when the node clock reads its recorded time.

    `at_end`: "wait" (default: no more frames, like a camera that went dark;
    the run's own schedule ends it), "raise" (EOFError) or "loop" (start over,
    shifted by the recording's length plus one frame period).
    `shift_s` moves every timestamp (e.g. to replay a recording later in a run).
    """

    def __init__(self, path: str | Path, clock, at_end: str = "wait", shift_s: float = 0.0) -> None:
        if at_end not in ("wait", "raise", "loop"):
            raise ValueError(f"at_end must be 'wait', 'raise' or 'loop', got {at_end!r}")
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no recording at {self.path}")
        _format_for(self.path)
        self._clock = clock
        self._at_end = at_end
        self._shift = shift_s
        self._iter = None
        self._first: float | None = None
        self._last: float | None = None
        self._period = 0.0
        self.delivered = 0
        self.closed = False

    def _next(self):
        if self._iter is None:
            self._iter = iter_recording(self.path)
        try:
            return next(self._iter)
        except StopIteration:
            return None

    async def recv(self) -> tuple[np.ndarray, float]:
        if self.closed:
            raise RuntimeError("camera is closed")
        item = await asyncio.to_thread(self._next)
        if item is None:
            if self._at_end == "raise" or self.delivered == 0:
                raise EOFError(f"end of recording {self.path}")
            if self._at_end == "wait":
                await asyncio.Event().wait()  # forever, until cancelled
            self._shift += (self._last - self._first) + self._period
            self._iter = None
            item = await asyncio.to_thread(self._next)
        image, t_rec = item
        if self._first is None:
            self._first = t_rec
        if self._last is not None and self._period == 0.0:
            self._period = t_rec - self._last
        self._last = t_rec
        t = t_rec + self._shift
        await self._clock.sleep_until(t)
        self.delivered += 1
        return image, t

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._iter is not None:
                try:
                    self._iter.close()  # closes the container
                except ValueError:  # still decoding in a worker thread: it ends with the thread
                    pass


__all__ = ["StreamRecorder", "RecordingCamera", "FileCamera", "read_recording"]
