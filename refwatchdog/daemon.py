"""The reference watchdog (``spark-watchdog``): probe, restart within a budget, stand down.

Run loop by default; ``--once`` runs one probe cycle; ``--restart-now [--force]`` restarts at once;
``--status [--json]`` reports. Logs are JSON lines on stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from refwatchdog.actions import pid_alive, read_pid, restart_engine
from spark_ops.account import local_account
from spark_ops.errors import WatchdogError
from spark_ops.files import read_regular
from spark_ops.headlib.atomic import atomic_write
from spark_ops.headlib.errors import HeadFailure, LockTimeout
from spark_ops.headlib.flock import lock_free, locked
from spark_ops.log import configure, get_logger
from spark_ops.watchdog import history
from spark_ops.watchdog.config import (
    DEFAULT_CONFIG,
    BudgetConfig,
    WatchdogConfig,
    WatchdogConfigError,
    load_config,
    parse_config,
)
from spark_ops.watchdog.lease import pause_in_force
from spark_ops.yamlsafe import MAX_YAML_BYTES, load_yaml

EXIT_OK = 0
EXIT_ACTION_FAILED = 1
EXIT_USAGE = 2
EXIT_LOCK = 3
EXIT_HISTORY = 4
EXIT_REFUSED = 5


class RestartRefused(WatchdogError):
    """A restart without --force was refused: over budget, paused or gave-up."""


@dataclass
class ProbeResult:
    """The outcome of one probe: ok, seconds taken, the model used, and the error if any."""

    ok: bool
    seconds: float
    model: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialize for the state file and logs."""
        return {
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "model": self.model,
            "error": self.error,
        }


async def probe_engine(cfg: WatchdogConfig, model_cache: dict[str, str]) -> ProbeResult:
    """Send a tiny real completion (max_tokens from config, temperature 0) with its own timeout."""
    import aiohttp

    started = time.monotonic()
    base = cfg.engine.base_url
    headers = {"Authorization": f"Bearer {cfg.engine.api_key}"} if cfg.engine.api_key else {}
    timeout = aiohttp.ClientTimeout(total=cfg.probe.timeout)
    model = cfg.engine.model or model_cache.get("model")
    try:
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            if model is None:
                async with session.get(f"{base}/v1/models") as resp:
                    if resp.status != 200:
                        raise ValueError(f"GET /v1/models answered {resp.status}")
                    listing = await resp.json()
                    data = listing.get("data") if isinstance(listing, dict) else None
                    if not data or not isinstance(data[0], dict) or "id" not in data[0]:
                        raise ValueError("GET /v1/models listed no model")
                    model = str(data[0]["id"])
            body: dict[str, Any] = {"model": model, "max_tokens": cfg.probe.max_tokens}
            body["temperature"] = 0
            if cfg.probe.endpoint == "chat":
                url = f"{base}/v1/chat/completions"
                body["messages"] = [{"role": "user", "content": cfg.probe.prompt}]
            else:
                url = f"{base}/v1/completions"
                body["prompt"] = cfg.probe.prompt
            async with session.post(url, json=body) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:200]
                    raise ValueError(f"POST {url} answered {resp.status}: {text}")
                answer = await resp.json()
            choices = answer.get("choices") if isinstance(answer, dict) else None
            if not choices:
                raise ValueError(f"POST {url} returned no choices")
    except asyncio.TimeoutError:
        model_cache.pop("model", None)
        return ProbeResult(
            False, time.monotonic() - started, model, f"timed out after {cfg.probe.timeout:g} s"
        )
    except Exception as exc:  # connection refused, bad JSON, HTTP errors
        model_cache.pop("model", None)
        msg = f"{type(exc).__name__}: {exc}"
        return ProbeResult(False, time.monotonic() - started, model, msg)
    if not cfg.engine.model:
        model_cache["model"] = model
    return ProbeResult(True, time.monotonic() - started, model)


def _read_json(path: str) -> dict[str, Any] | None:
    """Read a small JSON object file; None when missing or unreadable."""
    try:
        data = json.loads(Path(path).read_text() or "{}")
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else {"content": data}


