"""The one backup naming and rotation rule, in its two renderings: headlib/backup.py's Python (the
local writer) and remote/shell.py's sh (the remote writer), run on the same names and files."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from spark_ops.headlib import backup
from spark_ops.remote import sh_program
from spark_ops.remote.shell import COMMIT_SH, COMMON_SH, STAGE_SH, sha256

TABLE = json.loads((Path(__file__).parent / "fixtures" / "backups" / "names.json").read_text())
CASES: list[dict[str, Any]] = TABLE["cases"]


def sh_ours(path: Path, names: list[str]) -> list[bool]:
    """Ask the remote writer's sh `ours` about each name beside path."""
    program = COMMON_SH + (
        'p=$1; shift\nfor f; do if ours "$f"; then echo 1; else echo 0; fi; done\n'
    )
    argv = [str(path), *(str(path.parent / n) for n in names)]
    out = subprocess.run(
        ["sh", "-c", program, "sh", *argv], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return [line == "1" for line in out.split()]


def test_both_renderings_agree_on_every_name(tmp_path: Path) -> None:
    """Python's is_backup_name and sh's `ours` give the table's answer for every name."""
    path = tmp_path / "recipe.yaml"
    names = [c["name"] for c in CASES]
    by_sh = sh_ours(path, names)
    for case, sh_says in zip(CASES, by_sh, strict=True):
        assert backup.is_backup_name(str(path), case["name"]) is case["ours"], case
        assert sh_says is case["ours"], ("sh", case)


def test_new_names_follow_the_rule(tmp_path: Path) -> None:
    """A tag from Python (backup_tag) and one from the node's `date` both match the rule."""
    path = tmp_path / "recipe.yaml"
    program = COMMON_SH + "backup_tag\n"
    tag = subprocess.run(
        ["sh", "-c", program], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
    for made in (tag, backup.backup_tag(1764400000.5), backup.backup_tag(0.0)):
        name = backup.backup_name(str(path), made)
        assert backup.is_backup_name(str(path), os.path.basename(name)), name
        assert sh_ours(path, [os.path.basename(name)]) == [True], name
        assert backup.backup_tag_of(name) == made
    assert backup.backup_name("f", "T", 2, backup.ROLLED_BACK) == "f.bak.T-2.rolled-back"


def _seed(directory: Path) -> Path:
    """A recipe with 12 old backups of ours and 3 an operator made; return the recipe's path."""
    directory.mkdir()
    path = directory / "recipe.yaml"
    path.write_text("old\n")
    for i in range(12):
        (directory / f"recipe.yaml.bak.2025010{i % 9 + 1}T0000{i:02d}.000000Z").write_text(f"{i}\n")
    for mine in ("known-good", "20251129T070640.123456Z-12345", "20251129T070640Z"):
        (directory / f"recipe.yaml.bak.{mine}").write_text("mine\n")
    return path


def _write_remote_way(path: Path, content: str, keep: int) -> None:
    """Stage and commit with the remote writer's sh programs, run here on the local disk."""
    staged = subprocess.run(
        sh_program(STAGE_SH, str(path), "-", sha256(content), "-"),
        shell=True, input=content.encode(), capture_output=True, check=True, timeout=30,
    ).stdout.decode()  # fmt: skip
    tmp, target, seen = staged.split("\0")  # seen: the digest the commit checks again
    subprocess.run(
        sh_program(COMMIT_SH, str(path), tmp, target, str(keep), "", seen),
        shell=True, capture_output=True, check=True, timeout=30,
    )  # fmt: skip


def _write_local_way(path: Path, content: str, keep: int) -> None:
    """Back up and write with the local writer (headlib's, through spark_ops.files)."""
    from spark_ops.files import write_file

    write_file(path, content, keep_backups=keep)


@pytest.mark.parametrize("keep", [1, 5, 20])
def test_both_writers_rotate_alike(tmp_path: Path, keep: int) -> None:
    """Given the same files, both writers keep the same old backups, make one new one by the
    rule, never touch the operator's own, and leave no temp file."""
    survivors = []
    for way, write in (("remote", _write_remote_way), ("local", _write_local_way)):
        path = _seed(tmp_path / way)
        write(path, "new\n", keep)
        assert path.read_text() == "new\n"
        names = sorted(p.name for p in path.parent.iterdir())
        ours = [n for n in names if backup.is_backup_name(str(path), n)]
        assert len(ours) == min(keep, 13), (way, ours)
        newest = path.parent / ours[-1]
        assert newest.read_text() == "old\n" and ours[-1] > "recipe.yaml.bak.2026"
        theirs = [n for n in names if n.startswith("recipe.yaml.bak.") and n not in ours]
        assert len(theirs) == 3, (way, names)
        assert not [n for n in names if n.startswith(".")], (way, names)
        survivors.append(ours[:-1])
    assert survivors[0] == survivors[1]


@pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root to own a file by another group and drop CAP_CHOWN"
)
def test_the_staged_file_keeps_the_mode_when_root_may_not_chown(tmp_path: Path) -> None:
    """Root without CAP_CHOWN (a container, NFS's root_squash) stages the recipe with its mode:
    cp's failed ownership copy never leaves the staged file 0600 (red team of 2026-12-05)."""
    path = tmp_path / "recipe.yaml"
    path.write_text("old\n")
    os.chown(path, 0, 1234)
    path.chmod(0o644)
    staged = subprocess.run(
        ["setpriv", "--bounding-set", "-chown", "--inh-caps", "-chown", "sh", "-c",
         sh_program(STAGE_SH, str(path), "-", sha256("new\n"), "-")],
        input=b"new\n", capture_output=True, check=True, timeout=30,
    ).stdout.decode()  # fmt: skip
    tmp = Path(staged.split("\0")[0])
    try:
        assert tmp.read_text() == "new\n"
        assert tmp.stat().st_mode & 0o7777 == 0o644, oct(tmp.stat().st_mode)
    finally:
        tmp.unlink()
