"""Checks after a boot, run over SSH: effective args, KV pool, free memory, Xid, stale GPU users.

The parsing and the verdicts live in `spark_ops.verify`; this module gathers the evidence from the
nodes and the engine for a workflow's Operation.
"""

from __future__ import annotations

from contextlib import suppress

from spark_ops import verify
from spark_ops.engine.identity import read_engine
from spark_ops.engine.ranks import old_ranks, unreadable_starts
from spark_ops.errors import SparkOpsError, VerifyError
from spark_ops.remote.programs.engine import GPU_APPS, KERNEL_LOG
from spark_ops.remote.programs.node import MEMINFO
from spark_ops.workflows.converge import effective_args
from spark_ops.workflows.operation import Operation, Outcome
from spark_ops.workflows.plan import Plan


async def verify_boot(op: Operation, plan: Plan, out: Outcome) -> list[verify.Check]:
    """After a good boot: effective args, KV pool, workers' free memory, no new Xid."""
    c = op.cluster
    head = c.head.name
    if out.boot is not None:
        args = out.boot.non_default_args
    else:  # no boot followed (the checks a stopped run owed): the args its engine logged
        args = await effective_args(op.session) or {}
    expected = {k: v for k, v in (plan.facts.knobs_after or {}).items() if v is not None}
    checks = [verify.check_effective_args(args, expected, host=head)]
    after, kv_memory = await kv_cache(op)
    before_kv = (plan.facts.knobs_before or {}).get("kv_cache_memory_bytes")
    checks.append(
        verify.check_kv_pool(
            after,
            out.found.kv_pool_before,
            kv_memory_changed=before_kv != expected.get("kv_cache_memory_bytes"),
            kv_memory_bytes=kv_memory,
            previous_kv_memory_bytes=out.found.kv_memory_before,
            host=head,
        )
    )
    floor = int(c.engine.min_mem_available_gb * 1024**3)
    mem = await op.session.run_all(MEMINFO.line(), [n.name for n in c.workers], check=False)
    for host, res in mem.items():
        if isinstance(res, SparkOpsError):
            checks.append(verify.Check("mem-available", host, "fail", res.message))
        else:
            try:
                info = verify.parse_meminfo(res.stdout)
            except VerifyError as exc:
                checks.append(verify.Check("mem-available", host, "fail", exc.message))
                continue
            checks.append(verify.check_mem_available(info, min_bytes=floor, host=host))
    since = out.found.restart_at
    if since is not None:
        checks.extend(await _xid_checks(op, float(since)))
        checks.extend(await _gpu_process_checks(op, float(since)))
    if c.engine.executor == "mp" and out.boot is not None:  # per rank, where visible
        checks.extend(verify.check_rank_args(out.boot.ranks, expected))
        checks.extend(await _rank_leftover_checks(op, since))
    checks.append(await _still_serving(op, head, followed=out.boot is not None))
    return checks


async def _still_serving(op: Operation, head: str, *, followed: bool) -> verify.Check:
    """A second real completion after the checks: a wedged multi-node engine fails it.
    `followed`: this run saw the engine answer (its boot); a dead run's checks never did."""
    timeout = op.cluster.engine.probe_timeout_s
    async with op.engine(timeout=timeout) as api:
        ok = await api.complete(timeout)
    if ok:
        return verify.Check("still-serving", head, "ok", "a second completion answered")
    if not followed:  # a dead run's restart: this run never saw the engine answer
        return verify.Check(
            "still-serving", head, "fail",
            f"no completion within {timeout:.0f} s: the engine does not serve",
            "run the same command again: an engine down is restarted (spark-ops status)",
        )  # fmt: skip
    return verify.Check(
        "still-serving", head, "fail",
        f"the engine answered once, then no completion within {timeout:.0f} s",
        "a worker may have died after the boot (wedged TP group): spark-ops status, ray status",
    )  # fmt: skip


async def kv_pool(op: Operation) -> int | None:
    """The engine's KV pool in tokens from /metrics (cache_config_info blocks × block size)."""
    return (await kv_cache(op))[0]


async def kv_cache(op: Operation) -> tuple[int | None, int | None]:
    """The engine's KV pool in tokens and the KV cache memory it was started with, from
    /metrics (cache_config_info); None where the engine does not say."""
    async with op.engine() as api:
        snap = await api.metrics()
    return (snap.kv_tokens, snap.kv_memory_bytes) if snap is not None else (None, None)


async def _xid_checks(op: Operation, since: float) -> list[verify.Check]:
    """No Xid kernel line since the restart on any node (journalctl -k, else dmesg)."""
    import datetime as dt

    when = dt.datetime.fromtimestamp(since, dt.timezone.utc)
    cmd = KERNEL_LOG.line(int(since))
    results = await op.session.run_all(cmd, [n.name for n in op.cluster.nodes], check=False)
    checks = []
    for host, res in results.items():
        if isinstance(res, SparkOpsError):
            checks.append(verify.Check("xid", host, "fail", res.message))
            continue
        head, _, body = res.stdout.partition("\n")
        if head.strip() == "SOURCE=none":
            checks.append(
                verify.Check(
                    "xid", host, "ok", "unknown: neither journalctl -k nor dmesg is readable here",
                    "give the ssh user read access to the kernel log (group adm / systemd-journal)",
                )
            )  # fmt: skip
            continue
        boot = None
        if "BOOT=" in head:
            with suppress(ValueError):
                boot = dt.datetime.fromtimestamp(int(head.split("BOOT=")[1]), dt.timezone.utc)
        events = verify.parse_xid_lines(body)
        checks.append(verify.check_no_new_xid(events, since=when, boot_time=boot, host=host))
    return checks


async def _gpu_process_checks(op: Operation, since: float) -> list[verify.Check]:
    """No GPU compute process older than the restart on any node (skipped without nvidia-smi)."""
    results = await op.session.run_all(
        GPU_APPS.line(), [n.name for n in op.cluster.nodes], check=False
    )
    checks = []
    for host, res in results.items():
        if isinstance(res, SparkOpsError) or not res.ok:
            detail = res.message if isinstance(res, SparkOpsError) else res.stderr.strip()
            checks.append(verify.Check("stale-gpu-processes", host, "fail", detail))
            continue
        if res.stdout.startswith("NO_NVIDIA_SMI"):
            continue  # not a GPU node (the embedded cluster): nothing to check
        csv_text, _, ages = res.stdout.partition("---\n")
        starts = {}
        for line in ages.splitlines():
            pid, _, start = line.partition(" ")
            with suppress(ValueError):
                starts[int(pid)] = float(start)
        try:
            apps = verify.parse_compute_apps(csv_text)
        except VerifyError as exc:
            checks.append(verify.Check("stale-gpu-processes", host, "fail", exc.message))
            continue
        checks.append(
            verify.check_no_stale_gpu_processes(apps, starts, restart_at=since, host=host)
        )
    return checks


async def _rank_leftover_checks(op: Operation, since: float | None) -> list[verify.Check]:
    """An engine run as ranks: one `rank-leftovers` check per worker, no engine process there
    older than the restart (the old engine's rank would hold the node's memory)."""
    if since is None:
        return []
    checks = []
    for node, procs in (await read_engine(op.session, op.cluster)).workers.items():
        if isinstance(procs, str):
            checks.append(verify.Check("rank-leftovers", node, "warn", f"not checked: {procs}"))
        elif (why := unreadable_starts(procs)) is not None:
            checks.append(verify.Check("rank-leftovers", node, "warn", f"not checked: {why}"))
        else:
            checks.append(verify.check_rank_leftovers(old_ranks(procs, since), since, host=node))
    return checks
