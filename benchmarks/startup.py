"""How long does spark-ops take to start, command by command; what do imports cost?

Times whole processes (medians of interleaved runs, with their min–max) of spark-ops installed as
operators install it (common.bench_venv: `pip install .` in a venv of its own). The commands are
the CLI's own table (`spark_ops.cli.main.COMMANDS`), not a list kept here, and each is timed the
same two ways: `spark-ops CMD --help` as a whole process, and the import path of running it --
every module the command's code can import (tests/import_graph.py's path from the CLI and the
command's module, as tests/test_imports.py derives it), timed as one `python -c 'import …'`
process against `python -c pass`. Beside them: `spark-ops --help` through the console script and
through whatever `spark-ops` is first on PATH (a pyenv shim, for instance), `spark-ops budget` /
`spark-ops exec -- true` against the embedded cluster (`spark-ops sim up`, 4 nodes), and the top
imports of exec's path by `python -X importtime`.

SPARK_OPS_BASELINE_VENV=DIR adds DIR/bin/spark-ops (another build) to every whole-process row,
interleaved with this one, and the ratio of the two medians.

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


def command_table() -> dict[str, str]:
    """The CLI's own command table (spark_ops.cli.main.COMMANDS): command name -> its module."""
    from spark_ops.cli.main import COMMANDS

    return {name: module for name, (module, _attr, _help) in COMMANDS.items()}


def command_paths() -> dict[str, tuple[list[str], list[str]]]:
    """The import path of running each command of the table: {command: (spark_ops modules, the
    third-party packages among the rest)}, from the import graph (tests/import_graph.py: the CLI
    and the command's module, each module's imports anywhere in it, every branch)."""
    import import_graph as graph

    out: dict[str, tuple[list[str], list[str]]] = {}
    for name in command_table():
        ours, others = graph.path_of(*graph.command_roots([name]))
        theirs = sorted(m for m in others if m not in graph.STDLIB and not m.startswith("_"))
        out[name] = (sorted(ours), theirs)
    return out


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


def ms(s: c.Samples | None) -> str:
    """A median and its spread in ms: `55 ms (51–70)`, a dash when not run, failures said."""
    if s is None or s.median is None:
        return "–"
    fail = f"; {s.failures} failed: {s.last_error[-60:]!r}" if s.failures else ""
    return f"{s.median * 1000:.0f} ms ({min(s.times) * 1000:.0f}–{max(s.times) * 1000:.0f}{fail})"


def ratio(a: c.Samples | None, b: c.Samples | None) -> str:
    """The ratio of two medians, or a dash."""
    if a is None or b is None or not a.median or not b.median:
        return "–"
    return f"{a.median / b.median:.2f}x"


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
    base = c.baseline_argv()
    builds = {"": (script, PY)}
    if base is not None:
        builds[" [baseline]"] = (base, str(Path(base[0]).parent / "python"))
    on_path = shutil.which("spark-ops")
    print(f"# load average {os.getloadavg()[0]:.1f}; cores {os.cpu_count()}; python {PY}")

    table = command_table()
    paths = command_paths()
    cases: dict[str, Any] = {}
    for tag, (argv0, py) in builds.items():
        cases[f"spark-ops --help{tag}"] = fixed([*argv0, "--help"])
        cases[f"python -m spark_ops.cli.main --help{tag}"] = fixed(
            [py, "-m", "spark_ops.cli.main", "--help"]
        )
        cases[f"python -c pass{tag}"] = fixed([py, "-c", "pass"])
        for name in table:
            cases[f"{name} --help{tag}"] = fixed([*argv0, name, "--help"])
            cases[f"{name} imports{tag}"] = fixed([py, "-c", import_code(*paths[name])])
    shim = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "shims" / "spark-ops"
    for other in {on_path, str(shim) if shim.exists() else None} - {None, script[0]}:
        assert other is not None
        cases[f"spark-ops --help via {other}"] = fixed([other, "--help"])
    sim = None if args.no_sim else start_sim(work)
    try:
        if sim is not None:
            env = dict(os.environ, SPARK_OPS_INVENTORY=str(sim[1]))
            for tag, (argv0, _py) in builds.items():
                cases[f"spark-ops budget (embedded cluster){tag}"] = fixed(
                    [*argv0, "-q", "budget"], env
                )
                cases[f"spark-ops exec -- true (embedded, 4 nodes){tag}"] = fixed(
                    [*argv0, "-q", "exec", "--", "true"], env
                )
        samples = c.interleaved(cases, args.repeats, warmup=2)
    finally:
        if sim is not None:
            from spark_ops.sim.control import down

            down(sim[0])
    tags = list(builds)
    other = tags[1] if len(tags) > 1 else None
    cols = ["command", "median (min–max)"]
    if other:
        cols += ["baseline", "this ÷ baseline"]
    rows = []
    whole = ["spark-ops --help", "python -m spark_ops.cli.main --help"]
    whole += [k for k in samples if k.startswith("spark-ops --help via ")]
    whole += ["spark-ops budget (embedded cluster)", "spark-ops exec -- true (embedded, 4 nodes)"]
    for name in whole:
        if name not in samples:
            continue
        row = [name, ms(samples[name])]
        if other:
            b = samples.get(name + other)
            row += [ms(b), ratio(samples[name], b)]
        rows.append(row)
    print(c.table("start-up, whole process", cols, rows))
    helps = samples["spark-ops --help"].median or 0
    verdict = "met" if helps < HELP_TARGET_S else "NOT met"
    print(f"- `spark-ops --help` {helps * 1000:.0f} ms: target < 150 ms {verdict}\n")

    bare = samples["python -c pass"].median or 0.0
    cols = ["command", "`CMD --help`", "path: spark_ops modules", "third-party",
            "path imports", "over python -c pass"]  # fmt: skip
    if other:
        cols += ["--help ÷ baseline", "imports ÷ baseline"]
    rows = [["(python -c pass)", "", "", "", ms(samples["python -c pass"]), ""]]
    if other:
        rows[0] += ["", ratio(samples["python -c pass"], samples.get("python -c pass" + other))]
    for name, (ours, theirs) in paths.items():
        imp = samples[f"{name} imports"]
        over = f"{((imp.median or 0.0) - bare) * 1000:+.0f} ms"
        row = [name, ms(samples[f"{name} --help"]), len(ours), ", ".join(theirs) or "-",
               ms(imp), over]  # fmt: skip
        if other:
            row += [ratio(samples[f"{name} --help"], samples.get(f"{name} --help{other}")),
                    ratio(imp, samples.get(f"{name} imports{other}"))]  # fmt: skip
        rows.append(row)
    print(c.table("every command of the CLI's table: `spark-ops CMD --help` and the import path "
                  "of running it (python -c), median (min–max)", cols, rows))  # fmt: skip

    code = import_code(*paths["exec"])
    rows = [[mod, f"{ms_:.1f} ms"] for mod, ms_ in importtime_top(code)]
    print(c.table("top imports of the exec path (python -X importtime, cumulative)",
                  ["module", "ms"], rows))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
