"""Restart policies read as watchdogs: a systemd unit's `Restart=` with its start limit, or a
Docker container's restart policy, turned into the restart budget it implies.

Pure parsers of what the head prints (`systemctl show`, `systemctl cat`, `docker inspect`): the
remote programs that ask live in remote/programs/watchdog.py. systemd's own defaults apply where
a unit says nothing (`DefaultStartLimitIntervalSec=10s`, `DefaultStartLimitBurst=5`,
`RestartSec=100ms`): a start limit only stops a crash loop when more than `burst` starts fit in
its interval, which a `RestartSec` of 30 s never lets happen inside 10 s. Docker restarts
`always` and `unless-stopped` containers without end (its delay doubles up to a minute, then
resets after 10 s of running); `on-failure:N` stops after N restarts in a row, with no window.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from spark_ops.errors import SparkOpsError, WatchdogError
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.watchdog import CONTAINER_RESTART_POLICY, UNIT_RESTART_POLICY

SYSTEMD_DEFAULT_BURST = 5
SYSTEMD_DEFAULT_INTERVAL_S = 10.0
SYSTEMD_DEFAULT_RESTART_S = 0.1
_RESTART_VALUES = (
    "no", "on-success", "on-failure", "on-abnormal", "on-watchdog", "on-abort", "always",
)  # fmt: skip
_DOCKER_VALUES = ("no", "always", "unless-stopped", "on-failure", "")
_UNITS = {
    "us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0, "second": 1.0,
    "seconds": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0,
    "hr": 3600.0, "hour": 3600.0, "hours": 3600.0, "d": 86400.0, "day": 86400.0,
    "days": 86400.0, "w": 604800.0, "week": 604800.0, "weeks": 604800.0, "M": 2629800.0,
    "month": 2629800.0, "months": 2629800.0, "y": 31557600.0, "year": 31557600.0,
    "years": 31557600.0,
}  # fmt: skip
_SPAN_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]*)")


class PolicyError(WatchdogError):
    """A restart policy's text that cannot be read (names the source and the value)."""


@dataclass(frozen=True)
class RestartPolicy:
    """The budget a restart policy implies.

    `restarts` is False when the policy never restarts the engine (`Restart=no`, docker `no`);
    `max_restarts` None with `restarts` True is no limit at all: nothing stops a crash loop.
    `window_s` None with a limit: the count is in a row, not in a window (docker on-failure:N).
    """

    kind: str  # systemd | docker
    name: str  # the unit or the container
    setting: str  # Restart=on-failure, on-failure:3, always …
    restarts: bool
    max_restarts: int | None
    window_s: float | None
    delay_s: float | None = None
    note: str = ""

    @property
    def unlimited(self) -> bool:
        """True when the policy restarts without end: nothing stops a crash loop."""
        return self.restarts and self.max_restarts is None

    def describe(self) -> str:
        """The policy and its budget in words."""
        what = f"{self.kind} {self.name}: {self.setting}"
        if not self.restarts:
            return f"{what}: never restarts the engine"
        if self.unlimited:
            return f"{what}: no limit, nothing stops a crash loop" + (
                f" ({self.note})" if self.note else ""
            )
        per = f" per {_span(self.window_s)}" if self.window_s is not None else " in a row"
        return f"{what}: at most {self.max_restarts} restarts{per}" + (
            f" ({self.note})" if self.note else ""
        )

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {
            "kind": self.kind, "name": self.name, "setting": self.setting,
            "restarts": self.restarts, "max_restarts": self.max_restarts,
            "window_s": self.window_s, "delay_s": self.delay_s, "unlimited": self.unlimited,
            "note": self.note, "text": self.describe(),
        }  # fmt: skip


