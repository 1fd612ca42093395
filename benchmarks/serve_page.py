"""How heavy are `spark-ops serve`'s pages, and how soon does a browser paint them?

Starts an embedded cluster and `spark-ops serve` on it (a saved sweep from tests/fixtures/serve
for the sweeps page), then loads each page in Debian's headless chromium (selenium, chromedriver)
and reads the browser's own performance timing: the document's size on the wire and decoded,
first paint and first contentful paint, and the DOM's completion. Every page is one document:
no script, style sheet, font or image is fetched besides it (the table's last column counts what
was). The cluster and history pages read the cluster over SSH (a few seconds' cache), so their
first load includes that reading: the table shows the median of the loads after the first.

    python benchmarks/serve_page.py [--loads 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c

from spark_ops.sim.cluster import SimOptions
from spark_ops.sim.control import down, up, wait_serving

PAGES = ("/", "/boot", "/history", "/sweeps", "/metrics")
TIMING = """
const n=performance.getEntriesByType('navigation')[0];
const p=Object.fromEntries(performance.getEntriesByType('paint').map(e=>[e.name,e.startTime]));
return {transfer:n.transferSize, body:n.decodedBodySize, fp:p['first-paint']??null,
        fcp:p['first-contentful-paint']??null, dom:n.domComplete, ttfb:n.responseStart,
        fetched:performance.getEntriesByType('resource').length};
"""


def browser(profile: str) -> Any:
    """Headless chromium with the flags the tests use."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", f"--user-data-dir={profile}"):  # fmt: skip
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


def main() -> None:
    """Print one table: bytes and milliseconds per page (medians)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loads", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        state = up(root / "sim", SimOptions(time_scale=4.0, boot_scale=1.0))
        server = None
        driver = None
        try:
            wait_serving(state)
            token = "benchmark-token-0123456789abcdef"
            (root / "token").write_text(token)
            (root / "token").chmod(0o600)
            env = dict(os.environ, SPARK_OPS_INVENTORY=state["inventory"])
            server = subprocess.Popen(
                [sys.executable, "-m", "spark_ops.cli.main", "serve", "--port", "0", "--json",
                 "--token-file", str(root / "token"),
                 "--results", str(c.REPO / "tests" / "fixtures" / "serve")],
                env=env, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert server.stdout is not None
            url = json.loads(server.stdout.readline())["url"]
            driver = browser(str(root / "profile"))
            driver.get(f"{url}/?token={token}")
            rows = []
            for page in PAGES:
                got = []
                for _ in range(args.loads + 1):
                    driver.get(url + page)
                    got.append(driver.execute_script(TIMING))
                later = got[1:]

                def med(key: str, runs: list[dict[str, Any]] = later) -> str:
                    """The median of one figure, or a dash when the browser gave none."""
                    vals = [r[key] for r in runs if r[key] is not None]
                    return f"{statistics.median(vals):.0f}" if vals else "–"

                rows.append([page, med("transfer"), med("body"), med("ttfb"), med("fp"),
                             med("fcp"), med("dom"), med("fetched")])  # fmt: skip
            print(c.table(
                f"spark-ops serve pages in headless chromium (median of {args.loads} loads)",
                ["page", "bytes on the wire", "bytes decoded", "first byte ms", "first paint ms",
                 "first contentful paint ms", "DOM complete ms", "other requests"],
                rows,
            ))  # fmt: skip
        finally:
            if driver is not None:
                driver.quit()
            if server is not None:
                server.terminate()
                server.wait(timeout=30)
            down(root / "sim")


if __name__ == "__main__":
    main()
