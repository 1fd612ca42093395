"""Every file the CLI and serve read back, fuzzed (issue 34): saved sweeps, doctor's kept report,
audit and journal lines, watchdog history lines, the token file, the boot records (boots.json),
the watchdog's pause file, the reference watchdog's config and a loop watchdog's script. Each
reader answers with its value or with the project's own error (SparkOpsError, or history.py's
HistoryFailure), never another exception. Each call must return at all: it runs under a
watchdog (`returns`) whose bound no bounded input comes near, so a hang fails the test instead
of freezing the suite, and nothing about speed is asserted."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from spark_ops import audit
from spark_ops.bench.report import load_result
from spark_ops.cli.log import echo_entries
from spark_ops.doctor.last import read_last
from spark_ops.errors import SparkOpsError
from spark_ops.readiness import BootHistory
from spark_ops.serve.auth import read_token_file
from spark_ops.serve.sweeps import load_sweep
from spark_ops.watchdog.config import load_config
from spark_ops.watchdog.history import HistoryFailure, parse_history
from spark_ops.watchdog.lease import pause_in_force
from spark_ops.watchdog.loop import read_loop_script
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
WATCHDOG_S = 600.0  # no reader of a few KB comes near it: past it, the reader hangs
T = TypeVar("T")


def returns(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args)'s value or its exception, once it returned: it runs in a thread that the test
    waits on for WATCHDOG_S at most, and fails naming fn if it never returned (a FIFO waited on,
    a loop without end) rather than hang the suite."""
    box: dict[str, Any] = {}

    def run() -> None:
        """Call fn and keep what it gave."""
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # re-raised in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"fuzz-{fn.__name__}", daemon=True)
    thread.start()
    thread.join(WATCHDOG_S)
    assert not thread.is_alive(), f"{fn.__qualname__} did not return within {WATCHDOG_S:.0f} s"
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


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
        returns(load_result, path)
    row = returns(load_sweep, path)
    assert isinstance(row, dict) and row["file"] == path.name


@FUZZ
@given(st.one_of(files, values.map(lambda v: json.dumps({"report": {"checks": v}}).encode())))
def test_doctor_kept_report(data: bytes) -> None:
    """doctor's kept report: None, the report, or {"error"}; never an exception."""
    state = Path(tempfile.mkdtemp(prefix="spo-fuzz-"))
    (state / "doctor-c.json").write_bytes(data)
    got = returns(lambda: read_last("c", state_dir=state))
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
@example(['{"when":0,"account":"0","uid":0,"run":"","phase":"intent"}'])  # an unfinished run (CI)
@example(['{"when":0,"account":"0","uid":0,"steps":true}'])  # steps not a list (CI, stop 39)
def test_audit_and_journal_lines(body: list[str]) -> None:
    """Audit and journal lines: parsed, grouped into runs, the unfinished ones found and the log
    printed, without an exception; a line the head did not attribute never makes a run."""
    entries = returns(audit.parse_lines, "\n".join(body))
    runs = returns(runs_of, entries)
    for run in returns(unfinished_runs, runs):  # what status, doctor and log say of each
        returns(lambda r=run: (r.operation, r.command, r.last_step, r.unfinished))
    returns(lambda: echo_entries(entries, diffs=True))
    attributed = {str(e.get("run")) for e in entries if audit.is_attributed(e)}
    assert {r.run for r in runs} <= attributed


@FUZZ
@given(st.one_of(raw_bytes, st.lists(lines, max_size=12).map(lambda x: "\n".join(x).encode())))
def test_history_lines(data: bytes) -> None:
    """The watchdog's restart history: parsed, or history.py's own failure."""
    for fmt in ("auto", "stamps", "jsonl"):
        with contextlib.suppress(HistoryFailure):
            returns(lambda f=fmt: parse_history(data, path="h", fmt=f))


@FUZZ
@given(st.one_of(raw_bytes, st.text(max_size=5000).map(str.encode)))
def test_token_file(data: bytes) -> None:
    """The token file: a token or a TokenError (an InputError)."""
    path = _write(data, "token")
    try:
        token = returns(read_token_file, path)
    except SparkOpsError:
        return
    assert token and token.isascii() and token.isprintable()
    assert os.stat(path).st_mode & 0o777 == 0o600


