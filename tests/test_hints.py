"""Every error says what to do: the hints a new user meets first, and numbers shown for people."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_ops.errors import ConnectError, InventoryError, KnobError
from spark_ops.inventory import load_inventory
from spark_ops.recipe import Change
from spark_ops.sizes import human_bytes, human_count, human_share

FIXTURES = Path(__file__).parent / "fixtures" / "inventory" / "invalid"


def test_set_with_a_dashed_key_names_the_snake_case_key() -> None:
    """`--set max-num-seqs=48`: the defaults key meant, and the option."""
    with pytest.raises(KnobError) as err:
        Change.setting("max-num-seqs", "48")
    assert err.value.hint and "--set max_num_seqs=48" in err.value.hint
    assert "--max-num-seqs 48" in err.value.hint


def test_a_misspelt_moe_backend_says_the_one_meant() -> None:
    """`--moe-backend cutlas`: did you mean cutlass."""
    with pytest.raises(KnobError) as err:
        Change.knob("moe_backend", "cutlas")
    assert err.value.hint and "did you mean --moe-backend cutlass?" in err.value.hint


def test_no_inventory_names_init_and_sim_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No -i, no $SPARK_OPS_INVENTORY, no inventory/cluster.yaml: how to get one."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPARK_OPS_INVENTORY", raising=False)
    with pytest.raises(InventoryError) as err:
        load_inventory(None)
    assert err.value.hint and "spark-ops init --hosts" in err.value.hint
    assert "spark-ops sim up" in err.value.hint


def test_an_unknown_inventory_key_with_did_you_mean() -> None:
    """A misspelt key (budgett) names the key meant and the file."""
    path = FIXTURES / "unknown-key.yaml"
    with pytest.raises(InventoryError) as err:
        load_inventory(path).cluster()
    assert err.value.hint == f"did you mean clusters.c.watchdog.budget? rename the key in {path}"


def test_a_node_down_says_what_to_do() -> None:
    """A connect error's hint (and so its JSON `hint`) points at doctor for that node."""
    error = ConnectError("node3", "cannot connect to 127.0.0.1:1: Connect call failed")
    assert error.hint and "is node3 up" in error.hint and "spark-ops doctor" in error.hint
    assert error.to_dict()["hint"] == error.hint


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        (human_bytes(64424509440), "60 GiB"),
        (human_bytes(1536 * 2**20), "1.5 GiB"),
        (human_bytes(100), "100 B"),
        (human_share(0.00012324985210017747), "<0.1 %"),
        (human_share(0.0), "0 %"),
        (human_share(0.123), "12.3 %"),
        (human_share(1.0), "100 %"),
        (human_count(1.0), "1"),
    ],
)
def test_numbers_for_people(shown: str, expected: str) -> None:
    """Byte counts in GiB, KV usage in %, request gauges without `.0`."""
    assert shown == expected
