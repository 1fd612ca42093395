"""The maintenance lease: a pause of the watchdog that names its holder, run and expiry.

Before a planned disruption (a restart, or load that can starve the watchdog's probe) spark-ops
creates the watchdog's pause file (`watchdog.pause_file`) with a lease in it: JSON naming the
holder, the run, why, and an expiry in the head's clock. The reference watchdog
(refwatchdog/daemon.py) is paused while the file exists, except by a lease past its expiry: a
pause that nobody ends lapses by itself. Any other content (an operator's `touch`) pauses it for
as long as the file exists.

spark-ops makes the file only when none is there (link(2): never through a symlink, never over
an operator's pause) and removes only a file whose content is exactly the one its run made
(compared by digest on the head): a pause someone else set is never removed, and one that
appears meanwhile is reported.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, TypeGuard

from spark_ops.errors import SparkOpsError, excerpt
from spark_ops.files import read_regular
from spark_ops.remote import ClusterSession, sha256
from spark_ops.remote.programs.watchdog import LEASE_END, LEASE_TAKE

LEASE_KEY = "spark-ops-lease"  # its value: the lease format's version
LEASE_VERSION = 1
MIN_LEASE_S = 60  # a lease shorter than a minute would lapse while its own step runs
MAX_LEASE_S = 6 * 3600  # never longer: a lease is a bounded pause, not a switch
MAX_EXPIRY = 1e11  # an expiry past this (year 5138) is no lease spark-ops made
MAX_LEASE_BYTES = 4096


@dataclass(frozen=True)
class Lease:
    """A lease as a pause file holds it."""

    holder: str
    run: str
    why: str
    expires: float
    taken: float | None = None

    def live(self, now: float) -> bool:
        """True until its expiry (the head's clock)."""
        return now < self.expires

    def to_dict(self) -> dict[str, Any]:
        """Serialize for the journal and --json."""
        return asdict(self)


def parse_lease(data: bytes | str) -> Lease | None:
    """The lease a pause file holds, or None when its content is not one (an operator's pause)."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    version = obj.get(LEASE_KEY)
    if type(version) is not int or version != LEASE_VERSION:  # not true, not 1.0
        return None
    expires, taken = obj.get("expires"), obj.get("taken")
    if not _number(expires) or expires > MAX_EXPIRY:
        return None  # not a lease spark-ops made: a pause like any other content
    if _number(taken) and expires - taken > MAX_LEASE_S + 60:
        return None
    return Lease(
        holder=str(obj.get("holder", "?")),
        run=str(obj.get("run", "?")),
        why=str(obj.get("why", "")),
        expires=float(expires),
        taken=float(taken) if _number(taken) else None,
    )


def _number(value: object) -> TypeGuard[int | float]:
    """A finite JSON number (not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def pause_in_force(path: str, now: float | None = None) -> tuple[bool, Lease | None]:
    """Whether a watchdog is paused by the file at `path`: (paused, the lease it holds if any).

    No file: not paused. A lease past its expiry: not paused (it lapsed). Anything else, a file
    that cannot be read or is not a regular file included: paused (an operator's pause).
    """
    try:
        data = read_regular(path, limit=MAX_LEASE_BYTES)
    except FileNotFoundError:
        return False, None
    except OSError:
        return True, None
    return pause_of(data, time.time() if now is None else now)


def pause_of(data: bytes | str | None, now: float) -> tuple[bool, Lease | None]:
    """What a pause file's content does to the watchdog at `now` (its clock): no file (None):
    not paused; a lease past its expiry: not paused; anything else: paused."""
    if data is None:
        return False, None
    size = len(data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data)
    lease = parse_lease(data) if size <= MAX_LEASE_BYTES else None
    if lease is None:
        return True, None
    return lease.live(now), lease


def pause_shown(budget: dict[str, Any]) -> tuple[str, str] | None:
    """The watchdog's pause as `status`, `budget` and serve show it, from a budget's dict:
    ("paused", words) while a pause is in force, ("lapsed", words) for a lease past its expiry
    (the watchdog is NOT paused: it acts again), None for no pause file."""
    lease = budget.get("lease") or None
    if budget.get("paused"):
        if lease is None:
            return "paused", "watchdog PAUSED (pause file present)"
        who = f"{lease.get('holder')}, run {lease.get('run')}"
        return "paused", f"watchdog PAUSED until {_when(lease.get('expires'))} ({who})"
    if lease is None:
        return None
    return "lapsed", (
        f"lease LAPSED at {_when(lease.get('expires'))} ({lease.get('holder')}, run "
        f"{lease.get('run')}): the watchdog is NOT paused and acts again; the pause file is "
        "left (the next run's settle step ends it when its run is dead, or remove it by hand)"
    )


def lease_body(*, holder: str, run: str, why: str) -> str:
    """What the take program reads on stdin: the lease's JSON after its `{` (the program writes
    the opening brace and the expiry in the head's clock)."""
    text = json.dumps({LEASE_KEY: LEASE_VERSION, "holder": holder, "run": run, "why": why})
    return text[1:] + "\n"


def lease_seconds(seconds: float) -> int:
    """A lease's length in whole seconds, within [MIN_LEASE_S, MAX_LEASE_S]."""
    return int(min(max(math.ceil(seconds), MIN_LEASE_S), MAX_LEASE_S))


@dataclass
class LeaseHeld:
    """What a run did to the watchdog's pause: the lease it holds, or why it holds none.

    state: "held" (ours), "found" (a pause someone else set, or another run's lease: kept, the
    watchdog is paused all the same), "lapsed" (a lease found past its expiry: kept, but the
    watchdog is not paused), "none" (no pause file in the inventory), "failed".
    """

    path: str | None
    state: str
    why: str
    run: str = ""
    content: str = ""
    expires: float | None = None
    found: str = ""
    error: str = ""

    @property
    def sha(self) -> str:
        """The digest of the content this run made (what ending it compares)."""
        return sha256(self.content) if self.content else ""

    def to_dict(self) -> dict[str, Any]:
        """Serialize for the journal (the digest, not the content) and --json."""
        return {
            "path": self.path, "state": self.state, "why": self.why, "run": self.run,
            "sha": self.sha, "expires": self.expires, "found": self.found[:300],
            "error": self.error,
        }  # fmt: skip

    def text(self) -> str:
        """One line for the step's detail."""
        until = f" until {_when(self.expires)}" if self.expires is not None else ""
        if self.state == "held":
            return f"watchdog paused{until} ({self.path}, run {self.run}): {self.why}"
        if self.state == "found":
            return f"the watchdog was already paused by {self.found_who()}: kept as it is"
        if self.state == "lapsed":
            return (
                f"no lease: {self.path} holds a lapsed lease ({self.found_who()}), which the "
                "watchdog ignores: it is NOT paused; kept as it is (the next run's settle step "
                "ends it when its run is dead, or remove it by hand)"
            )
        if self.state == "none":
            return "no lease: the inventory names no watchdog.pause_file"
        return f"no lease ({self.error}): the watchdog is not paused"

    def found_who(self) -> str:
        """Who set the pause found: another run's lease, or an operator's file."""
        lease = parse_lease(self.found)
        if lease is None:
            return f"someone else ({self.path} holds {excerpt(self.found.strip()) or 'nothing'})"
        return f"{lease.holder}, run {lease.run}, until {_when(lease.expires)} ({lease.why})"


def _when(ts: float | None) -> str:
    """A Unix time as UTC text."""
    if ts is None:
        return "?"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))
    except (OverflowError, OSError, ValueError):
        return f"{ts:g} (no date)"


