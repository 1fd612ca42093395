"""The simulated GB10 `nvidia-smi` answers as tests/fixtures/sim/nvidia_smi.yaml says."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from spark_ops.sim.nvidia_smi import install

CASES = yaml.safe_load((Path(__file__).parent / "fixtures" / "sim" / "nvidia_smi.yaml").read_text())


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c["argv"]) for c in CASES])
def test_nvidia_smi(case: dict, tmp_path: Path) -> None:
    """The installed program (as a node runs it) prints the case's output and exit status."""
    tool = install(tmp_path)
    proc = subprocess.run([str(tool), *case["argv"]], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (case["rc"], case["out"]), proc.stderr
    if case["rc"] != 0:
        assert proc.stderr.strip(), "a refusal says why"
