"""`spark-ops serve` as a person and a script meet it: the token (header, URL once, cookie), a
read-only server, /metrics a Prometheus parser reads with the budget `budget --json` shows, pages
that show the budget and knobs and never a hostile value as markup, the boot page's events during
a real `apply` on the embedded cluster, the alert rules promtool accepts, and a real browser
(Debian's chromium driven by selenium) on the same server.

One embedded cluster and one server (the real CLI, a subprocess) for the whole module.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from conftest import REPO, Sim, start_sim

from spark_ops import __version__
from spark_ops.errors import ExitStatus
from spark_ops.readiness import PHASE_ORDER
from spark_ops.serve.auth import TokenError, kept_token, read_token_file
from spark_ops.serve.pages import boot_page, cluster_page, history_page, sweeps_page

FIXTURES = Path(__file__).parent / "fixtures" / "serve"
HOSTILE = yaml.safe_load((FIXTURES / "hostile.yaml").read_text())
TOKEN = "t0ken-for-the-serve-tests-0123456789"
RANKS = {p.value: p.rank for p in PHASE_ORDER}


class Served:
    """The running server: its URL, token and cluster."""

    def __init__(self, sim: Sim, url: str, env: dict[str, str], proc: subprocess.Popen[str]):
        """Keep what the tests need."""
        self.sim, self.url, self.env, self.proc = sim, url, env, proc
        self.auth = {"Authorization": f"Bearer {TOKEN}"}


def _cli(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """The real CLI."""
    return subprocess.run(
        [sys.executable, "-m", "spark_ops.cli.main", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """An embedded cluster whose boots last long enough to watch, and `spark-ops serve` on it."""
    from spark_ops.sim.control import down, wait_serving

    root = tmp_path_factory.mktemp("serve")
    from spark_ops.sim.nvidia_smi import install

    sim = start_sim(root / "sim", boot_scale=2.0)
    proc = None
    try:
        wait_serving(sim.state)
        for node in (sim.root / "nodes").iterdir():  # a GB10's nvidia-smi on each node
            install(node / "bin")
        token_file = root / "token"
        token_file.write_text(TOKEN + "\n")
        token_file.chmod(0o600)
        # a home of its own: the last doctor report and the boot records the page shows are this
        # module's, not another test's run on a cluster of the same name
        env = dict(os.environ, SPARK_OPS_INVENTORY=str(sim.inventory), HOME=str(root / "home"))
        env.pop("SPARK_OPS_CLUSTER", None)
        env.pop("SPARK_OPS_FLEET", None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "spark_ops.cli.main", "serve", "--port", "0", "--json",
             "--token-file", str(token_file), "--results", str(FIXTURES)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        started = json.loads(line)
        assert started["login_url"] == f"{started['url']}/?token={TOKEN}"
        assert started["url"].startswith("http://127.0.0.1:")  # loopback unless --host says
        yield Served(sim, started["url"], env, proc)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        down(sim.root)


# -- the token ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "content", "refused"),
    [
        (0o600, TOKEN, None),
        (0o644, TOKEN, "mode 0644, only 0600"),
        (0o640, TOKEN, "mode 0640, only 0600"),
        (0o600, "short", "at least 16"),
        (0o600, "has a space in the middle of it", "at least 16"),
    ],
)
def test_token_file_rules(tmp_path: Path, mode: int, content: str, refused: str | None) -> None:
    """Only a regular file of one's own, mode 0600, with one printable token line is read."""
    path = tmp_path / "token"
    path.write_text(content + "\n")
    path.chmod(mode)
    if refused is None:
        assert read_token_file(path) == content
        return
    with pytest.raises(TokenError, match=refused) as info:
        read_token_file(path)
    assert str(path) in info.value.message
    assert info.value.exit_status == ExitStatus.USAGE


def test_token_file_symlink_refused(tmp_path: Path) -> None:
    """A symlink is not followed (its target may be anyone's)."""
    real = tmp_path / "real"
    real.write_text(TOKEN)
    real.chmod(0o600)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(TokenError, match="cannot open"):
        read_token_file(tmp_path / "link")


def test_generated_token_is_kept_0600(tmp_path: Path) -> None:
    """Without --token-file a token is generated once, 0600, and the same one is read again."""
    path = tmp_path / "state" / "serve.token"
    token, where = kept_token(path)
    assert where == path and len(token) >= 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert kept_token(path)[0] == token
    path.chmod(0o644)  # someone widened it: refused, not silently served
    with pytest.raises(TokenError, match="only 0600"):
        kept_token(path)
    path.write_text("")  # a serve killed between creating the file and writing it: a new token
    path.chmod(0o600)
    again, _ = kept_token(path)
    assert again != token and len(again) >= 32 and path.read_text() == again + "\n"
    path.write_text("")
    path.chmod(0o640)  # empty but not as spark-ops leaves it: refused as it is
    with pytest.raises(TokenError, match="only 0600"):
        kept_token(path)


