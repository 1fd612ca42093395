"""A plan renders each recipe text once (issue 31): the edit's check, the knobs, the key check,
preflight and the KV warning all take the command from the plan's one rendering; the plan made
again under the lock renders nothing again; `apply --yes` makes its plan once, under the lock,
and runs that plan.

Every `render_recipe` a spark_ops module holds is replaced by a counting one while the plan is
made against a 2-node embedded cluster (real SSH); the cases are tests/fixtures/render_once/.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

import spark_ops.cli.apply
import spark_ops.cli.main
import spark_ops.recipe.render
import spark_ops.workflows
import spark_ops.workflows.execute
import spark_ops.workflows.plans
from spark_ops.errors import SparkOpsError
from spark_ops.inventory import Cluster, load_inventory
from spark_ops.log import configure
from spark_ops.recipe import Change
from spark_ops.workflows import ApplyOptions, Operation, plan_apply
from spark_ops.workflows.gate import ensure_same
from spark_ops.workflows.plan import Plan

FIXTURES = Path(__file__).parent / "fixtures"
CASES = yaml.safe_load((FIXTURES / "render_once" / "cases.yaml").read_text("utf-8"))
sys.path.insert(0, str(FIXTURES / "doctor"))
from minicluster import MiniCluster  # noqa: E402


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    """A 2-node embedded cluster (no engine needed), for the whole module."""
    m = MiniCluster(tmp_path_factory.mktemp("render") / "sim", nodes=2).start(engine=False)
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture(params=CASES, ids=[c["name"] for c in CASES])
def recipe(request: pytest.FixtureRequest, mini: MiniCluster) -> Iterator[str]:
    """The case's recipe on every node that holds one (the cluster's own restored afterwards)."""
    own = mini.recipe.read_text("utf-8")
    name = request.param["recipe"]
    text = own if name is None else (FIXTURES / name).read_text("utf-8")
    copies = [mini.home(n) / mini.recipe.relative_to(mini.head) for n in ("node1", "node2")]
    copies = [path for path in copies if path.exists()]  # the nodes the recipe lives on
    for path in copies:
        path.write_text(text, "utf-8")
    try:
        yield text
    finally:
        for path in copies:
            path.write_text(own, "utf-8")


@pytest.fixture
def rendered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts rendered while the test runs, one entry per call of render_recipe."""
    original = spark_ops.recipe.render.render_recipe
    texts: list[str] = []

    def counting(text: str, *, source: str, includes: Any = None) -> Any:
        """Count, then render."""
        texts.append(text)
        return original(text, source=source, includes=includes)

    for module in list(sys.modules.values()):
        named = module is not None and module.__name__.startswith("spark_ops")
        if named and getattr(module, "render_recipe", None) is original:
            monkeypatch.setattr(module, "render_recipe", counting)
    return texts


def cluster_of(mini: MiniCluster, state: str) -> Cluster:
    """The cluster with its own state dir (one audit and journal per test)."""
    base = load_inventory(mini.inventory).cluster()
    return dataclasses.replace(base, state_dir=f"~/.local/state/{state}")


def options() -> ApplyOptions:
    """`apply --max-num-seqs 64` (no drain: no engine serves here)."""
    return ApplyOptions(changes=[Change.knob("max_num_seqs", 64)], drain=False)


def assert_each_text_rendered_once(texts: list[str], old: str, plan: Plan) -> None:
    """The old text and the edited one were rendered, each exactly once."""
    new = plan.changes[0].new_text
    assert new != old
    counts = Counter(texts)
    times = {"old text": counts.pop(old, 0), "new text": counts.pop(new, 0)}
    assert not counts, f"{len(counts)} other text(s) rendered"
    assert times == {"old text": 1, "new text": 1}, f"times rendered: {times}"


async def test_a_plan_and_its_replan_render_each_text_once(
    mini: MiniCluster, recipe: str, rendered: list[str]
) -> None:
    """The plan shown, then the plan made again under the lock: two texts, two renderings."""
    cluster = cluster_of(mini, "render-plan")
    async with Operation.open(cluster, "apply", lock=False) as op:
        shown = await plan_apply(op, options())
        async with op.hold_lock():
            final = await plan_apply(op, options(), shown)
    ensure_same(shown, final)  # the CLI's own test of "the plan shown"
    assert final.facts.knobs_before and final.facts.knobs_before["max_num_seqs"] == 6
    assert final.facts.knobs_after and final.facts.knobs_after["max_num_seqs"] == 64
    assert final.facts.preflight is not None, "preflight judged the rendered command"
    assert_each_text_rendered_once(rendered, recipe, final)


class Stop(SparkOpsError):
    """Raised by the stand-in executor: the test ends the run where it would begin."""


def test_apply_yes_plans_once_under_the_lock_and_runs_that_plan(
    mini: MiniCluster,
    recipe: str,
    rendered: list[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """`apply --yes`: nothing waits between the plan and the run, so the plan is made once,
    under the lock, and the executor is given exactly that plan."""
    made: list[tuple[Plan, bool]] = []
    ran: list[tuple[Plan, bool]] = []

    async def planning(op: Operation, opts: ApplyOptions, shown: Plan | None = None) -> Plan:
        """Plan, and record the plan and whether the lock was held."""
        plan = await plan_apply(op, opts, shown)
        made.append((plan, op.locked))
        return plan

    async def executing(op: Operation, plan: Plan, *args: Any, **kw: Any) -> Any:
        """Record the plan given to run, then stop before anything runs."""
        ran.append((plan, op.locked))
        raise Stop("stopped by the test before the first step")

    monkeypatch.setattr(spark_ops.workflows, "plan_apply", planning)
    monkeypatch.setattr(spark_ops.workflows.execute, "execute", executing)
    inventory = tmp_path / "inventory.yaml"
    data = yaml.safe_load(mini.inventory.read_text("utf-8"))
    for cluster in data["clusters"].values():
        cluster["state_dir"] = "~/.local/state/render-yes"
    inventory.write_text(yaml.safe_dump(data), "utf-8")
    args = ["--inventory", str(inventory), "apply", "--max-num-seqs", "64", "--yes", "--no-drain"]
    try:
        result = CliRunner().invoke(spark_ops.cli.main.cli, args, catch_exceptions=True)
    finally:
        configure()  # the CLI set the log level for its run: the default again for what follows
    assert ran, result.output
    assert len(made) == 1, f"the plan was made {len(made)} times"
    assert made[0][1] and ran[0][1], "planned and run with the lock held"
    assert made[0][0] is ran[0][0], "the executor is given exactly the plan made and shown"
    assert_each_text_rendered_once(rendered, recipe, ran[0][0])
