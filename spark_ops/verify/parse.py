"""Pure parsers of node output for post-boot verification.

Parsers read text that the caller fetched (over SSH or from fixtures): vLLM's non-default args
and KV cache lines, /proc/meminfo, nvidia-smi compute-apps CSV (GB10 prints `[N/A]` for memory),
kernel Xid lines (journalctl -k and dmesg forms), `ray status` and `ray list nodes --format json`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from spark_ops.engine.metrics import CACHE_CONFIG_INFO, metric_labels
from spark_ops.errors import VerifyError
from spark_ops.readiness.phases import KV_CACHE_SIZE_RE, parse_args_literal


class ParseError(VerifyError):
    """Command output could not be read (names the source and the offending text)."""


# ---- vLLM log lines -----------------------------------------------------------------------------

_NON_DEFAULT_RE = re.compile(r"non-default args:\s*(\{.*)$", re.M)


def parse_non_default_args(text: str) -> dict[str, Any]:
    """The dict of vLLM's `non-default args: {...}` line (the last one in `text`)."""
    matches = _NON_DEFAULT_RE.findall(text)
    if not matches:
        raise ParseError(
            "no `non-default args: {...}` line in the engine log "
            f"(got {len(text.splitlines())} lines)"
        )
    return parse_args_literal(matches[-1])


def parse_kv_cache_tokens(text: str) -> int | None:
    """The KV pool in tokens from the last `GPU/CPU KV cache size: N tokens` line, or None."""
    matches = [m.group("tokens") for m in KV_CACHE_SIZE_RE.finditer(text)]
    return int(matches[-1].replace(",", "")) if matches else None


def parse_cache_config_info(metrics_text: str) -> dict[str, str]:
    """Labels of the `vllm:cache_config_info` gauge in /metrics (kv_cache_memory_bytes, ...)."""
    return metric_labels(metrics_text, CACHE_CONFIG_INFO)


# ---- /proc/meminfo --------------------------------------------------------------------------

_MEMINFO_RE = re.compile(r"^(?P<key>[\w()]+):\s+(?P<value>\d+)(?:\s+(?P<unit>kB))?\s*$")


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as a dict; values with a kB unit are converted to bytes (kB means KiB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = _MEMINFO_RE.match(line.strip())
        if m:
            value = int(m.group("value"))
            out[m.group("key")] = value * 1024 if m.group("unit") else value
    if not out:
        first = text.strip().splitlines()[0] if text.strip() else "(empty)"
        raise ParseError(f"/proc/meminfo: no `Key: value kB` line found (first line: {first!r})")
    return out


# ---- nvidia-smi --query-compute-apps ------------------------------------------------------------


@dataclass(frozen=True)
class ComputeApp:
    """One GPU process as nvidia-smi lists it; memory is None where the GPU cannot say (GB10)."""

    pid: int
    process_name: str
    used_memory_bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        """Serialize."""
        return {
            "pid": self.pid,
            "process_name": self.process_name,
            "used_memory_bytes": self.used_memory_bytes,
        }


_UNKNOWN_VALUES = {"[n/a]", "n/a", "not supported", "[not supported]", "[unknown error]", ""}
_UNITS = {"b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "kb": 1000, "mb": 1000**2}
_MEM_RE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[KMG]?i?B)?$", re.I)
_HEADER_UNIT_RE = re.compile(r"\[(?P<unit>[KMG]?i?B)\]", re.I)


def _memory(value: str, default_unit: str | None) -> int | None:
    """'1234 MiB' or '1234' (unit from the header) as bytes; GB10's '[N/A]' as None."""
    value = value.strip()
    if value.lower() in _UNKNOWN_VALUES:
        return None
    m = _MEM_RE.match(value)
    if not m:
        raise ParseError(f"nvidia-smi compute-apps: memory value {value!r} is not `N MiB` or [N/A]")
    unit = (m.group("unit") or default_unit or "MiB").lower()
    if unit not in _UNITS:
        raise ParseError(f"nvidia-smi compute-apps: unknown memory unit {unit!r}")
    return int(float(m.group("num")) * _UNITS[unit])


def parse_compute_apps(csv_text: str) -> list[ComputeApp]:
    """Rows of `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv[,...]`.

    Accepts output with or without the header and with or without `nounits`.
    """
    apps: list[ComputeApp] = []
    default_unit: str | None = None
    for raw in csv_text.splitlines():
        line = raw.strip()
        if not line or line.lower().startswith("no running"):
            continue
        if line.lower().startswith("pid"):
            unit = _HEADER_UNIT_RE.search(line)
            default_unit = unit.group("unit") if unit else None
            continue
        head, sep, rest = line.partition(",")
        if not sep or not head.strip().isdigit():
            raise ParseError(
                f"nvidia-smi compute-apps: unexpected line {line!r} "
                "(expected `pid, process_name, used_memory`)"
            )
        name, sep, mem = rest.rpartition(",")
        if not sep:
            raise ParseError(f"nvidia-smi compute-apps: line {line!r} has 2 fields, expected 3")
        apps.append(ComputeApp(int(head), name.strip(), _memory(mem, default_unit)))
    return apps


# ---- kernel Xid lines -------------------------------------------------------------------------

XID_NAMES: dict[int, str] = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning",
    62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "Video processor exception",
    74: "NVLink Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
    154: "GPU Recovery Action Changed",
}


