"""The restart action of the reference watchdog: recipe, launcher, systemd, docker, command or
sparkrun (sparkrun's own stop, then `sparkrun run RECIPE --cluster NAME --no-follow`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_ops.errors import WatchdogError
from spark_ops.headlib.atomic import atomic_write
from spark_ops.headlib.errors import HeadFailure
from spark_ops.recipe.files import render_file
from spark_ops.watchdog.config import ActionConfig, PathsConfig


class ActionError(WatchdogError):
    """A restart step failed, timed out or could not be started."""


@dataclass
class ActionResult:
    """What a restart did: the steps run, the engine pid when known, and an error if any."""

    kind: str
    ok: bool = True
    engine_pid: int | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialize for JSON output."""
        return {
            "kind": self.kind,
            "ok": self.ok,
            "engine_pid": self.engine_pid,
            "steps": self.steps,
            "error": self.error,
        }


def read_pid(pid_file: str) -> int | None:
    """Read a pid file; None when it is missing or does not hold a positive integer."""
    try:
        text = Path(pid_file).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) > 0 else None


def _proc_stat(pid: int) -> list[str] | None:
    """Return the fields of /proc/PID/stat after the command name, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def _reap(pid: int) -> None:
    """Collect pid if it is our exited child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def pid_alive(pid: int | None) -> bool:
    """Tell whether a process exists and is not a zombie."""
    if pid is None:
        return False
    _reap(pid)
    fields = _proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Return the live (non-zombie) processes of a process group."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _proc_stat(int(name))
        if fields and fields[0] not in ("Z", "X") and fields[2] == str(pgid):
            members.append(int(name))
    return members


# Set in the environment of every engine this watchdog starts (the value: its pid file), so a
# stop signals only a process that is the engine, never one that took a stale pid file's number.
ENGINE_MARK = "SPARK_WATCHDOG_ENGINE"


def _started_at(pid: int) -> float | None:
    """A process's start time (Unix seconds, from /proc), or None when it is gone."""
    fields = _proc_stat(pid)
    try:
        btime = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK") if fields else None
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def _command_line(pid: int) -> list[str]:
    """A process's command line (its words; empty when it cannot be read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]


def not_the_engine(pid: int, pid_file: str, argv: list[str] | None) -> str | None:
    """Why the live process `pid` is not the engine the pid file names (None when it is): it
    carries this watchdog's mark (an engine it started); else it started after the file was
    written (the engine died and its number was reused); else its command line must be the
    very one the action starts. The mark is read first: a clock stepped forward since the
    engine started makes its computed start time later than the file, never unmarked."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        env = []
    if f"{ENGINE_MARK}={pid_file}".encode() in env:
        return None
    words = _command_line(pid)
    shown = " ".join(words)[:200] or "?"
    started = _started_at(pid)
    try:
        written: float | None = os.stat(pid_file).st_mtime
    except OSError:
        written = None
    if started is not None and written is not None and started > written + 1.0:
        return f"reused: pid {pid} ({shown}) started after {pid_file} was written"
    if argv and words == list(argv):
        return None
    how = " and does not run the command its action starts" if argv else ""
    return f"pid {pid} ({shown}) is not the engine: it was not started by this watchdog{how}"


def stop_engine(
    pid_file: str, stop_timeout: float, argv: list[str] | None = None
) -> dict[str, Any]:
    """Stop the engine in the pid file: SIGTERM its process group, wait, then SIGKILL; a live
    process that is not the engine (not_the_engine) is never signalled: a reused number is the
    engine gone, any other an ActionError."""
    step: dict[str, Any] = {"step": "stop", "pid_file": pid_file, "pid": read_pid(pid_file)}
    pid = step["pid"]
    if pid is not None and not pid_alive(pid) and pid != os.getpgrp() and group_members(pid):
        # the leader died but its group (workers it started) lives on: stop the orphans
        return _stop_group(pid, pid, stop_timeout, step, orphans=True)
    if not pid_alive(pid):
        step["result"] = "not running"
        return step
    assert pid is not None
    other = not_the_engine(pid, pid_file, argv)
    if other is not None and other.startswith("reused"):
        step["result"] = f"not running ({other}: not signalled)"
        return step
    if other is not None:
        raise ActionError(
            f"{pid_file} names {other}: not signalled, no engine started (stop the engine by "
            f"hand and remove {pid_file}, or write the engine's pid in it)"
        )
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        step["result"] = "not running"
        return step
    return _stop_group(pid, pgid, stop_timeout, step, orphans=False)


