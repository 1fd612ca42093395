"""Planning: read the recipe everywhere, check drift, edit, lay out the steps (nothing changes)."""

from __future__ import annotations

import dataclasses
import datetime as dt

from spark_ops.engine.identity import read_engine
from spark_ops.errors import (
    KnobError,
    RecipeError,
    SparkOpsError,
    VerifyError,
)
from spark_ops.headlib.backup import BACKUP_TIME_FORMAT, ROLLED_BACK, backup_tag_of
from spark_ops.recipe import Rendered, edit_recipe, rendered_knobs, unified_diff
from spark_ops.recipe.changes import refuse_unknown_options, requested_flags
from spark_ops.recipe.source import load_recipe_text
from spark_ops.remote import sha256
from spark_ops.watchdog.policy import crash_loop_warning, engine_policy
from spark_ops.workflows.converge import (
    boot_of_dead_run,
    booting_note,
    checks_owed,
    engine_differs,
    plan_settle,
)
from spark_ops.workflows.disruption import lease_description
from spark_ops.workflows.facts import KeysChecked, KeysTrusted
from spark_ops.workflows.gate import check_budget, check_leftovers, check_ranks, check_workers
from spark_ops.workflows.journal import Run
from spark_ops.workflows.operation import ApplyOptions, Operation, jsonable
from spark_ops.workflows.plan import FileChange, OperationKind, Plan, StepKind
from spark_ops.workflows.postboot import kv_pool
from spark_ops.workflows.preflight import preflight
from spark_ops.workflows.prove import add_prove_steps, prove_refusal


def _drift(texts: dict[str, str], path: str) -> list[str]:
    """Diffs between the first node's recipe and every other copy that differs."""
    hosts = list(texts)
    first = hosts[0]
    return [
        unified_diff(texts[first], texts[h], f"{h}:{path} vs {first}")
        for h in hosts[1:]
        if texts[h] != texts[first]
    ]


def _plan(kind: OperationKind, op: Operation, shown: Plan | None) -> Plan:
    """A new plan; planned again under the lock (`shown`), it keeps the renderings of the plan
    shown: a recipe text read again unchanged is not rendered again."""
    plan = Plan(kind, op.cluster.name)
    if shown is not None:
        plan.rendered = shown.rendered
    return plan


async def plan_apply(op: Operation, opts: ApplyOptions, shown: Plan | None = None) -> Plan:
    """Read the recipe everywhere, check drift, edit it, and lay out the steps of apply.

    `shown`: the plan the operator saw; its preflight answer is kept when the command line it
    checked is the same (planning again under the lock then costs no second vLLM start-up), and
    so are its renderings. Each distinct recipe text is rendered once (Plan.rendered): the
    edit's check, the knobs, the key check, preflight and the KV warning share that rendering.
    """
    cluster = op.cluster
    plan = _plan(OperationKind.APPLY, op, shown)
    texts = await op.read_recipes()
    drift = _drift(texts, cluster.recipe.path)
    if drift and not opts.force:
        raise VerifyError(
            f"the recipe differs between nodes {list(texts)}:\n" + "\n".join(drift),
            hint="make the copies agree, or pass --force to overwrite them all with the edit",
        )
    if drift:
        plan.warnings.append(f"recipe copies differed on {len(drift)} node(s); --force given")
    head_text = texts.get(cluster.head.name, next(iter(texts.values())))
    await _check_keys(op, opts, plan, head_text)
    version = opts.vllm_version or await _engine_version(op)
    plan.facts.vllm_version = version
    for host, text in texts.items():
        source = f"{host}:{cluster.recipe.path}"
        edit = edit_recipe(
            text, list(opts.changes), source=source, vllm_version=version, renders=plan.rendered
        )
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
    head_source = f"{cluster.head.name}:{cluster.recipe.path}"
    plan.facts.knobs_before = jsonable(plan.rendered.knobs(head_text, source=head_source))
    new_text = next((c.new_text for c in plan.changes), head_text)
    new_render = plan.rendered.render(new_text, source=head_source)
    plan.facts.knobs_after = jsonable(rendered_knobs(new_render))
    if not plan.changes:
        await _restart_if_needed(op, opts, plan)
        await _settle_and_gate(op, opts, plan)
        return plan
    await _preflight(op, opts, plan, new_text, new_render, shown)
    warning = await _kv_capacity(op, new_render)
    if warning:
        plan.warnings.append(warning)
    _restart_steps(plan, op, opts, write=True)
    if opts.prove is not None:
        _prove_steps(op, opts, plan)
    await _settle_and_gate(op, opts, plan)
    return plan


