"""Cluster status as data: nodes and latency, engine state and load, recipe knobs, budget."""

from __future__ import annotations

import datetime as dt
import math
import time
from typing import Any

from spark_ops.engine.api import CompletionProbe
from spark_ops.engine.identity import read_engine
from spark_ops.engine.instance import stop_hint
from spark_ops.errors import AuthError, HostKeyError, SparkOpsError
from spark_ops.inventory import Cluster
from spark_ops.lock import describe_holder, lock_state
from spark_ops.readiness import BootHistory, history_key, summarize_boot_log
from spark_ops.readiness.eta import boot_served
from spark_ops.recipe import knob_values
from spark_ops.remote import ClusterSession, engine_log_recent
from spark_ops.verify.checks import check_effective_args
from spark_ops.watchdog.loop import no_recovery
from spark_ops.workflows.booting import boot_under_way
from spark_ops.workflows.converge import effective_args
from spark_ops.workflows.journal import Run, holds_lock, read_runs, unfinished_runs
from spark_ops.workflows.operation import Operation

STATUS_PROBE_S = 10.0  # status's completion deadline (engine.probe_timeout_s when shorter)


async def collect_status(cluster: Cluster) -> dict[str, Any]:
    """Gather everything `spark-ops status` shows; unreachable parts are reported, not raised."""
    data: dict[str, Any] = {"cluster": cluster.name, "time": time.time(), "nodes": [], "engine": {}}
    async with ClusterSession(cluster) as session:
        await session.connect(required=False)
        for node in cluster.nodes:
            err = session.errors.get(node.name)
            data["nodes"].append(
                {
                    "name": node.name,
                    "role": node.role,
                    "address": f"{node.host}:{node.port}",
                    "reachable": err is None,
                    "latency_ms": round(session.latency.get(node.name, 0) * 1000, 1)
                    if err is None
                    else None,
                    "error": err.message if err else None,
                    # a key unknown or refused is set-up, not the cluster's state (exit 4)
                    "refused": isinstance(err, HostKeyError | AuthError),
                    "refused_by": type(err).__name__
                    if isinstance(err, HostKeyError | AuthError)
                    else None,
                }
            )
        if cluster.head.name in session.errors:
            data["engine"] = {"up": False, "error": f"the head {cluster.head.name} is unreachable"}
            data["verdict"] = verdict(data)
            return data
        op = Operation(session, "status")
        data["engine"] = await _engine(op)
        try:
            texts = await op.read_recipes()
            head_text = texts.get(cluster.head.name, next(iter(texts.values())))
            data["recipe"] = {
                "path": cluster.recipe.path,
                "knobs": {k: v for k, v in knob_values(head_text, source="recipe").items()},
                "same_on_all_nodes": len(set(texts.values())) == 1,
            }
        except SparkOpsError as exc:
            data["recipe"] = {"path": cluster.recipe.path, "error": exc.message}
        try:
            data["budget"] = (await op.watchdog.budget()).to_dict()
            data["last_restart"] = await op.watchdog.last_restart()
        except SparkOpsError as exc:
            data["budget"] = {"error": exc.message}
        data["runs"] = await _runs(session)
        own = await op.watchdog.own_status()
        data["watchdog_status"] = own.to_dict() if own is not None else None
        args = await effective_args(session)
        if data["engine"].get("up"):
            data["engine"]["effective"] = args
            recipe_vs_engine(data, args, cluster.head.name)
        else:  # the args of an engine that does not serve are not effective
            data["engine"]["effective"] = None
            data["engine"]["last_started_with"] = args
        data["engine"].update(await _instance(session, cluster))
        if not data["engine"].get("up"):
            booting = await _booting(op)
            if booting is not None:
                data["engine"]["booting"] = booting
        data["recovery"] = recovery(cluster, data["engine"])
    data["last_boot"] = last_boot(cluster)
    data["verdict"] = verdict(data)
    return data


# Every state verdict() gives, most urgent first (serve's /metrics has one gauge per state).
VERDICT_STATES = (
    "experimenting", "restarting", "wedged", "not-serving", "degraded", "serving",
)  # fmt: skip


