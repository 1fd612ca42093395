"""What the pages, the JSON endpoints and /metrics show: read through the code `status`, `log`
and `bench` use, cached a few seconds so that a scrape storm opens no SSH session per request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from spark_ops.audit import is_attributed, read_log
from spark_ops.doctor import read_last
from spark_ops.errors import SparkOpsError
from spark_ops.inventory import Cluster
from spark_ops.readiness import BootHistory, history_key
from spark_ops.serve.boot import BootWatch
from spark_ops.serve.load import LoadWatch
from spark_ops.serve.nodes import FACTS_S, read_facts
from spark_ops.serve.sweeps import MAX_RESULTS, SweepReader, load_sweep
from spark_ops.status import collect_status

CACHE_S = 5.0  # a page, a script and Prometheus within this share one reading
AUDIT_LIMIT = 300  # raw lines: a run writes about ten, the history page groups them
RUN_OPERATIONS = ("apply", "restart", "rollback", "experiment")
__all__ = ["MAX_RESULTS", "Cached", "Source", "last_run", "load_sweep"]  # serve.sweeps' as before


class Cached:
    """One value read at most once per `ttl` seconds; concurrent readers share the read."""

    def __init__(self, read: Callable[[], Awaitable[Any]], ttl: float) -> None:
        """Keep the reader."""
        self.read = read
        self.ttl = ttl
        self.value: Any = None
        self.at = -1e18
        self.lock = asyncio.Lock()

    async def get(self) -> Any:
        """The value, read again when older than ttl."""
        async with self.lock:
            if time.monotonic() - self.at >= self.ttl:
                self.value = await self.read()
                self.at = time.monotonic()
            return self.value


class Source:
    """Everything the server shows about one cluster."""

    def __init__(
        self, cluster: Cluster, *, results: Path | None = None, ttl: float = CACHE_S
    ) -> None:
        """Readers for status and the audit log; the boot watch; where saved sweeps are."""
        self.cluster = cluster
        self.results = results
        self.boot = BootWatch(cluster)
        self.status = Cached(lambda: collect_status(cluster), ttl)
        self.audit = Cached(self._audit, ttl)
        self.sweep_reader = SweepReader(results, ttl=ttl) if results is not None else None
        self.hardware = Cached(self._hardware, max(ttl, FACTS_S))
        self.load = LoadWatch(cluster)

    async def _audit(self) -> dict[str, Any]:
        """The audit log's last entries (as `spark-ops log --json`), or the error reading it."""
        try:
            return {"entries": await read_log(self.cluster, AUDIT_LIMIT)}
        except SparkOpsError as exc:
            return {"entries": [], "error": exc.message}

    async def _hardware(self) -> dict[str, Any]:
        """Each node's facts (serve.nodes), or the error reading them (the page goes on)."""
        try:
            return await read_facts(self.cluster)
        except SparkOpsError as exc:
            return {"time": time.time(), "nodes": {}, "error": exc.message}

    def doctor(self) -> dict[str, Any] | None:
        """The last `spark-ops doctor` report kept on this machine for this cluster."""
        return read_last(self.cluster.name)

    def boots(self) -> dict[str, Any]:
        """This machine's boot records (`status`' last boot, the ETAs) and the live boot."""
        key = history_key(self.cluster)
        history = BootHistory()
        return {
            "live": self.boot.state.snapshot(),
            "tail": list(self.boot.tail),
            "watched_here": list(self.boot.past),
            "recorded": history.records(key)[::-1],
            "usual_s": history.estimate(key),
        }

    async def sweeps(self) -> dict[str, Any]:
        """Saved sweep results (`bench -o FILE.json`) under --results, with their what-if: read
        by one child process at a time under a budget (serve.sweeps)."""
        if self.sweep_reader is None:
            return {"dir": None, "runs": []}
        return await self.sweep_reader.get()

    async def close(self) -> None:
        """Stop what reads in the background (a sweep read's child)."""
        if self.sweep_reader is not None:
            await self.sweep_reader.close()


def last_run(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest ended run (apply, restart, rollback, experiment) in the audit entries."""
    for e in reversed(entries):
        if not is_attributed(e):
            continue  # a line the head's program did not write is no run (issue 34)
        what: dict[str, Any] = e["what"] if isinstance(e.get("what"), dict) else {}
        if what.get("operation") in RUN_OPERATIONS and e.get("phase") not in ("intent", "step"):
            return {
                "operation": what.get("operation"),
                "outcome": e.get("outcome"),
                "ok": e.get("outcome") in ("ok", "done"),
                "when": e.get("when"),
                "who": e.get("who"),
            }
    return None
