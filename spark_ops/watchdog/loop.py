"""Watchdogs that only loop: probe, stamp, restart, with no forced-restart command.

The community kind (a bash loop beside the launcher) probes a tiny completion, and after a few
failures in a row appends `date +%s` to its history — before the restart and without a lock —
then runs the launcher's stop and start, and sleeps. It has a pause file, a gave-up file, a
start-up grace and its own budget; it leaves an engine that is not running at all alone (read
as stopped on purpose), and its history often lives in /tmp, which a reboot empties.

spark-ops' side of it: recognise such a loop from what runs on the head (`find_loop_watchdogs`:
the process, its script and its environment), and say in words what it will not do
(`volatile_history`, `no_recovery`, `unlocked_appends`). The inventory describes it with
`watchdog.kind: loop` (inventory.model); a planned restart then runs the launcher's stop and start
itself, which writes no stamp.
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from spark_ops.errors import SparkOpsError
from spark_ops.remote import ClusterSession
from spark_ops.remote.programs.watchdog import (
    FILE_SYSTEM,
    PROCESS_ENV,
    PROCESSES,
)
from spark_ops.remote.quoting import quote_word

# directories a reboot empties on the usual distributions (tmpfs, or cleaned at boot)
VOLATILE_DIRS = ("/tmp/", "/run/", "/var/run/", "/dev/shm/")
VOLATILE_FS = ("tmpfs", "ramfs")
_SCRIPT_MAX = 256 * 1024  # a watchdog script is small; a bigger file is not read as one

_ASSIGN_RE = re.compile(r"^\s*(?:export\s+|readonly\s+|local\s+)?([A-Za-z_]\w*)=(.*)$")
_VAR_RE = re.compile(r"[$]\{([A-Za-z_]\w*)(?::?-([^}]*))?\}|[$]([A-Za-z_]\w*)")
_SUBSTITUTION_RE = re.compile(r"[$][(]|`")  # a value the shell computes: not read
_APPEND_RE = re.compile(r"date\s+\+%s\s*>>\s*(\"[^\"]+\"|'[^']+'|\S+)")
_NUM = r"\"?(\$\{?\w+\}?|\d+|[A-Za-z_]\w*)\"?"
_BUDGET_RE = re.compile(r"restarts?\W[^\n]*-ge\s+" + _NUM, re.I)
_WINDOW_RE = re.compile(r"\bnow\"?\s*-\s*" + _NUM)
_GRACE_RE = re.compile(r"AGE\"?\s*-lt\s+" + _NUM)
_FAILS_RE = re.compile(r"FAIL\w*\"?\s*-lt\s+" + _NUM, re.I)
_SLEEP_RE = re.compile(r"^\s*sleep\s+" + _NUM, re.M)
_CURL_TIMEOUT_RE = re.compile(r"curl\s[^\n]*?(?:-m|--max-time)\s+" + _NUM)
_CURL_URL_RE = re.compile(r"curl\s[^\n]*?[\"']?((?:https?://|[$]\{?\w*URL)[^\s\"']*)")
_ENGINE_CHECK_RE = re.compile(
    r"if\s+!\s[^\n]*(docker\s+ps|pgrep|kill\s+-0|vllm_node|running|alive)[^\n]*\n?[^\n]*continue"
)
_LOG_FUNC_RE = re.compile(r"^\s*(\w+)\s*\(\)\s*\{[^\n]*(?:echo|printf|logger)", re.M)
_QUOTED_VAR_RE = re.compile(r"\"\$\{?(\w+)\}?\"")
_REDIRECT_RE = re.compile(r"\s*(?:\d?>>?\s*(?:&\d|\"[^\"]*\"|\S+))")


@dataclass
class LoopFacts:
    """What a loop watchdog's script (and its environment) say it does; None: not found."""

    script: str
    pid: int | None = None
    history_file: str | None = None
    history_locked: bool = False
    pause_file: str | None = None
    gave_up_file: str | None = None
    max_restarts: int | None = None
    window_s: float | None = None
    grace_s: float | None = None
    failures: int | None = None
    interval_s: float | None = None
    probe_timeout_s: float | None = None
    probe_url: str | None = None
    restart_command: str | None = None
    restarts_missing_engine: bool = True
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Serialize for --json."""
        return dict(self.__dict__)


class _Vars:
    """A script's variables, resolved as the shell would for the simple cases (assignments in the
    script, then the process's environment; `${X:-default}`)."""

    def __init__(self, text: str, env: dict[str, str]) -> None:
        """Read every plain assignment of the script, in order."""
        self.env = env
        self.values: dict[str, str] = {}
        for line in text.splitlines():
            m = _ASSIGN_RE.match(line)
            if m and not _SUBSTITUTION_RE.search(m.group(2)):
                self.values.setdefault(m.group(1), self.resolve(_unquote(m.group(2))))

    def get(self, name: str) -> str | None:
        """A variable's value: the process's environment wins over a script default."""
        if name in self.env:
            return self.env[name]
        return self.values.get(name)

    def resolve(self, word: str) -> str:
        """Expand $X, ${X} and ${X:-default} in a word (unknown variables stay as written)."""

        def one(m: re.Match[str]) -> str:
            """One expansion."""
            name = m.group(1) or m.group(3)
            value = self.get(name)
            if value:
                return value
            if m.group(2) is not None:
                return self.resolve(m.group(2))
            return m.group(0)

        return _VAR_RE.sub(one, word)

    def number(self, word: str | None) -> float | None:
        """A number the script compares with or sleeps for, through a variable when it names
        one; None when it is not a plain number (a sleep of `2m`, an unknown variable)."""
        if word is None:
            return None
        value = self.get(word) or "" if word.isidentifier() else self.resolve(word)
        if not re.fullmatch(r"\d+(?:\.\d+)?", value):
            return None
        return float(value)


