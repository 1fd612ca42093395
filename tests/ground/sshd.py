"""Real OpenSSH sshd nodes on 127.0.0.1: one sshd process, host key and Unix user (own HOME) each.

Needs root (it creates Unix users) and /usr/sbin/sshd. Every cluster gets its own users
(`sparkop-<node>-<tag>`) and homes under /home/sparkop-ground/<tag>/, so that clusters started by
several test runs at once never share a HOME; `close()` removes them, and a later start removes
what a killed run left behind.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_ops.inventory import SHARED_STATE_DIR as LOCK_DIR
from spark_ops.remote.programs.lock import OPERATORS_GROUP

from . import GroundError, GroundUnavailable

SSHD = Path("/usr/sbin/sshd")
HOME_BASE = Path("/home/sparkop-ground")
USER_PREFIX = "sparkop-"
USER_GECOS = "spark-ops test ground"
OWNER_FILE = ".owner-pid"
_NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,15}$")
START_TIMEOUT = 15.0


def unavailable_reason() -> str | None:
    """Return why sshd nodes cannot run here (not root, a tool missing), or None when they can."""
    if os.geteuid() != 0:
        return "OpenSSH ground needs root (it creates one Unix user per node)"
    if not SSHD.is_file():
        return f"{SSHD} is missing (apt-get install openssh-server, or bash .ci/install-ground.sh)"
    for tool in ("ssh-keygen", "useradd", "userdel"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    return None


def sshd_version() -> tuple[int, int]:
    """Return OpenSSH's (major, minor) version as `sshd -V` prints it."""
    out = subprocess.run([str(SSHD), "-V"], capture_output=True, text=True, check=False)
    match = re.search(r"OpenSSH_(\d+)\.(\d+)", out.stdout + out.stderr)
    if not match:
        raise GroundError(
            f"cannot read the OpenSSH version from `{SSHD} -V`: {out.stderr.strip()!r}"
        )
    return int(match.group(1)), int(match.group(2))


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on host that nothing listens on now (bind to port 0, then release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _run(argv: Sequence[str], *, what: str) -> str:
    """Run a short command, return its stdout; raise GroundError naming `what` when it fails."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise GroundError(f"{what} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def keygen(path: Path, comment: str) -> str:
    """Generate an ed25519 key pair at path (+ .pub), no passphrase; return the public key line."""
    for old in (path, path.with_name(path.name + ".pub")):
        old.unlink(missing_ok=True)
    _run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        what=f"ssh-keygen for {path}",
    )
    path.chmod(0o600)
    return path.with_name(path.name + ".pub").read_text().strip()


def pid_alive(pid: int) -> bool:
    """Tell whether a process with this pid exists (zombies count as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _proc_table() -> Iterator[tuple[int, int, int]]:
    """Yield (pid, ppid, real uid) of every process in /proc."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        try:
            yield int(entry.name), int(fields["PPid"]), int(fields["Uid"].split()[0])
        except (KeyError, ValueError, IndexError):
            continue


def _descendants(root: int) -> list[int]:
    """Return the pids of all descendants of root (children first found, then theirs)."""
    children: dict[int, list[int]] = {}
    for pid, ppid, _uid in _proc_table():
        children.setdefault(ppid, []).append(pid)
    found: list[int] = []
    queue = [root]
    while queue:
        for child in children.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def _pids_of_uid(uid: int) -> list[int]:
    """Return the pids of processes whose real uid is uid."""
    return [pid for pid, _ppid, puid in _proc_table() if puid == uid]


def _kill_pids(pids: Iterable[int], sig: int = signal.SIGKILL) -> None:
    """Send sig to each pid, ignoring processes that are already gone."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _create_user(user: str, home: Path) -> pwd.struct_passwd:
    """Create a Unix user with this home (not made here), bash and a usable (unlocked) account."""
    argv = ["useradd", "-M", "-d", str(home), "-s", "/bin/bash", "-p", "*", "-c", USER_GECOS]
    argv += ["-U", "-G", OPERATORS_GROUP, user]  # every node's user is one of the operators
    for _ in range(50):  # useradd exits 10 while another useradd/userdel holds /etc/passwd's lock
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            break
        if (
            proc.returncode == 9
        ):  # already exists: a leftover with the same random tag is impossible
            raise GroundError(f"Unix user {user} already exists; pick another cluster tag")
        if proc.returncode != 10:
            raise GroundError(
                f"useradd {user} failed (exit {proc.returncode}): {proc.stderr.strip()}"
            )
        time.sleep(0.1)
    else:
        raise GroundError(f"useradd {user}: /etc/passwd stayed locked for 5 s")
    return pwd.getpwnam(user)


def operators_setup() -> None:
    """The one-time set-up `doctor` prints (issue 34): the operators' group, and the head-wide
    lock dir owned by it, 2770 (the ground's node users are the operators; root is the sim's)."""
    subprocess.run(["groupadd", "-f", OPERATORS_GROUP], capture_output=True, check=True)
    gid = grp.getgrnam(OPERATORS_GROUP).gr_gid
    lock_dir = Path(LOCK_DIR)
    lock_dir.mkdir(mode=0o2770, parents=True, exist_ok=True)
    os.chown(lock_dir, 0, gid)
    lock_dir.chmod(0o2770)


def _delete_user(user: str) -> None:
    """Delete a ground user (and its group); processes still running as it are killed first."""
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return
    _kill_pids(_pids_of_uid(uid))
    for _ in range(50):
        proc = subprocess.run(["userdel", user], capture_output=True, text=True, check=False)
        if proc.returncode in (0, 6):  # 6: no such user (someone else removed it)
            return
        if proc.returncode == 8:  # user still logged in: processes dying
            _kill_pids(_pids_of_uid(uid))
        time.sleep(0.1)
    raise GroundError(f"userdel {user} kept failing: {proc.stderr.strip()}")


def sweep_stale_users() -> list[str]:
    """Remove ground users and homes left by runs whose owner process died; return their names."""
    removed: list[str] = []
    for entry in pwd.getpwall():
        if not entry.pw_name.startswith(USER_PREFIX) or entry.pw_gecos != USER_GECOS:
            continue
        tag_dir = Path(entry.pw_dir).parent
        owner = tag_dir / OWNER_FILE
        try:
            alive = pid_alive(int(owner.read_text().strip()))
        except (OSError, ValueError):
            alive = False
        if not alive:
            _kill_listeners(tag_dir)
            _delete_user(entry.pw_name)
            removed.append(entry.pw_name)
            if tag_dir.parent == HOME_BASE:
                shutil.rmtree(tag_dir, ignore_errors=True)
    return removed


def _kill_listeners(tag_dir: Path) -> None:
    """Kill the sshd listeners (and their children) recorded in a dead cluster's tag directory."""
    for pid_file in tag_dir.glob(".sshd-*.pid"):
        try:
            pid = int(pid_file.read_text().strip())
            exe = os.readlink(f"/proc/{pid}/exe")
        except (OSError, ValueError):
            continue
        if exe == str(SSHD):  # not a reused pid (sshd rewrites its cmdline, not its exe)
            _kill_pids([*_descendants(pid), pid])


@dataclass
class SshNode:
    """One sshd node: where it listens, who logs in, its HOME and its current host key."""

    name: str
    host: str
    port: int
    user: str
    home: Path
    host_key_pub: str
    uid: int
    gid: int
    dir: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    starts: int = 0
    listened: bool = False

    @property
    def config_path(self) -> Path:
        """The node's sshd_config."""
        return self.dir / "sshd_config"

    @property
    def host_key_path(self) -> Path:
        """The node's private ed25519 host key."""
        return self.dir / "ssh_host_ed25519_key"

    @property
    def log_path(self) -> Path:
        """The current sshd's log (`-E`); each start writes a new one (sshd.1.log, sshd.2.log…)."""
        return self.dir / f"sshd.{max(self.starts, 1)}.log"

    def log_paths(self) -> list[Path]:
        """Every log this node's sshd has written, oldest first."""
        return [self.dir / f"sshd.{i}.log" for i in range(1, self.starts + 1)]

    @property
    def pid_path(self) -> Path:
        """sshd's PidFile."""
        return self.dir / "sshd.pid"

    @property
    def running(self) -> bool:
        """Whether the node's sshd listener process is alive."""
        return self.proc is not None and self.proc.poll() is None

    def known_hosts_line(self) -> str:
        """The known_hosts line for this node's current host key (`[host]:port type base64`)."""
        key_type, key_b64 = self.host_key_pub.split()[:2]
        return f"[{self.host}]:{self.port} {key_type} {key_b64}"

    def to_dict(self) -> dict[str, Any]:
        """Serialize the node's public facts."""
        return {
            "name": self.name,
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "home": str(self.home),
            "host_key_pub": self.host_key_pub,
            "running": self.running,
        }


class SshdCluster:
    """A set of sshd nodes sharing one client key and one known_hosts file."""

    def __init__(self, workdir: Path, tag: str, client_key: Path, known_hosts: Path) -> None:
        """Hold the cluster's paths; nodes are added by start_sshd_nodes."""
        self.workdir = workdir
        self.tag = tag
        self.client_key = client_key
        self.known_hosts = known_hosts
        self.nodes: list[SshNode] = []
        self.home_root = HOME_BASE / tag
        self._closed = False

    @property
    def client_key_pub(self) -> str:
        """The client public key line that every node's authorized_keys holds."""
        return self.client_key.with_name(self.client_key.name + ".pub").read_text().strip()

    @property
    def names(self) -> list[str]:
        """Node names in start order."""
        return [node.name for node in self.nodes]

    def node(self, name: str) -> SshNode:
        """Return the node called name."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise GroundError(f"no sshd node named {name!r}; nodes are {self.names}")

    def __getitem__(self, name: str) -> SshNode:
        """Return the node called name."""
        return self.node(name)

    def __iter__(self) -> Iterator[SshNode]:
        """Iterate over the nodes."""
        return iter(self.nodes)

    def __enter__(self) -> SshdCluster:
        """Use as a context manager that closes the cluster."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the cluster."""
        self.close()

    def connect_kwargs(self, name: str) -> dict[str, Any]:
        """Keyword arguments for asyncssh.connect() to reach node name with the client key."""
        node = self.node(name)
        return {
            "host": node.host,
            "port": node.port,
            "username": node.user,
            "client_keys": [str(self.client_key)],
            "known_hosts": str(self.known_hosts),
            "agent_path": None,
        }

    def ssh_argv(self, name: str) -> list[str]:
        """An OpenSSH client command line (without the remote command) that reaches node name."""
        node = self.node(name)
        return [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(self.client_key),
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-p",
            str(node.port),
            f"{node.user}@{node.host}",
        ]

    def write_known_hosts(self, names: Iterable[str] | None = None) -> Path:
        """(Re)write known_hosts with the current host keys of the named nodes (default: all)."""
        wanted = self.names if names is None else list(names)
        lines = [self.node(name).known_hosts_line() for name in wanted]
        self.known_hosts.write_text("".join(line + "\n" for line in lines))
        return self.known_hosts

    def log_text(self, name: str) -> str:
        """Everything node name's sshd has logged so far."""
        paths = self.node(name).log_paths()
        return "".join(path.read_text(errors="replace") for path in paths if path.exists())

    def start(self, name: str) -> None:
        """Start node name's sshd on its port (no-op when it runs); wait until it listens."""
        node = self.node(name)
        if self._closed:
            raise GroundError(f"cluster {self.tag} is closed; cannot start {name}")
        if node.running:
            return
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            node.starts += 1
            node.proc = subprocess.Popen(
                [str(SSHD), "-D", "-f", str(node.config_path), "-E", str(node.log_path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            )
            outcome = self._wait_listening(node, deadline)
            if outcome == "ok":
                (self.home_root / f".sshd-{name}.pid").write_text(f"{node.proc.pid}\n")
                node.listened = True
                return
            if outcome == "busy" and time.monotonic() < deadline:
                if not node.listened:  # a brand-new node: take another free port
                    self._move_port(node, free_port())
                else:  # clients know this port: wait for whoever holds it
                    time.sleep(0.2)
                continue
            log = node.log_path.read_text(errors="replace") if node.log_path.exists() else ""
            raise GroundError(
                f"sshd for node {name} (port {node.port}) did not start: {log.strip()[-2000:]}"
            )

    def _move_port(self, node: SshNode, port: int) -> None:
        """Give a node that never listened another port (config and known_hosts follow)."""
        text = node.config_path.read_text()
        node.config_path.write_text(text.replace(f"Port {node.port}\n", f"Port {port}\n", 1))
        node.port = port
        self.write_known_hosts([n.name for n in self.nodes if n.host_key_pub])

    def _wait_listening(self, node: SshNode, deadline: float) -> str:
        """Wait for sshd's 'Server listening' line; return 'ok', 'busy' (port taken) or 'failed'."""
        assert node.proc is not None
        needle = f"Server listening on {node.host} port {node.port}"
        while time.monotonic() < deadline:
            text = node.log_path.read_text(errors="replace") if node.log_path.exists() else ""
            if needle in text and node.proc.poll() is None:
                return "ok"
            if node.proc.poll() is not None:
                return "busy" if "Address already in use" in text else "failed"
            time.sleep(0.02)
        self._terminate(node)
        return "failed"

    def _terminate(self, node: SshNode) -> list[int]:
        """Stop node's listener (SIGTERM, then SIGKILL); return the pids of its sessions."""
        if node.proc is None:
            return []
        sessions = _descendants(node.proc.pid) if node.proc.poll() is None else []
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
            try:
                node.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(timeout=5)
        node.proc = None
        return sessions

    def stop(self, name: str, *, kill_sessions: bool = True) -> None:
        """Take node name down: stop its sshd, by default also its user's sessions/processes."""
        node = self.node(name)
        sessions = self._terminate(node)
        if kill_sessions:
            _kill_pids(sessions)
            _kill_pids(_pids_of_uid(node.uid))

    def rotate_host_key(self, name: str) -> str:
        """New host key for node name, then restart (known_hosts NOT updated); return the key."""
        node = self.node(name)
        was_running = node.running
        self._terminate(node)
        node.host_key_pub = keygen(node.host_key_path, f"{node.name}-host-rotated")
        if was_running:
            self.start(name)
        return node.host_key_pub

    def close(self) -> None:
        """Stop every node, kill its users' processes, delete the users and homes (idempotent)."""
        if self._closed:
            return
        self._closed = True
        errors: list[str] = []
        for node in self.nodes:
            try:
                self.stop(node.name)
                _delete_user(node.user)
            except (GroundError, OSError) as exc:
                errors.append(f"{node.name}: {exc}")
        shutil.rmtree(self.home_root, ignore_errors=True)
        if errors:
            raise GroundError("closing the sshd cluster: " + "; ".join(errors))


def _sshd_config(
    node: SshNode, *, env: dict[str, str], penalties: bool, options: dict[str, str] | None = None
) -> str:
    """Render a node's sshd_config: loopback only, key-only auth for its user, high limits.

    `options` replaces settings by keyword (e.g. {"MaxSessions": "10"} for sshd's default).
    """
    lines = [
        f"Port {node.port}",
        f"ListenAddress {node.host}",
        "AddressFamily inet",
        f"HostKey {node.host_key_path}",
        f"PidFile {node.pid_path}",
        "AuthorizedKeysFile .ssh/authorized_keys",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "PermitRootLogin no",
        f"AllowUsers {node.user}",
        "UsePAM no",
        "StrictModes no",
        "MaxStartups 512",
        "MaxSessions 512",
        "MaxAuthTries 10",
        "LoginGraceTime 30",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "AllowTcpForwarding yes",
        "PermitUserEnvironment no",
        "Subsystem sftp internal-sftp",
        "LogLevel VERBOSE",
    ]
    for key, value in (options or {}).items():
        lines = [li for li in lines if li.split(" ", 1)[0] != key] + [f"{key} {value}"]
    if penalties:  # OpenSSH >= 9.8 penalises sources that fail auth; tests fail auth on purpose
        lines.append("PerSourcePenalties no")
    if env:
        lines.append("SetEnv " + " ".join(f'"{key}={value}"' for key, value in env.items()))
    return "\n".join(lines) + "\n"


def start_sshd_nodes(
    n: int,
    workdir: Path,
    *,
    names: Sequence[str] | None = None,
    env: dict[str, str] | None = None,
    options: dict[str, str] | None = None,
) -> SshdCluster:
    """Start n sshd nodes on 127.0.0.1 (free ports, own users/homes/host keys); wait for them.

    `names` defaults to node1..nodeN. `env` adds variables to every session (sshd SetEnv); each
    node's PATH is `<home>/bin:/usr/local/bin:/usr/bin:/bin` unless env sets PATH. `options`
    overrides sshd_config settings by keyword (e.g. {"MaxSessions": "10"}). Raises
    GroundUnavailable when this machine cannot run sshd nodes (callers turn that into a skip).
    """
    reason = unavailable_reason()
    if reason:
        raise GroundUnavailable(reason)
    names = list(names) if names is not None else [f"node{i}" for i in range(1, n + 1)]
    if len(names) != n or len(set(names)) != n:
        raise GroundError(f"names must be {n} distinct names, got {names}")
    for name in names:
        if not _NAME_RE.match(name):
            raise GroundError(
                f"node name {name!r} not allowed: lowercase letter then letters/digits, ≤16"
            )
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    sweep_stale_users()
    operators_setup()
    Path("/run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
    penalties = sshd_version() >= (9, 8)

    tag = secrets.token_hex(3)
    client_dir = workdir / "client"
    client_dir.mkdir(exist_ok=True)
    client_key = client_dir / "id_ed25519"
    client_pub = keygen(client_key, f"spark-ops-ground-client-{tag}")
    cluster = SshdCluster(workdir, tag, client_key, client_dir / "known_hosts")
    HOME_BASE.mkdir(mode=0o755, exist_ok=True)
    cluster.home_root.mkdir(mode=0o755)
    (cluster.home_root / OWNER_FILE).write_text(f"{os.getpid()}\n")
    try:
        for name in names:
            user = f"{USER_PREFIX}{name}-{tag}"
            home = cluster.home_root / name
            entry = _create_user(user, home)
            for sub in ("", ".ssh", "bin"):
                (home / sub).mkdir(mode=0o755, exist_ok=True)
            (home / ".ssh" / "authorized_keys").write_text(client_pub + "\n")
            for path in (home, home / ".ssh", home / "bin", home / ".ssh" / "authorized_keys"):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            node_dir = workdir / f"sshd-{name}"
            node_dir.mkdir(exist_ok=True)
            node = SshNode(
                name=name,
                host="127.0.0.1",
                port=free_port(),
                user=user,
                home=home,
                host_key_pub="",
                uid=entry.pw_uid,
                gid=entry.pw_gid,
                dir=node_dir,
            )
            node.host_key_pub = keygen(node.host_key_path, f"{name}-host")
            node_env = {"PATH": f"{home}/bin:/usr/local/bin:/usr/bin:/bin", **(env or {})}
            config = _sshd_config(node, env=node_env, penalties=penalties, options=options)
            node.config_path.write_text(config)
            cluster.nodes.append(node)
        cluster.write_known_hosts()
        for node in cluster.nodes:
            cluster.start(node.name)
    except BaseException:
        with contextlib.suppress(GroundError, OSError):
            cluster.close()
        raise
    return cluster
