"""structlog set-up: a console renderer on a TTY, JSON lines otherwise; always on stderr."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def configure(verbosity: int = 0, *, json: bool | None = None) -> None:
    """Configure structlog once: verbosity -1 quiet, 0 info, 1+ debug; json=None picks by TTY."""
    level = logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO
    if json is None:
        json = not sys.stderr.isatty()
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(**bound: Any) -> Any:
    """Return a structlog logger bound with the given keys (host=..., op=...)."""
    return structlog.get_logger("spark_ops").bind(**bound)