def _whole(value: float | None) -> int | None:
    """A count: a whole number, else None."""
    return int(value) if value is not None and value == int(value) else None


def _unquote(value: str) -> str:
    """A shell value without its outer quotes and a trailing comment."""
    value = value.strip()
    if value[:1] in ("'", '"') and value[-1:] == value[:1] and len(value) > 1:
        return value[1:-1]
    return value.split(" #", 1)[0].strip()


def _search(pattern: re.Pattern[str], text: str) -> str | None:
    """The first group of a pattern's first match, or None."""
    m = pattern.search(text)
    return m.group(1) if m else None


def _path_var(values: _Vars, *needles: str) -> str | None:
    """The value of the first variable whose name holds one of the needles and looks like a path."""
    for name in list(values.values) + list(values.env):
        value = values.get(name) or ""
        if any(n in name.upper() for n in needles) and value.startswith(("/", "~/")):
            return value
    return None


def _restart_lines(text: str, values: _Vars) -> str | None:
    """The commands the loop runs after its stamp and before its sleep, as one `a && b` line."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if _APPEND_RE.search(ln)), None)
    if start is None:
        return None
    quiet = ("#", "echo ", "printf ", "logger ", *(f"{f} " for f in _LOG_FUNC_RE.findall(text)))
    words: list[str] = []
    for line in lines[start + 1 :]:
        line = line.strip()
        if re.match(r"sleep\b|done\b|fi\b|FAIL\w*=", line):
            break
        if not line or line.startswith(quiet):
            continue
        line = re.split(r"\s*\|\|\s*", line, maxsplit=1)[0]
        line = _REDIRECT_RE.sub("", line).strip()
        line = _QUOTED_VAR_RE.sub(lambda m: quote_word(values.get(m.group(1)) or ""), line)
        words.append(values.resolve(line))
    return " && ".join(w for w in words if w) or None


def read_loop_script(text: str, script: str, env: dict[str, str] | None = None) -> LoopFacts | None:
    """The facts of a loop watchdog's script; None when the text is no such loop (no `while`,
    no `sleep`, no `date +%s >>` stamp)."""
    text = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    if "while" not in text or "sleep" not in text or not _APPEND_RE.search(text):
        return None
    values = _Vars(text, env or {})
    facts = LoopFacts(script=script)
    target = _search(_APPEND_RE, text)
    facts.history_file = values.resolve(_unquote(target)) if target else None
    facts.history_locked = re.search(r"\bflock\b", text) is not None
    facts.pause_file = _path_var(values, "PAUSE")
    facts.gave_up_file = _path_var(values, "GAVE", "GIVE")
    facts.max_restarts = _whole(values.number(_search(_BUDGET_RE, text)))
    facts.window_s = values.number(_search(_WINDOW_RE, text))
    facts.grace_s = values.number(_search(_GRACE_RE, text))
    facts.failures = _whole(values.number(_search(_FAILS_RE, text)))
    facts.interval_s = values.number(_search(_SLEEP_RE, text[text.find("while") :]))
    facts.probe_timeout_s = values.number(_search(_CURL_TIMEOUT_RE, text))
    url = _search(_CURL_URL_RE, text)
    facts.probe_url = values.resolve(url) if url else None
    facts.restart_command = _restart_lines(text, values)
    facts.restarts_missing_engine = _ENGINE_CHECK_RE.search(text) is None
    if not facts.history_locked:
        facts.notes.append("it appends its stamps without a lock")
    return facts


_SHELLS = ("sh", "bash", "dash", "ksh", "zsh")


def script_of(args: str) -> str | None:
    """The script a process runs (`bash /x/w.sh …`, `/x/w.sh …`), or None."""
    words = args.split()
    if not words:
        return None
    first = words[0].rsplit("/", 1)[-1]
    if first in _SHELLS:
        rest = [w for w in words[1:] if not w.startswith("-")]
        return rest[0] if rest and "/" in rest[0] else None
    return words[0] if words[0].startswith("/") and words[0].endswith(".sh") else None


async def find_loop_watchdogs(session: ClusterSession, head: str) -> list[LoopFacts]:
    """Every process on the head that runs a loop watchdog's script, read with its environment;
    [] when none runs (or the head cannot say)."""
    try:
        listing = await session.call(head, PROCESSES)
    except SparkOpsError:
        return []
    found: list[LoopFacts] = []
    for line in listing.stdout.splitlines():
        pid, _, args = line.strip().partition(" ")
        script = script_of(args.strip())
        if not pid.isdigit() or script is None:
            continue
        try:
            text = await session.read_file(head, script, max_bytes=_SCRIPT_MAX)
        except SparkOpsError:
            continue
        if not text or "date +%s" not in text:
            continue
        env = await _environment(session, head, int(pid))
        facts = read_loop_script(text, script, env)
        if facts is not None:
            facts.pid = int(pid)
            found.append(facts)
    return found


def probed_port(facts: LoopFacts) -> str | None:
    """The port the loop's probe URL names (None: no URL read, or none written in it)."""
    if not facts.probe_url:
        return None
    try:
        port = urllib.parse.urlsplit(facts.probe_url).port
    except ValueError:
        return None
    return str(port) if port is not None else None