def _prove_steps(op: Operation, opts: ApplyOptions, plan: Plan) -> None:
    """apply --prove: the measurement steps join the plan; a point bench would refuse is refused."""
    assert opts.prove is not None
    wd = op.cluster.watchdog
    refused = prove_refusal(plan, opts.prove, wd.probe, wd.pause_file)
    if refused is not None:
        raise refused
    add_prove_steps(plan, opts.prove, op.cluster.head.name)


async def _check_keys(op: Operation, opts: ApplyOptions, plan: Plan, head_text: str) -> None:
    """Every --set/--flag key resolved against the serve parser of the head's vLLM (the one the
    recipe's command runs, in its container when it runs in one) before anything is written:
    an unknown option or an abbreviation is refused; so is a key no parser could check, unless
    --trust-keys says to write it unchecked (a parser that answers is always heard)."""
    head = op.cluster.head.name
    source = f"{head}:{op.cluster.recipe.path}"
    defaults = load_recipe_text(head_text, source=source).get("defaults")
    requested = requested_flags(opts.changes, defaults if isinstance(defaults, dict) else {})
    if not requested:
        return
    given = ", ".join(g for g, _ in requested)
    hint = "nothing was written; if you are sure of the names, --trust-keys writes them unchecked"
    try:
        rendered = plan.rendered.render(head_text, source=source)
        found = await preflight(
            op.session, head, rendered.argv, dict(rendered.env),
            how=opts.preflight if opts.preflight != "off" else "auto",
            timeout=opts.preflight_timeout_s, options=True,
        )  # fmt: skip
        why = found.detail if found.options is None else None
    except SparkOpsError as exc:
        found, why = None, exc.message
    if why is not None:  # no parser answered: --trust-keys, and only then, writes them unchecked
        if opts.trust_keys:
            plan.facts.keys = KeysTrusted([g for g, _ in requested], why)
            plan.warnings.append(
                f"--trust-keys: {given} written unchecked (no vLLM parser answered: {why})"
            )
            return
        raise KnobError(f"{source}: cannot check {given} against the head's vLLM: {why}", hint=hint)
    assert found is not None and found.options is not None
    plan.facts.keys = KeysChecked(
        found.vllm_version, found.method, found.detail, found.cached, len(found.options)
    )
    version = str(found.vllm_version)
    parser = (
        f"the sim engine (vLLM {version.removeprefix('sim ')}) on {head}"
        if found.method.endswith("sim")
        else f"vLLM {version} on {head}"
    )
    refuse_unknown_options(requested, found.options, parser)


async def _restart_if_needed(op: Operation, opts: ApplyOptions, plan: Plan) -> None:
    """The recipe holds the content already: plan a restart when the engine runs other values."""
    expected = plan.facts.knobs_after or {}
    why = await engine_differs(op, expected)
    if why is None:
        note = await booting_note(op, expected)
        if note:
            plan.warnings.append(note)
        await _checks_if_owed(op, plan, await checks_owed(op))
        return
    dead = await boot_of_dead_run(op)
    if dead is not None:  # its restart is booting: followed and checked, never restarted again
        plan.warnings.append(
            f"{why}, but run {dead.run} restarted the engine and stopped while it boots (its log "
            "names the engine it replaces until the new one starts): no restart is planned"
        )
        await _checks_if_owed(op, plan, dead)
        return
    plan.facts.restart_needed = why
    plan.warnings.append(
        f"the recipe already holds this content on every node, but {why}: restart needed"
    )
    _restart_steps(plan, op, opts, write=False)


async def _checks_if_owed(op: Operation, plan: Plan, owed: Run | None) -> None:
    """No restart is needed, but `owed`, the run that restarted the engine, stopped before its
    checks (interrupted or killed): plan them, and the budget report, so that the re-run ends."""
    if owed is None:
        return
    plan.facts.checks_owed = owed.run
    plan.warnings.append(
        f"run {owed.run} ({owed.operation}) restarted the engine and stopped before its checks "
        f"(last recorded: {owed.last_step}): this run runs them"
    )
    c = op.cluster
    what = (
        f"verify the restart of run {owed.run}: effective args, KV pool, free memory, Xid lines "
        "(once a boot under way serves)"
    )
    plan.add(StepKind.VERIFY, what, [n.name for n in c.nodes])
    plan.add(StepKind.BUDGET, "report the restart budget", [c.head.name])


