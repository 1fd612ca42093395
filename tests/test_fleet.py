"""The fleet (docs/fleet.md): the fleet file's cases under tests/fixtures/fleet/ (each states its
expectation on line 1), the worst-exit table, and the CLI on a fleet of real embedded clusters run
side by side (two sims of two nodes, started once for the module, plus a third cluster whose head
does not answer): one table, the JSON list, the worst exit, and the refusals."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from conftest import Sim, start_sim

from spark_ops.errors import FleetError
from spark_ops.fleet import load_fleet, worst_exit

CASES = Path(__file__).parent / "fixtures" / "fleet"


def _expect(path: Path) -> str:
    """A case's expectation: its first line after `# expect: `."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), path
    return first.removeprefix("# expect: ")


@pytest.mark.parametrize("path", sorted((CASES / "valid").glob("*.yaml")), ids=lambda p: p.stem)
def test_valid(path: Path) -> None:
    """A valid fleet loads its clusters in the file's order, each under its fleet name."""
    fleet = load_fleet(path)
    assert fleet.names() == _expect(path).split()
    for m in fleet.members:
        assert m.cluster.name == m.name and Path(m.inventory).is_file()


@pytest.mark.parametrize("path", sorted((CASES / "invalid").glob("*.yaml")), ids=lambda p: p.stem)
def test_invalid(path: Path) -> None:
    """An invalid fleet is refused naming the file, the key and what is allowed."""
    with pytest.raises(FleetError) as err:
        load_fleet(path)
    said = err.value.message
    assert said.startswith(str(path)), said
    assert said.removeprefix(str(path.parent) + "/").startswith(_expect(path).rstrip()), said


@pytest.mark.parametrize(
    "case", yaml.safe_load((CASES / "worst.yaml").read_text()), ids=lambda c: str(c["codes"])
)
def test_worst_exit(case: dict[str, object]) -> None:
    """The fleet's exit code is the worst of its clusters' (SEVERITY's order)."""
    assert worst_exit(list(case["codes"])) == case["worst"]  # type: ignore[call-overload]


def test_a_reading_past_its_deadline_is_that_clusters_error() -> None:
    """`across` reads every cluster at once: one that never answers gets a TIMEOUT error naming
    it when its own deadline passes; the other's reading is whole."""
    import asyncio

    from spark_ops.errors import ExitStatus
    from spark_ops.fleet import across
    from spark_ops.inventory import Cluster

    fleet = load_fleet(CASES / "valid" / "deadlines.yaml")

    async def read(cluster: Cluster) -> str:
        """The slow cluster never answers; the other answers its name."""
        if cluster.name == "slow":
            await asyncio.Event().wait()
        return cluster.name

    slow, quick = asyncio.run(across(fleet, read))
    assert (quick.value, quick.error) == ("quick", None)
    assert slow.value is None and slow.error is not None
    assert slow.error.exit_status is ExitStatus.TIMEOUT
    assert slow.error.message.startswith("slow: no answer within"), slow.error.message


def test_metrics_carry_the_fleet_name(tmp_path: Path) -> None:
    """/metrics labels every sample with the cluster's name: its fleet name under a fleet."""
    from prometheus_client.parser import text_string_to_metric_families

    from spark_ops.serve.metrics import render_metrics

    member = load_fleet(CASES / "valid" / "two.yaml").member("west")
    status = {"nodes": [{"name": "n1", "reachable": True}], "budget": {}, "runs": {}}
    text = render_metrics(status, {"active": False}, None, cluster=member.cluster.name).decode()
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    assert samples and {s.labels["cluster"] for s in samples} == {"west"}


# -- a fleet of real embedded clusters ------------------------------------------------------------


