"""The streaming parser, the workload file and the /metrics parser of spark_ops.bench."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_ops.bench.client import RequestRecord, SSEParser
from spark_ops.bench.metrics import WANTED
from spark_ops.bench.workload import build_payload, load_prompts
from spark_ops.engine.metrics import kv_pool_tokens, metric_sums
from spark_ops.errors import BenchError

FIXTURES = Path(__file__).parent / "fixtures" / "bench"


def chat_chunk(content: str | None, *, role: bool = False, finish: str | None = None) -> bytes:
    """One vLLM-shaped chat chunk as an SSE event."""
    delta: dict[str, object] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def usage_chunk(completion: int, prompt: int = 7) -> bytes:
    """The final usage chunk (empty choices)."""
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


TRICKY = ['"usage":{"x":1}', "error", 'say "content":"x"', "\\n", "ü€", " ", '"', "data: [DONE]"]


def stream_body(contents: list[str], *, usage: int | None) -> bytes:
    """A whole SSE body: role chunk, contents, finish chunk, optional usage, [DONE]."""
    out = chat_chunk("", role=True)
    out += b"".join(chat_chunk(c) for c in contents)
    out += chat_chunk(None, finish="length")
    if usage is not None:
        out += usage_chunk(usage)
    return out + b"data: [DONE]\n\n"


def parse(data: bytes, cuts: list[int]) -> RequestRecord:
    """Feed data split at the given cut points, each piece at a later time."""
    rec = RequestRecord(index=0)
    parser = SSEParser(rec)
    points = sorted({c % (len(data) + 1) for c in cuts})
    prev = 0
    for t, cut in enumerate([*points, len(data)]):
        parser.feed(data[prev:cut], float(t))
        prev = cut
    parser.finish()
    return rec


def test_counts_content_chunks_and_reads_usage() -> None:
    """Role-only and finish chunks are not tokens; usage gives the count."""
    rec = parse(stream_body(["a", "b", "c"], usage=3), [])
    assert len(rec.chunk_times) == 3
    assert rec.usage_tokens == 3 and rec.prompt_tokens == 7
    assert rec.usage_reported and rec.done and rec.error is None


def test_falls_back_to_counting_chunks_without_usage() -> None:
    """No usage chunk: the count is the number of content chunks, flagged as such."""
    rec = parse(stream_body(["a", "b"], usage=None), [])
    assert rec.output_tokens == 2
    assert not rec.usage_reported


def test_tricky_contents_are_tokens_not_usage_or_errors() -> None:
    """Content that looks like keys, errors or [DONE] is still one token each."""
    rec = parse(stream_body(TRICKY, usage=len(TRICKY)), [])
    assert len(rec.chunk_times) == len(TRICKY)
    assert rec.error is None and rec.usage_tokens == len(TRICKY)


def test_completions_text_chunks_and_spaces_after_colon() -> None:
    """/v1/completions chunks carry "text"; servers that put spaces after ':' are handled."""
    data = (
        b'data: {"choices": [{"index": 0, "text": "hi", "finish_reason": null}]}\n\n'
        b'data: {"choices": [{"index": 0, "text": "", "finish_reason": "length"}]}\n\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}\n\n'
        b"data: [DONE]\n\n"
    )
    rec = parse(data, [])
    assert len(rec.chunk_times) == 1 and rec.usage_tokens == 1


def test_error_chunk_is_recorded() -> None:
    """vLLM's mid-stream error event ends up in record.error."""
    data = chat_chunk("a") + b'data: {"error": {"message": "engine dead", "code": 500}}\n\n'
    rec = parse(data, [])
    assert rec.error == "stream error: engine dead"


@settings(max_examples=60, deadline=None)
@given(
    contents=st.lists(st.sampled_from([*TRICKY, "tok", " x"]), min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=20),
)
def test_any_split_gives_the_same_record(contents: list[str], cuts: list[int]) -> None:
    """However the bytes are split across reads, the counts are the same."""
    data = stream_body(contents, usage=len(contents))
    rec = parse(data, cuts)
    assert len(rec.chunk_times) == len(contents)
    assert rec.usage_tokens == len(contents) and rec.done and rec.error is None
    assert rec.chunk_times == sorted(rec.chunk_times)