def _span(seconds: float | None) -> str:
    """A duration in words: 10 s, 5 min, 6 h."""
    if seconds is None:
        return "?"
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def parse_timespan(value: str, *, source: str, key: str) -> float:
    """A systemd time span in seconds ("30s", "1min 30s", "100ms", "5" = seconds); `infinity`
    is math.inf. PolicyError naming the source and key otherwise."""
    text = value.strip()
    if text in ("infinity", "inf"):
        return math.inf
    total, pos = 0.0, 0
    for m in _SPAN_RE.finditer(text):
        if text[pos : m.start()].strip() or m.group(2) not in ("", *_UNITS):
            break
        total += float(m.group(1)) * (_UNITS[m.group(2)] if m.group(2) else 1.0)
        pos = m.end()
    else:
        if text and not text[pos:].strip():
            return total
    raise PolicyError(f"{source}: {key}={value!r} is not a systemd time span (e.g. 30s, 1min 30s)")


def systemd_policy(
    settings: dict[str, str], *, name: str, source: str, usec_keys: bool = False
) -> RestartPolicy:
    """The budget of a unit from its settings (systemctl show's keys, or a unit file's).

    `usec_keys`: the names `systemctl show` prints (RestartUSec, StartLimitIntervalUSec).
    """
    restart = settings.get("Restart", "no").strip() or "no"
    if restart not in _RESTART_VALUES:
        raise PolicyError(
            f"{source}: Restart={restart!r} is not one of {', '.join(_RESTART_VALUES)}"
        )
    interval_key = "StartLimitIntervalUSec" if usec_keys else "StartLimitIntervalSec"
    delay_key = "RestartUSec" if usec_keys else "RestartSec"
    raw_interval = settings.get(interval_key) or settings.get("StartLimitInterval")
    raw_burst = settings.get("StartLimitBurst")
    raw_delay = settings.get(delay_key)
    interval = (
        parse_timespan(raw_interval, source=source, key=interval_key)
        if raw_interval
        else SYSTEMD_DEFAULT_INTERVAL_S
    )
    delay = (
        parse_timespan(raw_delay, source=source, key=delay_key)
        if raw_delay
        else SYSTEMD_DEFAULT_RESTART_S
    )
    if raw_burst and not raw_burst.strip().isdigit():
        raise PolicyError(f"{source}: StartLimitBurst={raw_burst!r} is not a whole number")
    burst = int(raw_burst) if raw_burst else SYSTEMD_DEFAULT_BURST
    setting = f"Restart={restart}"
    if restart == "no":
        return RestartPolicy("systemd", name, setting, False, None, None, delay)
    limits = f"StartLimitBurst={burst}, StartLimitIntervalSec={_span(interval)}"
    if interval == 0 or math.isinf(interval) or burst == 0:
        return RestartPolicy(
            "systemd", name, setting, True, None, None, delay,
            f"{limits}: the start limit is off",
        )  # fmt: skip
    if burst * delay >= interval:
        # burst + 1 starts spaced by RestartSec span burst * RestartSec: never inside the interval
        return RestartPolicy(
            "systemd", name, setting, True, None, None, delay,
            f"{limits}, RestartSec={_span(delay)}: {burst + 1} starts never fit in "
            f"{_span(interval)}, so the limit never trips",
        )  # fmt: skip
    run_s = interval / burst - delay  # the longest an engine may run before each crash to trip it
    return RestartPolicy(
        "systemd", name, setting, True, burst, interval, delay,
        f"{limits}, RestartSec={_span(delay)}: it trips only when the engine fails within "
        f"{run_s:.3g} s of each start; a manual start counts too, and `systemctl reset-failed` "
        "empties the whole count",
    )  # fmt: skip


def parse_systemctl_show(text: str, *, name: str, source: str) -> RestartPolicy:
    """The budget of `systemctl show UNIT` output (KEY=value lines; the last one of a key wins)."""
    settings: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            settings[key.strip()] = value.strip()
    if settings.get("LoadState") == "not-found":
        raise PolicyError(f"{source}: unit {name} is not loaded (LoadState=not-found)")
    return systemd_policy(settings, name=name, source=source, usec_keys=True)


