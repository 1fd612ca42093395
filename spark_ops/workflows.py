"""Workflows: apply, planned restart and budget prune. Each builds a Plan, then executes it step by
step.

Nothing here knows about click. The CLI opens an Operation (connections + cluster lock), asks for a
plan, shows it, confirms, then calls the matching execute_* with reporters for steps and boot
events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from spark_ops.errors import (
    AmbiguousStamp,
    BootError,
    RecipeError,
    SparkOpsError,
    VerifyError,
)
from spark_ops.inventory import Cluster
from spark_ops.lock import cluster_lock
from spark_ops.log import get_logger
from spark_ops.plan import FileChange, Plan, StepRunner
from spark_ops.postboot import kv_pool, verify_boot
from spark_ops.remote import ClusterSession, FileWrite, quote_path, sha256
from spark_ops.watchdog.contract import BudgetView, WatchdogContract

StepReporter = Callable[[Any], None]
EventReporter = Callable[[Any], None]


@dataclass
class ApplyOptions:
    """What the operator asked apply (or restart) to do."""

    changes: Sequence[Any] = ()
    vllm_version: str | None = None
    force: bool = False
    drain: bool = True
    drain_timeout_s: float = 120.0
    rollback_on_failure: bool = False
    deadline_s: float | None = None
    reason: str = "planned restart (spark-ops apply)"


@dataclass
class Outcome:
    """What an executed plan did: the plan with step outcomes, boot report, prune and budget."""

    plan: Plan
    ok: bool
    stamp: float | None = None
    pruned: list[float] = field(default_factory=list)
    boot: dict[str, Any] | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)
    budget: dict[str, Any] | None = None
    rolled_back: bool = False
    error: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {
            "ok": self.ok,
            "plan": self.plan.to_dict(),
            "stamp": self.stamp,
            "pruned": self.pruned,
            "boot": self.boot,
            "checks": self.checks,
            "budget": self.budget,
            "rolled_back": self.rolled_back,
            "error": self.error,
        }


class Operation:
    """An open session on a cluster (with the lock when changing it) and what workflows share."""

    def __init__(self, session: ClusterSession, name: str) -> None:
        """Bind a connected session."""
        self.session = session
        self.cluster: Cluster = session.cluster
        self.name = name
        self.watchdog = WatchdogContract(session)
        self.log = get_logger(cluster=self.cluster.name, op=name)
        self._api_url: str | None = None

    @classmethod
    @asynccontextmanager
    async def open(
        cls, cluster: Cluster, name: str, *, lock: bool = True, nodes: Sequence[str] | None = None
    ) -> AsyncIterator[Operation]:
        """Connect to every node (or the named ones), take the cluster lock, yield, release."""
        async with AsyncExitStack() as stack:
            session = await stack.enter_async_context(ClusterSession(cluster))
            await session.connect(nodes)
            if lock:
                await stack.enter_async_context(cluster_lock(session, name))
            yield cls(session, name)

    async def api_url(self) -> str:
        """The engine API's base URL from here: direct, or through a tunnel to the head."""
        if self._api_url is None:
            eng = self.cluster.engine
            if not eng.tunnel:
                self._api_url = eng.api_url
            else:
                parts = urlsplit(eng.api_url)
                port = parts.port or (443 if parts.scheme == "https" else 80)
                local = await self.session.tunnel(
                    self.cluster.head.name, parts.hostname or "127.0.0.1", port
                )
                self._api_url = f"{parts.scheme}://127.0.0.1:{local}"
        return self._api_url

    def engine(self, timeout: float = 10.0) -> Any:
        """An EngineAPI client bound to the resolved URL (use after api_url())."""
        from spark_ops.engine_api import EngineAPI

        assert self._api_url is not None
        return EngineAPI(self._api_url, timeout=timeout, model=self.cluster.engine.model)

    async def read_recipes(self) -> dict[str, str]:
        """The recipe text on every node that holds it; a missing copy is an error naming it."""
        rs = self.cluster.recipe
        texts = await self.session.gather(
            rs.nodes, lambda h: self.session.read_file(h, rs.path, sudo=True)
        )
        out: dict[str, str] = {}
        for host, text in texts.items():
            if isinstance(text, SparkOpsError):
                raise text
            if text is None:
                raise RecipeError(
                    f"{host}:{rs.path}: recipe not found",
                    hint="check recipe.path and recipe.nodes in the inventory",
                )
            out[host] = text
        return out


