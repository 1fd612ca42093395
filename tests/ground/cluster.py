"""Turn the OpenSSH ground (tests/ground/sshd.py) into a spark-ops cluster.

Each sshd node is its own Unix user, who cannot read /root: neither the editable spark-ops nor
root's pyenv Python is usable there. So everything a node runs uses Debian's `/usr/bin/python3`
(3.11, stdlib + PyYAML from dist-packages) with a private library directory `~/lib` on the head:

- `~/lib/spark_ops`: a copy of this checkout's package (the simulated vLLM lives in it);
- `~/lib/<module>`: copies of aiohttp and its pure-Python/C-extension dependencies taken from the
  interpreter running the tests (CPython 3.11 too, so the `cpython-311` extension modules load).

On the head:
- `~/bin/vllm`: a shim that runs the simulated engine (`python3 -m spark_ops.sim.engine`);
- `~/bin/run-recipe`: renders the recipe (spark_ops.recipe) and starts it detached (pid file, log),
  like the community `run-recipe.py RECIPE -d`;
- `~/bin/spark-wd`: a bash watchdog of the community kind. `--restart-now --force` stops the engine
  of the pid file (SIGTERM to its process group, SIGKILL after 10 s), starts it again from the
  recipe and appends `date +%s` to the history under `flock` on the lock file. It prints no stamp,
  so the inventory says `reports_stamp: false` and spark-ops finds the stamp by the head's clock.
  `SPARK_WD_EXTRA_STAMPS=N` in `~/.watchdog/env` makes it append N more stamps, one second apart
  (an automatic restart racing the planned one).

Workers run a "raylet": a TCP listener (started over SSH as the worker's user) that the simulated
engine must reach to form its placement group, so a lost worker stalls the boot as on Ray.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from . import GroundError
from .sshd import SshdCluster, SshNode, free_port

if TYPE_CHECKING:
    from spark_ops.inventory import Cluster

REPO = Path(__file__).resolve().parents[2]
NODE_PYTHON = "/usr/bin/python3"
RECIPE_REL = "recipes/glm-5.3-flash-sim.yaml"
HISTORY_REL = ".watchdog/restart_history"
PID_REL = ".watchdog/engine.pid"
LOG_REL = "engine.log"
# aiohttp and what it imports at run time (attr/attrs, idna and typing_extensions when present)
RUNTIME_MODULES = (
    "aiohttp",
    "multidict",
    "yarl",
    "frozenlist",
    "aiosignal",
    "propcache",
    "aiohappyeyeballs",
    "attr",
    "attrs",
    "idna",
    "typing_extensions",
)

WATCHDOG_SH = r"""#!/bin/bash
# spark-wd: a restart watchdog of the community kind (its probe loop is left out: tests force
# restarts). History: one `date +%s` per line, appended under flock on the lock file.
set -u
STATE="$HOME/.watchdog"
HISTORY="$STATE/restart_history"
LOCK="$HISTORY.lock"
PIDFILE="$STATE/engine.pid"
RECIPE="$HOME/@RECIPE@"
[ -f "$STATE/env" ] && . "$STATE/env"

stop_engine() {
  local pid
  pid=$(head -n 1 "$PIDFILE" 2>/dev/null) || return 0
  [ -n "$pid" ] || return 0
  kill -TERM -- "-$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 -- "-$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL -- "-$pid" 2>/dev/null
  return 0
}

stamp() {
  (
    flock -w 10 9 || exit 1
    date +%s >> "$HISTORY"
  ) 9>>"$LOCK"
}

case "${1:-}" in
  --restart-now)
    if [ "${2:-}" != "--force" ]; then
      echo "spark-wd: refusing a restart without --force" >&2
      exit 5
    fi
    stop_engine
    run-recipe "$RECIPE" -d || exit 1
    stamp || exit 1
    for _ in $(seq "${SPARK_WD_EXTRA_STAMPS:-0}"); do sleep 1; stamp || exit 1; done
    ;;
  --start) run-recipe "$RECIPE" -d ;;
  --stop) stop_engine ;;
  *)
    echo "usage: spark-wd --restart-now --force | --start | --stop" >&2
    exit 2
    ;;
esac
"""

RUN_RECIPE_PY = """#!@PYTHON@
\"\"\"run-recipe RECIPE -d: render a recipe and start its command detached (pid file, log).\"\"\"
import os
import subprocess
import sys

sys.path.insert(0, os.path.expanduser("~/lib"))
from spark_ops.recipe import render_recipe  # noqa: E402