def _stop_group(
    pid: int, pgid: int, stop_timeout: float, step: dict[str, Any], *, orphans: bool
) -> dict[str, Any]:
    """SIGTERM the group (or only pid when it shares our group), wait, SIGKILL; fill step."""
    own_group = pgid == os.getpgrp()

    def send(sig: signal.Signals) -> None:
        """Signal the engine's group (never our own group: then only the engine)."""
        with contextlib.suppress(ProcessLookupError):
            if own_group:
                os.kill(pid, sig)
            else:
                os.killpg(pgid, sig)

    def alive() -> bool:
        """Tell whether the engine (or, for its own group, any member) still runs."""
        return pid_alive(pid) if own_group else bool(group_members(pgid)) or pid_alive(pid)

    send(signal.SIGTERM)
    deadline = time.monotonic() + stop_timeout
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive():
        send(signal.SIGKILL)
        end = time.monotonic() + 30  # a big engine's memory takes the kernel a while to free
        while alive() and time.monotonic() < end:
            time.sleep(0.05)
        step["result"] = "killed" if not alive() else "still running after SIGKILL"
    else:
        step["result"] = "terminated"
    if orphans:
        step["result"] = "orphans " + step["result"]
    if step["result"].endswith("still running after SIGKILL"):
        raise ActionError(f"engine pid {pid} from {step['pid_file']} survived SIGKILL")
    return step


def _spawn(
    argv: list[str], log: Any, *, env: dict[str, str] | None, cwd: str | None, what: str
) -> subprocess.Popen[bytes]:
    """Start argv in its own session, stdin from /dev/null, stdout and stderr to the log."""
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        raise ActionError(f"cannot {what} {argv[0]!r}: {exc.strerror}") from None


def start_detached(
    argv: list[str],
    *,
    env: dict[str, str] | None,
    log_file: str,
    pid_file: str,
    cwd: str | None = None,
) -> int:
    """Start argv in a new session, output appended to log_file, pid file written atomically."""
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, **(env or {}), ENGINE_MARK: pid_file}
    with open(log_file, "ab") as log:
        proc = _spawn(argv, log, env=full_env, cwd=cwd, what="start")
    atomic_write(pid_file, f"{proc.pid}\n".encode())
    return proc.pid


def run_step(
    argv: list[str], *, timeout: float, log_file: str, cwd: str | None = None
) -> dict[str, Any]:
    """Run one command to completion with a timeout; its output goes to the log file."""
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    step: dict[str, Any] = {"step": "run", "argv": argv}
    with open(log_file, "ab") as log:
        proc = _spawn(argv, log, env=None, cwd=cwd, what="run")
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise ActionError(f"{' '.join(argv)} timed out after {timeout:g} s") from None
    step.update(rc=rc, seconds=round(time.monotonic() - started, 3))
    if rc != 0:
        raise ActionError(f"{' '.join(argv)} exited {rc} (output in {log_file})")
    return step


