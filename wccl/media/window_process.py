"""A window in a helper process of its own, whose main thread owns it: for nodes that run off the main thread.

Cocoa (macOS) aborts a process that opens a window anywhere but on its main
thread, and the launcher runs a rank's node, windows included, on a worker
thread (the user's script keeps the main thread). So the node starts
`python -m wccl.media.window_process` (the same interpreter) and the helper's
main thread runs an ordinary `WindowScreen` (wccl.media.window) on an asyncio
loop of its own.

`ProcessWindowScreen` (the node's side) has WindowScreen's constructor and
interface (`show`, `set_overlay`, `close`, `stats`, `shown`, `quit_requested`,
`info`, ...). What passes between the two:
- frames through one block of shared memory (multiprocessing.shared_memory)
  holding two frames of the screen's size, used in turn;
- control as JSON lines: the node writes to the helper's stdin (`show` with
  the frame's number and slot, `overlay` with the lines, `close`); the helper
  answers on its stdout (`ready` once the window is open, or `error`;
  `shown` with the time.monotonic() the frame was presented, which the node
  turns into its clock as capture times are: clock.now() minus the age times
  the clock's rate; `quit` on Esc or when the window is closed, which calls
  `on_quit` on the node's event loop; and `log`: the helper's log events,
  logged again by the node's logger, so window_opened, cursor_hidden,
  window_closed and the rest appear in the node's log).
The helper's own stdout is moved to its stderr before anything can print, so
only these lines travel on the pipe. It ends when told to close or when its
stdin closes: when the node's process ends, however it ends, so does the
helper. A helper that dies first (a crash) is logged (`window_process_died`)
and counts as the window being closed: `on_quit` is called.

`show()` waits for the helper's answer (at most SHOW_TIMEOUT_S; then it
returns None and logs `window_process_slow`), like WindowScreen's `show()`
waits for the GUI's event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import structlog

from wccl.media.display import DeviceError, DisplayInfo, NoDisplay, probe_display
from wccl.cli import command_parser

SHOW_TIMEOUT_S = 2.0  # longest a show() waits for the helper's answer
START_TIMEOUT_S = 120.0  # longest the constructor waits for the helper's window (the paint check can take a while)
CLOSE_TIMEOUT_S = 10.0


class ProcessWindowScreen:
    """A WindowScreen run by a helper process; same constructor and interface. Any thread may create it."""

    def __init__(self, clock, title: str, width: int, height: int, *, fullscreen: bool = True, x: int = 0,
                 y: int = 0, on_quit: Callable[[], None] | None = None, display: str | None = None,
                 node: str | None = None) -> None:
        self.info: DisplayInfo = probe_display(display)  # NoDisplay here, before a process is started
        self._clock = clock
        self.title = title
        self.width, self.height = width, height
        self.fullscreen = fullscreen
        self.on_quit = on_quit
        self.quit_requested = False
        self.closed = False
        self.shown = 0
        self.refresh_hz: float | None = None
        self.log = structlog.get_logger("wccl").bind(**({"node": node} if node else {}), actor="screen")
        self._loop = asyncio.get_running_loop()
        self._n = 0
        self._replies: queue.Queue[dict] = queue.Queue()
        self._closing = False
        self._dead = False
        self._stats: dict = {}
        self._shm = shared_memory.SharedMemory(create=True, size=2 * height * width * 3)
        self._frames: np.ndarray | None = np.ndarray((2, height, width, 3), np.uint8, buffer=self._shm.buf)
        env = dict(os.environ)
        if display:
            env["DISPLAY"] = display
        root = str(Path(__file__).resolve().parents[2])  # the helper imports this same wccl
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        cmd = [sys.executable, "-m", "wccl.media.window_process", "--shm", self._shm.name, "--title", title,
               "--width", str(width), "--height", str(height), "--x", str(x), "--y", str(y),
               "--fullscreen", "1" if fullscreen else "0"]
        if display:
            cmd += ["--display", display]
        if node:
            cmd += ["--node", node]
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        except OSError:
            self._release_shm()
            raise
        self._reader = threading.Thread(target=self._read, name=f"window-process-{title}", daemon=True)
        self._reader.start()
        try:
            reply = self._wait({"ready", "error", "eof"}, START_TIMEOUT_S)
        except BaseException:
            self._stop_helper()
            raise
        if reply is None or reply["op"] != "ready":
            self._stop_helper()
            if reply is None:
                raise RuntimeError(f"window helper for {title!r}: no window after {START_TIMEOUT_S:.0f} s")
            if reply["op"] == "eof":
                raise RuntimeError(f"window helper for {title!r} exited with status {self._proc.returncode} "
                                   "before its window opened (its stderr above says why)")
            kind = {"NoDisplay": NoDisplay, "DeviceError": DeviceError}.get(reply.get("kind"), RuntimeError)
            raise kind(reply.get("message", "the window helper failed"))
        self.refresh_hz = reply.get("refresh_hz")
        self.log.info("window_process_started", pid=self._proc.pid, title=title)

    # -- the helper's answers (reader thread) ----------------------------------------------------
    def _read(self) -> None:
        out = self._proc.stdout
        for raw in out:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            op = msg.pop("op", None)
            if op == "log":
                level = msg.pop("level", "info")
                event = msg.pop("event", "window_process_log")
                for k in ("node", "actor"):
                    msg.pop(k, None)
                getattr(self.log, level, self.log.info)(event, **msg)
            elif op == "quit":
                self._call_on_loop(self._quit)
            else:
                self._replies.put({"op": op, **msg})
        self._proc.wait()
        self._dead = True
        self._replies.put({"op": "eof"})
        if not self._closing:
            self._call_on_loop(self._died)

    def _call_on_loop(self, fn: Callable[[], None]) -> None:
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def _wait(self, ops: set[str], timeout_s: float, n: int | None = None) -> dict | None:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                msg = self._replies.get(timeout=left)
            except queue.Empty:
                return None
            if msg["op"] == "eof":
                self._replies.put(msg)  # every later wait sees it too
                return msg if "eof" in ops else None
            if msg["op"] in ops and (n is None or msg.get("n") == n):
                return msg

    def _send(self, msg: dict) -> bool:
        if self._dead or self._proc.stdin is None:
            return False
        try:
            self._proc.stdin.write((json.dumps(msg) + "\n").encode())
            self._proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def _quit(self) -> None:
        if self.quit_requested:
            return
        self.quit_requested = True
        if self.on_quit is not None:
            self.on_quit()

    def _died(self) -> None:
        if self.closed:
            return
        self.log.error("window_process_died", returncode=self._proc.returncode, title=self.title,
                       hint="the window's helper process ended on its own; its stderr says why")
        self._quit()

    # -- the screen interface --------------------------------------------------------------------
    def set_overlay(self, lines: list[str] | None) -> None:
        """Show these instruction lines around the code (None: no overlay) from the next frame on."""
        if not self.closed:
            self._send({"op": "overlay", "lines": list(lines) if lines else None})

    def show(self, image: np.ndarray) -> float | None:
        if self.closed or self._dead or self._frames is None:
            return None
        if image.shape[:2] != (self.height, self.width):
            raise ValueError(f"window is {self.width}x{self.height}, image is {image.shape[1]}x{image.shape[0]}")
        self._n += 1
        slot = self._n % 2
        self._frames[slot] = image
        if not self._send({"op": "show", "n": self._n, "slot": slot}):
            return None
        reply = self._wait({"shown"}, SHOW_TIMEOUT_S, n=self._n)
        if reply is None or reply.get("t") is None:
            if not self._dead:
                self.log.warning("window_process_slow", frame=self._n, waited_s=SHOW_TIMEOUT_S)
            return None
        self.shown += 1
        rate = getattr(self._clock, "rate", 1.0)
        return self._clock.now() - (time.monotonic() - float(reply["t"])) * rate

    def stats(self) -> dict:
        """The helper's window statistics (WindowScreen.stats), as it reported them on closing ({} before)."""
        return dict(self._stats)

    def close(self) -> None:
        """Close the window and end the helper (idempotent; any thread)."""
        if self.closed:
            return
        self.closed = True
        self._closing = True
        if self._send({"op": "close"}):
            reply = self._wait({"closed"}, CLOSE_TIMEOUT_S)
            if reply is not None:
                self._stats = reply.get("stats", {})
        self._stop_helper()

    def _stop_helper(self) -> None:
        self._closing = True
        try:
            if self._proc.stdin is not None:
                self._proc.stdin.close()  # the helper ends at the end of its input
        except OSError:
            pass
        try:
            self._proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.log.warning("window_process_killed", pid=self._proc.pid)
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=5)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._release_shm()

    def _release_shm(self) -> None:
        self._frames = None
        try:
            self._shm.close()
            self._shm.unlink()
        except (FileNotFoundError, BufferError):
            pass


