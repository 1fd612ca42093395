#!/usr/bin/env bash
# The Docker ground: Debian's docker.io, and a dockerd that makes no bridge and touches no iptables
# (containers run on --network host only; the default bridge's 172.17.0.0/16 is never created).
# Idempotent; run as root. The image is made by the tests (tests/ground/docker.py: docker import).
set -euo pipefail
log() { printf '[install-docker %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

if ! command -v dockerd >/dev/null 2>&1; then
  log "installing docker.io"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/dev/null
fi
if docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; then
  log "dockerd answers: $(docker info --format '{{.ServerVersion}}' 2>/dev/null)"
  exit 0
fi
log "starting dockerd (--bridge=none --iptables=false)"
mkdir -p /var/log
setsid dockerd --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
  --host unix:///var/run/docker.sock >>/var/log/spark-ops-dockerd.log 2>&1 </dev/null &
for _ in $(seq 1 60); do
  if docker info --format '{{.ServerVersion}}' >/dev/null 2>&1; then
    log "dockerd up: $(docker info --format '{{.ServerVersion}}')"
    exit 0
  fi
  sleep 1
done
log "dockerd did not answer within 60 s; its log:"
tail -20 /var/log/spark-ops-dockerd.log >&2
exit 1