def test_cli_refuses_a_readable_token_file(tmp_path: Path) -> None:
    """The CLI exits 2 naming the file and the fix, before listening."""
    path = tmp_path / "token"
    path.write_text(TOKEN)
    path.chmod(0o644)
    env = dict(os.environ, SPARK_OPS_INVENTORY=str(tmp_path / "no-inventory.yaml"))
    res = _cli(env, "serve", "--token-file", str(path), "--port", "0", timeout=60)
    assert res.returncode == ExitStatus.USAGE, res.stderr
    assert f"{path}: mode 0644" in res.stderr and "chmod 600" in res.stderr


def test_port_taken_is_a_conflict(served: Served) -> None:
    """A port another process listens on: exit 19 naming the address, and a hint."""
    import socket

    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        token = served.sim.root.parent / "token"  # the module's: no token left in ~
        res = _cli(served.env, "serve", "--port", str(port), "--token-file", str(token),
                   timeout=120)  # fmt: skip
    assert res.returncode == ExitStatus.CONFLICT, res.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in res.stderr and "--port" in res.stderr


async def test_every_route_needs_the_token(served: Served) -> None:
    """401 without the token, with a wrong one, and with a wrong ?token=; nothing else said."""
    async with aiohttp.ClientSession() as http:
        for path in ("/", "/boot", "/history", "/sweeps", "/metrics", "/api/status", "/events"):
            for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
                async with http.get(served.url + path, headers=headers) as r:
                    assert r.status == 401, path
                    assert "budget" not in await r.text()
        async with http.get(served.url + "/?token=wrong", allow_redirects=False) as r:
            assert r.status == 401
            assert "Set-Cookie" not in r.headers


async def test_token_in_the_url_once_sets_a_session_cookie(served: Served) -> None:
    """?token= answers a redirect to the same URL without it and an HttpOnly, SameSite=Strict
    cookie (not the token itself); the cookie alone then opens the pages."""
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        url = f"{served.url}/history?token={TOKEN}&x=1"
        async with http.get(url, allow_redirects=False) as r:
            assert r.status == 303
            assert r.headers["Location"] == "/history?x=1"
            cookie = r.headers["Set-Cookie"]
            assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
            assert TOKEN not in cookie
        async with http.get(served.url + "/history") as r:
            assert r.status == 200
            assert "Restart stamps" in await r.text()
            assert r.headers["Content-Security-Policy"].startswith("default-src 'none'")


async def test_read_only_a_forged_action_is_refused(served: Served) -> None:
    """No route changes anything: a POST (with the token, as a forged form would send a cookie)
    is refused, and nothing was recorded."""
    async with aiohttp.ClientSession() as http:
        for path in ("/", "/api/apply", "/api/budget", "/metrics"):
            async with http.post(
                served.url + path, headers=served.auth, data={"max_num_seqs": "1"}
            ) as r:
                assert r.status in (404, 405), path


# -- the numbers ----------------------------------------------------------------------------------


async def test_metrics_parse_and_match_budget(served: Served) -> None:
    """/metrics is Prometheus text its own parser reads, with the budget `budget --json` shows."""

    async with aiohttp.ClientSession() as http:
        async with http.get(served.url + "/metrics", headers=served.auth) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain")
            text = await r.text()
        async with http.get(served.url + "/api/budget", headers=served.auth) as r:
            api_budget = await r.json()
    samples = _samples(text)
    cli_budget = json.loads(_cli(served.env, "budget", "--json").stdout)
    assert samples[("spark_ops_budget_used", ())] == cli_budget["used"] == api_budget["used"]
    assert samples[("spark_ops_budget_allowed", ())] == cli_budget["allowed"] == 2
    assert samples[("spark_ops_engine_up", ())] == 1
    assert samples[("spark_ops_watchdog_gave_up", ())] == 0
    assert samples[("spark_ops_lock_held", ())] == 0
    assert samples[("spark_ops_unfinished_runs", ())] == 0
    assert samples[("spark_ops_leftover_processes", ())] == 0
    assert samples[("spark_ops_verdict", (("state", "serving"),))] == 1


async def test_pages_show_budget_knobs_and_sweeps(served: Served) -> None:
    """The cluster page shows the budget and the recipe's knobs; the sweeps page draws the saved
    sweep measured and its what-if apart; /api/status is status' own document."""
    async with aiohttp.ClientSession() as http:
        async with http.get(served.url + "/", headers=served.auth) as r:
            page = await r.text()
        async with http.get(served.url + "/api/status", headers=served.auth) as r:
            status = await r.json()
        async with http.get(served.url + "/sweeps", headers=served.auth) as r:
            sweeps = await r.text()
    used, allowed = status["budget"]["used"], status["budget"]["allowed"]
    assert f"{used} / {allowed} restarts used" in page
    assert "max_num_seqs" in page
    assert f"<td>{status['recipe']['knobs']['max_num_seqs']}</td>" in page
    assert status["verdict"]["state"] == "serving"
    assert "sweep-cap5.json (measured)" in sweeps
    assert "what-if cap 2 (predicted)" in sweeps and 'stroke-dasharray="5 4"' in sweeps
    assert "<svg" in sweeps and "http://" not in sweeps.replace("http://www.w3.org/2000/svg", "")


