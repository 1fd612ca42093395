"""`doctor`: every precondition of `apply`, checked without changing anything, with a fix for each
failure.

Checks are data (`Check`). A `fail` is something that would make `apply` fail (or leave the cluster
unsafe to restart); a `warn` is worth knowing but does not stop `apply` (the watchdog paused, a
malformed history line). Nothing here writes on a node: writability is probed with `test -w` and a
non-blocking `flock` on a descriptor opened read-only. As root, `test -w` is true for a mode-0444
file because root may write it; it is false for an immutable (`chattr +i`) file or a read-only
mount, which is what really stops a write.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from spark_ops.errors import (
    AuthError,
    HostKeyError,
    RecipeError,
    SparkOpsError,
)
from spark_ops.inventory import Cluster, Node
from spark_ops.remote import ClusterSession, quote_path, sh_program

STATUSES = ("ok", "warn", "fail")


@dataclass
class Check:
    """One checked precondition: what, where, ok / warn / fail, what was seen, how to fix it."""

    name: str
    host: str
    status: str
    detail: str
    fix: str = ""

    def __post_init__(self) -> None:
        """Refuse a status outside ok / warn / fail."""
        if self.status not in STATUSES:
            raise ValueError(f"Check.status must be one of {STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return asdict(self)


@dataclass
class DoctorReport:
    """Every check of one cluster, in the order they were made."""

    cluster: str
    inventory: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings allowed)."""
        return not any(c.status == "fail" for c in self.checks)

    def add(self, name: str, host: str, status: str, detail: str, fix: str = "") -> Check:
        """Record one check and return it."""
        check = Check(name, host, status, detail, fix if status != "ok" else "")
        self.checks.append(check)
        return check

    def failed(self) -> list[Check]:
        """The failing checks."""
        return [c for c in self.checks if c.status == "fail"]

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        counts = {s: sum(1 for c in self.checks if c.status == s) for s in STATUSES}
        return {
            "cluster": self.cluster,
            "inventory": self.inventory,
            "ok": self.ok,
            "counts": counts,
            "checks": [c.to_dict() for c in self.checks],
        }


# $1 history file, $2 lock file. Prints key=value lines; changes nothing (the lock is opened read-
# only,
# and only when it exists; a missing lock file only needs a writable directory to be created in).
_WRITABLE = r"""
h=$1; l=$2
hd=$(dirname -- "$h"); ld=$(dirname -- "$l")
if [ -e "$h" ]; then
  if [ -f "$h" ] && [ -w "$h" ]; then echo "file=writable"; else echo "file=not-writable"; fi
else echo "file=absent"; fi
if [ -d "$hd" ]; then
  if [ -w "$hd" ]; then echo "dir=writable"; else echo "dir=not-writable"; fi
elif [ -e "$hd" ]; then echo "dir=not-a-directory"; else echo "dir=absent"; fi
command -v flock >/dev/null 2>&1 || { echo "lock=no-flock"; exit 0; }
if [ -e "$l" ]; then
  if [ ! -r "$l" ]; then echo "lock=unreadable"
  elif ( exec 9<"$l" && flock -n 9 ); then echo "lock=free"; else echo "lock=held"; fi
  if [ -w "$l" ]; then echo "lockfile=writable"; else echo "lockfile=not-writable"; fi
elif [ -d "$ld" ] && [ -w "$ld" ]; then echo "lock=absent-creatable"
else echo "lock=absent-not-creatable"; fi
"""

# $1 a directory that must exist or be creatable and writable (the state dir: cluster lock, audit
# log).
_STATE_DIR = r"""
d=$1
while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done
if [ -d "$d" ] && [ -w "$d" ]; then echo "ok $d"; else echo "no $d"; fi
"""


# $1 the cluster lock, $2 its owner file: "held" and the owner record when another process holds it.
_LOCK_FREE = r"""
l=$1; o=$2
[ -e "$l" ] || { echo free; exit 0; }
command -v flock >/dev/null 2>&1 || { echo free; exit 0; }
if ( exec 9<"$l" && flock -n 9 ); then echo free; else echo held; cat -- "$o" 2>/dev/null; fi
"""


