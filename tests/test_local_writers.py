"""Every local file spark-ops writes goes through the one writer and keeps its promises: temp file
beside the target, file fsynced, renamed, directory fsynced, mode kept, a symlink written through,
nothing left behind. One table of writers, one runner."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from spark_ops.errors import RecipeError, SparkOpsError
from spark_ops.files import sha256_of, write_file
from spark_ops.headlib.atomic import atomic_write
from spark_ops.readiness.eta import BootHistory
from spark_ops.recipe import changes_from_options
from spark_ops.recipe.files import edit_file, write_edit
from spark_ops.workflows.experiment.state import ExperimentError, ExperimentSpec, ExperimentState

GLM = Path(__file__).resolve().parents[1] / "recipes" / "glm-5.3-flash.yaml"


def _experiment(path: Path) -> None:
    """The experiment state file."""
    ExperimentState(ExperimentSpec("c1", {"max_num_seqs": [8]}, {}), {"max_num_seqs": 4}).save(path)


def _boots(path: Path) -> None:
    """The boot-ETA cache."""
    BootHistory(path).record("c1", {"durations": {"weights": 3.0}, "total_s": 3.0})


def _recipe(path: Path) -> None:
    """A `recipe set` edit."""
    landed = edit_file(path, changes_from_options(max_num_seqs="12"))
    write_edit(landed)


def _history(path: Path) -> None:
    """A history append (history.py in-process, as the reference watchdog runs it)."""
    atomic_write(str(path), b"1764400000\n")


WRITERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "experiment-state": (_experiment, '{"x": 1}\n'),
    "boot-eta": (_boots, '{"version": 1, "clusters": {}}\n'),
    "recipe-set": (_recipe, GLM.read_text()),
    "history": (_history, ""),
}


class FsyncSpy:
    """Record what os.fsync was called on: 'dir' or the file's name (the real fsync still runs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Wrap os.fsync."""
        self.calls: list[tuple[str, str]] = []
        real = os.fsync

        def spy(fd: int) -> None:
            """Note the kind and name of fd, then fsync it."""
            kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
            self.calls.append((kind, os.readlink(f"/proc/self/fd/{fd}")))
            real(fd)

        monkeypatch.setattr(os, "fsync", spy)


@pytest.mark.parametrize("name", list(WRITERS))
def test_writer_keeps_the_promises(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a symlink, with mode 0640: the target is replaced, the link kept, fsyncs seen."""
    write, seed = WRITERS[name]
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    real = real_dir / "file"
    real.write_text(seed)
    real.chmod(0o640)
    link = tmp_path / "link"
    link.symlink_to(real)
    spy = FsyncSpy(monkeypatch)
    write(link)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_bytes() != seed.encode()
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    files = [p for k, p in spy.calls if k == "file"]
    dirs = [p for k, p in spy.calls if k == "dir"]
    assert any(os.path.basename(p).startswith(".file.tmp.") for p in files), spy.calls
    assert str(real_dir) in dirs, spy.calls
    leftovers = [p.name for p in real_dir.iterdir() if p.name.startswith(".")]
    assert leftovers == [], leftovers


def test_experiment_state_in_a_new_directory(tmp_path: Path) -> None:
    """The experiment state's directory is made; a JSON document lands whole."""
    path = tmp_path / "a" / "b" / "state.json"
    _experiment(path)
    assert json.loads(path.read_text())["spec"]["cluster"] == "c1"


def test_failure_names_the_file_with_the_callers_error(tmp_path: Path) -> None:
    """A write that cannot happen raises the caller's error naming the file, leaving nothing."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(ExperimentError, match="not-a-dir"):
        ExperimentState(ExperimentSpec("c1", {}, {}), {}).save(blocker / "state.json")
    with pytest.raises(RecipeError, match=r"missing-dir/r\.yaml: not written"):
        write_file(tmp_path / "missing-dir" / "r.yaml", "x", error=RecipeError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-a-dir"]


def test_boot_cache_write_failure_does_not_raise(tmp_path: Path) -> None:
    """The boot-ETA file is a cache: a failed write is logged, the boot is not failed."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    _boots(blocker / "boots.json")
    assert blocker.read_text() == "x"


def test_recipe_changed_meanwhile_is_not_written(tmp_path: Path) -> None:
    """A colleague's edit between reading and writing: refused naming the file, theirs kept."""
    path = tmp_path / "glm.yaml"
    shutil.copy(GLM, path)
    landed = edit_file(path, changes_from_options(max_num_seqs="12"))
    path.write_text(GLM.read_text() + "# a colleague's note\n")
    with pytest.raises(RecipeError, match=r"glm\.yaml: changed since it was read; not written"):
        write_edit(landed)
    assert path.read_text().endswith("# a colleague's note\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["glm.yaml"]


def test_expected_digest_of_an_absent_file(tmp_path: Path) -> None:
    """expect_sha256 'absent' writes only a file that does not exist yet."""
    path = tmp_path / "new.txt"
    assert write_file(path, "one\n", expect_sha256=sha256_of(None)) is None
    with pytest.raises(SparkOpsError, match="changed since it was read"):
        write_file(path, "two\n", expect_sha256=sha256_of(None))
    assert path.read_text() == "one\n"


def test_no_other_local_writer() -> None:
    """Outside headlib/ (the writer) and sim/ (which builds its own fresh tree), no module
    replaces a file by itself, the reference watchdog's (refwatchdog/) included; appending to a
    log is not replacing."""
    repo = Path(__file__).resolve().parents[1]
    calls = ("write_text(", "write_bytes(", "os.replace(", ".rename(", "mkstemp(", "os.link(")
    found = [
        f"{p.relative_to(repo)}: {call}"
        for p in [*(repo / "spark_ops").rglob("*.py"), *(repo / "refwatchdog").rglob("*.py")]
        if p.relative_to(repo).parts[:2] not in (("spark_ops", "headlib"), ("spark_ops", "sim"))
        for call in calls
        if call in p.read_text()
    ]
    assert found == []


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_writer_ended_by_its_session_leaves_no_staged_file(tmp_path: Path, sig: str) -> None:
    """The head program's session dropped mid-write (a SIGTERM or SIGHUP between the staged file
    and the rename, CI stop 39): the target is as it was and no staged file stays beside it."""
    target = tmp_path / "restarts"
    target.write_text("1700000000\n")
    script = (
        "import os, signal, sys\n"
        "from spark_ops.headlib.atomic import atomic_write\n"
        "from spark_ops.headlib.proc import exit_on_hangup\n"
        "exit_on_hangup()\n"
        f"os.fsync = lambda fd: os.kill(os.getpid(), signal.{sig})\n"
        "atomic_write(sys.argv[1], b'new\\n')\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(target)], check=False)
    assert done.returncode == 128 + getattr(signal, sig)
    assert target.read_text() == "1700000000\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["restarts"]
