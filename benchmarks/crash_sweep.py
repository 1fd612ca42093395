"""The full crash-consistency sweep: 200+ kill points across apply, restart, rollback, budget prune
and experiment, each signal and the restart command, on one embedded cluster.

    python benchmarks/crash_sweep.py --out crash.jsonl [--seed 20] [--minutes 30] [--only apply]
    python benchmarks/crash_sweep.py --table crash.jsonl      # the table of an earlier run

Each case is run by tests/crash/harness.py (interrupt, re-run with --yes, check (a)–(e)); one JSON
line per case goes to --out; the table counts per command and signal: kill points tried, divergent
states after the re-run (recipe copies torn or disagreeing, or the engine not running the recipe),
audit records missing, history entries lost or left, lock left held. Cases run round-robin over
the commands, so a run cut short by --minutes still covers every command.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from crash.harness import (
    CrashCluster,
    KillPoint,
    boundary_points,
    random_points,
    restart_command_points,
    run_case,
    write_record,
)


def plan(seed: int) -> list[tuple[str, KillPoint]]:
    """Every case of the full sweep (221), round-robin over the commands."""
    per: dict[str, list[KillPoint]] = {
        "apply": [
            *(p for s in ("KILL", "INT", "TERM") for p in boundary_points("apply", s)),
            *random_points("apply", 20, seed),
            *random_points("apply", 10, seed, "INT"),
            *random_points("apply", 10, seed, "TERM"),
            *restart_command_points(10, seed),
        ],
        "restart": [
            *(p for s in ("KILL", "INT", "TERM") for p in boundary_points("restart", s)),
            *random_points("restart", 10, seed),
            *restart_command_points(6, seed + 1),
        ],
        "rollback": [
            *(p for s in ("KILL", "INT") for p in boundary_points("rollback", s)),
            *random_points("rollback", 8, seed),
            *restart_command_points(4, seed + 2),
        ],
        "prune-planned": [
            *(p for s in ("KILL", "INT", "TERM") for p in boundary_points("prune-planned", s)),
            *random_points("prune-planned", 10, seed, max_delay=0.8),
        ],
        "prune-stamp": [
            *(p for s in ("KILL", "INT", "TERM") for p in boundary_points("prune-stamp", s)),
            *random_points("prune-stamp", 8, seed, max_delay=0.8),
        ],
        "experiment": [
            *boundary_points("experiment"),
            *random_points("experiment", 4, seed, "INT"),
            *restart_command_points(2, seed + 3),
        ],
    }
    rng = random.Random(seed)
    for points in per.values():
        rng.shuffle(points)
    out: list[tuple[str, KillPoint]] = []
    while any(per.values()):
        for cmd, points in per.items():
            if points:
                out.append((cmd, points.pop(0)))
    return out


def table(records: list[dict[str, Any]]) -> str:
    """The sweep's table: per command and signal, tried and what failed (markdown)."""
    rows: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in records:
        who = "restart command" if r["target"] == "restart-command" else f"SIG{r['signal']}"
        row = rows[(r["command"], who)]
        ch = r["checks"]
        row["tried"] += 1
        row["reached"] += int(r["fired"])
        row["divergent"] += int(
            not ch["a_recipe_whole_and_agreeing"] or not ch["b_engine_runs_recipe"]
        )
        row["audit missing"] += int(not ch["d_audit_complete"])
        row["history lost/left"] += int(not ch["c_history_exact"])
        row["lock held"] += int(not ch["e_lock_free"])
        row["other"] += int(
            not ch["operator_file_untouched"] or not ch["no_staged_left"] or not ch["rerun_ok"]
        )
        row["all held"] += int(r["ok"])
    cols = ["tried", "reached", "divergent", "audit missing", "history lost/left", "lock held",
            "other", "all held"]  # fmt: skip
    lines = ["| command | signal | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    total: dict[str, int] = defaultdict(int)
    for (cmd, who), row in sorted(rows.items()):
        lines.append(f"| {cmd} | {who} | " + " | ".join(str(row[c]) for c in cols) + " |")
        for c in cols:
            total[c] += row[c]
    lines.append("| **all** | | " + " | ".join(f"**{total[c]}**" for c in cols) + " |")
    return "\n".join(lines)


def main() -> int:
    """Run the sweep (or print the table of a record file)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="crash-sweep.jsonl")
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--minutes", type=float, default=0, help="stop starting cases after this")
    ap.add_argument("--only", action="append", help="commands to run (repeatable)")
    ap.add_argument("--table", help="print the table of an earlier run's JSON lines and exit")
    args = ap.parse_args()
    if args.table:
        print(table([json.loads(li) for li in Path(args.table).read_text().splitlines() if li]))
        return 0
    cases = [(c, p) for c, p in plan(args.seed) if not args.only or c in args.only]
    print(f"{len(cases)} cases planned", flush=True)
    started = time.monotonic()
    records = []
    with tempfile.TemporaryDirectory(prefix="crash-sweep.") as tmp:
        cluster = CrashCluster(Path(tmp))
        try:
            for i, (cmd, point) in enumerate(cases, 1):
                if args.minutes and time.monotonic() - started > args.minutes * 60:
                    print(f"stopped after {i - 1} cases (--minutes {args.minutes})", flush=True)
                    break
                try:
                    res = run_case(cluster, cmd, point)
                except Exception as exc:  # a case the harness could not arrange: say so, go on
                    print(f"[{i}] {cmd} {point.label}: harness error {exc!r}", flush=True)
                    continue
                write_record(args.out, res)
                records.append(res.record())
                bad = [k for k, v in res.checks.items() if not v]
                print(f"[{i}/{len(cases)}] {cmd} {point.label}: exit {res.killed_exit} → "
                      f"{res.rerun_exit}; {'ok' if res.ok else bad} ({res.seconds} s)",
                      flush=True)  # fmt: skip
        finally:
            cluster.close()
    print(f"\n{len(records)} cases in {time.monotonic() - started:.0f} s\n")
    print(table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