def _pages_of_hostile_data() -> dict[str, str]:
    """Every page rendered from the hostile fixture."""
    status, audit, boot = HOSTILE["status"], HOSTILE["audit"], HOSTILE["boot"]
    result = json.loads((FIXTURES / "sweep-cap5.json").read_text())
    result["model"] = HOSTILE["sweep_model"]
    result["knobs"]["moe_backend"] = HOSTILE["raw"][1]
    raw = HOSTILE["raw"]
    other = json.loads(json.dumps(result))
    other["knobs"]["max_num_seqs"] = raw[3]
    sweeps = {"dir": "x", "runs": [{"file": raw[0], "result": result},
                                   {"file": raw[4], "result": other}]}  # fmt: skip
    status = {**status, "budget": {**status["budget"], "now": 1796250000.0}}
    # the node facts, the load ring and the boot's tail and missing workers carry them too
    hardware = {
        "time": 1,
        "error": raw[4],
        "nodes": {
            status["nodes"][0]["name"]: {
                "gpu": {"name": raw[1], "util_pct": 1},
                "ranks": [raw[2]],
                "mem_available": 1,
                "mem_total": 2,
            },
            "node2": {"error": raw[3]},
        },
    }
    load = {
        "span_s": 3600,
        "interval_s": 10,
        "error": raw[0],
        "last_ok": 1,
        "samples": [{"at": 1796249990, "running": 1, "waiting": 0, "tok_s": 2.0}],
    }
    live = {**boot, "missing_workers": [raw[3]]}
    audit = {
        "entries": [
            *audit["entries"],
            {
                "run": raw[1],
                "phase": "intent",
                "when": 2,
                "who": raw[2],
                "what": {"operation": raw[3]},
            },
        ]
    }
    return {
        "cluster": cluster_page(status, {"operation": raw[0], "ok": False,
                                         "outcome": raw[2], "who": "x", "when": 1},
                                {"when": 1, "who": raw[1], "report": {
                                    "ok": False, "checks": [{"status": "fail",
                                    "name": raw[0], "host": raw[1],
                                    "detail": raw[2], "fix": raw[0]}]}},
                                hardware=hardware, load=load, boot=live, now=1796250000.0),
        "history": history_page(status, audit),
        "boot": boot_page({"live": live, "recorded": [], "watched_here": [], "usual_s": {},
                           "tail": list(raw)}),
        "sweeps": sweeps_page(sweeps),
    }  # fmt: skip


@pytest.mark.parametrize("name", ["cluster", "history", "boot", "sweeps"])
def test_hostile_values_are_escaped(name: str) -> None:
    """Node names, recipe values, reasons, diffs and log lines are shown as text, never markup."""
    page = _pages_of_hostile_data()[name]
    for raw in HOSTILE["raw"]:
        assert raw not in page, (name, raw)
    live = name in ("boot", "cluster")  # the live pages' own script only
    assert page.count("<script>") == (1 if live else 0)
    if name != "boot":
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


async def test_last_doctor_result_on_page_and_metrics(served: Served) -> None:
    """`spark-ops doctor` keeps its report on this machine; the cluster page shows when, who and
    the verdict, and /metrics its failed checks, as `doctor --json` counted them."""
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as http:
        async with http.get(served.url + "/", headers=served.auth) as r:
            assert "no doctor run kept on this machine" in await r.text()
        doctor = _cli(served.env, "doctor", "--json")
        report = json.loads(doctor.stdout)
        async with http.get(served.url + "/", headers=served.auth) as r:
            page = await r.text()
        async with http.get(served.url + "/metrics", headers=served.auth) as r:
            text = await r.text()
    section = page[page.index('id="doctor"') :]
    verdict = "ready for apply" if report["ok"] else "not ready for apply"
    ok = report["counts"]["ok"]
    assert f"{verdict}</span>: {ok} of {len(report['checks'])} checks ok" in section, section
    failed = [
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "spark_ops_doctor_failed_checks"
    ]
    assert failed == [report["counts"]["fail"]]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, None),
        (b"", "not a doctor report"),
        (b"\xff\xfe{", "not a doctor report"),
        (b'{"report": {"checks": "no"}}', "no checks"),
        (b"[1, 2]", "no checks"),
        (b" " * ((1 << 20) + 1), "larger than"),
        (b"FIFO", "not a regular file"),
        (b"DIR", "not a regular file"),
    ],
)
def test_last_doctor_report_read_never_raises(
    tmp_path: Path, content: bytes | None, said: str | None
) -> None:
    """A kept report that is missing, empty, not UTF-8, not a report or huge is said as such,
    naming the file; a cluster name with a slash stays one file in the state directory."""
    from spark_ops.doctor.last import last_path, read_last

    path = last_path("a/../b", tmp_path)
    assert path.parent == tmp_path
    if content == b"FIFO":
        os.mkfifo(path)  # read without blocking the server's event loop
    elif content == b"DIR":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    got = read_last("a/../b", state_dir=tmp_path)
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        read_last("a/../b", state_dir=tmp_path)
    assert len(os.listdir("/proc/self/fd")) == fds, "a descriptor left open"
    if said is None:
        assert got is None
    else:
        assert got is not None and said in got["error"] and str(path) in got["error"]


