"""Plans as data: what an operation will change where (as diffs) and the steps it will take.

`--dry-run` prints a Plan, `--json` serializes it, and the workflows execute it step by step,
reporting each step's outcome into the same structure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FileChange:
    """One file to rewrite on one node: the diff, and the digest of the content planned from."""

    host: str
    path: str
    old_sha: str
    diff: str
    new_text: str = field(repr=False)
    old_text: str = field(default="", repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Serialize without the full texts."""
        return {"host": self.host, "path": self.path, "old_sha256": self.old_sha, "diff": self.diff}


@dataclass
class Step:
    """One step of a plan and, once run, its outcome."""

    name: str
    description: str
    hosts: list[str] = field(default_factory=list)
    status: str = "pending"  # pending | running | done | skipped | failed
    detail: str = ""
    seconds: float | None = None  # how long it took, once finished
    started: float | None = field(default=None, repr=False)  # monotonic clock, while running

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        data: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "hosts": self.hosts,
            "status": self.status,
        }
        if self.detail:
            data["detail"] = self.detail
        if self.seconds is not None:
            data["seconds"] = round(self.seconds, 3)
        return data


@dataclass
class Plan:
    """What an operation will do: file changes, steps, warnings and the facts it was planned on."""

    operation: str
    cluster: str
    changes: list[FileChange] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def changes_files(self) -> bool:
        """True when at least one file would change."""
        return any(c.diff for c in self.changes)

    def step(self, name: str) -> Step:
        """Find a step by name."""
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def add(self, name: str, description: str, hosts: list[str] | None = None) -> Step:
        """Append a step."""
        s = Step(name, description, hosts or [])
        self.steps.append(s)
        return s

    def to_dict(self) -> dict[str, Any]:
        """Serialize the whole plan."""
        return {
            "operation": self.operation,
            "cluster": self.cluster,
            "changes": [c.to_dict() for c in self.changes],
            "steps": [s.to_dict() for s in self.steps],
            "warnings": self.warnings,
            "facts": self.facts,
        }


class StepRunner:
    """Marks steps running / done / failed with timings, calling a reporter on each change."""

    def __init__(self, plan: Plan, report: Callable[[Step], None] | None = None) -> None:
        """Bind to a plan and an optional callable(step)."""
        self.plan = plan
        self.report = report

    def _emit(self, step: Step) -> None:
        """Tell the reporter a step changed."""
        if self.report is not None:
            self.report(step)

    def start(self, name: str) -> Step:
        """Mark a step as running."""
        s = self.plan.step(name)
        s.status = "running"
        s.started = time.monotonic()
        s.seconds = None
        self._emit(s)
        return s

    def finish(self, name: str, detail: str = "", status: str = "done") -> Step:
        """Mark a step finished with a detail line."""
        s = self.plan.step(name)
        s.seconds = time.monotonic() - s.started if s.started is not None else None
        s.started = None
        s.status = status
        s.detail = detail
        self._emit(s)
        return s

    def fail(self, name: str, detail: str) -> Step:
        """Mark a step failed."""
        return self.finish(name, detail, status="failed")

    def skip(self, name: str, detail: str) -> Step:
        """Mark a step skipped."""
        return self.finish(name, detail, status="skipped")
