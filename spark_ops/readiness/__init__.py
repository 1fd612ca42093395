"""Boot readiness: phases from engine log lines, fail-fast rules, waiting with a deadline, ETA."""

from __future__ import annotations

from spark_ops.readiness.eta import (
    DEFAULT_STATE_PATH,
    BootHistory,
    estimate,
    eta_seconds,
    history_key,
    record,
)
from spark_ops.readiness.phases import (
    PHASE_ORDER,
    BootTracker,
    Fatal,
    FatalKind,
    LineInfo,
    Phase,
    classify_line,
    parse_args_literal,
    split_prefix,
    summarize_boot_log,
)
from spark_ops.readiness.wait import (
    BootEvent,
    BootReport,
    InstanceView,
    exit_line,
    expected_phases,
    wait_for_boot,
)

__all__ = [
    "DEFAULT_STATE_PATH",
    "PHASE_ORDER",
    "BootEvent",
    "BootHistory",
    "BootReport",
    "BootTracker",
    "Fatal",
    "FatalKind",
    "InstanceView",
    "LineInfo",
    "Phase",
    "classify_line",
    "estimate",
    "eta_seconds",
    "exit_line",
    "expected_phases",
    "history_key",
    "parse_args_literal",
    "record",
    "split_prefix",
    "summarize_boot_log",
    "wait_for_boot",
]