def _drift(texts: dict[str, str], path: str) -> list[str]:
    """Diffs between the first node's recipe and every other copy that differs."""
    from spark_ops.recipe import unified_diff

    hosts = list(texts)
    first = hosts[0]
    return [
        unified_diff(texts[first], texts[h], f"{h}:{path} vs {first}")
        for h in hosts[1:]
        if texts[h] != texts[first]
    ]


async def plan_apply(op: Operation, opts: ApplyOptions) -> Plan:
    """Read the recipe everywhere, check drift, edit it, and lay out the steps of apply."""
    from spark_ops.recipe import edit_recipe, knob_values, unified_diff

    cluster = op.cluster
    plan = Plan("apply", cluster.name)
    texts = await op.read_recipes()
    drift = _drift(texts, cluster.recipe.path)
    if drift and not opts.force:
        raise VerifyError(
            f"the recipe differs between nodes {list(texts)}:\n" + "\n".join(drift),
            hint="make the copies agree, or pass --force to overwrite them all with the edit",
        )
    if drift:
        plan.warnings.append(f"recipe copies differed on {len(drift)} node(s); --force given")
    version = opts.vllm_version or await _engine_version(op)
    plan.facts["vllm_version"] = version
    for host, text in texts.items():
        source = f"{host}:{cluster.recipe.path}"
        edit = edit_recipe(text, list(opts.changes), source=source, vllm_version=version)
        for w in edit.warnings:
            if w not in plan.warnings:
                plan.warnings.append(w)
        if edit.text != text:
            plan.changes.append(
                FileChange(
                    host, cluster.recipe.path, sha256(text),
                    unified_diff(text, edit.text, source), edit.text, text,
                )
            )  # fmt: skip
    head_text = texts.get(cluster.head.name, next(iter(texts.values())))
    plan.facts["knobs_before"] = _jsonable(knob_values(head_text, source="recipe"))
    new_text = next((c.new_text for c in plan.changes), head_text)
    plan.facts["knobs_after"] = _jsonable(knob_values(new_text, source="recipe"))
    if not plan.changes:
        return plan
    warning = await _kv_capacity(op, new_text)
    if warning:
        plan.warnings.append(warning)
    _restart_steps(plan, op, write=True, drain=opts.drain)
    return plan


async def _kv_capacity(op: Operation, recipe_text: str) -> str | None:
    """Warn when max_num_seqs full-length sequences cannot fit the running engine's KV pool."""
    from spark_ops.recipe import render_recipe

    try:
        args = render_recipe(recipe_text, source="recipe").args()
        seqs, length = int(str(args["max_num_seqs"])), int(str(args["max_model_len"]))
    except (KeyError, TypeError, ValueError, SparkOpsError):
        return None
    try:
        pool = await kv_pool(op)
    except SparkOpsError:
        pool = None
    if pool is None or seqs * length <= pool:
        return None
    return (
        f"KV pool of the running engine: {pool:,} tokens, room for {pool // length} sequences of "
        f"the full {length:,} tokens; max_num_seqs {seqs} admits more, so long requests will wait "
        "or be preempted (short ones still run concurrently)"
    )


async def plan_restart(op: Operation, opts: ApplyOptions) -> Plan:
    """Lay out a planned maintenance restart: no recipe change, same wait and prune."""
    from spark_ops.recipe import knob_values

    plan = Plan("restart", op.cluster.name)
    texts = await op.read_recipes()
    head_text = texts.get(op.cluster.head.name, next(iter(texts.values())))
    plan.facts["knobs_before"] = plan.facts["knobs_after"] = _jsonable(
        knob_values(head_text, source="recipe")
    )
    _restart_steps(plan, op, write=False, drain=opts.drain)
    return plan


async def list_backups(op: Operation) -> dict[str, list[str]]:
    """The recipe's backups on every node that holds it, oldest first."""
    path = op.cluster.recipe.path
    cmd = f"ls -1 -- {quote_path(path)}.bak.* 2>/dev/null | grep -v '[.]part$' | sort || true"
    found = await op.session.run_all(cmd, op.cluster.recipe.nodes, check=False, sudo=True)
    out: dict[str, list[str]] = {}
    for host, res in found.items():
        if isinstance(res, SparkOpsError):
            raise res
        out[host] = [line for line in res.stdout.splitlines() if line.strip()]
    return out


