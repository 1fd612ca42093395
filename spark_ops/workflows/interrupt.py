"""Interruption: SIGINT and SIGTERM end a run between atomic units, never inside one.

The CLI turns both signals into a cancellation of the running operation (`request`). A step that
must not stop half-way — the all-or-nothing recipe write, the watchdog's restart command with the
identification of its stamp, the prune of that stamp — runs as one `atomic` unit: a cancellation
that arrives meanwhile waits for the unit to finish, then takes effect. The run then says, in plain
lines, where the cluster stands (`standing`) and which command converges.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

_received: list[str] = []  # the signals seen by this process, in order
_listeners: list[Callable[[str], None]] = []  # told first, e.g. to note the step in progress


def request(task: asyncio.Task[object], signame: str) -> None:
    """Cancel the running operation for a signal (called from the CLI's signal handler)."""
    _received.append(signame)
    for listener in list(_listeners):
        listener(signame)
    task.cancel()


@contextlib.contextmanager
def listening(listener: Callable[[str], None]) -> Iterator[None]:
    """Call `listener(signal name)` when a signal arrives while the block runs."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def received() -> str:
    """The name of the first signal that interrupted this process ("" when none did)."""
    return _received[0] if _received else ""


def clear() -> None:
    """Forget the signals seen (tests run several operations in one process)."""
    _received.clear()


async def atomic(work: Awaitable[T]) -> T:
    """Run `work` to its end even when the caller is cancelled meanwhile; then re-raise.

    Put the unit's own bookkeeping (what it wrote, the step's outcome) inside `work`: a
    cancellation that waited for the unit is raised after it, and the result is not returned.
    """
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True  # finish the unit first, however often the operator insists
            _uncancel()
    if cancelled:
        raise asyncio.CancelledError()
    return result


def _uncancel() -> None:
    """Take back a cancellation request the current task has received (Python >= 3.11)."""
    task = asyncio.current_task()
    if task is not None:
        with contextlib.suppress(AttributeError):
            task.uncancel()


def absorb() -> None:
    """Called once an interruption was caught: later awaits of the run's clean-up may proceed."""
    _uncancel()
