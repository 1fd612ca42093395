"""The doctor's report (checks as data) and the base that every group of checks works on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spark_ops.remote import ClusterSession
from spark_ops.verify.checks import STATUSES, Check


@dataclass
class DoctorReport:
    """Every check of one cluster, in the order they were made."""

    cluster: str
    inventory: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings allowed)."""
        return not any(c.status == "fail" for c in self.checks)

    def add(self, name: str, host: str, status: str, detail: str, fix: str = "") -> Check:
        """Record one check and return it."""
        check = Check(name, host, status, detail, fix if status != "ok" else "")
        self.checks.append(check)
        return check

    def failed(self) -> list[Check]:
        """The failing checks."""
        return [c for c in self.checks if c.status == "fail"]

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        counts = {s: sum(1 for c in self.checks if c.status == s) for s in STATUSES}
        return {
            "cluster": self.cluster,
            "inventory": self.inventory,
            "ok": self.ok,
            "counts": counts,
            "checks": [c.to_dict() for c in self.checks],
        }


def parse_kv(text: str) -> dict[str, str]:
    """key=value lines (a doctor probe's answer) into a dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


class Checker:
    """What a group of checks works on: the open session, its cluster, the report it fills."""

    def __init__(self, session: ClusterSession, report: DoctorReport) -> None:
        """Bind to an open session (nodes connected or with their errors recorded)."""
        self.session = session
        self.cluster = session.cluster
        self.report = report
        self.head = self.cluster.head.name

    def up(self, name: str) -> bool:
        """True when the node is connected."""
        return name in self.session.connectors