def url_port(url: str) -> str | None:
    """The port an engine's API URL reaches: the one written, else its scheme's (80, 443);
    None when unparsable (then no loop is told apart by its port)."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if port is None:
        port = {"http": 80, "https": 443}.get(parts.scheme)
    return str(port) if port is not None and parts.hostname else None


def split_loops(
    loops: list[LoopFacts], port: str | None
) -> tuple[list[LoopFacts], list[LoopFacts]]:
    """(the loops that may watch the engine on `port`, those whose probe names another port:
    another engine's watchdogs, on a head that serves more than one)."""
    other = [f for f in loops if port and probed_port(f) not in (None, port)]
    return [f for f in loops if f not in other], other


def pick_loop(
    loops: list[LoopFacts], *, port: str | None = None, history: str | None = None
) -> LoopFacts | None:
    """This cluster's loop among those running: the one whose stamps are `history` (the
    inventory names them); else, of those whose probe does not name another port than `port`
    (another engine's watchdog is never this cluster's), the only one, else the one whose probe
    names `port`, else the first (None: none runs, or every one probes another engine)."""
    named = [f for f in loops if history and f.history_file == history]
    if len(named) == 1:
        return named[0]
    mine, _ = split_loops(loops, port)
    if len(mine) <= 1:
        return mine[0] if mine else None
    probing = [f for f in mine if port and probed_port(f) == port]
    return probing[0] if len(probing) == 1 else mine[0]


def other_engines(loops: list[LoopFacts], port: str | None) -> str:
    """Words for the loops on the head that probe another port than this engine's `port`."""
    named = ", ".join(f"{f.script} (pid {f.pid}) probes port {probed_port(f)}" for f in loops)
    return (
        f"also on the head: {named}, not this engine's port {port}: another engine's watchdog, "
        "not read as this cluster's"
    )


def several_loops(loops: list[LoopFacts], chosen: LoopFacts) -> str:
    """Words for a head that runs more than one loop watchdog (each restarts on its own)."""
    others = ", ".join(f"{f.script} (pid {f.pid})" for f in loops if f is not chosen)
    return (
        f"{len(loops)} loop watchdogs run on the head; read {chosen.script} (pid {chosen.pid}), "
        f"also running: {others}. Two loops probing one engine both restart it"
    )


async def _environment(session: ClusterSession, head: str, pid: int) -> dict[str, str]:
    """A process's environment ({} when it cannot be read)."""
    try:
        res = await session.call(head, PROCESS_ENV, pid)
    except SparkOpsError:
        return {}
    env: dict[str, str] = {}
    for line in res.stdout.splitlines() if res.ok else ():
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value
    return env


async def volatile_history(session: ClusterSession, head: str, history: str) -> str | None:
    """Why the history does not survive a reboot (in /tmp, on tmpfs), or None when it does."""
    fstype = ""
    try:
        res = await session.call(head, FILE_SYSTEM, history)
        fstype = res.stdout.strip() if res.ok else ""
    except SparkOpsError:
        pass
    if fstype in VOLATILE_FS:
        return f"{history} is on {fstype}: a reboot empties it, and the watchdog's budget with it"
    if history.startswith(VOLATILE_DIRS):
        top = "/" + history.split("/")[1]
        return (
            f"{history} is under {top}, which a reboot empties on most systems: the watchdog's "
            "budget starts again at 0 after every reboot"
        )
    return None


def no_recovery(restart_command: str) -> str:
    """The words `status` and `doctor` say when the watchdog restarts nothing after a crash."""
    return (
        "no watchdog will bring the engine back: the watchdog reads a missing engine as "
        "stopped on purpose (watchdog.restarts_missing_engine: false) and stands down; start "
        f"it with `spark-ops restart` (which runs {restart_command[:200]})"
    )


def unlocked_appends(history: str, lock: str) -> str:
    """The words doctor says of a watchdog that appends to its history without the lock."""
    return (
        f"the watchdog appends to {history} without taking {lock}: a stamp it appends while "
        "spark-ops prunes can be lost (spark-ops prunes only after a planned restart that "
        "caused a stamp, and a loop watchdog's planned restart causes none)"
    )