def test_doctor_never_writes_its_report_through_a_link(tmp_path: Path) -> None:
    """The kept report's name replaced by a symlink (to an operator's file): doctor keeps no
    report rather than write into the file the link names."""
    from spark_ops.doctor import DoctorReport
    from spark_ops.doctor.last import keep_report, last_path

    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    last_path("c", tmp_path).symlink_to(notes)
    assert keep_report(DoctorReport("c", "inv.yaml"), state_dir=tmp_path) is None
    assert notes.read_text() == "mine\n"
    assert keep_report(DoctorReport("d", "inv.yaml"), state_dir=tmp_path) == last_path(
        "d", tmp_path
    )


def test_a_session_cookie_is_this_runs_and_ends() -> None:
    """A session cookie holds no token, is valid only for the run that issued it and until its
    expiry; any other text (not ASCII, forged, another run's) is refused, never an error."""
    from spark_ops.serve.auth import Sessions

    now = [1_000_000.0]
    run = Sessions(lifetime=60, clock=lambda: now[0])
    cookie = run.issue()
    assert run.valid(cookie) and TOKEN not in cookie
    assert not Sessions(lifetime=60, clock=lambda: now[0]).valid(cookie)  # a restarted server
    for forged in ("", "é", "1.é", "99999999999.x", cookie + "0", "0." + cookie.split(".")[1],
                   cookie.replace(".", ":"), "\udcff", "1" * 40 + "." + "a" * 64):  # fmt: skip
        assert not run.valid(forged), forged
    now[0] += 61
    assert not run.valid(cookie)


@pytest.mark.parametrize(
    ("path", "where"),
    [
        ("/", "/"),
        ("/history", "/history?a=b"),
        ("//evil.example/landed", "/evil.example/landed?a=b"),
        ("/\\evil.example", "/evil.example?a=b"),
        ("///\\//x", "/x?a=b"),
    ],
)
def test_after_the_token_the_browser_stays_here(path: str, where: str) -> None:
    """?token= answers with a redirect to this server's own page without the token: a path
    shaped like another site's address never sends the browser away."""
    from spark_ops.serve.app import same_page

    query = {"token": TOKEN} if path == "/" else {"token": TOKEN, "a": "b"}
    assert same_page(path, query) == where


def test_an_odd_saved_sweep_is_one_error_not_a_broken_page(tmp_path: Path) -> None:
    """A file in --results that is not a sweep bench wrote, or whose what-if cannot be made, is
    shown with why; the other sweeps and the page still show."""
    from spark_ops.serve.source import load_sweep

    good = json.loads((FIXTURES / "sweep-cap5.json").read_text())
    odd = {
        "text-throughput": lambda d: d["levels"][0].update(output_throughput="fast"),
        "knobs-list": lambda d: d.update(knobs=[1, 2]),
        "null-level": lambda d: d["levels"].append(None),
        "no-half-cap": lambda d: d["knobs"].update(max_num_seqs=64),
    }
    runs = []
    for name, spoil in odd.items():
        data = json.loads(json.dumps(good))
        spoil(data)
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
        runs.append(load_sweep(tmp_path / f"{name}.json"))
    (tmp_path / "not-json.json").write_bytes(b"\xff{")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    os.mkfifo(tmp_path / "fifo.json")  # never waited on
    for name in ("not-json.json", "deep.json", "fifo.json"):
        runs.append(load_sweep(tmp_path / name))
        assert "error" in runs[-1], runs[-1]
    runs.append(load_sweep(FIXTURES / "sweep-cap5.json"))
    assert "whatif" in runs[-1] and "error" not in runs[-1]
    page = sweeps_page({"dir": str(tmp_path), "runs": runs})
    assert "sweep-cap5.json (measured)" in page
    said = {name: run for name, run in zip(odd, runs, strict=False)}
    assert "must be a mapping" in said["knobs-list"]["error"]
    assert "bad key" in said["null-level"]["error"]
    assert "no level" in said["no-half-cap"]["whatif_error"]
    assert "whatif" in said["text-throughput"]  # shown; its text throughput drawn as no point


def test_metrics_say_unread_when_the_head_did_not_answer() -> None:
    """With the head down, status has no budget and no runs: /metrics says the budget was not
    read and gives no lock or run figure; an experiment under way is a verdict state too."""

    from spark_ops.serve.metrics import render_metrics

    boot = {"active": False, "phase": None}
    for status, readable in (({"budget": {}, "runs": {}}, 0.0),
                             ({"budget": {"error": "x"}}, 0.0)):  # fmt: skip
        status["verdict"] = {"state": "experimenting"}
        text = render_metrics(status, boot, None).decode()
        samples = _samples(text, "default")
        assert samples[("spark_ops_budget_readable", ())] == readable
        assert ("spark_ops_lock_held", ()) not in samples
        assert samples[("spark_ops_verdict", (("state", "experimenting"),))] == 1
    page = cluster_page({"verdict": {"state": "not-serving"}, "runs": {}, "budget": {}}, None)
    assert "lock and runs unknown" in page and "lock free" not in page