async def plan_rollback(op: Operation, opts: ApplyOptions, to: str | None = None) -> Plan:
    """Plan restoring the latest recipe backup (or the one whose name holds `to`) everywhere."""
    from spark_ops.recipe import knob_values, unified_diff

    plan = Plan("rollback", op.cluster.name)
    texts = await op.read_recipes()
    backups = await list_backups(op)
    for host, names in backups.items():
        chosen = [b for b in names if to is None or to in b.rsplit(".bak.", 1)[-1]]
        if not chosen:
            raise RecipeError(
                f"{host}:{op.cluster.recipe.path}: no backup"
                + (f" matching {to!r}" if to else "")
                + (f"; backups are {[b.rsplit('.bak.', 1)[-1] for b in names]}" if names else ""),
                hint="spark-ops rollback --list shows them",
            )
        backup_text = await op.session.read_file(host, chosen[-1], sudo=True)
        assert backup_text is not None
        current = texts[host]
        plan.facts.setdefault("backups", {})[host] = chosen[-1]
        if backup_text != current:
            diff = unified_diff(current, backup_text, f"{host}:{op.cluster.recipe.path}")
            plan.changes.append(
                FileChange(
                    host, op.cluster.recipe.path, sha256(current), diff, backup_text, current
                )
            )
    head_text = texts.get(op.cluster.head.name, next(iter(texts.values())))
    plan.facts["knobs_before"] = _jsonable(knob_values(head_text, source="recipe"))
    new_text = next((c.new_text for c in plan.changes), head_text)
    plan.facts["knobs_after"] = _jsonable(knob_values(new_text, source="recipe"))
    if plan.changes:
        _restart_steps(plan, op, write=True, drain=opts.drain)
    return plan


def _restart_steps(plan: Plan, op: Operation, *, write: bool, drain: bool) -> None:
    """The common steps of a planned restart."""
    c = op.cluster
    head = [c.head.name]
    if write:
        hosts = [ch.host for ch in plan.changes]
        plan.add("write", f"write the recipe atomically (backup kept) on {', '.join(hosts)}", hosts)
    if drain:
        plan.add(
            "drain", "wait for in-flight requests to finish (vllm:num_requests_running → 0)", head
        )
    plan.add("restart", f"force a restart through the watchdog: {c.watchdog.restart_command}", head)
    plan.add(
        "boot",
        "follow the boot until a real completion answers "
        f"(deadline {c.engine.boot_deadline_s:.0f} s)",
        head,
    )
    plan.add("prune", "remove exactly the stamp this planned restart wrote from the history", head)
    plan.add(
        "verify", "check effective args, KV pool, free memory, Xid lines", [n.name for n in c.nodes]
    )
    plan.add("budget", "report the restart budget", head)


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    """Make knob values JSON-friendly."""
    return {
        k: (v if isinstance(v, str | int | float | bool) or v is None else str(v))
        for k, v in values.items()
    }


async def _engine_version(op: Operation) -> str | None:
    """The running engine's vLLM version, or None when it does not answer quickly."""
    try:
        await op.api_url()
        async with op.engine(timeout=5) as api:
            return await api.version()
    except SparkOpsError:
        return None


async def execute(
    op: Operation,
    plan: Plan,
    opts: ApplyOptions,
    *,
    on_step: StepReporter | None = None,
    on_event: EventReporter | None = None,
) -> Outcome:
    """Run an apply or restart plan step by step; the audit log on the head records the outcome."""
    out = Outcome(plan, ok=False)
    failure: BaseException | None = None
    try:
        await _execute(op, plan, opts, out, StepRunner(plan, on_step), on_event)
    except BaseException as exc:
        failure = exc
        raise
    finally:
        await _audit(op, audit_entry(plan, opts, out, failure))
    return out


def audit_entry(plan: Plan, opts: Any, out: Any, failure: BaseException | None) -> dict[str, Any]:
    """The audit entry of an executed plan."""
    from spark_ops import audit

    return audit.entry_for(plan, opts, out, error=failure)


async def _audit(op: Operation, entry: dict[str, Any]) -> None:
    """Append to the head's audit log; a failure to do so is logged, never raised."""
    from spark_ops import audit

    try:
        await audit.record(op.session, entry)
    except SparkOpsError as exc:
        op.log.warning("audit log not written", error=exc.message)


