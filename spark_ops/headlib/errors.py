"""The one failure of the head-side pieces: an exit code, a kind and a JSON-able description.

Standard library only (spark_ops/headlib/__init__.py says why).
"""

from __future__ import annotations

from typing import Any

EXIT_LOCK = 3  # a lock stayed held past its timeout
EXIT_IO = 4  # a file could not be read or written


class HeadFailure(Exception):
    """A head-side operation failed; carries the exit code and a JSON-able description."""

    exit_code = EXIT_IO
    kind = "io"

    def __init__(self, message: str, **details: Any) -> None:
        """Keep the message and the details that go into the JSON output."""
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        """Serialize as the one JSON object a failing subcommand prints."""
        return {"ok": False, "error": self.kind, "message": self.message, **self.details}


class LockTimeout(HeadFailure):
    """The lock file stayed held by someone else past the timeout."""

    exit_code = EXIT_LOCK
    kind = "lock_timeout"