def verdict(data: dict[str, Any]) -> dict[str, Any]:
    """What a script or an alert needs from a status: one state and the reasons for it.

    States, most urgent first: "experimenting" (an experiment holds the lock: restarts and sweeps
    come and go until it ends), "restarting" (another run holds the lock: wait for it),
    "wedged" (/health answers, a 1-token completion does not finish and the token counters stay
    frozen with requests in the engine: NCCL or a Ray worker stuck), "not-serving" (the engine
    does not answer, or a completion does not finish and its counters are unknown), "degraded"
    (it serves, but a node is down, the budget is spent,
    the watchdog paused or gave up, a run never finished, the dead engine left processes, the
    recipe copies differ, or a part could not be read), "serving" (none of these).
    """
    reasons: list[str] = []
    runs = data.get("runs") or {}
    engine = data.get("engine") or {}
    if runs.get("experiment"):
        return {"state": "experimenting", "reasons": [runs["experiment"]]}
    if runs.get("in_progress"):
        return {"state": "restarting", "reasons": [f"a run is under way: {runs['in_progress']}"]}
    down = [n["name"] for n in data.get("nodes") or [] if not n.get("reachable")]
    booting = engine.get("booting") or {}
    if not engine.get("up") and booting and not booting.get("hung"):
        # the watchdog's restart, or a colleague's by hand: wait for it, do not diagnose it
        return {
            "state": "restarting",
            "reasons": [booting_text(booting), *[f"{n} down" for n in down]],
            "next": "spark-ops status --watch 5",
        }
    if not engine.get("up"):
        return not_serving(data, str(engine.get("error") or "the engine does not answer"), down)
    probe = engine.get("completion")
    if isinstance(probe, dict) and not probe.get("ok", True):
        said = CompletionProbe.from_dict(probe).describe()
        if probe.get("wedged"):  # its own state (issue 30 #7): a restart is what it needs
            return {"state": "wedged", "reasons": [said, *[f"{n} down" for n in down]]}
        if not probe.get("progressing"):
            return {"state": "not-serving", "reasons": [said, *[f"{n} down" for n in down]]}
        reasons.append(
            f"busy: {said.removeprefix('wedged: ')} while the engine generated tokens "
            f"({engine.get('running')} running, {engine.get('waiting')} waiting)"
        )
    reasons += [f"{n} down" for n in down]
    budget = data.get("budget") or {}
    if "error" in budget:
        reasons.append(f"watchdog budget unreadable: {budget['error']}")
    elif budget.get("used") is not None and budget["used"] >= budget.get("allowed", 0):
        reasons.append(f"restart budget spent ({budget['used']}/{budget['allowed']})")
    if budget.get("paused"):
        reasons.append("watchdog paused")
    if budget.get("gave_up"):
        reasons.append("watchdog gave up")
    if runs.get("error"):
        reasons.append(f"runs unreadable: {runs['error']}")
    if runs.get("unfinished"):
        reasons.append(f"{len(runs['unfinished'])} unfinished run(s)")
    if engine.get("leftovers"):
        reasons.append("processes left by a dead engine")
    recipe = data.get("recipe") or {}
    if "error" in recipe:
        reasons.append(f"recipe unreadable: {recipe['error']}")
    elif recipe and not recipe.get("same_on_all_nodes", True):
        reasons.append("recipe copies differ between nodes")
    elif recipe.get("differs_from_engine"):
        reasons.append(
            f"the recipe differs from the running engine: {recipe['differs_from_engine']}"
        )
    return {"state": "degraded" if reasons else "serving", "reasons": reasons}


