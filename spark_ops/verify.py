"""Post-boot verification: pure parsers of node output, and checks that return data.

Parsers read text that the caller fetched (over SSH or from fixtures): vLLM's non-default args
and KV cache lines, /proc/meminfo, nvidia-smi compute-apps CSV (GB10 prints `[N/A]` for memory),
kernel Xid lines (journalctl -k and dmesg forms), `ray status` and `ray list nodes --format json`.
Checks turn parsed data into `Check` records; nothing here raises for a failed check.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from spark_ops.errors import VerifyError
from spark_ops.readiness.phases import parse_args_literal


class ParseError(VerifyError):
    """Command output could not be read (names the source and the offending text)."""


@dataclass(frozen=True)
class Check:
    """The outcome of one post-boot check on one host."""

    name: str
    host: str
    ok: bool
    detail: str
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {
            "name": self.name,
            "host": self.host,
            "ok": self.ok,
            "detail": self.detail,
            "fix": self.fix,
        }


# ---- vLLM log lines -----------------------------------------------------------------------------

_NON_DEFAULT_RE = re.compile(r"non-default args:\s*(\{.*)$", re.M)
_KV_TOKENS_RE = re.compile(r"\b(?:GPU|CPU|XPU|TPU)?\s*KV cache size:\s*([\d,]+)\s+tokens")


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
    matches = _KV_TOKENS_RE.findall(text)
    return int(matches[-1].replace(",", "")) if matches else None


_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_cache_config_info(metrics_text: str) -> dict[str, str]:
    """Labels of the `vllm:cache_config_info` gauge in /metrics (kv_cache_memory_bytes, ...)."""
    for line in metrics_text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            body = line[line.index("{") + 1 : line.rindex("}")]
            return dict(_LABEL_RE.findall(body))
    return {}


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
_RAY_RES_RE = re.compile(r"^\s*(?P<used>[\d.]+)/(?P<total>[\d.]+)\s+(?P<name>\S+)\s*$")


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


# ---- checks -------------------------------------------------------------------------------------


def _key(name: str) -> str:
    """'--max-num-seqs' / 'max-num-seqs' -> 'max_num_seqs'."""
    return name.lstrip("-").replace("-", "_")


def _same(actual: Any, expected: Any) -> bool:
    """Equal, allowing '64' == 64, 64.0 == 64 and 'true' == True (recipe values are text)."""
    if actual == expected and type(actual) is type(expected):
        return True
    if isinstance(expected, bool) or isinstance(actual, bool):

        def as_bool(v: Any) -> bool | None:
            """Read a bool from a bool or a true/false string."""
            if isinstance(v, bool):
                return v
            text = str(v).strip().lower()
            return True if text == "true" else False if text == "false" else None

        return as_bool(actual) is not None and as_bool(actual) == as_bool(expected)
    try:
        return float(actual) == float(expected)
    except (TypeError, ValueError):
        return str(actual) == str(expected)


def check_effective_args(
    actual: Mapping[str, Any], expected: Mapping[str, Any], *, host: str = ""
) -> Check:
    """The engine's non-default args carry the recipe's expected values."""
    args = {_key(k): v for k, v in actual.items()}
    wrong: list[str] = []
    for name, want in expected.items():
        key = _key(name)
        if key not in args:
            if want in (False, None):
                continue  # a default the engine does not list
            wrong.append(f"{key}: expected {want!r}, not among the non-default args")
        elif not _same(args[key], want):
            wrong.append(f"{key}: expected {want!r}, engine has {args[key]!r}")
    if wrong:
        return Check(
            "effective-args",
            host,
            False,
            "; ".join(wrong),
            "the engine did not get the recipe's flags: check the rendered command "
            "(spark-ops recipe show) and that the restart used the edited recipe",
        )
    shown = ", ".join(f"{_key(k)}={args.get(_key(k))!r}" for k in expected)
    return Check(
        "effective-args", host, True, f"as expected: {shown}" if shown else "nothing expected"
    )


def check_kv_pool(
    tokens: int | None,
    previous_tokens: int | None,
    *,
    kv_memory_changed: bool = False,
    kv_memory_bytes: int | None = None,
    previous_kv_memory_bytes: int | None = None,
    host: str = "",
) -> Check:
    """The KV pool in tokens equals the previous boot's unless the KV cache memory was changed.

    The change is told directly (`kv_memory_changed`) or by both boots' --kv-cache-memory-bytes.
    """
    if kv_memory_bytes is not None and previous_kv_memory_bytes is not None:
        kv_memory_changed = kv_memory_changed or kv_memory_bytes != previous_kv_memory_bytes
    if tokens is None:
        return Check(
            "kv-pool",
            host,
            False,
            "no `KV cache size: N tokens` line in the engine log",
            "read the engine log around KV cache allocation (it may be incomplete)",
        )
    if previous_tokens is None:
        return Check("kv-pool", host, True, f"{tokens:,} tokens (no earlier boot to compare)")
    if kv_memory_changed:
        return Check(
            "kv-pool",
            host,
            True,
            f"{tokens:,} tokens (was {previous_tokens:,}; KV cache memory was changed)",
        )
    if tokens == previous_tokens:
        return Check("kv-pool", host, True, f"{tokens:,} tokens, same as the previous boot")
    return Check(
        "kv-pool",
        host,
        False,
        f"{tokens:,} tokens, previous boot had {previous_tokens:,} with the same KV cache memory",
        "check that --kv-cache-memory-bytes reached the engine (non-default args) and that no "
        "leftover process holds memory on a node",
    )


def _gib(n: int) -> str:
    """Bytes as GiB with one decimal."""
    return f"{n / 1024**3:.1f} GiB"


def check_mem_available(
    meminfo: Mapping[str, int] | int, *, min_bytes: int, host: str = ""
) -> Check:
    """A node's MemAvailable (unified memory on GB10) is above a threshold."""
    available = meminfo if isinstance(meminfo, int) else meminfo.get("MemAvailable")
    if available is None:
        return Check(
            "mem-available",
            host,
            False,
            "no MemAvailable in /proc/meminfo",
            "read /proc/meminfo on the node by hand (kernel older than 3.14?)",
        )
    detail = f"MemAvailable {_gib(available)} (minimum {_gib(min_bytes)})"
    if available >= min_bytes:
        return Check("mem-available", host, True, detail)
    return Check(
        "mem-available",
        host,
        False,
        detail,
        "memory is short: look for leftover GPU processes (nvidia-smi --query-compute-apps) "
        "and page cache pressure; lower --kv-cache-memory-bytes if the boot took it all",
    )


