"""How the recipe edit scales with the recipe's size; prints a table (seconds per edit, per MB).

    python benchmarks/recipe_edit_size.py

Two shapes padded to growing sizes: many `defaults` entries, and many command flags. The edit is
linear when the seconds-per-MB column stays flat as the size grows (issue 13: a 48 MB recipe
took 5 minutes before the 256 KiB limit and the one-parse-per-text cache).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from spark_ops.recipe import changes_from_options, edit_recipe  # noqa: E402

BASE = (REPO / "spark_ops" / "data" / "sim" / "glm-5.3-flash-sim.yaml").read_text()


def shapes(n: int) -> dict[str, str]:
    """The two padded recipes with n entries each."""
    entries = "".join(f"  k{i}: {i}\n" for i in range(n))
    flags = "".join(f"      --flag-{i} {i} \\\n" for i in range(n))
    return {
        "defaults": BASE.replace("defaults:\n", "defaults:\n" + entries),
        "flags": BASE.replace("      --trust-remote-code", flags + "      --trust-remote-code"),
    }


def main() -> None:
    """Print one row per shape and size: bytes, best of 3 seconds, seconds per MB."""
    changes = changes_from_options(max_num_seqs="64", sets=("newkey=5",))
    print(f"{'shape':<9} {'entries':>8} {'bytes':>9} {'s/edit':>8} {'s/MB':>7}")
    for n in (500, 2000, 8000):
        for name, text in shapes(n).items():
            best = min(_timed(text, changes) for _ in range(3))
            mb = len(text) / 1e6
            print(f"{name:<9} {n:>8} {len(text):>9} {best:>8.3f} {best / mb:>7.2f}")


def _timed(text: str, changes: list) -> float:
    """Seconds for one edit of text (a fresh text each time: no parse cached across rounds)."""
    text = text + f"# {time.monotonic()}\n"
    start = time.perf_counter()
    edit_recipe(text, changes, source="bench")
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
