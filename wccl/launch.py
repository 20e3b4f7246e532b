"""`python -m wccl.launch --config ROOM.toml script.py [args]`: one process per laptop, as torchrun does.

Starts one OS process per training node of the room file (rank order is the
room file's node order; observers are not ranks), each running `script.py`
with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, WCCL_CONFIG and
WCCL_NODE set, so that `dist.init_process_group("wccl")` needs no argument.
On Linux the ranks are forked from one helper process that has already
imported torch (wccl.runtime.forkserver): a room of N ranks imports it once,
not N times; elsewhere each rank is a new Python process.
In the simulated room, the room itself runs as one more process
(`python -m wccl.room.serve`), reached by the ranks through a Unix socket
(WCCL_ROOM) and sharing nothing else with them. On real laptops,
`--node NAME` runs this laptop's rank only. No network is used.

What it says (on stderr, each line starting `wccl.launch:`): the room
starting; each rank started (its pid), in init_process_group (its node in
the room, greeting its peers and measuring which camera reads which
screen), and synced (the layout it picked, the share of each peer's frames
its camera reads, the room time that took). Each rank reports these on a
pipe of its own (WCCL_STATUS_FD; wccl.distributed.status), and its
collectives' totals. On a terminal one live line under the output shows
the collectives so far (their count, or its range over the ranks; tensor
bytes and simulated seconds, the most of any rank), redrawn in place;
elsewhere the same line is written every PROGRESS_EVERY_S seconds.

The ranks' stdout and stderr pass through the launcher to its own, line by
line as they come (a line left unfinished for PARTIAL_S as it is; with
stdout on a terminal, PYTHONUNBUFFERED: the ranks' prints show at once).
Their logs show warnings and errors only, unless the room file's [logging]
level says otherwise or `--log-level` asks (WCCL_LOG_LEVEL); on a terminal
they are in the console format (WCCL_LOG_FORMAT). Of the room process's
output, JSON log lines below that level are not shown (nor, once the
launcher stops the processes, any of it); its room is `--supervised`, so a
rank gone without goodbye is no warning of its own. `--room-log FILE`
writes all of the room's output to FILE instead.

When a rank exits with a non-zero status, the launcher names it, with its
status and the last TAIL_LINES lines of its stderr, and stops the other
ranks and the intruders at once, and the room once they have ended
(SIGTERM, then SIGKILL after STOP_GRACE_S: no process sees its room vanish
while it runs); `--grace-s N` first gives them N seconds to end on their
own (their collectives then fail with their own errors once their timeout
passes). A room process that fails while ranks run is named the same way.
When every rank exits 0, the intruders are stopped, then the room. Once every
process it started has stopped and their output has been shown, it prints a
summary: each rank's exit status and its collectives' count, bytes and
simulated seconds.

Exit status: 0 when every rank exits 0; otherwise the first failing rank's
status (the room's if it failed first; 128+N for a process killed by
signal N); 2 for bad arguments or config (one line, no traceback); 130 on
Ctrl-C or SIGTERM, after every process it started has stopped.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from wccl.cli import command_parser
from wccl.config import ConfigError, load_config
from wccl.keys import PAIR_TABLE_ENV, RUN_KEY_ENV, new_ephemeral, pairs, room_key
from wccl.runtime import forkserver
from wccl.runtime.forkserver import ForkedProcess, ForkServerError, RankForker

EXIT_OK, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 2, 130
ROOM_START_S = 60.0  # how long the room process may take to open its socket
STOP_GRACE_S = 5.0  # after SIGTERM, how long a process may take before it is killed
DRAIN_S = 3.0  # after the processes stopped, how long their last output may take to arrive
TAIL_LINES = 10  # a failed process's last lines of stderr, shown with its status
PROGRESS_EVERY_S = 60.0  # not on a terminal: a line of the collectives' totals this often (wall seconds)
REDRAW_S = 0.25  # on a terminal: the live line's redraws
PARTIAL_S = 0.2  # a process's unfinished line of output is shown after this long (wall seconds)
LAYOUT_WAIT_S = 1.0  # a rank's "synced" line waits this long for its layout (logged as init returns)
LOG_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
DEFAULT_LOG_LEVEL = "warning"  # when neither --log-level nor the room file's [logging] level says


class LaunchError(Exception):
    pass


def json_objects(text: str) -> list[dict]:
    """Every JSON object in the ranks' shared output, wherever the newlines fall: two processes write
    to one stream, and unbuffered (PYTHONUNBUFFERED) a print's newline is a write of its own, so one
    rank's object can be followed by another's on the same line."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while (i := text.find("{", i)) != -1:
        try:
            item, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        if isinstance(item, dict):
            out.append(item)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = command_parser("wccl.launch",
                       "Run a PyTorch script on every laptop of a WCCL room (the 'wccl' backend).")
    p.add_argument("--config", required=True, help="the room file (its training nodes are the ranks, in order)")
    p.add_argument("--node", help="run only this laptop's rank (real laptops: one launcher per laptop)")
    p.add_argument("--clock", choices=["virtual", "realtime"], help="override [room] clock (simulated room)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                   help="the ranks' log level, and the least level of the room's log lines shown (default: the "
                        f"room file's [logging] level if it sets one, else {DEFAULT_LOG_LEVEL})")
    p.add_argument("--grace-s", type=float, default=0.0,
                   help="once a rank fails, give the others this long (wall seconds) to end on their own "
                        "before they are stopped (default: 0, they are stopped at once)")
    p.add_argument("--room-log", help="write the room process's whole output to this file "
                                      "(default: its lines at the log level, on this terminal)")
    p.add_argument("--aim-seconds", type=float, default=120.0,
                   help="on real devices (medium \"hardware\"), aim first (wccl aim) for at most this long; 0: "
                        "start at once")
    p.add_argument("script", help="the training script (python file)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return p


# ---- the terminal ---------------------------------------------------------------------------------

class _Terminal:
    """The launcher's stdout and stderr: its own lines, the processes' output as it comes, and on a
    terminal one live line under them (redrawn in place; drawn only when no output line is half
    written). One lock: each of the launcher's lines, and each chunk of output, is written whole."""

    def __init__(self) -> None:
        self.streams = {"out": sys.stdout, "err": sys.stderr}
        self.live = sys.stderr.isatty()
        self._on_screen = {k: s.isatty() for k, s in self.streams.items()}
        self._at_line_start = {"out": True, "err": True}
        self._lock = threading.Lock()
        self._line: Callable[[], str] | None = None
        self._shown = False
        self.muted = False  # once set, the processes' output is no longer shown (the summary is final)

    def say(self, text: str) -> None:
        self.write("err", "".join(f"wccl.launch: {line}\n" for line in text.splitlines()).encode(), own=True)

    def write(self, stream: str, data: bytes, own: bool = False) -> None:
        if not data:
            return
        with self._lock:
            if self.muted and not own:
                return
            self._hide()
            target = self.streams[stream]
            try:
                target.flush()
                target.buffer.write(data)
                target.buffer.flush()
            except (OSError, ValueError):
                pass  # a closed or broken stream (e.g. `| head`): nothing more to show there
            self._at_line_start[stream] = data.endswith(b"\n")
            self._show()

    def progress(self, text: Callable[[], str]) -> None:
        """Show `text()` as the live line (on a terminal only), and again under every line written."""
        if not self.live:
            return
        with self._lock:
            self._hide()
            self._line = text
            self._show()

    def end_progress(self) -> None:
        with self._lock:
            self._hide()
            self._line = None

    def _hide(self) -> None:
        if self._shown:
            self._raw(b"\r\x1b[K")
            self._shown = False

    def _show(self) -> None:
        if (self.live and self._line
                and all(self._at_line_start[k] for k, tty in self._on_screen.items() if tty)):
            try:
                columns = os.get_terminal_size(sys.stderr.fileno()).columns or 100  # 0: not known
            except OSError:
                columns = 100
            width = max(20, columns - 1)  # never wraps: \r clears it all
            self._raw(self._line()[:width].encode())
            self._shown = True

    def _raw(self, data: bytes) -> None:
        try:
            sys.stderr.buffer.write(data)
            sys.stderr.buffer.flush()
        except (OSError, ValueError):
            pass


# ---- reading the processes' pipes -----------------------------------------------------------------

class _Pump:
    """Reads every pipe of the processes it started, on one thread: each chunk goes to the pipe's
    `feed`, and b"" once the pipe is closed at its other end (every writer exited); a feed with a
    `tick()` is also called every tenth of a second or so."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._new: list[tuple[int, Callable[[bytes], None]]] = []
        self._cond = threading.Condition()
        self._open = 0
        self._thread = threading.Thread(target=self._run, name="wccl-launch-pipes", daemon=True)
        self._thread.start()

    def add(self, fd: int, feed: Callable[[bytes], None]) -> None:
        os.set_blocking(fd, False)
        with self._cond:
            self._new.append((fd, feed))
            self._open += 1

    def drain(self, timeout_s: float) -> bool:
        """Wait until every pipe has been read to its end; False if some are still open after `timeout_s`."""
        with self._cond:
            return self._cond.wait_for(lambda: self._open == 0, timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                new, self._new = self._new, []
            for fd, feed in new:
                self._sel.register(fd, selectors.EVENT_READ, feed)
            if not self._sel.get_map():
                time.sleep(0.05)
                continue
            for key in list(self._sel.get_map().values()):
                tick = getattr(key.data, "tick", None)
                if tick is not None:
                    tick()
            for key, _ in self._sel.select(0.1):
                try:
                    data = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self._sel.unregister(key.fd)
                    os.close(key.fd)
                try:
                    key.data(data)
                except Exception:  # noqa: BLE001 - one reader's bug must not stop the others being read
                    traceback.print_exc()
                if not data:
                    with self._cond:
                        self._open -= 1
                        self._cond.notify_all()


class _Relay:
    """A process's stdout or stderr passed on to the launcher's, whole lines at a time (the launcher's
    own lines and the other processes' never land inside one); a line still unfinished after
    PARTIAL_S is passed on as it is (a prompt, a progress bar), and the rest at the end. `tail`, if
    given, keeps the last lines."""

    def __init__(self, term: _Terminal, stream: str, tail: collections.deque[str] | None = None,
                 closed: threading.Event | None = None) -> None:
        self.term, self.stream, self.tail, self.closed = term, stream, tail, closed
        self._lines = _Lines(tail.append) if tail is not None else None
        self._partial = b""
        self._since = 0.0

    def __call__(self, data: bytes) -> None:
        if self._lines is not None:
            self._lines(data)
        if not data:
            self.term.write(self.stream, self._partial)
            self._partial = b""
            if self.closed is not None:
                self.closed.set()
            return
        if not self._partial:
            self._since = time.monotonic()
        data = self._partial + data
        end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        self.term.write(self.stream, data[:end])
        self._partial = data[end:]

    def tick(self) -> None:
        if self._partial and time.monotonic() - self._since > PARTIAL_S:
            self.term.write(self.stream, self._partial)
            self._partial = b""


class _Lines:
    """A pipe's chunks as lines of text for `on_line` (the last one even without its newline)."""

    def __init__(self, on_line: Callable[[str], None]) -> None:
        self.on_line = on_line
        self._buf = b""

    def __call__(self, data: bytes) -> None:
        if not data:
            if self._buf:
                self.on_line(self._buf.decode("utf-8", "replace"))
                self._buf = b""
            return
        *lines, self._buf = (self._buf + data).split(b"\n")
        for line in lines:
            self.on_line(line.decode("utf-8", "replace"))


def _level_of(line: str) -> int | None:
    """A JSON log line's level (None for any other line)."""
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return LOG_LEVELS.get(str(event.get("level"))) if isinstance(event, dict) else None


# ---- the processes --------------------------------------------------------------------------------

def _wall(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _exit_status(rc: int) -> int:
    return rc if rc >= 0 else 128 - rc


def _describe_exit(rc: int) -> str:
    if rc >= 0:
        return f"exited with status {rc}"
    try:
        return f"was killed by {signal.Signals(-rc).name}"
    except ValueError:
        return f"was killed by signal {-rc}"


class _Rank:
    """One rank's process, its stderr's last lines, and what it reported on its status pipe."""

    def __init__(self, rank: int, node: str, world: int) -> None:
        self.rank, self.node, self.world = rank, node, world
        self.name = f"rank {rank} ({node})"
        self.proc: subprocess.Popen | ForkedProcess | None = None
        self.exit: int | None = None
        self.stopped = False  # stopped by the launcher
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.stderr_closed = threading.Event()
        self.phase = "starting"  # starting | greeting (in init_process_group) | ready
        self.layout: dict | None = None
        self.count = self.messages = self.failed = self.nbytes = 0
        self.t: float | None = None  # its simulated seconds at its last report
        self.synced: tuple[float, str] | None = None  # ready, not yet said: (when, what), waiting for its layout

    def totals(self) -> str:
        if self.phase != "ready":
            return ("before init_process_group" if self.phase == "starting"
                    else "in init_process_group (greeting its peers)")
        done = _count(self.count, "collective")
        if self.messages:  # point-to-point: a pipeline's ranks may send and receive and call no collective
            done += f", {_count(self.messages, 'message')} sent or received"
        failed = f" ({self.failed} failed)" if self.failed else ""
        return f"{done}{failed}, {_size(self.nbytes)}, {self.t or 0.0:.2f} s simulated"


def _describe_layout(layout: dict) -> str:
    s = (f"layout {layout.get('rows')}x{layout.get('cols')} cells of {layout.get('cell_px')} px, "
         f"{layout.get('colours')} colours")
    if layout.get("hold_s") is not None:
        s += f", frames held {layout['hold_s'] * 1000:.0f} ms"
    reads = layout.get("reads")
    if reads:
        s += "; its camera reads " + ", ".join(f"{peer} {q:.0%}" for peer, q in reads.items()) + " of their frames"
    return s


class _Launch:
    """One run of the launcher: the processes it started, their pipes, and what it says about them."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.monotonic()
        self.term = _Terminal()
        self.pump = _Pump()
        self.ranks: list[_Rank] = []
        self.room: subprocess.Popen | None = None
        self.intruders: list[subprocess.Popen] = []
        self.forker: RankForker | None = None  # on Linux: the process the ranks are forked from
        self.room_tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.room_closed = threading.Event()  # its output has been read to the end
        self.tearing_down = False  # once set, the room's and intruders' output is no longer shown
        self.side_level = LOG_LEVELS[DEFAULT_LOG_LEVEL]
        self._synced_lock = threading.Lock()

    def elapsed(self) -> str:
        return _wall(time.monotonic() - self.t0)

    # -- starting
    def pipe_to(self, feed: Callable[[bytes], None]) -> int:
        """A new pipe whose read end the pump reads into `feed`; its write end, for a child (the caller
        closes it once the child has it)."""
        r, w = os.pipe()
        self.pump.add(r, feed)
        return w

    def side_output(self, tail: collections.deque[str] | None = None,
                    closed: threading.Event | None = None) -> Callable[[bytes], None]:
        """The room's (or an intruder's) output: lines at the log level shown, the last kept in `tail`."""

        def line(text: str) -> None:
            if tail is not None:
                tail.append(text)
            level = _level_of(text)
            if not self.tearing_down and (level is None or level >= self.side_level):
                self.term.write("err", (text + "\n").encode())

        lines = _Lines(line)

        def feed(data: bytes) -> None:
            lines(data)
            if not data and closed is not None:
                closed.set()

        return feed

    def start_room(self, config: Path, nodes: list[str], clock: str | None, env: dict, log) -> str:
        sock = os.path.join(tempfile.mkdtemp(prefix="wccl-room-"), "room.sock")
        cmd = [sys.executable, "-m", "wccl.room.serve", "--config", str(config), "--socket", sock,
               "--nodes", ",".join(nodes), "--authkey-env", "WCCL_ROOM_AUTHKEY", "--supervised"]
        if clock:
            cmd += ["--clock", clock]
        if log is not None:
            self.room_closed.set()  # its output goes to the file, not here
        w = log.fileno() if log is not None else self.pipe_to(self.side_output(self.room_tail, self.room_closed))
        try:
            self.room = subprocess.Popen(cmd, env=env, stdout=w, stderr=w)
        finally:
            if log is None:
                os.close(w)
        deadline = time.monotonic() + ROOM_START_S
        while not os.path.exists(sock):
            if self.room.poll() is not None:
                self.room_closed.wait(1.0)
                raise LaunchError(f"the room process exited with status {self.room.returncode} before it was "
                                  "ready" + "".join(f"\n  room| {line}" for line in self.room_tail))
            if time.monotonic() > deadline:
                raise LaunchError(f"the room process did not open {sock} within {ROOM_START_S:g} s")
            time.sleep(0.05)
        return sock

    def start_intruder(self, node: str, env: dict, log) -> None:
        w = log.fileno() if log is not None else self.pipe_to(self.side_output())
        try:
            self.intruders.append(subprocess.Popen([sys.executable, "-m", "wccl.intruder"],
                                                   env=dict(env, WCCL_NODE=node), stdout=w, stderr=w))
        finally:
            if log is None:
                os.close(w)

    def start_forker(self, env: dict) -> None:
        """The process the ranks are forked from, torch already imported (wccl.runtime.forkserver); its
        own output (nothing, unless it fails) shown as the room's is."""
        w = self.pipe_to(self.side_output())
        try:
            self.forker = RankForker(env, stderr=w)
        finally:
            os.close(w)

    def start_rank(self, r: _Rank, argv: list[str], env: dict) -> None:
        """Rank `r` running `argv` ([script, *args]): forked (Linux) or started afresh."""
        out_w = self.pipe_to(_Relay(self.term, "out"))
        err_w = self.pipe_to(_Relay(self.term, "err", r.tail, r.stderr_closed))
        status_w = self.pipe_to(_Lines(lambda line: self.on_status(r, line)))
        try:
            if self.forker is not None:
                try:
                    r.proc = self.forker.spawn(argv, env, os.getcwd(), out_w, err_w, {"WCCL_STATUS_FD": status_w})
                except ForkServerError as e:
                    raise LaunchError(f"{r.name} could not be started: {e}") from None
            else:
                r.proc = subprocess.Popen([sys.executable, *argv], env=dict(env, WCCL_STATUS_FD=str(status_w)),
                                          stdout=out_w, stderr=err_w, pass_fds=(status_w,))
        finally:
            for fd in (out_w, err_w, status_w):
                os.close(fd)
        self.term.say(f"{r.name} started (pid {r.proc.pid})")

    def on_status(self, r: _Rank, line: str) -> None:
        """A line of the rank's status pipe (wccl.distributed.status)."""
        try:
            msg = json.loads(line)
            kind = msg["kind"]
        except (ValueError, KeyError, TypeError):
            return
        if kind == "joined":
            r.phase = "greeting"
            what = ("greeting its peers, measuring which camera reads which screen" if r.world > 1
                    else "the only rank")
            self.term.say(f"{r.name} in init_process_group at {self.elapsed()}: {what}")
        elif kind == "layout":
            r.layout = msg
            if r.synced is not None:
                self.say_synced(r)
            elif r.phase == "ready":
                self.term.say(f"{r.name} {_describe_layout(msg)}")
        elif kind == "ready":
            r.phase = "ready"
            r.t = msg.get("t")
            r.synced = (time.monotonic(), f"{r.name} synced at {self.elapsed()} ({r.t or 0.0:.2f} s simulated)")
            if r.layout is not None or r.world == 1:
                self.say_synced(r)
        elif kind == "collectives":
            r.count, r.messages = msg.get("count", 0), msg.get("messages", 0)
            r.failed, r.nbytes = msg.get("failed", 0), msg.get("bytes", 0)
            r.t = msg.get("t", r.t)

    def say_synced(self, r: _Rank) -> None:
        """Say that the rank is synced, with its layout when it came (its node logs it as init returns)."""
        with self._synced_lock:  # (the pipes' thread and the main one both call this)
            synced, r.synced = r.synced, None
        if synced is not None:
            self.term.say(synced[1] + (f": {_describe_layout(r.layout)}" if r.layout else ""))

    # -- running
    def progress_text(self) -> str:
        """The ranks' collectives so far (count, or its range over the ranks; point-to-point messages, tensor
        bytes and simulated seconds: the most of any rank), and the ranks still starting."""
        parts = [self.elapsed()]
        ready = [r for r in self.ranks if r.phase == "ready"]
        if ready:
            least, most = min(r.count for r in ready), max(r.count for r in ready)
            parts.append(_count(most, "collective") if least == most else f"{least}-{most} collectives")
            messages = max(r.messages for r in ready)
            if messages:
                parts.append(_count(messages, "message"))
            parts.append(_size(max(r.nbytes for r in ready)))
            parts.append(f"{max(r.t or 0.0 for r in ready):.1f} s simulated")
        waiting: dict[tuple[str, str], list[str]] = {}  # (what one rank does, what several do) -> the ranks
        for r in self.ranks:
            if r.phase != "ready" and r.exit is None:
                what = ("starting",) * 2 if r.phase == "starting" else ("greeting its peers", "greeting their peers")
                waiting.setdefault(what, []).append(r.node)
        for (one, several), nodes in waiting.items():  # (a classroom's ranks are counted, not named)
            parts.append(", ".join(f"{n} {one}" for n in nodes) if len(nodes) <= 3
                         else f"{len(nodes)} ranks {several}")
        return " | ".join(parts)

    def report_failure(self, who: str, rc: int, tail: collections.deque[str], closed: threading.Event | None,
                       label: str, stream: str = "stderr") -> None:
        if closed is not None:
            closed.wait(2.0)  # its last lines (a traceback) may still be in the pipe
        lines = list(tail)
        text = f"{who} {_describe_exit(rc)}"
        text += f"; its last {len(lines)} lines of {stream}:" if lines else f" (nothing on its {stream})"
        self.term.say(text + "".join(f"\n  {label}| {line}" for line in lines))

    def watch(self) -> int:
        """Wait for every rank; once one fails (or the room), name it and return its status (after
        `--grace-s`, if given, for the others to end on their own)."""
        failed: int | None = None
        deadline: float | None = None
        next_line = time.monotonic() + (REDRAW_S if self.term.live else PROGRESS_EVERY_S)
        while True:
            now = time.monotonic()
            if (failed is None and self.room is not None and self.room.poll() not in (None, 0)
                    and any(r.exit is None for r in self.ranks)):
                failed = _exit_status(self.room.returncode)
                self.report_failure("the room process", self.room.returncode, self.room_tail, self.room_closed,
                                    "room", "output")
                return failed
            for r in self.ranks:
                if r.exit is None and (rc := r.proc.poll()) is not None:
                    r.exit = rc
                    if rc != 0 and failed is None:
                        failed = _exit_status(rc)
                        self.report_failure(r.name, rc, r.tail, r.stderr_closed, r.node)
                        if self.args.grace_s <= 0:
                            return failed
                        self.term.say(f"the other ranks get {self.args.grace_s:g} s to end (--grace-s)")
                        deadline = now + self.args.grace_s
            for r in self.ranks:
                if r.synced is not None and now - r.synced[0] > LAYOUT_WAIT_S:
                    self.say_synced(r)
            if all(r.exit is not None for r in self.ranks):
                return failed if failed is not None else EXIT_OK
            if deadline is not None and now > deadline:
                return failed
            if now >= next_line:
                if self.term.live:
                    self.term.progress(lambda: f"wccl.launch {self.progress_text()}")
                    next_line = now + REDRAW_S
                else:
                    self.term.say(self.progress_text())
                    next_line = now + PROGRESS_EVERY_S
            time.sleep(0.1)

    # -- stopping
    def stop_all(self) -> None:
        """Stop every process still running and wait for their output to end: first the ranks and the
        intruders, then the room, once none of them runs in it any more (an intruder whose room vanished
        under it would restart its actors on the closed connection instead of ending its run)."""
        self.tearing_down = True
        alive = [r for r in self.ranks if r.proc is not None and r.proc.poll() is None]
        for r in alive:
            r.stopped = True
        if alive:
            room = " and the room" if self.room is not None and self.room.poll() is None else ""
            self.term.say(f"stopping {', '.join(r.name for r in alive)}{room}")
        _stop([r.proc for r in self.ranks if r.proc is not None] + self.intruders)
        if self.forker is not None:
            self.forker.close()
        if self.room is not None:
            _stop([self.room])
        for r in self.ranks:
            if r.proc is not None and r.exit is None:
                r.exit = r.proc.returncode
            self.say_synced(r)
        if not self.pump.drain(DRAIN_S):
            # a process the ranks started themselves still holds a pipe: show nothing more of it
            self.term.muted = True
        self.term.end_progress()

    def summary(self, interrupted: bool) -> None:
        if not any(r.proc is not None for r in self.ranks):
            return
        failed = sum(1 for r in self.ranks if r.exit != 0 and not r.stopped)
        stopped = sum(1 for r in self.ranks if r.stopped)
        if interrupted:
            head = "interrupted"
        elif not failed and not stopped:
            head = f"all {len(self.ranks)} ranks exited 0" if len(self.ranks) > 1 else "the rank exited 0"
        else:
            head = ", ".join(part for part in (_count(failed, "rank") + " failed" if failed else "",
                                               _count(stopped, "rank") + " stopped" if stopped else "") if part)
        lines = [f"{head} after {self.elapsed()}:"]
        for r in self.ranks:
            if r.exit is None:
                status = "not started"
            elif r.stopped:
                status = "stopped by the launcher"
            elif r.exit >= 0:
                status = f"exit {r.exit}"
            else:
                status = _describe_exit(r.exit)
            lines.append(f"  {r.name}: {status}; {r.totals()}")
        self.term.say("\n".join(lines))


def _stop(procs: list[subprocess.Popen | ForkedProcess], sig: int = signal.SIGTERM) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(args: argparse.Namespace) -> int:
    config_path = Path(args.config).resolve()
    cfg = load_config(config_path)
    script = Path(args.script)
    if not script.is_file():
        raise LaunchError(f"{args.script}: no such script")
    ranks = cfg.room.ranks
    if args.node is not None and args.node not in ranks:
        raise LaunchError(f"--node {args.node}: not a training node of the room ({', '.join(ranks)})")
    simulated = cfg.room.medium == "simulated"
    if not pairs(cfg):
        room_key(cfg)  # a key file or passphrase that cannot be had: one line here, before anything starts
    if args.node is not None and simulated:
        raise LaunchError("--node runs one laptop's rank on real devices; the simulated room runs every rank "
                          "(leave out --node)")
    run = [args.node] if args.node else ranks
    if cfg.room.medium == "hardware" and args.aim_seconds > 0:
        # Aim on this process's main thread (a window must open there on macOS), before the script starts.
        from wccl.aim import aim_first
        from wccl.runtime.logs import configure_logging

        configure_logging(cfg.logging.format, args.log_level or cfg.logging.level)
        status = aim_first(cfg, args.node, args.aim_seconds)
        if status is not None:
            return status
    base = dict(os.environ)
    for k in ("MASTER_ADDR", "MASTER_PORT", "WCCL_STATUS_FD"):
        base.pop(k, None)
    base.update(WORLD_SIZE=str(len(ranks)), LOCAL_WORLD_SIZE=str(len(run)), WCCL_CONFIG=str(config_path))
    if args.clock:
        base["WCCL_CLOCK"] = args.clock
    level = args.log_level or (cfg.logging.level if "level" in cfg.logging.model_fields_set else DEFAULT_LOG_LEVEL)
    base["WCCL_LOG_LEVEL"] = level
    if cfg.logging.format == "auto" and sys.stderr.isatty():
        base["WCCL_LOG_FORMAT"] = "console"  # their stderr is a pipe to here, but it ends on a terminal
    if sys.stdout.isatty():
        base.setdefault("PYTHONUNBUFFERED", "1")  # their prints show as they come, as on a terminal

    job = _Launch(args)
    job.side_level = LOG_LEVELS[level]
    job.ranks = [_Rank(ranks.index(n), n, len(ranks)) for n in run]
    log = open(args.room_log, "w") if args.room_log else None  # noqa: SIM115 - closed below
    interrupted = False
    people_dir = None  # the folder of the simulated people who confirm a pairing code (made below, if it pairs)

    def _interrupt(signum, frame):
        nonlocal interrupted
        interrupted = True
        raise KeyboardInterrupt

    def _note(signum, frame):
        nonlocal interrupted
        interrupted = True

    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if forkserver.available():
            job.start_forker(base)  # its imports overlap the room's start
        if simulated:
            job.term.say(f"{config_path.name}: {len(ranks)} ranks ({', '.join(ranks)}); starting the simulated "
                         f"room ({cfg.room.profile} profile, {args.clock or cfg.room.clock} clock)")
            base["WCCL_ROOM_AUTHKEY"] = secrets.token_hex(16)
            if (cfg.room.key_file is None and cfg.room.key_env is None and cfg.room.key == "auto"
                    and not base.get(RUN_KEY_ENV)):
                base[RUN_KEY_ENV] = new_ephemeral().hex()  # the run's room key (wccl.keys): every rank's
            base["WCCL_ROOM"] = job.start_room(config_path, ranks + cfg.room.intruders, args.clock, base, log)
            # Intruders (a test of the room key): their own processes, without the run's key.
            bare = {k: v for k, v in base.items() if k != RUN_KEY_ENV}
            for n in cfg.room.intruders:
                job.start_intruder(n, bare, log)
        if pairs(cfg) and args.node is None:  # every rank here: the people see every screen's pairing code
            base[PAIR_TABLE_ENV] = people_dir = tempfile.mkdtemp(prefix="wccl-pairing-")
        for local, r in enumerate(job.ranks):
            env = dict(base, RANK=str(r.rank), LOCAL_RANK=str(local), WCCL_NODE=r.node)
            job.start_rank(r, [str(script), *args.args], env)
        return job.watch()
    except KeyboardInterrupt:
        interrupted = True
        return EXIT_INTERRUPTED
    finally:
        for s in old:
            signal.signal(s, _note)  # a second Ctrl-C does not cut the stopping short
        try:
            job.stop_all()
            if people_dir is not None:
                shutil.rmtree(people_dir, ignore_errors=True)
            if log is not None:
                log.close()
            job.summary(interrupted)
            if interrupted:
                job.term.say("interrupted; every process it started has stopped")
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return launch(args)
    except (ConfigError, LaunchError) as e:
        print(f"wccl.launch: {e}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
