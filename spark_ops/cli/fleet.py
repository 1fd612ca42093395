"""The fleet-wide readings: `status`, `budget`, `doctor` and `log` on every cluster of a fleet.

Each command reads all clusters at once (spark_ops.fleet.across, each cluster within its own
deadline) and shows ONE table with a cluster column; `--json` gives a list with one object per
cluster, `cluster` first. The exit code is the worst of the clusters' (spark_ops.fleet.SEVERITY,
docs/exit-codes.md).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click

from spark_ops.cli.common import emit_json, run_async, when
from spark_ops.cli.doctor import shown
from spark_ops.errors import ExitStatus

if TYPE_CHECKING:
    from spark_ops.doctor import DoctorReport
    from spark_ops.fleet import Fleet, Reading
    from spark_ops.inventory import Cluster
    from spark_ops.watchdog.contract import BudgetView


def table(headers: list[str], rows: list[list[str]]) -> None:
    """Print rows under headers, each column as wide as its widest cell."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    click.secho("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
                bold=True)  # fmt: skip
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _entry(reading: Reading[Any], code: int, key: str, value: Any) -> dict[str, Any]:
    """One cluster's object in the fleet's JSON list: its value under `key`, or its error."""
    out: dict[str, Any] = {
        "cluster": reading.member.name,
        "inventory": reading.member.inventory,
        "exit": code,
    }
    if reading.error is not None:
        out["error"] = reading.error_dict()
    else:
        out[key] = value
    return out


def _code(reading: Reading[Any], ok: int) -> int:
    """A cluster's exit code: its error's, or `ok` (what its value says)."""
    return int(reading.error.exit_status) if reading.error is not None else ok


def _errors(readings: list[Reading[Any]]) -> None:
    """Under the table, each cluster's error and hint (the table says only `error`)."""
    for r in readings:
        if r.error is not None:
            click.secho(f"{r.member.name}: error: {r.error.message}", fg="red")
            if r.error.hint:
                click.echo(f"{r.member.name}: hint: {r.error.hint}")


def _read(fleet: Fleet, read: Any) -> list[Reading[Any]]:
    """Every cluster's reading, read at once."""
    from spark_ops.fleet import across

    return run_async(across(fleet, read))


# status


def status_fleet(fleet: Fleet, as_json: bool, watch: float | None) -> int:
    """`status` on every cluster (once, or every `watch` seconds); the worst exit."""
    import json

    while True:
        from spark_ops.status import collect_status

        readings = _read(fleet, collect_status)
        codes = [_status_code(r) for r in readings]
        entries = [_entry(r, c, "status", r.value) for r, c in zip(readings, codes, strict=True)]
        if as_json and watch:
            click.echo(json.dumps(entries, default=str))
        elif as_json:
            emit_json(entries)
        else:
            if watch:
                click.clear()
                click.echo(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}  every {watch:g} s; "
                           "Ctrl-C to stop")  # fmt: skip
            echo_status_table(fleet, readings, codes)
        if not watch:
            return _worst(codes)
        time.sleep(watch)


def _status_code(reading: Reading[Any]) -> int:
    """A cluster's status exit: its verdict's (4 when SSH refused a node), or its error's."""
    from spark_ops.cli.status import verdict_exit

    return _code(reading, int(verdict_exit(reading.value or {})))


def echo_status_table(fleet: Fleet, readings: list[Reading[Any]], codes: list[int]) -> None:
    """The fleet's status: one row per cluster, then each cluster's reasons and errors."""
    from spark_ops.sizes import human_share

    rows = []
    for r, code in zip(readings, codes, strict=True):
        if r.error is not None:
            rows.append([r.member.name, "error", "-", "-", "-", "-", str(code)])
            continue
        data = r.value or {}
        nodes = data.get("nodes") or []
        up = sum(1 for n in nodes if n.get("reachable"))
        e = data.get("engine") or {}
        engine = "serving" if e.get("up") else ("booting" if e.get("booting") else "down")
        usage = e.get("kv_cache_usage")
        kv = human_share(usage) if isinstance(usage, int | float) else "?"
        load = f"{_count(e.get('running'))} run, {_count(e.get('waiting'))} wait, KV {kv}"
        b = data.get("budget") or {}
        budget = f"{b['used']}/{b['allowed']}" if "used" in b else "unreadable"
        budget += " PAUSED" if (b.get("pause") or {}).get("state") == "paused" else ""
        budget += " GAVE-UP" if b.get("gave_up") else ""
        verdict = (data.get("verdict") or {}).get("state", "?")
        rows.append([r.member.name, verdict, f"{up}/{len(nodes)}", engine, load, budget,
                     str(code)])  # fmt: skip
    click.secho(f"Fleet {fleet.path}: {len(readings)} clusters", bold=True)
    table(["CLUSTER", "VERDICT", "NODES", "ENGINE", "LOAD", "BUDGET", "EXIT"], rows)
    for r in readings:
        for reason in ((r.value or {}).get("verdict") or {}).get("reasons") or []:
            click.secho(f"{r.member.name}: {reason}", fg="yellow")
    _errors(readings)


def _count(value: object) -> str:
    """A gauge as a whole count, or ? when the metrics did not say."""
    return str(round(value)) if isinstance(value, int | float) else "?"


