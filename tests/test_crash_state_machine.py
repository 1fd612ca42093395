"""A stateful property: commands interleaved with kills, the watchdog, a colleague, a 2nd inventory.

hypothesis's rule-based state machine drives one embedded cluster (tests/crash/harness.py) with
`apply` of a random value, `restart`, `budget prune --planned`, a SIGKILL of apply or restart at a
random step boundary followed by the same command again, an automatic restart stamp appended
through the watchdog's own history tool, a colleague's edit of one node's recipe copy, and a
second inventory (the same head, recipe and watchdog, its own state dir) running `restart` while
the first runs `apply`. After every rule: (a) the copies are whole and agree (unless the
colleague's edit is pending), (b) after a command that ended 0 the engine runs the recipe, (c)
the history is exactly the watchdog's own entries, (d) every changing run has an audit record,
(e) every lock is free. Few examples in CI; SPARK_OPS_CRASH_EXAMPLES raises them.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from crash.harness import (
    BOUNDARIES,
    PLANNED_BY,
    CrashCluster,
    KillPoint,
    cap_of,
    changes,
    run_interrupted,
    whole,
)
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from spark_ops.watchdog import history as wd_history

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("SPARK_OPS_CRASH_EXAMPLES", "3"))
STEPS = int(os.environ.get("SPARK_OPS_CRASH_STEPS", "3"))
CAPS = [6, 8, 16, 64]


class CrashMachine(RuleBasedStateMachine):
    """One embedded cluster; the model: the watchdog's own entries, pending edits, audit due."""

    cluster: CrashCluster

    def __init__(self) -> None:
        """Start from the cluster as repaired: recipe copies agree, engine runs them."""
        super().__init__()
        c = self.cluster
        c.repair()
        self.start = c.snapshot()
        self.audit_start = len(c.audit()) + len(c.audit(second=True))
        self.changing_runs = 0
        self.pending_edit = False
        self.last_ok: bool | None = None  # the last command's exit was 0 (None: no command)
        self.appended = 0
        self.problems: list[str] = []

    # -- running commands, remembering what they changed
    def _run(self, args: list[str], point: KillPoint | None = None, second: bool = False) -> int:
        """Run one command (interrupted at point), counting it when it changed something."""
        c = self.cluster
        before = c.snapshot()
        res = run_interrupted(c.env(second), args, point, c.root)
        self.changing_runs += bool(changes(c, before, c.snapshot()))
        assert res.code is not None
        return res.code

    def _apply_args(self, value: int) -> list[str]:
        """apply VALUE (--force while a colleague's edit makes the copies differ)."""
        force = ["--force"] if self.pending_edit else []
        return ["apply", "--max-num-seqs", str(value), "--yes", "--json", "--no-drain", *force]

    @rule(value=st.sampled_from(CAPS))
    def apply(self, value: int) -> None:
        """apply a random value."""
        code = self._run(self._apply_args(value))
        self.last_ok = code == 0
        if code == 0:
            self.pending_edit = False

    @rule()
    def restart(self) -> None:
        """restart (the engine from the head's recipe)."""
        self.last_ok = self._run(["restart", "--yes", "--json", "--no-drain"]) == 0

    @rule()
    def prune_planned(self) -> None:
        """budget prune --planned (nothing but spark-ops' own stamps may go)."""
        self._run(["budget", "prune", "--planned", "--yes", "--json"])
        self.last_ok = None

    @rule(
        command=st.sampled_from(["apply", "restart"]),
        at=st.sampled_from(BOUNDARIES["restart"]),
        value=st.sampled_from(CAPS),
    )
    def sigkill_then_rerun(self, command: str, at: tuple[str, int], value: int) -> None:
        """SIGKILL the running command at a step boundary, then run it again."""
        args = (
            self._apply_args(value)
            if command == "apply"
            else ["restart", "--yes", "--json", "--no-drain"]
        )
        self._run(args, KillPoint(*at))
        code = self._run(args)
        self.last_ok = code == 0
        if code == 0 and command == "apply":
            self.pending_edit = False

    @precondition(lambda self: self.appended < 1)  # the budget (2 in 6 h) holds one more
    @rule()
    def watchdog_append(self) -> None:
        """An automatic restart stamp, appended through the watchdog's own tool."""
        self.cluster.watchdog_append()
        self.appended += 1
        self.last_ok = None

    @rule(node=st.integers(0, 1), value=st.sampled_from(CAPS))
    def colleague_edit(self, node: int, value: int) -> None:
        """A colleague sets the cap in one node's copy, in place."""
        self.cluster.colleague_edit(node, value)
        self.pending_edit = len(set(self.cluster.snapshot()["recipes"])) > 1
        self.last_ok = None

    @rule(value=st.sampled_from(CAPS))
    def second_inventory_races(self, value: int) -> None:
        """The second inventory's restart while the first inventory's apply runs."""
        codes: dict[str, int] = {}

        def second() -> None:
            """The other operator's restart."""
            codes["b"] = self._run(["restart", "--yes", "--json", "--no-drain"], second=True)

        t = threading.Thread(target=second)
        t.start()
        codes["a"] = self._run(self._apply_args(value))
        t.join()
        self.last_ok = codes["a"] == 0 and codes["b"] == 0
        if codes["a"] == 0:
            self.pending_edit = False

    # -- the invariants
    @invariant()
    def cluster_stays_true(self) -> None:
        """(a)–(e) after every rule."""
        c = self.cluster
        snap = c.snapshot()
        bad = []
        head = snap["recipes"][0]
        caps = set(CAPS) | {cap_of(self.start["recipes"][0]) or 6}
        for i, text in enumerate(snap["recipes"]):
            if not whole(text, self.start["recipes"][i], caps) and not whole(
                text, self.start["recipes"][0], caps
            ):
                bad.append(f"(a) {c.recipe_nodes[i]}'s copy is not whole")
        if not self.pending_edit and len(set(snap["recipes"])) > 1:
            bad.append(f"(a) copies disagree: caps {[cap_of(t) for t in snap['recipes']]}")
        if self.last_ok:
            eng = c.engine()
            have = (eng.get("effective") or {}).get("max_num_seqs") if eng.get("up") else None
            if have != cap_of(head):
                bad.append(f"(b) engine runs {have}, the head's recipe says {cap_of(head)}")
        recs = c.journal_since(self.start["journal_n"])
        automatic = Counter(
            str(int(r["stamp"]))
            for r in recs
            if r.get("action", "restart") in ("restart", "append")
            and not wd_history.is_planned(r, PLANNED_BY)
        )
        expected = Counter(self.start["history"]) + automatic
        actual = Counter(snap["history"])
        if expected != actual:
            bad.append(
                f"(c) history lost {sorted((expected - actual).elements())}, "
                f"left {sorted((actual - expected).elements())}"
            )
        records = len(c.audit()) + len(c.audit(second=True)) - self.audit_start
        if records < self.changing_runs:
            bad.append(f"(d) {records} audit records for {self.changing_runs} changing runs")
        held = c.locks_held()
        if held:
            bad.append(f"(e) locks held: {held}")
        assert not bad, "\n".join(bad)

    def teardown(self) -> None:
        """Put the cluster back for the next example."""
        self.cluster.repair()


@pytest.fixture(scope="module")
def machine_cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One embedded cluster for every example."""
    c = CrashCluster(Path(tmp_path_factory.mktemp("crash-sm")))
    try:
        yield c
    finally:
        c.close()


def test_crash_state_machine(machine_cluster: CrashCluster) -> None:
    """Interleavings of commands, kills and other writers keep the cluster and records true."""
    CrashMachine.cluster = machine_cluster
    run_state_machine_as_test(
        CrashMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
            phases=(Phase.explicit, Phase.generate),  # no shrinking: each step is a real run
        ),
    )