def _program(command: str) -> tuple[str | None, str | None]:
    """(directory, program) a shell command runs: skips `cd DIR &&`, VAR=value, sudo, env."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    directory = None
    i = 0
    while i < len(words):
        w = words[i]
        if w == "cd" and i + 2 < len(words) and words[i + 2] in ("&&", ";"):
            directory = words[i + 1]
            i += 3
        elif "=" in w and not w.startswith(("/", "~", ".")) and w.split("=", 1)[0].isidentifier():
            i += 1
        elif w in ("sudo", "env", "exec", "nice", "nohup"):
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 1
        else:
            return directory, w
    return directory, None


def _first_word(command: str) -> str | None:
    """The program a shell command runs (see _program)."""
    return _program(command)[1]


def _parse_kv(text: str) -> dict[str, str]:
    """key=value lines into a dict."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


class Doctor:
    """Runs every check against a connected session and fills a DoctorReport."""

    def __init__(self, session: ClusterSession, report: DoctorReport) -> None:
        """Bind to an open session (nodes connected or with their errors recorded)."""
        self.session = session
        self.cluster = session.cluster
        self.report = report
        self.head = self.cluster.head.name

    def up(self, name: str) -> bool:
        """True when the node is connected."""
        return name in self.session.connectors

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
        res = await self.session.run(
            self.head,
            f'for t in flock {shlex.quote(py)} sha256sum mktemp; do command -v "$t" >/dev/null '
            '2>&1 || echo "missing $t"; done',
            check=False,
        )
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
        import json

        from spark_ops.lock import describe_holder, lock_paths

        if not self.up(self.head):
            return
        lock, owner = lock_paths(self.cluster.state_dir, self.cluster.name)
        res = await self.session.run(self.head, sh_program(_LOCK_FREE, lock, owner), check=False)
        first, _, rest = res.stdout.partition("\n")
        if first.strip() != "held":
            self.report.add("cluster-lock", self.head, "ok", f"free ({lock})")
            return
        try:
            holder = json.loads(rest.strip() or "{}")
        except ValueError:
            holder = {}
        self.report.add(
            "cluster-lock",
            self.head,
            "fail",
            f"held by {describe_holder(holder if isinstance(holder, dict) else {})}",
            "wait for that operation to end (the lock frees itself if its holder dies), "
            "then run doctor again",
        )

    async def check_sudo(self) -> None:
        """`sudo -n true` on every node whose inventory entry says sudo: true."""
        for node in self.cluster.nodes:
            if not node.sudo or not self.up(node.name):
                continue
            res = await self.session.run(node.name, "sudo -n true", check=False)
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
        """The head's state dir (cluster lock, audit log) exists or can be made, and is writable."""
        if not self.up(self.head):
            return
        sd = self.cluster.state_dir
        res = await self.session.run(self.head, sh_program(_STATE_DIR, sd), check=False)
        word, _, where = res.stdout.strip().partition(" ")
        if word == "ok":
            self.report.add("state-dir", self.head, "ok", f"{sd} usable (lock and audit log)")
        else:
            self.report.add(
                "state-dir",
                self.head,
                "fail",
                f"{sd} cannot be created or written ({where or res.stderr.strip()} is not a "
                "writable directory)",
                f"create it: ssh {self.cluster.head.host} mkdir -p {sd}, or set state_dir in the "
                "inventory to a directory the SSH user can write",
            )

    async def check_recipe(self) -> str | None:
        """The recipe on every node that holds it: present, parseable, renderable, identical."""
        from spark_ops.recipe import load_recipe_text, render_recipe

        rs = self.cluster.recipe
        texts: dict[str, str] = {}
        for host in rs.nodes:
            if not self.up(host):
                continue
            source = f"{host}:{rs.path}"
            try:
                text = await self.session.read_file(host, rs.path, sudo=True)
            except SparkOpsError as exc:
                self.report.add(
                    "recipe",
                    host,
                    "fail",
                    f"cannot read {rs.path}: {exc.message}",
                    "check the file's permissions, or set sudo: true for the node",
                )
                continue
            if text is None:
                self.report.add(
                    "recipe",
                    host,
                    "fail",
                    f"{rs.path} not found",
                    f"copy the recipe to {host}:{rs.path}, or fix recipe.path / recipe.nodes "
                    "in the inventory (spark-ops init finds it for you)",
                )
                continue
            try:
                load_recipe_text(text, source=source)
                rendered = render_recipe(text, source=source)
                args = rendered.args()
            except RecipeError as exc:
                self.report.add(
                    "recipe",
                    host,
                    "fail",
                    exc.message,
                    exc.hint or f"fix the recipe at {source} (see the message)",
                )
                continue
            texts[host] = text
            seqs = args.get("--max-num-seqs", "default")
            self.report.add(
                "recipe",
                host,
                "ok",
                f"{rs.path} parses; model {rendered.model or '?'}, --max-num-seqs {seqs}",
            )
        if len(texts) > 1:
            first = next(iter(texts))
            differ = [h for h, t in texts.items() if t != texts[first]]
            if differ:
                from spark_ops.recipe import unified_diff

                diff = unified_diff(texts[first], texts[differ[0]], f"{differ[0]}:{rs.path}")
                lines = [
                    ln
                    for ln in diff.splitlines()
                    if ln.startswith(("+", "-")) and not ln.startswith(("+++", "---"))
                ]
                self.report.add(
                    "recipe-same",
                    ",".join(texts),
                    "fail",
                    f"the copy on {', '.join(differ)} differs from {first}: "
                    + " | ".join(lines[:4]),
                    f"make the copies agree (e.g. copy {first}:{rs.path} to {', '.join(differ)}), "
                    "or run apply with --force to overwrite them all",
                )
            else:
                self.report.add(
                    "recipe-same", ",".join(texts), "ok", f"identical on {len(texts)} nodes"
                )
        return texts.get(self.head) or next(iter(texts.values()), None)

    async def check_watchdog(self) -> None:
        """Restart command present; history readable and writable under its lock; pause, gave-up."""
        if not self.up(self.head):
            return
        wd = self.cluster.watchdog
        directory, prog = _program(wd.restart_command)
        if prog is None:
            self.report.add(
                "watchdog-command",
                self.head,
                "fail",
                f"watchdog.restart_command {wd.restart_command!r} names no program",
                "set watchdog.restart_command to your watchdog's forced-restart command",
            )
        else:
            target = quote_path(prog) if prog.startswith("~") else shlex.quote(prog)
            probe = f"command -v {target}"
            if directory:
                where = (
                    quote_path(directory) if directory.startswith("~") else shlex.quote(directory)
                )
                probe = f"cd {where} && {probe}"
            res = await self.session.run(self.head, probe, check=False)
            if res.ok and res.stdout.strip():
                self.report.add(
                    "watchdog-command",
                    self.head,
                    "ok",
                    f"{prog} found at {res.stdout.strip()}"
                    + (f" (in {directory})" if directory else ""),
                )
            else:
                self.report.add(
                    "watchdog-command",
                    self.head,
                    "fail",
                    f"{prog} (first word of watchdog.restart_command) is not found on the head's "
                    "PATH for a non-interactive SSH command",
                    "install the watchdog on the head, or use an absolute path in "
                    "watchdog.restart_command",
                )
        from spark_ops.watchdog.contract import WatchdogContract

        contract = WatchdogContract(self.session)
        try:
            data = await contract.history("read", *contract._common())
        except SparkOpsError as exc:
            self.report.add(
                "history",
                self.head,
                "fail",
                exc.message,
                f"check watchdog.history_file ({wd.history_file}) and "
                f"watchdog.history_format ({wd.history_format}); "
                f"python3 must run on the head as {wd.python}",
            )
            return
        count = int(data.get("count", 0))
        malformed = data.get("malformed") or []
        exists = data.get("exists", True)
        detail = f"{wd.history_file}: {count} stamp(s), format {data.get('format')}"
        if not exists:
            detail = f"{wd.history_file} does not exist yet (no restart recorded)"
        if malformed:
            first = malformed[0]
            self.report.add(
                "history",
                self.head,
                "warn",
                f"{detail}; {len(malformed)} malformed line(s), e.g. line {first.get('line')}: "
                f"{str(first.get('raw', first)).strip()[:80]}",
                "malformed lines are kept and ignored; fix them by hand under the lock if they "
                "should count",
            )
        else:
            self.report.add("history", self.head, "ok", detail)
        await self._check_writable()
        await self._check_flags()

    async def _check_writable(self) -> None:
        """The history (or its directory) writable, the lock file lockable now, as the SSH user."""
        wd = self.cluster.watchdog
        res = await self.session.run(
            self.head, sh_program(_WRITABLE, wd.history_file, wd.lock_path), check=False, sudo=True
        )
        kv = _parse_kv(res.stdout)
        user = self.cluster.head.user or "the SSH user"
        problems = []
        if kv.get("file") == "not-writable":
            problems.append(f"{wd.history_file} is not writable by {user}")
        if kv.get("dir") != "writable":
            problems.append(
                f"its directory is {kv.get('dir', 'unknown').replace('-', ' ')} for {user} "
                "(the history is replaced by a rename there)"
            )
        lock = kv.get("lock", "unknown")
        if lock in ("unreadable", "absent-not-creatable", "no-flock", "unknown"):
            problems.append(f"lock file {wd.lock_path}: {lock.replace('-', ' ')}")
        if kv.get("lockfile") == "not-writable":
            problems.append(f"lock file {wd.lock_path} is not writable")
        if problems:
            self.report.add(
                "history-writable",
                self.head,
                "fail",
                "; ".join(problems),
                f"let {user} write {wd.history_file} and its directory (chown/chmod, or "
                "chattr -i if immutable), or set sudo: true for the head in the inventory",
            )
        elif lock == "held":
            self.report.add(
                "history-writable",
                self.head,
                "warn",
                f"writable, but {wd.lock_path} is locked right now (the watchdog may be writing)",
                "run doctor again in a moment; if it stays locked, find the holder: "
                f"fuser -v {wd.lock_path}",
            )
        else:
            self.report.add(
                "history-writable",
                self.head,
                "ok",
                f"history and its directory writable; lock {wd.lock_path} "
                f"{'free' if lock == 'free' else 'can be created'}",
            )

    async def _check_flags(self) -> None:
        """Report the pause and gave-up flags (warnings: apply forces the restart anyway)."""
        wd = self.cluster.watchdog
        for name, path, fix in (
            (
                "pause",
                wd.pause_file,
                "the watchdog will not recover a failed boot while paused; "
                "remove the file when done",
            ),
            (
                "gave-up",
                wd.gave_up_file,
                "see why, then `spark-ops budget` and clear it once the window has room",
            ),
        ):
            if not path:
                continue
            text = await self.session.read_file(self.head, path)
            if text is None:
                self.report.add(f"watchdog-{name}", self.head, "ok", f"{path} absent")
            else:
                first = (text.strip().splitlines() or [""])[0][:120]
                self.report.add(
                    f"watchdog-{name}",
                    self.head,
                    "warn",
                    f"{path} present{': ' + first if first else ''}",
                    fix,
                )

    async def check_engine(self) -> None:
        """The engine's API: reachable (directly or by tunnel), version, model, a completion."""
        from spark_ops.workflows import Operation

        if not self.up(self.head) and self.cluster.engine.tunnel:
            return
        eng = self.cluster.engine
        op = Operation(self.session, "doctor")
        how = "through an SSH tunnel to the head" if eng.tunnel else "directly"
        try:
            await op.api_url()
        except SparkOpsError as exc:
            self.report.add(
                "engine-api",
                self.head,
                "fail",
                f"{eng.api_url} {how}: {exc.message}",
                "check engine.api.url; the head's sshd must allow TCP forwarding",
            )
            return
        fix = (
            f"check the engine on the head (spark-ops status; its log: {eng.log_kind} "
            f"{eng.log_target}) and engine.api.url ({eng.api_url}) in the inventory"
        )
        async with op.engine(timeout=min(eng.probe_timeout_s, 10.0)) as api:
            if not await api.health():
                self.report.add(
                    "engine-api",
                    self.head,
                    "fail",
                    f"{eng.api_url} ({how}) does not answer /health",
                    fix,
                )
                return
            version = await api.version()
            models = await api.models()
            self.report.add(
                "engine-api",
                self.head,
                "ok",
                f"{eng.api_url} ({how}): vLLM {version or '?'}, "
                f"serving {', '.join(models) or 'no model'}",
            )
            if eng.model and eng.model not in models:
                self.report.add(
                    "engine-model",
                    self.head,
                    "fail",
                    f"engine.model {eng.model!r} is not served (served: {models})",
                    "set engine.model to one of the served names, or remove it",
                )
            start = time.monotonic()
            answered = await api.complete(eng.probe_timeout_s)
            took = time.monotonic() - start
        if answered:
            self.report.add(
                "engine-completion",
                self.head,
                "ok",
                f"a 5-token completion answered in {took:.1f} s",
            )
        else:
            self.report.add(
                "engine-completion",
                self.head,
                "fail",
                f"/health answers but a 5-token completion did not within "
                f"{eng.probe_timeout_s:.0f} s "
                "(the engine may be wedged: a Ray worker lost, NCCL hung)",
                "see docs/troubleshooting.md ('/health 200 while wedged'); a restart is needed "
                "before apply can prove its own",
            )

    async def check_engine_log(self) -> None:
        """The engine's log source exists, so apply can follow the boot."""
        if not self.up(self.head):
            return
        eng = self.cluster.engine
        if eng.log_kind == "file":
            cmd, what = f"test -r {quote_path(eng.log_target)}", f"log file {eng.log_target}"
            fix = "set engine.log.path to the file the engine writes (or kind: docker / journalctl)"
        elif eng.log_kind == "docker":
            cmd = f"docker inspect --format '{{{{.State.Status}}}}' {shlex.quote(eng.log_target)}"
            what, fix = (
                f"container {eng.log_target}",
                "set engine.log.container to the engine's container",
            )
        elif eng.log_kind == "journalctl":
            cmd = f"systemctl cat {shlex.quote(eng.log_target)} >/dev/null"
            what, fix = f"systemd unit {eng.log_target}", "set engine.log.unit to the engine's unit"
        else:
            self.report.add("engine-log", self.head, "ok", f"log command: {eng.log_target}")
            return
        res = await self.session.run(self.head, cmd, check=False, sudo=True)
        if res.ok:
            self.report.add("engine-log", self.head, "ok", f"{what} readable")
        else:
            self.report.add(
                "engine-log",
                self.head,
                "fail",
                f"{what} not readable: {res.stderr.strip()[-200:] or 'absent'}",
                fix,
            )

    async def check_budget(self) -> None:
        """The restart budget left: none left fails (a failed boot could not be recovered)."""
        if not self.up(self.head):
            return
        from spark_ops.watchdog.contract import WatchdogContract

        try:
            view = await WatchdogContract(self.session).budget()
        except SparkOpsError as exc:
            self.report.add(
                "budget",
                self.head,
                "fail",
                exc.message,
                "fix the history first (see the history check)",
            )
            return
        left = max(0, view.allowed - view.used)
        detail = f"{view.used}/{view.allowed} automatic restarts used in {view.window_s / 3600:g} h"
        if left == 0:
            wait = max(0.0, view.next_free_at - view.now)
            self.report.add(
                "budget",
                self.head,
                "fail",
                f"{detail}: none left; if apply's boot failed the watchdog could not recover "
                f"the engine (next slot frees in {wait / 60:.0f} min)",
                "remove planned stamps left by earlier experiments: spark-ops budget prune "
                "--planned (see `spark-ops budget`), or wait for the window to free a slot",
            )
        else:
            self.report.add("budget", self.head, "ok", f"{detail}, {left} left")


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


async def run_doctor(cluster: Cluster, *, session: ClusterSession | None = None) -> DoctorReport:
    """Run every check on a cluster and return the report (never raises for a failed check)."""
    report = DoctorReport(cluster.name, cluster.source)
    own = session is None
    sess = session or ClusterSession(cluster)
    try:
        await sess.connect(required=False)
        doc = Doctor(sess, report)
        doc.check_ssh()
        if doc.up(doc.head):
            await doc.check_tools()
            await doc.check_state_dir()
            await doc.check_cluster_lock()
        await doc.check_sudo()
        await doc.check_recipe()
        await doc.check_watchdog()
        await doc.check_budget()
        await doc.check_engine_log()
        await doc.check_engine()
    finally:
        if own:
            await sess.close()
    return report
