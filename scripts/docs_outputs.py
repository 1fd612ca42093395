"""Run the commands the docs show, on a fresh embedded cluster, and write (or check) their outputs.

    python scripts/docs_outputs.py            # rewrite every generated block in docs/
    python scripts/docs_outputs.py --check    # exit 1, with a diff, when a block is not what runs
    python scripts/docs_outputs.py --check docs/user-guide.md

A generated block is an indented block whose lines start with `$ COMMAND`, each followed by what
that command printed (stdout and stderr, as a terminal shows them), right after a marker comment:

    <!-- run -->                         run the block's commands, show all they print
    <!-- run: exit=16; grep=^(error|hint) -->
                                         the last command exits 16; keep only matching lines,
                                         a `…` line where lines were left out (`gaps=off`: none)
    <!-- run: setup=spark-ops sim stop-node node3; after=spark-ops sim start-node node3 -->
    <!-- run: numbers=vary; loose=^Engine cap -->
                                         a measurement: every number is masked when checking,
                                         and a line matching `loose` (a verdict) as a whole
    <!-- not run: WHY -->                shown as written (a server that runs until stopped …)

A document opts in with `<!-- docs-outputs: sim up OPTIONS[; inventory=PATH] -->`: its blocks run in
order, one session on one embedded cluster started with those options in a temporary directory (its
`.sim` there, HOME there, SPARK_OPS_INVENTORY at PATH in it, by default the sim's own inventory).
`--check` compares with what varies from run to run masked (ports, durations, stamps, clock times,
pids, the directory); the test tests/test_docs_outputs.py runs it.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from spark_ops.audit import local_account, who
from spark_ops.files import sha256_of, write_file

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SHOWN_DIR = "/tmp/g3"  # the directory the docs show the session in
SHOWN_WHO = "alice@workstation"
MARK_RE = re.compile(r"^<!-- (run|not run)(?::\s*(.*?))?\s*-->\s*$")
DOC_RE = re.compile(r"^<!-- docs-outputs: sim up(.*?)(?:; inventory=(\S+))?\s*-->\s*$", re.M)
HOSTS_RE = re.compile(r"127\.0\.0\.1:\d+")
COMMAND_TIMEOUT_S = 300.0

# what varies between two runs of the same session: masked on both sides before comparing
MASKS = [
    (re.compile(r"\d{8}T\d{6}\.\d+Z"), "STAMPTIME"),
    (re.compile(r"\d{8}T\d{6}-[0-9a-f]{6}"), "RUN"),
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(\+00:00)?"), "DATETIME"),
    (re.compile(r"\b\d\d:\d\d(:\d\d)?\b"), "CLOCK"),
    (re.compile(r"\b1[789]\d{8}(\.\d+)?\b"), "STAMP"),
    (re.compile(r"127\.0\.0\.1:\d+"), "127.0.0.1:PORT"),
    (re.compile(r"'127\.0\.0\.1', \d+"), "'127.0.0.1', PORT"),
    (re.compile(r"\bport: \d+"), "port: PORT"),
    (re.compile(r"ports \[[\d, ]+\]"), "ports [PORTS]"),
    (re.compile(r"(?<![A-Za-z])(pid=|pid\": |pids?:? )\d+"), r"\1PID"),
    (re.compile(r'"--port", "\d+"'), '"--port", "PORT"'),
    (re.compile(r"\b\d+ \((python3|vllm|sh)\)"), r"PID (\1)"),
    (re.compile(r"cluster-[0-9a-f]{16}"), "cluster-KEY"),
    # a duration is one to three parts ("4 h", "3 h 59 min"): the parts shown vary with the clock
    (re.compile(r"\b\d+(\.\d+)? ?(ms|s|min|h)\b( \d+(\.\d+)? ?(ms|s|min|h)\b){0,2}"), "DURATION"),
    (re.compile(r"\b\d+(\.\d+)?(?= ?(ms|s|min|h|GiB)\b)"), "N"),
    (re.compile(r"token=\S+"), "token=TOKEN"),
    (re.compile(r"\d+(?= request\(s\) running or waiting)"), "N"),  # the watchdog's probe too
    (re.compile(r"\bN h N min\b"), "N h"),  # a slot freeing "in 2 h" or "in 1 h 59 min"
]
NUMBER_RE = re.compile(r"\d[\d,.]*")
# a line only spark-ops prints: a block holding one shows its output (pasted, or generated)
OUTPUT_RE = re.compile(
    r"^([✓✗] \S+ \(|[✓✗] [a-z-]+ +node\d|Verdict: |Restart budget: |Plan: \S+ on cluster |"
    r"Experiment (on cluster|finished|interrupted) |Ready for apply|Not ready for apply|Done: )"
)


@dataclass
class Block:
    """One generated block: where it is, its options, its commands and the output it shows."""

    start: int  # index of its first line in the document
    end: int  # index after its last line
    options: dict[str, str]
    commands: list[str]
    shown: list[str]  # the block's lines, without the 4-space indent

    def option(self, key: str, default: str = "") -> str:
        """One option of the marker."""
        return self.options.get(key, default)


@dataclass
class Document:
    """A Markdown file with its generated blocks and the sim options of its session."""

    path: Path
    lines: list[str]
    sim_args: list[str]
    inventory: str  # relative to the session's directory
    sha256: str  # of the text read: a file edited meanwhile is not replaced
    blocks: list[Block] = field(default_factory=list)


def parse_options(text: str | None) -> dict[str, str]:
    """`key=value; key=value` of a marker (a value may hold `=`, never `; `)."""
    out: dict[str, str] = {}
    for part in (text or "").split("; "):
        if part.strip():
            key, _, value = part.partition("=")
            out[key.strip()] = value.strip()
    return out


def read_document(path: Path) -> Document | None:
    """The document's generated blocks, or None when it does not opt in."""
    text = path.read_text(encoding="utf-8")
    head = DOC_RE.search(text)
    if head is None:
        return None
    inventory = head.group(2) or ".sim/inventory.yaml"
    args = shlex.split(head.group(1))
    doc = Document(path, text.split("\n"), args, inventory, sha256_of(text.encode("utf-8")))
    i = 0
    while i < len(doc.lines):
        mark = MARK_RE.match(doc.lines[i])
        i += 1
        if mark is None or mark.group(1) != "run":
            continue
        while i < len(doc.lines) and not doc.lines[i].strip():
            i += 1
        start = i
        while i < len(doc.lines) and (doc.lines[i].startswith("    ") or not doc.lines[i].strip()):
            i += 1
        while i > start and not doc.lines[i - 1].strip():
            i -= 1
        shown = [line[4:] for line in doc.lines[start:i]]
        commands = [line[2:] for line in shown if line.startswith("$ ")]
        if not shown or not shown[0].startswith("$ "):
            raise SystemExit(f"{path}:{start + 1}: a `<!-- run -->` block must start with `$ `")
        doc.blocks.append(Block(start, i, parse_options(mark.group(2)), commands, shown))
    return doc


