"""The remote layer: one SSH connection per node for a whole run, commands with timeouts, atomic
writes, log streaming and tunnels.

Only `spark_ops.remote.connector` imports asyncssh. Every sh program is a RemoteProgram
(remote/program.py: typed arguments, quoted in one place); results and errors are kept per host.
"""

from __future__ import annotations

from spark_ops.remote.connector import (
    Connector,
    HeldProcess,
    Result,
    SSHConnector,
    transient,
)
from spark_ops.remote.program import (
    RemoteProgram,
    check_text,
    quote_args,
    quote_path,
    quote_word,
    sh_program,
)
from spark_ops.remote.session import ClusterSession, FileWrite, WriteOutcome
from spark_ops.remote.shell import (
    engine_log_follow,
    engine_log_last_args,
    engine_log_recent,
    sha256,
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