async def _preflight(
    op: Operation,
    opts: ApplyOptions,
    plan: Plan,
    new_text: str,
    rendered: Rendered,
    shown: Plan | None,
) -> None:
    """Have the head's own vLLM parse the edited command line (`rendered`: new_text rendered);
    a refusal stops the plan."""
    head = op.cluster.head.name
    source = f"{head}:{op.cluster.recipe.path}"
    digest = sha256(new_text)
    check = shown.facts.preflight if shown is not None else None
    if check is None or check.recipe_sha256 != digest or check.ok is False:
        check = await preflight(
            op.session, head, rendered.argv, dict(rendered.env),
            how=opts.preflight, timeout=opts.preflight_timeout_s,
        )  # fmt: skip
        check.recipe_sha256 = digest
    plan.facts.preflight = check
    if check.ok is False:
        raise KnobError(
            f"{source}: vLLM {check.vllm_version} on {head} refuses the edited command line "
            f"({check.method} check, {check.stage} stage):\n{check.detail}",
            hint="nothing was written and the engine still serves; fix the value and run again",
        )
    if check.ok is None:
        plan.warnings.append(f"preflight: {check.detail}")
    for warning in check.warnings:
        if f"preflight: {warning}" not in plan.warnings:
            plan.warnings.append(f"preflight: {warning}")


async def _kv_capacity(op: Operation, rendered: Rendered) -> str | None:
    """Warn when max_num_seqs full-length sequences cannot fit the running engine's KV pool."""
    try:
        args = rendered.args()
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


async def plan_restart(op: Operation, opts: ApplyOptions, shown: Plan | None = None) -> Plan:
    """Lay out a planned maintenance restart: no recipe change, same wait and prune."""
    plan = _plan(OperationKind.RESTART, op, shown)
    texts = await op.read_recipes()
    head_text = texts.get(op.cluster.head.name, next(iter(texts.values())))
    knobs = jsonable(plan.rendered.knobs(head_text, source="recipe"))
    plan.facts.knobs_before, plan.facts.knobs_after = knobs, dict(knobs)
    _restart_steps(plan, op, opts, write=False)
    await _settle_and_gate(op, opts, plan)
    return plan


async def list_backups(op: Operation) -> dict[str, list[str]]:
    """The recipe's backups spark-ops made on every node that holds it, oldest first."""
    path = op.cluster.recipe.path
    found = await op.session.gather(
        op.cluster.recipe.nodes, lambda h: op.session.backups(h, path, sudo=True)
    )
    out: dict[str, list[str]] = {}
    for host, names in found.items():
        if isinstance(names, SparkOpsError):
            raise names
        out[host] = names
    return out


@dataclasses.dataclass(frozen=True)
class BackupInfo:
    """One recipe backup as `rollback --list` shows it."""

    path: str
    tag: str  # what `rollback --to` matches
    made_at: float | None  # epoch seconds, from the name's UTC time
    before: str  # "apply": the version an apply replaced; "rollback": the one a rollback replaced
    default: bool  # what a plain `spark-ops rollback` restores

    def to_dict(self) -> dict[str, object]:
        """JSON form."""
        return dataclasses.asdict(self)


def describe_backups(names: list[str]) -> list[BackupInfo]:
    """Each backup's time, what made it, and whether a plain rollback restores it (oldest first)."""
    default = rollback_source(names, None)
    out = []
    for name in names:
        tag = backup_tag_of(name)
        stamp = tag.removesuffix(ROLLED_BACK).split("-", 1)[0]
        try:
            made = dt.datetime.strptime(stamp, BACKUP_TIME_FORMAT).replace(tzinfo=dt.timezone.utc)
            made_at: float | None = made.timestamp()
        except ValueError:
            made_at = None
        before = "rollback" if tag.endswith(ROLLED_BACK) else "apply"
        out.append(BackupInfo(name, tag, made_at, before, name == default))
    return out


def rollback_source(names: list[str], to: str | None) -> str | None:
    """The backup a rollback restores: the newest one an apply made, or the newest matching `to`.

    A backup a rollback made (`.rolled-back`, the version rolled away from) is never the default:
    a rollback and its re-run restore the same version and then find nothing to do.
    """
    tags = [(b, backup_tag_of(b)) for b in names]
    if to is not None:
        chosen = [b for b, tag in tags if to in tag]
    else:
        chosen = [b for b, tag in tags if not tag.endswith(ROLLED_BACK)]
    return chosen[-1] if chosen else None


