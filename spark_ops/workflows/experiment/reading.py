"""Reading an experiment: pure functions of the configurations' sweep results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spark_ops.bench.sweep import SweepResult

CLEAR_MARGIN = 1.05  # the best configuration at a level must beat the next by 5% to be called best
BOTTLENECK_RATIO = 1.2  # a higher cap giving 20% more aggregate makes the lower cap the limit


@dataclass
class ExperimentReading:
    """Comparison per level (ratios to the first), per-configuration readings, the text."""

    configs: list[dict[str, Any]]
    levels: list[dict[str, Any]]
    bottleneck: dict[str, Any] | None
    recommended: str | None
    slo_tok_s: float | None
    lines: list[str]

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return dict(self.__dict__)


def _users(n: int) -> str:
    """'1 concurrent request' / '64 concurrent requests'."""
    return f"{n} concurrent request{'s' if n != 1 else ''}"


def _config_reading(name: str, r: SweepResult) -> dict[str, Any]:
    """One configuration's knee, SLO concurrency and cap, from its sweep's reading."""
    cap = r.reading.cap
    knob = (r.knobs or {}).get("max_num_seqs")
    return {
        "label": name,
        "max_num_seqs": int(knob) if isinstance(knob, int | str) and str(knob).isdigit() else None,
        "knee": r.reading.knee,
        "knee_gain": r.reading.knee_gain,
        "slo_max_concurrency": r.reading.slo_max_concurrency,
        "slo_text": r.reading.slo_text,
        "metrics": r.metrics_available,
        "cap": cap.to_dict(),
        "cap_is_knob": bool(cap.detected and cap.matches_knob),
        "aggregate": {lv.max_concurrency: lv.output_throughput for lv in r.levels},
        "per_user": {lv.max_concurrency: lv.per_user_tok_s for lv in r.levels},
        "predicted_from": (r.config or {}).get("predicted_from"),
        "untrusted": _untrusted(r),
    }


def _untrusted(r: SweepResult) -> dict[int, str]:
    """A predicted sweep's levels not to be trusted, with why (empty for a measured one)."""
    points = ((r.config or {}).get("what_if") or {}).get("points") or []
    return {
        int(p["concurrency"]): str(p.get("why_not") or "not to be trusted")
        for p in points
        if not p.get("trusted", True)
    }


def _figure(cfg: dict[str, Any], concurrency: int) -> str:
    """'' for a measured figure, ' (predicted)' or ' (predicted, not to be trusted)' otherwise."""
    if not cfg.get("predicted_from"):
        return ""
    return " (predicted, not to be trusted)" if concurrency in cfg["untrusted"] else " (predicted)"


def _doubt(cfg: dict[str, Any], configs: list[dict[str, Any]], top: int) -> str | None:
    """Why a predicted configuration is not to be recommended without --confirm, or None.

    Its figure at the top level is not to be trusted, or it beats what a higher cap measured
    there: a lower cap only holds requests back, so such a prediction is the model's failure.
    """
    if not cfg.get("predicted_from"):
        return None
    mine = cfg["aggregate"].get(top)
    for other in configs:
        theirs = other["aggregate"].get(top)
        if (
            not other.get("predicted_from") and mine is not None and theirs is not None
            and (other["max_num_seqs"] or 0) > (cfg["max_num_seqs"] or 0) and mine > theirs
        ):  # fmt: skip
            return (
                f"its predicted {mine:.0f} tok/s beats the {theirs:.0f} tok/s measured with "
                f"{other['label']} at {_users(top)}, and a lower cap cannot add throughput"
            )
    return cfg["untrusted"].get(top)


