"""Core of the sim engine: the step-time model, continuous batching and the metrics it keeps."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import itertools
import time
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from spark_ops.sim.engine_config import active_fault, cfg_float, cfg_get, time_scale


@dataclass(frozen=True)
class StepModel:
    """Decode step time t(B) = t0 + te*(1-(1-q)^B) + c*B, plus a prefill cost when requests join.

    The API server hands requests to the engine core one at a time: each takes frontend_s +
    frontend_per_prompt_token_s x (its prompt tokens) + frontend_per_running_s x (sequences
    running) of serial pre-processing first (the staggered start that makes a burst's
    per-request average exceed aggregate / C; a short prompt passes almost at once).
    """

    t0: float
    te: float
    q: float
    c: float
    prefill_fixed: float = 0.0
    prefill_per_token: float = 0.0
    frontend_s: float = 0.0
    frontend_per_prompt_token_s: float = 0.0
    frontend_per_running_s: float = 0.0

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> StepModel:
        """Read the model's parameters (emulated seconds) from the scheduler section."""
        return cls(
            t0=cfg_float(cfg, "scheduler.t0_s"),
            te=cfg_float(cfg, "scheduler.te_s"),
            q=cfg_float(cfg, "scheduler.q"),
            c=cfg_float(cfg, "scheduler.c_s"),
            prefill_fixed=cfg_float(cfg, "scheduler.prefill_fixed_s"),
            prefill_per_token=cfg_float(cfg, "scheduler.prefill_per_token_s"),
            frontend_s=cfg_float(cfg, "scheduler.frontend_s"),
            frontend_per_prompt_token_s=cfg_float(cfg, "scheduler.frontend_per_prompt_token_s"),
            frontend_per_running_s=cfg_float(cfg, "scheduler.frontend_per_running_s"),
        )

    def frontend_time(self, prompt_tokens: int, running: int) -> float:
        """Return the API server's emulated seconds for one request while `running` decode."""
        return (
            self.frontend_s
            + self.frontend_per_prompt_token_s * prompt_tokens
            + self.frontend_per_running_s * running
        )

    def decode_time(self, batch: int) -> float:
        """Return the emulated seconds of one decode step for a batch of `batch` sequences."""
        if batch <= 0:
            return 0.0
        return self.t0 + self.te * (1.0 - (1.0 - self.q) ** batch) + self.c * batch

    def prefill_time(self, joining_tokens: int) -> float:
        """Return the extra emulated seconds of a step in which prompts of this many tokens join."""
        if joining_tokens <= 0:
            return 0.0
        return self.prefill_fixed + self.prefill_per_token * joining_tokens

    def throughput(self, batch: int) -> float:
        """Return the steady-state aggregate decode rate (tok/s) of a full batch."""
        return batch / self.decode_time(batch)


class Histogram:
    """A Prometheus histogram with fixed buckets and weighted observations."""

    def __init__(self, buckets: list[float]) -> None:
        """Create empty counts for the given upper bounds (+Inf added)."""
        self.bounds = sorted(float(b) for b in buckets)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float, weight: int = 1) -> None:
        """Record `weight` observations of `value`."""
        self.counts[bisect.bisect_left(self.bounds, value)] += weight
        self.total += value * weight
        self.n += weight

    def cumulative(self) -> list[tuple[str, int]]:
        """Return (le, cumulative count) pairs including +Inf."""
        out, acc = [], 0
        for bound, count in zip([*self.bounds, float("inf")], self.counts, strict=True):
            acc += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), acc))
        return out


@dataclass
class Stats:
    """Counters the engine exposes on /metrics and in its periodic log line."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    success: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(("stop", "length", "abort", "error", "repetition"), 0)
    )


_ids = itertools.count(1)


@dataclass(eq=False)
class Request:
    """One generation request: how many tokens it wants and how many it has got."""

    prompt_tokens: int
    max_tokens: int
    stop_at: int | None = None  # an earlier natural stop ("stop") if not ignore_eos
    seed: int = 0
    rid: int = field(default_factory=lambda: next(_ids))
    arrival: float = field(default_factory=time.monotonic)
    arrival_loop: float | None = None  # the loop's clock at submission (set by submit callers)
    generated: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    finish_reason: str | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def target(self) -> int:
        """Return the number of tokens after which the request finishes."""
        return min(self.max_tokens, self.stop_at) if self.stop_at is not None else self.max_tokens

    @property
    def done(self) -> bool:
        """Return whether the request has finished (any reason)."""
        return self.finish_reason is not None


def prompt_seed(text: str) -> int:
    """Return a deterministic seed for a prompt (filler words start there)."""
    return zlib.crc32(text.encode("utf-8", "replace"))


def slowed(model: StepModel, cfg: dict[str, Any], max_num_seqs: int) -> StepModel:
    """The step model under the `slow_decode` fault: every decode step `factor` times longer when
    the engine runs at the fault's max_num_seqs (a change that regresses), else unchanged."""
    if active_fault(cfg) != "slow_decode":
        return model
    if max_num_seqs != int(cfg_get(cfg, "faults.slow_decode.max_num_seqs")):
        return model
    k = cfg_float(cfg, "faults.slow_decode.factor")
    return dataclasses.replace(model, t0=model.t0 * k, te=model.te * k, c=model.c * k)


