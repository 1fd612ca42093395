"""Benchmark: prune one stamp from a 100,000-line restart history, both formats; target < 1 s.

Usage: python benchmarks/history_prune.py [--lines 100000] [--repeats 7]
Times the in-process call and the way spark-ops runs it (source on stdin of ``python3 -``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spark_ops.watchdog import history
from spark_ops.watchdog.contract import history_source

SOURCE = history_source().encode()  # history.py with headlib, as sent to the head
TARGET_S = 1.0


def make_content(fmt: str, lines: int) -> tuple[bytes, int]:
    """Build a history of `lines` stamps; return content and the stamp in the middle."""
    base = 1_700_000_000
    stamps = [base + 37 * i for i in range(lines)]
    if fmt == "stamps":
        text = "".join(f"{s}\n" for s in stamps)
    else:
        text = "".join(
            json.dumps({"ts": s, "reason": "probe failed", "by": "watchdog", "forced": False})
            + "\n"
            for s in stamps
        )
    return text.encode(), stamps[lines // 2]


def time_once(path: Path, content: bytes, stamp: int, how: str) -> float:
    """Restore the file, then time one prune of `stamp`."""
    path.write_bytes(content)
    start = time.perf_counter()
    if how == "in-process":
        out = history.prune(str(path), stamps=[stamp], keep_backups=2)
    else:
        proc = subprocess.run(
            [
                sys.executable,
                "-",
                "prune",
                "--history",
                str(path),
                "--stamp",
                str(stamp),
                "--keep-backups",
                "2",
            ],
            input=SOURCE,
            capture_output=True,
            check=True,
        )
        out = json.loads(proc.stdout)
    elapsed = time.perf_counter() - start
    assert len(out["removed"]) == 1, out
    return elapsed


def main() -> None:
    """Run the benchmark and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("stamps", "jsonl"):
            content, stamp = make_content(fmt, args.lines)
            path = Path(tmp) / f"history-{fmt}"
            for how in ("in-process", "python3 -"):
                times = [time_once(path, content, stamp, how) for _ in range(args.repeats)]
                rows.append((fmt, how, len(content), statistics.median(times), max(times)))
    print(f"prune 1 stamp from {args.lines:,} lines, median of {args.repeats} (target < 1 s)")
    print(f"{'format':<8} {'how':<11} {'size':>10} {'median s':>9} {'max s':>7}  ok")
    for fmt, how, size, med, worst in rows:
        ok = "yes" if med < TARGET_S else "NO"
        print(f"{fmt:<8} {how:<11} {size:>10,} {med:>9.3f} {worst:>7.3f}  {ok}")


if __name__ == "__main__":
    main()
