"""Post-boot checks: parsed node output turned into `Check` records (none raises on a failure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from spark_ops.sizes import human_value
from spark_ops.verify.parse import ComputeApp, RayStatus, XidEvent

STATUSES = ("ok", "warn", "fail")


@dataclass(frozen=True)
class Check:
    """One check on one host: what, where, ok / warn / fail, what was seen, how to fix it.

    The one check record of spark-ops: post-boot verification (here) and `doctor` (doctor/report.py)
    both report in it.
    """

    name: str
    host: str
    status: str
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        """Refuse a status outside ok / warn / fail."""
        if self.status not in STATUSES:
            raise ValueError(f"Check.status must be one of {STATUSES}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        """True unless the check failed (a warning is not a failure)."""
        return self.status != "fail"

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {
            "name": self.name,
            "host": self.host,
            "status": self.status,
            "ok": self.ok,
            "detail": self.detail,
            "fix": self.fix,
        }


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


def _shown(key: str, value: Any) -> str:
    """An arg's value in a check's detail: a byte count in GiB (sizes.human_value), else repr."""
    human = human_value(key, value)
    return human if human != str(value) else repr(value)


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
            wrong.append(f"{key}: expected {_shown(key, want)}, not among the non-default args")
        elif not _same(args[key], want):
            have, wanted = _shown(key, args[key]), _shown(key, want)
            if have != repr(args[key]) or wanted != repr(want):  # in GiB: the bytes too
                have, wanted = f"{have} ({args[key]!r})", f"{wanted} ({want!r})"
            wrong.append(f"{key}: expected {wanted}, engine has {have}")
    if wrong:
        return Check(
            "effective-args",
            host,
            "fail",
            "; ".join(wrong),
            "the engine did not get the recipe's flags: check the rendered command "
            "(spark-ops recipe show) and that the restart used the edited recipe",
        )
    shown = ", ".join(f"{_key(k)}={_shown(_key(k), args.get(_key(k)))}" for k in expected)
    return Check(
        "effective-args", host, "ok", f"as expected: {shown}" if shown else "nothing expected"
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
            "fail",
            "no `KV cache size: N tokens` line in the engine log",
            "read the engine log around KV cache allocation (it may be incomplete)",
        )
    if previous_tokens is None:
        return Check("kv-pool", host, "ok", f"{tokens:,} tokens (no earlier boot to compare)")
    if kv_memory_changed:
        return Check(
            "kv-pool",
            host,
            "ok",
            f"{tokens:,} tokens (was {previous_tokens:,}; KV cache memory was changed)",
        )
    if tokens == previous_tokens:
        return Check("kv-pool", host, "ok", f"{tokens:,} tokens, same as the previous boot")
    return Check(
        "kv-pool",
        host,
        "fail",
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
            "fail",
            "no MemAvailable in /proc/meminfo",
            "read /proc/meminfo on the node by hand (kernel older than 3.14?)",
        )
    detail = f"MemAvailable {_gib(available)} (minimum {_gib(min_bytes)})"
    if available >= min_bytes:
        return Check("mem-available", host, "ok", detail)
    return Check(
        "mem-available",
        host,
        "fail",
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
        return Check("xid", host, "ok", f"no Xid since {since.isoformat()}")
    codes = ", ".join(sorted({f"{e.code} ({e.name})" for e in new}))
    detail = f"{len(new)} Xid event(s) since {since.isoformat()}: {codes}"
    if undated:
        detail += f"; {undated} could not be dated (give the node's boot time for dmesg lines)"
    return Check(
        "xid",
        host,
        "fail",
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
            "fail",
            f"{len(stale)} GPU process(es) older than the restart: {'; '.join(stale)}{note}",
            "stop them (kill the pids, or restart the container); if memory stays taken, reboot "
            "the node: GPU memory of a failed start is not always freed",
        )
    return Check(
        "stale-gpu-processes",
        host,
        "ok",
        f"{count} GPU process(es), none older than the restart{note}",
    )


def check_ray_nodes(status: RayStatus, *, expected: int, host: str = "") -> Check:
    """`ray status` lists the expected number of active nodes."""
    if not status.reachable:
        return Check(
            "ray-nodes",
            host,
            "fail",
            f"Ray head unreachable: {status.error}",
            "start Ray on the head (ray start --head) and check its container",
        )
    if not status.ready:
        return Check("ray-nodes", host, "fail", "Ray has no cluster status yet", "retry in a few s")
    n = len(status.active)
    if n >= expected:
        return Check("ray-nodes", host, "ok", f"{n} active node(s) (expected {expected})")
    return Check(
        "ray-nodes",
        host,
        "fail",
        f"{n} active node(s), expected {expected} (ray status names no missing node; "
        "map IPs with `ray list nodes`)",
        "start Ray on the missing worker (ray start --address=HEAD:6379) with the same network "
        "environment as the others",
    )


def check_rank_leftovers(procs: list[Any], since: float, *, host: str) -> Check:
    """An engine run as ranks: no process of the old engine's rank still runs on a worker
    (it would hold the node's memory into the new boot); `procs` are the worker's engine
    processes that started before the restart at `since`."""
    if not procs:
        return Check("rank-leftovers", host, "ok", "every engine process here started anew")
    stamp = datetime.fromtimestamp(since, tz=timezone.utc).strftime("%H:%M:%S")
    named = ", ".join(p.label() for p in procs)
    groups = " ".join(f"-{g}" for g in sorted({p.pgid for p in procs}))
    return Check(
        "rank-leftovers",
        host,
        "fail",
        f"a rank of the old engine still runs here (started before the restart at {stamp} "
        f"UTC): {named}",
        f"it holds this node's memory: stop it (kill -TERM -- {groups}) and restart",
    )


def check_rank_args(ranks: Mapping[str, Any], expected: Mapping[str, Any]) -> list[Check]:
    """An engine run as ranks: every worker rank's own non-default args carry the recipe's
    values, where its log shows them. vLLM 0.32's headless rank (`vllm serve … --headless`) logs
    no `non-default args:` line: a started rank without one is a warning that names what is not
    visible, never a failure (rank 0's args and the rank's start are checked anyway)."""
    checks = []
    for node, rank in sorted(ranks.items()):
        if not rank.get("started"):
            checks.append(Check("effective-args", node, "fail", "its rank did not start anew"))
        elif not rank.get("non_default_args") and expected:
            checks.append(
                Check(
                    "effective-args", node, "warn",
                    "not visible: its rank started anew, but its log names no non-default args "
                    "(vLLM's headless rank does not print them)",
                    f"read its command line on {node}: ps -ww -eo pid,args | grep -e --headless",
                )
            )  # fmt: skip
        else:
            checks.append(check_effective_args(rank.get("non_default_args", {}), expected,
                                               host=node))  # fmt: skip
    return checks
