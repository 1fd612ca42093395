"""How long does spark-ops take to start (--help, budget, exec -- true); what do imports cost?

Times whole processes (medians of interleaved runs) of spark-ops installed as operators install it
(common.bench_venv: `pip install .` in a venv of its own): `spark-ops --help` through the console
script itself and through whatever `spark-ops` is first on PATH (a pyenv shim, for instance), and
`spark-ops budget` / `spark-ops exec -- true` against the embedded cluster (`spark-ops sim up`, 4
nodes). Then what each command imports when it runs, read from a fresh process's sys.modules as
tests/test_imports.py reads it (tests/import_graph.py: no list by hand), each timed as a `python
-c 'import …'` process against `python -c pass`; and the top imports of exec's path by `python -X
importtime`.

    python benchmarks/startup.py [--repeats 15] [--no-sim]

Target: `spark-ops --help` under 150 ms.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c

HELP_TARGET_S = 0.150
PY = sys.executable  # replaced in main() by the benchmark venv's interpreter


def command_paths(work: Path) -> dict[str, tuple[list[str], list[str]]]:
    """What each command imports when it runs: {command line: (spark_ops modules, third-party
    packages)}, read from a fresh process's sys.modules as tests/test_imports.py reads them
    (tests/import_graph.py), the command run against nodes that refuse."""
    import import_graph as graph

    inv = str(graph.refusing_inventory(work))
    out: dict[str, tuple[list[str], list[str]]] = {}
    for argv in COMMAND_LINES:
        modules = graph.loaded(["-i", inv, *argv] if argv != ["--help"] else argv, work)
        out[" ".join(["spark-ops", *argv])] = graph.importable(modules)
    return out


# The command lines whose paths are timed (each path itself is read from the run, not listed).
COMMAND_LINES = [["--help"], ["exec", "--", "true"], ["status"], ["budget"]]


def import_code(modules: list[str], third: list[str]) -> str:
    """`python -c` code importing a path's modules (a missing optional package is skipped)."""
    lines = [f"import {m}" for m in modules]
    lines += [f"try:\n    import {m}\nexcept ImportError:\n    pass" for m in third]
    return "\n".join(lines) or "pass"


def fixed(argv: list[str], env: dict[str, str] | None = None) -> Any:
    """A case of common.interleaved that runs the same argv every round."""

    def case(rnd: int) -> tuple[list[str], dict[str, str] | None]:
        """The fixed argv and environment."""
        return argv, env

    return case


def importtime_top(code: str, n: int = 12) -> list[tuple[str, float]]:
    """The n costliest top-level imports (cumulative ms) of `python -X importtime -c code`."""
    proc = subprocess.run(
        [PY, "-X", "importtime", "-c", code], capture_output=True, text=True, check=False
    )
    top: list[tuple[str, float]] = []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( +)(\S+)", line)
        if m and len(m.group(3)) <= 2:  # depth 0 (one space) or 1 (three spaces) is skipped
            top.append((m.group(4), int(m.group(2)) / 1000))
    return sorted(top, key=lambda t: -t[1])[:n]


def start_sim(work: Path) -> tuple[Path, Path] | None:
    """Start the embedded cluster; return (root, inventory) or None when it cannot start."""
    try:
        from spark_ops.sim.cluster import SimOptions
        from spark_ops.sim.control import up
    except ImportError:
        return None
    root = work / "sim"
    state = up(root, SimOptions(time_scale=4.0, boot_scale=1.0))
    return root, Path(state["inventory"])


def main(argv: list[str] | None = None) -> int:
    """Measure and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--no-sim", action="store_true")
    args = ap.parse_args(argv)
    global PY
    work = Path(tempfile.mkdtemp(prefix="spark-ops-bench-startup-"))
    script = c.spark_ops_argv()
    PY = c.bench_python()
    on_path = shutil.which("spark-ops")
    print(f"# load average {os.getloadavg()[0]:.1f}; cores {os.cpu_count()}; python {PY}")

    cases: dict[str, Any] = {"spark-ops --help (console script)": fixed([*script, "--help"])}
    shim = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "shims" / "spark-ops"
    for other in {on_path, str(shim) if shim.exists() else None} - {None, script[0]}:
        assert other is not None
        cases[f"spark-ops --help via {other}"] = fixed([other, "--help"])
    cases["python -m spark_ops.cli.main --help"] = fixed([PY, "-m", "spark_ops.cli.main", "--help"])
    sim = None if args.no_sim else start_sim(work)
    try:
        if sim is not None:
            env = dict(os.environ, SPARK_OPS_INVENTORY=str(sim[1]))
            cases["spark-ops budget (embedded cluster)"] = fixed([*script, "-q", "budget"], env)
            cases["spark-ops exec -- true (embedded, 4 nodes)"] = fixed(
                [*script, "-q", "exec", "--", "true"], env
            )
        samples = c.interleaved(cases, args.repeats, warmup=2)
    finally:
        if sim is not None:
            from spark_ops.sim.control import down

            down(sim[0])
    rows = []
    for name, s in samples.items():
        fail = f" ({s.failures} failed: {s.last_error[-80:]!r})" if s.failures else ""
        rows.append([name, f"{(s.median or 0) * 1000:.0f} ms{fail}"])
    print(c.table("start-up, whole process, median", ["command", "median"], rows))
    helps = samples["spark-ops --help (console script)"].median or 0
    verdict = "met" if helps < HELP_TARGET_S else "NOT met"
    print(f"- `spark-ops --help` {helps * 1000:.0f} ms: target < 150 ms {verdict}\n")

    paths = command_paths(work)
    layer_cases = {"python -c pass": fixed([PY, "-c", "pass"])}
    for name, (ours, theirs) in paths.items():
        layer_cases[name] = fixed([PY, "-c", import_code(ours, theirs)])
    layers = c.interleaved(layer_cases, args.repeats, warmup=1)
    base = layers["python -c pass"].median or 0.0
    rows = [["python -c pass (interpreter + site)", "", "", f"{base * 1000:.0f} ms", ""]]
    for name, (ours, theirs) in paths.items():
        med = layers[name].median or 0.0
        rows.append([name, len(ours), ", ".join(theirs) or "-", f"{med * 1000:.0f} ms",
                     f"{(med - base) * 1000:+.0f} ms"])  # fmt: skip
    cols = ["command", "spark_ops modules", "third-party", "imports", "over python"]
    print(c.table("what each command's path imports (derived from the import graph; python -c, "
                  "median)", cols, rows))  # fmt: skip

    code = import_code(*paths["spark-ops exec -- true"])
    rows = [[mod, f"{ms:.1f} ms"] for mod, ms in importtime_top(code)]
    print(c.table("top imports of the exec path (python -X importtime, cumulative)",
                  ["module", "ms"], rows))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
