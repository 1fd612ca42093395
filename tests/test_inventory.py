"""Inventory loading: each case in tests/fixtures/inventory/ states its expectation on line 1."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spark_ops.errors import InventoryError
from spark_ops.inventory import load_inventory, parse_inventory, parse_jump

CASES = Path(__file__).parent / "fixtures" / "inventory"


def _expect(path: Path) -> str:
    """The text after '# expect:' on the case's first line."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect:"), f"{path} must start with '# expect: ...'"
    return first.split(":", 1)[1].strip()


def _summary(path: Path) -> str:
    """Describe the chosen cluster the way valid cases state it."""
    c = load_inventory(path).cluster()
    return (
        f"cluster={c.name} nodes={len(c.nodes)} head={c.head.name} tp={c.tensor_parallel} "
        f"recipe_nodes={','.join(c.recipe.nodes)} "
        f"budget={c.watchdog.max_restarts}/{c.watchdog.window_s} log={c.engine.log_kind} "
        f"api_tunnel={c.engine.tunnel}"
    )


@pytest.mark.parametrize("path", sorted((CASES / "valid").glob("*.yaml")), ids=lambda p: p.stem)
def test_valid(path: Path) -> None:
    """A valid inventory loads into the expected shape."""
    assert _summary(path) == _expect(path)


@pytest.mark.parametrize("path", sorted((CASES / "invalid").glob("*.yaml")), ids=lambda p: p.stem)
def test_invalid(path: Path) -> None:
    """An invalid inventory is refused with a message naming the file and the key."""
    with pytest.raises(InventoryError) as err:
        load_inventory(path).cluster()
    assert _expect(path) in err.value.message
    assert str(path) in err.value.message


def test_env_var_and_missing_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SPARK_OPS_INVENTORY picks the file; a missing file is named in the error."""
    src = CASES / "valid" / "four-nodes.yaml"
    monkeypatch.setenv("SPARK_OPS_INVENTORY", str(src))
    assert load_inventory().cluster().name == "spark"
    with pytest.raises(InventoryError, match=r"nope\.yaml: cannot read inventory"):
        load_inventory(tmp_path / "nope.yaml")


def test_several_clusters_need_a_choice() -> None:
    """With two clusters and no default, the error lists them."""
    text = (CASES / "valid" / "eight-nodes-two-clusters.yaml").read_text()
    inv = parse_inventory(text.replace("default_cluster: big\n", ""), "two.yaml")
    with pytest.raises(InventoryError, match=r"holds clusters \['big', 'small'\]"):
        inv.cluster()
    assert inv.cluster("small").head.name == "s1"
    assert inv.cluster("big").node("n8").sudo is True
    assert inv.cluster("big").node("n8").port == 2200


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("bastion", (None, "bastion", 22)),
        ("ops@bastion", ("ops", "bastion", 22)),
        ("ops@bastion.example:2222", ("ops", "bastion.example", 2222)),
        ("[fd00::1]:2200", (None, "fd00::1", 2200)),
        ("ops@[fd00::1]", ("ops", "fd00::1", 22)),
        ("bastion:ssh", "port 'ssh' is not a number"),
        ("bastion:70000", "port '70000' is not a number"),
        ("@bastion", "the user before @ is empty"),
        ("fd00::1", "expected [user@]host[:port]"),
        ("[fd00::1", "an IPv6 jump host is written"),
        ("ops bastion", "expected [user@]host[:port]"),
    ],
)
def test_jump_host_forms(value: str, expected: tuple[str | None, str, int] | str) -> None:
    """ssh.jump is [user@]host[:port]; anything else is refused with the accepted form."""
    if isinstance(expected, tuple):
        assert parse_jump(value) == expected
    else:
        with pytest.raises(ValueError, match=re.escape(expected)):
            parse_jump(value)


@pytest.mark.parametrize(
    "path", sorted((Path(__file__).parents[1] / "inventory").glob("*.yaml")), ids=lambda p: p.name
)
def test_shipped_inventories_load(path: Path) -> None:
    """The inventories shipped in inventory/ (what operators copy) are valid."""
    inv = load_inventory(path)
    assert inv.clusters
    for name in inv.clusters:
        assert inv.cluster(name).head.role == "head"


@pytest.mark.parametrize(
    ("text", "same_value_ok", "refused"),  # same_value_ok: a recipe (scalar_last_wins too)
    [
        ("a: 1\nb: 2\na: 1\n", False, "line 3: key 'a' is written twice"),
        ("x: {a: 1, a: 2}\n", False, "line 1: key 'a' is written twice"),
        ("d: &d {a: 1}\ne:\n  <<: *d\n  a: 2\n", False, None),  # a merge is overridden, not twice
        ("x: &x {a: 1}\ny: &y {a: 2}\nz: {<<: *x, <<: *y}\n", False, "line 3: key '<<' is"),
        ("container: v\nenv: {}\ncontainer: v\n", True, None),  # a recipe's word-for-word repeat
        ("defaults: {n: 1}\ndefaults: {n: 2}\n", True, "line 2: key 'defaults' is written twice"),
        ("env: {A: '1', A: '2'}\ncontainer: a\ncontainer: b\n", True, None),  # as launchers read
        ("env: {A: '1'}\nenv: [A]\n", True, "line 2: key 'env' is written twice"),
    ],
)
def test_yaml_key_twice(text: str, same_value_ok: bool, refused: str | None) -> None:
    """The one YAML loader refuses a key written twice (the last would silently win)."""
    from spark_ops.yamlsafe import load_yaml

    if refused is None:
        load_yaml(
            text, source="f.yaml", error=InventoryError, same_value_ok=same_value_ok,
            scalar_last_wins=same_value_ok,
        )  # fmt: skip
        return
    with pytest.raises(InventoryError, match=re.escape(f"f.yaml: {refused}")):
        load_yaml(
            text, source="f.yaml", error=InventoryError, same_value_ok=same_value_ok,
            scalar_last_wins=same_value_ok,
        )  # fmt: skip
