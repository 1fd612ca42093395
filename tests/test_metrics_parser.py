"""One Prometheus text parser (engine/metrics.py), checked with every consumer on one table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops.bench.metrics import WANTED
from spark_ops.engine.api import EngineSnapshot
from spark_ops.engine.metrics import kv_pool_tokens, metric_labels, metric_sums
from spark_ops.verify.parse import parse_cache_config_info

HERE = Path(__file__).parent / "fixtures" / "engine" / "metrics"
CASES: list[dict[str, Any]] = yaml.safe_load((HERE / "cases.yaml").read_text())


def page_of(case: dict[str, Any]) -> str:
    """The case's page text."""
    return (HERE / case["file"]).read_text() if "file" in case else str(case["page"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_metrics_case(case: dict[str, Any]) -> None:
    """Sums, labels, pool and snapshot as the table says, from every consumer."""
    text = page_of(case)
    if "sums" in case:
        assert metric_sums(text, case.get("names")) == case["sums"]
        wanted = {k: v for k, v in case["sums"].items() if k in WANTED}
        if case.get("names") is None or set(case["names"]) <= set(WANTED):
            assert metric_sums(text, WANTED) == wanted  # what bench's scraper reads
    if "labels" in case:
        want = case["labels"]  # at least these labels ({}: none); verify's reading agrees
        for got in (metric_labels(text, case["labels_of"]), parse_cache_config_info(text)):
            assert {k: got.get(k) for k in want} == want if want else got == {}
    if "pool" in case:
        assert kv_pool_tokens(text) == case["pool"]
        assert EngineSnapshot.from_metrics(text).kv_tokens == case["pool"]  # the engine client's
    if "kv_memory" in case:
        assert EngineSnapshot.from_metrics(text).kv_memory_bytes == case["kv_memory"]
    if "snapshot" in case:
        snap = EngineSnapshot.from_metrics(text).to_dict()
        for key, value in case["snapshot"].items():
            assert snap[key] == value, key


def test_no_other_prometheus_parser() -> None:
    """No module but engine/metrics.py reads Prometheus text itself."""
    root = Path(__file__).resolve().parents[1] / "spark_ops"
    offenders = []
    for path in [*root.rglob("*.py"), *(root.parent / "refwatchdog").rglob("*.py")]:
        if path.name == "metrics.py" and path.parent.name == "engine":
            continue
        text = path.read_text()
        if "text_string_to_metric_families" in text or 'startswith("vllm:' in text:
            offenders.append(str(path.relative_to(root.parent)))
    assert offenders == []