def check_no_new_xid(
    events: Iterable[XidEvent],
    *,
    since: datetime,
    boot_time: datetime | None = None,
    host: str = "",
) -> Check:
    """No Xid event at or after `since` (the restart); undated events count as new."""
    new: list[XidEvent] = []
    undated = 0
    for event in events:
        when = event.when(boot_time)
        if when is None:
            undated += 1
            new.append(event)
        elif when >= since:
            new.append(event)
    if not new:
        return Check("xid", host, True, f"no Xid since {since.isoformat()}")
    codes = ", ".join(sorted({f"{e.code} ({e.name})" for e in new}))
    detail = f"{len(new)} Xid event(s) since {since.isoformat()}: {codes}"
    if undated:
        detail += f"; {undated} could not be dated (give the node's boot time for dmesg lines)"
    return Check(
        "xid",
        host,
        False,
        detail,
        "read `journalctl -k | grep Xid` on the node; 79/119/120 usually need a reboot of the "
        "node, repeated 13/31/43 under load point at the driver or the kernel flags",
    )


def _epoch(value: float | datetime) -> float:
    """A datetime or Unix time as Unix time."""
    return value.timestamp() if isinstance(value, datetime) else float(value)


def check_no_stale_gpu_processes(
    apps: Iterable[ComputeApp],
    start_times: Mapping[int, float | datetime],
    *,
    restart_at: float | datetime,
    host: str = "",
) -> Check:
    """No GPU process started before the restart (it would hold memory of an earlier boot)."""
    cutoff = _epoch(restart_at)
    stale: list[str] = []
    unknown: list[int] = []
    count = 0
    for app in apps:
        count += 1
        started = start_times.get(app.pid)
        if started is None:
            unknown.append(app.pid)
        elif _epoch(started) < cutoff:
            stale.append(f"{app.pid} {app.process_name}")
    note = f"; start time unknown for pid {', '.join(map(str, unknown))}" if unknown else ""
    if stale:
        return Check(
            "stale-gpu-processes",
            host,
            False,
            f"{len(stale)} GPU process(es) older than the restart: {'; '.join(stale)}{note}",
            "stop them (kill the pids, or restart the container); if memory stays taken, reboot "
            "the node: GPU memory of a failed start is not always freed",
        )
    return Check(
        "stale-gpu-processes",
        host,
        True,
        f"{count} GPU process(es), none older than the restart{note}",
    )


def check_ray_nodes(status: RayStatus, *, expected: int, host: str = "") -> Check:
    """`ray status` lists the expected number of active nodes."""
    if not status.reachable:
        return Check(
            "ray-nodes",
            host,
            False,
            f"Ray head unreachable: {status.error}",
            "start Ray on the head (ray start --head) and check its container",
        )
    if not status.ready:
        return Check("ray-nodes", host, False, "Ray has no cluster status yet", "retry in a few s")
    n = len(status.active)
    if n >= expected:
        return Check("ray-nodes", host, True, f"{n} active node(s) (expected {expected})")
    return Check(
        "ray-nodes",
        host,
        False,
        f"{n} active node(s), expected {expected} (ray status names no missing node; "
        "map IPs with `ray list nodes`)",
        "start Ray on the missing worker (ray start --address=HEAD:6379) with the same network "
        "environment as the others",
    )
