"""The one request loop of bench: the server opened and its model found, request bodies in
rotation, and requests sent open loop (each at its scheduled time, openloop.py and the gate) or
closed loop (C in flight: sweep.py's levels, the gate, warm-ups); each request's figures are
recorded by StreamClient.stream.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

from spark_ops.bench.client import RequestRecord, StreamClient
from spark_ops.bench.workload import APIS, build_payload, load_prompts
from spark_ops.errors import BenchError, BenchUnreachable


class ServerSettings:
    """What both bench configs (SweepConfig, RateConfig: dataclasses) say of the server they load:
    the headers each request carries, and the config as reported, without secrets."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    base_url: str
    api: str
    headers: dict[str, str]
    api_key: str | None

    def validate_server(self) -> None:
        """Raise BenchError when the URL or the API is not one bench can load."""
        if not self.base_url.startswith(("http://", "https://")):
            raise BenchError(f"base_url {self.base_url!r} must start with http:// or https://")
        if self.api not in APIS:
            raise BenchError(f"api {self.api!r} is not supported; allowed: {', '.join(APIS)}")

    def all_headers(self) -> dict[str, str]:
        """Request headers, with the bearer token when an api_key is set."""
        headers = dict(self.headers)
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def to_dict(self) -> dict[str, Any]:
        """Serialize without secrets (api_key and Authorization are masked); sequences as lists,
        the prompt file as text."""
        data = {
            k: list(v) if isinstance(v, Sequence) and not isinstance(v, str) else v
            for k, v in asdict(self).items()
        }
        data["prompts_path"] = str(data["prompts_path"]) if data["prompts_path"] else None
        if data["api_key"]:
            data["api_key"] = "***"
        data["headers"] = {
            k: ("***" if k.lower() == "authorization" else v) for k, v in self.headers.items()
        }
        return data


async def discover_model(client: StreamClient) -> str:
    """The first model id the server lists at /v1/models."""
    status, text = await client.get_text("/v1/models")
    if status != 200:
        raise BenchUnreachable(f"{client.base_url}/v1/models answered HTTP {status}: {text[:200]}")
    try:
        ids = [m["id"] for m in json.loads(text)["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchUnreachable(
            f"{client.base_url}/v1/models: unexpected body: {text[:200]}"
        ) from exc
    if not ids:
        raise BenchUnreachable(f"{client.base_url}/v1/models lists no model; pass --model")
    return str(ids[0])


async def open_client(
    base_url: str, *, headers: dict[str, str], timeout_s: float, model: str | None
) -> tuple[StreamClient, str]:
    """An open StreamClient and the model to ask for (the first /v1/models lists when None);
    BenchUnreachable when the server does not answer. The caller closes the client."""
    client = StreamClient(base_url, headers=headers, timeout_s=timeout_s)
    await client.__aenter__()
    try:
        found = model or await discover_model(client)
        if model:
            await client.get_text("/v1/models")
        return client, found
    except BenchError:
        await client.__aexit__()
        raise
    except Exception as exc:  # OSError, aiohttp.ClientError, timeouts: not reachable
        await client.__aexit__()
        raise BenchUnreachable(
            f"cannot reach {base_url}: {type(exc).__name__}: {exc}",
            hint="is the server up and the URL right (scheme, host, port)?",
        ) from exc


class Bodies:
    """Request bodies in rotation, so that consecutive requests never share a prompt."""

    def __init__(self, bodies: list[dict[str, Any]]) -> None:
        """Hand out the given bodies in turn."""
        self.bodies = bodies
        self.i = 0

    @classmethod
    def build(
        cls, model: str, *, api: str, output_tokens: int, prompts_path: Path | None
    ) -> Bodies:
        """One body per prompt of the prompt file."""
        prompts = load_prompts(prompts_path)
        return cls(
            [build_payload(p, model=model, api=api, output_tokens=output_tokens) for p in prompts]
        )

    def next(self) -> dict[str, Any]:
        """The next request body."""
        body = self.bodies[self.i % len(self.bodies)]
        self.i += 1
        return body


async def send_at(
    client: StreamClient, path: str, bodies: Bodies, times: Sequence[float],
    max_concurrency: int | None = None,
) -> tuple[list[RequestRecord], list[float], float]:  # fmt: skip
    """Send request i at times[i] s after now (open loop; at most max_concurrency in flight when
    given); return the records, each send's lag behind its schedule (s) and the start time."""
    sem = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    lags = [0.0] * len(times)

    async def one(i: int, body: dict[str, Any], due: float) -> RequestRecord:
        """Send one request (after the cap lets it), noting how late it left."""
        if sem is None:
            lags[i] = max(0.0, time.monotonic() - due)
            return await client.stream(path, body, i)
        async with sem:
            lags[i] = max(0.0, time.monotonic() - due)
            return await client.stream(path, body, i)

    t0 = time.monotonic()
    tasks: list[asyncio.Task[RequestRecord]] = []
    for i, at in enumerate(times):
        due = t0 + at
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, bodies.next(), due)))
    return list(await asyncio.gather(*tasks)), lags, t0


async def send_closed(
    client: StreamClient, path: str, bodies: Bodies, requests: int, concurrency: int,
    until: float | None = None,
) -> tuple[list[RequestRecord], float]:  # fmt: skip
    """Send up to `requests` requests keeping `concurrency` in flight (closed loop), none sent
    once the monotonic clock reaches `until` when given; the records (by index) and the start."""
    counter = iter(range(requests))

    async def worker() -> list[RequestRecord]:
        """Send the next request as soon as this one's previous finished, until none are left."""
        out: list[RequestRecord] = []
        while until is None or time.monotonic() < until:
            i = next(counter, None)
            if i is None:
                break
            out.append(await client.stream(path, bodies.next(), i))
        return out

    t0 = time.monotonic()
    per_worker = await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
    return sorted((r for recs in per_worker for r in recs), key=lambda r: r.index), t0
