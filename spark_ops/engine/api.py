"""The engine's HTTP API as spark-ops uses it: health, version, models, metrics, a tiny real
completion.

Reached directly or through an SSH tunnel to the head (the caller passes the base URL it resolved).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from spark_ops.engine.metrics import CACHE_CONFIG_INFO, parse_metrics, pool_tokens

_SNAPSHOT_NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:generation_tokens_total",
    CACHE_CONFIG_INFO,
)


@dataclass
class EngineSnapshot:
    """What /metrics says about load and the KV cache right now."""

    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    generation_tokens: float | None = None
    kv_tokens: int | None = None
    cache_config: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_metrics(cls, text: str) -> EngineSnapshot:
        """Sum the vLLM gauges/counters over engines and models."""
        snap = cls()
        for s in parse_metrics(text, _SNAPSHOT_NAMES):
            if s.name == "vllm:num_requests_running":
                snap.running = (snap.running or 0) + s.value
            elif s.name == "vllm:num_requests_waiting":
                snap.waiting = (snap.waiting or 0) + s.value
            elif s.name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
                snap.kv_usage = max(snap.kv_usage or 0.0, s.value)
            elif s.name == "vllm:generation_tokens_total":
                snap.generation_tokens = (snap.generation_tokens or 0) + s.value
            elif s.name == CACHE_CONFIG_INFO and not snap.cache_config:
                snap.cache_config = s.labels
                snap.kv_tokens = pool_tokens(s.labels)
        return snap

    @property
    def kv_memory_bytes(self) -> int | None:
        """The engine's --kv-cache-memory-bytes as its CacheConfig reports it (None: unset)."""
        value = self.cache_config.get("kv_cache_memory_bytes", "")
        return int(value) if value.isdigit() else None

    def to_dict(self) -> dict[str, Any]:
        """Serialize for reports."""
        return {
            "running": self.running,
            "waiting": self.waiting,
            "kv_cache_usage": self.kv_usage,
            "generation_tokens_total": self.generation_tokens,
            "kv_cache_tokens": self.kv_tokens,
        }


PROBE_TOKENS = 1  # doctor's and status's completion probe: the smallest real piece of work


@dataclass
class CompletionProbe:
    """One tiny real completion: whether text came back, how long it took, else what happened."""

    ok: bool
    seconds: float
    timeout_s: float
    max_tokens: int = PROBE_TOKENS
    error: str = ""  # empty when ok; "timeout" when no answer came within timeout_s
    progressing: bool | None = None  # timed out: did the token counters move meanwhile?
    work: int | None = None  # timed out: requests running + waiting after it (from /metrics)

    @property
    def wedged(self) -> bool:
        """Wedged (issue 30 #7): /health answers, the completion did not finish, and the token
        counters stayed frozen with requests in the engine (NCCL or a Ray worker stuck)."""
        return self.timed_out and self.progressing is False and (self.work or 0) > 0

    @property
    def timed_out(self) -> bool:
        """True when the completion did not finish within its deadline (a wedged engine)."""
        return self.error == "timeout"

    def describe(self) -> str:
        """One line for doctor's check and status's verdict."""
        what = f"a {self.max_tokens}-token completion"
        if self.ok:
            return f"{what} answered in {self.seconds:.1f} s"
        if self.wedged:
            return (
                f"wedged: /health answers, {what} did not finish in {self.timeout_s:g} s and the "
                f"token counters stayed frozen with {self.work} request(s) running or waiting"
            )
        if self.timed_out:
            return f"wedged: /health answers, {what} did not finish in {self.timeout_s:g} s"
        return f"/health answers, {what} failed: {self.error}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompletionProbe:
        """Rebuild from to_dict()'s fields (status's verdict reads its data)."""
        return cls(
            ok=bool(data.get("ok")),
            seconds=float(data.get("seconds") or 0.0),
            timeout_s=float(data.get("timeout_s") or 0.0),
            max_tokens=int(data.get("max_tokens") or PROBE_TOKENS),
            error=str(data.get("error") or ""),
            progressing=data.get("progressing"),
            work=data.get("work"),
        )

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {
            "ok": self.ok,
            "seconds": round(self.seconds, 2),
            "timeout_s": self.timeout_s,
            "max_tokens": self.max_tokens,
            "error": self.error,
            "progressing": self.progressing,
            "work": self.work,
            "wedged": self.wedged,
        }


