"""The last doctor report of a cluster, kept on this machine so that `serve` can show it.

`spark-ops doctor` writes its report (with when and who) to
`~/.local/state/spark-ops/doctor-<cluster>.json` through the one local writer; the page and
/metrics read it back. Keeping it is best effort: a report that cannot be kept is a warning, never
a failed doctor. Reading it never raises: a file missing is "no doctor run here yet", a file too
big, not JSON or not a report is said as such.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from spark_ops.account import local_account
from spark_ops.doctor.report import DoctorReport
from spark_ops.errors import SparkOpsError
from spark_ops.files import NotRegularFile, read_regular, write_file
from spark_ops.log import get_logger

STATE_DIR = Path("~/.local/state/spark-ops")  # beside boots.json and serve.token
MAX_BYTES = 1 << 20  # a report is a few KiB; more is not ours

log = get_logger(op="doctor")


def last_path(cluster: str, state_dir: Path | None = None) -> Path:
    """Where the last doctor report of `cluster` is kept (its name quoted into one file name)."""
    base = (state_dir or STATE_DIR).expanduser()
    return base / f"doctor-{quote(cluster, safe='')}.json"


def keep_report(report: DoctorReport, *, state_dir: Path | None = None) -> Path | None:
    """Keep report as the cluster's last doctor result; None (and a warning) when it cannot."""
    path = last_path(report.cluster, state_dir)
    record = {"when": time.time(), "who": local_account(), "report": report.to_dict()}
    if path.is_symlink() or (path.exists() and not path.is_file()):
        log.warning("doctor report not kept: not a regular file of ours", path=str(path))
        return None  # the writer writes through a link: never into a file it points at
    try:
        write_file(path, json.dumps(record, indent=1) + "\n", make_parents=True)
    except SparkOpsError as exc:
        log.warning("doctor report not kept", path=str(path), error=exc.message)
        return None
    return path


def read_last(cluster: str, *, state_dir: Path | None = None) -> dict[str, Any] | None:
    """The last kept report of cluster ({"when", "who", "report"}), None when none was kept, or
    {"error": …} naming the file when it cannot be read as one."""
    path = last_path(cluster, state_dir)
    try:  # not blocking on a FIFO, not through a link: the server reads it on its event loop
        raw = read_regular(path, limit=MAX_BYTES, follow=False)
    except FileNotFoundError:
        return None
    except NotRegularFile:
        return {"error": f"{path}: not a regular file"}
    except OSError as exc:
        return {"error": f"{path}: {exc.strerror or exc}"}
    if len(raw) > MAX_BYTES:
        return {"error": f"{path}: larger than {MAX_BYTES} bytes, not a doctor report"}
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # nested past the stack
        return {"error": f"{path}: not a doctor report ({str(exc)[:200]})"}
    report = data.get("report") if isinstance(data, dict) else None
    if not isinstance(report, dict) or not isinstance(report.get("checks"), list):
        return {"error": f"{path}: not a doctor report (no checks)"}
    return {"when": data.get("when"), "who": data.get("who"), "report": report}