path = sys.argv[1]
with open(path, encoding="utf-8") as fh:
    rendered = render_recipe(fh.read(), source=path)
home = os.path.expanduser("~")
pid_file = os.path.join(home, "@PID@")
env = dict(os.environ, **rendered.env)
with open(os.path.join(home, "@LOG@"), "ab") as log:
    proc = subprocess.Popen(
        rendered.argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        start_new_session=True, cwd=home,
    )
tmp = pid_file + ".tmp"
with open(tmp, "w", encoding="utf-8") as fh:
    fh.write(f"{proc.pid}\\n")
os.replace(tmp, pid_file)
"""

VLLM_SHIM = """#!/bin/sh
# `vllm` on the head's PATH: the simulated vLLM from the copied spark_ops package.
[ -f "$HOME/.sim-ray-workers" ] && SPARK_SIM_RAY_WORKERS=$(cat "$HOME/.sim-ray-workers")
export SPARK_SIM_RAY_WORKERS
export SPARK_SIM_CONFIG="$HOME/engine.yaml"
export PYTHONPATH="$HOME/lib"
exec @PYTHON@ -m spark_ops.sim.engine "$@"
"""

RAYLET_PY = """import ctypes, socket, threading
# named `raylet` like Ray's own process, so that `pgrep -x raylet` finds it (PR_SET_NAME = 15)
ctypes.CDLL(None).prctl(15, b"raylet", 0, 0, 0)
def keep(conn):
    # hold the engine's liveness connection until it closes (or this node dies)
    conn.sendall(b"raylet {name}\\n")
    while conn.recv(4096):
        pass
    conn.close()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {port}))
s.listen(64)
while True:
    threading.Thread(target=keep, args=(s.accept()[0],), daemon=True).start()
"""


@dataclass
class SparkGround:
    """An OpenSSH cluster set up for spark-ops: inventory, head files, engine port."""

    cluster: SshdCluster
    workdir: Path
    inventory: Path
    engine_port: int
    recipe_nodes: list[str]
    raylet_ports: dict[str, int] = field(default_factory=dict)

    @property
    def head(self) -> SshNode:
        """The head node (node1)."""
        return self.cluster.nodes[0]

    @property
    def history(self) -> Path:
        """The bash watchdog's restart history on the head."""
        return self.head.home / HISTORY_REL

    @property
    def recipe(self) -> Path:
        """The recipe on the head."""
        return self.head.home / RECIPE_REL

    def recipe_on(self, name: str) -> Path:
        """The recipe copy on node name."""
        return self.cluster.node(name).home / RECIPE_REL

    @property
    def engine_log(self) -> Path:
        """The engine's log on the head."""
        return self.head.home / LOG_REL

    @property
    def base_url(self) -> str:
        """The engine API as seen from this machine (loopback)."""
        return f"http://127.0.0.1:{self.engine_port}"

    def env(self) -> dict[str, str]:
        """Environment for running the spark-ops CLI against this cluster."""
        env = dict(os.environ)
        env["SPARK_OPS_INVENTORY"] = str(self.inventory)
        env.pop("SPARK_OPS_CLUSTER", None)
        env.pop("SPARK_OPS_FLEET", None)
        return env

    def stamps(self) -> list[str]:
        """The history's lines, verbatim."""
        return self.history.read_text().splitlines()

    def set_extra_stamps(self, n: int) -> None:
        """Make the watchdog append n more stamps per forced restart (a racing restart)."""
        write_as(self.head, self.head.home / ".watchdog" / "env", f"SPARK_WD_EXTRA_STAMPS={n}\n")

    def ssh(self, name: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a command on node name through the OpenSSH client."""
        return subprocess.run(
            [*self.cluster.ssh_argv(name), command],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip

    def wait_serving(self, timeout: float = 120.0) -> None:
        """Wait until the engine answers /v1/models; raise GroundError with the log tail if not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base_url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.3)
        tail = (
            self.engine_log.read_text(errors="replace")[-2000:] if self.engine_log.exists() else ""
        )
        raise GroundError(f"the engine on the OpenSSH head did not serve in {timeout} s: {tail}")