boot_records = st.fixed_dictionaries(
    {},
    optional={
        "at": scalars, "total_s": scalars, "durations": values, "skipped": values,
        "kv_cache_tokens": scalars, "kv_cache_memory_bytes": scalars, "vllm_version": scalars,
    },
)  # fmt: skip
boot_files = st.one_of(
    files,
    st.dictionaries(st.text(max_size=8), st.one_of(st.lists(boot_records, max_size=4), values),
                    max_size=3).map(lambda c: json.dumps({"version": 1, "clusters": c}).encode()),
)  # fmt: skip


def _boots(path: Path) -> None:
    """Every reading of the boot records that status, serve and the boot wait make."""
    history = BootHistory(path)
    recs = history.records("c")
    assert isinstance(recs, list) and all(isinstance(r, dict) for r in recs)
    estimates = history.estimate("c")
    assert all(isinstance(v, float) for v in estimates.values())
    previous = history.previous("c") or {}
    total = previous.get("total_s")
    assert total is None or isinstance(total, float)  # booting.py's ETA takes float(total)


@FUZZ
@given(boot_files)
def test_boot_records(data: bytes) -> None:
    """boots.json: the records of the shape `record` writes, or none; never an exception."""
    returns(_boots, _write(data, "boots.json"))


@FUZZ
@given(st.one_of(files, raw_bytes, record.map(lambda r: json.dumps(
    {"spark-ops-lease": 1, **r}).encode())))  # fmt: skip
def test_pause_file(data: bytes) -> None:
    """The watchdog's pause file: paused or not, with its lease or none; never an exception."""
    paused, lease = returns(pause_in_force, str(_write(data, "pause")))
    assert isinstance(paused, bool)
    assert lease is None or isinstance(lease.expires, float)


@FUZZ
@given(st.one_of(files, values.map(lambda v: json.dumps({"probe": v, "budget": v}).encode())))
def test_watchdog_config(data: bytes) -> None:
    """The reference watchdog's config (its loop reads it back): a config or its error."""
    with contextlib.suppress(SparkOpsError):
        returns(load_config, _write(data, "config.yaml"))


loop_lines = st.sampled_from([
    "while true; do", "sleep 30", "done", "date +%s >> $HIST", "HIST=/var/lib/h", "MAX=2",
    'PAUSE_FILE="$HOME/pause"', "curl -m 5 http://x/health", "flock /l sh -c x",
    "WINDOW=$((6*3600))", "FAILS=3", "docker restart vllm", "${HIST:-/x}", "$(( 1 << 200 ))",
    "MAX=1e999",
])  # fmt: skip


@FUZZ
@given(st.lists(st.one_of(loop_lines, st.text(max_size=60)), max_size=20))
def test_loop_script(body: list[str]) -> None:
    """A loop watchdog's script as doctor and init read it from the head: its facts or None."""
    returns(read_loop_script, "\n".join(body), "/w.sh", {"HOME": "/h"})


DEEP = 200_000  # levels of nesting: far past the JSON parser's depth


@pytest.mark.parametrize("shape", ["[", '{"a":'])
def test_deep_nesting_in_every_file(shape: str) -> None:
    """JSON nested 200,000 levels in each file read back: the reader's clean answer (an error,
    an empty history, an operator's pause), never RecursionError."""
    data = (shape * DEEP).encode()
    with contextlib.suppress(SparkOpsError):
        returns(load_result, _write(data))
    assert "error" in returns(load_sweep, _write(data))
    state = Path(tempfile.mkdtemp(prefix="spo-fuzz-"))
    (state / "doctor-c.json").write_bytes(data)
    got = returns(lambda: read_last("c", state_dir=state))
    assert got is None or "error" in got
    boots = _write(data, "boots.json")
    assert returns(BootHistory(boots).records, "c") == []
    assert returns(BootHistory(boots).estimate, "c") == {}
    assert returns(pause_in_force, str(_write(data, "pause"))) == (True, None)
    with pytest.raises(SparkOpsError):
        returns(load_config, _write(data, "config.yaml"))
    assert all(isinstance(e, dict) for e in returns(audit.parse_lines, data.decode()))
