"""The remote layer: one SSH connection per node for a whole run, commands with timeouts, atomic
writes, log streaming and tunnels.

Only `spark_ops.remote.connector` imports asyncssh. Every sh program is a RemoteProgram
(remote/program.py: typed arguments, quoted in one place); results and errors are kept per host.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_ops import lazy_exports

if TYPE_CHECKING:  # the names are imported on first use (a command imports what it runs)
    from spark_ops.remote.connector import SSHConnector, transient
    from spark_ops.remote.program import (
        RemoteProgram,
        check_text,
        sh_program,
    )
    from spark_ops.remote.quoting import quote_args, quote_path, quote_word
    from spark_ops.remote.session import ClusterSession
    from spark_ops.remote.shell import (
        engine_log_follow,
        engine_log_last_args,
        engine_log_recent,
        sha256,
    )
    from spark_ops.remote.transport import Connector, HeldProcess, Result
    from spark_ops.remote.writes import FileWrite, WriteOutcome

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "spark_ops.remote.connector": ("SSHConnector", "transient"),
        "spark_ops.remote.program": (
            "RemoteProgram",
            "check_text",
            "sh_program",
        ),
        "spark_ops.remote.quoting": ("quote_args", "quote_path", "quote_word"),
        "spark_ops.remote.session": ("ClusterSession",),
        "spark_ops.remote.shell": (
            "engine_log_follow",
            "engine_log_last_args",
            "engine_log_recent",
            "sha256",
        ),
        "spark_ops.remote.transport": ("Connector", "HeldProcess", "Result"),
        "spark_ops.remote.writes": ("FileWrite", "WriteOutcome"),
    },
)


__all__ = [
    "ClusterSession",
    "Connector",
    "FileWrite",
    "HeldProcess",
    "RemoteProgram",
    "Result",
    "SSHConnector",
    "WriteOutcome",
    "check_text",
    "engine_log_follow",
    "engine_log_last_args",
    "engine_log_recent",
    "quote_args",
    "quote_path",
    "quote_word",
    "sh_program",
    "sha256",
    "transient",
]
