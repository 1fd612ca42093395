"""`serve` under a fleet (docs/fleet.md): one process, one token, the fleet's page at /, each
cluster's pages under /c/NAME/, /metrics with every cluster's samples. Against two real embedded
clusters side by side (started once for the module) and a third whose head does not answer."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import start_sim

from spark_ops.serve.fleetapp import merge_metrics, overview_row, reading
from spark_ops.serve.html import page, url

DEADLINE_S = 120.0  # a generous bound on one answer on a loaded machine
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@dataclass
class FleetServer:
    """A running `spark-ops --fleet F serve`: where it listens and its token."""

    host: str
    port: int
    token: str

    def get(
        self, path: str, token: str | None = "", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], str]:
        """One GET: status, headers, body (a stream: its first event only). token "": this
        server's; None: no credential."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=DEADLINE_S)
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token or self.token}"
        try:
            conn.request("GET", path, headers=sent)
            answer = conn.getresponse()
            got = {k.lower(): v for k, v in answer.getheaders()}
            if got.get("content-type", "").startswith("text/event-stream"):
                body = _first_event(answer)
            else:
                body = answer.read().decode()
            return answer.status, got, body
        finally:
            conn.close()


def _first_event(answer: http.client.HTTPResponse) -> str:
    """The first server-sent event's data (a keepalive comment skipped)."""
    lines: list[str] = []
    while True:
        line = answer.fp.readline().decode()
        if not line:
            return "\n".join(lines)
        if line.strip() == "" and any(x.startswith("data:") for x in lines):
            return "\n".join(x for x in lines if x.startswith("data:"))
        lines.append(line.rstrip("\n"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetServer]:
    """Two embedded 2-node clusters (east, west) and one whose nodes refuse SSH (gone), served
    by one `spark-ops --fleet F serve`."""
    from spark_ops.sim.control import down, wait_serving

    root = tmp_path_factory.mktemp("fleetserve")
    a = start_sim(root / "a", nodes=2)
    try:
        b = start_sim(root / "b", nodes=2)
    except BaseException:
        down(a.root)
        raise
    proc: subprocess.Popen[str] | None = None
    try:
        wait_serving(a.state)
        wait_serving(b.state)
        ports = iter(range(1, 100))  # nothing listens there: each node's connection is refused
        dead = re.sub(r"port: \d+", lambda _: f"port: {next(ports)}", b.inventory.read_text())
        (root / "gone.yaml").write_text(dead.replace("~/recipes/", "~/gone/recipes/"))
        (root / "fleet.yaml").write_text(
            f"clusters:\n  - {{name: east, inventory: {a.inventory}}}\n"
            f"  - {{name: west, inventory: {b.inventory}}}\n"
            "  - {name: gone, inventory: gone.yaml}\n"
        )
        token = secrets.token_urlsafe(24)
        token_file = root / "token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_OPS_")}
        env["HOME"] = str(root / "home")
        proc = subprocess.Popen(
            [sys.executable, "-m", "spark_ops.cli.main", "--fleet", str(root / "fleet.yaml"),
             "serve", "--port", "0", "--json", "--token-file", str(token_file)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "serve did not start"
        where = json.loads(line)["url"].removeprefix("http://")
        host, _, port = where.rpartition(":")
        yield FleetServer(host, int(port), token)
    finally:
        if proc is not None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=60)
        down(b.root)
        down(a.root)


def _rows(body: str) -> dict[str, str]:
    """The fleet page's rows by cluster name (each row's HTML)."""
    rows = re.findall(r"<tr>(.*?)</tr>", body)
    out = {}
    for row in rows:
        name = re.search(r'<a href="/c/([a-z0-9_-]+)/">', row)
        if name:
            out[name.group(1)] = row
    return out


def test_overview_lists_every_cluster_and_the_unreachable_one(served: FleetServer) -> None:
    """/ has a row per cluster with its link; east and west serve, gone's nodes are unreachable."""
    status, _, body = served.get("/")
    assert status == 200
    rows = _rows(body)
    assert list(rows) == ["east", "west", "gone"], body
    for name in ("east", "west"):
        assert "2/2 nodes" in rows[name] and ">serving<" in rows[name], rows[name]
    assert "unreachable" in rows["gone"] and ">serving<" not in rows["gone"], rows["gone"]


def test_the_fleets_table_comes_again_over_its_stream(served: FleetServer) -> None:
    """/events/fleet sends the fleet's table (its section, as the page draws it) with a row per
    cluster: the page at / is live, as each cluster's is."""
    status, headers, event = served.get("/events/fleet")
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    data = json.loads(event.removeprefix("data:").strip())
    assert data["html"].startswith('<section id="fleet">')
    rows = _rows(data["html"])
    assert list(rows) == ["east", "west", "gone"], data["html"]
    assert "unreachable" in rows["gone"] and ">serving<" in rows["east"], rows
    _, _, page_body = served.get("/")
    assert "/events/fleet" in page_body  # the page's script follows the stream


THEIRS = [  # (path under /c/NAME, what shows the cluster's own name, with NAME in it)
    ("/api/status", '"cluster": "NAME"'),
    ("/", "Cluster NAME"),
    ("/metrics", 'spark_ops_build_info{cluster="NAME"'),
    ("/events/cluster", "Cluster NAME"),
]


@pytest.mark.parametrize("name,other", [("east", "west"), ("west", "east")])
@pytest.mark.parametrize("path,mark", THEIRS, ids=[p for p, _ in THEIRS])
def test_each_prefix_shows_its_own_cluster(
    served: FleetServer, name: str, other: str, path: str, mark: str
) -> None:
    """/c/NAME/… shows NAME's facts, never the other cluster's."""
    status, _, body = served.get(f"/c/{name}{path}")
    assert status == 200, body
    if path == "/api/status":
        body = json.dumps(json.loads(body))
    assert mark.replace("NAME", name) in body, body[:2000]
    assert mark.replace("NAME", other) not in body


@pytest.mark.parametrize("name", ["east", "west"])
def test_a_clusters_pages_link_under_its_prefix(served: FleetServer, name: str) -> None:
    """Every link of a cluster's pages and its streams' base stay under /c/NAME; the nav leads
    back to the fleet."""
    for path in ("/", "/boot", "/history", "/sweeps"):
        status, _, body = served.get(f"/c/{name}{path}")
        assert status == 200, (path, body)
        assert f'data-base="/c/{name}"' in body
        hrefs = re.findall(r'href="([^"]*)"', body)
        assert "/" in hrefs, hrefs
        assert all(h == "/" or h.startswith(f"/c/{name}/") for h in hrefs), hrefs


PROTECTED = [
    "/", "/metrics", "/c/east/", "/c/west/", "/c/east/boot", "/c/west/history",
    "/c/east/sweeps", "/c/west/api/status", "/c/east/api/log", "/c/west/metrics",
    "/c/east/events", "/c/west/events", "/c/east/events/cluster", "/c/west/events/cluster",
    "/c/gone/", "/c/gone/events/cluster", "/c/east", "/c/nowhere/", "/events", "/events/fleet",
]  # fmt: skip


@pytest.mark.parametrize("path", PROTECTED)
@pytest.mark.parametrize("token", [None, "wrong-" + "x" * 30], ids=["none", "wrong"])
def test_the_token_is_required_on_every_prefix_and_stream(
    served: FleetServer, path: str, token: str | None
) -> None:
    """Without the token, or with another, every page and stream of every cluster is 401."""
    status, _, body = served.get(path, token=token)
    assert status == 401, body
    assert "east" not in body and "west" not in body


@pytest.mark.parametrize("name", ["east", "west"])
def test_a_clusters_bare_prefix_leads_to_its_page(served: FleetServer, name: str) -> None:
    """/c/NAME (no slash) is its page's address, /c/NAME/; without the token, 401 first."""
    status, headers, _ = served.get(f"/c/{name}")
    assert status == 302 and headers["location"] == f"/c/{name}/", headers
    assert served.get(f"/c/{name}", token=None)[0] == 401


def test_one_login_opens_every_cluster(served: FleetServer) -> None:
    """?token= once on a cluster's page: redirected there without it, and its session cookie
    opens the fleet page and the other cluster's pages too."""
    status, headers, _ = served.get(f"/c/west/boot?token={served.token}", token=None)
    assert status == 303 and headers["location"] == "/c/west/boot", headers
    cookie = headers["set-cookie"].split(";", 1)[0]
    for path in ("/", "/c/east/", "/c/west/history"):
        assert served.get(path, token=None, headers={"Cookie": cookie})[0] == 200, path


def test_metrics_has_every_clusters_samples_once_per_family(served: FleetServer) -> None:
    """/metrics: both clusters' samples under their label, each family's HELP once, and which
    clusters answered."""
    status, _, body = served.get("/metrics")
    assert status == 200
    for name in ("east", "west"):
        assert f'spark_ops_engine_up{{cluster="{name}"}} 1.0' in body, body
        assert f'spark_ops_fleet_cluster_answered{{cluster="{name}"}} 1.0' in body
    helps = re.findall(r"^# HELP (\S+)", body, re.M)
    assert len(helps) == len(set(helps)), helps
    from prometheus_client.parser import text_string_to_metric_families

    up = next(f for f in text_string_to_metric_families(body) if f.name == "spark_ops_engine_up")
    assert sorted(s.labels["cluster"] for s in up.samples) == ["east", "gone", "west"]


MERGES = [  # (pages, the merged page)
    (["# HELP a x\n# TYPE a gauge\na{c=\"1\"} 1\n", "# HELP a x\n# TYPE a gauge\na{c=\"2\"} 2\n"],
     "# HELP a x\n# TYPE a gauge\na{c=\"1\"} 1\na{c=\"2\"} 2\n"),
    (["# HELP a x\n# TYPE a gauge\na 1\n# HELP b y\n# TYPE b gauge\nb 3\n",
      "# HELP b y\n# TYPE b gauge\nb 4\n"],
     "# HELP a x\n# TYPE a gauge\na 1\n# HELP b y\n# TYPE b gauge\nb 3\nb 4\n"),
    ([], "\n"),
]  # fmt: skip


@pytest.mark.parametrize("pages,merged", MERGES)
def test_merge_metrics(pages: list[str], merged: str) -> None:
    """Pages merged: a family's HELP and TYPE once, its samples together, in order."""
    assert merge_metrics(pages) == merged


URLS = [("", "/boot", "/boot"), ("", "/", "/"), ("/c/east", "/boot", "/c/east/boot"),
        ("/c/east", "/", "/c/east/"), ("/c/a&b", "/", "/c/a&amp;b/")]  # fmt: skip


@pytest.mark.parametrize("base,path,made", URLS)
def test_url_is_the_one_place_an_address_is_made(base: str, path: str, made: str) -> None:
    """A page's address under its base, escaped; the single cluster's pages keep theirs."""
    assert url(base, path) == made


def test_the_single_clusters_page_is_unchanged_at_the_root() -> None:
    """Without a base: the nav of today (/, /boot, /history, /sweeps), no fleet link."""
    hrefs = re.findall(r'href="([^"]*)"', page("Boot", "/boot", "x"))
    assert hrefs == ["/", "/boot", "/history", "/sweeps"]
    assert 'data-base=""' in page("Boot", "/boot", "x")


ROWS = [  # (reading, cells that must be in the row)
    ({"error": "no answer within 20 s"}, ["unreachable", "no answer within 20 s"]),
    ({"status": {"nodes": [{"reachable": True}], "verdict": {"state": "<b>x</b>"},
                 "budget": {"used": 1, "allowed": 2}}, "audit": {"entries": []}},
     ["1/1 nodes", "&lt;b&gt;x&lt;/b&gt;", "1/2", "none"]),
]  # fmt: skip


@pytest.mark.parametrize("got,cells", ROWS)
def test_overview_row(got: dict[str, Any], cells: list[str]) -> None:
    """A row says the cluster's facts, escaped; one that did not answer says so."""
    row = "".join(overview_row("east", got, 0.0))
    assert '<a href="/c/east/">east</a>' in row
    for cell in cells:
        assert cell in row, row


def test_a_cluster_past_its_deadline_is_an_error_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster whose reading does not end in time is an `error` reading (its row says so); the
    page does not wait for it."""
    import spark_ops.serve.fleetapp as fleetapp

    monkeypatch.setattr(fleetapp, "READ_S", 0.05)

    class Hung:
        """A reading that never ends."""

        async def get(self) -> Any:
            """Never."""
            await asyncio.Event().wait()

    class Src:
        """A source whose every reading hangs."""

        status = audit = hardware = Hung()

    class M:
        """A member with a long deadline of its own."""

        deadline_s = 70.0

    got = asyncio.run(reading(M(), Src()))  # type: ignore[arg-type]
    assert "no answer within" in got["error"]


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless chromium (as test_serve drives it), skipped where it is missing."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("chromium and chromedriver not installed")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium not installed (pip install -e '.[test]')")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-sync",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):  # fmt: skip
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(DEADLINE_S)
    try:
        yield driver
    finally:
        driver.quit()


def test_browser_logs_in_once_and_each_clusters_page_is_live(
    served: FleetServer, browser: Any
) -> None:
    """As a person: the login URL opens the fleet's page, whose table comes again over its
    stream; a cluster's page, reached by its link, gets its own live sections over its own
    stream (the page's script under its prefix)."""
    from selenium.webdriver.support.ui import WebDriverWait

    top = f"http://{served.host}:{served.port}"
    browser.get(f"{top}/?token={served.token}")
    assert browser.current_url == top + "/"
    WebDriverWait(browser, DEADLINE_S).until(  # the fleet's table comes again, live
        lambda d: int(d.execute_script("return document.body.dataset.updates||0")) >= 1
    )
    assert "gone" in browser.find_element("id", "fleet").text
    for name, other in (("west", "east"), ("east", "west")):
        browser.find_element("link text", name).click()
        assert browser.current_url == f"{top}/c/{name}/"
        WebDriverWait(browser, DEADLINE_S).until(
            lambda d: int(d.execute_script("return document.body.dataset.updates||0")) >= 1
        )
        summary = browser.find_element("id", "summary").text
        assert f"Cluster {name}" in summary and other not in summary
        browser.find_element("link text", "Fleet").click()
        assert browser.current_url == top + "/"