async def _execute(
    op: Operation,
    plan: Plan,
    opts: ApplyOptions,
    out: Outcome,
    run: StepRunner,
    on_event: EventReporter | None,
) -> None:
    """The steps of apply / restart; our stamp is pruned even if the boot fails."""
    steps = {s.name for s in plan.steps}
    await op.api_url()
    if "write" in steps:
        run.start("write")
        writes = [
            FileWrite(ch.host, ch.path, ch.new_text, ch.old_sha, op.cluster.recipe.keep_backups)
            for ch in plan.changes
        ]
        done = await op.session.write_atomic(writes)
        run.finish("write", "; ".join(f"{d.host}: backup {d.backup}" for d in done))
    try:
        try:
            await _restart_and_wait(op, plan, run, out, opts, on_event)
            out.ok = True
        except BootError as exc:
            out.error = exc.to_dict()
            if not (opts.rollback_on_failure and plan.changes):
                raise
            await _rollback(op, plan, run, out, opts, on_event)
        if out.ok:
            out.checks = await verify_boot(op, plan, run, out)
    finally:
        out.budget = await _budget_step(op, run, plan)


async def _restart_and_wait(
    op: Operation,
    plan: Plan,
    run: StepRunner,
    out: Outcome,
    opts: ApplyOptions,
    on_event: EventReporter | None,
    *,
    suffix: str = "",
) -> None:
    """Drain, trigger, follow the boot, and prune this restart's stamp whatever the boot did."""
    from spark_ops.readiness import record as record_boot
    from spark_ops.readiness import wait_for_boot

    c = op.cluster
    steps = {s.name for s in plan.steps}
    if "drain" in steps and not suffix:
        run.start("drain")
        async with op.engine() as api:
            drained = await api.drain(opts.drain_timeout_s)
        run.finish("drain", _drain_text(drained), "done" if drained["drained"] else "skipped")
    before = await op.watchdog.stamps()
    start_at = await _log_offset(op)
    if not suffix:
        plan.facts["kv_pool_before"] = await kv_pool(op)
    run.start("restart" + suffix)
    trigger = await op.watchdog.trigger(opts.reason)
    plan.facts["restart_at"] = trigger.before
    stamp: float | None = None
    stamp_error: SparkOpsError | None = None
    try:
        stamp = await op.watchdog.identify(trigger, before)
    except AmbiguousStamp as exc:
        stamp_error = exc
    run.finish("restart" + suffix, f"stamp {stamp}" if stamp is not None else "no stamp identified")
    out.stamp = stamp
    run.start("boot" + suffix)
    boot_error: BaseException | None = None
    try:
        lines = _follow_log(op, start_at)
        async with op.engine(timeout=c.engine.probe_timeout_s) as api:
            report = await wait_for_boot(
                lines,
                probe=lambda: api.complete(c.engine.probe_timeout_s),
                health=api.health,
                deadline_s=opts.deadline_s or c.engine.boot_deadline_s,
                on_event=on_event,
                worker_stall_s=c.engine.worker_stall_s,
                probe_timeout_s=c.engine.probe_timeout_s,
                source_end_fatal=start_at is not None,
            )
        out.boot = report.to_dict()
        record_boot(c.name, report)
        run.finish("boot" + suffix, f"ready in {report.total_s:.1f} s")
    except BaseException as exc:
        boot_error = exc
        run.fail("boot" + suffix, getattr(exc, "message", str(exc)))
    finally:
        await _prune_step(op, run, out, stamp, stamp_error, suffix)
    if boot_error is not None:
        raise boot_error


async def _prune_step(
    op: Operation,
    run: StepRunner,
    out: Outcome,
    stamp: float | None,
    stamp_error: SparkOpsError | None,
    suffix: str,
) -> None:
    """Remove exactly our stamp; say why when none can be removed."""
    name = "prune"
    if suffix and f"prune{suffix}" in {s.name for s in run.plan.steps}:
        name += suffix
    run.start(name)
    if stamp_error is not None:
        run.fail(name, stamp_error.message + (f" ({stamp_error.hint})" if stamp_error.hint else ""))
        raise stamp_error
    if stamp is None:
        run.skip(name, "the watchdog left no new stamp: nothing to prune")
        return
    result = await op.watchdog.prune(stamps=[stamp], reason=f"planned restart ({op.name})")
    removed = result["removed_stamps"]
    out.pruned.extend(removed)
    run.finish(name, f"removed {removed}; backup {result.get('backup')}")


async def _budget_step(op: Operation, run: StepRunner, plan: Plan) -> dict[str, Any] | None:
    """Report the budget as the head sees it now."""
    if "budget" not in {s.name for s in plan.steps}:
        return None
    run.start("budget")
    try:
        view = await op.watchdog.budget()
    except SparkOpsError as exc:
        run.fail("budget", exc.message)
        return None
    run.finish("budget", f"{view.used}/{view.allowed} used in the window")
    return view.to_dict()


