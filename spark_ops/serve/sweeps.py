"""Saved sweeps for serve's sweeps page, read in a child process under a budget (issue 34).

Reading a saved sweep and making its what-if is CPU work in pure Python: one file at the allowed
maxima (1,000 levels, caps of 100,000) takes seconds to minutes, and a thread doing it can be
neither stopped nor waited for at shutdown. So the reading runs here, in one child process at a
time (`python -m spark_ops.serve.sweeps`, the request as JSON on stdin, one JSON line per answer
on stdout), which serve kills when the read's budget (READ_BUDGET_S, the whole of --results) is
spent or when serve stops. A child also ends itself (SIGALRM) a little after the budget, should
serve be SIGKILLed.

Each file's row is kept by the file's identity (device, inode, size, modification time in ns,
name): a file read once is not read again until it changes, so every read makes progress on the
files not yet read. A file that alone took FILE_BUDGET_S when the budget ran out gets an error row,
kept like any other until the file changes; the files the budget did not reach say so and are read
by the next read.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

from spark_ops.bench.report import RateResult, load_saved
from spark_ops.bench.whatif import running_cap_of, whatif_of
from spark_ops.errors import SparkOpsError

MAX_RESULTS = 20  # saved sweeps shown (newest first)
READ_BUDGET_S = 20.0  # one read of --results, every file: within the handler's deadline (30 s)
FILE_BUDGET_S = 10.0  # a file still not read after this when the budget ends: an error row
MAX_ROW_BYTES = 4 << 20  # one file's row as the page gets it; a sweep bench writes is kilobytes
MAX_KEPT_BYTES = 16 << 20  # all rows kept (in serve's memory, on the page) together
ALARM_MARGIN_S = 5  # the child ends itself this long after the budget (serve killed meanwhile)
_SURROGATE = re.compile("[\ud800-\udfff]")
# The directory that holds the spark_ops package: the child's cwd, so that `python -m` imports
# nothing from the directory serve was started in.
PACKAGE_HOME = str(Path(__file__).resolve().parents[2])


def load_sweep(path: Path) -> dict[str, Any]:
    """One saved sweep with bench's what-if for half its cap; a file that is not one, or whose
    what-if cannot be made, is shown with why (one odd file never takes the page down)."""
    try:
        saved = load_saved(path)
        if isinstance(saved, RateResult):  # an open-loop sweep: its table, no concurrency chart
            return {"file": path.name, "openloop": saved.to_dict()}
        result = saved
        run: dict[str, Any] = {"file": path.name, "result": result.to_dict()}
    except SparkOpsError as exc:
        return {"file": path.name, "error": exc.message}
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a shape bench never wrote
        return {"file": path.name, "error": f"not a sweep bench wrote ({type(exc).__name__})"}
    try:
        cap = running_cap_of(result.knobs)
        if cap and cap > 1:  # bench's what-if predicts lower caps: half the one swept
            run["whatif"] = whatif_of(result, [cap // 2]).to_dict()
    except SparkOpsError as exc:
        run["whatif_error"] = exc.message
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        run["whatif_error"] = f"no what-if for this sweep ({type(exc).__name__})"
    return run


def listing(results: Path, limit: int = MAX_RESULTS) -> list[tuple[str, str]]:
    """The newest `limit` *.json files of a directory as (name, identity key); a file gone
    meanwhile keeps its name with an identity of its own (its row says why)."""
    found: list[tuple[int, str, str]] = []
    with os.scandir(results) as entries:
        for entry in entries:
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue  # as glob("*.json"): no hidden files
            named = os.fsencode(entry.name).hex()  # a key is ASCII whatever the name's bytes
            try:
                st = entry.stat()
            except OSError:
                found.append((0, entry.name, f"gone:{named}"))
                continue
            key = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{named}"
            found.append((st.st_mtime_ns, entry.name, key))
    found.sort(key=lambda f: (f[0], f[1]), reverse=True)
    return [(name, key) for _, name, key in found[:limit]]


def row_of(path: Path) -> dict[str, Any]:
    """load_sweep's row, or an error row when it fails otherwise or is too large for the page."""
    try:
        row = load_sweep(path)
        text = json.dumps(row, default=str)
    except Exception as exc:  # the child's one file: any failure is its row, the others go on
        return {"file": path.name, "error": f"cannot be shown ({type(exc).__name__})"}
    if len(text) > MAX_ROW_BYTES:
        return {
            "file": path.name,
            "error": f"its page data is {len(text):,} bytes, over the {MAX_ROW_BYTES:,} this "
            "page shows",
        }
    return row


def _say(message: dict[str, Any]) -> None:
    """One JSON line to the parent, at once; a lone surrogate (a file name's byte that is not
    UTF-8, a `\\ud800` in a file) is sent as U+FFFD: a page must be able to encode it."""
    text = _SURROGATE.sub("\ufffd", json.dumps(message, default=str, ensure_ascii=False))
    sys.stdout.buffer.write(text.encode("utf-8") + b"\n")
    sys.stdout.flush()


def main() -> None:
    """The child: read {"dir", "limit", "known", "budget_s"} on stdin; say the listing, then
    for each file whose key is not known, {"start": key} and {"key", "row"}."""
    request = json.loads(sys.stdin.read())
    signal.alarm(math.ceil(float(request["budget_s"])) + ALARM_MARGIN_S)  # default: it ends
    results = Path(request["dir"])
    try:
        files = listing(results, int(request["limit"]))
    except OSError as exc:
        _say({"error": f"{results}: cannot list: {exc.strerror or exc}"})
        return
    _say({"files": files})
    known = set(request["known"])
    for name, key in files:
        if key not in known:
            _say({"start": key})
            _say({"key": key, "row": row_of(results / name)})


