"""The sh programs preflight runs on the head, bare or inside the engine's container: finding the
`vllm` the engine runs, and the interpreter that imports a module. Their exit status 47 means
"nothing to ask on this node". Both are run as an argument list (`argv`), wrapped in `env K=V …`
or `docker exec … CONTAINER`."""

from __future__ import annotations

from spark_ops.remote.program import RemoteProgram, result, text

# Finds the `vllm` the engine is started with; prints its path, resolved path and first 4 KiB.
PROBE_SH = r"""
v=$(command -v "$1" 2>/dev/null) || { echo "no $1 on PATH ($PATH)" >&2; exit 47; }
r=$(readlink -f "$v" 2>/dev/null) || r=$v
printf '%s\n%s\n' "$v" "$r"
head -c 4096 "$r" 2>/dev/null | LC_ALL=C tr -d '\000'
"""

# Runs the program on stdin with the first candidate interpreter that can import the module (not
# from the working directory, the SSH user's home: the probe and the program both take it off the
# import path first, so a stray ~/vllm/ or ~/json.py is neither found nor run; an empty or relative
# entry of the recipe's PYTHONPATH, which Python reads as the working directory, is dropped too).
PICK_SH = r"""
m=$1; shift
if [ -n "${PYTHONPATH+x}" ]; then  # the recipe's env: keep its absolute entries only
  set -f; old_ifs=$IFS; IFS=:; kept=
  for d in $PYTHONPATH; do case $d in /*) kept=${kept:+$kept:}$d ;; esac; done
  IFS=$old_ifs; set +f
  if [ -n "$kept" ]; then PYTHONPATH=$kept; export PYTHONPATH; else unset PYTHONPATH; fi
fi
for py in "$@"; do
  case $py in
    */*) [ -x "$py" ] || continue ;;
    *) command -v "$py" >/dev/null 2>&1 || continue ;;
  esac
  if "$py" -c 'import sys; sys.path[:] = [p for p in sys.path if p not in ("", ".")]
import importlib.util as u; sys.exit(0 if u.find_spec(sys.argv[1]) else 1)' \
      "$m" </dev/null >/dev/null 2>&1; then
    exec "$py" -
  fi
done
echo "no Python here imports $m (tried: $*)" >&2
exit 47
"""

PROBE = RemoteProgram("find vllm", PROBE_SH, (text("vllm"),), result)
PICK = RemoteProgram(
    "pick interpreter",
    PICK_SH,
    (text("module"), text("interpreters", many=True)),
    result,
)