# ------------------------------------------------------------------------------------ the helper
class _MonotonicClock:
    """The helper's clock: time.monotonic(), which the node's process shares (presentation times are in it)."""

    rate = 1.0

    def now(self) -> float:
        return time.monotonic()


def _attach(name: str) -> shared_memory.SharedMemory:
    """The node's shared memory, without this process's resource tracker claiming it (the node unlinks it)."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name, track=False)
    from multiprocessing import resource_tracker

    register = resource_tracker.register
    resource_tracker.register = lambda *a, **k: None
    try:
        return shared_memory.SharedMemory(name)
    finally:
        resource_tracker.register = register


def _serve(args, send: Callable[[dict], None]) -> int:
    from wccl.media.window import WindowScreen

    shm = _attach(args.shm)
    frames = np.ndarray((2, args.height, args.width, 3), np.uint8, buffer=shm.buf)

    async def run(frames: np.ndarray) -> int:
        loop = asyncio.get_running_loop()
        commands: asyncio.Queue[bytes | None] = asyncio.Queue()

        def read_stdin() -> None:
            # Unbuffered reads of fd 0: a thread blocked in a buffered read would stop the interpreter's
            # shutdown (it holds the buffer's lock).
            pending = b""
            while True:
                try:
                    chunk = os.read(0, 1 << 16)
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    loop.call_soon_threadsafe(commands.put_nowait, line)
            loop.call_soon_threadsafe(commands.put_nowait, None)  # the node closed the pipe (or ended)

        threading.Thread(target=read_stdin, name="window-commands", daemon=True).start()
        try:
            screen = WindowScreen(_MonotonicClock(), args.title, args.width, args.height,
                                  fullscreen=bool(args.fullscreen), x=args.x, y=args.y,
                                  on_quit=lambda: send({"op": "quit"}), display=args.display, node=args.node)
        except DeviceError as e:
            send({"op": "error", "kind": type(e).__name__, "message": str(e)})
            return e.exit_status
        send({"op": "ready", "display": screen.info.name, "refresh_hz": screen.refresh_hz})
        try:
            while True:
                line = await commands.get()
                if line is None:
                    break
                msg = json.loads(line)
                if msg["op"] == "show":
                    t = screen.show(frames[msg["slot"]].copy())
                    send({"op": "shown", "n": msg["n"], "t": t})
                elif msg["op"] == "overlay":
                    screen.set_overlay(msg["lines"])
                elif msg["op"] == "close":
                    break
        finally:
            screen.close()
        send({"op": "closed", "stats": screen.stats()})
        return 0

    try:
        return asyncio.run(run(frames))
    finally:
        del frames
        shm.close()


def main(argv: list[str] | None = None) -> int:
    p = command_parser("wccl.media.window_process",
                       "A node's window, in a process whose main thread owns it "
                                            "(started by ProcessWindowScreen; not for use by hand).")
    p.add_argument("--shm", required=True)
    p.add_argument("--title", required=True)
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--height", type=int, required=True)
    p.add_argument("--x", type=int, default=0)
    p.add_argument("--y", type=int, default=0)
    p.add_argument("--fullscreen", type=int, choices=(0, 1), default=1)
    p.add_argument("--display", default=None)
    p.add_argument("--node", default=None)
    args = p.parse_args(argv)

    # The control pipe is this process's stdout: keep it for the protocol, and send anything else that would
    # print there (a library's chatter) to stderr.
    pipe = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    lock = threading.Lock()

    def send(msg: dict) -> None:
        line = json.dumps(msg, default=str)
        with lock:
            try:
                pipe.write(line + "\n")
                pipe.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass  # the node is gone: stdin's end stops this process

    def forward(_logger, method: str, event_dict: dict) -> dict:
        send({"op": "log", "level": method if method != "exception" else "error", **event_dict})
        raise structlog.DropEvent

    structlog.configure(processors=[forward], cache_logger_on_first_use=False)
    return _serve(args, send)


if __name__ == "__main__":
    sys.exit(main())