def _first_pid(argv: list[str], timeout: float) -> int | None:
    """Run a query command and read a positive pid from its output (best effort)."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = out.stdout.strip()
    return int(text) if out.returncode == 0 and text.isdigit() and int(text) > 0 else None


def _recipe(action: ActionConfig, paths: PathsConfig, result: ActionResult) -> None:
    """Stop the engine by its pid file, render the recipe and start it detached."""
    assert action.recipe is not None
    if not Path(action.recipe).is_file():
        raise ActionError(f"cannot read recipe {action.recipe}: no such file")
    rendered = render_file(Path(action.recipe))  # either dialect; sparkrun bases read beside it
    result.steps.append(stop_engine(paths.pid, action.stop_timeout, list(rendered.argv)))
    cwd = action.workdir or str(Path(action.recipe).parent)
    pid = start_detached(
        list(rendered.argv),
        env=dict(rendered.env),
        log_file=paths.engine_log,
        pid_file=paths.pid,
        cwd=cwd,
    )
    result.engine_pid = pid
    result.steps.append({"step": "start", "argv": list(rendered.argv), "pid": pid})


def _command(action: ActionConfig, paths: PathsConfig, result: ActionResult) -> None:
    """Run the configured stop command (or stop by pid file), then the start command."""
    assert action.start is not None
    if action.stop is not None:
        result.steps.append(
            run_step(action.stop, timeout=action.timeout, log_file=paths.engine_log)
        )
    elif action.detach:
        result.steps.append(stop_engine(paths.pid, action.stop_timeout, list(action.start)))
    if action.detach:
        pid = start_detached(
            action.start,
            env=None,
            log_file=paths.engine_log,
            pid_file=paths.pid,
            cwd=action.workdir,
        )
        result.engine_pid = pid
        result.steps.append({"step": "start", "argv": action.start, "pid": pid})
    else:
        result.steps.append(
            run_step(
                action.start, timeout=action.timeout, log_file=paths.engine_log, cwd=action.workdir
            )
        )
        result.engine_pid = read_pid(paths.pid)


def sparkrun_argv(action: ActionConfig, verb: str) -> list[str]:
    """`sparkrun stop|run RECIPE --cluster NAME` (run: --no-follow and the run options)."""
    assert action.recipe is not None and action.cluster is not None
    argv = [*(action.sparkrun or ["sparkrun"]), verb, action.recipe, "--cluster", action.cluster]
    if verb == "run":
        argv += ["--no-follow", *(action.run_options or [])]
    return argv


def _sparkrun(action: ActionConfig, paths: PathsConfig, result: ActionResult) -> None:
    """sparkrun's own restart: stop the job (nothing running is fine), then run it again."""
    stop = sparkrun_argv(action, "stop")
    try:
        result.steps.append(
            run_step(stop, timeout=action.stop_timeout + 60, log_file=paths.engine_log)
        )
    except ActionError as exc:
        if "timed out" in str(exc):
            raise
        result.steps.append({"step": "run", "argv": stop, "result": f"ignored: {exc}"})
    result.steps.append(
        run_step(sparkrun_argv(action, "run"), timeout=action.timeout, log_file=paths.engine_log)
    )


def restart_engine(action: ActionConfig, paths: PathsConfig) -> ActionResult:
    """Run the configured restart; never raises for a failed step, the result carries the error."""
    result = ActionResult(kind=action.kind)
    log = paths.engine_log
    try:
        if action.kind == "recipe":
            _recipe(action, paths, result)
        elif action.kind == "launcher":
            assert action.workdir is not None and action.recipe is not None
            for argv in (["./launch-cluster.sh", "stop"], ["./run-recipe.py", action.recipe, "-d"]):
                result.steps.append(
                    run_step(argv, timeout=action.timeout, log_file=log, cwd=action.workdir)
                )
            result.engine_pid = read_pid(paths.pid)
        elif action.kind == "systemd":
            assert action.unit is not None
            result.steps.append(
                run_step(
                    ["systemctl", "restart", action.unit], timeout=action.timeout, log_file=log
                )
            )
            result.engine_pid = _first_pid(
                ["systemctl", "show", "-p", "MainPID", "--value", action.unit], 10
            )
        elif action.kind == "docker":
            assert action.container is not None
            argv = ["docker", "restart", "-t", str(int(action.stop_timeout)), action.container]
            result.steps.append(run_step(argv, timeout=action.timeout, log_file=log))
            result.engine_pid = _first_pid(
                ["docker", "inspect", "-f", "{{.State.Pid}}", action.container], 10
            )
        elif action.kind == "sparkrun":
            _sparkrun(action, paths, result)
        else:
            _command(action, paths, result)
    except (WatchdogError, HeadFailure) as exc:
        result.ok, result.error = False, str(exc)
    except Exception as exc:  # a recipe that cannot render, an unexpected OS error
        result.ok, result.error = False, f"{type(exc).__name__}: {exc}"
    return result
