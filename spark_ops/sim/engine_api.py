"""OpenAI-compatible HTTP API of the simulated engine (aiohttp), with vLLM's /metrics."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_ops.sim.engine_config import cfg_float, cfg_get
from spark_ops.sim.engine_model import EngineCore, Request, prompt_seed

if TYPE_CHECKING:
    from aiohttp import web

    from spark_ops.sim.engine_args import ServeArgs
    from spark_ops.sim.engine_log import VllmLog


@dataclass
class ServerState:
    """What the API needs to know about the engine: limits, names, liveness."""

    args: ServeArgs
    cfg: dict[str, Any]
    core: EngineCore
    log: VllmLog
    max_model_len: int
    kv_cache_memory_bytes: int
    kv_tokens: int
    dead: bool = False
    draining: bool = False
    paused: bool = False
    resumed: asyncio.Event = field(default_factory=asyncio.Event)


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    """Return vLLM's JSON error body."""
    from aiohttp import web

    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status, dumps=_compact)


def _compact(obj: Any) -> str:
    """Encode JSON without spaces, as vLLM's FastAPI responses are."""
    return json.dumps(obj, separators=(",", ":"))


class Api:
    """Request handlers bound to one ServerState."""

    def __init__(self, state: ServerState) -> None:
        """Pre-encode the filler words once (JSON-escaped, with a leading space)."""
        self.st = state
        words = [str(w) for w in cfg_get(state.cfg, "generation.words")]
        self.words = [json.dumps(" " + w)[1:-1].encode() for w in words]
        self.words_text = [" " + w for w in words]
        gen = cfg_get(state.cfg, "generation")
        self.default_completion_max = int(gen["default_completion_max_tokens"])
        self.eos_after = gen.get("eos_after_tokens")
        self.unbounded_stop = int(gen["unbounded_stop_tokens"])
        self.chars_per_token = cfg_float(state.cfg, "scheduler.chars_per_token")
        self.chat_overhead = int(cfg_get(state.cfg, "scheduler.chat_template_tokens"))
        self.name = state.args.served_name

    def build(self) -> web.Application:
        """Create the aiohttp application with vLLM's routes."""
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/load", self.load)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        if os.environ.get("VLLM_SERVER_DEV_MODE") == "1":  # as vLLM: pause/resume in dev mode only
            app.router.add_post("/pause", self.pause)
            app.router.add_post("/resume", self.resume)
            app.router.add_get("/is_paused", self.is_paused)
        return app

    async def pause(self, request: web.Request) -> web.Response:
        """Hold new requests; with mode=wait, return once in-flight requests have finished."""
        from aiohttp import web

        self.st.paused = True
        self.st.resumed.clear()
        if request.query.get("mode") == "wait" or request.query.get("wait_for_inflight_requests"):
            while self.st.core.in_flight > 0:
                await asyncio.sleep(0.05)
        return web.json_response({"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        """Let held and new requests run again."""
        from aiohttp import web

        self.st.paused = False
        self.st.resumed.set()
        return web.json_response({"status": "resumed"})

    async def is_paused(self, request: web.Request) -> web.Response:
        """Whether the engine is paused."""
        from aiohttp import web

        return web.json_response({"is_paused": self.st.paused})

    async def health(self, request: web.Request) -> web.Response:
        """200 with an empty body while the engine lives (even wedged); 503 once dead."""
        from aiohttp import web

        return web.Response(status=503 if self.st.dead else 200)

    async def version(self, request: web.Request) -> web.Response:
        """Return the emulated vLLM version."""
        from aiohttp import web

        return web.json_response(
            {"version": str(cfg_get(self.st.cfg, "vllm_version"))}, dumps=_compact
        )

    async def models(self, request: web.Request) -> web.Response:
        """List the served model."""
        from aiohttp import web

        card = {
            "id": self.name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
            "root": self.st.args.model, "parent": None, "max_model_len": self.st.max_model_len,
        }  # fmt: skip
        return web.json_response({"object": "list", "data": [card]}, dumps=_compact)

    async def load(self, request: web.Request) -> web.Response:
        """Return the number of requests in flight."""
        from aiohttp import web

        return web.json_response({"server_load": self.st.core.in_flight}, dumps=_compact)

    async def metrics(self, request: web.Request) -> web.Response:
        """Render Prometheus text with vLLM's metric names."""
        from aiohttp import web

        return web.Response(text=render_metrics(self.st), content_type="text/plain")

    # -- completions -------------------------------------------------------------------------
    def _tokens(self, text: str) -> int:
        """Estimate a prompt's token count from its length."""
        return max(1, round(len(text) / self.chars_per_token))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """Serve /v1/completions (streaming or not)."""
        return await self._serve(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """Serve /v1/chat/completions (streaming or not)."""
        return await self._serve(request, chat=True)

    def _parse(self, body: Any, chat: bool) -> tuple[Request, str] | web.Response:
        """Validate a request body into a Request, or return the error response."""
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object", "BadRequestError")
        model = body.get("model", self.name)
        if model != self.name:
            msg = f"The model `{model}` does not exist."
            return _error(404, msg, "NotFoundError", "model")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return _error(400, "messages must be a non-empty list", "BadRequestError")
            parts = []
            for m in messages:
                content = m.get("content", "") if isinstance(m, dict) else ""
                if isinstance(content, list):
                    content = " ".join(
                        str(c.get("text", "")) for c in content if isinstance(c, dict)
                    )
                parts.append(str(content))
            text = "\n".join(parts)
            prompt = self._tokens(text) + self.chat_overhead * len(messages)
        else:
            raw = body.get("prompt")
            if isinstance(raw, list):
                raw = " ".join(str(p) for p in raw)
            if not isinstance(raw, str):
                return _error(
                    400, "prompt must be a string or a list of strings", "BadRequestError"
                )
            text = raw
            prompt = self._tokens(text)
        limit = self.st.max_model_len
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        ignore_eos = bool(body.get("ignore_eos", False))
        stop_at = None
        if max_tokens is None:
            max_tokens = limit - prompt if chat else self.default_completion_max
            if chat and not ignore_eos:
                stop_at = self.unbounded_stop
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(
                400, f"max_tokens must be at least 1, got {max_tokens!r}", "BadRequestError"
            )
        if prompt + max_tokens > limit:
            msg = (
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the "
                "completion). Please reduce the length of the messages or completion."
            )
            return _error(400, msg, "BadRequestError", "max_tokens")
        if self.eos_after is not None and not ignore_eos:
            stop_at = int(self.eos_after)
        return Request(prompt, max_tokens, stop_at=stop_at, seed=prompt_seed(text)), text

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        """Common path: validate, submit to the engine core, stream or collect the tokens."""
        if self.st.dead:
            return _error(
                500,
                "EngineCore encountered an issue. See stack trace for the root cause.",
                "EngineDeadError",
            )
        if self.st.draining:
            return _error(503, "The server is shutting down.", "ServiceUnavailableError")
        if self.st.paused:
            await self.st.resumed.wait()
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "request body is not valid JSON", "BadRequestError")
        parsed = self._parse(body, chat)
        if not isinstance(parsed, tuple):
            return parsed
        req, _text = parsed
        self.st.core.submit(req)
        try:
            if body.get("stream"):
                opts = body.get("stream_options") or {}
                usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
                return await self._stream(request, req, chat=chat, usage=usage)
            return await self._collect(req, chat=chat)
        finally:
            if not req.done:
                self.st.core.abort(req)

    def _text(self, req: Request, start: int, end: int) -> str:
        """Return the filler text of tokens [start, end)."""
        words, n = self.words_text, len(self.words_text)
        return "".join(words[(req.seed + i) % n] for i in range(start, end))

    def _usage(self, req: Request) -> dict[str, int]:
        """Return the usage block of a request."""
        return {
            "prompt_tokens": req.prompt_tokens,
            "total_tokens": req.prompt_tokens + req.generated,
            "completion_tokens": req.generated,
        }

    async def _collect(self, req: Request, *, chat: bool) -> web.Response:
        """Wait for the whole generation and return one JSON body."""
        from aiohttp import web

        while not req.done:
            await req.wake.wait()
            req.wake.clear()
        if req.finish_reason == "abort" and self.st.dead:
            return _error(500, "EngineCore encountered an issue.", "EngineDeadError")
        text = self._text(req, 0, req.generated)
        created = int(time.time())
        if chat:
            choice: dict[str, Any] = {
                "index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None, "finish_reason": req.finish_reason, "stop_reason": None,
            }  # fmt: skip
            kind, prefix = "chat.completion", "chatcmpl"
        else:
            choice = {
                "index": 0, "text": text, "logprobs": None,
                "finish_reason": req.finish_reason, "stop_reason": None,
            }  # fmt: skip
            kind, prefix = "text_completion", "cmpl"
        return web.json_response({
            "id": f"{prefix}-{req.rid}", "object": kind, "created": created, "model": self.name,
            "choices": [choice], "usage": self._usage(req),
        }, dumps=_compact)  # fmt: skip

    async def _stream(
        self, request: web.Request, req: Request, *, chat: bool, usage: bool
    ) -> web.StreamResponse:
        """Stream server-sent events: one chunk per token, batched into one write per wake-up."""
        from aiohttp import web

        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)
        created = int(time.time())
        name = json.dumps(self.name)
        if chat:
            head = (
                f'data: {{"id":"chatcmpl-{req.rid}","object":"chat.completion.chunk",'
                f'"created":{created},"model":{name},"choices":['
            )
            pre = (head + '{"index":0,"delta":{"content":"').encode()
            post, fin = b'"},"logprobs":null,"finish_reason":', b"}]}\n\n"
            await resp.write(
                (
                    head
                    + '{"index":0,"delta":{"role":"assistant","content":""},'
                    + '"logprobs":null,"finish_reason":null}]}\n\n'
                ).encode()
            )
        else:
            head = (
                f'data: {{"id":"cmpl-{req.rid}","object":"text_completion",'
                f'"created":{created},"model":{name},"choices":['
            )
            pre = (head + '{"index":0,"text":"').encode()
            post, fin = b'","logprobs":null,"finish_reason":', b',"stop_reason":null}]}\n\n'
        words, n = self.words, len(self.words)
        sent = 0
        while True:
            await req.wake.wait()
            req.wake.clear()
            upto = req.generated
            if upto > sent or req.done:
                chunks: list[bytes] = []
                for i in range(sent, upto):
                    last = req.done and i == upto - 1
                    reason = json.dumps(req.finish_reason).encode() if last else b"null"
                    chunks += (pre, words[(req.seed + i) % n], post, reason, fin)
                if req.done and upto == sent:
                    chunks += (pre, b"", post, json.dumps(req.finish_reason).encode(), fin)
                sent = upto
                await resp.write(b"".join(chunks))
            if req.done:
                break
        if usage:
            body: dict[str, Any] = {
                "id": f"{'chatcmpl' if chat else 'cmpl'}-{req.rid}",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created,
                "model": self.name,
                "choices": [],
                "usage": self._usage(req),
            }
            await resp.write(b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _labels(**labels: str) -> str:
    """Render Prometheus labels sorted by name, as prometheus_client does."""
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def process_start_time() -> float:
    """This process's start time in Unix seconds, as prometheus_client computes it (whole-second
    boot time from /proc/stat plus the start ticks of /proc/self/stat)."""
    try:
        stat = open("/proc/self/stat").read()  # noqa: SIM115
        ticks = int(stat[stat.rfind(")") + 2 :].split()[19])
        btime = next(
            float(line.split()[1])
            for line in open("/proc/stat")  # noqa: SIM115
            if line.startswith("btime ")
        )
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


_START_TIME = process_start_time()


def render_metrics(st: ServerState) -> str:
    """Return /metrics text: vLLM's names, `engine` and `model_name` labels."""
    core, name = st.core, st.args.served_name
    base = _labels(engine="0", model_name=name)
    out: list[str] = [
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {_START_TIME!r}",
    ]

    def metric(
        metric_name: str, kind: str, help_text: str, samples: list[tuple[str, float]]
    ) -> None:
        """Append one metric family."""
        out.append(f"# HELP {metric_name} {help_text}")
        out.append(f"# TYPE {metric_name} {kind}")
        out.extend(f"{metric_name}{{{lab}}} {float(val)!r}" for lab, val in samples)

    for metric_name, kind, help_text, value in (
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
         len(core.running)),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
         len(core.waiting)),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
         core.kv_usage()),
        ("vllm:num_preemptions_total", "counter",
         "Cumulative number of preemption from the engine.", core.stats.preemptions),
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
         core.stats.prompt_tokens),
        ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
         core.stats.generation_tokens),
    ):  # fmt: skip
        metric(metric_name, kind, help_text, [(base, value)])
    metric(
        "vllm:request_success_total", "counter", "Count of successfully processed requests.",
        [
            (_labels(engine="0", finished_reason=r, model_name=name), c)
            for r, c in core.stats.success.items()
        ],
    )  # fmt: skip
    for hname, hist, help_text in (
        (
            "vllm:time_to_first_token_seconds",
            core.ttft,
            "Histogram of time to first token in seconds.",
        ),
        (
            "vllm:inter_token_latency_seconds",
            core.itl,
            "Histogram of inter-token latency in seconds.",
        ),
    ):
        out.append(f"# HELP {hname} {help_text}")
        out.append(f"# TYPE {hname} histogram")
        for le, count in hist.cumulative():
            out.append(
                f"{hname}_bucket{{{_labels(engine='0', le=le, model_name=name)}}} {float(count)!r}"
            )
        out.append(f"{hname}_count{{{base}}} {float(hist.n)!r}")
        out.append(f"{hname}_sum{{{base}}} {hist.total!r}")
    block = core.block_size
    info = _labels(
        block_size=str(block), cache_dtype=str(st.args.kv_cache_dtype), engine="0",
        gpu_memory_utilization=str(st.args.gpu_memory_utilization),
        kv_cache_memory_bytes=str(st.kv_cache_memory_bytes), kv_cache_size_tokens=str(st.kv_tokens),
        num_gpu_blocks=str(st.kv_tokens // block), enable_prefix_caching="True",
    )  # fmt: skip
    metric(
        "vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig", [(info, 1.0)]
    )
    return "\n".join(out) + "\n"


def stats_line(st: ServerState, prompt_rate: float, gen_rate: float) -> str:
    """Return the periodic `Engine 000: ...` line."""
    core = st.core
    return (
        f"Engine 000: Avg prompt throughput: {prompt_rate:.1f} tokens/s, "
        f"Avg generation throughput: {gen_rate:.1f} tokens/s, Running: {len(core.running)} reqs, "
        f"Waiting: {len(core.waiting)} reqs, "
        f"GPU KV cache usage: {core.kv_usage() * 100:.1f}%, Prefix cache hit rate: 0.0%"
    )


async def stats_logger(st: ServerState, interval: float) -> None:
    """Log the stats line every interval while there is (or just was) activity."""
    core = st.core
    last_p, last_g, last_t = (
        core.stats.prompt_tokens,
        core.stats.generation_tokens,
        time.monotonic(),
    )
    was_busy = False
    while True:
        await asyncio.sleep(interval)
        now = time.monotonic()
        dt = max(now - last_t, 1e-9)
        p, g = core.stats.prompt_tokens, core.stats.generation_tokens
        busy = bool(p - last_p or g - last_g or core.in_flight)
        if busy or was_busy:
            st.log.info(
                "APIServer", "loggers.py:335", stats_line(st, (p - last_p) / dt, (g - last_g) / dt)
            )
        was_busy = busy
        last_p, last_g, last_t = p, g, now
