"""The walk of one knob: which spark_ops files `apply --max-num-seqs N` passes the value through.

Starts the embedded cluster in a temporary directory, runs `spark-ops apply --max-num-seqs N --yes`
in this process under a profile hook, and lists every spark_ops file with a function that was
called holding the knob: the value itself under a knob's name, the `Change` that carries it, a
recipe text or command line naming it, or a container of those one level down. What runs on the
nodes (sh programs, the head's history program) is outside this process: the walk ends where
remote/ sends a command. Usage: python scripts/knob_walk.py [--value 64] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = str(ROOT / "spark_ops") + os.sep


def _holds(
    value: object, needles: tuple[str, ...], number: int, name: str, depth: int, objects: bool
) -> bool:
    """Whether one local holds the knob: its text, its Change, its number under a knob's name, or
    (`depth` levels down) a container or spark_ops object holding one of those."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        named = "num_seqs" in name and value.strip() == str(number)
        return named or any(n in value for n in needles)
    if isinstance(value, int) and not isinstance(value, bool):
        return value == number and "num_seqs" in name
    if type(value).__name__ == "Change":
        return getattr(value, "name", "") == "max_num_seqs" and str(value.value) == str(number)  # type: ignore[attr-defined]
    if depth <= 0:
        return False
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_holds(v, needles, number, name, depth - 1, objects) for v in list(value)[:64])
    if isinstance(value, dict):
        items = list(value.items())[:64]
        return any(_holds(v, needles, number, str(k), depth - 1, objects) for k, v in items)
    if objects and type(value).__module__.startswith("spark_ops.") and hasattr(value, "__dict__"):
        items = list(vars(value).items())[:64]
        return any(_holds(v, needles, number, k, depth - 1, objects) for k, v in items)
    return False


class Walk:
    """A profile hook that notes every spark_ops function called with the knob in its arguments."""

    def __init__(self, number: int) -> None:
        """Look for `number` (and its spellings in recipe text and vLLM's args line)."""
        self.number = number
        self.needles = (
            f"--max-num-seqs {number}",
            f"--max-num-seqs={number}",
            f"max_num_seqs={number}",
            f"'max_num_seqs': {number}",
            f"max_num_seqs: {number}",
        )
        self.value: dict[str, set[str]] = defaultdict(set)  # the value, its Change, its text
        self.carried: dict[str, set[str]] = defaultdict(set)  # an object holding those

    def hook(self, frame: FrameType, event: str, _arg: object) -> None:
        """On each call into spark_ops: look at the arguments the function received."""
        if event != "call" or not frame.f_code.co_filename.startswith(PACKAGE):
            return
        code = frame.f_code
        names = [n for n in code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]]
        values = [(n, frame.f_locals.get(n)) for n in names if n != "self"]
        rel = os.path.relpath(code.co_filename, ROOT)
        qualname = getattr(code, "co_qualname", code.co_name)
        find = self.needles, self.number
        if any(_holds(v, *find, n, 1, objects=False) for n, v in values):
            self.value[rel].add(qualname)
        elif any(_holds(v, *find, n, 3, objects=True) for n, v in values):
            self.carried[rel].add(qualname)


def run(number: int) -> dict[str, Any]:
    """Start the embedded cluster, apply the knob under the hook, stop the cluster."""
    from spark_ops.cli.main import main

    with tempfile.TemporaryDirectory(prefix="knob-walk-") as tmp:
        sim = os.path.join(tmp, "sim")
        env = {**os.environ, "HOME": tmp}
        cli = [sys.executable, "-m", "spark_ops.cli.main"]
        up = [*cli, "sim", "up", "--dir", sim, "--time-scale", "20"]
        subprocess.run(up, env=env, check=True, stdout=sys.stderr)
        walk = Walk(number)
        old_home = os.environ.get("HOME")
        os.environ["HOME"] = tmp
        argv = ["-i", os.path.join(sim, "inventory.yaml"), "apply", "--max-num-seqs", str(number)]
        threading.setprofile(walk.hook)
        sys.setprofile(walk.hook)
        code: object = None
        try:
            with contextlib.redirect_stdout(sys.stderr):  # stdout is this script's report
                code = main([*argv, "--yes"])
        except SystemExit as exc:
            code = exc.code
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type,unused-ignore]
            if old_home is not None:
                os.environ["HOME"] = old_home
            down = [*cli, "sim", "down", "--dir", sim]
            subprocess.run(down, env=env, check=False, stdout=sys.stderr)
    value = {f: sorted(fns) for f, fns in sorted(walk.value.items())}
    carried = {f: sorted(fns) for f, fns in sorted(walk.carried.items()) if f not in value}
    return {"exit": code, "value": value, "carried": carried}


def main() -> None:
    """Print the files (and functions) the knob passed through."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--value", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.value)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
        return
    value, carried = result["value"], result["carried"]
    sys.stdout.write(
        f"apply --max-num-seqs {args.value} (exit {result['exit']}): the value, its Change or a "
        f"text naming it passes through {len(value)} files\n"
    )
    for path, fns in value.items():
        sys.stdout.write(f"  {path}: {', '.join(fns)}\n")
    sys.stdout.write(f"{len(carried)} more files receive only an object holding it (a plan):\n")
    for path, fns in carried.items():
        sys.stdout.write(f"  {path}: {', '.join(fns)}\n")


if __name__ == "__main__":
    main()