@dataclass
class FleetRun:
    """Two running embedded clusters, a fleet file naming them (and one more that does not
    answer), and the environment that runs the CLI with it."""

    a: Sim
    b: Sim
    root: Path
    fleet: Path  # east, west: both serve
    with_dead: Path  # east, west and gone: gone's head does not answer
    env: dict[str, str]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetRun]:
    """Two embedded 2-node clusters side by side on loopback, each with its own ports."""
    from spark_ops.sim.control import down, wait_serving

    root = tmp_path_factory.mktemp("fleet")
    a = start_sim(root / "a", nodes=2)
    try:
        b = start_sim(root / "b", nodes=2)
    except BaseException:
        down(a.root)
        raise
    try:
        wait_serving(a.state)
        wait_serving(b.state)
        ports = iter(range(1, 100))  # nothing listens there: each node's connection is refused
        dead = re.sub(r"port: \d+", lambda _: f"port: {next(ports)}", b.inventory.read_text())
        dead = dead.replace("~/recipes/", "~/gone/recipes/")
        (root / "gone.yaml").write_text(dead)
        two = f"clusters:\n  - {{name: east, inventory: {a.inventory}}}\n" + (
            "  - {name: west, inventory: b/inventory.yaml}\n"
        )
        (root / "fleet.yaml").write_text(two)
        (root / "with-dead.yaml").write_text(two + "  - {name: gone, inventory: gone.yaml}\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_OPS_")}
        env["SPARK_OPS_FLEET"] = str(root / "fleet.yaml")
        yield FleetRun(a, b, root, root / "fleet.yaml", root / "with-dead.yaml", env)
    finally:
        down(b.root)
        down(a.root)


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The real CLI."""
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def _rows(stdout: str) -> dict[str, list[str]]:
    """A fleet table's rows by cluster (the line under the title is the header)."""
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith(("CLUSTER", "WHEN")))
    rows = {}
    for line in lines[header + 1 :]:
        cells = line.split()
        if cells and not line.startswith(" ") and ":" not in cells[0]:
            rows[cells[0]] = cells
    return rows


