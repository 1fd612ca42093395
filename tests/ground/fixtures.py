"""pytest fixtures of the real test ground; import them in tests/conftest.py.

from ground.fixtures import node_daemons, openssh_cluster, real_ray, real_vllm  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from . import GroundError, GroundUnavailable
from .docker import docker_unavailable_reason
from .dockerd import NodeDaemons
from .ray import RayCluster, ray_cluster
from .sshd import SshdCluster, start_sshd_nodes
from .vllm import VllmFactory, VllmServer, vllm_unavailable_reason

OPENSSH_NODES = 4


@contextmanager
def sshd_nodes(n: int, workdir: Path, **kw: Any) -> Iterator[SshdCluster]:
    """n sshd nodes for one test (start_sshd_nodes options); skips where sshd cannot run."""
    try:
        cluster = start_sshd_nodes(n, workdir, **kw)
    except GroundUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def openssh_cluster(tmp_path: Path) -> Iterator[SshdCluster]:
    """Four real sshd nodes (node1..node4) on 127.0.0.1, each with own user, HOME, host key."""
    with sshd_nodes(OPENSSH_NODES, tmp_path / "openssh") as cluster:
        yield cluster


@pytest.fixture
def real_vllm_factory(tmp_path: Path) -> Iterator[VllmFactory]:
    """Boots real vLLM CPU servers (`.start(model, max_num_seqs=…)`); all stopped after."""
    reason = vllm_unavailable_reason()
    if reason:
        pytest.skip(reason)
    factory = VllmFactory(tmp_path / "vllm")
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def real_vllm(real_vllm_factory: VllmFactory) -> VllmServer:
    """A real vLLM CPU server of tiny-llama (`--max-num-seqs 6`), booted and answering."""
    return real_vllm_factory.start("tiny-llama", max_num_seqs=6)


@pytest.fixture
def real_ray(tmp_path: Path) -> Iterator[RayCluster]:
    """A real two-node Ray cluster (head 198.18.0.1, worker 198.18.0.2, one namespace each).

    Stopped and cleaned (processes, namespaces, psm_* segments, temp dirs) after the test, even
    when it fails; skipped with the reason where namespaces or Ray are missing.
    """
    try:
        with ray_cluster(tmp_path / "ray") as cluster:
            yield cluster
    except GroundUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def node_daemons() -> Iterator[NodeDaemons]:
    """One real dockerd per simulated node (node1..node4), the ground image in each; started once
    per session, and only these daemons (and their containers) are stopped afterwards."""
    reason = docker_unavailable_reason()
    if reason:
        pytest.skip(reason)
    try:
        daemons = NodeDaemons([f"node{i}" for i in range(1, OPENSSH_NODES + 1)]).start()
    except GroundError as exc:
        pytest.skip(f"no Docker daemon per node here: {exc}")
    try:
        yield daemons
    finally:
        daemons.stop()
