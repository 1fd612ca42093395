"""What a lower --max-num-seqs would give, read from one sweep at a higher cap (no restart).

A cap only matters once more sequences want to run than it allows. An engine at cap K driven at
concurrency C <= k < K runs exactly what a cap-k engine would run, so the sweep's level C stands
for cap k unchanged. Above the cap, a cap-k engine runs k at a time while the rest wait; the
sweep's level k measured how long a request takes with k running (its per-user speed), so with
s = output tokens / per-user tok/s at level k:

- burst (all C at once): the requests go through in waves of k; wall = wall(k) + (C/k - 1) x s,
  aggregate = C x tokens / wall, request i (0-based) ends after (i // k + 1) x s, so per-user =
  per-user(k) x mean(1 / (i // k + 1)), and its first token comes (i // k) x s later than at k;
- sustained (C users, each sending the next request when one ends): the engine stays at k, the
  aggregate is that of level k, and each request also waits (C/k - 1) x s (Little's law).

Pure: a function of the sweep's figures (no I/O), checked on data in tests/fixtures/bench/.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from spark_ops.bench.measures import CapReading, slo_max_concurrency
from spark_ops.bench.stats import MAX_LEVEL, LevelResult, SpeedCheck, read_levels
from spark_ops.bench.sweep import SweepResult
from spark_ops.errors import BenchError

ASSUMPTIONS = (
    "prefill and decode share the batch (a request's prefill runs in the steps of the others)",
    "the KV cache is not what limits the batch (the pool holds cap x tokens per request)",
    "the same prompts and output lengths as the sweep, sent the same way (burst or sustained)",
    "the lower cap changes nothing else in the engine (memory profile, graphs, scheduling)",
    "the engine the cap runs on is as fast as the one swept (the speed check shows whether this "
    "one held its speed; only a confirmation, `experiment --confirm`, shows whether another boot "
    "runs alike)",
)
PREDICTABLE_MODES = ("burst", "sustained")
QUEUE_LOSS = 0.1  # a sweep that loses this much above its own cap: queues cost throughput
NOISY_SPREAD = 0.2  # a base level whose repeats spread more than this cannot anchor a prediction
SPEED_DRIFT = 0.1  # a speed check that moved more than this: the engine's speed did not hold


@dataclass
class WhatIfPoint:
    """One offered concurrency under one cap: measured (cap not binding) or predicted."""

    concurrency: int
    aggregate_tok_s: float
    per_user_tok_s: float | None
    ttft_ms: float | None
    source: str  # "measured" (C <= cap: the sweep's own level) or "predicted" (requests wait)
    queued: int  # requests beyond the cap at this level (they wait)
    trusted: bool = True
    why_not: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Serialize."""
        return asdict(self)


@dataclass
class WhatIfCap:
    """The predicted curve of one cap and the load up to which it keeps the per-user SLO."""

    cap: int
    base_level: int
    points: list[WhatIfPoint]
    slo_max_concurrency: int | None

    def point(self, concurrency: int) -> WhatIfPoint | None:
        """The point at this offered concurrency, if swept."""
        return next((p for p in self.points if p.concurrency == concurrency), None)

    def to_dict(self) -> dict[str, Any]:
        """Serialize."""
        return {
            "cap": self.cap,
            "base_level": self.base_level,
            "slo_max_concurrency": self.slo_max_concurrency,
            "points": [p.to_dict() for p in self.points],
        }


@dataclass
class WhatIf:
    """Every asked cap's curve, what the prediction assumes, and where it does not hold."""

    running_cap: int | None
    mode: str
    slo_tok_s: float | None
    caps: list[WhatIfCap]
    assumptions: list[str] = field(default_factory=lambda: list(ASSUMPTIONS))
    warnings: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    speed_check: SpeedCheck | None = None

    def cap(self, cap: int) -> WhatIfCap | None:
        """The curve of one cap, if asked."""
        return next((c for c in self.caps if c.cap == cap), None)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return {
            "running_cap": self.running_cap,
            "mode": self.mode,
            "slo_tok_s": self.slo_tok_s,
            "caps": [c.to_dict() for c in self.caps],
            "assumptions": list(self.assumptions),
            "warnings": list(self.warnings),
            "lines": list(self.lines),
            "speed_check": self.speed_check.to_dict() if self.speed_check else None,
        }


def _tokens_per_request(lv: LevelResult) -> tuple[float, float | None]:
    """Mean output tokens and prompt tokens (None when not reported) per completed request."""
    done = max(1, lv.completed)
    prompt = lv.total_input_tokens / done if lv.total_input_tokens is not None else None
    return lv.total_output_tokens / done, prompt


