#!/usr/bin/env bash
# The real sparkrun (PyPI sparkrun, Python >= 3.12) in its own venv: the recipe oracle and the sparkrun CLI
# of the sparkrun-shaped embedded cluster. Idempotent; run as root (CI does).
#   SPARK_SPARKRUN_VENV  venv location (default /opt/spark-ops-sparkrun)
#   SPARK_SPARKRUN_PYTHON  a Python >= 3.12 (default: pyenv's 3.12, else python3.12 on PATH)
set -euo pipefail

VENV="${SPARK_SPARKRUN_VENV:-/opt/spark-ops-sparkrun}"
SPARKRUN_VERSION="0.4.2"
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf '[install-sparkrun %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

if [[ -x "$VENV/bin/sparkrun" ]] \
  && [[ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("sparkrun"))' 2>/dev/null)" == "$SPARKRUN_VERSION" ]]; then
  log "sparkrun $SPARKRUN_VERSION present in $VENV"
  exit 0
fi

PY="${SPARK_SPARKRUN_PYTHON:-}"
if [[ -z "$PY" ]]; then
  for cand in /root/.pyenv/versions/3.12.*/bin/python "$(command -v python3.12 || true)"; do
    [[ -n "$cand" && -x "$cand" ]] && { PY="$cand"; break; }
  done
fi
[[ -n "$PY" ]] || { log "no Python 3.12 found (set SPARK_SPARKRUN_PYTHON)"; exit 1; }
"$PY" -c 'import sys; assert sys.version_info >= (3, 12), sys.version' \
  || { log "$PY is older than 3.12"; exit 1; }

t0=$SECONDS
log "creating $VENV with sparkrun==$SPARKRUN_VERSION on $("$PY" --version)"
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q "sparkrun==$SPARKRUN_VERSION"
"$VENV/bin/sparkrun" --version >/dev/null
log "sparkrun $SPARKRUN_VERSION installed in $((SECONDS - t0)) s"