def _worst(codes: list[int]) -> int:
    """The fleet's exit: the worst of its clusters'."""
    from spark_ops.fleet import worst_exit

    return worst_exit(codes)


# budget


async def _budget(cluster: Cluster) -> BudgetView:
    """One cluster's budget, read from its head (as `spark-ops budget` reads it)."""
    from spark_ops.workflows import Operation, budget_view

    async with Operation.open(cluster, "budget", lock=False, nodes=[cluster.head.name]) as op:
        return await budget_view(op)


def budget_fleet(fleet: Fleet, as_json: bool) -> int:
    """`budget` on every cluster; the worst exit (0 when every budget was read)."""
    readings = _read(fleet, _budget)
    codes = [_code(r, int(ExitStatus.OK)) for r in readings]
    if as_json:
        emit_json([_entry(r, c, "budget", r.value.to_dict() if r.value else None)
                   for r, c in zip(readings, codes, strict=True)])  # fmt: skip
        return _worst(codes)
    rows = []
    for r, code in zip(readings, codes, strict=True):
        view = r.value
        if view is None:
            rows.append([r.member.name, "error", "-", "-", "-", str(code)])
            continue
        spent = view.used >= view.allowed
        pause = view.to_dict()["pause"]
        flags = [{"paused": "PAUSED", "lapsed": "LEASE-LAPSED"}[pause["state"]]] if pause else []
        flags += ["GAVE-UP"] if view.gave_up else []
        flags += ["SPENT"] if spent else []
        rows.append([
            r.member.name, f"{view.used}/{view.allowed}", f"{view.window_s / 3600:g} h",
            when(view.next_free_at) if spent else "now", " ".join(flags) or "-", str(code),
        ])  # fmt: skip
    click.secho(f"Fleet {fleet.path}: restart budgets", bold=True)
    table(["CLUSTER", "USED", "WINDOW", "NEXT SLOT", "FLAGS", "EXIT"], rows)
    for r in readings:
        if r.value is not None and r.value.disagreement:
            click.secho(f"{r.member.name}: warning: {r.value.disagreement}", fg="yellow")
    _errors(readings)
    return _worst(codes)


# doctor


def doctor_fleet(fleet: Fleet, as_json: bool) -> int:
    """`doctor` on every cluster; the worst exit (11 when a check failed somewhere)."""
    from spark_ops.doctor import run_doctor

    readings: list[Reading[DoctorReport]] = _read(fleet, run_doctor)
    ok, failed = int(ExitStatus.OK), int(ExitStatus.CHECK_FAILED)
    codes = [_code(r, ok if r.value is None or r.value.ok else failed) for r in readings]
    if as_json:
        emit_json([_entry(r, c, "report", r.value.to_dict() if r.value else None)
                   for r, c in zip(readings, codes, strict=True)])  # fmt: skip
        return _worst(codes)
    rows = []
    for r, code in zip(readings, codes, strict=True):
        if r.value is None:
            rows.append([r.member.name, "-", "-", "-", "error", str(code)])
            continue
        counts = r.value.to_dict()["counts"]
        ready = "ready" if r.value.ok else "NOT READY"
        rows.append([r.member.name, str(counts["ok"]), str(counts["warn"]), str(counts["fail"]),
                     ready, str(code)])  # fmt: skip
    click.secho(f"Fleet {fleet.path}: doctor", bold=True)
    table(["CLUSTER", "OK", "WARN", "FAIL", "APPLY", "EXIT"], rows)
    for r in readings:
        for c in r.value.checks if r.value is not None else ():
            if c.status != "ok":
                color = "red" if c.status == "fail" else "yellow"
                mark = "✗" if c.status == "fail" else "!"
                click.secho(
                    f"{r.member.name}: {mark} {c.name} {c.host}: {shown(c.detail)}", fg=color
                )
                if c.fix:
                    click.echo(f"{r.member.name}:     fix: {shown(c.fix)}")
    _errors(readings)
    return _worst(codes)


# log


def log_fleet(fleet: Fleet, limit: int, as_json: bool) -> int:
    """`log` on every cluster (the last `limit` operations of each), merged by time."""
    from spark_ops.workflows.journal import finite_number
    from spark_ops.workflows.oplog import read_log_operations

    async def read(cluster: Cluster) -> list[dict[str, Any]]:
        """One cluster's last operations."""
        return await read_log_operations(cluster, limit)

    readings = _read(fleet, read)
    codes = [_code(r, int(ExitStatus.OK)) for r in readings]
    if as_json:
        emit_json([_entry(r, c, "entries", r.value) for r, c in zip(readings, codes, strict=True)])
        return _worst(codes)
    from spark_ops.cli.log import entry_line

    lines = []
    for r in readings:
        for e in r.value or []:
            stamp = e.get("started", e.get("when"))
            at = finite_number(stamp) or 0.0
            lines.append((at, r.member.name, entry_line(e)))
    lines.sort(key=lambda x: x[0])
    click.secho(f"Fleet {fleet.path}: the last {limit} operations of each cluster", bold=True)
    if not lines and not any(r.error for r in readings):
        click.echo("The audit logs are empty: no operation has been recorded on any cluster yet.")
        return _worst(codes)
    table(["WHEN", "CLUSTER", "OUTCOME", "OPERATION", "WHO"],
          [[when(at) if at else "-", name, *cells] for at, name, cells in lines])  # fmt: skip
    _errors(readings)
    return _worst(codes)