def not_serving(data: dict[str, Any], why: str, down: list[str]) -> dict[str, Any]:
    """The not-serving verdict as one sentence: the engine's silence, its dead process, the
    watchdog's give-up and a spent budget together, and the one command to run next."""
    engine = data.get("engine") or {}
    budget = data.get("budget") or {}
    inst = engine.get("instance") or {}
    reasons = [why]
    booting = engine.get("booting") or {}
    if booting.get("hung"):
        reasons.append(
            f"its instance ({booting.get('instance')}) has run {booting.get('elapsed_s', 0):.0f} s "
            f"without answering, longer than the boot deadline ({booting.get('deadline_s'):g} s): "
            "hung, not booting"
        )
    if data.get("recovery"):
        reasons.append(str(data["recovery"]))  # no watchdog brings it back: the command that does
    if inst and inst.get("alive") is False:
        reasons.append(f"its process (pid {inst.get('pid')}) is gone")
    used, allowed = budget.get("used"), budget.get("allowed", 0)
    spent = isinstance(used, int) and used >= allowed
    if budget.get("gave_up"):
        spent_text = f" (its restart budget spent, {used}/{allowed})" if spent else ""
        reasons.append(f"the watchdog gave up{spent_text}: nothing will restart it")
    elif spent:
        reasons.append(
            f"the restart budget is spent ({used}/{allowed}): the watchdog will not restart it"
        )
    elif budget.get("paused"):
        reasons.append("the watchdog is paused: it will not restart it")
    dead = bool(inst) and inst.get("alive") is False
    alone = bool(data.get("recovery"))  # a watchdog that reads a missing engine as stopped
    if dead and isinstance(used, int) and not spent and not budget.get("paused") and not alone:
        reasons.append(f"the watchdog restarts it ({used}/{allowed} of its budget used)")
    reasons += [f"{n} down" for n in down]
    if down:
        then = "spark-ops doctor"
    elif spent or budget.get("gave_up"):
        then = "spark-ops restart --over-budget"
    elif dead and (budget.get("paused") or alone):
        then = "spark-ops restart"
    elif dead:
        then = "spark-ops status --watch 5"
    else:
        then = "spark-ops doctor"
    return {"state": "not-serving", "reasons": reasons, "next": then}


def booting_text(booting: dict[str, Any]) -> str:
    """A boot under way in words: "booting, phase X, N s, ETA M s" and which instance."""
    parts = ["booting"]
    if booting.get("phase"):
        parts.append(f"phase {booting['phase']}")
    elapsed = booting.get("elapsed_s")
    if isinstance(elapsed, int | float):
        parts.append(f"{elapsed:.0f} s")
    eta = booting.get("eta_s")
    parts.append(
        f"ETA {eta:.0f} s" if isinstance(eta, int | float) else "ETA unknown (no earlier boot)"
    )
    return ", ".join(parts) + f" (the engine {booting.get('instance')} does not answer yet)"


async def _booting(op: Operation) -> dict[str, Any] | None:
    """The boot under way on the head (workflows.booting's rule: the engine's instance runs and
    its API does not answer), with the phase its log has reached; `hung` past the boot deadline."""
    boot = await boot_under_way(op)
    if boot is None:
        return None
    out = boot.to_dict()
    deadline = op.cluster.engine.boot_deadline_s
    out["deadline_s"] = deadline
    out["hung"] = boot.elapsed_s is not None and boot.elapsed_s >= deadline
    out["phase"] = None
    try:
        res = await op.session.run(
            op.cluster.head.name, engine_log_recent(op.cluster.engine, 2000),
            check=False, timeout=20,
        )  # fmt: skip
        out["phase"] = summarize_boot_log(res.stdout)["phase"] if res.stdout.strip() else None
    except SparkOpsError:
        pass  # the phase is unknown; the boot is still one
    return out


def recovery(cluster: Cluster, engine: dict[str, Any]) -> str | None:
    """What brings a crashed engine back when the watchdog will not (None: it will, or the
    engine serves, or its instance could not be read)."""
    instance = engine.get("instance")
    if engine.get("up") or "leftovers_error" in engine:
        return None
    if isinstance(instance, dict) and instance.get("alive", True):
        return None  # an engine runs (booting, or wedged): the watchdog's to judge
    if cluster.watchdog.restarts_missing_engine:
        return None
    return no_recovery(cluster.watchdog.restart_command)


def recipe_vs_engine(data: dict[str, Any], args: dict[str, Any] | None, head: str) -> None:
    """Note in data["recipe"] where the recipe's knobs and the serving engine's args differ (an
    edit nobody restarted for: issue 34); nothing when either is unknown."""
    recipe = data.get("recipe") or {}
    knobs = recipe.get("knobs")
    if args is None or not isinstance(knobs, dict) or not recipe.get("same_on_all_nodes", True):
        return
    check = check_effective_args(args, {k: v for k, v in knobs.items() if v is not None}, host=head)
    if not check.ok:
        recipe["differs_from_engine"] = check.detail