class EngineCore:
    """Continuous batching: at most max_num_seqs running, FIFO waiting, one token per step each."""

    def __init__(
        self, cfg: dict[str, Any], *, max_num_seqs: int, max_num_batched_tokens: int, kv_tokens: int
    ) -> None:
        """Set up the scheduler from config and the engine's effective limits."""
        self.model = slowed(StepModel.from_config(cfg), cfg, max_num_seqs)
        self.scale = time_scale(cfg)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.kv_tokens = max(1, kv_tokens)
        self.block_size = int(cfg_get(cfg, "memory.block_size"))
        self.max_catch_up = cfg_float(cfg, "scheduler.max_catch_up_s")
        self.front: deque[Request] = deque()  # in the API server, not yet in the engine core
        self.front_ready_at: float | None = None  # when the head of `front` reaches the core
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = Stats()
        self.ttft = Histogram(list(cfg_get(cfg, "metrics.ttft_buckets")))
        self.itl = Histogram(list(cfg_get(cfg, "metrics.itl_buckets")))
        self._arrived = asyncio.Event()
        self.wedged = False
        self.stopped = False

    # -- API side -------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        """Queue a request (FIFO) behind the API server's pre-processing and wake the loop."""
        if req.arrival_loop is None:
            with contextlib.suppress(RuntimeError):
                req.arrival_loop = asyncio.get_running_loop().time()
        self.front.append(req)
        self._arrived.set()

    def advance_front(self, now: float) -> float | None:
        """Move requests the API server has finished by `now` to waiting; return the next's time.

        `now` and the returned time are in the loop's clock (real seconds, i.e. emulated / scale).
        """
        while self.front:
            if self.front_ready_at is None:
                head = self.front[0]
                cost = self.model.frontend_time(head.prompt_tokens, len(self.running))
                self.front_ready_at = max(now, head.arrival_loop or now) + cost / self.scale
            if self.front_ready_at > now:
                return self.front_ready_at
            self.waiting.append(self.front.popleft())
            done_at, self.front_ready_at = self.front_ready_at, None
            if self.front:  # the next one starts where this one ended (no drift)
                head = self.front[0]
                cost = self.model.frontend_time(head.prompt_tokens, len(self.running))
                self.front_ready_at = max(done_at, head.arrival_loop or done_at) + cost / self.scale
        return None

    def abort(self, req: Request) -> None:
        """Drop a request (client went away or shutdown) and count it as aborted."""
        if req.done or self.wedged:
            return  # a wedged engine core never processes the abort
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        elif req in self.front:
            if self.front[0] is req:
                self.front_ready_at = None
            self.front.remove(req)
        self._finish(req, "abort")

    def abort_all(self) -> None:
        """Abort every running and waiting request."""
        for req in [*self.running, *self.waiting, *self.front]:
            self.abort(req)

    @property
    def in_flight(self) -> int:
        """Return running plus waiting requests (those still in the API server included)."""
        return len(self.running) + len(self.waiting) + len(self.front)

    def _blocks(self, tokens: int) -> int:
        """Return the KV blocks that hold this many tokens."""
        return -(-tokens // self.block_size)

    @property
    def kv_blocks(self) -> int:
        """Return the number of KV cache blocks in the pool."""
        return max(1, self.kv_tokens // self.block_size)

    def kv_usage(self) -> float:
        """Return the KV cache usage (0..1) in whole blocks held by running requests."""
        blocks = sum(self._blocks(r.prompt_tokens + r.generated) for r in self.running)
        return min(1.0, blocks / self.kv_blocks)

    def _blocks_next_step(self, reqs: list[Request]) -> int:
        """Return the blocks these requests need to hold their next token."""
        return sum(self._blocks(r.prompt_tokens + r.generated + 1) for r in reqs)

    # -- engine loop ------------------------------------------------------------------------
    def _finish(self, req: Request, reason: str) -> None:
        """Mark a request finished, count it and wake its reader."""
        req.finish_reason = reason
        self.stats.success[reason] = self.stats.success.get(reason, 0) + 1
        req.wake.set()

    def _admit(self) -> int:
        """Move waiting requests into the batch within the caps; return joining prompt tokens."""
        budget = self.max_num_batched_tokens - len(self.running)
        used = self._blocks_next_step(self.running)
        joining = 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            need = req.prompt_tokens + req.generated
            blocks = self._blocks(need + 1)
            if joining and need > budget - joining:
                break
            if self.running and used + blocks > self.kv_blocks:
                break
            self.waiting.popleft()
            self.running.append(req)
            joining += need
            used += blocks
        self.stats.prompt_tokens += joining
        return joining

    def _preempt_if_full(self) -> None:
        """Send the newest running requests back to waiting while the KV cache would overflow."""
        while len(self.running) > 1 and self._blocks_next_step(self.running) > self.kv_blocks:
            victim = self.running.pop()
            self.waiting.appendleft(victim)
            self.stats.preemptions += 1

    def _emit(self, now: float, step_s: float) -> None:
        """Give every running sequence one token and retire the finished ones."""
        batch = len(self.running)
        still: list[Request] = []
        first = 0
        for req in self.running:
            req.generated += 1
            if req.first_token_at is None:
                req.first_token_at = now
                self.ttft.observe(now - req.arrival)
                first += 1
            req.last_token_at = now
            if req.generated >= req.target:
                self._finish(req, "length" if req.generated >= req.max_tokens else "stop")
            else:
                req.wake.set()
                still.append(req)
        if batch - first:
            self.itl.observe(step_s, batch - first)
        self.stats.generation_tokens += batch
        self.running = still

    async def run(self) -> None:
        """Run steps forever on an absolute schedule (so loop overhead does not slow tokens)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while not self.stopped:
            next_front = self.advance_front(loop.time())
            if self.wedged or not (self.running or self.waiting):
                self._arrived.clear()
                wait = None if next_front is None else max(0.0, next_front - loop.time())
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), wait)
                deadline = loop.time()
                continue
            joining = self._admit()
            self._preempt_if_full()
            step = self.model.decode_time(len(self.running)) + self.model.prefill_time(joining)
            start = loop.time()
            deadline = max(deadline, start - self.max_catch_up) + step / self.scale
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            if self.wedged or self.stopped:
                continue
            self._emit(time.monotonic(), max(0.0, loop.time() - start))

    def wedge(self) -> None:
        """Stop producing tokens for good (a lost Ray worker); requests stay running."""
        self.wedged = True

    def stop(self) -> None:
        """Stop the loop after the current step."""
        self.stopped = True
        self._arrived.set()


@dataclass(frozen=True)
class BurstTimes:
    """One request of a virtual burst: emulated seconds from the send to its first, last token."""

    first_token_s: float
    end_s: float


def virtual_burst(
    cfg: dict[str, Any], *, concurrency: int, cap: int, output_tokens: int, prompt_tokens: int,
    kv_tokens: int = 10**9, max_num_batched_tokens: int = 8192,
) -> list[BurstTimes]:  # fmt: skip
    """Run the engine core's own scheduling on a virtual clock: `concurrency` requests sent at once.

    The same front end, admission, preemption and step times as the serving loop, without
    sleeping: what the sim would measure on an idle machine (emulated seconds).
    """
    core = EngineCore(
        {**cfg, "time_scale": 1.0}, max_num_seqs=cap,
        max_num_batched_tokens=max_num_batched_tokens, kv_tokens=kv_tokens,
    )  # fmt: skip
    reqs = [Request(prompt_tokens, output_tokens, arrival=0.0, arrival_loop=0.0)]
    reqs += [
        Request(prompt_tokens, output_tokens, arrival=0.0, arrival_loop=0.0)
        for _ in range(concurrency - 1)
    ]
    for req in reqs:
        core.front.append(req)
    now = 0.0
    while not all(r.done for r in reqs):
        next_front = core.advance_front(now)
        if not (core.running or core.waiting):
            if next_front is None:
                raise RuntimeError("virtual burst stalled with requests unfinished")
            now = next_front
            continue
        joining = core._admit()
        core._preempt_if_full()
        now += core.model.decode_time(len(core.running)) + core.model.prefill_time(joining)
        core._emit(now, 0.0)
    return [BurstTimes(r.first_token_at or 0.0, r.last_token_at or 0.0) for r in reqs]
