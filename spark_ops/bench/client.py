"""A fast streaming client for OpenAI-compatible servers: one record per request, every chunk timed.

The client must never be what is measured, so it avoids per-chunk work: the connection pool is not
capped, reads are large, each read is timestamped once (every chunk in it arrived then), and chunks
are recognised by byte search; only the rare usage/error chunks go through ``json.loads``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spark_ops.errors import BenchError

if TYPE_CHECKING:
    import aiohttp

_DATA = b"data:"
_DONE = b"[DONE]"
_TOKEN_KEYS = (b'"content":', b'"text":', b'"reasoning_content":', b'"reasoning":')
_QUOTE = ord('"')
_SPACE = ord(" ")
# An SSE line of vLLM's is a chunk of a few hundred bytes (a usage or error line a few kB): a
# longer one is not an OpenAI-compatible stream (another program on the engine's port)
MAX_SSE_LINE = 1 << 20
MAX_TEXT_BYTES = 4 << 20  # a body read whole (/v1/models, /metrics, an error answer)


@dataclass(slots=True)
class RequestRecord:
    """What one streamed request did: times are time.monotonic() seconds."""

    index: int
    start: float = 0.0
    end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    done: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the request finished without an error."""
        return self.error is None

    @property
    def output_tokens(self) -> int:
        """Generated tokens: the server's usage figure, else the number of content chunks."""
        return self.usage_tokens if self.usage_tokens is not None else len(self.chunk_times)

    @property
    def usage_reported(self) -> bool:
        """True when the token count came from the server's usage chunk."""
        return self.usage_tokens is not None

    @property
    def first_token(self) -> float | None:
        """Arrival time of the first content chunk, if any."""
        return self.chunk_times[0] if self.chunk_times else None


def _has_token(line: bytes) -> bool:
    """True when a chunk carries a non-empty content/text/reasoning string (byte search only)."""
    for key in _TOKEN_KEYS:
        i = line.find(key)
        if i < 0:
            continue
        j = i + len(key)
        n = len(line)
        while j < n and line[j] == _SPACE:
            j += 1
        if j + 1 < n and line[j] == _QUOTE and line[j + 1] != _QUOTE:
            return True
    return False


class SSEParser:
    """Incremental parser of an SSE body into a RequestRecord."""

    __slots__ = ("_buf", "overflow", "record")

    def __init__(self, record: RequestRecord) -> None:
        """Start with an empty buffer for the given record."""
        self._buf = b""
        self.overflow = False
        self.record = record

    def feed(self, data: bytes, now: float) -> None:
        """Consume bytes that arrived at `now`; complete lines are parsed, the rest is kept (a
        rest past MAX_SSE_LINE fails the record: `overflow`, the caller reads no further)."""
        buf = self._buf + data if self._buf else data
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        if len(self._buf) > MAX_SSE_LINE:
            self._buf, self.overflow = b"", True
            self.record.error = (
                f"a line of more than {MAX_SSE_LINE:,} bytes without an end: not an SSE stream "
                "of an OpenAI-compatible server; the rest left unread"
            )
        rec = self.record
        times = rec.chunk_times
        for line in lines:
            if not line.startswith(_DATA):
                continue
            payload = line[5:].strip()
            if not payload:
                continue
            if _has_token(payload):
                times.append(now)
                if b'"usage":{' not in payload and b'"usage": {' not in payload:
                    continue
            if payload == _DONE:
                rec.done = True
            elif b'"usage"' in payload or b"error" in payload:
                self._parse_rare(payload)

    def finish(self) -> None:
        """Parse a last line that had no trailing newline."""
        if self._buf:
            tail, self._buf = self._buf, b""
            self.feed(tail + b"\n", self.record.chunk_times[-1] if self.record.chunk_times else 0)

    def _parse_rare(self, payload: bytes) -> None:
        """Fully parse a usage or error chunk."""
        try:
            obj = json.loads(payload)
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        usage = obj.get("usage")
        if isinstance(usage, dict):
            ct = usage.get("completion_tokens")
            if isinstance(ct, int):
                self.record.usage_tokens = ct
            pt = usage.get("prompt_tokens")
            if isinstance(pt, int):
                self.record.prompt_tokens = pt
        err = obj.get("error")
        if obj.get("object") == "error" or err:
            msg = err.get("message") if isinstance(err, dict) else (err or obj.get("message"))
            self.record.error = f"stream error: {msg}"


def ensure_fd_limit(connections: int, *, spare: int = 256) -> int:
    """Raise the soft open-files limit to fit `connections` sockets; return the limit in effect."""
    try:
        import resource
    except ImportError:  # not on POSIX: nothing to adjust
        return connections + spare
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = connections + spare
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            raise BenchError(
                f"concurrency {connections} needs about {want} open files but the hard limit "
                f"(ulimit -Hn) is {hard}",
                hint="raise the hard limit or lower --concurrency",
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        return want
    return soft if soft != resource.RLIM_INFINITY else want


class StreamClient:
    """An aiohttp session tuned for many concurrent long streams against one server."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        timeout_s: float = 600.0,
        read_bufsize: int = 1 << 20,
    ) -> None:
        """Remember the target; the session opens in __aenter__."""
        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.read_bufsize = read_bufsize
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> StreamClient:
        """Open a session with no connection cap and large read buffers."""
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
        self._session = aiohttp.ClientSession(
            connector=connector,
            headers=self.headers,
            timeout=aiohttp.ClientTimeout(total=None, connect=30, sock_read=self.timeout_s),
            read_bufsize=self.read_bufsize,
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Close the session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The open session (error if used outside `async with`)."""
        if self._session is None:
            raise RuntimeError("StreamClient used outside 'async with'")  # a bug: exit 1
        return self._session

    async def get_text(self, path: str, *, timeout_s: float = 10.0) -> tuple[int, str]:
        """GET a path and return (status, body text)."""
        import aiohttp

        async with self.session.get(
            self.base_url + path, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            return resp.status, await _text(resp)

    async def stream(self, path: str, body: dict[str, Any], index: int) -> RequestRecord:
        """POST a streaming request, timing every chunk; errors end up in the record."""
        import asyncio

        import aiohttp

        rec = RequestRecord(index=index)
        parser = SSEParser(rec)
        clock = time.monotonic
        data = json.dumps(body).encode()
        rec.start = clock()
        try:
            async with self.session.post(
                self.base_url + path,
                data=data,
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:
                if resp.status != 200:
                    text = (await _text(resp))[:300].strip()
                    rec.error = f"HTTP {resp.status}: {text}"
                else:
                    content = resp.content
                    feed = parser.feed
                    while True:
                        chunk = await content.readany()
                        if not chunk:
                            break
                        feed(chunk, clock())
                        if parser.overflow:
                            break
                    if not parser.overflow:
                        parser.finish()
                    if rec.error is None and not rec.done:
                        rec.error = "stream ended before [DONE]"
        except asyncio.TimeoutError:
            rec.error = f"timed out after {self.timeout_s:g} s"
        except aiohttp.ClientError as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
        rec.end = clock()
        return rec


async def _text(resp: aiohttp.ClientResponse) -> str:
    """A response's body as text, read no further than MAX_TEXT_BYTES (the rest left unread: an
    answer longer than that is cut, and fails whatever parses it)."""
    chunks: list[bytes] = []
    got = 0
    while got <= MAX_TEXT_BYTES:
        chunk = await resp.content.readany()
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    data = b"".join(chunks)[: MAX_TEXT_BYTES + 1]
    try:
        return data.decode(resp.charset or "utf-8", "replace")
    except LookupError:  # a charset Python does not know
        return data.decode("utf-8", "replace")