class Watchdog:
    """The watchdog's decisions over its files; the loop and the one-shot modes share it."""

    def __init__(self, cfg: WatchdogConfig, *, loop_started: float | None = None) -> None:
        """Bind the configuration; loop_started opens a grace window at daemon start."""
        self.cfg = cfg
        self.paths = cfg.paths
        self.budget_in_force = cfg.budget
        raw = self._config_bytes()  # the text the budget in force was loaded from
        self.budget_digest = hashlib.sha256(raw).hexdigest() if raw is not None else ""
        self.loop_started = loop_started
        self.log = get_logger(component="watchdog", config=cfg.source)
        self.model_cache: dict[str, str] = {}
        self.action_lock = self.paths.state + ".action.lock"
        self.instance_lock = self.paths.state + ".lock"
        for path in (self.paths.state, self.paths.history):
            with contextlib.suppress(OSError):
                Path(path).parent.mkdir(parents=True, exist_ok=True)

    def _config_bytes(self) -> bytes | None:
        """The config file's bytes now (None when it cannot be read as a regular file)."""
        try:
            return read_regular(self.cfg.source, limit=MAX_YAML_BYTES)
        except OSError:  # NotRegularFile too: a FIFO is never waited on
            return None

    def current_budget(self) -> BudgetConfig:
        """The budget of the config file as it is now: the loop follows an edit of it, as the
        one-shot modes (--status, --restart-now) and spark-ops' budget gate read it. Compared by
        content, not by time; an edit that cannot be read, is invalid or has no `budget:` (a
        file caught mid-write) keeps the budget in force, and says so."""
        raw = self._config_bytes()
        if raw is None:
            return self.budget_in_force
        digest = hashlib.sha256(raw).hexdigest()
        if digest == self.budget_digest:
            return self.budget_in_force
        self.budget_digest = digest
        try:
            data = load_yaml(raw.decode("utf-8"), source=self.cfg.source, error=WatchdogConfigError)
            budget = data.get("budget") if isinstance(data, dict) else None
            if not isinstance(budget, dict) or not {"max", "window"} <= set(budget):
                raise WatchdogConfigError(
                    f"{self.cfg.source}: the edited config states no whole budget "
                    "(budget.max and budget.window)"
                )
            self.budget_in_force = parse_config(data, source=self.cfg.source).budget
        except (WatchdogError, UnicodeDecodeError) as exc:
            self.log.error("config_edit_refused", error=str(exc), kept=asdict(self.budget_in_force))
        return self.budget_in_force

    def budget(self, now: float | None = None) -> dict[str, Any]:
        """Return the history budget at now (the config file's budget as it is now)."""
        limits = self.current_budget()
        return history.budget(
            self.paths.history,
            allowed=limits.max,
            window=limits.window,
            now=time.time() if now is None else now,
            fmt=self.paths.format,
        )

    def grace_until(self) -> float:
        """Return the end of the start-up grace window (latest restart stamp, pid file, end of the
        latest restart action, daemon start)."""
        anchors = [0.0]
        stamps = history.read_history(self.paths.history, self.paths.format).stamps()
        if stamps:
            anchors.append(float(max(stamps)))
        for anchor in (self.paths.pid, self.action_lock):  # the action lock: the last action's end
            with contextlib.suppress(OSError):
                anchors.append(os.stat(anchor).st_mtime)
        if self.loop_started is not None:
            anchors.append(self.loop_started)
        return max(anchors) + self.cfg.probe.grace

    def restart_in_progress(self) -> bool:
        """True while another process holds the action lock (a `--restart-now` running)."""
        try:
            return not lock_free(self.action_lock)
        except HeadFailure:  # a lock file it cannot open: nobody is restarting through it
            return False

    def paused(self) -> bool:
        """True while the pause file exists, unless it holds a lease past its expiry (lapsed)."""
        paused, lease = pause_in_force(self.paths.pause)
        if lease is not None and not paused:
            self.log.warning("lease_lapsed", file=self.paths.pause, run=lease.run, by=lease.holder)
        return paused

    def load_state(self) -> dict[str, Any]:
        """Read the state file (consecutive failures survive --once runs and daemon restarts)."""
        return _read_json(self.paths.state) or {}

    def save_state(self, state: dict[str, Any]) -> None:
        """Write the state file atomically."""
        state["updated"] = time.time()
        Path(self.paths.state).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.paths.state, (json.dumps(state, indent=1) + "\n").encode())

    def give_up(self, reason: str, budget: dict[str, Any]) -> None:
        """Touch the gave-up file with the reason; no more restarts until a person removes it."""
        body = {
            "time": time.time(),
            "reason": reason,
            "used": budget["used"],
            "allowed": budget["allowed"],
            "stamps": budget["stamps"],
            "next_free_at": budget["next_free_at"],
            "remove_to_resume": self.paths.gave_up,
        }
        atomic_write(self.paths.gave_up, (json.dumps(body) + "\n").encode())
        self.log.error("gave_up", reason=reason, file=self.paths.gave_up, used=budget["used"])

    def restart(self, *, reason: str, by: str, forced: bool) -> dict[str, Any]:
        """Record a stamp and journal entry, then run the restart action."""
        with locked(self.action_lock, self.cfg.action.timeout + 60):
            return self._restart_locked(reason=reason, by=by, forced=forced)

    def _restart_locked(self, *, reason: str, by: str, forced: bool) -> dict[str, Any]:
        """Record and restart while holding the action lock (one restart at a time)."""
        stamp = int(time.time())
        history.append(
            self.paths.history,
            stamp=stamp,
            reason=reason,
            by=by,
            forced=forced,
            action="restart",
            fmt=self.paths.format,
            lock=self.paths.lock,
            lock_timeout=self.paths.lock_timeout,
            journal=self.paths.journal,
        )
        self.log.warning("restarting", stamp=stamp, reason=reason, by=by, forced=forced)
        result = restart_engine(self.cfg.action, self.paths)
        with contextlib.suppress(OSError):  # the grace window runs from the action's end (an
            os.utime(self.action_lock)  # action that writes no pid file: sparkrun, docker …)
        if not result.ok:
            self.log.error("restart_failed", stamp=stamp, error=result.error)
            with contextlib.suppress(HeadFailure):
                history.journal_event(
                    self.paths.history,
                    stamp=stamp,
                    action="restart-failed",
                    reason=result.error or "",
                    forced=forced,
                    by=by,
                    lock=self.paths.lock,
                    lock_timeout=self.paths.lock_timeout,
                    journal=self.paths.journal,
                )
        else:
            self.log.info("restarted", stamp=stamp, engine_pid=result.engine_pid)
        return {
            "stamp": stamp,
            "forced": forced,
            "reason": reason,
            "by": by,
            "engine_pid": result.engine_pid,
            "ok": result.ok,
            "action": result.to_dict(),
        }

    def restart_now(self, *, force: bool, reason: str, by: str) -> dict[str, Any]:
        """Restart at once; without force, refuse when over budget, paused or gave-up."""
        if not force:
            b = self.budget()
            if os.path.exists(self.paths.gave_up):
                raise RestartRefused(f"{self.paths.gave_up} exists: the watchdog gave up")
            if self.paused():
                raise RestartRefused(f"{self.paths.pause} exists: the watchdog is paused")
            if b["over_budget"]:
                raise RestartRefused(
                    f"restart budget used: {b['used']} of {b['allowed']} in {b['window']} s "
                    f"(history {self.paths.history}); next slot at {b['next_free_at']}; "
                    "use --force to restart anyway"
                )
        return self.restart(reason=reason, by=by, forced=force)

    async def cycle(self, state: dict[str, Any]) -> dict[str, Any]:
        """Run one probe cycle and act on it; returns the new state."""
        result = await probe_engine(self.cfg, self.model_cache)
        now = time.time()
        failures = int(state.get("consecutive_failures", 0))
        grace_end = self.grace_until()
        state["last_probe"] = {"time": now, **result.to_dict()}
        if result.ok:
            if failures:
                self.log.info("probe_recovered", after_failures=failures)
            failures, decision = 0, "ok"
        elif self.restart_in_progress():
            failures, decision = 0, "restarting"
            self.log.info("probe_failed_while_restarting", error=result.error)
        elif self.paused():
            # a pause (an operator's, or a lease over a planned disruption) counts nothing: when
            # it ends, the watchdog needs its full run of failures again before it acts, as the
            # community loop does, rather than acting at once on failures seen while paused
            failures, decision = 0, "paused"
            self.log.info("probe_failed_while_paused", error=result.error, file=self.paths.pause)
        elif now < grace_end:
            failures, decision = 0, "grace"
            self.log.info("probe_failed_in_grace", error=result.error, grace_until=grace_end)
        else:
            failures += 1
            decision = "failing"
            self.log.warning("probe_failed", error=result.error, consecutive=failures)
        if failures >= self.cfg.probe.failures:
            decision = await asyncio.to_thread(self._act, failures, result, state)
            if decision == "restarted":
                failures = 0
        state["consecutive_failures"] = failures
        state["decision"] = decision
        self.save_state(state)
        return state

    def _act(self, failures: int, result: ProbeResult, state: dict[str, Any]) -> str:
        """Decide what N consecutive failures lead to: paused, gave-up, or a restart."""
        if self.paused():
            self.log.warning("paused", file=self.paths.pause, consecutive=failures)
            return "paused"
        if os.path.exists(self.paths.gave_up):
            self.log.warning("standing_down", file=self.paths.gave_up, consecutive=failures)
            return "gave-up"
        b = self.budget()
        reason = f"{failures} consecutive probe failures: {result.error}"
        if b["over_budget"]:
            self.give_up(f"restart budget used ({b['used']}/{b['allowed']}); {reason}", b)
            return "gave-up"
        outcome = self.restart(reason=reason, by="watchdog", forced=False)
        state["last_restart"] = {k: outcome[k] for k in ("stamp", "reason", "by", "ok")}
        return "restarted"

    async def run(self, stop: asyncio.Event) -> None:
        """Probe every interval until stop is set."""
        state = self.load_state()
        state["daemon_pid"] = os.getpid()
        self.log.info("watchdog_started", interval=self.cfg.probe.interval, pid=os.getpid())
        while not stop.is_set():
            try:
                state = await self.cycle(state)
            except (HeadFailure, WatchdogError, OSError) as exc:
                self.log.error("cycle_failed", error=str(exc))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.cfg.probe.interval)
        self.log.info("watchdog_stopped")

    def status(self) -> dict[str, Any]:
        """Report state, budget, stamps with journal reasons, engine pid and last restart."""
        b = self.budget()
        records, _ = history.read_journal(self.paths.journal)
        by_stamp: dict[Any, dict[str, Any]] = {}
        for rec in records:
            if rec.get("action") == "restart":
                by_stamp[rec.get("stamp")] = rec
        stamps = []
        for s in b["stamps"]:
            rec = by_stamp.get(s, {})
            stamps.append(
                {
                    "stamp": s,
                    "reason": rec.get("reason"),
                    "by": rec.get("by"),
                    "forced": rec.get("forced"),
                }
            )
        gave_up = os.path.exists(self.paths.gave_up)
        paused, lease = pause_in_force(self.paths.pause)
        state = (
            "gave-up"
            if gave_up
            else "paused"
            if paused
            else "over-budget"
            if b["over_budget"]
            else "ok"
        )
        restarts = [r for r in records if r.get("action") == "restart"]
        last = restarts[-1] if restarts else None
        pid = read_pid(self.paths.pid)
        saved = self.load_state()
        return {
            "state": state,
            "used": b["used"],
            "allowed": b["allowed"],
            "window": b["window"],
            "now": b["now"],
            "stamps": stamps,
            "next_free_at": b["next_free_at"],
            "paused": paused,
            "lease": lease.to_dict() if lease is not None else None,
            "gave_up": _read_json(self.paths.gave_up) if gave_up else None,
            "engine": {"pid": pid, "alive": pid_alive(pid), "pid_file": self.paths.pid},
            "last_restart": (
                {k: last.get(k) for k in ("stamp", "time", "reason", "by", "forced")}
                if last
                else None
            ),
            "last_probe": saved.get("last_probe"),
            "consecutive_failures": saved.get("consecutive_failures", 0),
            "history": self.paths.history,
            "malformed": b["malformed"],
        }


