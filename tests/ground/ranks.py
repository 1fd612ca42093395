"""vLLM's CPU build run as two ranks without Ray, across the real-Ray ground's two namespaces.

The namespaces and the veth are `tests/ground/ray.py`'s (head 198.18.0.1, worker 198.18.0.2, both
ends named sray0); no Ray is started in them. The head's `vllm` is the launcher written here
(`launcher_text`), the way eugr/spark-vllm-docker launches ranks today: a `vllm serve` line with
`--distributed-executor-backend mp` and no `--node-rank` first stops the worker rank the last
launch left (its pid file, by process group), starts rank 1 in the worker's namespace

    vllm serve ARGS --nnodes 2 --node-rank 1 --master-addr 198.18.0.1 --master-port 29555 --headless

with the worker node's own HOME and environment, logging to the worker's `~/engine.log`, then
becomes rank 0 on the head (`… --node-rank 0 …`, serving the API). Each rank gets VLLM_HOST_IP, its
node's address: vLLM finds it by a UDP connect to a public address, which has no route in these
namespaces; without it rank 0 offers its message queue at 0.0.0.0 and rank 1 never reaches it
(both ranks then wait after loading the weights, with no error line). Any other command line (the
preflight's parse, `--version`) runs vLLM's CPU build unchanged. The head's watchdog runs this
`vllm` as its restart action, so `spark-ops apply` and `rollback` restart both ranks.

A test makes rank 1 fail at start by writing `rank-fault` in the worker's home: its words are put
before the command (`VAR=value …`, as `env` takes them) for the next launch only.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from .ray import HEAD_IP, IFNAME, WORKER_IP
from .vllm import OWNER_ENV, VENV

MASTER_PORT = 29555
RANK_PID = ".local/state/spark-sim/rank.pid"  # the sim's own path: its RANK_CHECK reads it
FAULT_FILE = "rank-fault"


def launcher_text(
    *, worker_ns: str, worker_home: Path, owner_pid: int, master_port: int = MASTER_PORT
) -> str:
    """The head's `vllm`: the ranks launcher described in the module docstring."""
    real = shlex.quote(str(VENV / "shim" / "vllm"))
    home = shlex.quote(str(worker_home))
    pidfile = shlex.quote(str(worker_home / RANK_PID))
    fault = shlex.quote(str(worker_home / FAULT_FILE))
    env = {
        "HOME": str(worker_home),
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "GLOO_SOCKET_IFNAME": IFNAME,
        "VLLM_HOST_IP": WORKER_IP,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        OWNER_ENV: str(owner_pid),
    }
    env_words = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
    multi = f"--nnodes 2 --master-addr {HEAD_IP} --master-port {master_port}"
    return f"""#!/bin/bash
# The ranks launcher of the test ground (tests/ground/ranks.py): rank 1 headless in the worker's
# network namespace, then rank 0 here. Any other vllm command line runs vLLM's CPU build as is.
# bash, not sh: dash's kill takes neither `--` nor a negative pid (a process group).
unset VLLM_CPU_KVCACHE_SPACE SPARK_SIM_CONFIG SPARK_SIM_RAY_WORKERS SPARK_SIM_RANKS
case " $* " in
  *" --node-rank "*|*" --headless "*) exec {real} "$@" ;;
  *" --distributed-executor-backend mp "*) ;;
  *) exec {real} "$@" ;;
esac
old=$(cat {pidfile} 2>/dev/null)
if [ -n "$old" ] && grep -q -- --headless "/proc/$old/cmdline" 2>/dev/null; then
  kill -TERM -- "-$old" 2>/dev/null
  i=0
  while kill -0 "$old" 2>/dev/null && [ "$i" -lt 150 ]; do sleep 0.2; i=$((i + 1)); done
  kill -KILL -- "-$old" 2>/dev/null
fi
extra=""
if [ -f {fault} ]; then extra=$(cat {fault}); rm -f {fault}; fi
mkdir -p "$(dirname {pidfile})"
# in a subshell that exits at once: rank 1 is no child of rank 0 (it runs on another node)
(
  # shellcheck disable=SC2086  # the fault's words are split on purpose
  setsid ip netns exec {shlex.quote(worker_ns)} env -i {env_words} $extra \\
    {real} "$@" {multi} --node-rank 1 --headless </dev/null >>{home}/engine.log 2>&1 &
  echo "$!" > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}
)
export VLLM_HOST_IP={HEAD_IP}
exec {real} "$@" {multi} --node-rank 0
"""


def rank_argv(pid: int) -> list[str]:
    """A process's command line (its words), [] when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [w.decode(errors="replace") for w in raw.split(b"\0") if w]


def flag_value(argv: list[str], name: str) -> str | None:
    """The value of `--name V` / `--name=V` on a command line (the last one), else None."""
    found = None
    for i, word in enumerate(argv):
        key, eq, val = word.partition("=")
        if key == name:
            found = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return found