async def plan_rollback(
    op: Operation, opts: ApplyOptions, to: str | None = None, shown: Plan | None = None
) -> Plan:
    """Plan restoring the newest backup an apply made (or the one whose name holds `to`)."""
    plan = _plan(OperationKind.ROLLBACK, op, shown)
    texts = await op.read_recipes()
    found = await list_backups(op)
    backups: dict[str, str] = {}
    for host, names in found.items():
        chosen = rollback_source(names, to)
        if chosen is None:
            raise RecipeError(
                f"{host}:{op.cluster.recipe.path}: no backup"
                + (f" matching {to!r}" if to else "")
                + (f"; backups are {[backup_tag_of(b) for b in names]}" if names else ""),
                hint="spark-ops rollback --list shows them",
            )
        backup_text = await op.session.read_file(host, chosen, sudo=True)
        if backup_text is None:
            raise RecipeError(f"{host}:{chosen}: the backup vanished while planning; run again")
        current = texts[host]
        backups[host] = chosen
        if backup_text != current:
            diff = unified_diff(current, backup_text, f"{host}:{op.cluster.recipe.path}")
            plan.changes.append(
                FileChange(
                    host, op.cluster.recipe.path, sha256(current), diff, backup_text, current
                )
            )
    plan.facts.backups = backups or None
    head_text = texts.get(op.cluster.head.name, next(iter(texts.values())))
    plan.facts.knobs_before = jsonable(plan.rendered.knobs(head_text, source="recipe"))
    new_text = next((c.new_text for c in plan.changes), head_text)
    plan.facts.knobs_after = jsonable(plan.rendered.knobs(new_text, source="recipe"))
    if plan.changes:
        _restart_steps(plan, op, opts, write=True)
    else:
        await _restart_if_needed(op, opts, plan)
    await _settle_and_gate(op, opts, plan)
    return plan


async def _settle_and_gate(op: Operation, opts: ApplyOptions, plan: Plan) -> None:
    """Finish dead runs first (plan_settle); refuse a restart whose boot would fail (a worker
    missing, an earlier engine's rank on a worker, a dead engine's processes holding memory), then
    weigh it against the budget left."""
    await plan_settle(op, plan)
    if plan.has(StepKind.RESTART):
        await check_workers(op, plan)
        reading = await read_engine(op.session, op.cluster)  # once, for the checks below
        check_leftovers(op, reading)  # the head's dead engine's processes (doctor's check)
        check_ranks(plan, reading)  # ranks without Ray: an earlier engine's rank still on a worker
        await check_budget(op, opts, plan, reading)
        loop = crash_loop_warning(await engine_policy(op.session))  # a policy is a watchdog too
        if loop and loop not in plan.warnings:
            plan.warnings.append(loop)


def _restart_steps(plan: Plan, op: Operation, opts: ApplyOptions, *, write: bool) -> None:
    """The common steps of a planned restart."""
    c = op.cluster
    head = [c.head.name]
    if write:
        hosts = [ch.host for ch in plan.changes]
        what = f"write the recipe atomically (backup kept) on {', '.join(hosts)}"
        plan.add(StepKind.WRITE, what, hosts)
    plan.add(StepKind.LEASE, lease_description(c, opts), head)
    if opts.drain:
        what = "wait for in-flight requests to finish (vllm:num_requests_running → 0)"
        plan.add(StepKind.DRAIN, what, head)
    command = op.watchdog.restart_command(opts.reason)
    if c.watchdog.loops_only:  # no forced restart: the launcher's own stop and start
        paused = (
            f", the watchdog paused by {c.watchdog.pause_file}" if c.watchdog.pause_file else ""
        )
        what = f"restart with the launcher (the watchdog only loops{paused}): {command}"
    else:
        what = f"force a restart through the watchdog: {command}"
    plan.add(StepKind.RESTART, what, head)
    plan.add(
        StepKind.BOOT,
        "follow the boot until a real completion answers "
        f"(deadline {opts.deadline_s or c.engine.boot_deadline_s:.0f} s)",
        head,
    )
    what = "remove exactly the stamp this planned restart wrote from the history"
    if c.watchdog.loops_only:
        what = (
            "the launcher writes no stamp: nothing to prune unless the watchdog stamped a "
            "restart of its own during this one (then exactly that stamp)"
        )
    plan.add(StepKind.PRUNE, what, head)
    what = "check effective args, KV pool, free memory, Xid lines"
    plan.add(StepKind.VERIFY, what, [n.name for n in c.nodes])
    plan.add(StepKind.BUDGET, "report the restart budget", head)
    if c.watchdog.pause_file:
        plan.add(StepKind.RELEASE, "end the lease (remove the pause file only if it is ours)", head)


async def _engine_version(op: Operation) -> str | None:
    """The running engine's vLLM version, or None when it does not answer quickly."""
    try:
        await op.api_url()
        async with op.engine(timeout=5) as api:
            return await api.version()
    except SparkOpsError:
        return None