class Session:
    """One embedded cluster in a temporary directory, and the commands run against it."""

    def __init__(self, sim_args: list[str], inventory: str) -> None:
        """Start the cluster the document names."""
        self.tmp = tempfile.TemporaryDirectory(prefix="spark-docs-")
        self.dir = Path(self.tmp.name)
        (self.dir / "home").mkdir()
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("SPARK_OPS_")},
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "HOME": str(self.dir / "home"),
            "SPARK_OPS_INVENTORY": str(self.dir / inventory),
            "COLUMNS": "200",
            "NO_COLOR": "1",
            "TERM": "dumb",
        }
        up = self.run(["spark-ops", "sim", "up", *sim_args, "--json"], check=True)
        ports = json.loads(up.stdout)["ports"]
        self.hosts = [f"127.0.0.1:{port}" for port in ports.values()]

    def run(self, argv: list[str] | str, *, check: bool = False) -> subprocess.CompletedProcess:
        """One command in the session's directory (a string runs through bash)."""
        res = subprocess.run(
            argv,
            shell=isinstance(argv, str),
            executable="/bin/bash" if isinstance(argv, str) else None,
            cwd=self.dir,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=COMMAND_TIMEOUT_S,
        )
        if check and res.returncode != 0:
            raise SystemExit(f"{argv}: exit {res.returncode}\n{res.stdout[-3000:]}")
        return res

    def command(self, shown: str) -> str:
        """The command to run for the one shown: the session's node addresses, in order."""
        hosts = iter(self.hosts)
        return HOSTS_RE.sub(lambda m: next(hosts, m.group(0)), shown)

    def close(self) -> None:
        """Stop the cluster, and every other one a block's setup started in the session's
        directory (docs/fleet.md runs a fleet: `sim up --dir .sim-NAME`), and remove it."""
        self.run(["spark-ops", "sim", "down"])
        for other in sorted(self.dir.glob(".sim-*/")):
            self.run(["spark-ops", "sim", "down", "--dir", str(other)])
        self.tmp.cleanup()


def _shown_text(text: str, session: Session) -> str:
    """Output as the docs show it: the session's directory and account replaced."""
    text = text.replace(str(session.dir), SHOWN_DIR).replace(who(), SHOWN_WHO)
    text = text.replace(f"(account {local_account()})", "(account alice)")
    return text.replace(f"spark-ops:{local_account()}", "spark-ops:alice")


