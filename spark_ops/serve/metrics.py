"""/metrics: status, budget, audit and boot data as Prometheus gauges (a registry of its own)."""

from __future__ import annotations

import math
import time
from typing import Any

from spark_ops import __version__
from spark_ops.readiness import PHASE_ORDER
from spark_ops.status import VERDICT_STATES

PREFIX = "spark_ops_"
DEFAULT_CLUSTER = "default"  # the `cluster` label when no name is given
VERDICTS = VERDICT_STATES


def render_metrics(
    status: dict[str, Any],
    boot: dict[str, Any],
    last_run: dict[str, Any] | None,
    doctor: dict[str, Any] | None = None,
    *,
    hardware: dict[str, Any] | None = None,
    load: dict[str, Any] | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> bytes:
    """The Prometheus text page of one reading (status' dict, the live boot, the last run, the last
    doctor report kept here, the nodes' hardware and the engine's load as this server read them).

    Every sample carries a `cluster` label, first: the cluster's fleet name under a fleet, its
    inventory name otherwise (docs/fleet.md), so that one Prometheus scrapes a fleet's servers."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry(auto_describe=False)

    def gauge(name: str, doc: str, value: float | None, **labels: str) -> None:
        """One gauge with one sample; a value not known is left out (absent, not zero)."""
        if value is None:
            return
        g = Gauge(PREFIX + name, doc, ["cluster", *labels], registry=registry)
        g.labels(cluster=cluster, **labels).set(float(value))

    info = Gauge(PREFIX + "build_info", "The spark-ops serving this page (1).",
                 ["cluster", "version"], registry=registry)  # fmt: skip
    info.labels(cluster=cluster, version=__version__).set(1.0)
    nodes = status.get("nodes") or []
    gauge("nodes", "Nodes in the inventory.", len(nodes))
    gauge("nodes_reachable", "Nodes that answered SSH.", sum(1 for n in nodes if n["reachable"]))
    per_node(registry, nodes, hardware, cluster)
    engine = status.get("engine") or {}
    gauge("engine_up", "1 when the engine answers /health.", 1.0 if engine.get("up") else 0.0)
    budget = status.get("budget") or {}
    gauge("budget_readable", "1 when the watchdog's restart history could be read.",
          1.0 if "used" in budget else 0.0)  # fmt: skip
    gauge("budget_used", "Restarts in the watchdog's window.", budget.get("used"))
    gauge("budget_allowed", "Restarts the watchdog allows per window.", budget.get("allowed"))
    gauge("budget_window_seconds", "The watchdog's budget window.", budget.get("window_s"))
    gauge("budget_remaining", "Restarts left in the window now.", budget.get("remaining"))
    gauge("budget_next_free_timestamp_seconds", NEXT_FREE_HELP, next_free(budget))
    if "used" in budget:
        gauge("watchdog_gave_up", "1 when the watchdog gave up.", float(bool(budget["gave_up"])))
        gauge("watchdog_paused", "1 when the watchdog is paused.", float(bool(budget["paused"])))
    runs = status.get("runs") or {}
    if "error" not in runs and runs:
        gauge("lock_held", "1 when a run holds the cluster lock.", float(bool(runs["lock_held"])))
        gauge("unfinished_runs", "Runs that began and never ended.", len(runs["unfinished"]))
    if "leftovers" in engine:
        gauge("leftover_processes", "Processes a dead engine left running.",
              len(engine["leftovers"]))  # fmt: skip
    state = (status.get("verdict") or {}).get("state")
    if state in VERDICTS:
        g = Gauge(PREFIX + "verdict", "status' verdict (1 for the current state).",
                  ["cluster", "state"], registry=registry)  # fmt: skip
        for v in VERDICTS:
            g.labels(cluster=cluster, state=v).set(1.0 if v == state else 0.0)
    last_boot = status.get("last_boot") or {}
    gauge("last_boot_duration_seconds", "The last boot spark-ops watched, start to ready.",
          last_boot.get("total_s"))  # fmt: skip
    gauge("boot_in_progress", "1 while an engine boot is under way.", float(bool(boot["active"])))
    if boot["active"] and boot["phase"]:
        g = Gauge(PREFIX + "boot_phase", "The current boot phase (1 for it).",
                  ["cluster", "phase"], registry=registry)  # fmt: skip
        for p in PHASE_ORDER:
            g.labels(cluster=cluster, phase=p.value).set(1.0 if p.value == boot["phase"] else 0.0)
        gauge("boot_phase_seconds", "Seconds the boot has been in its current phase.",
              boot["seconds_in_phase"])  # fmt: skip
        gauge("boot_phase_usual_seconds", "The current phase's median time in earlier boots.",
              (boot.get("usual_s") or {}).get(boot["phase"]))  # fmt: skip
    if last_run is not None:
        gauge("last_run_success", "1 when the last apply/restart/rollback ended well.",
              float(bool(last_run["ok"])), operation=str(last_run["operation"]))  # fmt: skip
        when = last_run.get("when")
        gauge("last_run_timestamp_seconds", "When the last run ended (head clock).",
              float(when) if isinstance(when, int | float) else None)  # fmt: skip
    report = (doctor or {}).get("report")
    if isinstance(report, dict):
        checks = [c for c in report["checks"] if isinstance(c, dict)]
        gauge("doctor_failed_checks", "Checks that failed in the last doctor run kept here.",
              sum(1 for c in checks if c.get("status") == "fail"))  # fmt: skip
        when = (doctor or {}).get("when")
        gauge("doctor_timestamp_seconds", "When the last doctor run kept here ended.",
              float(when) if isinstance(when, int | float) else None)  # fmt: skip
    gauge("status_timestamp_seconds", "When this reading was taken.", status.get("time"))
    last = fresh_sample(load, bool(engine.get("up")), time.time())
    if last is not None:
        gauge("engine_requests_running", "Requests the engine runs (its last scrape here).",
              last.get("running"))  # fmt: skip
        gauge("engine_requests_waiting", "Requests waiting in the engine (its last scrape here).",
              last.get("waiting"))  # fmt: skip
        gauge("engine_generation_tokens_per_second",
              "Tokens the engine generated per second between two scrapes here (the last two "
              "answered in a row).", latest(load, "tok_s"))  # fmt: skip
    gauge("engine_scrape_timestamp_seconds", "When this server last read the engine's /metrics "
          "(its figures above are exported only while current).",
          (latest(load) or {}).get("at"))  # fmt: skip
    return generate_latest(registry)


NEXT_FREE_HELP = (
    "When a restart slot is free (head clock, as `spark-ops budget` says): while the budget is "
    "spent, when enough counted stamps have left the window for one slot to be free; while a "
    "slot is free, the time the budget was read."
)
STALE_INTERVALS = 2  # a reading older than this many of its intervals is not exported as current


def fresh_sample(load: dict[str, Any] | None, engine_up: bool, now: float) -> dict[str, Any] | None:
    """The engine's last answered scrape when it is current: the engine up now and the scrape
    within STALE_INTERVALS of its interval (else None: an old figure is not the engine's now)."""
    last = latest(load)
    if last is None or not engine_up:
        return None
    interval = (load or {}).get("interval_s")
    span = STALE_INTERVALS * float(interval) if isinstance(interval, int | float) else 0.0
    at = last.get("at")
    if not isinstance(at, int | float) or now - float(at) > span:
        return None
    return last


def next_free(budget: dict[str, Any]) -> float | None:
    """The next free slot's time, true to NEXT_FREE_HELP (None: the budget was not read)."""
    if "used" not in budget:
        return None
    if budget["used"] >= budget.get("allowed", 0):
        at = budget.get("next_free_at")
    else:
        at = budget.get("now")
    return float(at) if isinstance(at, int | float) else None


def latest(load: dict[str, Any] | None, key: str = "") -> Any:
    """The engine's last answered scrape in the load ring (None: none); with `key`, that key's
    newest value that is not None."""
    for sample in reversed((load or {}).get("samples") or []):
        if not isinstance(sample, dict) or sample.get("running") is None:
            continue
        if not key:
            return sample
        if sample.get(key) is not None:
            return sample[key]
    return None


FACTS_STALE_S = 45.0  # node facts (read every 15 s) older than this are not current


def facts_fresh(hardware: dict[str, Any] | None, now: float | None = None) -> bool:
    """The node facts were read within FACTS_STALE_S."""
    at = (hardware or {}).get("time")
    now = time.time() if now is None else now
    return isinstance(at, int | float) and now - float(at) <= FACTS_STALE_S


def per_node(
    registry: Any,
    nodes: list[dict[str, Any]],
    hardware: dict[str, Any] | None,
    cluster: str = DEFAULT_CLUSTER,
) -> None:
    """Per-node gauges, each with `cluster` and `node` labels: reachable, latency, and what the
    node hardware say (MemAvailable, GPU use and power); a value not read is absent."""
    from prometheus_client import Gauge

    known = (hardware or {}).get("nodes") or {}
    specs = (
        ("node_reachable", "1 when the node answered SSH."),
        ("node_ssh_latency_seconds", "The node's SSH round trip."),
        ("node_mem_available_bytes", "The node's MemAvailable (/proc/meminfo)."),
        ("node_gpu_utilization_percent", "The node's GPU use (nvidia-smi)."),
        ("node_gpu_power_watts", "The node's GPU power draw (nvidia-smi)."),
    )
    gauges = {
        name: Gauge(PREFIX + name, doc, ["cluster", "node"], registry=registry)
        for name, doc in specs
    }
    for n in nodes:
        name = str(n.get("name"))
        gauges["node_reachable"].labels(cluster, name).set(1.0 if n.get("reachable") else 0.0)
        if isinstance(n.get("latency_ms"), int | float):
            gauges["node_ssh_latency_seconds"].labels(cluster, name).set(n["latency_ms"] / 1000)
        current = bool(n.get("reachable")) and facts_fresh(hardware)
        f = (known.get(name) or {}) if current else {}  # a stopped node's old facts: not current
        gpu: dict[str, Any] = f["gpu"] if isinstance(f.get("gpu"), dict) else {}
        for metric, value in (("node_mem_available_bytes", f.get("mem_available")),
                              ("node_gpu_utilization_percent", gpu.get("util_pct")),
                              ("node_gpu_power_watts", gpu.get("power_w"))):  # fmt: skip
            if (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
            ):
                gauges[metric].labels(cluster, name).set(float(value))
