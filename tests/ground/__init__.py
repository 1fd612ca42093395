"""The real test ground: OpenSSH sshd nodes on loopback, vLLM's CPU build, real Ray in two netns."""

from __future__ import annotations

from spark_ops.errors import SparkOpsError


class GroundError(SparkOpsError):
    """A piece of the test ground (sshd, user, vLLM server) could not be set up or stopped."""


class GroundUnavailable(GroundError):
    """The ground cannot run here (not root, sshd, the vLLM venv or Ray missing); tests skip."""
