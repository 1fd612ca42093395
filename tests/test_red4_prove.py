"""The red team of 2026-12-05, round 4: apply --prove's bounds, apply's exit codes, the rollout's
journal directory (docs/reliability.md, "The red team of 2026-12-05, round 4")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from spark_ops.bench.gate import LoadPoint, Thresholds, Verdict
from spark_ops.cli.apply import exit_of
from spark_ops.errors import BenchError, ExitStatus
from spark_ops.workflows.prove import MAX_REQUESTS, MAX_TOKENS, Proving
from spark_ops.workflows.rollout import RolloutError, RolloutJournal


def _proving(requests: int, output_tokens: int, **load: float) -> Proving:
    """A proof at concurrency 4 (or the rate given) with these requests and tokens."""
    point = LoadPoint(
        requests=requests, output_tokens=output_tokens, **(load or {"concurrency": 4})
    )  # type: ignore[arg-type]
    return Proving(point, Thresholds())


BOUNDS = [
    # requests, output tokens, refused with
    (99999999999999999999, 64, "a proof sends at most 10,000 requests"),
    (MAX_REQUESTS + 1, 1, "a proof sends at most 10,000 requests"),
    (32, 100_000_000, "3,200,000,000 tokens to decode"),
    (4000, 2000, "8,000,000 tokens to decode"),
    (MAX_REQUESTS, MAX_TOKENS // MAX_REQUESTS, None),  # at the bounds: planned
    (32, 64, None),  # the defaults
    (4000, 600, None),  # round 3's case 2
]


@pytest.mark.parametrize(("requests", "tokens", "refused"), BOUNDS)
def test_a_proofs_measurement_is_bounded(requests: int, tokens: int, refused: str | None) -> None:
    """`--prove-requests 99999999999999999999` or `--prove-output-tokens 100000000` were planned
    and measured for as long as they took, the cluster lock held (their lease clamped at 6 h
    and lapsing). Refused while validating (exit 2), naming the option and the bound."""
    proving = _proving(requests, tokens)
    if refused is None:
        proving.validate()
        return
    with pytest.raises(BenchError, match=refused):
        proving.validate()


def _outcome(*, rolled_back: bool = False, verdict_ok: bool | None = None, checks_ok: bool = True,
             history_problem: bool = False, unproven: bool = False) -> SimpleNamespace:  # fmt: skip
    """What exit_of reads of an executed apply."""
    proof = None
    if verdict_ok is not None:
        verdict = Verdict(checks=[], problems=[] if verdict_ok else ["tok/s -50%"])
        proof = SimpleNamespace(regressed=not verdict.ok, verdict=verdict)
    return SimpleNamespace(
        rolled_back=rolled_back,
        proof=proof,
        checks_ok=checks_ok,
        history_problem=object() if history_problem else None,
        plan=SimpleNamespace(facts=SimpleNamespace(unproven=["R"] if unproven else None)),
    )


EXITS = [
    ({}, ExitStatus.OK),
    ({"verdict_ok": True}, ExitStatus.OK),  # proved and kept
    ({"rolled_back": True, "verdict_ok": False}, ExitStatus.REGRESSED),
    ({"rolled_back": True, "verdict_ok": False, "checks_ok": False}, ExitStatus.REGRESSED),
    ({"rolled_back": True}, ExitStatus.BOOT_FAILED),  # --rollback-on-failure's rollback
    ({"rolled_back": True, "verdict_ok": True}, ExitStatus.BOOT_FAILED),
    ({"checks_ok": False}, ExitStatus.CHECK_FAILED),
    ({"checks_ok": False, "verdict_ok": True}, ExitStatus.CHECK_FAILED),
    ({"checks_ok": False, "history_problem": True}, ExitStatus.CHECK_FAILED),
    ({"history_problem": True}, ExitStatus.BUDGET),
    ({"history_problem": True, "verdict_ok": True}, ExitStatus.BUDGET),
    # round 3's case 5: a re-run that finished a dead apply --prove (SIGKILLed in measure-after)
    # said Done and exited 0, the change in place and never proven
    ({"unproven": True}, ExitStatus.CHECK_FAILED),
    ({"unproven": True, "history_problem": True}, ExitStatus.CHECK_FAILED),
    ({"unproven": True, "verdict_ok": True}, ExitStatus.OK),  # this run proved its own change
]


@pytest.mark.parametrize(("outcome", "code"), EXITS)
def test_every_outcome_of_apply_exits_as_exit_codes_md_says(
    outcome: dict[str, bool], code: ExitStatus
) -> None:
    """exit_of (commit 5e32051): each outcome of an executed apply maps to docs/exit-codes.md's
    code (the failures raised instead, interrupted 9, over budget 16, are the errors' own)."""
    assert exit_of(_outcome(**outcome)) == int(code)  # type: ignore[arg-type]


@pytest.mark.parametrize("blocker", ["a-file", "a-file/below"])
def test_a_journal_directory_that_cannot_be_made_is_named(tmp_path: Path, blocker: str) -> None:
    """`rollout --journal-dir` under a regular file (or under an immutable or read-only
    directory, found with `chattr +i`): NotADirectoryError / PermissionError traceback, exit 1.
    Now RolloutError (exit 2) naming the directory and the option."""
    (tmp_path / "a-file").write_text("an operator's file\n")
    journal = RolloutJournal(tmp_path / blocker / "rollouts")
    with (
        pytest.raises(RolloutError, match="journal directory cannot be made"),
        journal.held(str(tmp_path / "fleet.yaml")),
    ):
        pass
    assert (tmp_path / "a-file").read_text() == "an operator's file\n"


def test_a_link_put_at_the_rollout_lock_after_its_check_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fleet's lock was checked for a symlink, then opened following one (O_CREAT): a link
    put between the two, dangling, had its target created. Now opened with O_NOFOLLOW."""
    import hashlib

    fleet = tmp_path / "fleet.yaml"
    (tmp_path / "j").mkdir()
    digest = hashlib.sha256(str(fleet.resolve()).encode()).hexdigest()[:16]
    target = tmp_path / "made-through-the-link"
    (tmp_path / "j" / f"fleet-{digest}.lock").symlink_to(target)
    monkeypatch.setattr(Path, "is_symlink", lambda self: False)  # the link came after the check
    journal = RolloutJournal(tmp_path / "j")
    with (
        pytest.raises(RolloutError, match="rollout lock cannot be opened"),
        journal.held(str(fleet)),
    ):
        pass
    assert not target.exists()