async def _rollback(
    op: Operation,
    plan: Plan,
    run: StepRunner,
    out: Outcome,
    opts: ApplyOptions,
    on_event: EventReporter | None,
) -> None:
    """Restore the recipe as it was before, restart, wait, prune again."""
    for name, desc in (
        ("rollback", "restore the previous recipe on every node"),
        ("restart-rollback", "force a restart with the previous recipe"),
        ("boot-rollback", "follow the boot of the previous recipe"),
        ("prune-rollback", "remove the rollback restart's stamp"),
    ):
        plan.add(name, desc, [op.cluster.head.name])
    run.start("rollback")
    writes = [
        FileWrite(
            ch.host, ch.path, ch.old_text, sha256(ch.new_text), op.cluster.recipe.keep_backups
        )
        for ch in plan.changes
    ]
    await op.session.write_atomic(writes)
    run.finish("rollback", "previous recipe restored")
    await _restart_and_wait(op, plan, run, out, opts, on_event, suffix="-rollback")
    out.rolled_back = True


def _drain_text(d: dict[str, Any]) -> str:
    """One line on what draining waited for."""
    if d.get("running_at_start") == 0:
        return "no request in flight"
    state = "drained" if d.get("drained") else "not drained (timeout)"
    return f"{d.get('running_at_start')} request(s) in flight; {state} after {d.get('seconds')} s"


async def _log_offset(op: Operation) -> int | None:
    """The engine log's current size, so that following starts exactly at the restart."""
    eng = op.cluster.engine
    if eng.log_kind != "file":
        return None
    res = await op.session.run(
        op.cluster.head.name,
        f"stat -c %s -- {quote_path(eng.log_target)} 2>/dev/null || echo 0",
        check=False,
    )
    try:
        return int(res.stdout.strip() or 0)
    except ValueError:
        return 0


async def _follow_log(op: Operation, offset: int | None) -> AsyncIterator[str]:
    """Follow the engine log from the restart on (from a byte offset for plain files)."""
    eng = op.cluster.engine
    if offset is None:
        cmd = eng.follow_command()
    elif eng.pid_file:  # tail ends when the engine process does: an exit is seen at once
        cmd = (
            f"pid=$(cat {quote_path(eng.pid_file)} 2>/dev/null | head -n 1); "
            f'exec tail -s 0.2 -c +{offset + 1} -F ${{pid:+--pid="$pid"}} '
            f"-- {quote_path(eng.log_target)} 2>/dev/null"
        )
    else:
        cmd = f"tail -c +{offset + 1} -F -- {quote_path(eng.log_target)} 2>/dev/null"
    async for line in op.session.stream_lines(op.cluster.head.name, cmd):
        yield line


@asynccontextmanager
async def engine_endpoint(cluster: Cluster) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The engine's URL from here (tunnelled through the head if needed) and the recipe's knobs."""
    from spark_ops.recipe import knob_values

    async with Operation.open(cluster, "bench", lock=False, nodes=[cluster.head.name]) as op:
        url = await op.api_url()
        knobs: dict[str, Any] = {}
        if cluster.head.name in cluster.recipe.nodes:
            text = await op.session.read_file(cluster.head.name, cluster.recipe.path, sudo=True)
            if text is not None:
                knobs = _jsonable(knob_values(text, source=f"{cluster.head.name}:recipe"))
        yield url, knobs


async def budget_view(op: Operation) -> BudgetView:
    """The budget as the head sees it."""
    return await op.watchdog.budget()


async def budget_prune(
    op: Operation,
    *,
    stamps: Sequence[float] = (),
    since: float | None = None,
    until: float | None = None,
    planned: bool = False,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Remove chosen stamps (by value, time range, or the journal's planned entries)."""
    if not stamps and since is None and not planned:
        raise SparkOpsError("choose what to prune: --stamp S, --since T or --planned")
    result = await op.watchdog.prune(
        stamps=list(stamps), since=since, until=until, planned=planned, dry_run=dry_run,
        reason="operator prune",
    )  # fmt: skip
    if not dry_run and result.get("removed_stamps"):
        from spark_ops import audit

        args = {"stamps": list(stamps), "since": since, "until": until, "planned": planned}
        detail = {"removed": result["removed_stamps"], "backup": result.get("backup")}
        entry = audit.make_entry("budget prune", args=args, outcome="ok", detail=detail)
        await _audit(op, entry)
    return result
