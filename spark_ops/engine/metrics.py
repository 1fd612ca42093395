"""vLLM's /metrics page, read with the Prometheus client library's own text parser: spark-ops' one
Prometheus parser (engine/api, bench and verify all call it).

A page that the library refuses whole (a truncated scrape, a proxy's junk line) is read line by
line with the same parser: the samples it can read are kept, the lines it cannot are skipped and
counted, so one bad line does not blind a drain or a sweep.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from spark_ops.log import get_logger

CACHE_CONFIG_INFO = "vllm:cache_config_info"


@dataclass(frozen=True)
class MetricSample:
    """One Prometheus sample: its name as exposed (e.g. `…_total`), labels, value."""

    name: str
    labels: dict[str, str]
    value: float


def _samples(text: str) -> list[MetricSample]:
    """Every sample of a well-formed page (ValueError when the library refuses it)."""
    # imported here: prometheus_client's package import costs tens of ms, paid only when a page
    # is read (as for asyncssh, aiohttp, rich and yaml, the CLI's start must not pay it)
    from prometheus_client.parser import text_string_to_metric_families

    return [
        MetricSample(s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def parse_metrics(text: str, names: Iterable[str] | None = None) -> list[MetricSample]:
    """Parse Prometheus text exposition into samples, in page order; unreadable lines skipped.

    With names, only lines that may hold those metrics reach the parser (and only their samples
    are returned): a page with several engines' histograms is large, and the parser is not fast.
    """
    if names is not None:
        wanted = set(names)
        return [s for s in parse_metrics(_lines_of(text, wanted)) if s.name in wanted]
    try:
        return _samples(text)
    except ValueError:
        pass
    out: list[MetricSample] = []
    skipped = 0
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            out.extend(_samples(line + "\n"))
        except ValueError:
            skipped += 1
    if skipped:
        get_logger(op="metrics").warning("metrics_lines_unreadable", skipped=skipped)
    return out


def _lines_of(text: str, names: set[str]) -> str:
    """Only the sample lines that may belong to names (their name is a prefix of the line)."""
    prefixes = tuple(names)
    return "".join(line + "\n" for line in text.splitlines() if line.startswith(prefixes))


def metric_sums(text: str, names: Iterable[str] | None = None) -> dict[str, float]:
    """Sum each metric over its label sets (engines add up); only `names` if given, absent left out.

    NaN samples (a gauge with no value yet) are left out of the sum.
    """
    out: dict[str, float] = {}
    for s in parse_metrics(text, names):
        if not math.isnan(s.value):
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def metric_labels(text: str, name: str) -> dict[str, str]:
    """The labels of the first sample of `name` (an `_info` gauge's values); {} when absent."""
    for s in parse_metrics(text, (name,)):
        return s.labels
    return {}


def pool_tokens(cache_config: dict[str, str]) -> int | None:
    """The KV pool in tokens from `vllm:cache_config_info` labels (num_gpu_blocks x block_size)."""
    try:
        return int(cache_config["num_gpu_blocks"]) * int(cache_config["block_size"])
    except (KeyError, ValueError):
        pass
    try:
        return int(cache_config["kv_cache_size_tokens"])
    except (KeyError, ValueError):
        return None


def kv_pool_tokens(text: str) -> int | None:
    """The KV pool in tokens of a /metrics page, or None when it does not say."""
    return pool_tokens(metric_labels(text, CACHE_CONFIG_INFO))
