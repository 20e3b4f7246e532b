"""A camera that films a region of an X display with FFmpeg's x11grab (PyAV), in a helper process.

Consumes: the pixels of a rectangle of an X display (`display`, `rect`), at
`fps`. Emits: through `async recv()` (ThreadedCamera), each capture as a BGR
image and the node-clock time it was grabbed; `blackout` rectangles (the
node's own window, if it lies in the region) are painted black, as a webcam
never sees its own laptop's screen.

Why a helper process (`python -m wccl.media.x11grab`): opencv-python and
PyAV each bundle their own libxcb, and the two copies of libxcb-shm carry the
same versioned name. Once OpenCV's Qt window is up, x11grab in the same
process binds to OpenCV's copy and crashes (SIGSEGV in xcb_shm_query_version),
and grabbing first makes Qt hang instead. The helper imports PyAV and numpy
only; it writes each capture to its stdout as a 28-byte header (magic,
sequence number, capture time on `time.monotonic()`, width, height) and the
raw BGR pixels. A thread of the node reads the pipe. The helper ends when
the pipe closes.

Capture times: x11grab stamps each grab with the wall clock (`av_gettime`);
the helper moves that onto `time.monotonic()`, which every process on the
machine shares, so the node turns it into its own clock exactly.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import time

import numpy as np

from wccl.media.capture import ThreadedCamera
from wccl.media.display import DeviceError, NoDisplay
from wccl.cli import command_parser

HEADER = struct.Struct("<4sIdII")
MAGIC = b"WGRB"
START_TIMEOUT_S = 10.0


class X11GrabCamera(ThreadedCamera):
    name = "x11grab"

    def __init__(self, clock, display: str, rect: tuple[int, int, int, int], fps: float,
                 blackout: list[tuple[int, int, int, int]] | None = None, buffer: int = 4,
                 node: str | None = None) -> None:
        super().__init__(clock, buffer=buffer, node=node)
        x, y, w, h = rect
        if w < 16 or h < 16:
            raise ValueError(f"capture region {w}x{h} is too small")
        self.display, self.rect, self.fps = display, rect, fps
        # Regions to paint black, relative to the capture region.
        self._blackout = []
        for bx, by, bw, bh in blackout or []:
            x0, y0 = max(bx - x, 0), max(by - y, 0)
            x1, y1 = min(bx + bw - x, w), min(by + bh - y, h)
            if x1 > x0 and y1 > y0:
                self._blackout.append((x0, y0, x1, y1))
        cmd = [sys.executable, "-m", "wccl.media.x11grab", "--display", display, "--x", str(x), "--y", str(y),
               "--width", str(w), "--height", str(h), "--fps", str(fps)]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, bufsize=0)
        self._stderr: list[bytes] = []
        threading.Thread(target=self._drain_stderr, name="x11grab-stderr", daemon=True).start()
        first = self._read_first()
        self._ring.append(first)
        self.captured = 1
        self._t_first = self._t_last = first[1]
        self.log.info("x11grab_started", display=display, x=x, y=y, width=w, height=h, fps=fps, pid=self._proc.pid)
        self._start()

    def _drain_stderr(self) -> None:
        for line in iter(self._proc.stderr.readline, b""):
            self._stderr.append(line)
            del self._stderr[:-20]

    def _helper_error(self) -> str:
        text = b"".join(self._stderr).decode(errors="replace").strip().splitlines()
        return text[-1] if text else f"helper exited with status {self._proc.poll()}"

    def _read_first(self) -> tuple[np.ndarray, float]:
        result: list = []
        t = threading.Thread(target=lambda: result.append(self._read_or_error()), daemon=True)
        t.start()
        t.join(START_TIMEOUT_S)
        if not result:
            self._proc.kill()
            raise DeviceError(f"x11grab on {self.display}: no image within {START_TIMEOUT_S:.0f} s")
        item = result[0]
        if isinstance(item, BaseException) or item is None:
            self._proc.wait(timeout=5)
            time.sleep(0.05)  # let the stderr thread catch the last line
            msg = self._helper_error()
            cls = NoDisplay if "display" in msg.lower() or "cannot open" in msg.lower() else DeviceError
            raise cls(f"x11grab on {self.display} at {self.rect}: {msg}")
        return item

    def _read_or_error(self):
        try:
            return self._read()
        except BaseException as e:  # noqa: BLE001 (reported by the caller)
            return e

    def _read_exact(self, n: int) -> memoryview | None:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self._proc.stdout.readinto(view[got:])
            if not k:
                return None
            got += k
        return view

    def _read(self) -> tuple[np.ndarray, float] | None:
        head = self._read_exact(HEADER.size)
        if head is None:
            return None
        magic, _seq, t_mono, w, h = HEADER.unpack(head)
        if magic != MAGIC:
            raise RuntimeError("x11grab helper: bad frame header")
        data = self._read_exact(w * h * 3)
        if data is None:
            return None
        image = np.frombuffer(data, np.uint8).reshape(h, w, 3)
        for x0, y0, x1, y1 in self._blackout:
            image[y0:y1, x0:x1] = 0
        return image, t_mono

    def _stop_source(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def _release(self) -> None:
        if self._proc.stdout is not None:
            self._proc.stdout.close()


# ---------------------------------------------------------------------------------------- the helper
def _grab(display: str, x: int, y: int, width: int, height: int, fps: float, count: int | None) -> int:
    import av

    try:
        container = av.open(f"{display}+{x},{y}", format="x11grab",
                            options={"video_size": f"{width}x{height}", "framerate": f"{fps:g}",
                                     "draw_mouse": "0"})
    except Exception as e:  # noqa: BLE001 (the parent reads the last line of stderr)
        print(f"cannot open display {display} region {width}x{height}+{x}+{y}: {e}", file=sys.stderr)
        return 2
    out = sys.stdout.buffer
    seq = 0
    try:
        for frame in container.decode(video=0):
            now_mono, now_wall = time.monotonic(), time.time()
            t_mono = now_mono
            if frame.time is not None and 0.0 <= now_wall - frame.time < 1.0:
                t_mono = now_mono - (now_wall - frame.time)  # x11grab stamps the grab on the wall clock
            image = frame.to_ndarray(format="bgr24")
            h, w = image.shape[:2]
            out.write(HEADER.pack(MAGIC, seq & 0xFFFFFFFF, t_mono, w, h))
            out.write(np.ascontiguousarray(image).data)
            out.flush()
            seq += 1
            if count is not None and seq >= count:
                break
    except (BrokenPipeError, ValueError):  # the node closed the pipe: done
        pass
    finally:
        container.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = command_parser("wccl.media.x11grab",
                       "Grab a region of an X display; raw BGR frames with headers on stdout.")
    p.add_argument("--display", default=os.environ.get("DISPLAY", ":0"))
    p.add_argument("--x", type=int, default=0)
    p.add_argument("--y", type=int, default=0)
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--height", type=int, required=True)
    p.add_argument("--fps", type=float, default=30.0)
    p.add_argument("--count", type=int, help="stop after this many frames")
    a = p.parse_args(argv)
    try:
        return _grab(a.display, a.x, a.y, a.width, a.height, a.fps, a.count)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