def _timeout(seconds: float) -> Any:
    """An aiohttp total timeout."""
    import aiohttp

    return aiohttp.ClientTimeout(total=seconds)


class BodyTooLarge(Exception):
    """An answer larger than the reader's bound (refused, not read whole)."""


class EngineAPI:
    """A small client of the vLLM OpenAI-compatible server."""

    def __init__(self, base_url: str, *, timeout: float = 10.0, model: str | None = None) -> None:
        """Bind to a base URL like http://127.0.0.1:8000."""
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.model = model
        self._session: Any = None
        self.last_error = ""  # why the last metrics() read nothing, when it was refused

    async def __aenter__(self) -> EngineAPI:
        """Open the HTTP session."""
        import aiohttp

        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout)
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()

    async def _get(
        self, path: str, timeout: float | None = None, *, max_bytes: int | None = None
    ) -> tuple[int, str]:
        """GET a path; returns status and body text (with `max_bytes`, a larger body raises
        BodyTooLarge once that much was read, never held whole)."""
        import aiohttp

        assert self._session is not None, "use EngineAPI as an async context manager"
        t = aiohttp.ClientTimeout(total=timeout or self.timeout)
        async with self._session.get(self.base_url + path, timeout=t) as resp:
            if max_bytes is None:
                return resp.status, await resp.text()
            body = bytearray()
            async for chunk in resp.content.iter_chunked(64 * 1024):
                body += chunk
                if len(body) > max_bytes:
                    raise BodyTooLarge(
                        f"the engine's {path} answer is larger than {max_bytes} bytes"
                    )
            return resp.status, body.decode("utf-8", "replace")

    async def health(self) -> bool:
        """True when /health answers 200 (necessary, never sufficient)."""
        try:
            status, _ = await self._get("/health", 5)
        except (OSError, asyncio.TimeoutError, Exception):
            return False
        return status == 200

    async def version(self) -> str | None:
        """The server's vLLM version, or None when unreachable."""
        import json

        try:
            status, body = await self._get("/version")
            return str(json.loads(body)["version"]) if status == 200 else None
        except Exception:
            return None

    async def models(self) -> list[str]:
        """Served model names (empty when unreachable)."""
        import json

        try:
            status, body = await self._get("/v1/models")
            if status != 200:
                return []
            return [str(m["id"]) for m in json.loads(body).get("data", [])]
        except Exception:
            return []

    async def metrics(self, max_bytes: int | None = None) -> EngineSnapshot | None:
        """Parse /metrics, or None when unreachable or larger than `max_bytes` (last_error says
        which)."""
        self.last_error = ""
        try:
            status, body = await self._get("/metrics", max_bytes=max_bytes)
        except BodyTooLarge as exc:
            self.last_error = str(exc)
            return None
        except Exception:
            return None
        return EngineSnapshot.from_metrics(body) if status == 200 else None

    async def start_time(self) -> float | None:
        """The API server's `process_start_time_seconds` from /metrics (None: not exported)."""
        try:
            status, body = await self._get("/metrics")
        except Exception:
            return None
        if status != 200:
            return None
        for s in parse_metrics(body, ("process_start_time_seconds",)):
            if not s.labels:
                return s.value
        return None

    async def complete(self, timeout: float = 30.0) -> bool:
        """Ask for a tiny real completion (5 tokens); True when text came back."""
        return (await self.probe_completion(timeout, max_tokens=5)).ok

    async def probe_serving(self, timeout: float) -> CompletionProbe:
        """The completion probe, and when it times out whether the engine is wedged: the token
        counters of /metrics read before and after it (frozen, with requests in the engine, is
        wedged; moving is only busy). status, doctor, serve and /metrics all read it."""
        before = await self.metrics()
        probe = await self.probe_completion(timeout)
        if not probe.timed_out:
            return probe
        later = await self.metrics()
        was = before.generation_tokens if before is not None else None
        now = later.generation_tokens if later is not None else None
        if was is not None and now is not None:
            probe.progressing = now > was
        if later is not None:
            probe.work = int(later.running or 0) + int(later.waiting or 0)
        return probe

    async def probe_completion(
        self, timeout: float, *, max_tokens: int = PROBE_TOKENS
    ) -> CompletionProbe:
        """A real completion of max_tokens under a deadline: what came back, or why none did.

        /health answers while an engine is wedged (a Ray worker lost, NCCL hung); only a
        completion that finishes proves it serves. The deadline covers the model lookup too.
        """

        assert self._session is not None
        start = time.monotonic()

        def done(ok: bool, error: str = "") -> CompletionProbe:
            """The probe's record, timed from its start."""
            return CompletionProbe(ok, time.monotonic() - start, timeout, max_tokens, error)

        async def ask() -> CompletionProbe:
            """Find the model, post the completion, read its answer."""
            model = self.model or next(iter(await self.models()), None)
            if model is None:
                return done(False, "no model is served (/v1/models is empty)")
            self.model = model
            body = {"model": model, "prompt": "ping", "max_tokens": max_tokens, "temperature": 0}
            async with self._session.post(
                self.base_url + "/v1/completions", json=body, timeout=_timeout(timeout)
            ) as resp:
                if resp.status != 200:
                    return done(False, f"HTTP {resp.status}")
                data = await resp.json()
                return done(True) if data.get("choices") else done(False, "no text came back")

        try:
            return await asyncio.wait_for(ask(), timeout)
        except asyncio.TimeoutError:
            return done(False, "timeout")
        except Exception as exc:  # a refused or reset connection, a body that is not JSON
            return done(False, f"{type(exc).__name__}: {str(exc)[:120]}".rstrip(": "))

    async def pause(self, timeout: float) -> bool:
        """Stop new work and let in-flight requests finish, where the engine allows it.

        vLLM offers POST /pause in dev mode (VLLM_SERVER_DEV_MODE=1): `mode=wait` in newer
        versions, `wait_for_inflight_requests=true` in older ones. False when not offered.
        """
        assert self._session is not None
        params = {"mode": "wait", "wait_for_inflight_requests": "true"}
        try:
            async with self._session.post(
                self.base_url + "/pause", params=params, timeout=_timeout(timeout)
            ) as resp:
                return resp.status == 200
        except Exception:
            return False

    async def resume(self) -> bool:
        """Undo pause() (when the restart does not happen after all)."""
        assert self._session is not None
        try:
            async with self._session.post(self.base_url + "/resume", timeout=_timeout(10)) as r:
                return r.status == 200
        except Exception:
            return False

    async def drain(self, timeout: float, poll: float = 1.0) -> dict[str, Any]:
        """Stop new work if the engine allows, wait until none runs (or the timeout); report it."""
        start = time.monotonic()
        first = await self.metrics()
        seen = int(first.running or 0) if first else 0
        paused = await self.pause(timeout) if first is not None else False
        last = await self.metrics() if paused else first
        while last is not None and (last.running or 0) > 0:
            if time.monotonic() - start >= timeout:
                return {
                    "drained": False,
                    "paused": paused,
                    "running_at_start": seen,
                    "running_at_end": int(last.running or 0),
                    "seconds": round(time.monotonic() - start, 1),
                }
            await asyncio.sleep(poll)
            last = await self.metrics()
        return {
            "drained": last is not None,
            "paused": paused,
            "running_at_start": seen,
            "running_at_end": 0 if last is not None else None,
            "seconds": round(time.monotonic() - start, 1),
        }
