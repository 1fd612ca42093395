"""A file an operator names that never ends (/dev/zero) is refused past the read limit by the
inventory, fleet and recipe loaders, naming it: never read until memory runs out
(tests/fixtures/yamlsafe/endless.yaml)."""

from __future__ import annotations

import contextlib
import resource
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_ops import errors
from spark_ops.fleet import load_fleet
from spark_ops.inventory import load_inventory
from spark_ops.recipe.files import read_recipe
from spark_ops.workflows.preflight import local_serve_options

CASE: dict[str, Any] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "yamlsafe" / "endless.yaml").read_text("utf-8")
)
LOADERS: dict[str, Callable[[str], object]] = {
    "inventory": load_inventory,
    "fleet": load_fleet,
    "recipe": lambda p: read_recipe(Path(p)),
}


@contextlib.contextmanager
def memory_capped() -> Iterator[None]:
    """At most 4 GiB of address space meanwhile: a reader that does not stop fails, not the host."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (min(4 << 30, hard) if hard > 0 else 4 << 30, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("path", CASE["paths"])
@pytest.mark.parametrize("loader", CASE["loaders"], ids=lambda c: c["name"])
def test_an_endless_file_is_refused(loader: dict[str, str], path: str) -> None:
    """The loader's own error names the path and the limit (memory capped: no reading it all)."""
    if not Path(path).exists():
        pytest.skip(f"no {path} here")
    with memory_capped(), pytest.raises(getattr(errors, loader["error"])) as info:
        LOADERS[loader["name"]](path)
    assert info.value.message.startswith(f"{path}: {CASE['message']}")


@pytest.mark.parametrize("path", CASE["paths"])
def test_an_endless_options_cache_counts_as_not_cached(tmp_path: Path, path: str) -> None:
    """apply's cache of the serve parsers' options linked to an endless file: ignored past its
    limit (the shipped list used), as an unreadable cache is."""
    cache = tmp_path / "options.json"
    cache.symlink_to(path)
    with memory_capped():
        found = local_serve_options("0.32.0", cache=cache)
    assert found is not None and found.method == "shipped"