# -- the boot, live -------------------------------------------------------------------------------


async def _events_during_apply(served: Served, value: str) -> list[dict[str, Any]]:
    """Every /events message from a real `apply --max-num-seqs VALUE` until the boot's end."""
    got: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=240)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.get(served.url + "/events", headers=served.auth) as r,
    ):
        assert r.headers["Content-Type"] == "text/event-stream"
        first = await r.content.readline()
        assert first == b"event: boot\n"
        apply = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "spark_ops.cli.main", "apply", "--max-num-seqs", value,
            "-y", env=served.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            async for raw in r.content:
                if raw.startswith(b"data: "):
                    got.append(json.loads(raw[6:]))
                    if got[-1]["event"]["kind"] == "end":
                        break
        finally:
            _, err = await apply.communicate()
        assert apply.returncode == 0, err.decode()
    return got


async def test_boot_events_during_apply(served: Served) -> None:
    """During `apply` the server streams the boot's phases in order (readiness' own events), the
    ETA state with them, and the end; /metrics then shows the apply's outcome."""
    events = await _events_during_apply(served, "5")
    phases = [e["event"]["phase"] for e in events if e["event"]["kind"] == "phase"]
    assert phases[0] == "STARTING" and "API_UP" in phases, phases
    assert [RANKS[p] for p in phases] == sorted(RANKS[p] for p in phases), phases
    end = events[-1]["event"]
    assert end["outcome"] == "ready" and end["phase"] == "READY"
    live = [e["state"] for e in events if e["state"]["active"]]
    assert live and all(s["phase"] for s in live)
    assert any(e["event"]["kind"] == "line" for e in events)
    from prometheus_client.parser import text_string_to_metric_families

    await asyncio.sleep(6)  # past the cache's few seconds
    async with (
        aiohttp.ClientSession() as http,
        http.get(served.url + "/metrics", headers=served.auth) as r,
    ):
        text = await r.text()
    runs = {
        s.labels.get("operation"): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "spark_ops_last_run_success"
    }
    assert runs == {"apply": 1.0}


async def _get(served: Served, path: str) -> str:
    """One page or document's text, with the token."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(served.url + path, headers=served.auth) as r,
    ):
        assert r.status == 200, path
        return await r.text()


def _samples(text: str, cluster: str = "sim") -> dict[tuple[str, tuple[tuple[str, str], ...]], Any]:
    """Prometheus text as {(name, labels): value}, each sample's `cluster` label checked (the
    inventory's name for its cluster, or render_metrics' default) and left out of the key."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    assert samples and all(s.labels.get("cluster") == cluster for s in samples), text[:2000]
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "cluster"))): s.value
        for s in samples
    }


async def test_history_is_one_entry_per_operation(served: Served) -> None:
    """After the apply above, the history page shows it once, with its steps inside, never an
    intent beside its end as "did not end", and no argument that was not given."""
    page = await _get(served, "/history")
    audit = page[page.index('id="audit"') :]
    assert audit.count("apply max_num_seqs=5 ") == 1, audit[:3000]
    assert "did not end" not in audit
    assert "steps: write done" in audit and "boot done" in audit
    assert "=[]" not in audit and "=None" not in audit


async def test_boot_page_shows_the_engine_log_tail_between_boots(served: Served) -> None:
    """With no boot under way the boot page shows the engine log's latest lines (the running
    engine's, as the server follows the log), without the pollers' access lines."""
    boots = json.loads(await _get(served, "/api/boot"))
    assert not boots["live"]["active"] and boots["tail"], boots
    assert not any('"GET /metrics' in line for line in boots["tail"]), boots["tail"]
    page = await _get(served, "/boot")
    tail = page[page.index("<pre id=tail>") :]
    assert boots["tail"][-1].split(" ")[0] in tail[: tail.index("</pre>")]


async def test_node_panels_show_gpu_memory_power_and_rank(served: Served) -> None:
    """Each node's panel: reachable, the GB10's use and power (its nvidia-smi), its memory unified
    with the host, MemAvailable, and the engine rank on it; /metrics has the same per node."""
    end = time.monotonic() + 240
    page = await _get(served, "/")
    while "node facts not read yet" in page:  # read in the background: pages never wait on it
        assert time.monotonic() < end, "the node facts were never read"
        await asyncio.sleep(0.5)
        page = await _get(served, "/")
    for name in ("node1", "node2", "node3", "node4"):
        panel = page[page.index(f'id="node-{name}"') :]
        panel = panel[: panel.index("</div>")]
        assert "NVIDIA GB10" in panel and "<dd>0 %</dd>" in panel and "5.0 W" in panel, panel
        assert "unified with the host" in panel and "MemAvailable" in panel, panel
        rank = "rank 0 (serves the API)" if name == "node1" else "Ray worker running"
        assert rank in panel, panel
    assert "node facts just now" in page or "node facts " in page
    samples = _samples(await _get(served, "/metrics"))
    assert samples[("spark_ops_build_info", (("version", __version__),))] == 1
    for name in ("node1", "node3"):
        assert samples[("spark_ops_node_gpu_power_watts", (("node", name),))] == 5.0
        assert samples[("spark_ops_node_reachable", (("node", name),))] == 1
        assert samples[("spark_ops_node_mem_available_bytes", (("node", name),))] > 0


