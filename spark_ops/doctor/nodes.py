"""Doctor checks of the nodes themselves: SSH, tools, the state dir, the cluster lock, sudo."""

from __future__ import annotations

from typing import Any

from spark_ops.doctor.report import Checker
from spark_ops.errors import AuthError, HostKeyError, SparkOpsError
from spark_ops.inventory import Node
from spark_ops.lock import (
    LOCK_DIR,
    OPERATORS_GROUP,
    describe_holder,
    first_unsafe,
    lock_state,
    setup_commands,
)
from spark_ops.remote.programs.doctor import STATE_DIR, TOOLS
from spark_ops.remote.programs.lock import STATE_SAFE
from spark_ops.remote.programs.node import SUDO_OK
from spark_ops.workflows.journal import holds_lock, read_runs, unfinished_runs


class NodeChecks(Checker):
    """SSH on every node; tools, state dir and cluster lock on the head; sudo where needed."""

    def check_ssh(self) -> None:
        """Reachable, host key known, authentication accepted, on every node."""
        c = self.cluster
        kh = c.ssh.known_hosts or "~/.ssh/known_hosts"
        for node in c.nodes:
            err = self.session.errors.get(node.name)
            if err is None:
                ms = self.session.latency.get(node.name, 0.0) * 1000
                key = (
                    "host key NOT checked" if c.ssh.insecure_no_host_key_check else "host key known"
                )
                status = "warn" if c.ssh.insecure_no_host_key_check else "ok"
                self.report.add(
                    "ssh",
                    node.name,
                    status,
                    f"{node.host}:{node.port} reachable ({ms:.0f} ms), {key}",
                    "remove ssh.insecure_no_host_key_check and add the nodes' keys to known_hosts",
                )
                continue
            self.report.add("ssh", node.name, "fail", err.message, _ssh_fix(err, node, kh))

    async def check_tools(self) -> None:
        """The head has flock (cluster lock, history lock) and the watchdog's python3."""
        if not self.up(self.head):
            return
        py = self.cluster.watchdog.python
        res = await self.session.call(self.head, TOOLS, py)
        missing = [
            ln.split(" ", 1)[1] for ln in res.stdout.splitlines() if ln.startswith("missing ")
        ]
        if missing:
            self.report.add(
                "tools",
                self.head,
                "fail",
                f"not found on PATH: {', '.join(missing)}",
                "install util-linux (flock), coreutils (sha256sum, mktemp) and python3 on the "
                "head, "
                "or set watchdog.python to the head's python3",
            )
        else:
            self.report.add("tools", self.head, "ok", f"flock, {py}, sha256sum, mktemp present")

    async def check_cluster_lock(self) -> None:
        """Nobody holds the cluster lock now (apply would stop with exit 6); names the holder."""
        if not self.up(self.head):
            return
        held, holder, lock = await lock_state(self.session)
        await self.check_unfinished_runs(holder if held else {})
        if not held:
            self.report.add("cluster-lock", self.head, "ok", f"free ({lock})")
            return
        self.report.add(
            "cluster-lock",
            self.head,
            "fail",
            f"held by {describe_holder(holder)}",
            "wait for that operation to end (the lock frees itself if its holder dies), "
            "then run doctor again",
        )

    async def check_unfinished_runs(self, holder: dict[str, Any]) -> None:
        """No run began and died without ending (the lock holder's own run is live, not dead)."""
        try:
            runs = unfinished_runs(await read_runs(self.session))
            dead = [r for r in runs if not holds_lock(r, holder)]
        except SparkOpsError as exc:
            self.report.add("unfinished-runs", self.head, "warn", f"audit log not read: {exc}")
            return
        if not dead:
            self.report.add("unfinished-runs", self.head, "ok", "every recorded run ended")
            return
        for r in dead:
            self.report.add(
                "unfinished-runs",
                self.head,
                "fail",
                f"run {r.run} ({r.operation} by {r.summary().who or '?'}) did not end; "
                f"last recorded: {r.last_step}",
                f"finish it: {r.command}",
            )

    async def check_ray_workers(self) -> None:
        """engine.worker_check on every reachable worker: is its Ray worker (or rank) running?"""
        engine = self.cluster.engine
        check = engine.worker_check
        if not check:
            return
        part = engine.worker_part
        name = "ray-worker" if engine.executor == "ray" else "worker-rank"
        for node in self.cluster.workers:
            if not self.up(node.name):
                continue
            res = await self.session.run(node.name, check, check=False, timeout=10)
            down = engine.worker_down(res.exit_code)
            if down is False:
                self.report.add(name, node.name, "ok", f"`{check}` found it running")
            elif down:
                start = "start Ray" if engine.executor == "ray" else "start its rank"
                self.report.add(
                    name,
                    node.name,
                    "fail",
                    f"`{check}` exited 1: no {part} running, so a TP boot would wait for it",
                    f"{start} on {node.name} (the launcher's container, e.g. `docker ps -a`, "
                    "`docker logs vllm_node`), then run doctor again",
                )
            else:
                self.report.add(
                    name,
                    node.name,
                    "warn",
                    f"`{check}` exited {res.exit_code}: cannot tell "
                    f"({res.stderr.strip()[-160:] or 'no message'})",
                    f"set engine.worker_check to a command that exits 0 when the node's {part} "
                    'runs and 1 when it does not (or "" to skip this check)',
                )

    async def check_sudo(self) -> None:
        """`sudo -n true` on every node whose inventory entry says sudo: true."""
        for node in self.cluster.nodes:
            if not node.sudo or not self.up(node.name):
                continue
            res = await self.session.call(node.name, SUDO_OK)
            if res.ok:
                self.report.add("sudo", node.name, "ok", "sudo -n true works without a password")
            else:
                self.report.add(
                    "sudo",
                    node.name,
                    "fail",
                    f"sudo -n true failed (exit {res.exit_code}): {res.stderr.strip()[-200:]}",
                    f"allow {node.user or 'the SSH user'} passwordless sudo on {node.name} "
                    "(a sudoers.d entry), or set sudo: false for the node if the files are its own",
                )

    async def check_state_dir(self) -> None:
        """The head's lock dir (cluster lock) and state dir (audit log) exist or can be made, and
        are writable."""
        if not self.up(self.head):
            return
        sd = self.cluster.state_dir
        if sd == LOCK_DIR:
            uses = {sd: "lock and audit log"}
        else:
            uses = {sd: "audit log", LOCK_DIR: "cluster lock"}
        usable = []
        for d, use in uses.items():
            res = await self.session.call(self.head, STATE_DIR, d)
            word, _, where = res.stdout.strip().partition(" ")
            if word != "ok":
                self.report.add(
                    "state-dir",
                    self.head,
                    "fail",
                    f"{d} cannot be created or written ({where or res.stderr.strip()} is not a "
                    f"writable directory; it holds the {use})",
                    f"create it: ssh {self.cluster.head.host} mkdir -p {d}"
                    + (
                        ", or set state_dir in the inventory to a directory the SSH user can write"
                        if d == sd
                        else f" (every operator's lock is there): {setup_commands(d)}"
                    ),
                )
                return
            usable.append(f"{d} usable ({use})")
        for d in uses:
            history = self.cluster.watchdog.history_file
            res = await self.session.call(self.head, STATE_SAFE, d, history)
            unsafe = first_unsafe(self.head, res.stdout)
            if unsafe is not None:
                self.report.add("state-dir", self.head, "fail", unsafe.message, unsafe.hint or "")
                return
            word, _, rest = res.stdout.strip().partition(" ")
            group = rest.rpartition(" ")[2] if word == "ok" else ""
            if group != OPERATORS_GROUP:  # usable by this account alone: say how to share it
                usable.append(
                    f"{d} {'not made yet' if word == 'missing' else f'of group {group}'}: for "
                    f"other operators, once on {self.cluster.head.host}: {setup_commands(d)}"
                )
        self.report.add("state-dir", self.head, "ok", "; ".join(usable))


def _ssh_fix(err: SparkOpsError, node: Node, known_hosts: str) -> str:
    """The fix for an SSH failure."""
    target = f"[{node.host}]:{node.port}" if node.port != 22 else node.host
    if isinstance(err, HostKeyError):
        return (
            f"verify the node's key fingerprint, then: ssh-keyscan -p {node.port} {node.host} "
            f">> {known_hosts} (the entry must read {target} ...)"
        )
    if isinstance(err, AuthError):
        return (
            f"install your public key in ~{node.user or ''}/.ssh/authorized_keys on {node.name}, "
            "or set ssh.identity in the inventory"
        )
    return f"check that {node.name} is up and sshd listens on {node.host}:{node.port}"