async def take(
    session: ClusterSession, *, run: str, holder: str, why: str, seconds: float
) -> LeaseHeld:
    """Pause the watchdog for `seconds` (clamped) with a lease of this run; never raises for a
    pause that is there already (kept and reported) or one that cannot be made (reported)."""
    path = session.cluster.watchdog.pause_file
    if not path:
        return LeaseHeld(None, "none", why, run)
    head = session.cluster.head.name
    body = lease_body(holder=holder, run=run, why=why)
    try:
        res = await session.call(
            head, LEASE_TAKE, path, lease_seconds(seconds), input=body, sudo=True
        )
    except SparkOpsError as exc:
        return LeaseHeld(path, "failed", why, run, error=exc.message)
    if res.exit_code == 0:
        made = parse_lease(res.stdout)
        expires = made.expires if made is not None else None
        return LeaseHeld(path, "held", why, run, content=res.stdout, expires=expires)
    if res.exit_code == 46:
        return LeaseHeld(path, "found", why, run, found=res.stdout)
    error = res.stderr.strip() or f"exit {res.exit_code}"
    return LeaseHeld(path, "failed", why, run, error=f"{LEASE_TAKE.name} on {head}: {error}")


async def end(session: ClusterSession, path: str, sha: str) -> str:
    """Remove the pause file when its content is still the one of digest `sha`; what was done,
    in words ("ended", or why it was left). Never raises: a lease not ended lapses by itself."""
    head = session.cluster.head.name
    try:
        res = await session.call(head, LEASE_END, path, sha, sudo=True)
    except SparkOpsError as exc:
        return f"not ended ({exc.message}); it lapses at its expiry"
    if res.exit_code == 0:
        return "ended"
    if res.exit_code == 44:
        return f"{path} was gone already (someone removed it)"
    if res.exit_code == 45:
        other = parse_lease(res.stdout)
        who = (
            f"a lease of run {other.run}" if other is not None
            else excerpt(res.stdout.strip()) or res.stderr.strip() or "other content"
        )  # fmt: skip
        moved = next((ln for ln in res.stderr.splitlines() if "kept as" in ln), "")
        return f"{path} now holds {who}: someone paused the watchdog meanwhile; kept" + (
            f" ({moved})" if moved else ""
        )
    why = res.stderr.strip() or f"exit {res.exit_code}"
    return f"not ended ({why}); it lapses at its expiry"


def risk_without_pause(failures: int | None, interval_s: float | None) -> str:
    """What stays at risk when the watchdog offers no pause (shown in the plan)."""
    probe = (
        f" (its probe fails {failures} times in a row: about {failures * interval_s:.0f} s)"
        if failures and interval_s
        else ""
    )
    return (
        "the watchdog is not paused (the inventory names no watchdog.pause_file): it may restart "
        f"the engine itself during the boot or under load{probe}, spending a slot of its budget "
        "that spark-ops cannot prune (an automatic stamp)"
    )