async def test_budget_gauge_timeline_and_next_slot(served: Served) -> None:
    """The budget box draws one box per allowed restart, the window's stamps on a line with when,
    who and why, lists them, and says the slots left; /metrics' next free time is the reading's
    time while a slot is free."""
    status = json.loads(await _get(served, "/api/status"))
    budget = status["budget"]
    page = await _get(served, "/")
    box = page[page.index('id="budget"') : page.index('id="engine"')]
    assert f'aria-label="{budget["used"]} of {budget["allowed"]} restarts used"' in box
    assert "<svg id=timeline" in box
    for stamp in budget["stamps"]:
        why = stamp.get("reason") or "(no journal entry)"
        assert why in box and box.count("<circle class=stamp") == len(budget["stamps"])
    if budget["used"] < budget["allowed"]:
        assert f"{budget['remaining']} left now" in box
    samples = _samples(await _get(served, "/metrics"))
    assert ("spark_ops_budget_next_free_timestamp_seconds", ()) in samples


async def test_load_over_the_last_hour(served: Served) -> None:
    """serve scrapes the engine's /metrics into a ring: running, waiting and tok/s show on the
    page (with a y axis) and on /metrics once two scrapes were answered."""
    give_up = time.monotonic() + 120
    while True:
        load = json.loads(await _get(served, "/api/load"))
        if any(s["tok_s"] is not None for s in load["samples"]):
            break
        assert time.monotonic() < give_up, load
        await asyncio.sleep(1.0)
    page = await _get(served, "/")
    box = page[page.index('id="load"') :]
    assert '<svg id="chart-requests"' in box and '<svg id="chart-tok"' in box
    assert "class=ytick" in box and "running" in box and "tok/s" in box
    samples = _samples(await _get(served, "/metrics"))
    assert samples[("spark_ops_engine_requests_running", ())] >= 0
    assert samples[("spark_ops_engine_generation_tokens_per_second", ())] >= 0


async def test_cluster_page_during_a_run_is_amber_with_the_live_boot(served: Served) -> None:
    """While a run holds the cluster lock (as an `apply` does) the cluster page says
    "restarting" in amber, links the live boot, and the engine box names the run: never red,
    never "not serving: —"."""
    from spark_ops.inventory import load_inventory
    from spark_ops.lock import cluster_lock
    from spark_ops.remote import ClusterSession

    cluster = load_inventory(served.sim.inventory).cluster(None)
    give_up = time.monotonic() + 90
    async with ClusterSession(cluster) as session:
        await session.connect([cluster.head.name])
        async with cluster_lock(session, "apply --max-num-seqs 6"):
            while 'id="verdict" class="big warn">restarting' not in (
                page := await _get(served, "/")
            ):
                assert time.monotonic() < give_up, page[:3000]
                await asyncio.sleep(0.5)
    engine = page[page.index('<section id="engine">') : page.index('<section id="load">')]
    assert "id=bootlink" in page and 'href="/boot"' in engine, engine
    assert 'class="warn" id=enginestate' in engine and "apply --max-num-seqs 6" in engine, engine
    assert "not serving" not in engine


async def test_live_cluster_page_sends_sections_with_ages(served: Served) -> None:
    """/events/cluster sends the cluster page's sections again, each kept fact with its age: a
    doctor run made meanwhile shows on the next event, "doctor report just now"."""
    doctor = _cli(served.env, "doctor", "--json")
    assert doctor.stdout, doctor.stderr
    timeout = aiohttp.ClientTimeout(total=120)
    async with (
        aiohttp.ClientSession(timeout=timeout) as http,
        http.get(served.url + "/events/cluster", headers=served.auth) as r,
    ):
        assert r.headers["Content-Type"] == "text/event-stream"
        async for raw in r.content:
            if raw.startswith(b"data: "):
                item = json.loads(raw[6:])
                if "doctor report" in item["html"]:
                    break
    html = item["html"]
    assert 'data-what="doctor report"' in html and 'data-what="status"' in html
    assert 'data-what="node facts"' in html and 'data-what="engine scrape"' in html
    for ident in ("summary", "nodes", "budget", "engine", "load", "runs", "doctor"):
        assert f'<section id="{ident}">' in html, ident


