"""Programs that read the node itself: the account's home, its memory, whether sudo asks nothing,
and the facts of serve's node panel."""

from __future__ import annotations

from spark_ops.remote.program import RemoteProgram, result, stdout_if_ok

# The account's home on the node, as its shell expands $HOME (None when the shell fails)
HOME = RemoteProgram("home", 'printf "%s" "$HOME"', (), stdout_if_ok)

# /proc/meminfo as the kernel shows it
MEMINFO = RemoteProgram("meminfo", "cat /proc/meminfo", (), result)

# exit 0 when sudo runs without asking for a password
SUDO_OK = RemoteProgram("sudo without password", "sudo -n true", (), result)

# One node's facts for serve's panel (serve.nodes parses them): MEM total available (kB); GPU csv |
# NO_GPU_TOOL | GPU_ERROR (nothing within 3 s where `timeout` exists: a hung nvidia-smi never holds
# the MEM and ENGINE lines); ENGINE pid args (this account's engine processes only: owned by its
# uid, and an environ it can read whose HOME is the account's; the others are left out before the
# 20-line limit, so none of them can push ours off)
FACTS_SH = r"""
awk '/^MemTotal:/{t=$2} /^MemAvailable:/{a=$2} END{print "MEM", t+0, a+0}' /proc/meminfo
if command -v nvidia-smi >/dev/null 2>&1; then
  q=name,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu
  t=
  if command -v timeout >/dev/null 2>&1; then t="timeout 3"; fi
  $t nvidia-smi --query-gpu="$q" --format=csv,noheader,nounits 2>/dev/null | head -n 4 \
    | sed 's/^/GPU /' | grep . || echo GPU_ERROR
else
  echo NO_GPU_TOOL
fi
ps -ww -u "$(id -u)" -o pid=,args= \
| awk -v me=$$ '$1 != me && $0 ~ /vllm serve|vllm\.entrypoints|sim\.(engine|ranks) serve/' \
| while read -r pid args; do
  tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qxF "HOME=$HOME" || continue
  echo "ENGINE $pid $args"
done | head -n 20
"""
FACTS = RemoteProgram("node facts", FACTS_SH, (), result, deadline=10)
