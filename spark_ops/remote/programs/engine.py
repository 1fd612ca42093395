"""The programs that read the engine and the node it runs on: the engine's identity (pid file,
container, unit), engine-like processes, the kernel's Xid lines, the GPUs' compute apps."""

from __future__ import annotations

from spark_ops.remote.program import RemoteProgram, integer, path, result, stdout_if_ok, text

# Prints "T <now> <btime> <clk_tck>", "F <pid in the pid file>", "S <its /proc stat line>", then
# "P <pid> <ppid> <pgid> <state> <elapsed s> <name>" for the pid file's process, its descendants,
# the processes of its group when it leads one, and the pids / group given as $2 / $3 (what an
# instance seen earlier held: its leader may be gone, its children reparented).
PID_PROBE_SH = r"""
f=$1; keep=",${2:-},"; grp=${3:-}
echo "T $(date +%s.%N) $(awk '/^btime /{print $2}' /proc/stat) $(getconf CLK_TCK)"
pid=$(head -n 1 -- "$f" 2>/dev/null | tr -cd '0-9')
echo "F ${pid:-none}"
lead=
if [ -n "$pid" ] && read -r line < "/proc/$pid/stat" 2>/dev/null; then
  echo "S $line"
  set -- ${line##*) }
  [ "$3" = "$pid" ] && lead=$pid
elif [ -n "$pid" ]; then
  lead=$pid  # gone: a leader's group outlives it (started with setsid, as watchdogs do)
fi
ps -ww -e -o pid=,ppid=,pgid=,stat=,etimes=,comm=,args= | awk -v root="${pid:--1}" -v keep="$keep" \
  -v grp="$grp" -v lead="$lead" '
  { n++; id[n]=$1; pp[n]=$2; pg[n]=$3; line[n]=$0 }
  END {
    want[root]=1; more=1
    while (more) { more=0
      for (i=1; i<=n; i++) if (!(id[i] in want) && (pp[i] in want)) { want[id[i]]=1; more=1 } }
    for (i=1; i<=n; i++)
      if ((id[i] in want) || index(keep, "," id[i] ",") || (grp != "" && pg[i] == grp) \
          || (lead != "" && pg[i] == lead)) print "P " line[i]
  }'
"""


# Engine-like processes on the head: vLLM's titled processes and `vllm serve` command lines. A
# process whose environment is readable and names another HOME belongs to another account (or,
# on a test ground, another node sharing the kernel): it is not this cluster's; nor is one gone
# since ps listed it (its environment then unreadable for that reason alone). Before each "P"
# line, "K <pid> <start in clock ticks since boot>" from /proc/PID/stat (field 22): with the "T"
# line's btime and CLK_TCK the start on the node's clock, not moved by how late ps ran after
# `date` (etimes is counted at ps's own moment: under load seconds after the "T" line).
ENGINE_PROCS_SH = r"""
b=$(awk '/^btime /{print $2}' /proc/stat 2>/dev/null)
t=$(getconf CLK_TCK 2>/dev/null)
echo "T $(date +%s.%N) ${b:-0} ${t:-100}"
ps -ww -e -o pid=,ppid=,pgid=,stat=,etimes=,comm=,args= | awk -v me=$$ '
  $1 != me && $2 != me \
    && ($6 ~ /^VLLM::/ || $0 ~ /vllm serve|vllm\.entrypoints|sim\.engine serve/) {
    print "P " $0 }' \
| while read -r tag pid rest; do
  if [ -r "/proc/$pid/environ" ]; then
    tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qxF "HOME=$HOME" || continue
  elif [ ! -e "/proc/$pid" ]; then
    continue
  fi
  read -r st < "/proc/$pid/stat" 2>/dev/null && set -- ${st##*) } && echo "K $pid ${20:-}"
  echo "P $pid $rest"
done
"""


# The head's engine in one read (the engine reading of the plan, doctor, verify and status):
# PID_PROBE's lines for the pid file $1, a line HEAD_ENGINE_MARK, then ENGINE_PROCS's lines.
HEAD_ENGINE_MARK = "--- engine processes"
HEAD_ENGINE_SH = PID_PROBE_SH + f'echo "{HEAD_ENGINE_MARK}"\n' + ENGINE_PROCS_SH


DOCKER_FMT = (
    "{{json .Id}} {{json .State.StartedAt}} {{json .State.Running}} {{json .State.Pid}} "
    "{{json .State.Status}} {{json .State.Error}}"
)


# $1 the restart time (epoch s): "SOURCE=…" then the kernel's Xid lines since then
KERNEL_LOG_SH = """
if command -v journalctl >/dev/null 2>&1 && journalctl -k -n 0 >/dev/null 2>&1; then
  echo SOURCE=journalctl
  journalctl -k -o short-iso --no-pager --since "@$1" | grep -i 'NVRM: Xid' || true
elif dmesg >/dev/null 2>&1; then
  echo "SOURCE=dmesg BOOT=$(date -d "$(uptime -s)" +%s)"
  dmesg | grep -i 'NVRM: Xid' || true
else
  echo SOURCE=none
fi
"""


# the compute apps (CSV), "---", then "PID START" per app: or NO_NVIDIA_SMI
GPU_APPS_SH = """
command -v nvidia-smi >/dev/null 2>&1 || { echo NO_NVIDIA_SMI; exit 0; }
now=$(date +%s)
apps=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader) || exit 3
printf '%s\n' "$apps"
echo ---
printf '%s\n' "$apps" | while IFS=, read -r pid rest; do
  age=$(ps -o etimes= -p "$pid" 2>/dev/null | tr -d ' ')
  if [ -n "$age" ]; then echo "$pid $((now - age))"; fi
done
"""


PID_PROBE = RemoteProgram(
    "engine pid probe",
    PID_PROBE_SH,
    (path("pid file"), text("pids kept", optional=True), text("group", optional=True)),
    result,
    deadline=10,
)
ENGINE_PROCS = RemoteProgram("engine processes", ENGINE_PROCS_SH, (), result, deadline=15)
HEAD_ENGINE = RemoteProgram(
    "engine reading", HEAD_ENGINE_SH, (path("pid file"),), result, deadline=25
)
# the container's identity: DOCKER_FMT's six JSON values, or None when docker does not answer
DOCKER_IDENTITY = RemoteProgram(
    "container identity",
    'docker inspect -f "$1" "$2" 2>/dev/null',
    (text("format"), path("container")),
    stdout_if_ok,
    deadline=10,
)
UNIT_IDENTITY = RemoteProgram(
    "unit identity",
    'systemctl show -p MainPID -p InvocationID -p ActiveState -- "$1" 2>/dev/null',
    (path("unit"),),
    result,
    deadline=10,
)
KERNEL_LOG = RemoteProgram("kernel Xid lines", KERNEL_LOG_SH, (integer("since"),), result)
GPU_APPS = RemoteProgram("GPU compute apps", GPU_APPS_SH, (), result)
# the engine log's size in bytes (0 when it cannot be read)
LOG_SIZE = RemoteProgram(
    "log size", 'stat -c %s -- "$1" 2>/dev/null || echo 0', (path("file"),), result
)
