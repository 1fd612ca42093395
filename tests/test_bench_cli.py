"""`spark-ops bench` and `spark-ops bench compare` through click, against a real local server."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from spark_ops.cli.bench import cli, resolve_url
from spark_ops.errors import BenchError

_spec = importlib.util.spec_from_file_location(
    "bench_stream_server", Path(__file__).parent / "fixtures" / "bench" / "stream_server.py"
)
assert _spec is not None and _spec.loader is not None
server = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("bench_stream_server", server)
_spec.loader.exec_module(server)


@pytest.fixture
def live_server() -> Iterator[tuple[Any, str]]:
    """A FakeEngine (cap 2) served from a thread's own event loop (the CLI runs asyncio.run)."""
    loop = asyncio.new_event_loop()
    engine = server.FakeEngine(max_num_seqs=2, step_s=0.005)
    ready = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        """Run the loop with the server until stopped."""
        asyncio.set_event_loop(loop)
        box["runner"], box["url"] = loop.run_until_complete(server.start(engine))
        ready.set()
        loop.run_forever()
        loop.run_until_complete(box["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield engine, box["url"]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_sweep_then_compare(live_server: tuple[Any, str], tmp_path: Path) -> None:
    """The sweep prints the table and writes JSON/CSV/PNG; compare prints ratios."""
    engine, url = live_server
    runner = CliRunner()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    args = [
        "--url",
        url + "/v1/",
        "--concurrency",
        "1,4",
        "--output-tokens",
        "10",
        "--repeats",
        "1",
        "--slo-tok-s",
        "12",
    ]
    res = runner.invoke(
        cli,
        [
            *args,
            "--knob",
            "max_num_seqs=2",
            "-o",
            str(a),
            "--csv",
            str(tmp_path / "a.csv"),
            "--plot",
            str(tmp_path / "a.png"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "concurrent" in res.output and "aggregate" in res.output and "tok/s" in res.output
    assert "(max_num_seqs=2)" in res.output
    assert "Per-user SLO 12 tok/s" in res.output
    data = json.loads(a.read_text())
    assert data["knobs"] == {"max_num_seqs": 2}
    assert [lv["max_concurrency"] for lv in data["levels"]] == [1, 4]
    assert (tmp_path / "a.csv").read_text().count("\n") == 3
    assert (tmp_path / "a.png").stat().st_size > 1000
    assert engine.requests == 5

    prompts = tmp_path / "p.yaml"
    prompts.write_text(
        "template: 'Write {title} in {language}. {detail}'\nlanguages: [Go, Zig]\n"
        "tasks: [{id: t, title: a queue, detail: Be brief.}]\n"
    )
    res = runner.invoke(
        cli,
        [
            *args,
            "--mode",
            "sustained",
            "--duration",
            "0.3",
            "-o",
            str(b),
            "--prompts",
            str(prompts),
        ],
    )
    assert res.exit_code == 0, res.output
    sent = {m["content"] for body in engine.bodies[5:] for m in body["messages"]}
    assert sent == {"Write a queue in Go. Be brief.", "Write a queue in Zig. Be brief."}
    res = runner.invoke(cli, ["compare", str(a), str(b), "-o", str(tmp_path / "c.json")])
    assert res.exit_code == 0, res.output
    assert "aggregate tok/s" in res.output and "×" in res.output
    cmp = json.loads((tmp_path / "c.json").read_text())
    assert [lv["max_concurrency"] for lv in cmp["levels"]] == [1, 4]


def test_usage_errors() -> None:
    """Bad levels are a usage error; a missing result file is a BenchError naming it."""
    runner = CliRunner()
    res = runner.invoke(cli, ["--url", "http://127.0.0.1:9", "--concurrency", "1,x"])
    assert res.exit_code == 2 and "comma-separated integers" in res.output
    res = runner.invoke(cli, ["--url", "http://127.0.0.1:9", "--mode", "poisson"])
    assert isinstance(res.exception, BenchError) and "needs a rate" in str(res.exception)
    res = runner.invoke(cli, ["compare", "/nonexistent/a.json", "/nonexistent/b.json"])
    assert isinstance(res.exception, BenchError)
    assert "/nonexistent/a.json: cannot read" in str(res.exception)


def test_resolve_url() -> None:
    """URLs are normalised: scheme added, trailing /v1 and slash dropped."""
    assert resolve_url("node1:8000") == "http://node1:8000"
    assert resolve_url("http://node1:8000/v1/") == "http://node1:8000"


def test_no_url_and_no_inventory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --url the inventory's engine is used; with neither, the error says what to give."""
    from spark_ops.cli.main import main
    from spark_ops.errors import ExitStatus

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPARK_OPS_INVENTORY", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--concurrency", "1", "--repeats", "1"])
    assert exc.value.code == ExitStatus.INVENTORY
    assert "pass --inventory FILE or set SPARK_OPS_INVENTORY" in capsys.readouterr().err


def test_what_if_cap_adds_levels_and_reports(live_server: tuple[Any, str], tmp_path: Path) -> None:
    """--what-if-cap 1: level 1 is swept, the what-if table, assumptions and JSON are written."""
    _, url = live_server
    out = tmp_path / "w.json"
    args = ["--url", url, "--concurrency", "4", "--output-tokens", "10", "--repeats", "1"]
    res = CliRunner().invoke(
        cli, [*args, "--knob", "max_num_seqs=2", "--what-if-cap", "1", "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    assert "What-if for lower caps, read from this sweep (running cap 2)" in res.output
    assert "The prediction assumes: prefill and decode share the batch" in res.output
    data = json.loads(out.read_text())
    assert [lv["max_concurrency"] for lv in data["levels"]] == [1, 4]
    curve = data["what_if"]["caps"][0]
    assert curve["cap"] == 1
    assert [(p["concurrency"], p["source"], p["queued"]) for p in curve["points"]] == [
        (1, "measured", 0), (4, "predicted", 3),
    ]  # fmt: skip
    res = CliRunner().invoke(cli, [*args, "--knob", "max_num_seqs=2", "--what-if-cap", "8"])
    assert (
        res.exit_code == 0 and "what-if: --what-if-cap 8 is above the running cap 2" in res.output
    )
    res = CliRunner().invoke(cli, [*args, "--what-if-cap", "x"])
    assert res.exit_code == 2 and "--what-if-cap" in res.output


NO_MATPLOTLIB = """
import sys
sys.modules["matplotlib"] = None  # as where the `plot` extra is not installed: import fails
from spark_ops.cli.main import main
main(sys.argv[1:])
"""


def test_plot_without_matplotlib_fails_before_the_first_request(tmp_path: Path) -> None:
    """`bench --plot` where matplotlib is missing: refused at once, naming the extra to install;
    the engine is never asked anything."""
    import socket
    import subprocess

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        res = subprocess.run(
            [sys.executable, "-c", NO_MATPLOTLIB, "bench", "--url", f"http://127.0.0.1:{port}",
             "--concurrency", "1", "--timeout", "5", "--plot", str(tmp_path / "p.png")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        try:
            conn, _ = listener.accept()
            conn.close()
            connected = True
        except TimeoutError:
            connected = False
    finally:
        listener.close()
    assert res.returncode != 0
    assert "--plot needs matplotlib" in res.stderr, res.stderr[-2000:]
    assert "pip install 'spark-ops[plot]'" in res.stderr, res.stderr[-2000:]
    assert not connected, "a request was sent before the plot's dependency was checked"
    assert not (tmp_path / "p.png").exists()