def run_block(block: Block, session: Session) -> list[str]:
    """The block's lines as they are now: each command, then what it printed."""
    if block.option("setup"):
        session.run(block.option("setup"), check=True)
    lines: list[str] = []
    code = 0
    try:
        for shown in block.commands:
            res = session.run(session.command(shown))
            code = res.returncode
            out = _shown_text(res.stdout, session).rstrip("\n").split("\n")
            lines.append(f"$ {session.command(shown)}")
            lines += _grep(out, block.option("grep"), gaps=block.option("gaps") != "off")
    finally:
        if block.option("after"):
            session.run(block.option("after"), check=True)
    want = int(block.option("exit", "0"))
    if code != want:
        raise SystemExit(
            f"`{block.commands[-1]}` exited {code}, the doc says {want}:\n" + "\n".join(lines)
        )
    return [line.rstrip() for line in lines]


def _grep(lines: list[str], pattern: str, *, gaps: bool = True) -> list[str]:
    """Lines matching pattern, a `…` line for each run left out unless `gaps` is off (a block
    whose other lines come and go with timing); all lines without a pattern."""
    if not pattern:
        return lines
    rx = re.compile(pattern)
    out: list[str] = []
    for line in lines:
        if rx.search(line):
            out.append(line)
        elif gaps and (not out or out[-1] != "…"):
            out.append("…")
    return out


def masked(lines: list[str], numbers_vary: bool, loose: re.Pattern[str] | None = None) -> list[str]:
    """The lines with what varies between runs masked (all numbers, for a measurement; a line
    matching `loose` as a whole)."""
    out = []
    for line in lines:
        for rx, repl in MASKS:
            line = rx.sub(repl, line)
        if loose is not None and loose.search(line):
            line = "(a verdict that varies with the machine's load)"
        elif numbers_vary:
            line = re.sub(r"[ ━─]+", " ", NUMBER_RE.sub("N", line))
        out.append(line)
    return out


def process(doc: Document, *, check: bool) -> list[str]:
    """Run every block of the document; rewrite it, or return the differences found."""
    problems: list[str] = []
    session = Session(doc.sim_args, doc.inventory)
    try:
        fresh = [run_block(block, session) for block in doc.blocks]
    finally:
        session.close()
    for block, lines in zip(doc.blocks, fresh, strict=True):
        vary = block.option("numbers") == "vary"
        loose = re.compile(block.option("loose")) if block.option("loose") else None
        old, new = masked(block.shown, vary, loose), masked(lines, vary, loose)
        if old != new:
            where = f"{doc.path.relative_to(ROOT)}:{block.start + 1}"
            diff = difflib.unified_diff(
                old, new, f"{where} (the doc)", "what runs now", n=1, lineterm=""
            )
            problems.append("\n".join(diff))
    if not check:
        for block, lines in reversed(list(zip(doc.blocks, fresh, strict=True))):
            doc.lines[block.start : block.end] = [f"    {line}".rstrip() for line in lines]
        write_file(doc.path, "\n".join(doc.lines), expect_sha256=doc.sha256)
    return problems


def unmarked_blocks(path: Path) -> list[str]:
    """Blocks that show `$ spark-ops` or its output (fenced or indented, on any of their lines: a
    command, or a line only spark-ops prints, OUTPUT_RE) with neither a run nor a not-run
    marker before them: hand-pasted output that goes stale."""
    lines = path.read_text(encoding="utf-8").split("\n")
    out = []
    i = 0
    while i < len(lines):
        start = i
        if lines[i].lstrip().startswith("```"):  # a fenced block, to its closing fence
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith("```"):
                i += 1
            body = lines[start + 1 : i]
            i += 1
        elif lines[i].startswith("    ") and lines[i].strip():  # an indented block
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                i += 1
            body = lines[start:i]
        else:
            i += 1
            continue
        shown = [b.strip() for b in body if b.strip().startswith("$ spark-ops")]
        shown += [b.strip() for b in body if OUTPUT_RE.match(b.strip())]
        if not shown:
            continue
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j < 0 or not MARK_RE.match(lines[j]):
            out.append(f"{_where(path)}:{start + 1}: {shown[0][:80]}")
    return out


def _where(path: Path) -> str:
    """A path as the messages name it: relative to the checkout when it is inside."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    """Write or check the generated blocks of the given docs (all of docs/ by default)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="compare; change nothing")
    parser.add_argument("docs", nargs="*", type=Path)
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.docs] or sorted(DOCS.glob("*.md"))
    problems: list[str] = []
    for path in paths:
        doc = read_document(path)
        if doc is not None:
            problems += process(doc, check=args.check)
    for problem in problems:
        print(problem)
    if problems:
        verb = "differ" if args.check else "changed (now rewritten)"
        print(f"{len(problems)} block(s) {verb}; run `python scripts/docs_outputs.py` to rewrite")
    return 1 if problems and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
