"""The fleet: several clusters, each an inventory, named once in a fleet file (docs/fleet.md).

The one place a cluster's name becomes its inventory: `load_fleet` reads and validates the file
(names, inventories that load, no machine under two names), `Fleet.member` resolves a name,
`Fleet.members` iterates them, and `across` runs one reading on every cluster at once, each
within its own deadline, so that one cluster that does not answer never hides the others.
Nothing here renders or picks an exit code for a person: `worst_exit` only orders the codes.
"""

from __future__ import annotations

import asyncio
import difflib
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from spark_ops.errors import (
    CommandTimeout,
    ConnectError,
    ExitStatus,
    FleetError,
    SparkOpsError,
    excerpt,
)
from spark_ops.inventory import Cluster, load_inventory
from spark_ops.yamlsafe import load_yaml, read_text_capped

ENV_VAR = "SPARK_OPS_FLEET"
NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
NAME_RULE = "a lowercase letter, then up to 31 lowercase letters, digits, '-' or '_'"
TOP_KEYS = ("clusters",)
MEMBER_KEYS = ("name", "inventory", "cluster")
MAX_CLUSTERS = 64

# Worst last: a fleet command's exit is the worst of its clusters'. A cluster that serves (0) is
# best; one in motion (an experiment, a restart) next; then one that serves with something to look
# at, a failed check, a wedged engine, one that does not serve; then a cluster that could not be
# read at all (past its deadline, unreachable); any other code (an error of that cluster's own:
# its inventory, its history) is worse still, the higher number the worse among them.
SEVERITY: tuple[ExitStatus, ...] = (
    ExitStatus.OK,
    ExitStatus.EXPERIMENTING,
    ExitStatus.RESTARTING,
    ExitStatus.DEGRADED,
    ExitStatus.CHECK_FAILED,
    ExitStatus.WEDGED,
    ExitStatus.NOT_SERVING,
    ExitStatus.TIMEOUT,
    ExitStatus.UNREACHABLE,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Member:
    """One cluster of the fleet: its name, its inventory file and the cluster loaded from it
    (renamed to the fleet's name for it)."""

    name: str
    inventory: str
    cluster: Cluster

    @property
    def deadline_s(self) -> float:
        """How long a fleet-wide reading waits for this cluster: one connect and two commands."""
        return self.cluster.ssh.connect_timeout + 2 * self.cluster.ssh.command_timeout


@dataclass(frozen=True)
class Fleet:
    """The clusters a fleet file names, in its order."""

    path: str
    members: tuple[Member, ...]

    def names(self) -> list[str]:
        """The clusters' names, in the file's order."""
        return [m.name for m in self.members]

    def member(self, name: str) -> Member:
        """The cluster called `name`; FleetError naming the fleet's clusters when none is."""
        for m in self.members:
            if m.name == name:
                return m
        near = difflib.get_close_matches(name, self.names(), n=1, cutoff=0.6)
        raise FleetError(
            f"{self.path}: no cluster {excerpt(name)} in the fleet; its clusters are "
            f"{', '.join(self.names())}",
            hint=f"did you mean --cluster {near[0]}?" if near else "pass --cluster with one",
        )


@dataclass(frozen=True)
class Reading(Generic[T]):
    """What one cluster answered to a fleet-wide reading: its value, or the error it met."""

    member: Member
    value: T | None = None
    error: SparkOpsError | None = None

    def error_dict(self) -> dict[str, object] | None:
        """The error as every command says it in JSON ({error, message, hint}), or None."""
        return None if self.error is None else self.error.to_dict()


def _error(path: str, key: str, message: str, hint: str | None = None) -> FleetError:
    """An error naming the fleet file and the key."""
    return FleetError(f"{path}: {key}: {message}", hint=hint)


def _keys(path: str, where: str, data: object, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    """`data` as a mapping holding only `allowed` keys (the first other one refused by name)."""
    if not isinstance(data, Mapping):
        raise _error(path, where or "(top)", f"must be a mapping, got {type(data).__name__}")
    for key in data:
        if key not in allowed:
            shown = str(key)[:60]
            near = difflib.get_close_matches(shown, allowed, n=1, cutoff=0.6)
            raise _error(
                path,
                f"{where}.{shown}" if where else shown,
                f"unknown key; allowed keys: {', '.join(allowed)}",
                hint=f"did you mean {near[0]}?" if near else f"remove the key from {path}",
            )
    return data


def _text(path: str, where: str, data: Mapping[str, Any], key: str, required: bool) -> str | None:
    """A key's value as non-empty text (None when absent and not required)."""
    value = data.get(key)
    if value is None:
        if required:
            raise _error(path, f"{where}.{key}", "is required")
        return None
    if not isinstance(value, str) or not value:
        raise _error(path, f"{where}.{key}", f"must be non-empty text, got {excerpt(value)}")
    return value


def _member(path: str, base: Path, where: str, data: object) -> Member:
    """Validate one `clusters` entry and load the cluster its inventory names."""
    entry = _keys(path, where, data, MEMBER_KEYS)
    name = str(_text(path, where, entry, "name", True))
    if not NAME.match(name):
        raise _error(path, f"{where}.name", f"{excerpt(name)} is not a cluster name: {NAME_RULE}")
    where = f"{where} ({name})"
    file = Path(str(_text(path, where, entry, "inventory", True))).expanduser()
    inventory = file if file.is_absolute() else base / file
    if not inventory.is_file():
        raise _error(
            path, f"{where}.inventory", f"{inventory} does not exist (or is not a file)",
            hint=f"a relative path is read from the fleet file's directory, {base}",
        )  # fmt: skip
    chosen = _text(path, where, entry, "cluster", False)
    try:
        loaded = load_inventory(inventory)
    except SparkOpsError as exc:
        raise _error(path, f"{where}.inventory", exc.message, hint=exc.hint) from exc
    held = ", ".join(loaded.clusters)
    if chosen is not None and chosen not in loaded.clusters:
        raise _error(
            path, f"{where}.cluster", f"{excerpt(chosen)} is not a cluster of {inventory}; its "
            f"clusters are {held}",
        )  # fmt: skip
    if chosen is None and loaded.default is None and len(loaded.clusters) > 1:
        raise _error(
            path, f"{where}.cluster",
            f"is required: {inventory} holds the clusters {held} and no default_cluster",
            hint="name one with `cluster:` in this entry (one entry per cluster you operate)",
        )  # fmt: skip
    cluster = loaded.cluster(chosen)
    # the cluster goes by its fleet name (plans, status, the local state kept per cluster name:
    # two inventories that both call their cluster `sim` stay two clusters here)
    return Member(name=name, inventory=str(inventory), cluster=replace(cluster, name=name))


def _machine(cluster: Cluster) -> tuple[str, int, str, str]:
    """What makes two clusters one: the head's address and SSH port, and the recipe file there
    (a path under `~`, or relative, is the SSH user's own: the user is part of it then)."""
    head = cluster.head
    path = cluster.recipe.path
    owner = "" if path.startswith("/") else (head.user or "")
    return head.host.lower().rstrip("."), head.port, owner, path


def _machine_text(cluster: Cluster) -> str:
    """The head and recipe `_machine` compares, as an error names them."""
    host, port, owner, path = _machine(cluster)
    return f"head {f'{owner}@' if owner else ''}{host}:{port}, recipe {path}"


def parse_fleet(text: str, source: str) -> Fleet:
    """Parse and validate fleet YAML text read from the file `source` (its inventories too)."""
    top = _keys(source, "", load_yaml(text, source=source, error=FleetError), TOP_KEYS)
    given = top.get("clusters")
    if not isinstance(given, list) or not given:
        raise _error(source, "clusters", "must be a list of at least one {name, inventory} entry")
    if len(given) > MAX_CLUSTERS:
        raise _error(source, "clusters", f"names {len(given)} clusters; at most {MAX_CLUSTERS}")
    base = Path(source).parent
    members: list[Member] = []
    for i, data in enumerate(given):
        m = _member(source, base, f"clusters[{i}]", data)
        for j, other in enumerate(members):
            if other.name == m.name:
                raise _error(
                    source, f"clusters[{i}].name",
                    f"{m.name!r} is also the name of clusters[{j}]; each cluster has its own name",
                )  # fmt: skip
            if _machine(other.cluster) == _machine(m.cluster):
                raise _error(
                    source, f"clusters[{i}] ({m.name})",
                    f"is the cluster clusters[{j}] ({other.name}) already names: "
                    f"{_machine_text(m.cluster)}; one machine under two names would take every "
                    "change twice",
                    hint=f"keep one of {other.name} and {m.name} in {source}",
                )  # fmt: skip
        members.append(m)
    return Fleet(path=source, members=tuple(members))


def load_fleet(path: str | os.PathLike[str]) -> Fleet:
    """Read and validate the fleet file at `path` (FleetError naming the file on any problem)."""
    p = Path(path).expanduser()
    return parse_fleet(read_text_capped(p, error=FleetError, what="the fleet file"), str(p))


def worst_exit(codes: list[int]) -> int:
    """The worst of the clusters' exit codes (SEVERITY's order; 0 for none)."""
    ranked = [int(s) for s in SEVERITY]

    def rank(code: int) -> tuple[int, int]:
        """Where a code stands: SEVERITY's place, or past it by its number."""
        return (ranked.index(code), 0) if code in ranked else (len(ranked), code)

    return max(codes, key=rank, default=int(ExitStatus.OK))


async def across(fleet: Fleet, read: Callable[[Cluster], Awaitable[T]]) -> list[Reading[T]]:
    """`read` on every cluster at once, each within its member's deadline; in the fleet's order.

    A cluster's SparkOpsError (or OSError) is its own reading's error; one past its deadline gets
    a TIMEOUT error naming it. The other clusters' readings are whole either way.
    """

    async def one(m: Member) -> Reading[T]:
        """One cluster's reading, bounded by its deadline."""
        try:
            return Reading(m, value=await asyncio.wait_for(read(m.cluster), m.deadline_s))
        except TimeoutError:
            return Reading(m, error=_timeout(m))
        except SparkOpsError as exc:
            return Reading(m, error=exc)
        except OSError as exc:
            return Reading(m, error=_unreachable(m, exc))

    return list(await asyncio.gather(*(one(m) for m in fleet.members)))


def _timeout(m: Member) -> SparkOpsError:
    """The error of a cluster that did not answer within its deadline."""
    return CommandTimeout(
        m.name,
        f"no answer within {m.deadline_s:g} s (its ssh.connect_timeout and "
        "twice its ssh.command_timeout)",
        hint=f"spark-ops --cluster {m.name} doctor",
    )


def _unreachable(m: Member, exc: OSError) -> SparkOpsError:
    """The error of a cluster whose head could not be reached at all."""
    return ConnectError(
        m.name, str(exc.strerror or exc), hint=f"spark-ops --cluster {m.name} doctor"
    )
