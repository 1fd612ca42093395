"""The one backup naming rule of spark-ops, and the local backup writer.

<file>.bak.<UTC YYYYmmddTHHMMSS.ffffffZ>[-N][.rolled-back]. Shared by history.py on the head, the
local writer every other module uses (spark_ops/files.py) and the remote writer (remote/shell.py
renders the same rule into sh from the constants below; tests/test_backup_rule.py runs both
against the same names). Rotation removes only names of this shape: an operator's own
`recipe.yaml.bak.known-good` is never touched. `.rolled-back` marks the copy a rollback moved away
from, so a rollback and its re-run restore the same version. Standard library only
(spark_ops/headlib/__init__.py says why).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import time
from collections.abc import Callable

from spark_ops.headlib.atomic import atomic_write

DEFAULT_KEEP_BACKUPS = 10
BACKUP_INFIX = ".bak."
BACKUP_TIME_FORMAT = "%Y%m%dT%H%M%S.%fZ"  # datetime.strftime; GNU date spells %f as %6N
BACKUP_COUNTER_DIGITS = 4  # the -N that makes a name unique: 1 to 4 digits
ROLLED_BACK = ".rolled-back"
_FORMAT_DIGITS = {"Y": 4, "m": 2, "d": 2, "H": 2, "M": 2, "S": 2, "f": 6}


def backup_tag_pattern(digits: Callable[[int], str], literal: Callable[[str], str]) -> str:
    """Render the time part of the naming rule as a pattern: digits(n) per field, literal text."""
    parts, fmt = [], BACKUP_TIME_FORMAT
    i = 0
    while i < len(fmt):
        if fmt[i] == "%":
            parts.append(digits(_FORMAT_DIGITS[fmt[i + 1]]))
            i += 2
        else:
            parts.append(literal(fmt[i]))
            i += 1
    return "".join(parts)


BACKUP_TAG_RE = re.compile(
    "^"
    + backup_tag_pattern(lambda n: rf"\d{{{n}}}", re.escape)
    + rf"(?:-\d{{1,{BACKUP_COUNTER_DIGITS}}})?(?:{re.escape(ROLLED_BACK)})?$"
)


def backup_tag(now: float) -> str:
    """Return the sortable UTC time tag of a backup name, with microseconds."""
    moment = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
    return moment.strftime(BACKUP_TIME_FORMAT)


def backup_name(path: str, tag: str, n: int = 0, label: str = "") -> str:
    """Return the name of the n-th backup of path made at tag (n > 0 when the name was taken)."""
    return path + BACKUP_INFIX + tag + (f"-{n}" if n else "") + label


def backup_tag_of(name: str) -> str:
    """Return what follows ``.bak.`` in a backup's name (its tag, counter and label)."""
    return os.path.basename(name).rpartition(BACKUP_INFIX)[2]


def backup_prefix(path: str) -> str:
    """Return the prefix of backup files of path (``<history>.bak.``)."""
    return os.path.basename(path) + BACKUP_INFIX


def is_backup_name(path: str, name: str) -> bool:
    """Whether name (a base name) is a backup of path that spark-ops made (its naming rule)."""
    prefix = backup_prefix(path)
    return name.startswith(prefix) and bool(BACKUP_TAG_RE.match(name[len(prefix) :]))


def list_backups(path: str) -> list[str]:
    """Return the backups spark-ops made of path, oldest first (an operator's own are left out)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        names = [n for n in os.listdir(directory) if is_backup_name(path, n)]
    except OSError:
        return []
    return [os.path.join(directory, n) for n in sorted(names)]


def write_backup(path: str, data: bytes, keep: int, *, label: str = "") -> str:
    """Keep the old content as a timestamped copy beside path; keep only the last ``keep``.

    The old file is hard-linked when it is about to be replaced by a rename (its inode is then the
    backup, with no copy); where links are not possible its bytes are written atomically. A symlink
    is never linked: its target's content is copied, so the backup cannot follow the live file.
    """
    tag, n = backup_tag(time.time()), 0
    target = backup_name(path, tag, n, label)
    while os.path.lexists(target):
        n += 1
        target = backup_name(path, tag, n, label)
    try:
        if os.path.islink(path):
            raise OSError("a symlink is copied, not linked")
        os.link(path, target)
    except OSError:
        atomic_write(target, data)
    backups = list_backups(path)
    for old in backups[: max(0, len(backups) - keep)]:
        with contextlib.suppress(OSError):
            os.unlink(old)
    return target
