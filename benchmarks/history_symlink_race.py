"""The watchdog appending beside the target while spark-ops prunes through a symlink (issue 20 #7).

Usage: python benchmarks/history_symlink_race.py [--seconds 30] [--runs 3]
Runs the race of tests/test_history_concurrency.py (`race_through_link`: a bash loop appending
under flock on <target>.lock as a bash watchdog does, against history.py appending and pruning a
marker through the link) for longer, and prints the watchdog's appends, the prunes and the appends
lost (must be 0).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_history_concurrency import race_through_link


def main() -> int:
    """Run the race --runs times; exit 1 if any append was lost."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    total_lost = 0
    print(f"{'run':>3} {'appends':>8} {'prunes':>7} {'lost':>5}")
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory() as tmp:
            appended, rounds, lines = race_through_link(Path(tmp), args.seconds)
        kept = {int(x) for x in lines if int(x) < 10**12}
        lost = len(set(range(1, appended + 1)) - kept)
        total_lost += lost
        print(f"{run:>3} {appended:>8} {rounds:>7} {lost:>5}")
    return 1 if total_lost else 0


if __name__ == "__main__":
    sys.exit(main())
