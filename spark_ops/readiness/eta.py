"""Phase durations of earlier boots, kept in a small local JSON file, for ETAs."""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from spark_ops.errors import SparkOpsError
from spark_ops.files import read_regular, write_file
from spark_ops.inventory import Cluster
from spark_ops.log import get_logger
from spark_ops.readiness.phases import PHASE_ORDER, Phase


class Reported(Protocol):
    """What a boot report gives the history: its dict (readiness.report.BootReport has one)."""

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able data."""
        ...


def _log() -> Any:
    """The module logger (structlog is imported only when something is logged)."""
    return get_logger(op="boot-eta")


DEFAULT_STATE_PATH = Path("~/.local/state/spark-ops/boots.json")
FORMAT_VERSION = 1
MAX_FILE_BYTES = 1 << 20  # ten boots per cluster are a few KB; more is not a file record() wrote


def _finite(value: object) -> float | None:
    """A JSON number as a finite float (not a boolean), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None
    return number if math.isfinite(number) else None


def _seconds(value: object) -> float | None:
    """A duration: a finite, non-negative JSON number, else None."""
    number = _finite(value)
    return number if number is not None and number >= 0 else None


def _count(value: object) -> int | None:
    """A JSON integer 0..2**63 (not a boolean), else None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        return None
    return value


def _record_of(rec: object) -> dict[str, Any] | None:
    """One boot record as `record` or `record_failed` writes it, its values checked; None when it
    is not one (no finite `at` and `total_s`); a bad duration or field is left out; an outcome
    other than ok reads as failed (never an ETA)."""
    if not isinstance(rec, dict):
        return None
    at, total = _finite(rec.get("at")), _seconds(rec.get("total_s"))
    if at is None or total is None:
        return None
    durations = rec.get("durations")
    skipped = rec.get("skipped")
    version = rec.get("vllm_version")
    kv = rec.get("kv_cache_memory_bytes")  # as the engine's args said it: a count or its text
    outcome = rec.get("outcome", "ok")
    phase, error = rec.get("phase"), rec.get("error")
    kept: dict[str, Any] = {"outcome": outcome if outcome in ("ok", "failed") else "failed"}
    if kept["outcome"] == "failed":  # a failed boot's phase and why, as record_failed wrote them
        kept["phase"] = phase[:64] if isinstance(phase, str) else ""
        kept["error"] = error[:300] if isinstance(error, str) else ""
    return {
        **kept,
        "at": at,
        "total_s": total,
        "durations": {
            str(k): secs
            for k, v in (durations.items() if isinstance(durations, dict) else ())
            if (secs := _seconds(v)) is not None
        },
        "skipped": [s for s in skipped if isinstance(s, str)] if isinstance(skipped, list) else [],
        "kv_cache_tokens": _count(rec.get("kv_cache_tokens")),
        "kv_cache_memory_bytes": kv if isinstance(kv, str) and len(kv) <= 64 else _count(kv),
        "vllm_version": version if isinstance(version, str) else None,
    }


class BootHistory:
    """Per-cluster records of earlier boots (newest last), stored as JSON."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, keep: int = 10) -> None:
        """Use `path` (default ~/.local/state/spark-ops/boots.json); keep the last `keep` boots."""
        self.path = Path(path if path is not None else DEFAULT_STATE_PATH).expanduser()
        self.keep = keep

    def load(self) -> dict[str, list[dict[str, Any]]]:
        """All records by cluster; an unreadable file counts as empty (it is only a cache): one
        not regular (a FIFO is never waited on), over MAX_FILE_BYTES, not JSON, nested beyond
        the parser's depth; a record not of the shape `record` writes is left out."""
        try:
            data = read_regular(self.path, limit=MAX_FILE_BYTES)
            if len(data) > MAX_FILE_BYTES:
                raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
            raw = json.loads(data.decode("utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError: a ValueError
            _log().warning("boot_history_unreadable", path=str(self.path), error=str(exc)[:200])
            return {}
        clusters = raw.get("clusters") if isinstance(raw, dict) else None
        if not isinstance(clusters, dict):
            _log().warning("boot_history_unexpected_shape", path=str(self.path))
            return {}
        return {
            str(name): [r for r in map(_record_of, recs) if r is not None]
            for name, recs in clusters.items()
            if isinstance(recs, list)
        }

    def records(self, cluster: str) -> list[dict[str, Any]]:
        """The records of one cluster, oldest first."""
        return self.load().get(cluster, [])

    def previous(self, cluster: str, *, served: bool = False) -> dict[str, Any] | None:
        """The newest record of a cluster (e.g. its KV pool in tokens), or None; `served`: the
        newest boot that served (a failed boot's time is no ETA)."""
        recs = [r for r in self.records(cluster) if not served or boot_served(r)]
        return recs[-1] if recs else None

    def record(self, cluster: str, report: Reported | Mapping[str, Any]) -> dict[str, Any]:
        """Append a boot (a BootReport or its dict) to the cluster's records and save atomically."""
        data: Mapping[str, Any] = report if isinstance(report, Mapping) else report.to_dict()
        durations = {
            str(k): float(v)
            for k, v in dict(data.get("durations") or {}).items()
            if isinstance(v, (int, float))
        }
        entry: dict[str, Any] = {
            "outcome": "ok",
            "at": float(data.get("started_at") or time.time()),
            "total_s": float(data.get("total_s") or sum(durations.values())),
            "durations": durations,
            "skipped": list(data.get("skipped") or []),
            "kv_cache_tokens": data.get("kv_cache_tokens"),
            "kv_cache_memory_bytes": (data.get("non_default_args") or {}).get(
                "kv_cache_memory_bytes"
            ),
            "vllm_version": data.get("vllm_version"),
        }
        return self._append(cluster, entry)

    def record_failed(
        self, cluster: str, *, at: float, total_s: float, phase: str, error: str
    ) -> dict[str, Any]:
        """Append a boot that failed (or passed its deadline): when its wait began, how long it
        ran, the phase it reached and why; `status` shows it, the ETAs skip it."""
        entry: dict[str, Any] = {
            "outcome": "failed",
            "at": float(at),
            "total_s": round(max(0.0, float(total_s)), 3),
            "phase": phase,
            "error": error.splitlines()[0][:300] if error else "",
        }
        return self._append(cluster, entry)

    def _append(self, cluster: str, entry: dict[str, Any]) -> dict[str, Any]:
        """Add one record to the cluster's, keep the last `keep`, save atomically."""
        everything = self.load()
        recs = everything.setdefault(cluster, [])
        recs.append(entry)
        everything[cluster] = recs[-self.keep :]
        self._save(everything)
        return entry

    def estimate(self, cluster: str) -> dict[str, float]:
        """Expected seconds per phase (median of earlier boots that served); empty when none is
        known. A failed boot's phases say nothing of how long a boot takes."""
        per_phase: dict[str, list[float]] = {}
        for rec in self.records(cluster):
            if not boot_served(rec):
                continue
            for phase, secs in (rec.get("durations") or {}).items():
                if (kept := _seconds(secs)) is not None:
                    per_phase.setdefault(phase, []).append(kept)
        order = {p.value: p.rank for p in PHASE_ORDER}
        return {
            phase: statistics.median(values)
            for phase, values in sorted(per_phase.items(), key=lambda kv: order.get(kv[0], 99))
        }

    def _save(self, everything: Mapping[str, Any]) -> None:
        """Write the file with spark-ops' one local writer (temp file, fsyncs, rename)."""
        payload = json.dumps(
            {"version": FORMAT_VERSION, "clusters": everything}, indent=1, sort_keys=True
        )
        try:
            write_file(self.path, payload + "\n", make_parents=True)
        except SparkOpsError as exc:  # only a cache: a boot is not failed for want of its ETA
            _log().warning("boot_history_not_saved", path=str(self.path), error=exc.message)


def boot_served(rec: Mapping[str, Any]) -> bool:
    """Whether a boot record is of a boot that served (records older than `outcome` did)."""
    return rec.get("outcome", "ok") == "ok"


def estimate(cluster: str, *, path: str | os.PathLike[str] | None = None) -> dict[str, float]:
    """Expected seconds per phase for a cluster, from earlier boots."""
    return BootHistory(path).estimate(cluster)


def record(
    cluster: str,
    report: Reported | Mapping[str, Any],
    *,
    path: str | os.PathLike[str] | None = None,
) -> None:
    """Store a finished boot's phase durations for later ETAs."""
    BootHistory(path).record(cluster, report)


def record_failed(
    cluster: str,
    *,
    at: float,
    total_s: float,
    phase: str,
    error: str,
    path: str | os.PathLike[str] | None = None,
) -> None:
    """Store a failed boot: `status` says the last boot failed; the ETAs skip it."""
    BootHistory(path).record_failed(cluster, at=at, total_s=total_s, phase=phase, error=error)


def eta_seconds(
    estimates: Mapping[str, float],
    phase: Phase | str,
    in_phase_s: float,
    remaining: Iterable[Phase | str] | None = None,
) -> float | None:
    """Seconds left: the rest of the current phase plus the phases after it; None if unknown."""
    current = Phase(phase)
    if current is Phase.READY:
        return 0.0
    if not estimates:
        return None
    candidates: list[Phase] = (
        list(PHASE_ORDER) if remaining is None else [Phase(p) for p in remaining]
    )
    after = [p for p in candidates if p.rank > current.rank and p is not Phase.READY]
    left = max(0.0, estimates.get(current.value, 0.0) - in_phase_s)
    return left + sum(estimates.get(p.value, 0.0) for p in after)


def history_key(cluster: Cluster) -> str:
    """The boot history's key for a cluster: its identity (head host and recipe path), not its
    inventory name (the same cluster under two names shares its history; two clusters named
    alike do not)."""
    head = cluster.head
    return f"{head.user or ''}@{head.host}:{head.port}:{cluster.recipe.path}"