@dataclass(frozen=True)
class XidEvent:
    """One `NVRM: Xid` kernel line; dated by wall clock or by seconds since boot (dmesg)."""

    code: int
    pci: str
    message: str
    line: str
    timestamp: datetime | None = None
    uptime_s: float | None = None
    pid: int | None = None
    process: str | None = None

    @property
    def name(self) -> str:
        """NVIDIA's name for the Xid code, or 'Xid N'."""
        return XID_NAMES.get(self.code, f"Xid {self.code}")

    def when(self, boot_time: datetime | None = None) -> datetime | None:
        """Wall-clock time of the event (uptime-dated lines need the node's boot time)."""
        if self.timestamp is not None:
            return self.timestamp
        if self.uptime_s is not None and boot_time is not None:
            return boot_time + timedelta(seconds=self.uptime_s)
        return None

    def to_dict(self) -> dict[str, Any]:
        """Serialize."""
        return {
            "code": self.code,
            "name": self.name,
            "pci": self.pci,
            "message": self.message,
            "timestamp": self.timestamp.isoformat() if self.timestamp else None,
            "uptime_s": self.uptime_s,
            "pid": self.pid,
            "process": self.process,
        }


_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<code>\d+)"
    r"(?:, pid=(?P<pid>'?<?\w+>?'?))?(?:, name=(?P<name>[^,]*))?(?:,\s*(?P<msg>.*))?$"
)
_ISO_TS_RE = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s")
_SYSLOG_TS_RE = re.compile(r"^(?P<ts>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?)\s")
_DMESG_T_RE = re.compile(r"^\[(?P<ts>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]")
_UPTIME_RE = re.compile(r"^\[\s*(?P<up>\d+\.\d+)\]")


def _parse_ts(line: str, year: int, tz: timezone) -> tuple[datetime | None, float | None]:
    """The time of a kernel log line: wall clock (journalctl, dmesg -T) or uptime (dmesg)."""
    if m := _ISO_TS_RE.match(line):
        ts = m.group("ts")
        ts = ts[:-1] + "+00:00" if ts.endswith("Z") else ts
        if re.search(r"[+-]\d{4}$", ts):
            ts = ts[:-2] + ":" + ts[-2:]
        parsed = datetime.fromisoformat(ts)
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=tz)), None
    if m := _SYSLOG_TS_RE.match(line):
        text = " ".join(m.group("ts").split())
        fmt = "%Y %b %d %H:%M:%S.%f" if "." in text else "%Y %b %d %H:%M:%S"
        return datetime.strptime(f"{year} {text}", fmt).replace(tzinfo=tz), None
    if m := _DMESG_T_RE.match(line):
        text = " ".join(m.group("ts").split())
        return datetime.strptime(text, "%a %b %d %H:%M:%S %Y").replace(tzinfo=tz), None
    if m := _UPTIME_RE.match(line):
        return None, float(m.group("up"))
    return None, None


def parse_xid_lines(
    text: str, *, year: int | None = None, tz: timezone = timezone.utc
) -> list[XidEvent]:
    """Xid events from `journalctl -k` (short, short-iso, short-monotonic) or `dmesg [-T]` text.

    journalctl's short format has no year: `year` (default: this year) supplies it; times
    without a zone are taken in `tz` (default UTC).
    """
    year = year if year is not None else datetime.now(tz).year
    events: list[XidEvent] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _XID_RE.search(line)
        if not m:
            continue
        timestamp, uptime = _parse_ts(line, year, tz)
        pid_text = (m.group("pid") or "").strip("'<>")
        name = (m.group("name") or "").strip().strip("<>") or None
        events.append(
            XidEvent(
                code=int(m.group("code")),
                pci=m.group("pci"),
                message=(m.group("msg") or "").strip(),
                line=line,
                timestamp=timestamp,
                uptime_s=uptime,
                pid=int(pid_text) if pid_text.isdigit() else None,
                process=None if name == "unknown" else name,
            )
        )
    return events


# ---- Ray ----------------------------------------------------------------------------------------


@dataclass
class RayStatus:
    """What `ray status` says: reachable at all, and which nodes are active / pending / failed."""

    reachable: bool
    ready: bool  # False for "No cluster status." (Ray still starting)
    active: list[str] = field(default_factory=list)  # node ids (or node types with autoscaler)
    pending: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    reported_at: str | None = None
    resources: dict[str, tuple[float, float]] = field(default_factory=dict)  # name: (used, total)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialize."""
        return {
            "reachable": self.reachable,
            "ready": self.ready,
            "active": self.active,
            "pending": self.pending,
            "failures": self.failures,
            "reported_at": self.reported_at,
            "resources": {k: list(v) for k, v in self.resources.items()},
            "error": self.error,
        }


