"""The embedded cluster: asyncssh nodes on loopback, the reference watchdog, a simulated vLLM."""

# A worker's "Ray worker" is a TCP listener whose port each command on the node finds in this
# variable; the inventory's engine.worker_check for the embedded cluster connects to it.
RAYLET_PORT_ENV = "SPARK_SIM_RAYLET_PORT"
RAYLET_CHECK = f'exec 3<>"/dev/tcp/127.0.0.1/${RAYLET_PORT_ENV}" 2>/dev/null'
# An engine run as ranks (sim/ranks.py): a worker's rank runs while the pid in its pid file is a
# live process; the inventory's engine.worker_check for that shape (exit 1: no rank runs).
# a zombie (a rank that died, not yet reaped by the launcher) does not count.
RANK_CHECK = (
    's=$(ps -o stat= -p "$(cat ~/.local/state/spark-sim/rank.pid 2>/dev/null)" 2>/dev/null) '
    '&& [ "${s#Z}" = "$s" ] || exit 1'
)
