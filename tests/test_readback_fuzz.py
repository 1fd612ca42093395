"""Every file the CLI and serve read back, fuzzed (issue 34): saved sweeps, doctor's kept report,
audit and journal lines, watchdog history lines, the token file. Each reader answers with its
value or with the project's own error (SparkOpsError, or history.py's HistoryFailure), never
another exception; the inputs are bounded in size, so the work is too (no timing asserted)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_ops import audit
from spark_ops.bench.report import load_result
from spark_ops.cli.log import echo_entries
from spark_ops.doctor.last import read_last
from spark_ops.errors import SparkOpsError
from spark_ops.serve.auth import read_token_file
from spark_ops.serve.source import load_sweep
from spark_ops.watchdog.history import HistoryFailure, parse_history
from spark_ops.workflows.journal import runs_of, unfinished_runs

SWEEP = json.loads((Path(__file__).parent / "fixtures" / "serve" / "sweep-cap5.json").read_text())
FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)  # fmt: skip

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from([2**70, -1, 0, 10**30, "2**70", "", "NaN"]),
)  # fmt: skip
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
deep = st.integers(min_value=1, max_value=5000).map(lambda n: "[" * n + "]" * n)
raw_bytes = st.binary(max_size=2000)


def _mutate(base: Any, path: list[int], value: Any) -> Any:
    """base with the value at a path (chosen by indices into its keys) replaced."""
    if not path or not isinstance(base, dict | list) or not base:
        return value
    if isinstance(base, dict):
        key = sorted(base)[path[0] % len(base)]
        return {**base, key: _mutate(base[key], path[1:], value)}
    i = path[0] % len(base)
    return [*base[:i], _mutate(base[i], path[1:], value), *base[i + 1 :]]


mutated_sweeps = st.builds(
    lambda path, value: json.dumps(_mutate(SWEEP, path, value)).encode(),
    st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=5),
    values,
)
files = st.one_of(
    raw_bytes, deep.map(str.encode), values.map(lambda v: json.dumps(v).encode()), mutated_sweeps
)


def _write(data: bytes, name: str = "f.json", mode: int = 0o600) -> Path:
    """data in a new private file."""
    path = Path(tempfile.mkdtemp(prefix="spo-fuzz-")) / name
    path.write_bytes(data)
    path.chmod(mode)
    return path


@FUZZ
@given(files)
def test_saved_sweeps(data: bytes) -> None:
    """A saved sweep: a SweepResult or a BenchError; serve's row always a dict."""
    path = _write(data)
    with contextlib.suppress(SparkOpsError):
        load_result(path)
    row = load_sweep(path)
    assert isinstance(row, dict) and row["file"] == path.name


@FUZZ
@given(st.one_of(files, values.map(lambda v: json.dumps({"report": {"checks": v}}).encode())))
def test_doctor_kept_report(data: bytes) -> None:
    """doctor's kept report: None, the report, or {"error"}; never an exception."""
    state = Path(tempfile.mkdtemp(prefix="spo-fuzz-"))
    (state / "doctor-c.json").write_bytes(data)
    got = read_last("c", state_dir=state)
    assert got is None or isinstance(got, dict)


record = st.fixed_dictionaries(
    {},
    optional={
        "when": scalars, "account": scalars, "uid": scalars, "run": st.sampled_from(["r1", "r2"]),
        "phase": st.sampled_from(["intent", "step", "end", "x"]), "steps": values,
        "what": values, "who": scalars, "pid": scalars, "settles": values, "outcome": scalars,
        "nodes": values, "args": values,
    },
)  # fmt: skip
lines = st.one_of(
    record.map(json.dumps), st.text(max_size=200), deep,
    record.map(lambda r: '{"when": 1, "account": "a", "uid": 0, ' + json.dumps(r)[1:]),
)  # fmt: skip


@FUZZ
@given(st.lists(lines, max_size=12))
def test_audit_and_journal_lines(body: list[str]) -> None:
    """Audit and journal lines: parsed, grouped into runs, the unfinished ones found and the log
    printed, without an exception; a line the head did not attribute never makes a run."""
    entries = audit.parse_lines("\n".join(body))
    runs = runs_of(entries)
    for run in unfinished_runs(runs):
        run.to_dict()
    echo_entries(entries, diffs=True)
    attributed = {str(e.get("run")) for e in entries if audit.is_attributed(e)}
    assert {r.run for r in runs} <= attributed


@FUZZ
@given(st.one_of(raw_bytes, st.lists(lines, max_size=12).map(lambda x: "\n".join(x).encode())))
def test_history_lines(data: bytes) -> None:
    """The watchdog's restart history: parsed, or history.py's own failure."""
    for fmt in ("auto", "stamps", "jsonl"):
        with contextlib.suppress(HistoryFailure):
            parse_history(data, path="h", fmt=fmt)


@FUZZ
@given(st.one_of(raw_bytes, st.text(max_size=5000).map(str.encode)))
def test_token_file(data: bytes) -> None:
    """The token file: a token or a TokenError (an InputError)."""
    path = _write(data, "token")
    try:
        token = read_token_file(path)
    except SparkOpsError:
        return
    assert token and token.isascii() and token.isprintable()
    assert os.stat(path).st_mode & 0o777 == 0o600