def _level_rows(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level: each configuration's figures, ratios to the first one, and the best."""
    levels = sorted({c for cfg in configs for c in cfg["aggregate"]})
    rows = []
    for c in levels:
        first = configs[0]
        cells = []
        for cfg in configs:
            agg, user = cfg["aggregate"].get(c), cfg["per_user"].get(c)
            a0, u0 = first["aggregate"].get(c), first["per_user"].get(c)
            cells.append({
                "label": cfg["label"], "aggregate": agg, "per_user": user, "note": _figure(cfg, c),
                "ratio_aggregate": agg / a0 if agg is not None and a0 else None,
                "ratio_per_user": user / u0 if user is not None and u0 else None,
            })  # fmt: skip
        ranked = sorted(
            (x for x in cells if x["aggregate"] is not None), key=lambda x: -x["aggregate"]
        )
        clear = len(ranked) == 1 or (
            len(ranked) > 1 and ranked[0]["aggregate"] >= CLEAR_MARGIN * ranked[1]["aggregate"]
        )
        best = ranked[0]["label"] if ranked else None
        rows.append({"concurrency": c, "cells": cells, "best": best, "clear": clear})
    return rows


def _bottleneck(configs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first capped configuration that a higher max_num_seqs clearly beat at the top level."""
    for low in configs:
        if not low["cap_is_knob"]:
            continue
        best: dict[str, Any] | None = None
        for high in configs:
            if (high["max_num_seqs"] or 0) <= (low["max_num_seqs"] or 0):
                continue
            common = set(low["aggregate"]) & set(high["aggregate"])
            if not common:
                continue
            top = max(common)
            before, after = low["aggregate"][top], high["aggregate"][top]
            ratio = after / before if before else None
            if ratio is not None and (best is None or ratio > best["ratio"]):
                best = {
                    "capped": low["label"], "knob": low["max_num_seqs"], "higher": high["label"],
                    "level": top, "before": before, "after": after, "ratio": ratio,
                    "cap": low["cap"],
                }  # fmt: skip
        if best is not None:
            best["is_bottleneck"] = best["ratio"] >= BOTTLENECK_RATIO
            best["predicted"] = bool(low.get("predicted_from"))
            return best
    return None


def _level_lines(rows: list[dict[str, Any]], first: str) -> list[str]:
    """Which configuration is best at each level, in words."""
    lines = []
    for row in rows:
        if row["best"] is None:
            continue
        cell = next(x for x in row["cells"] if x["label"] == row["best"])
        at = f"At {_users(row['concurrency'])}"
        if not row["clear"]:
            top = cell["aggregate"]
            near = [x for x in row["cells"] if x["aggregate"] is not None
                    and x["aggregate"] * CLEAR_MARGIN >= top]  # fmt: skip
            below = [x for x in row["cells"] if x["aggregate"] is not None and x not in near]
            text = f"{at}: no clear difference"
            text += (
                f" (all within {CLEAR_MARGIN - 1:.0%} of {top:.0f} tok/s)."
                if not below
                else f" between {', '.join(x['label'] for x in near)} (within "
                f"{CLEAR_MARGIN - 1:.0%} of {top:.0f} tok/s); "
                + ", ".join(f"{x['label']} gives {x['aggregate']:.0f}{x['note']}" for x in below)
                + "."
            )
            lines.append(text)
            continue
        ratio = cell["ratio_aggregate"]
        vs = f", {ratio:.2f}x {first}" if row["best"] != first and ratio else ""
        lines.append(
            f"{at}: {row['best']} is best, {cell['aggregate']:.0f} tok/s aggregate"
            f"{cell['note']}{vs}."
        )
    return lines


def _cap_line(cfg: dict[str, Any]) -> str:
    """Whether max_num_seqs capped one configuration, in words."""
    cap, name = cfg["cap"], cfg["label"]
    if cfg.get("predicted_from"):
        return f"{name}: predicted from the sweep at {cfg['predicted_from']} (no restart)."
    if not cfg["metrics"]:
        return f"{name}: cap unknown (the engine's /metrics was not readable)."
    if cfg["cap_is_knob"]:
        return (
            f"{name}: the cap was reached — running requests stayed at {cap['plateau']} while "
            f"others waited ({cap['at_plateau']} of {cap['waiting_samples']} samples)."
        )
    if cap["detected"]:
        return (
            f"{name}: running requests plateaued at {cap['plateau']} while others waited, below "
            f"max_num_seqs={cfg['max_num_seqs']}: another limit (KV cache?) holds them back."
        )
    return f"{name}: the cap was not reached (no requests waited behind a full batch)."


def _bottleneck_line(neck: dict[str, Any]) -> str:
    """The verdict on a capped configuration against a higher cap."""
    at = f"{_users(neck['level'])} ({neck['before']:.0f} → {neck['after']:.0f} tok/s)"
    if neck.get("predicted"):
        return (
            f"The cap of {neck['knob']} would be the bottleneck (predicted, not measured): "
            f"{neck['higher']} gave {neck['ratio']:.1f}x the aggregate throughput predicted for "
            f"{neck['capped']} at {at}."
            if neck["is_bottleneck"]
            else f"The cap of {neck['knob']} (predicted, not measured): {neck['higher']} gave "
            f"{neck['ratio']:.2f}x the aggregate predicted for it at {at}."
        )
    if neck["is_bottleneck"]:
        return (
            f"The cap of {neck['knob']} was the bottleneck: with {neck['capped']} the engine ran "
            f"{neck['cap']['plateau']} requests at a time while the rest waited, and "
            f"{neck['higher']} gave {neck['ratio']:.1f}x the aggregate throughput at {at}."
        )
    return (
        f"The cap of {neck['knob']} was reached, but {neck['higher']} gained only "
        f"{neck['ratio']:.2f}x at {at}: the cap is not what limits throughput here."
    )


def _recommendation(
    rec: dict[str, Any], top: int, n: int, slo: float | None, doubt: str | None
) -> str:
    """The configuration to keep, the concurrency for the per-user SLO, and the knee."""
    text = f"Recommendation: {rec['label']}"
    if rec.get("predicted_from"):
        text += (
            f", predicted from the sweep at {rec['predicted_from']}, not measured (highest "
            f"predicted aggregate at {_users(top)})."
        )
        if doubt:
            text += f" The prediction is not to be trusted ({doubt}): --confirm measures it now."
    else:
        text += f" (highest aggregate at {_users(top)})." if n > 1 else "."
    if slo is not None and rec["slo_max_concurrency"] is not None:
        text += (
            f" For interactive use keep ≤{rec['slo_max_concurrency']} concurrent users to give "
            f"each ≥{slo:g} tok/s."
        )
    elif slo is not None:
        text += f" No level measured gives ≥{slo:g} tok/s per user with it."
    levels = sorted(rec["aggregate"])
    if rec["knee"] is not None and levels.index(rec["knee"]) > 0:
        prev = levels[levels.index(rec["knee"]) - 1]
        text += (
            f" The aggregate flattens at {rec['knee']} (under {rec['knee_gain']:.0%} more than at "
            f"{prev}): batch work gains little beyond {prev} concurrent requests."
        )
    elif len(levels) > 1:
        gain = rec["aggregate"][levels[-1]] / rec["aggregate"][levels[-2]] - 1
        text += (
            f" The aggregate still grew {gain:+.0%} from {levels[-2]} to {levels[-1]}: batch work "
            f"can go to {levels[-1]} concurrent requests (no saturation knee measured)."
        )
    return text


def _recommended(configs: list[dict[str, Any]], top: int, confirm: bool) -> dict[str, Any]:
    """Highest aggregate at the top level; within CLEAR_MARGIN of it, the highest cap wins.

    Configurations that close are not told apart by a sweep (noise), and the higher cap admits
    more requests at once: so a noisy tie is decided the same way in every run. A prediction in
    doubt (_doubt) is left out unless `confirm` (the run then measures it before relying on it).
    """
    everyone = configs
    configs = [c for c in everyone if confirm or _doubt(c, everyone, top) is None] or everyone
    best = max(c["aggregate"].get(top) or 0.0 for c in configs)
    close = [c for c in configs if (c["aggregate"].get(top) or 0.0) * CLEAR_MARGIN >= best]
    return max(close, key=lambda c: (c["max_num_seqs"] or 0, c["aggregate"].get(top) or 0.0))


def _passed_over(configs: list[dict[str, Any]], rec: dict[str, Any], top: int) -> list[str]:
    """A sentence for each prediction in doubt that the recommendation passed over."""
    lines = []
    best = rec["aggregate"].get(top) or 0.0
    for cfg in configs:
        doubt = _doubt(cfg, configs, top)
        if cfg is rec or doubt is None or (cfg["aggregate"].get(top) or 0.0) <= best:
            continue
        lines.append(
            f"Not recommended: {cfg['label']}, predicted {cfg['aggregate'][top]:.0f} tok/s at "
            f"{_users(top)}, not measured; the prediction is not to be trusted ({doubt}). "
            "experiment --confirm measures it."
        )
    return lines


def read_experiment(
    results: list[tuple[str, SweepResult]], *, slo_tok_s: float | None = None,
    confirm: bool = False, partial: str | None = None,
) -> ExperimentReading:  # fmt: skip
    """The verdict first (bottleneck, recommendation), then the best per level and each cap.

    A predicted configuration in doubt is recommended only with `confirm` (which measures it).
    `partial` (why the reading is not whole: a configuration not measured, a level lost) means no
    recommendation at all: one from part of the configurations would be a guess.
    """
    configs = [_config_reading(name, r) for name, r in results]
    if not configs:
        return ExperimentReading([], [], None, None, slo_tok_s, ["No configuration was measured."])
    rows = _level_rows(configs)
    top = rows[-1]["concurrency"]
    measured = [c for c in configs if c["aggregate"].get(top) is not None] or configs
    neck = _bottleneck(configs)
    lines = [_bottleneck_line(neck)] if neck is not None else []
    if partial is not None:
        lines.append(f"No recommendation: the reading is partial ({partial}).")
        lines += _level_lines(rows, configs[0]["label"]) if len(configs) > 1 else []
        lines += [_cap_line(cfg) for cfg in configs]
        return ExperimentReading(configs, rows, neck, None, slo_tok_s, lines)
    rec = _recommended(measured, top, confirm)
    lines.append(_recommendation(rec, top, len(configs), slo_tok_s, _doubt(rec, configs, top)))
    lines += _passed_over(configs, rec, top)
    if len(configs) > 1:
        lines += _level_lines(rows, configs[0]["label"])
    lines += [_cap_line(cfg) for cfg in configs]
    return ExperimentReading(configs, rows, neck, rec["label"], slo_tok_s, lines)