_RAY_UNREACHABLE = re.compile(
    r"Failed to connect to GCS|Timed out while waiting for GCS|RpcError|"
    r"Could not find any running Ray instance|ConnectionError"
)
_RAY_HEADER_RE = re.compile(r"^=+ Autoscaler status: (?P<ts>.+?) =+$")
_RAY_NODE_RE = re.compile(r"^\s*(?P<count>\d+)\s+(?P<node>\S+)\s*$")
# " 0.0/2.0 vcpu", and with a placement group holding it (real, Ray 2.60):
# " 0.0/2.0 vcpu (0.0 used of 2.0 reserved in placement groups)"
_RAY_RES_RE = re.compile(
    r"^\s*(?P<used>[\d.]+)/(?P<total>[\d.]+)\s+(?P<name>\S+)"
    r"(?:\s+\([\d.]+ used of (?P<reserved>[\d.]+) reserved in placement groups\))?\s*$"
)


def parse_ray_status(text: str) -> RayStatus:
    """Parse `ray status` output (a leading `$ command` line is ignored)."""
    lines = [ln for ln in text.splitlines() if not ln.startswith("$ ")]
    body = "\n".join(lines)
    if "No cluster status." in body:
        return RayStatus(reachable=True, ready=False, error="No cluster status (Ray starting)")
    if _RAY_UNREACHABLE.search(body) and "Node status" not in body:
        last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
        return RayStatus(reachable=False, ready=False, error=last)
    status = RayStatus(reachable=True, ready=True)
    section: str | None = None
    seen_header = False
    for line in lines:
        stripped = line.strip()
        if m := _RAY_HEADER_RE.match(stripped):
            status.reported_at = m.group("ts")
            seen_header = True
            continue
        if stripped in ("Active:", "Pending:", "Recent failures:", "Total Usage:"):
            section = stripped[:-1]
            continue
        if (
            stripped.startswith("Node: ")
            or stripped.startswith("From request_resources")
            or (stripped in ("Resources", "Pending Demands:", "Node status"))
        ):
            section = None
            continue
        if not stripped or stripped.startswith("(") or set(stripped) == {"-"}:
            continue
        if section == "Active" and (m := _RAY_NODE_RE.match(line)):
            status.active.extend([m.group("node")] * int(m.group("count")))
        elif section == "Pending":
            status.pending.append(stripped)
        elif section == "Recent failures":
            status.failures.append(stripped)
        elif section == "Total Usage" and (m := _RAY_RES_RE.match(line)):
            status.resources[m.group("name")] = (float(m.group("used")), float(m.group("total")))
    if not seen_header:
        raise ParseError(
            "ray status: no `Autoscaler status` header and no known error "
            f"(first line: {(lines[0] if lines else '(empty)')!r})"
        )
    return status


@dataclass(frozen=True)
class RayNode:
    """One node of `ray list nodes --format json`."""

    node_id: str
    ip: str
    is_head: bool
    state: str
    state_message: str | None = None
    name: str | None = None

    @property
    def alive(self) -> bool:
        """True when Ray considers the node alive."""
        return self.state.upper() == "ALIVE"

    def to_dict(self) -> dict[str, Any]:
        """Serialize."""
        return {
            "node_id": self.node_id,
            "ip": self.ip,
            "is_head": self.is_head,
            "state": self.state,
            "state_message": self.state_message,
            "name": self.name,
        }


def parse_ray_nodes(json_text: str) -> list[RayNode]:
    """Parse `ray list nodes --format json` (a leading `$ command` line is ignored)."""
    body = "\n".join(ln for ln in json_text.splitlines() if not ln.startswith("$ "))
    try:
        raw = json.loads(body)
    except ValueError as exc:
        raise ParseError(f"ray list nodes: not JSON ({exc}): {body[:80]!r}") from exc
    if not isinstance(raw, list):
        raise ParseError(f"ray list nodes: expected a JSON list, got {type(raw).__name__}")
    nodes = []
    for item in raw:
        if not isinstance(item, dict) or "node_id" not in item or "state" not in item:
            raise ParseError(f"ray list nodes: entry without node_id/state: {item!r:.120}")
        nodes.append(
            RayNode(
                node_id=str(item["node_id"]),
                ip=str(item.get("node_ip") or ""),
                is_head=bool(item.get("is_head_node")),
                state=str(item["state"]),
                state_message=item.get("state_message"),
                name=item.get("node_name"),
            )
        )
    return nodes


def missing_nodes(expected: Mapping[str, str], nodes: Iterable[RayNode]) -> list[str]:
    """Names (from `expected`, name -> IP) of the nodes not ALIVE in `ray list nodes`."""
    alive = {n.ip for n in nodes if n.alive}
    return [name for name, ip in expected.items() if ip not in alive]