def write_as(node: SshNode, path: Path, text: str, mode: int = 0o644) -> Path:
    """Write a file in a node's HOME owned by the node's user (parents made and owned too)."""
    parents = []
    for parent in path.parents:
        if parent == node.home or not str(parent).startswith(str(node.home)):
            break
        parents.append(parent)
    for parent in reversed(parents):
        if not parent.exists():
            parent.mkdir(mode=0o755)
            os.chown(parent, node.uid, node.gid)
    path.write_text(text)
    path.chmod(mode)
    os.chown(path, node.uid, node.gid)
    return path


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    """chown a directory tree (the node user must own what it runs and writes)."""
    os.chown(root, uid, gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def install_runtime(node: SshNode) -> Path:
    """Copy spark_ops and aiohttp (with its dependencies) into node's ~/lib; return the path."""
    lib = node.home / "lib"
    lib.mkdir(mode=0o755, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "spark_ops", lib / "spark_ops", ignore=ignore, dirs_exist_ok=True)
    for name in RUNTIME_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        if spec.submodule_search_locations:
            src = Path(next(iter(spec.submodule_search_locations)))
            shutil.copytree(src, lib / src.name, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copy2(spec.origin, lib / Path(spec.origin).name)
    _chown_tree(lib, node.uid, node.gid)
    return lib


def _recipe_text(engine_port: int, max_num_seqs: int, tp: int) -> str:
    """The embedded cluster's GLM recipe with this ground's port, cap and TP."""
    from spark_ops.sim.cluster import asset

    return (
        asset("glm-5.3-flash-sim.yaml")
        .replace("port: 8000", f"port: {engine_port}")
        .replace("max_num_seqs: 6 ", f"max_num_seqs: {max_num_seqs} ")
        .replace("tensor_parallel: 4", f"tensor_parallel: {tp}")
    )


def inventory_text(
    ground_cluster: SshdCluster, engine_port: int, recipe_nodes: Sequence[str]
) -> str:
    """The spark-ops inventory of an OpenSSH ground cluster (one user per node)."""
    nodes = "\n".join(
        f"      {n.name}: {{host: {n.host}, port: {n.port}, user: {n.user}, "
        f"role: {'head' if i == 0 else 'worker'}}}"
        for i, n in enumerate(ground_cluster.nodes)
    )
    return f"""# spark-ops inventory of the OpenSSH test ground (written by tests/ground/cluster.py)
clusters:
  ground:
    tensor_parallel: {len(ground_cluster.nodes)}
    ssh:
      known_hosts: {ground_cluster.known_hosts}
      identity: {ground_cluster.client_key}
      agent: false
      config: /dev/null
      connect_timeout: 5
      command_timeout: 60
    nodes:
{nodes}
    recipe:
      path: ~/{RECIPE_REL}
      nodes: [{", ".join(recipe_nodes)}]
      keep_backups: 5
    watchdog:
      restart_command: spark-wd --restart-now --force
      reports_stamp: false
      history_file: ~/{HISTORY_REL}
      history_format: stamps
      lock_file: ~/{HISTORY_REL}.lock
      pause_file: ~/.watchdog/pause
      gave_up_file: ~/.watchdog/gave-up
      python: {NODE_PYTHON}
      budget: {{max_restarts: 2, window_s: 21600}}
    engine:
      log: {{kind: file, path: ~/{LOG_REL}}}
      pid_file: ~/{PID_REL}
      api: {{url: "http://127.0.0.1:{engine_port}", tunnel: true}}
      boot_deadline_s: 120
      probe_timeout_s: 10
      worker_stall_s: 20
      min_mem_available_gb: 0.1
      # the ground's nodes share one kernel: count only this node user's raylet
      worker_check: pgrep -x -u "$(id -u)" raylet >/dev/null
"""


def bare_cluster(ground_cluster: SshdCluster, **ssh: object) -> Cluster:
    """A spark-ops cluster over sshd nodes (the first one head) with no engine, for SSH tests.

    Host keys and the client key come from the inventory only; `ssh` adds settings of the
    inventory's ssh: section (e.g. max_channels=8, jump="user@host:port").
    """
    from spark_ops.inventory import parse_inventory

    nodes = "".join(
        f"      {n.name}: {{host: {n.host}, port: {n.port}, user: {n.user}"
        + (", role: head" if i == 0 else "")
        + "}\n"
        for i, n in enumerate(ground_cluster.nodes)
    )
    extra = "".join(f"      {key}: {json.dumps(value)}\n" for key, value in ssh.items())
    text = (
        "clusters:\n  t:\n    ssh:\n"
        f"      known_hosts: {ground_cluster.known_hosts}\n"
        f"      identity: {ground_cluster.client_key}\n"
        "      agent: false\n      config: /dev/null\n      connect_timeout: 10\n"
        + extra
        + "    nodes:\n"
        + nodes
        + "    recipe: {path: ~/recipe.yaml}\n"
        "    watchdog: {restart_command: 'true', history_file: ~/restarts}\n"
    )
    return parse_inventory(text, "test-inventory.yaml").cluster()


def start_raylet(ground: SparkGround, name: str) -> None:
    """Start (over SSH, as the worker's user) the worker's raylet listener, detached."""
    port = ground.raylet_ports[name]
    code = RAYLET_PY.format(port=port, name=name)
    script = write_as(ground.cluster.node(name), ground.cluster.node(name).home / "raylet.py", code)
    res = ground.ssh(
        name, f"setsid -f {NODE_PYTHON} {script} </dev/null >/dev/null 2>&1; echo started"
    )
    if res.returncode != 0:
        raise GroundError(f"raylet on {name} did not start: {res.stderr.strip()}")


def make_spark_ground(
    cluster: SshdCluster,
    workdir: Path,
    *,
    max_num_seqs: int = 6,
    recipe_nodes: Sequence[str] = ("node1",),
    earlier_stamps: Sequence[int] = (),
    time_scale: float = 4.0,
    boot_scale: float = 1.0,
    start_engine: bool = True,
) -> SparkGround:
    """Install runtime, shims, watchdog, recipe(s) and history; start raylets and the engine."""
    workdir.mkdir(parents=True, exist_ok=True)
    head = cluster.nodes[0]
    engine_port = free_port()
    ground = SparkGround(
        cluster=cluster,
        workdir=workdir,
        inventory=workdir / "inventory.yaml",
        engine_port=engine_port,
        recipe_nodes=list(recipe_nodes),
        raylet_ports={n.name: free_port() for n in cluster.nodes[1:]},
    )
    lib = install_runtime(head)
    base = lib / "spark_ops" / "data" / "sim" / "engine.yaml"
    overlay = f"base: {base}\ntime_scale: {time_scale}\nfault: null\n"
    if boot_scale != 1.0:  # slower boot phases, so that a test can act in the middle of one
        import yaml

        phases = yaml.safe_load(base.read_text()).get("boot", {})
        overlay += "boot:\n" + "".join(
            f"  {k}: {float(v) * boot_scale}\n" for k, v in phases.items()
        )
    write_as(head, head.home / "engine.yaml", overlay)
    bins = head.home / "bin"
    write_as(head, bins / "vllm", VLLM_SHIM.replace("@PYTHON@", NODE_PYTHON), 0o755)
    run_recipe = RUN_RECIPE_PY.replace("@PYTHON@", NODE_PYTHON)
    run_recipe = run_recipe.replace("@PID@", PID_REL).replace("@LOG@", LOG_REL)
    write_as(head, bins / "run-recipe", run_recipe, 0o755)
    write_as(head, bins / "spark-wd", WATCHDOG_SH.replace("@RECIPE@", RECIPE_REL), 0o755)
    workers = ",".join(f"{n}=127.0.0.1:{p}" for n, p in ground.raylet_ports.items())
    write_as(head, head.home / ".sim-ray-workers", workers + "\n")
    recipe = _recipe_text(engine_port, max_num_seqs, len(cluster.nodes))
    for name in recipe_nodes:
        node = cluster.node(name)
        write_as(node, node.home / RECIPE_REL, recipe)
    write_as(head, head.home / HISTORY_REL, "".join(f"{s}\n" for s in earlier_stamps))
    ground.inventory.write_text(inventory_text(cluster, engine_port, recipe_nodes))
    for name in ground.raylet_ports:
        start_raylet(ground, name)
    if start_engine:
        res = ground.ssh(head.name, "spark-wd --start")
        if res.returncode != 0:
            raise GroundError(f"spark-wd --start failed: {res.stderr.strip()}")
        ground.wait_serving()
    return ground


def ground_facts(ground: SparkGround) -> dict[str, object]:
    """A JSON-able summary (for test reports)."""
    return {
        "inventory": str(ground.inventory),
        "engine_port": ground.engine_port,
        "nodes": [n.to_dict() for n in ground.cluster.nodes],
        "recipe_nodes": ground.recipe_nodes,
        "history": json.dumps(ground.stamps()),
    }


def run_cli(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run the real spark-ops CLI in a subprocess (this checkout's package, via PYTHONPATH)."""
    import sys

    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
