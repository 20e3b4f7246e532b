"""Structured logs: `configure_logging()` once per process.

Events are constant snake_case names with key=value fields. `node`, `actor`
and `step` come from contextvars (bound by the supervisor and the actors), and
`t` is the room's time (virtual or real seconds) when an event loop runs.
Console renderer on a terminal, JSON lines otherwise (or when asked); on a
terminal one live progress line (`ProgressLine`) stays under the log.
Taps (`add_tap`) are shown a copy of every event that passes the level
filter: the live dashboard reads the run's events this way.

The console at level info shows only the run's headlines (`HEADLINES`:
start, layout, clock sync, recovery, devices, aiming), each once and in words
where it has them, and every warning and error;
per-step and per-frame detail reaches the console at level debug. JSON logs
carry every event of the level, whatever it is.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _add_room_time(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    try:
        event.setdefault("t", round(asyncio.get_running_loop().time(), 3))
    except RuntimeError:
        pass
    return event


# The info events a console shows at level info; the rest of info (per step, per frame) shows at debug.
HEADLINES = frozenset({
    "run_started", "run_folder", "dashboard_listening", "dashboard_waiting_for_page", "dashboard_lingering",
    "room_key", "node_started", "window_opened", "webcam_opened", "webcam_locked", "rank_ready", "keep_awake",
    "sight_known", "schedule_fixed", "schedule_resumed", "server_resumed", "clock_synced",
    "joining_late", "snapshot_adopted", "observer_recovered", "aim_state", "aim_ok",
})


def _pct(edges: dict[str, float]) -> str:
    return ", ".join(f"{k} {100 * v:.0f} %" for k, v in edges.items())


# The console's headlines in words: (the fields that make a headline news, not a repeat; its words). A
# headline said once already (the same event with the same key: the room key of each node of the room,
# a layout every rank chose alike, a clock synced again) is not said again at level info.
_WORDS: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any]], str]]] = {
    "run_started": ((), lambda e: f"run: {', '.join(e.get('nodes', []))}; {e.get('steps')} steps, the "
                    f"{e.get('profile')} room ({e.get('medium')}, {e.get('clock')} time), exchange {e.get('exchange')}"),
    "run_folder": ((), lambda e: f"run folder {e.get('path')}: {e.get('holds')}"),
    "dashboard_listening": ((), lambda e: f"dashboard: {e.get('url')}"),
    "room_key": (("fingerprint",), lambda e: f"room key {e.get('fingerprint')} ({e.get('source')}): frames "
                 f"{e.get('frames')}, tensors {e.get('payloads')}"),
    "node_started": (("node",), lambda e: f"{e.get('node')} started: {', '.join(e.get('roles', []))}"),
    "sight_known": (("layout", "rows", "cols"), lambda e: f"layout: {e.get('rows')}x{e.get('cols')} cells of "
                    f"{e.get('cell_px')} px, {e.get('colours')} colours; frames read: {_pct(e.get('edges', {}))}"),
    "schedule_fixed": (("epoch",), lambda e: f"schedule: {e.get('period_s'):.3f} s a step, {e.get('steps')} steps"),
    "clock_synced": (("node",), lambda e: f"{e.get('node')}'s clock synced to the server's: off by "
                     f"{e.get('offset_s'):+.3f} s, within {e.get('err_ms'):.1f} ms"),
}


class _Headlines:
    """The console at level info: the headlines only (`HEADLINES`), each once, in words where it has them
    (`_WORDS`); warnings and errors all, as they come."""

    def __init__(self) -> None:
        self.said: set[tuple] = set()

    def __call__(self, _: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        if method != "info":
            return event
        name = event.get("event")
        if name not in HEADLINES:
            raise structlog.DropEvent
        keys, words = _WORDS.get(name, (None, None))
        if keys is None:  # (a headline without words: news when any of its fields is)
            keys = tuple(sorted(k for k in event if k not in ("t", "timestamp", "level")))
        key = (name, *(repr(event.get(k)) for k in keys))
        if key in self.said:
            raise structlog.DropEvent
        self.said.add(key)
        if words is None:
            return event
        try:
            text = words(event)
        except (TypeError, ValueError):  # (a field missing or of another kind: the event as it is)
            return event
        return {"event": text, **{k: event[k] for k in ("level", "t") if k in event}}


_TAPS: list[Callable[[dict[str, Any]], None]] = []


def add_tap(tap: Callable[[dict[str, Any]], None]) -> None:
    """Show `tap` every event from now on (it must not block and must not log)."""
    _TAPS.append(tap)


def remove_tap(tap: Callable[[dict[str, Any]], None]) -> None:
    if tap in _TAPS:
        _TAPS.remove(tap)


def _feed_taps(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    for tap in list(_TAPS):
        tap(dict(event))
    return event


class ProgressLine:
    """One live line under the log on a terminal: step k of N, the phase, the last accuracy, the link's
    health (frames read / frames read or rejected) and the simulated time left. Log lines go above it;
    between them the line is redrawn as the run goes (at most every `REDRAW_S` wall seconds)."""

    REDRAW_S = 0.25

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.drawn_at = 0.0
        self.steps: int | None = None
        self.step = -1
        self.phase = "starting"
        self.accuracy: float | None = None
        self.frames = [0, 0]  # read, rejected (since the start)
        self.period: float | None = None
        self.shown = False

    def tap(self, e: dict[str, Any]) -> None:
        name = e.get("event")
        if name == "run_started":
            self.steps = e.get("steps")
        elif name in ("steps_made_up", "schedule_announced") and self.steps and e.get("steps", 0) > self.steps:
            self.steps = e["steps"]  # (the server made up a step it skipped)
        elif name == "node_started" and self.phase == "starting":
            self.phase = "start-up: looking for the other screens"
        elif name == "handshake" and e.get("trusted") and self.phase.startswith("start-up: looking"):
            self.phase = "start-up: measuring the layouts"  # (a peer read and trusted: discovery goes on)
        elif name == "sight_known" and self.phase.startswith("start-up"):
            self.phase = "start-up: layout chosen, syncing clocks"
        elif name == "schedule_fixed":
            self.period, self.phase = e.get("period_s"), "training"
        elif name == "clock_synced" and self.phase.startswith(("starting", "start-up")):
            self.phase = "clocks synced"
        elif name == "step_applied" and e.get("step", -1) >= self.step:
            self.step = e["step"]
            self.accuracy = e.get("test_accuracy", self.accuracy)
        elif name == "link_report":
            rejected = e.get("frames_rejected") or {}
            self.frames[0] += e.get("frames_ok", 0)
            self.frames[1] += sum(rejected.values()) if isinstance(rejected, dict) else 0
        elif name in ("run_finished", "run_interrupted"):
            self.phase = "finished" if name == "run_finished" else "interrupted"
        if self.shown and time.monotonic() - self.drawn_at > self.REDRAW_S:
            self.stream.write(f"\r\x1b[K{self.render()}")
            self.stream.flush()
            self.drawn_at = time.monotonic()

    def render(self) -> str:
        parts = [f"step {self.step + 1}/{self.steps}" if self.steps else "step -", self.phase]
        if self.accuracy is not None:
            parts.append(f"accuracy {self.accuracy:.3f}")
        read, bad = self.frames
        if read + bad:
            parts.append(f"link {read / (read + bad):.0%} of frames read")
        if self.steps and self.period and self.phase == "training":
            parts.append(f"~{(self.steps - self.step - 1) * self.period:.0f} s left (room time)")
        return "wccl | " + " | ".join(parts)

    def write(self, message: str) -> None:
        clear = "\r\x1b[K" if self.shown else ""
        self.stream.write(f"{clear}{message}\n{self.render()}")
        self.stream.flush()
        self.shown = True
        self.drawn_at = time.monotonic()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False


class _ProgressLogger:
    """A structlog logger that writes each line above the progress line."""

    def __init__(self, line: ProgressLine) -> None:
        self._line = line

    def msg(self, message: str) -> None:
        self._line.write(message)

    log = debug = info = warn = warning = err = error = critical = exception = fatal = msg


_progress: ProgressLine | None = None


def configure_logging(fmt: str = "auto", level: str = "info", stream: TextIO | None = None,
                      progress: bool = False, taps_level: str | None = None) -> str:
    """Configure structlog for this process. `fmt`: auto | console | json. On a terminal with the
    console format, `progress` keeps one live progress line under the log (the built-in run's). `taps_level` (below `level`)
    lets the taps see events the log does not show. Returns the format in use ("console" or "json")."""
    global _progress
    if _progress is not None:
        remove_tap(_progress.tap)
        _progress.close()
        _progress = None
    stream = stream or sys.stdout
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _add_room_time,
        _feed_taps,
    ]
    floor = level
    if taps_level is not None and _LEVELS[taps_level] < _LEVELS[level]:
        floor = taps_level
        threshold = _LEVELS[level]

        def _below_level(_: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
            if _LEVELS.get(event.get("level", method), logging.CRITICAL) < threshold:  # (add_log_level named it)
                raise structlog.DropEvent
            return event

        processors.append(_below_level)
    if fmt == "json":
        processors += [
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ]
    elif fmt == "console":
        if level == "info":
            processors.append(_Headlines())
        processors += [
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(colors=stream.isatty()),
        ]
    else:
        raise ValueError(f"unknown log format {fmt!r}")
    factory: Any = structlog.PrintLoggerFactory(stream)
    if fmt == "console" and progress and stream.isatty():
        _progress = ProgressLine(stream)
        add_tap(_progress.tap)
        atexit.register(_progress.close)
        line = _progress
        factory = lambda *args: _ProgressLogger(line)  # noqa: E731
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[floor]),
        logger_factory=factory,
        cache_logger_on_first_use=False,
    )
    return fmt


def end_progress() -> None:
    """End the live progress line (if any), so that what is printed next starts on a line of its own."""
    if _progress is not None:
        _progress.close()


def get_logger() -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger("wccl")
