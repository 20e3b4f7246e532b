"""Structured logs: `configure_logging()` once per process.

Events are constant snake_case names with key=value fields. `node`, `actor`
and `step` come from contextvars (bound by the supervisor and the actors), and
`t` is the room's time (virtual or real seconds) when an event loop runs.
Console renderer on a terminal, JSON lines otherwise (or when asked).
Taps (`add_tap`) are shown a copy of every event that passes the level
filter: the live dashboard reads the run's events this way.
"""

from __future__ import annotations

import asyncio
import logging
import sys
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


def configure_logging(fmt: str = "auto", level: str = "info", stream: TextIO | None = None) -> None:
    """Configure structlog for this process. `fmt`: auto | console | json."""
    stream = stream or sys.stdout
    if fmt == "auto":
        fmt = "console" if stream.isatty() else "json"
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _add_room_time,
        _feed_taps,
    ]
    if fmt == "json":
        processors += [
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ]
    elif fmt == "console":
        processors += [
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(colors=stream.isatty()),
        ]
    else:
        raise ValueError(f"unknown log format {fmt!r}")
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def get_logger() -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger("wccl")
