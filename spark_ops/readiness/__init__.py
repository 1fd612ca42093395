"""Boot readiness: phases from engine log lines, fail-fast rules, waiting with a deadline, ETA."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_ops import lazy_exports

if TYPE_CHECKING:  # the names are imported on first use (a command imports what it runs)
    from spark_ops.readiness.eta import (
        DEFAULT_STATE_PATH,
        BootHistory,
        estimate,
        eta_seconds,
        history_key,
        record,
        record_failed,
    )
    from spark_ops.readiness.phases import (
        PHASE_ORDER,
        FatalKind,
        LineInfo,
        Phase,
        classify_line,
        parse_args_literal,
        split_prefix,
    )
    from spark_ops.readiness.report import (
        BootEvent,
        BootReport,
        InstanceView,
        exit_line,
        expected_phases,
    )
    from spark_ops.readiness.tracker import BootTracker, Fatal, summarize_boot_log
    from spark_ops.readiness.wait import wait_for_boot

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "spark_ops.readiness.eta": (
            "DEFAULT_STATE_PATH",
            "BootHistory",
            "estimate",
            "eta_seconds",
            "history_key",
            "record",
            "record_failed",
        ),
        "spark_ops.readiness.phases": (
            "PHASE_ORDER",
            "FatalKind",
            "LineInfo",
            "Phase",
            "classify_line",
            "parse_args_literal",
            "split_prefix",
        ),
        "spark_ops.readiness.report": (
            "BootEvent",
            "BootReport",
            "InstanceView",
            "exit_line",
            "expected_phases",
        ),
        "spark_ops.readiness.tracker": ("BootTracker", "Fatal", "summarize_boot_log"),
        "spark_ops.readiness.wait": ("wait_for_boot",),
    },
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
    "record_failed",
    "split_prefix",
    "summarize_boot_log",
    "wait_for_boot",
]
