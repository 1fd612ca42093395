"""Shared test set-up: where the shared real-world data lives, and the embedded cluster fixture."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from crash.harness import CrashCluster
from embedded import start_nodes
from ground.fixtures import (  # noqa: F401
    node_daemons,
    openssh_cluster,
    real_ray,
    real_vllm,
    real_vllm_factory,
)

from spark_ops.inventory import Cluster

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
REQUIRE_GROUND = "SPARK_OPS_REQUIRE_GROUND"  # set by .ci/run: a skipped tier is a failure there


def cluster_files(history: Path, state_dir: str = "/var/tmp/spark-ops") -> dict[str, Path]:
    """The cluster lock, its owner file and the audit log the head keeps for a watchdog.

    Both are keyed by the real path of the watchdog's restart history (spark_ops/lock.py); the
    lock is always in the head-wide lock dir, the audit in the inventory's state dir.
    """
    from spark_ops.lock import LOCK_DIR, cluster_key, lock_paths

    key = cluster_key(os.path.realpath(history))
    lock, owner = lock_paths(key, LOCK_DIR)
    audit = Path(state_dir) / f"cluster-{key}.audit.jsonl"
    return {"lock": Path(lock), "owner": Path(owner), "audit": audit}


HEAVY_MARKS = ("realvllm", "realray", "docker")  # tests that boot real engines or Ray (CPU-bound)
HEAVY_FIXTURES = ("real_vllm", "real_vllm_factory", "real_ray", "node_daemons")
# The embedded clusters share this machine's process table: a loop watchdog one module starts is
# seen by `init` and `doctor` on every other cluster's head (another engine's, so not adopted, but
# said), and the docs' outputs are compared byte for byte. These modules run one after another.
ONE_PROCESS_TABLE = (
    "tests/test_loop_watchdog.py", "tests/test_docs_outputs.py", "tests/test_init.py",
    "tests/test_init_sparkrun.py",
)  # fmt: skip


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`-n 2 --dist loadgroup`, as README and .ci/run say): one group per
    module, so a module's shared fixtures start once; every test that boots real vLLM, Ray or
    Docker in one group ("heavy"), so two CPU-bound boots never share the two cores while the
    embedded-cluster tests, which mostly wait, run beside them on the other worker; the modules
    of ONE_PROCESS_TABLE in one group."""
    for item in items:
        heavy = any(item.get_closest_marker(m) is not None for m in HEAVY_MARKS) or any(
            f in HEAVY_FIXTURES for f in getattr(item, "fixturenames", ())
        )
        module = item.nodeid.split("::", 1)[0]
        group = "heavy" if heavy else ("processes" if module in ONE_PROCESS_TABLE else module)
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_configure(config: pytest.Config) -> None:
    """Under `--dist loadgroup`, refuse to start when pytest-xdist cannot group: it marks a
    test's group by suffixing `Node._nodeid`, which pytest 9.2 no longer reads; the heavy tiers
    would then boot side by side on the two cores, and a module's fixtures start twice."""
    from _pytest.nodes import Node

    if config.getoption("dist", default="no") != "loadgroup":
        return
    nodeid = getattr(Node, "nodeid", None)
    reads = getattr(getattr(nodeid, "fget", None), "__code__", None)
    if reads is not None and "_nodeid" not in reads.co_names:
        raise pytest.UsageError(
            f"pytest {pytest.__version__} with pytest-xdist: --dist loadgroup would group nothing "
            "(xdist suffixes Node._nodeid, which this pytest ignores); install the versions "
            "pyproject.toml allows: pip install -e '.[test]'"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under SPARK_OPS_REQUIRE_GROUND=1 a skip (sshd, vLLM or Ray missing) fails instead."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.skipped and os.environ.get(REQUIRE_GROUND) == "1":
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped ({reason}), but {REQUIRE_GROUND}=1 asks for every tier to run"


class Sim:
    """A running embedded cluster: its directory, inventory and node control."""

    def __init__(self, root: Path, state: dict) -> None:
        """Keep the state written by `sim up`."""
        self.root = root
        self.state = state
        self.inventory = Path(state["inventory"])
        self.head = root / "nodes" / "node1"

    @property
    def history(self) -> Path:
        """The watchdog's restart history on the head."""
        return self.head / ".local" / "state" / "spark-watchdog" / "restarts"

    @property
    def recipe(self) -> Path:
        """The recipe file on the head."""
        return self.head / "recipes" / "glm-5.3-flash-sim.yaml"

    def stop_node(self, name: str) -> None:
        """Take a node off the network."""
        from spark_ops.sim.control import node

        node(self.root, "stop", name)

    def stop_raylet(self, name: str) -> None:
        """Stop a worker's Ray worker only (its SSH server stays up)."""
        from spark_ops.sim.control import node

        node(self.root, "stop-raylet", name)

    def start_node(self, name: str) -> None:
        """Bring a node back."""
        from spark_ops.sim.control import node

        node(self.root, "start", name)


def start_sim(root: Path, **kw: object) -> Sim:
    """Start an embedded cluster in root (a fast one by default)."""
    from spark_ops.sim.cluster import SimOptions
    from spark_ops.sim.control import up

    # the Ray shape unless a test asks for ranks (`executor="mp"`, the CLI's default): most
    # suites were written against it; tests/test_sim_ranks.py and the CLI's tests run ranks
    base = {"time_scale": 4.0, "boot_scale": 1.0, "executor": "ray"}
    opts = SimOptions(**{**base, **kw})  # type: ignore[arg-type]
    state = up(root, opts)
    return Sim(root, state)


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Sim]:
    """A fresh embedded 4-node cluster with the engine serving (cap 6), stopped afterwards."""
    from spark_ops.sim.control import down, wait_serving

    s = start_sim(tmp_path / "sim")
    try:
        wait_serving(s.state)  # `up` returns when the nodes listen; the engine's first boot goes on
        yield s
    finally:
        down(s.root)


@pytest.fixture
def cli_env(sim: Sim) -> dict[str, str]:
    """Environment for running the spark-ops CLI against the embedded cluster."""
    env = dict(os.environ)
    env["SPARK_OPS_INVENTORY"] = str(sim.inventory)
    env.pop("SPARK_OPS_CLUSTER", None)
    env.pop("SPARK_OPS_FLEET", None)
    return env


@pytest.fixture
async def one_node(tmp_path: Path) -> AsyncIterator[Cluster]:
    """One running embedded node, the cluster's head (it signals a command's process group when
    the command's channel closes); stopped after the test."""
    nodes, c = await start_nodes(tmp_path, 1)
    try:
        yield c
    finally:
        for n in nodes:
            await n.stop()


@pytest.fixture(scope="module")
def crash_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashCluster]:
    """One embedded cluster (2 nodes, the recipe on both) for every case of a crash module."""
    c = CrashCluster(tmp_path_factory.mktemp("crash"))
    try:
        yield c
    finally:
        c.close()