def _when(ts: float, now: float) -> str:
    """Format a Unix time as UTC with its distance from now."""
    text = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
    delta = ts - now
    if abs(delta) < 1:
        return f"{text} (now)"
    return f"{text} ({'in ' if delta > 0 else ''}{abs(delta):.0f} s{' ago' if delta < 0 else ''})"


def _render_status(st: dict[str, Any]) -> str:
    """Render the status as a few human lines."""
    now = float(st["now"])
    lines = [
        f"state: {st['state']}   restarts used: {st['used']}/{st['allowed']} "
        f"in {st['window']} s   next slot free at: {_when(st['next_free_at'], now)}",
        f"engine pid: {st['engine']['pid']} "
        f"({'alive' if st['engine']['alive'] else 'not running'})",
    ]
    for s in st["stamps"]:
        lines.append(
            f"  stamp {s['stamp']} {_when(s['stamp'], now)}: {s['reason'] or '?'}"
            f" (by {s['by'] or '?'})"
        )
    if st["gave_up"]:
        lines.append(f"gave up: {st['gave_up'].get('reason')} — remove the file to resume")
    return "\n".join(lines)


def _emit(obj: dict[str, Any]) -> None:
    """Print one JSON object on stdout."""
    click.echo(json.dumps(obj))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", default=DEFAULT_CONFIG, show_default=True)