async def test_the_boot_watch_asks_the_clis_missing_workers(served: Served) -> None:
    """The boot watch's missing-workers query is the CLI boot wait's (workflows.gate): with
    node3's worker check failing, it names node3 and its part."""
    import dataclasses

    from spark_ops.inventory import load_inventory
    from spark_ops.remote import ClusterSession
    from spark_ops.serve.boot import BootWatch
    from spark_ops.workflows.operation import Operation

    cluster = load_inventory(served.sim.inventory).cluster(None)
    engine = dataclasses.replace(cluster.engine, worker_check='test "$SPARK_SIM_NODE" != node3')
    cluster = dataclasses.replace(cluster, engine=engine)
    async with ClusterSession(cluster) as session:
        await session.connect()
        missing = await BootWatch.workers_query(Operation(session, "serve"))()
    assert [m.split(" ", 1)[0] for m in missing] == ["node3"], missing
    assert f"its {engine.worker_part} is not running" in missing[0]


def test_restarting_is_amber_with_the_live_boot() -> None:
    """During a run the verdict and the engine box are amber, link the live boot and say the
    run; an engine down with no reason recorded says so, never a bare dash."""
    status = {"verdict": {"state": "restarting", "reasons": ["a run is under way: apply"]},
              "engine": {"up": False}, "runs": {"lock_held": True, "in_progress": "apply by x",
                                                "unfinished": []}}  # fmt: skip
    page = cluster_page(status, None)
    assert 'class="big warn">restarting' in page and 'href="/boot"' in page
    assert 'class="warn" id=enginestate>restarting: apply by x' in page
    assert "not serving" not in page
    down = cluster_page({"verdict": {"state": "not-serving"}, "engine": {"up": False}}, None)
    assert "not serving: the engine did not answer and status recorded no reason" in down


def test_metrics_next_free_and_load_ring_bounds() -> None:
    """next_free is when a slot frees while the budget is spent, the reading's time while one is
    free; the load ring keeps at most its size, a gap is no rate, a counter reset no rate."""
    from spark_ops.serve.load import LoadRing
    from spark_ops.serve.metrics import next_free

    spent = {"used": 2, "allowed": 2, "now": 100.0, "next_free_at": 5000.0, "stamps": [1, 2]}
    assert next_free(spent) == 5000.0
    assert next_free({**spent, "used": 1}) == 100.0
    assert next_free({"error": "x"}) is None
    ring = LoadRing(keep=5, interval_s=10)
    for i in range(50):
        ring.add(10.0 * i, 1.0, 0.0, 100.0 * i)
    assert len(ring.samples) == 5 and ring.samples[-1]["tok_s"] == 10.0
    ring.add(600.0, None, None, None)
    ring.add(610.0, 1.0, 0.0, 3.0)  # after a gap: no rate
    ring.add(620.0, 1.0, 0.0, 1.0)  # a new engine's counter: no rate
    assert [s["tok_s"] for s in list(ring.samples)[-3:]] == [None, None, None]


def test_sweeps_have_y_ticks_the_whatif_asked_and_a_comparison() -> None:
    """Two saved sweeps: the charts have y-axis ticks, each run says which what-if was asked, and
    a comparison names the best tok/s of each and the knobs that differ."""
    from spark_ops.serve.source import load_sweep

    one = load_sweep(FIXTURES / "sweep-cap5.json")
    other = json.loads(json.dumps(one))
    other["file"] = "other.json"
    other["result"]["knobs"]["max_num_seqs"] = 9
    page = sweeps_page({"dir": "x", "runs": [one, other]})
    assert page.count("class=ytick") >= 4
    assert "what-if asked: max_num_seqs 2" in page
    compared = page[page.index('id="compare"') :]
    assert "max_num_seqs=9" in compared and "(the newest)" in compared


# -- alert rules ----------------------------------------------------------------------------------


def test_alert_rules() -> None:
    """docs/alerts.yml: promtool accepts it (where installed); every rule names a metric the
    server exports."""
    path = REPO / "docs" / "alerts.yml"
    doc = yaml.safe_load(path.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    names = {r["alert"] for r in rules}
    assert {"SparkOpsRestartBudgetSpent", "SparkOpsWatchdogGaveUp", "SparkOpsBootStuck",
            "SparkOpsUnfinishedRun"} <= names  # fmt: skip
    source = (REPO / "spark_ops" / "serve" / "metrics.py").read_text()
    for r in rules:
        for word in str(r["expr"]).replace("(", " ").replace(")", " ").split():
            if word.startswith("spark_ops_"):
                assert f'"{word.removeprefix("spark_ops_")}"' in source, (r["alert"], word)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus): YAML checked only")
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


# -- a real browser -------------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SCREENSHOTS = "SPARK_OPS_SCREENSHOTS"  # a directory (docs/img to refresh the docs' pictures)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Debian's headless chromium through chromedriver (selenium); skipped where one is missing
    (a failure under SPARK_OPS_REQUIRE_GROUND=1: .ci/install-ground.sh installs them)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (apt-get install chromium "
                    "chromium-driver)")  # fmt: skip
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium not installed (pip install -e '.[test]')")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1200,1100",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):  # fmt: skip
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(120)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _shot(driver: Any, name: str, tmp_path: Path) -> None:
    """A screenshot of the page as it is, where SPARK_OPS_SCREENSHOTS says (else the test's dir)."""
    where = Path(os.environ.get(SCREENSHOTS) or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(where / f"serve-{name}.png"))


