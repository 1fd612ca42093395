"""One size parser for vLLM's human-readable ints, one table: the parser itself, the recipe's
`--kv-cache-memory` rules on top of it, the simulated vLLM's command line, and real vLLM."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from ground.vllm import VENV

from spark_ops.errors import ExitStatus, KnobError
from spark_ops.recipe import parse_kv_cache_memory
from spark_ops.sim.engine_args import build_parser
from spark_ops.sim.engine_config import load_config
from spark_ops.sizes import parse_human_int

CASES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "fixtures" / "sizes" / "cases.yaml").read_text()
)
IDS = [repr(c["text"]) for c in CASES]
SIM_CFG = load_config(Path(__file__).parent / "fixtures" / "sim" / "fast.yaml")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_parser_reads_as_vllm(case: dict[str, Any]) -> None:
    """parse_human_int gives vLLM's value, or a ValueError naming the text when vLLM refuses."""
    if case["vllm"] is None:
        with pytest.raises(ValueError, match="invalid value"):
            parse_human_int(case["text"])
    else:
        assert parse_human_int(case["text"]) == case["vllm"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_simulated_vllm_reads_the_same(
    case: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """The simulated `vllm serve` parses --kv-cache-memory-bytes with the same parser."""
    parser = build_parser(SIM_CFG)
    argv = ["m", f"--kv-cache-memory-bytes={case['text']}"]
    if case["vllm"] is None:
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
        assert "invalid value" in capsys.readouterr().err
    else:
        assert parser.parse_args(argv).kv_cache_memory_bytes == case["vllm"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_recipe_knob(case: dict[str, Any]) -> None:
    """--kv-cache-memory takes vLLM's value in the plain form, or refuses naming the forms."""
    want = case["spark_ops"]
    if isinstance(want, int):
        assert parse_kv_cache_memory(case["text"]) == want == case["vllm"]
        return
    with pytest.raises(KnobError, match=want.replace("(", r"\(")) as info:
        parse_kv_cache_memory(case["text"])
    assert info.value.exit_status == ExitStatus.RECIPE and len(info.value.message) < 500
    if "60G = " in want:
        assert repr(case["text"].strip()) in info.value.message or not case["text"].strip()


VLLM_PY = VENV / "bin" / "python"
ORACLE = """
import json, sys
from vllm.utils.argparse_utils import human_readable_int
out = []
for text in json.load(sys.stdin):
    try:
        out.append(human_readable_int(text))
    except Exception:
        out.append(None)
print(json.dumps(out))
"""


@pytest.mark.realvllm
@pytest.mark.skipif(not VLLM_PY.exists(), reason=f"vLLM's CPU build not installed at {VENV}")
def test_real_vllm_agrees_with_the_table() -> None:
    """vLLM's own human_readable_int gives the table's `vllm` column for every text."""
    texts = [c["text"] for c in CASES]
    proc = subprocess.run(
        [str(VLLM_PY), "-c", ORACLE],
        input=json.dumps(texts), capture_output=True, text=True, timeout=240,
        env={"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    if proc.returncode != 0 and "No module named 'vllm.utils.argparse_utils'" in proc.stderr:
        pytest.skip("this vLLM keeps human_readable_int elsewhere")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert dict(zip(texts, got, strict=True)) == {c["text"]: c["vllm"] for c in CASES}
