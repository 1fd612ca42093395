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


def test_post_boot_gpu_process_check_on_an_idle_gpu(tmp_path: Path) -> None:
    """spark-ops' post-boot GPU process program on a node whose GPU runs no compute app: exit 0,
    an empty list (it used to end with the status of its loop's last test, 1)."""
    import os

    from spark_ops.remote import sh_program
    from spark_ops.remote.programs.engine import GPU_APPS_SH

    install(tmp_path)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    proc = subprocess.run(
        ["bash", "-c", sh_program(GPU_APPS_SH)], env=env, capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stdout) == (0, "\n---\n"), proc.stderr