@pytest.mark.browser
def test_browser_pages_token_and_live_boot(served: Served, browser: Any, tmp_path: Path) -> None:
    """As a person: the URL printed at start opens the cluster page (budget, knobs) and drops the
    token from the address; a request without the session gets 401, a forged POST is refused;
    during an `apply` the boot page moves through the phases without a reload."""
    d = browser
    d.get(f"{served.url}/?token={TOKEN}")
    assert d.current_url == served.url + "/"
    text = d.find_element("tag name", "body").text
    assert "restarts used" in text and "max_num_seqs" in text
    _shot(d, "cluster", tmp_path)
    no_session = d.execute_async_script(
        "const cb=arguments[0];fetch('/api/status',{credentials:'omit'}).then(r=>cb(r.status))"
    )
    assert no_session == 401
    forged = d.execute_async_script(
        "const cb=arguments[0];fetch('/',{method:'POST',body:'max_num_seqs=1',"
        "headers:{'Content-Type':'application/x-www-form-urlencoded'}}).then(r=>cb(r.status))"
    )
    assert forged == 405

    d.get(served.url + "/boot")
    d.execute_script(
        "window.__same_page=1;window.__seen=[];new MutationObserver(()=>{"
        "const t=document.getElementById('bphase').textContent;"
        "if(window.__seen[window.__seen.length-1]!==t)window.__seen.push(t)})"
        ".observe(document.getElementById('bphase'),{childList:true,characterData:true,"
        "subtree:true})"
    )
    time.sleep(1.0)  # the page's EventSource connects
    apply = subprocess.Popen(
        [sys.executable, "-m", "spark_ops.cli.main", "apply", "--max-num-seqs", "7", "-y"],
        env=served.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    shot = False
    deadline = time.monotonic() + 240
    while apply.poll() is None and time.monotonic() < deadline:
        state = d.find_element("id", "bstate").text
        if not shot and state == "booting" and len(d.execute_script("return window.__seen")) >= 3:
            _shot(d, "boot", tmp_path)
            shot = True
        time.sleep(0.2)
    _, err = apply.communicate(timeout=60)
    assert apply.returncode == 0, err
    give_up = time.monotonic() + 60  # the page's last events arrive: wait for READY, not a time
    while "READY" not in (seen := d.execute_script("return window.__seen")):
        assert time.monotonic() < give_up, seen
        time.sleep(0.1)
    assert d.execute_script("return window.__same_page") == 1  # no reload happened
    assert "STARTING" in seen and "READY" in seen, seen
    ranks = [RANKS[p] for p in seen if p in RANKS]
    assert len(set(ranks)) >= 3 and ranks == sorted(ranks), seen
    assert d.find_element("id", "bstate").text == "no boot under way"
    if not shot:
        _shot(d, "boot", tmp_path)
    d.get(served.url + "/boot")  # idle: words, never "undefined"; the engine log's tail
    text = d.find_element("tag name", "body").text
    assert "undefined" not in text and "READY for" not in text, text
    assert "no boot watched since this server started" in text or "ended at READY" in text
    assert d.find_element("id", "tail").text.strip(), "the engine log's tail is shown"

    d.get(served.url + "/")  # the cluster page lives: sections come again without a reload
    d.execute_script("window.__same_page=1")
    give_up = time.monotonic() + 60
    while not d.execute_script("return Number(document.body.dataset.updates||0)>=1"):
        assert time.monotonic() < give_up, "no /events/cluster update reached the page"
        time.sleep(0.2)
    assert d.execute_script("return window.__same_page") == 1
    text = d.find_element("tag name", "body").text
    assert "undefined" not in text and "NaN" not in text, text
    assert "NVIDIA GB10" in text and "MemAvailable" in text and "rank 0 (serves the API)" in text
    assert "status " in text and ("just now" in text or " s old" in text)
    assert d.find_element("id", "gauge") and d.find_element("id", "timeline")
    height = d.execute_script("return document.documentElement.scrollHeight")
    d.set_window_size(1200, min(int(height) + 140, 4000))  # the whole page in one picture
    _shot(d, "cluster", tmp_path)  # the page as an operator leaves it open
    d.set_window_size(1200, 1100)
    for page in ("history", "sweeps"):
        d.get(f"{served.url}/{page}")
        text = d.find_element("tag name", "body").text
        assert "undefined" not in text, (page, text)
        assert page != "history" or "one entry per operation" in text, text
        _shot(d, page, tmp_path)


@pytest.mark.parametrize("given", [None, "", "x", "ab" * 16 + "!"])
def test_same_token_refuses_anything_but_the_token(given: str | None) -> None:
    """The one comparison behind the Bearer header and ?token=: nothing, an empty value or
    another value is never the token."""
    from spark_ops.serve.auth import same_token

    token = "ab" * 16
    assert not same_token(given, token)
    assert same_token(token, token)
