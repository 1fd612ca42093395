"""The remote layer: one SSH connection per node for a whole run, commands with timeouts, atomic
writes, log streaming and tunnels.

Only `spark_ops.remote.connector` imports asyncssh. Everything is built from quoted arguments;
results and errors are kept per host.
"""

from __future__ import annotations

from spark_ops.remote.connector import (
    Connector,
    HeldProcess,
    Result,
    SSHConnector,
    transient,
)
from spark_ops.remote.session import ClusterSession, FileWrite, WriteOutcome
from spark_ops.remote.shell import (
    check_text,
    engine_log_follow,
    engine_log_recent,
    quote_args,
    quote_path,
    sh_program,
    sha256,
)

__all__ = [
    "ClusterSession",
    "Connector",
    "FileWrite",
    "HeldProcess",
    "Result",
    "SSHConnector",
    "WriteOutcome",
    "check_text",
    "engine_log_follow",
    "engine_log_recent",
    "quote_args",
    "quote_path",
    "sh_program",
    "sha256",
    "transient",
]
