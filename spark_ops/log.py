"""Logging: structlog with a console renderer on a TTY, JSON lines otherwise; always on stderr.

The CLI logs only when asked (cli_verbosity): warnings by default, -v info, --log-json JSON lines.

structlog (and the rich modules it pulls in) is imported only when a message passes the level, so a
quiet command pays nothing for it: `get_logger()` returns a small proxy.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_LEVELS.update(warn=logging.WARNING, error=logging.ERROR, critical=logging.CRITICAL)
_state: dict[str, Any] = {"level": logging.INFO, "json": None, "ready": False}


SILENT = -2  # no log line at all (the CLI under --json without -v: its error object alone)


def configure(verbosity: int = 0, *, json: bool | None = None) -> None:
    """Set the level (-2 silent, -1 warnings, 0 info, 1+ debug) and format (None: JSON unless
    stderr is a TTY)."""
    levels = {SILENT: logging.CRITICAL + 10, -1: logging.WARNING, 0: logging.INFO}
    level = levels.get(max(verbosity, SILENT), logging.DEBUG)
    _state.update(level=level, json=json, ready=False)


def cli_verbosity(verbose: int, *, quiet: bool, as_json: bool, log_json: bool) -> int:
    """The CLI's log level: a report is for a person, so logs reach stderr only when asked.

    Warnings by default (and with -q, which wins); -v info, -vv debug; --log-json info as JSON
    lines. Under
    --json without -v or --log-json, no log line at all: stderr holds the error object alone.
    """
    if quiet:
        return -1
    if verbose:
        return verbose - 1
    if log_json:
        return 0
    if as_json:
        return SILENT
    return -1


def _structlog() -> Any:
    """Import and configure structlog on first use."""
    import structlog

    if not _state["ready"]:
        as_json = _state["json"]
        if as_json is None:
            as_json = not sys.stderr.isatty()
        renderer: Any = (
            structlog.processors.JSONRenderer()
            if as_json
            else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        )
        structlog.configure(
            processors=[
                structlog.contextvars.merge_contextvars,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                renderer,
            ],
            wrapper_class=structlog.make_filtering_bound_logger(_state["level"]),
            logger_factory=lambda *args: _Stderr(),
            cache_logger_on_first_use=False,
        )
        _state["ready"] = True
    return structlog


class _Stderr:
    """A structlog output writing to whatever sys.stderr is at the time (tests swap it)."""

    def msg(self, message: str) -> None:
        """Write one rendered line."""
        print(message, file=sys.stderr, flush=True)

    debug = info = warning = warn = error = critical = exception = log = msg


class _Logger:
    """A bound logger that defers structlog until a message is actually emitted."""

    def __init__(self, bound: dict[str, Any]) -> None:
        """Keep the bound keys."""
        self._bound = bound

    def bind(self, **more: Any) -> _Logger:
        """A logger with more keys bound."""
        return _Logger({**self._bound, **more})

    def __getattr__(self, name: str) -> Any:
        """debug / info / warning / error / critical: emit when the level allows."""
        level = _LEVELS.get(name)
        if level is None:
            raise AttributeError(name)

        def emit(event: str, **kw: Any) -> None:
            """Forward to structlog if the message passes the level."""
            if level >= _state["level"]:
                logger = _structlog().get_logger("spark_ops").bind(**self._bound)
                getattr(logger, name)(event, **kw)

        return emit


def get_logger(**bound: Any) -> Any:
    """Return a logger bound with the given keys (host=..., op=...)."""
    return _Logger(dict(bound))