@click.option("--once", is_flag=True, help="Run one probe cycle and exit.")
@click.option("--restart-now", is_flag=True, help="Restart the engine at once.")
@click.option("--force", is_flag=True, help="With --restart-now: even over budget/paused/gave-up.")
@click.option("--reason", default=None, help="Reason recorded with --restart-now.")
@click.option("--by", "by", default=None, help="Who asks, recorded with --restart-now.")
@click.option("--status", is_flag=True, help="Report state, budget and engine.")
@click.option("--json", "as_json", is_flag=True, help="With --status: one JSON object.")
@click.option("-v", "--verbose", count=True)
def cli(
    config_path: str,
    once: bool,
    restart_now: bool,
    force: bool,
    reason: str | None,
    by: str | None,
    status: bool,
    as_json: bool,
    verbose: int,
) -> None:
    """Probe a vLLM engine with tiny completions and restart it within a restart budget."""
    configure(verbose, json=True)
    modes = [
        m
        for m, on in (("--once", once), ("--restart-now", restart_now), ("--status", status))
        if on
    ]
    if len(modes) > 1:
        raise click.UsageError(f"{' and '.join(modes)} cannot be combined")
    if force and not restart_now:
        raise click.UsageError("--force only goes with --restart-now")
    try:
        cfg = load_config(config_path)
    except WatchdogError as exc:
        click.echo(f"spark-watchdog: {exc.message}", err=True)
        sys.exit(EXIT_USAGE)
    dog = Watchdog(cfg)
    try:
        if status:
            st = dog.status()
            click.echo(json.dumps(st) if as_json else _render_status(st))
        elif restart_now:
            who = by or os.environ.get("SUDO_USER") or local_account()
            out = dog.restart_now(force=force, reason=reason or "restart-now", by=who)
            _emit(out)
            sys.exit(EXIT_OK if out["ok"] else EXIT_ACTION_FAILED)
        elif once:
            state = asyncio.run(dog.cycle(dog.load_state()))
            _emit({"decision": state["decision"], **state})
        else:
            asyncio.run(_run_loop(cfg))
    except RestartRefused as exc:
        _emit({"ok": False, "error": "refused", "message": exc.message})
        click.echo(f"spark-watchdog: {exc.message}", err=True)
        sys.exit(EXIT_REFUSED)
    except HeadFailure as exc:
        _emit(exc.to_dict())
        click.echo(f"spark-watchdog: {exc.message}", err=True)
        sys.exit(EXIT_LOCK if isinstance(exc, LockTimeout) else EXIT_HISTORY)


async def _run_loop(cfg: WatchdogConfig) -> None:
    """Run the loop until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    dog = Watchdog(cfg, loop_started=time.time())
    try:
        with locked(dog.instance_lock, 0):
            await dog.run(stop)
    except LockTimeout:
        raise LockTimeout(
            f"another spark-watchdog runs with this state ({dog.instance_lock} is locked)",
            lock=dog.instance_lock,
        ) from None


def main() -> None:
    """Entry point of ``spark-watchdog``."""
    cli()


if __name__ == "__main__":
    main()
