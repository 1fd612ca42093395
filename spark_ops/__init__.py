"""spark-ops: operate a vLLM serving cluster of DGX Spark nodes safely."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

__version__ = "0.1.0"


def lazy_exports(
    package: str, exports: dict[str, tuple[str, ...]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's __getattr__ and __dir__ that import a name's module on first use.

    `exports` maps each submodule to the names the package re-exports from it (PEP 562): a
    command imports only the modules it uses, not every sibling of one (docs/performance.md).
    """
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        """Import the module that defines name; keep the name on the package."""
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        """The package's own names and the exported ones."""
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
