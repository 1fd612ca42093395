"""Test ground only: let vLLM's CPU build use Ray (the one part of the Ray tier that is not stock).

vLLM 0.32's CPU platform names no Ray device (`ray_device_key = ""`), so
`--distributed-executor-backend ray` fails with `ValueError: current platform cpu does not support
ray.`. Loaded at start-up through PYTHONPATH (tests/ground/ray.py sets it for `ray start` and
`vllm serve`), this module changes two things once their modules are imported, and nothing else:

- the CPU platform's Ray device key becomes the custom resource `vcpu` (each `ray start` declares
  `--resources '{"vcpu": 1}'`), so the placement group asks one `vcpu` bundle per TP rank;
- a Ray worker's device-id lookup answers `[0]` (Ray has no accelerator ids for a custom resource).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any

DEVICE_KEY = "vcpu"
_PATCHED = ("vllm.platforms.cpu", "vllm.v1.executor.ray_executor_v2", "vllm.v1.executor.ray_utils")


def _node_and_device_ids(self: Any) -> tuple[str, list[int]]:
    """(this Ray node's id, [0]): the one CPU "device" of the worker."""
    import ray

    return ray.get_runtime_context().get_node_id(), [0]


def _patch(name: str, module: Any) -> None:
    """Apply the change that belongs to a freshly executed module."""
    if name == "vllm.platforms.cpu":
        module.CpuPlatform.ray_device_key = DEVICE_KEY
        return
    for cls in ("RayWorkerProc", "RayWorkerWrapper"):
        if hasattr(module, cls):
            getattr(module, cls).get_node_and_physical_gpu_ids = _node_and_device_ids


class _Finder(importlib.abc.MetaPathFinder):
    """Runs _patch right after one of the _PATCHED modules is executed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        """The normal spec, with an exec_module that patches afterwards."""
        if name not in _PATCHED:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            """Execute the module, then patch it."""
            original(module)
            _patch(name, module)

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