class SweepReader:
    """The saved sweeps of one --results directory, read by one child at a time under a budget;
    rows kept by file identity; the last answer shared for `ttl` seconds."""

    def __init__(
        self,
        results: Path,
        *,
        ttl: float,
        budget_s: float = READ_BUDGET_S,
        file_budget_s: float = FILE_BUDGET_S,
    ) -> None:
        """Nothing read yet."""
        self.results = results
        self.ttl = ttl
        self.budget_s = budget_s
        self.file_budget_s = file_budget_s
        self.rows: dict[str, dict[str, Any]] = {}  # identity key -> row (read, or too slow)
        self.sizes: dict[str, int] = {}  # identity key -> its row's size as the child sent it
        self.value: dict[str, Any] | None = None
        self.at = -math.inf
        self.task: asyncio.Task[dict[str, Any]] | None = None

    async def get(self) -> dict[str, Any]:
        """The sweeps: the last answer while fresh, else the read under way (one at a time; a
        request that goes away never stops it, serve's end does)."""
        loop = asyncio.get_running_loop()
        if self.value is not None and loop.time() - self.at < self.ttl:
            return self.value
        if self.task is None or self.task.done():
            self.task = asyncio.create_task(self._read(), name="serve-sweeps")
        return await asyncio.shield(self.task)

    async def close(self) -> None:
        """Stop a read under way (its child killed)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def _read(self) -> dict[str, Any]:
        """One read: the child lists and reads what is not kept yet, until done or the budget
        is spent (then it is killed)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.budget_s
        answer: dict[str, Any] = {"dir": str(self.results), "runs": []}
        files: list[tuple[str, str]] | None = None
        current: tuple[str, float] | None = None  # the key being read, since when
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "spark_ops.serve.sweeps",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                cwd=PACKAGE_HOME,  # `-m` puts the cwd first on sys.path: never the operator's
                limit=MAX_ROW_BYTES + (64 << 10),
            )  # fmt: skip
        except OSError as exc:  # no process to be had (its limit, memory)
            answer["error"] = f"cannot start the reader of {self.results}: {exc}"
            self.value, self.at = answer, loop.time()
            return answer
        try:
            assert proc.stdin is not None and proc.stdout is not None  # PIPEs
            proc.stdin.write(json.dumps({
                "dir": str(self.results), "limit": MAX_RESULTS, "known": list(self.rows),
                "budget_s": self.budget_s,
            }).encode())  # fmt: skip
            await proc.stdin.drain()
            proc.stdin.close()
            while True:
                line = await asyncio.wait_for(proc.stdout.readline(), deadline - loop.time())
                if not line:  # the child ended: done, or died on the file it was reading
                    if current is not None:
                        await proc.wait()
                        self.rows[current[0]] = {"error": self._died(proc.returncode)}
                    break
                said = json.loads(line)
                if "error" in said:
                    answer["error"] = said["error"]
                elif "files" in said:
                    files = [(str(name), str(key)) for name, key in said["files"]]
                    self._forget_all_but({key for _, key in files})
                elif "start" in said:
                    current = (str(said["start"]), loop.time())
                else:
                    self._keep(str(said["key"]), said["row"], len(line))
                    current = None
        except TimeoutError:
            if current is not None and loop.time() - current[1] >= self.file_budget_s:
                self.rows[current[0]] = {"error": self._too_slow()}
        except (ValueError, OSError) as exc:  # a line past the limit, the pipe gone
            answer["error"] = f"the reader of {self.results} failed: {exc}"
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
        if files is None:
            answer.setdefault("error", f"{self.results}: not listed within {self.budget_s:g} s")
        else:
            answer["runs"] = [self._row(name, key) for name, key in files]
        self.value, self.at = answer, loop.time()
        return answer

    def _forget_all_but(self, keys: set[str]) -> None:
        """Drop the rows of files no longer listed (changed, gone, or past the newest)."""
        self.rows = {k: v for k, v in self.rows.items() if k in keys}
        self.sizes = {k: v for k, v in self.sizes.items() if k in keys}

    def _keep(self, key: str, row: dict[str, Any], size: int) -> None:
        """Keep a file's row, unless the rows kept already fill MAX_KEPT_BYTES (its error then,
        kept the same way: the file is not read again until it changes)."""
        if sum(self.sizes.values()) + size > MAX_KEPT_BYTES:
            row = {"error": f"not shown: the other sweeps take the {MAX_KEPT_BYTES:,} bytes "
                   "this page keeps"}  # fmt: skip
            size = 0
        self.rows[key], self.sizes[key] = row, size

    def _row(self, name: str, key: str) -> dict[str, Any]:
        """A file's row: the one kept for its identity, or why there is none yet."""
        row = self.rows.get(key)
        if row is None:
            return {
                "file": name,
                "error": f"not read yet: this read's {self.budget_s:g} s were spent on other "
                "files; the next read goes on",
            }
        return {**row, "file": name}

    @staticmethod
    def _died(code: int | None) -> str:
        """The error row of a file the child ended on (killed by a signal, or crashed)."""
        how = f"signal {-code}" if code is not None and code < 0 else f"exit {code}"
        return f"reading it ended the reader ({how})"

    def _too_slow(self) -> str:
        """The error row of a file that alone took the file budget."""
        return (
            f"not read within {self.file_budget_s:g} s: too large a sweep for this page "
            "(`spark-ops bench compare` reads it)"
        )


if __name__ == "__main__":
    main()
