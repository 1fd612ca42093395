"""Inventory: clusters, nodes, SSH settings and the watchdog contract, loaded from YAML and
validated.

Every error names the file, the key (dotted path) and what is allowed. Nothing here connects
anywhere. The model is inventory.model; its loader and validation, inventory.load.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_ops import lazy_exports

if TYPE_CHECKING:  # the names are imported on first use (a command imports what it runs)
    from spark_ops.inventory.load import (
        ENV_VAR,
        EXECUTORS,
        home_path,
        host_problem,
        load_inventory,
        parse_inventory,
    )
    from spark_ops.inventory.model import (
        DEFAULT_WORKER_CHECK,
        HISTORY_FORMATS,
        LOG_KINDS,
        ROLES,
        SHARED_STATE_DIR,
        WATCHDOG_KINDS,
        Cluster,
        EngineSettings,
        Inventory,
        Node,
        RecipeSettings,
        SSHSettings,
        WatchdogProbe,
        WatchdogSettings,
        parse_jump,
    )

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "spark_ops.inventory.load": (
            "ENV_VAR",
            "EXECUTORS",
            "home_path",
            "host_problem",
            "load_inventory",
            "parse_inventory",
        ),
        "spark_ops.inventory.model": (
            "DEFAULT_WORKER_CHECK",
            "HISTORY_FORMATS",
            "LOG_KINDS",
            "ROLES",
            "SHARED_STATE_DIR",
            "WATCHDOG_KINDS",
            "Cluster",
            "EngineSettings",
            "Inventory",
            "Node",
            "RecipeSettings",
            "SSHSettings",
            "WatchdogProbe",
            "WatchdogSettings",
            "parse_jump",
        ),
    },
)

__all__ = [
    "DEFAULT_WORKER_CHECK",
    "ENV_VAR",
    "EXECUTORS",
    "HISTORY_FORMATS",
    "LOG_KINDS",
    "ROLES",
    "SHARED_STATE_DIR",
    "WATCHDOG_KINDS",
    "Cluster",
    "EngineSettings",
    "Inventory",
    "Node",
    "RecipeSettings",
    "SSHSettings",
    "WatchdogProbe",
    "WatchdogSettings",
    "home_path",
    "host_problem",
    "load_inventory",
    "parse_inventory",
    "parse_jump",
]