def test_status_spans_the_fleet(fleet: FleetRun) -> None:
    """Without --cluster, status reads every cluster: one table, a row each, exit 0 (all serve);
    --json is a list with one object per cluster, in the fleet's order."""
    res = _cli(fleet.env, "status")
    assert res.returncode == 0, res.stderr
    rows = _rows(res.stdout)
    assert list(rows) == ["east", "west"], res.stdout
    assert all(r[1] == "serving" and r[2] == "2/2" and r[-1] == "0" for r in rows.values())
    res = _cli(fleet.env, "status", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert [d["cluster"] for d in data] == ["east", "west"]
    assert all(set(d) == {"cluster", "inventory", "exit", "status"} for d in data)
    assert [d["status"]["cluster"] for d in data] == ["east", "west"]
    assert data[0]["inventory"] == str(fleet.a.inventory)
    assert all(d["status"]["verdict"]["state"] == "serving" for d in data)


def test_an_unreachable_cluster_hides_none(fleet: FleetRun) -> None:
    """A cluster whose head does not answer is its own row (not serving, exit 14); the others
    are read whole, and the fleet's exit is the worst: 14."""
    env = {**fleet.env, "SPARK_OPS_FLEET": str(fleet.with_dead)}
    res = _cli(env, "status")
    assert res.returncode == 14, res.stdout + res.stderr
    rows = _rows(res.stdout)
    assert rows["east"][1] == rows["west"][1] == "serving", res.stdout
    assert rows["gone"][1] == "not-serving" and rows["gone"][-1] == "14", res.stdout
    res = _cli(env, "budget", "--json")
    data = json.loads(res.stdout)
    assert [d["cluster"] for d in data] == ["east", "west", "gone"]
    assert "budget" in data[0] and "budget" in data[1] and "error" in data[2], data
    assert res.returncode == data[2]["exit"] == 4, res.stderr


def test_budget_doctor_and_log_span_the_fleet(fleet: FleetRun) -> None:
    """budget, doctor and log read every cluster too: one table each, a cluster column."""
    res = _cli(fleet.env, "budget")
    assert res.returncode == 0, res.stderr
    rows = _rows(res.stdout)
    assert list(rows) == ["east", "west"] and all(re.match(r"\d+/2$", r[1]) for r in rows.values())
    data = json.loads(_cli(fleet.env, "budget", "--json").stdout)
    assert [(d["cluster"], d["budget"]["allowed"]) for d in data] == [("east", 2), ("west", 2)]
    res = _cli(fleet.env, "doctor", "--json")
    assert res.returncode == 0, res.stdout
    data = json.loads(res.stdout)
    assert [(d["cluster"], d["report"]["ok"]) for d in data] == [("east", True), ("west", True)]
    res = _cli(fleet.env, "log", "-n", "2", "--json")
    assert res.returncode == 0, res.stderr
    keys = {"cluster", "inventory", "exit", "entries"}
    assert [set(d) for d in json.loads(res.stdout)] == [keys, keys]


def test_one_cluster_by_name(fleet: FleetRun) -> None:
    """--cluster NAME runs a command on that cluster's inventory, as -i would, under its name."""
    res = _cli(fleet.env, "--cluster", "west", "status", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["cluster"] == "west"
    assert {n["address"].split(":")[1] for n in data["nodes"]} == {
        str(p) for p in fleet.b.state["ports"].values()
    }
    res = _cli(fleet.env, "--cluster", "east", "budget", "prune", "--planned", "--dry-run")
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize(
    ("args", "env", "code", "said"),
    [
        (["apply", "--max-num-seqs", "8", "--yes"], {}, 2, "names the clusters east, west: "
         "`spark-ops apply` acts on one cluster; choose it with --cluster NAME"),
        (["restart", "--yes"], {}, 2, "`spark-ops restart` acts on one cluster"),
        (["plan", "--max-num-seqs", "8"], {}, 2, "`spark-ops plan` acts on one cluster"),
        (["rollback", "--yes"], {}, 2, "`spark-ops rollback` acts on one cluster"),
        (["budget", "prune", "--planned", "--yes"], {}, 2, "`spark-ops budget prune` acts on one"),
        (["exec", "--", "true"], {}, 2, "`spark-ops exec` acts on one cluster"),
        (["--cluster", "wset", "status"], {}, 3, "no cluster 'wset' in the fleet; its clusters "
         "are east, west"),
        (["-i", "x.yaml", "--fleet", "f.yaml", "status"], {}, 2, "-i x.yaml and --fleet f.yaml "
         "both given: choose one"),
        (["status"], {"SPARK_OPS_INVENTORY": "x.yaml"}, 2, "SPARK_OPS_INVENTORY (x.yaml) and "
         "SPARK_OPS_FLEET"),
        (["--fleet", "nowhere.yaml", "status"], {}, 3, "nowhere.yaml: cannot read the fleet file"),
    ],
    ids=["apply", "restart", "plan", "rollback", "prune", "exec", "unknown", "both-options",
         "both-env", "no-file"],
)  # fmt: skip
def test_refusals(
    fleet: FleetRun, args: list[str], env: dict[str, str], code: int, said: str
) -> None:
    """A change under a fleet without --cluster, an unknown cluster, -i with --fleet: each refused
    with its code and a message that names what to do; nothing runs."""
    res = _cli({**fleet.env, **env}, *args)
    assert res.returncode == code, res.stdout + res.stderr
    assert said in res.stderr.replace("\n", " "), res.stderr
    assert res.stdout == ""


def test_a_refusal_in_json(fleet: FleetRun) -> None:
    """With --json the refusal is one JSON object on stderr, as every error is; its hint is the
    command line again, with --cluster."""
    res = _cli(fleet.env, "restart", "--yes", "--json")
    assert res.returncode == 2 and res.stdout == "", res.stderr
    said = json.loads(res.stderr.strip().splitlines()[-1])
    assert said["error"] == "NeedsCluster" and "east, west" in said["message"], said
    assert said["hint"].startswith("spark-ops --cluster east restart --yes --json"), said
