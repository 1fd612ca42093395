"""What workflows share: the open Operation (connections + lock), options, outcome."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from spark_ops.engine import EngineAPI
from spark_ops.errors import (
    InputError,
    RecipeError,
    SparkOpsError,
    excerpt,
)
from spark_ops.inventory import Cluster
from spark_ops.lock import cluster_lock
from spark_ops.log import get_logger
from spark_ops.readiness import BootReport
from spark_ops.recipe import Change, knob_values
from spark_ops.remote import ClusterSession, check_text
from spark_ops.verify import Check
from spark_ops.watchdog.contract import BudgetView, WatchdogContract
from spark_ops.watchdog.identify import stamp_json, stamps_json
from spark_ops.workflows.facts import HistoryProblem, KnobValue
from spark_ops.workflows.plan import Plan, RunFacts, StepKind, StepRun

if TYPE_CHECKING:
    from spark_ops.workflows.prove import Proof, Proving

MAX_REASON_BYTES = 1000


@dataclass
class ApplyOptions:
    """What the operator asked apply (or restart) to do."""

    changes: Sequence[Change] = ()
    vllm_version: str | None = None
    force: bool = False
    drain: bool = True
    drain_timeout_s: float = 120.0
    rollback_on_failure: bool = False
    deadline_s: float | None = None
    reason: str = "planned restart (spark-ops apply)"
    preflight: str = "auto"  # auto | vllm | sim | docker | off
    preflight_timeout_s: float = 60.0
    trust_keys: bool = False  # write --set/--flag keys the head's vLLM parser could not check
    command: str = ""  # the command line as run, for "run it again" and the audit
    over_budget: bool = False  # restart even when the watchdog's budget has no slot left
    boot_wait_s: float | None = None  # a boot under way: wait this long (None: boot deadline)
    prove: Proving | None = None  # --prove: measure before and after, keep only if the gate passes

    def __post_init__(self) -> None:
        """Refuse, before anything connects, a value that could not be sent or written whole.

        The reason reaches the watchdog's command line and journal, change values the recipe:
        each must be UTF-8 text without NUL or control characters, of a sane size; durations
        finite and positive. A value found bad only after the write would leave the recipe new
        and the engine old.
        """
        check_text("--reason", self.reason, max_bytes=MAX_REASON_BYTES)
        bad = next((c for c in self.reason if ord(c) < 32 and c != "\t"), None)
        if bad is not None:
            raise InputError(
                f"--reason: holds the control character {bad!r} in {excerpt(self.reason)}; "
                "nothing was changed",
                hint="give the reason on one line",
            )
        if len(self.command) > 4000:
            self.command = self.command[:4000] + " …"
        if self.vllm_version is not None:
            check_text("--vllm-version", self.vllm_version, max_bytes=64)
        for change in self.changes:
            name = str(getattr(change, "name", change))
            check_text(f"--{name}", name, max_bytes=256)
            value = getattr(change, "value", None)
            if isinstance(value, str):
                check_text(f"--{name.replace('_', '-')} value", value, max_bytes=64 << 10)
        for label, seconds, zero_ok in (
            ("--drain-timeout", self.drain_timeout_s, True),
            ("--deadline", self.deadline_s, False),
            ("--preflight-timeout", self.preflight_timeout_s, False),
            ("--boot-wait", self.boot_wait_s, True),
        ):
            if seconds is None:
                continue
            if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero_ok):
                what = "seconds >= 0" if zero_ok else "seconds > 0"
                raise InputError(f"{label}: {seconds!r} is not allowed; give {what}")


@dataclass(frozen=True)
class BootFollowed:
    """A boot a run followed: its step (boot, or the rollback's) and the boot's report."""

    step: StepKind
    report: BootReport

    def to_json(self) -> dict[str, Any]:
        """As the outcome's JSON holds it: the step's name beside the report."""
        return {"step": self.step.value, **self.report.to_dict()}


@dataclass
class Outcome:
    """What an executed plan did, beside the plan (never in it): the steps as they ran, what the
    run found, the boot report, the checks, the prune and the budget."""

    plan: Plan
    ok: bool
    stamp: float | None = None
    pruned: list[float] = field(default_factory=list)
    boot: BootReport | None = None
    checks: list[Check] = field(default_factory=list)
    budget: BudgetView | None = None
    rolled_back: bool = False
    error: SparkOpsError | None = None  # the failed boot (the run's error), when it recovered
    boots: list[BootFollowed] = field(default_factory=list)  # every boot followed, rollback's too
    warnings: list[str] = field(default_factory=list)  # e.g. gave-up appeared during the apply
    history_problem: HistoryProblem | None = None  # the history did not move: budget unknown
    steps: list[StepRun] = field(default_factory=list)  # the plan's steps as run (+ a rollback's)
    found: RunFacts = field(default_factory=RunFacts)
    proof: Proof | None = None  # --prove: what it measured at, before, after and the verdict

    def __post_init__(self) -> None:
        """Begin with every planned step pending."""
        if not self.steps:
            self.steps = [StepRun(s) for s in self.plan.steps]

    @property
    def checks_ok(self) -> bool:
        """True when no check failed."""
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json: the plan with its steps and facts as the run left them."""
        return {
            "ok": self.ok,
            "plan": self.plan.to_dict(self.steps, self.found),
            "stamp": stamp_json(self.stamp),
            "pruned": stamps_json(self.pruned),
            "boot": self.boot.to_dict() if self.boot is not None else None,
            "checks": [c.to_dict() for c in self.checks],
            "budget": self.budget.to_dict() if self.budget is not None else None,
            "rolled_back": self.rolled_back,
            "error": self.error.to_dict() if self.error is not None else None,
            "boots": [b.to_json() for b in self.boots],
            "warnings": self.warnings,
            "history_problem": (
                self.history_problem.to_json() if self.history_problem is not None else None
            ),
            "proof": self.proof.to_dict() if self.proof is not None else None,
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
        self.locked = False  # set when this operation holds the cluster lock

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
            op = cls(session, name)
            op.locked = lock
            yield op

    @asynccontextmanager
    async def hold_lock(self) -> AsyncIterator[None]:
        """Take the cluster lock for the block (after the confirmation: never while it waits)."""
        async with cluster_lock(self.session, self.name):
            self.locked = True
            try:
                yield
            finally:
                self.locked = False

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

    def engine(self, timeout: float = 10.0) -> EngineAPI:
        """An EngineAPI client bound to the resolved URL (use after api_url())."""
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


def jsonable(values: dict[str, Any]) -> dict[str, KnobValue]:
    """Make knob values JSON-friendly."""
    return {
        k: (v if isinstance(v, str | int | float | bool) or v is None else str(v))
        for k, v in values.items()
    }


@asynccontextmanager
async def engine_endpoint(cluster: Cluster) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """The engine's URL from here (tunnelled through the head if needed) and the recipe's knobs."""
    async with Operation.open(cluster, "bench", lock=False, nodes=[cluster.head.name]) as op:
        yield await op.api_url(), await head_knobs(op)


async def head_knobs(op: Operation) -> dict[str, Any]:
    """The recipe's knobs as the head's copy says ({} when the head holds no copy)."""
    cluster = op.cluster
    if cluster.head.name not in cluster.recipe.nodes:
        return {}
    text = await op.session.read_file(cluster.head.name, cluster.recipe.path, sudo=True)
    if text is None:
        return {}
    return jsonable(knob_values(text, source=f"{cluster.head.name}:recipe"))
