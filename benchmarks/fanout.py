"""How fast is `spark-ops exec` against the tools an operator would use instead?

Starts real OpenSSH nodes on 127.0.0.1 (tests/ground/sshd.py: one sshd process, Unix user and
HOME per node, so 32 nodes are 32 sshd processes), writes each tool's inventory, and times whole
processes, from exec to exit, interleaved (a shuffled round-robin per round) so that the load of
the machine hits all tools alike. Two operations:

- `true` on every node;
- an atomic one-line edit of ~/bench-recipe.yaml: `spark-ops exec --edit … --sub …` (read, stage
  a synced temp file with a digest check, rename, keep a backup — remote.FileWrite) against
  `sed -i` run by each peer.

spark-ops runs as operators install it (common.bench_venv: `pip install .`, not editable, in a venv
of its own, like the peers). Peers: a minimal asyncssh script (spark-ops' interpreter),
parallel-ssh (ssh2-python), pssh (Debian's parallel-ssh 2.3.4), pyinfra and Ansible (raw module); a
peer that is not installed is skipped and marked so. Peers are looked for in $SPARK_OPS_PEERS_VENV
(default /tmp/sparkops-peers) and on PATH.

    python benchmarks/fanout.py [--sizes 4,32] [--repeats 5] [--ops true,edit]
    python benchmarks/fanout.py --limits-only   # connect cap / MaxStartups / MaxSessions

It ends with the table the targets are set on (issue 32: each ratio with its per-round spread).
SPARK_OPS_BASELINE_VENV=DIR adds DIR/bin/spark-ops (another build, e.g. main's) as a row of its
own, interleaved with this one, so before and after meet the same load.

Targets: within 1.1x of the fastest peer at 4 nodes, the fastest of all at 32, >= 3x faster
than Ansible.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c

SED = "sed -i 's/^max_num_seqs: .*/max_num_seqs: {v}/' " + c.RECIPE_NAME
Case = Callable[[int], "tuple[list[str], dict[str, str] | None] | None"]


def cases_for(t: c.Target, op: str) -> dict[str, Case]:
    """The per-tool process builders for one operation ('true' or 'edit')."""
    out: dict[str, Case] = {}
    tools: dict[str, c.Builder] = dict(c.PEERS)
    if c.NO_CAP in t.files:
        tools[c.NO_CAP] = c.PEERS["spark-ops"]
    if c.baseline_argv() is not None:
        tools[c.BASELINE] = c.PEERS["spark-ops"]
    for name, build in tools.items():

        def case(rnd: int, name: str = name, build: c.Builder = build) -> Any:
            """argv and env of one run; the edit writes a value unique to (round, tool)."""
            value = edit_value(name, rnd)
            env = c.ansible_env(t) if name.startswith("ansible") else None
            inventory = str(t.files[name if name == c.NO_CAP else "spark-ops"])
            script = c.baseline_argv() if name == c.BASELINE else c.spark_ops_argv()
            if op == "true":
                argv = build(t, ["true"])
                if argv is not None and name == c.NO_CAP:
                    argv = [inventory if a == str(t.files["spark-ops"]) else a for a in argv]
                if argv is not None and name == c.BASELINE:
                    argv = [*(script or []), *argv[len(c.spark_ops_argv()) :]]
            elif name.startswith("spark-ops"):
                argv = [
                    *(script or []), "-q", "-i", inventory, "exec",
                    "--edit", "~/" + c.RECIPE_NAME,
                    "--sub", "^max_num_seqs: .*", f"max_num_seqs: {value}",
                ]  # fmt: skip
            else:
                argv = build(t, [SED.format(v=value)])
            return None if argv is None else (argv, env)

        out[name] = case
    return out


def edit_value(name: str, rnd: int) -> int:
    """The max_num_seqs value a tool writes in a round (unique per round and tool)."""
    return 1000 + rnd * 10 + [*c.PEERS, c.NO_CAP, c.BASELINE].index(name)


def edit_verifier(cluster: Any) -> Callable[[str, int], str | None]:
    """A check that a tool's edit landed on every node (None) or which nodes missed it."""

    def verify(name: str, rnd: int) -> str | None:
        """Every node's recipe holds this run's value."""
        want = f"max_num_seqs: {edit_value(name, rnd)}\n"
        missed = [n.name for n in cluster if want not in (n.home / c.RECIPE_NAME).read_text()]
        return f"edit missing on {missed}" if missed else None

    return verify