def _waves(concurrency: int, cap: int) -> tuple[float, float]:
    """mean(1 / (i // cap + 1)) and mean(i // cap) over i < concurrency (FIFO waves of cap)."""
    inv = sum(1.0 / (i // cap + 1) for i in range(concurrency)) / concurrency
    wait = sum(i // cap for i in range(concurrency)) / concurrency
    return inv, wait


def predict_point(base: LevelResult, cap: int, concurrency: int, mode: str) -> WhatIfPoint:
    """The figures of a cap-`cap` engine at `concurrency` from the sweep's level `cap` (= base)."""
    tokens, _ = _tokens_per_request(base)
    if base.per_user_tok_s is None or base.per_user_tok_s <= 0 or base.completed == 0:
        raise BenchError(f"level {base.max_concurrency} completed no request: nothing to predict")
    service_s = tokens / base.per_user_tok_s
    ttft = base.mean_ttft_ms
    queued = concurrency - cap
    if mode == "burst":
        wall = base.duration + (concurrency / cap - 1.0) * service_s
        inv, wait = _waves(concurrency, cap)
        return WhatIfPoint(
            concurrency, concurrency * tokens / wall, base.per_user_tok_s * inv,
            None if ttft is None else ttft + 1000.0 * wait * service_s, "predicted", queued,
        )  # fmt: skip
    extra_s = (concurrency / cap - 1.0) * service_s
    return WhatIfPoint(
        concurrency, base.output_throughput, tokens / (service_s + extra_s),
        None if ttft is None else ttft + 1000.0 * extra_s, "predicted", queued,
    )  # fmt: skip


def _measured(lv: LevelResult) -> WhatIfPoint:
    """A level below the cap: the sweep's own figures."""
    return WhatIfPoint(
        lv.max_concurrency, lv.output_throughput, lv.per_user_tok_s, lv.mean_ttft_ms, "measured", 0
    )


def queue_loss(by_c: dict[int, LevelResult], running_cap: int | None) -> float | None:
    """How much the aggregate fell when requests waited behind the running cap (None: no fall).

    The prediction assumes a waiting request costs nothing. A sweep that went above its own cap
    shows whether that holds: if its highest level gives over QUEUE_LOSS less than the level at
    the cap, queues cost throughput on this engine and every prediction with a queue is optimistic.
    """
    if running_cap is None or running_cap not in by_c:
        return None
    above = [c for c in by_c if c > running_cap]
    base = by_c[running_cap].output_throughput
    if not above or base <= 0:
        return None
    loss = by_c[max(above)].output_throughput / base - 1
    return loss if loss < -QUEUE_LOSS else None


def _distrust(
    point: WhatIfPoint, levels: dict[int, LevelResult], cap: int, kv_tokens: int | None
) -> None:
    """Mark a point untrusted where the KV pool or preemptions break the assumptions."""
    used = levels.get(min(cap, point.concurrency))
    reasons = []
    if used is not None and used.preemptions:
        reasons.append(f"{used.preemptions} preemption(s) at C={used.max_concurrency}")
    if (
        used is not None and point.source == "predicted" and used.repeats > 1
        and used.output_throughput > 0
        and (spread := (used.output_throughput_max - used.output_throughput_min)
             / used.output_throughput) > NOISY_SPREAD
    ):  # fmt: skip
        reasons.append(f"C={used.max_concurrency} varied {spread:.0%} between its repeats")
    if used is not None and kv_tokens is not None:
        out, prompt = _tokens_per_request(used)
        need = min(cap, point.concurrency) * (out + (prompt or 0.0))
        if need > kv_tokens:
            reasons.append(f"{need:.0f} tokens in flight > KV pool {kv_tokens}")
    if reasons:
        untrust(point, "; ".join(reasons))


def _beats_measured(
    point: WhatIfPoint, levels: dict[int, LevelResult], running_cap: int | None
) -> str | None:
    """Why a predicted point is not to be trusted when it beats the sweep's own (higher) cap.

    A lower cap only holds requests back: it cannot give more than the higher cap measured at the
    same load. A prediction that does says the model's assumptions failed there (e.g. the higher
    cap never filled: too few requests ran at once to gain from a queue).
    """
    measured = levels.get(point.concurrency)
    if measured is None or point.aggregate_tok_s <= measured.output_throughput:
        return None
    higher = f"cap {running_cap}" if running_cap is not None else "the swept cap"
    return (
        f"predicted {point.aggregate_tok_s:.0f} tok/s beats the {measured.output_throughput:.0f} "
        f"measured with {higher} at C={point.concurrency}: a lower cap cannot add throughput"
    )


def _drifted(check: SpeedCheck | None) -> str | None:
    """Why no point is to be trusted when the engine's speed moved within the sweep, or None."""
    if check is None or abs(check.drift) <= SPEED_DRIFT:
        return None
    return (
        f"the engine's speed at C={check.concurrency} moved {check.drift:+.0%} within the sweep "
        f"({check.swept_tok_s:.0f} then {check.again_tok_s:.0f} tok/s)"
    )


def untrust(point: WhatIfPoint, why: str) -> None:
    """Mark a point not to be trusted, adding why to the reasons it already has."""
    point.trusted = False
    point.why_not = f"{point.why_not}; {why}" if point.why_not else why


def predict_caps(
    levels: list[LevelResult], caps: list[int], *, mode: str, running_cap: int | None,
    slo_tok_s: float | None = None, kv_tokens: int | None = None,
    speed_check: SpeedCheck | None = None,
) -> WhatIf:  # fmt: skip
    """The curve of each lower cap at every swept level; BenchError when one cannot be read."""
    if mode not in PREDICTABLE_MODES:
        raise BenchError(
            f"--what-if-cap needs a burst or sustained sweep (this one is {mode}): the waves a "
            "cap makes of open-loop arrivals depend on their timing"
        )
    by_c = {lv.max_concurrency: lv for lv in levels}
    out: list[WhatIfCap] = []
    for cap in sorted(set(caps)):
        if cap < 1:
            raise BenchError(f"--what-if-cap {cap}: a cap must be >= 1")
        if running_cap is not None and cap > running_cap:
            raise BenchError(
                f"--what-if-cap {cap} is above the running cap {running_cap}: a sweep shows only "
                "lower caps; raise the cap (a restart) and sweep there"
            )
        if cap not in by_c:
            raise BenchError(
                f"--what-if-cap {cap}: the sweep has no level C={cap}; levels: "
                f"{','.join(map(str, sorted(by_c)))} (add {cap} to --concurrency)"
            )
        base = by_c[cap]
        points = [
            _measured(lv) if lv.max_concurrency <= cap
            else predict_point(base, cap, lv.max_concurrency, mode)
            for lv in sorted(levels, key=lambda x: x.max_concurrency)
        ]  # fmt: skip
        loss = queue_loss(by_c, running_cap)
        drifted = _drifted(speed_check)
        for p in points:
            _distrust(p, by_c, cap, kv_tokens)
            if p.source == "predicted" and (beaten := _beats_measured(p, by_c, running_cap)):
                untrust(p, beaten)
            if loss is not None and p.source == "predicted":
                untrust(p, f"a queue cost {-loss:.0%} at the running cap {running_cap}")
            if drifted:
                untrust(p, drifted)
        users = [(p.concurrency, p.per_user_tok_s or 0.0) for p in points]
        slo = slo_max_concurrency(users, slo_tok_s) if slo_tok_s else None
        out.append(WhatIfCap(cap, cap, points, slo))
    result = WhatIf(running_cap, mode, slo_tok_s, out, speed_check=speed_check)
    result.warnings = _warnings(result, levels, kv_tokens)
    if speed_check is None:
        result.warnings.append(
            "no speed check (no level was run again at the sweep's end): whether the engine's "
            "speed held during the sweep is not known"
        )
    result.lines = reading_lines(result)
    return result


def _warnings(result: WhatIf, levels: list[LevelResult], kv_tokens: int | None) -> list[str]:
    """Where the assumptions do not hold: preemptions seen, a KV pool too small, no metrics."""
    out = []
    preempted = [lv for lv in levels if lv.preemptions]
    for lv in preempted:
        out.append(
            f"the engine preempted {lv.preemptions} request(s) at C={lv.max_concurrency}: the KV "
            "cache was binding there, predictions built on that level are not to be trusted"
        )
    if kv_tokens is None:
        out.append("KV pool size unknown (no vllm:cache_config_info): KV capacity not checked")
    if all(lv.preemptions is None for lv in levels):
        out.append("no preemption counter on /metrics: preemptions not checked")
    for cap in result.caps:
        bad = [p.concurrency for p in cap.points if not p.trusted]
        if bad:
            why = next(p.why_not for p in cap.points if not p.trusted)
            out.append(f"cap {cap.cap}: not to be trusted at C={','.join(map(str, bad))} ({why})")
    return out


def reading_lines(result: WhatIf) -> list[str]:
    """Which cap keeps the per-user SLO up to which load, and what a lower cap costs at the top."""
    lines = []
    slo = result.slo_tok_s
    for cap in result.caps:
        top = cap.points[-1]
        text = (
            f"cap {cap.cap}: at C={top.concurrency} {top.aggregate_tok_s:.0f} tok/s aggregate, "
            f"{(top.per_user_tok_s or 0):.1f} tok/s per user"
        )
        if top.ttft_ms is not None:
            text += f", first token after {top.ttft_ms / 1000:.1f} s"
        if slo is not None:
            keep = cap.slo_max_concurrency
            text += (
                f"; keeps ≥{slo:g} tok/s per user up to {keep} concurrent requests"
                if keep is not None
                else f"; no level keeps ≥{slo:g} tok/s per user"
            )
        lines.append(text + ("" if top.trusted else " (not to be trusted there)") + ".")
    check = result.speed_check
    if check is not None:
        text = (
            f"Speed check: C={check.concurrency} run again at the sweep's end gave "
            f"{check.again_tok_s:.0f} tok/s ({check.drift:+.0%} of the sweep's "
            f"{check.swept_tok_s:.0f})"
        )
        lines.append(
            text + ": the engine held its speed."
            if abs(check.drift) <= SPEED_DRIFT
            else text + ": this machine does not run the same thing at the same speed twice, "
            "so no prediction from this sweep is to be trusted (sweep again when it is quiet)."
        )
    return lines


def running_cap_of(knobs: dict[str, Any] | None) -> int | None:
    """The max_num_seqs a sweep ran with (from its knobs), or None when unknown."""
    knob = (knobs or {}).get("max_num_seqs")
    if isinstance(knob, bool) or not isinstance(knob, int | str):
        return None
    text = str(knob)
    if not text.isascii() or not text.isdigit():
        return None
    if len(text) > 7 or not 1 <= int(text) <= MAX_LEVEL:
        raise BenchError(
            f"max_num_seqs {text[:20]} is not a cap spark-ops predicts (1..{MAX_LEVEL})"
        )
    return int(text)


def whatif_of(result: SweepResult, caps: list[int], slo_tok_s: float | None = None) -> WhatIf:
    """The what-if of a SweepResult (its levels, mode, knobs, KV pool and SLO)."""
    slo = slo_tok_s if slo_tok_s is not None else result.reading.slo_tok_s
    return predict_caps(
        result.levels, caps, mode=result.mode, running_cap=running_cap_of(result.knobs),
        slo_tok_s=slo, kv_tokens=result.kv_pool_tokens, speed_check=result.speed_check,
    )  # fmt: skip


def levels_with_caps(levels: list[int], caps: list[int]) -> list[int]:
    """The sweep's levels plus every asked cap (the what-if reads the level at each cap)."""
    return sorted(set(levels) | set(caps))


def recheck_level(caps: list[int]) -> int | None:
    """The level a what-if sweep runs again at its end: the lowest cap asked (None: no what-if).

    Every prediction of that cap is built on that level, and it is run with the cap full.
    """
    return min(caps) if caps else None


def _level_of(base: LevelResult, p: WhatIfPoint) -> LevelResult:
    """A level carrying a predicted point's figures (the base level's other fields kept)."""
    from dataclasses import replace

    return replace(
        base, output_throughput=p.aggregate_tok_s, output_throughput_min=p.aggregate_tok_s,
        output_throughput_max=p.aggregate_tok_s, output_throughput_stdev=0.0,
        per_user_tok_s=p.per_user_tok_s, per_user_tok_s_min=p.per_user_tok_s,
        per_user_tok_s_max=p.per_user_tok_s, mean_ttft_ms=p.ttft_ms,
        steady_output_throughput=None, engine_output_throughput=None, tail_pct=None,
        samples=[], runs=[],
    )  # fmt: skip


def predicted_sweep(base: SweepResult, cap: int, base_label: str) -> SweepResult:
    """A SweepResult for cap `cap` predicted from the sweep `base` (marked in config, warnings)."""
    curve = whatif_of(base, [cap]).caps[0]
    by_c = {lv.max_concurrency: lv for lv in base.levels}
    levels = [
        by_c[p.concurrency] if p.source == "measured" else _level_of(by_c[p.concurrency], p)
        for p in curve.points
    ]
    reading = read_levels(
        levels, slo_tok_s=base.reading.slo_tok_s, knee_gain=base.reading.knee_gain
    )
    queued = [p for p in curve.points if p.queued > 0]
    reading.cap = CapReading(bool(queued), cap if queued else None, len(queued), len(queued), cap)
    untrusted = [p.concurrency for p in curve.points if not p.trusted]
    notes = [f"predicted from the sweep at {base_label} (no restart)"]
    if untrusted:
        notes.append(f"not to be trusted at C={','.join(map(str, untrusted))}")
    return SweepResult(
        base_url=base.base_url, model=base.model, api=base.api, mode=base.mode,
        output_tokens=base.output_tokens, levels=levels, reading=reading,
        config={"predicted_from": base_label, "what_if": curve.to_dict()},
        knobs={**(base.knobs or {}), "max_num_seqs": cap}, started_at=base.started_at,
        finished_at=base.finished_at, metrics_available=True, warnings=notes,
        kv_pool_tokens=base.kv_pool_tokens,
    )  # fmt: skip