async def _runs(session: ClusterSession) -> dict[str, Any]:
    """The lock's holder (a run under way) and the runs that began and never ended."""
    try:
        held, holder, _ = await lock_state(session)
        every = await read_runs(session)
    except SparkOpsError as exc:
        return {"error": exc.message}
    runs = unfinished_runs(every)
    out: dict[str, Any] = {"lock_held": held, "holder": holder or None}
    if held:
        out["in_progress"] = describe_holder(holder)
        if holder.get("operation") == "experiment":
            mine = [r for r in every if holds_lock(r, holder)]
            out["experiment"] = experiment_under_way(holder, mine)
        runs = [r for r in runs if not holds_lock(r, holder)]  # the holder's own run is live
    out["unfinished"] = [r.summary().to_json() for r in runs]
    return out


def experiment_under_way(holder: dict[str, Any], mine: list[Run]) -> str:
    """An experiment holding the lock in words: who, since when, and the step its own runs (its
    restarts, in the head's audit) say it is at: applying one, or measuring after it."""
    since = holder.get("since")
    when = (
        f", since {dt.datetime.fromtimestamp(since, dt.timezone.utc):%H:%M} UTC "
        f"({max(0, int(time.time() - since)) // 60} min ago)"
        if isinstance(since, int | float) and math.isfinite(since)
        else ""
    )
    who = f"{holder.get('user', '?')}@{holder.get('host', '?')} (pid {holder.get('pid', '?')})"
    if not mine:
        step = "before its first restart (planning, or measuring the starting configuration)"
    else:
        last = mine[-1]
        args = (last.intent.get("what") or {}).get("args") or {}
        knobs = ", ".join(
            f"{k}={v}" for k, v in args.items() if k not in ("reason", "force", "over_budget")
        )
        what = knobs or "the starting configuration"
        if "restore" in str(args.get("reason", "")):
            what = f"the starting configuration back ({what})"
        step = (
            f"applying {what} (last recorded: {last.last_step})"
            if last.unfinished
            else f"measuring {what} (its apply ended)"
        )
    return f"an experiment is under way: {who}{when}; step: {step}"


async def _instance(session: ClusterSession, cluster: Cluster) -> dict[str, Any]:
    """The engine instance the head runs and engine processes left outside it."""
    try:
        instance, own, others = (await read_engine(session, cluster, ranks=False)).leftovers()
    except SparkOpsError as exc:
        return {"instance": None, "leftovers_error": exc.message}

    def rows(procs: list[Any]) -> list[dict[str, Any]]:
        """JSON rows of processes."""
        return [
            {"pid": p.pid, "name": p.name, "pgid": p.pgid, "started_at": p.started_at}
            for p in procs
        ]

    out: dict[str, Any] = {
        "instance": instance.to_dict() if instance is not None else None,
        "leftovers": rows(own),
        "other_engine_processes": rows(others),
    }
    if own:
        out["leftovers_fix"] = stop_hint(own)
    return out


def last_boot(cluster: Cluster, history: BootHistory | None = None) -> dict[str, Any] | None:
    """The last boot spark-ops watched from this machine (its boot history): when it began, and
    how long it took to serve, or the phase it failed in and why (`total_s` only for a boot that
    served: it is the boot's duration)."""
    rec = (history or BootHistory()).previous(history_key(cluster))
    if not rec:
        return None
    at = rec.get("at")
    out: dict[str, Any] = {
        "outcome": "ok" if boot_served(rec) else "failed",
        "started_at": at if isinstance(at, int | float) else None,
    }
    if out["outcome"] == "ok":
        out["total_s"] = rec.get("total_s")
    else:
        out.update(total_s=None, failed_after_s=rec.get("total_s"), phase=rec.get("phase"))
        out["error"] = rec.get("error")
    return out


async def _engine(op: Operation) -> dict[str, Any]:
    """Engine health, version, model and load from /metrics."""
    try:
        await op.api_url()
    except SparkOpsError as exc:
        return {"up": False, "error": exc.message}
    async with op.engine(timeout=5) as api:
        up = await api.health()
        info: dict[str, Any] = {"up": up, "url": op.cluster.engine.api_url}
        if not up:
            info["error"] = f"no answer on {op.cluster.engine.api_url}/health"
            return info
        info["version"] = await api.version()
        info["models"] = await api.models()
        snap = await api.metrics()
        if snap is not None:
            info.update(snap.to_dict())
        probe = await api.probe_serving(min(op.cluster.engine.probe_timeout_s, STATUS_PROBE_S))
        info["completion"] = probe.to_dict()  # timed out: wedged, or only busy (its counters)
    return info