def parse_unit_text(text: str, *, name: str, source: str) -> RestartPolicy:
    """The budget of unit file text (`systemctl cat UNIT`: the unit and its drop-ins, in order).

    A later assignment overrides an earlier one, an empty one resets to the default, as systemd
    reads them; only the [Unit] and [Service] keys that bear on restarts are read.
    """
    settings: dict[str, str] = {}
    section = ""
    wanted = {
        "Unit": ("StartLimitBurst", "StartLimitIntervalSec", "StartLimitInterval"),
        "Service": ("Restart", "RestartSec", "StartLimitBurst", "StartLimitInterval"),
    }
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if sep and key in wanted.get(section, ()):
            if value:
                settings[key] = value
            else:
                settings.pop(key, None)
    return systemd_policy(settings, name=name, source=source)


def parse_docker_inspect(text: str, *, source: str) -> RestartPolicy:
    """The budget of a container's restart policy from `docker inspect NAME` (a JSON array)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PolicyError(f"{source}: not the JSON docker inspect prints ({exc})") from None
    if isinstance(data, list):
        if len(data) != 1:
            raise PolicyError(f"{source}: docker inspect printed {len(data)} objects, expected 1")
        data = data[0]
    host = data.get("HostConfig") if isinstance(data, dict) else None
    policy = host.get("RestartPolicy") if isinstance(host, dict) else None
    if not isinstance(policy, dict):
        raise PolicyError(f"{source}: no HostConfig.RestartPolicy in docker inspect's output")
    name = str(data.get("Name") or "?").lstrip("/")
    kind = policy.get("Name") or ""
    count = policy.get("MaximumRetryCount") or 0
    if kind not in _DOCKER_VALUES or not isinstance(count, int) or isinstance(count, bool):
        raise PolicyError(
            f"{source}: RestartPolicy {policy!r} is not one of {', '.join(_DOCKER_VALUES[:4])}"
        )
    if kind in ("", "no"):
        return RestartPolicy("docker", name, "restart=no", False, None, None)
    if kind == "on-failure" and count > 0:
        return RestartPolicy(
            "docker", name, f"restart=on-failure:{count}", True, count, None, None,
            "counted since the container was last started; a `docker restart` resets it",
        )  # fmt: skip
    setting = f"restart={kind}" + (":0" if kind == "on-failure" else "")
    note = {
        "always": "a container stopped by hand comes back when dockerd restarts",
        "unless-stopped": "not after a `docker stop`",
        "on-failure": "MaximumRetryCount 0 is no limit",
    }[kind]
    return RestartPolicy("docker", name, setting, True, None, None, None, note)


async def engine_policy(session: ClusterSession) -> RestartPolicy | str | None:
    """The restart policy of the engine's unit or container on the head, as the inventory's
    engine.log names it (journalctl: the unit; docker: the container); None when the engine is
    neither; the reason in words when it could not be read. Never raises."""
    engine = session.cluster.engine
    head = session.cluster.head.name
    if engine.log_kind == "journalctl":
        program, source = UNIT_RESTART_POLICY, f"{head}: systemctl show {engine.log_target}"
    elif engine.log_kind == "docker":
        program, source = CONTAINER_RESTART_POLICY, f"{head}: docker inspect {engine.log_target}"
    else:
        return None
    try:
        res = await session.call(head, program, engine.log_target)
        if not res.ok:
            return f"{source} failed (exit {res.exit_code}): {res.stderr.strip()[:200]}"
        if engine.log_kind == "docker":
            return parse_docker_inspect(res.stdout, source=source)
        return parse_systemctl_show(res.stdout, name=engine.log_target, source=source)
    except SparkOpsError as exc:
        return exc.message


def crash_loop_warning(policy: RestartPolicy | str | None) -> str | None:
    """The plan's words for a policy that restarts without end (None otherwise)."""
    if not isinstance(policy, RestartPolicy) or not policy.unlimited:
        return None
    return (
        f"the engine's restart policy is a watchdog with no budget ({policy.describe()}): if the "
        "new recipe fails at start-up, it restarts the engine again and again"
    )