def test_workload_has_120_unique_prompts() -> None:
    """20 tasks x 6 languages, all different."""
    prompts = load_prompts()
    assert len(prompts) == 120
    assert len({p.text for p in prompts}) == 120
    assert len({p.task for p in prompts}) == 20
    assert len({p.language for p in prompts}) == 6
    assert all(p.language in p.text for p in prompts)


def test_payload_defaults() -> None:
    """Streaming, usage requested, ignore_eos, temperature 0, max_tokens."""
    prompt = load_prompts()[0]
    body = build_payload(prompt, model="m", output_tokens=300)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["temperature"] == 0 and body["max_tokens"] == 300
    assert body["messages"] == [{"role": "user", "content": prompt.text}]
    body = build_payload(prompt, model="m", api="completions")
    assert body["prompt"] == prompt.text and "messages" not in body
    with pytest.raises(BenchError, match="allowed: chat, completions"):
        build_payload(prompt, model="m", api="responses")


def test_bad_prompt_file_names_the_file_and_key(tmp_path: Path) -> None:
    """Errors name the file and the key."""
    bad = tmp_path / "p.yaml"
    bad.write_text("template: 'Do {title}'\nlanguages: [Go]\ntasks: [{id: a}]\n")
    with pytest.raises(BenchError, match=r"p\.yaml: tasks\[0\] needs string keys"):
        load_prompts(bad)
    bad.write_text(
        "template: 'Do {title} {nope}'\nlanguages: [Go]\ntasks: [{id: a, title: t, detail: d}]\n"
    )
    with pytest.raises(BenchError, match="cannot be filled \\(KeyError: 'nope'\\)"):
        load_prompts(bad)
    for template in (
        "{title} {detail",
        "{title} } it",
        "{title}{title.nope}",
        "{title}{0}",
        "{title}{title:zz}",
    ):
        bad.write_text(
            f"template: '{template}'\nlanguages: [Go]\ntasks: [{{id: a, title: t, detail: d}}]\n"
        )
        with pytest.raises(BenchError, match=r"p\.yaml: key 'template' cannot be filled"):
            load_prompts(bad)
    with pytest.raises(BenchError, match="cannot read the prompt file"):
        load_prompts(tmp_path / "missing.yaml")


def test_parse_prometheus_real_vllm_metrics() -> None:
    """The real idle /metrics of vLLM's CPU build: counters and gauges at 0, the KV pool."""
    text = (FIXTURES / "metrics-idle.txt").read_text()
    values = metric_sums(text, WANTED)
    assert values == {
        "vllm:generation_tokens_total": 0.0,
        "vllm:num_requests_running": 0.0,
        "vllm:num_requests_waiting": 0.0,
        "vllm:num_preemptions_total": 0.0,
    }
    labels = [ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{")]
    blocks = int(labels[0].split('num_gpu_blocks="')[1].split('"')[0])
    size = int(labels[0].split(',block_size="')[1].split('"')[0])
    assert kv_pool_tokens(text) == blocks * size  # num_gpu_blocks x block_size


def test_parse_prometheus_sums_engines() -> None:
    """Several engines' label sets add up; similarly named metrics are not mixed in."""
    text = (
        'vllm:generation_tokens_total{engine="0"} 10.0\n'
        'vllm:generation_tokens_total{engine="1"} 5.5\n'
        'vllm:generation_tokens_created{engine="0"} 1.7e9\n'
        "vllm:num_requests_running 3\n"
    )
    assert metric_sums(text, WANTED) == {
        "vllm:generation_tokens_total": 15.5,
        "vllm:num_requests_running": 3.0,
    }


def test_fd_limit_is_raised_or_refused() -> None:
    """The open-files limit grows to fit the connections; past the hard limit, a clear error."""
    import resource

    from spark_ops.bench.client import ensure_fd_limit

    assert ensure_fd_limit(10) >= 266
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft >= 266 or soft == resource.RLIM_INFINITY
    if hard != resource.RLIM_INFINITY:
        with pytest.raises(BenchError, match=r"ulimit -Hn"):
            ensure_fd_limit(hard + 1)