def check_edits(cluster: Any) -> str:
    """Check every node's recipe still has exactly one max_num_seqs line (no torn edits)."""
    bad = []
    for node in cluster:
        text = (node.home / c.RECIPE_NAME).read_text()
        if (
            len(re.findall(r"^max_num_seqs: \d+$", text, flags=re.M)) != 1
            or len(text.splitlines()) != 3
        ):
            bad.append(node.name)
    return "all recipes intact" if not bad else f"recipes damaged on {bad}"


def run_fanout(sizes: list[int], repeats: int, ops: list[str], work: Path) -> dict[str, Any]:
    """Time every tool on every size and operation; return {op: {size: {tool: Samples}}}."""
    results: dict[str, Any] = {op: {} for op in ops}
    for n in sizes:
        t0 = time.monotonic()
        cluster = c.start_nodes(n, work / f"nodes{n}")
        print(f"# {n} sshd nodes up in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        try:
            target = c.Target.from_cluster(cluster, work / f"tools{n}")
            target.write_all()
            for op in ops:
                reps = repeats if n <= 8 else max(3, repeats - 2)
                check = edit_verifier(cluster) if op == "edit" else None
                results[op][n] = c.interleaved(cases_for(target, op), reps, verify=check)
                print(f"#   {op} on {n}: done ({check_edits(cluster)})", file=sys.stderr)
        finally:
            cluster.close()
    return results


def fanout_tables(results: dict[str, Any], sizes: list[int]) -> str:
    """One table per operation: medians, ratio to the fastest peer, failures."""
    text = []
    for op, by_size in results.items():
        cols = ["tool"]
        for n in sizes:
            cols += [f"{n} nodes", f"x fastest peer ({n})"]
        rows: list[list[str]] = []
        fastest: dict[int, float] = {}
        for n in sizes:
            peers = [
                s.median
                for name, s in by_size[n].items()
                if not name.startswith("spark-ops") and s.median
            ]
            fastest[n] = min(peers) if peers else float("nan")
        variants = [v for v in (c.NO_CAP, c.BASELINE) if any(v in by_size[n] for n in sizes)]
        for name in [*c.PEERS, *variants]:
            row = [name]
            for n in sizes:
                s = by_size[n].get(name)
                if s is None:
                    row += ["(not run)", ""]
                    continue
                if s.skipped:
                    row += [f"skipped ({s.skipped})", ""]
                    continue
                fail = f" ({s.failures} failed runs)" if s.failures else ""
                row += [c.fmt_s(s.median) + fail, f"{(s.median or 0) / fastest[n]:.2f}"]
            rows.append(row)
        title = (
            "run `true`" if op == "true" else "atomic one-line edit (spark-ops --edit vs sed -i)"
        )
        text.append(c.table(f"{title}: whole-process wall time, median", cols, rows))
        for n in sizes:
            s = by_size[n]["spark-ops"]
            ans = by_size[n].get("ansible (raw)")
            if s.median is None:
                continue
            verdict = [f"{n} nodes: spark-ops {s.median / fastest[n]:.2f}x the fastest peer"]
            if ans is not None and ans.median:
                verdict.append(f"Ansible/spark-ops = {ans.median / s.median:.1f}x")
            if s.failures:
                verdict.append(f"spark-ops last error: {s.last_error[-200:]!r}")
            text.append("- " + "; ".join(verdict))
        text.append("")
        for n in sizes:
            for name, s in by_size[n].items():
                if s.failures:
                    text.append(
                        f"- {op}/{n}/{name}: {s.failures} failed, last: {s.last_error[-160:]!r}"
                    )
        text.append("")
    return "\n".join(text)


def ratio(by_size: dict[int, Any], n: int, a: str, b: str) -> str:
    """a's median over b's at n nodes, with the spread of the per-round ratios (rounds are
    interleaved, so a round's two runs met the same load), or why there is none."""
    sa, sb = by_size.get(n, {}).get(a), by_size.get(n, {}).get(b)
    for name, s in ((a, sa), (b, sb)):
        if s is None or not s.times:
            return f"{name}: {'not installed' if s is not None and s.skipped else 'not run'}"
    assert sa is not None and sb is not None
    pairs = sorted(x / y for x, y in zip(sa.times, sb.times, strict=False))
    return f"{(sa.median or 0) / (sb.median or 1):.2f}x ({pairs[0]:.2f}–{pairs[-1]:.2f})"


ISSUE_ROWS = [  # (figure, op, nodes, numerator, denominator); issue 32's table, in its order
    ("`exec -- true`, 4 nodes, vs parallel-ssh", "true", 4, "spark-ops", "parallel-ssh"),
    ("`exec -- true`, 32 nodes, vs the minimal asyncssh script", "true", 32, "spark-ops",
     "asyncssh (minimal script)"),
    ("atomic edit, 4 nodes, vs parallel-ssh's `sed -i`", "edit", 4, "spark-ops", "parallel-ssh"),
    ("atomic edit, 32 nodes, vs the minimal script's `sed -i`", "edit", 32, "spark-ops",
     "asyncssh (minimal script)"),
    ("Ansible's time ÷ spark-ops' (edit, 4 nodes)", "edit", 4, "ansible (raw)", "spark-ops"),
    ("Ansible's time ÷ spark-ops' (edit, 32 nodes)", "edit", 32, "ansible (raw)", "spark-ops"),
    ("Ansible's time ÷ spark-ops' (`true`, 4 nodes)", "true", 4, "ansible (raw)", "spark-ops"),
    ("Ansible's time ÷ spark-ops' (`true`, 32 nodes)", "true", 32, "ansible (raw)", "spark-ops"),
]  # fmt: skip


def issue_table(results: dict[str, Any]) -> str:
    """The figures the targets are set on (issue 32), as ratios of medians with their per-round
    spread; with $SPARK_OPS_BASELINE_VENV, the baseline's ratio beside this code's."""
    cols = ["figure", "this code"]
    base = c.baseline_argv() is not None
    if base:
        cols.insert(1, "baseline")
    rows = []
    for figure, op, n, a, b in ISSUE_ROWS:
        by_size = results.get(op, {})
        row = [figure, ratio(by_size, n, a, b)]
        if base:
            a0, b0 = (c.BASELINE if x == "spark-ops" else x for x in (a, b))
            row.insert(1, ratio(by_size, n, a0, b0))
        rows.append(row)
    for n in sorted(results.get("edit", {})):
        s = results["edit"][n].get("spark-ops")
        row = [f"atomic edit, {n} nodes, spark-ops' median", c.fmt_s(s.median if s else None)]
        if base:
            s0 = results["edit"][n].get(c.BASELINE)
            row.insert(1, c.fmt_s(s0.median if s0 else None))
        rows.append(row)
    title = "issue 32's figures: ratio of medians (min–max of the per-round ratios)"
    return c.table(title, cols, rows)


# ----------------------------------------------------------------------------- limits


def one_sshd_many_ports(n: int, work: Path, *, defaults: bool) -> tuple[Any, c.Target]:
    """One sshd process listening on n ports (the load a jump host or a shared sshd sees)."""
    from ground.sshd import free_port

    cluster = c.start_nodes(1, work)
    node = cluster.nodes[0]
    ports = [node.port] + [free_port() for _ in range(n - 1)]
    lines = [
        ln
        for ln in node.config_path.read_text().splitlines()
        if not (defaults and ln.startswith(("MaxStartups", "MaxSessions")))
    ]
    lines += [f"Port {p}" for p in ports[1:]]
    node.config_path.write_text("\n".join(lines) + "\n")
    cluster.stop(node.name, kill_sessions=False)
    cluster.start(node.name)
    kind, b64 = node.host_key_pub.split()[:2]
    kh = work / "known_hosts_many"
    kh.write_text("".join(f"[{node.host}]:{p} {kind} {b64}\n" for p in ports))
    eps = [c.Endpoint(f"node{i + 1}", node.host, p, node.user) for i, p in enumerate(ports)]
    target = c.Target(eps, cluster.client_key, kh, work / "tools")
    target.write_all()
    return cluster, target


def fixed(argv: list[str]) -> Case:
    """A case that runs the same argv every round."""

    def case(rnd: int) -> tuple[list[str], dict[str, str] | None] | None:
        """The fixed argv, default environment."""
        return argv, None

    return case


def limits(work: Path, runs: int, n: int = 16) -> str:
    """Failures of exec on n endpoints of ONE sshd with default limits, per cap, retries on/off."""
    out = []
    cluster, target = one_sshd_many_ports(n, work / "limits", defaults=True)
    try:
        out.append(connect_caps(target, runs, n))
        out.append(channels(target, runs))
    finally:
        cluster.close()
    return "\n".join(out)


def connect_caps(target: c.Target, runs: int, n: int) -> str:
    """In-process fan-outs of `true` per connect cap, with and without the connect retries."""
    import dataclasses
    import statistics

    from spark_ops import fanout
    from spark_ops.inventory import load_inventory
    from spark_ops.remote import session

    base = load_inventory(target.files["spark-ops"]).cluster()
    caps = sorted({n, 12, 10, 8, 4}, reverse=True)
    stats: dict[tuple[int, int], list[tuple[int, float]]] = {}
    saved = session.CONNECT_RETRIES  # what ClusterSession.connect reads (remote/connector's)
    refuse = session.ClusterSession._refuse_one_machine_twice

    async def many_endpoints_one_sshd(self: Any) -> None:
        """The n endpoints are one sshd by design (the load one sshd sees): not refused here."""

    session.ClusterSession._refuse_one_machine_twice = many_endpoints_one_sshd  # type: ignore
    try:
        for _ in range(runs):
            for cap in caps:
                for retries in (0, saved):
                    session.CONNECT_RETRIES = retries
                    ssh = dataclasses.replace(base.ssh, max_concurrent_connects=cap)
                    cl = dataclasses.replace(base, ssh=ssh)
                    t0 = time.perf_counter()
                    rep = asyncio.run(fanout.run_command(cl, ["true"]))
                    took = time.perf_counter() - t0
                    stats.setdefault((cap, retries), []).append((len(rep.failed), took))
    finally:
        session.CONNECT_RETRIES = saved
        session.ClusterSession._refuse_one_machine_twice = refuse  # type: ignore
    rows = []
    for (cap, retries), got in stats.items():
        label = f"{cap} (no cap for {n} endpoints)" if cap == n else str(cap)
        bad_runs = sum(1 for f, _ in got if f)
        bad_hosts = sum(f for f, _ in got)
        med = statistics.median(t for _, t in got)
        rows.append([label, retries, f"{bad_runs}/{len(got)}", f"{bad_hosts}/{n * len(got)}",
                     c.fmt_s(med)])  # fmt: skip
    return c.table(
        f"{n} connections at once to ONE sshd with default MaxStartups 10:30:100 (in-process)",
        ["connect cap", "retries", "runs with a failed host", "failed hosts", "median"],
        rows,
    )


def channels(target: c.Target, runs: int) -> str:
    """Commands at once on ONE connection against default MaxSessions 10: how many fail."""
    from spark_ops.inventory import load_inventory
    from spark_ops.remote import ClusterSession

    cl = load_inventory(target.files["spark-ops"]).cluster()

    async def attempt(k: int) -> int:
        """Run k concurrent `sleep 0.3` on node1 over one connection; count failures."""
        async with ClusterSession(cl) as s:
            await s.connect(["node1"])
            res = await asyncio.gather(
                *(s.run("node1", "sleep 0.3", check=False, timeout=20) for _ in range(k)),
                return_exceptions=True,
            )
        return sum(1 for r in res if isinstance(r, BaseException) or not r.ok)

    rows = []
    for k in (4, 10, 11, 16, 32):
        fails = [asyncio.run(attempt(k)) for _ in range(runs)]
        rows.append([k, f"{sum(fails)}/{k * runs}"])
    return c.table(
        "commands at once on ONE connection, sshd default MaxSessions 10",
        ["concurrent channels", "failed commands"],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run, print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,32")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--ops", default="true,edit")
    ap.add_argument("--limits-runs", type=int, default=5)
    ap.add_argument("--limits-only", action="store_true")
    ap.add_argument("--no-limits", action="store_true")
    ap.add_argument("--workdir", type=Path)
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    ops = [o for o in args.ops.split(",") if o]
    from spark_ops.log import configure

    configure(-1)
    if os.geteuid() != 0:
        print("needs root (tests/ground/sshd.py creates one Unix user per node)", file=sys.stderr)
        return 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="spark-ops-bench-fanout-"))
    print(f"# workdir {work}; load average {os.getloadavg()[0]:.1f}; cores {os.cpu_count()}")
    if not args.limits_only:
        results = run_fanout(sizes, args.repeats, ops, work)
        print(fanout_tables(results, sizes))
        print(issue_table(results))
    if not args.no_limits:
        print(limits(work, args.limits_runs))
    print(f"# load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
