"""`init`: write an inventory from the cluster you already run, never guessing silently.

From a host list (first = head) or the community launch setup's `.env` on the head, connect, then
look on the head for the recipe, the watchdog (reference `spark-watchdog` config or a bash watchdog
and its history), the engine's log (docker container, systemd unit or file) and API (through a
tunnel). Everything found is written with where it came from; everything not found is left as a `#
TODO(spark-ops init): …` line and reported. Nothing is written on the nodes.
"""

from __future__ import annotations

from spark_ops.discover.flow import discover
from spark_ops.discover.options import (
    BASH_WATCHDOGS,
    DOCKER_CONTAINER,
    HISTORY_GLOBS,
    LOG_FILES,
    NAME_RE,
    RECIPE_DIRS,
    TODO,
    WATCHDOG_CONFIG,
    WATCHDOG_STATE,
    Finding,
    InitOptions,
    InitResult,
    NodeSpec,
    parse_env_file,
    parse_hosts,
)
from spark_ops.discover.probe import Discovery
from spark_ops.discover.render import check_output, render_inventory, write_inventory

__all__ = [
    "BASH_WATCHDOGS",
    "DOCKER_CONTAINER",
    "HISTORY_GLOBS",
    "LOG_FILES",
    "NAME_RE",
    "RECIPE_DIRS",
    "TODO",
    "WATCHDOG_CONFIG",
    "WATCHDOG_STATE",
    "Discovery",
    "Finding",
    "InitOptions",
    "InitResult",
    "NodeSpec",
    "check_output",
    "discover",
    "parse_env_file",
    "parse_hosts",
    "render_inventory",
    "write_inventory",
]
