"""How the recipe edit scales with the recipe's size; prints a table (seconds per edit, per MB).

    python benchmarks/recipe_edit_size.py [--baseline REV]

Two shapes padded to growing sizes: many `defaults` entries, and many command flags. The edit is
linear when the seconds-per-MB column stays flat as the size grows (issue 13: a 48 MB recipe
took 5 minutes before the 256 KiB limit and the one-parse-per-text cache). With --baseline, the
same measure runs on that revision (`git archive` into a temporary directory, same Python) and
the table shows both side by side with the ratio baseline / now.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIZES = (500, 2000, 8000)


def shapes(base: str, n: int) -> dict[str, str]:
    """The two padded recipes with n entries each."""
    entries = "".join(f"  k{i}: {i}\n" for i in range(n))
    flags = "".join(f"      --flag-{i} {i} \\\n" for i in range(n))
    return {
        "defaults": base.replace("defaults:\n", "defaults:\n" + entries),
        "flags": base.replace("      --trust-remote-code", flags + "      --trust-remote-code"),
    }


def measure(repo: Path) -> list[dict[str, object]]:
    """Best of 3 seconds per edit for each shape and size, with the spark_ops of repo."""
    sys.path.insert(0, str(repo))
    from spark_ops.recipe import changes_from_options, edit_recipe

    base = (repo / "spark_ops" / "data" / "sim" / "glm-5.3-flash-sim.yaml").read_text()
    changes = changes_from_options(max_num_seqs="64", sets=("newkey=5",))
    rows: list[dict[str, object]] = []
    for n in SIZES:
        for name, text in shapes(base, n).items():
            best = float("inf")
            for _ in range(3):
                fresh = text + f"# {time.monotonic()}\n"  # no parse cached across rounds
                start = time.perf_counter()
                edit_recipe(fresh, changes, source="bench")
                best = min(best, time.perf_counter() - start)
            rows.append({"shape": name, "n": n, "bytes": len(text), "s": best})
    return rows


def baseline(rev: str) -> list[dict[str, object]]:
    """The same measure on revision rev, in a subprocess of this Python."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        code = f"import json, runpy; m = runpy.run_path({__file__!r}); "
        code += f"print(json.dumps(m['measure'](__import__('pathlib').Path({tmp!r}))))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        return list(json.loads(out.stdout))


def main() -> None:
    """Print one row per shape and size: bytes, seconds per edit and per MB (and the baseline's)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="REV", help="git revision to compare with")
    args = parser.parse_args()
    base = baseline(args.baseline) if args.baseline else None
    now = measure(REPO)
    head = f"{'shape':<9} {'entries':>8} {'bytes':>9} {'s/edit':>8} {'s/MB':>7}"
    print(head + (f" {'baseline s':>11} {'s/MB':>7} {'ratio':>7}" if base else ""))
    for i, row in enumerate(now):
        mb = float(row["bytes"]) / 1e6  # type: ignore[arg-type]
        s = float(row["s"])  # type: ignore[arg-type]
        line = f"{row['shape']:<9} {row['n']:>8} {row['bytes']:>9} {s:>8.3f} {s / mb:>7.2f}"
        if base:
            b = float(base[i]["s"])  # type: ignore[arg-type]
            line += f" {b:>11.3f} {b / mb:>7.2f} {b / s:>6.1f}x"
        print(line)


if __name__ == "__main__":
    main()
