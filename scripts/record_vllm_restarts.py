"""Record real vLLM (CPU build) output of an engine stopped during its boot, for readiness fixtures.

    python scripts/record_vllm_restarts.py OUTDIR [CASE ...]

Each case starts `vllm serve` (the ground's shim, tiny-llama) with its output to a log file, waits
for a marker line, then stops it the way a watchdog would (SIGTERM to its process group, or SIGKILL
of the API server alone), and records the output until every process of the group is gone (or a
limit), plus the processes still alive 3 s after the signal. Paths are replaced by VLAB / TMPDIR.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

VENV = Path(os.environ.get("SPARK_GROUND_VENV", "/opt/spark-ops-vllm"))

# case: (marker line to wait for, how to stop: "term-group" | "kill-api")
CASES = {
    "term-after-args": ("non-default args:", "term-group"),
    "term-loading": ("Starting to load model", "term-group"),
    "term-kv": ("KV cache size:", "term-group"),
    "kill-api-loading": ("Starting to load model", "kill-api"),
    "term-serving": ("Application startup complete.", "term-group"),
}


def _free_port() -> int:
    """A free loopback port."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _group(pgid: int) -> list[tuple[int, str]]:
    """Live processes of a process group: (pid, comm)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        comm = raw[raw.find("(") + 1 : raw.rfind(")")]
        fields = raw[raw.rfind(")") + 2 :].split()
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            out.append((int(entry.name), comm))
    return sorted(out)


def record(outdir: Path, case: str) -> dict[str, object]:
    """Run one case; write OUTDIR/real-<case>.log; return what happened."""
    marker, how = CASES[case]
    port = _free_port()
    log_path = outdir / f"real-{case}.log"
    work = outdir / "work"
    work.mkdir(parents=True, exist_ok=True)
    argv = [str(VENV / "shim" / "vllm"), "serve", str(VENV / "models" / "tiny-llama")]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny"]
    argv += ["--enforce-eager", "--kv-cache-memory-bytes", "256M", "--max-num-seqs", "6"]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", SPARK_RECORDER="1")
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=work, env=env, start_new_session=True,
        )  # fmt: skip
    started = time.monotonic()
    facts: dict[str, object] = {"case": case, "marker": marker, "how": how}
    try:
        while marker not in log_path.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() - started > 400:
                facts["error"] = f"marker never seen (exit {proc.poll()})"
                return facts
            time.sleep(0.05)
        facts["marker_after_s"] = round(time.monotonic() - started, 1)
        facts["group_before"] = _group(proc.pid)
        if how == "term-group":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            os.kill(proc.pid, signal.SIGKILL)
        signalled = time.monotonic()
        time.sleep(3)
        facts["alive_after_3s"] = _group(proc.pid)
        while _group(proc.pid) and time.monotonic() - signalled < 60:
            time.sleep(0.2)
        facts["group_gone_after_s"] = round(time.monotonic() - signalled, 1)
    finally:
        if _group(proc.pid):
            facts["killed_leftovers"] = _group(proc.pid)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        facts["exit"] = proc.returncode
    text = log_path.read_text(errors="replace")
    text = text.replace(str(VENV), "VLAB").replace(str(work), "TMPDIR")
    text = text.replace(os.environ.get("HOME", "/root"), "HOME")
    log_path.write_text(text)
    return facts


def main() -> int:
    """Record the cases named (all by default); print one JSON line each."""
    outdir = Path(sys.argv[1])
    outdir.mkdir(parents=True, exist_ok=True)
    for case in sys.argv[2:] or list(CASES):
        print(json.dumps(record(outdir, case)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
