"""Who runs spark-ops: the one answer, from the account database, never from the environment.

$LOGNAME and $USER are whatever the caller's shell says (anyone can set them to anyone, and to
bytes that are not UTF-8); the audit's `who`, the lock's holder and the watchdog's `--by` must
name the account the process really runs as, so they all ask here.
"""

from __future__ import annotations

import os
import pwd


def local_account() -> str:
    """This process's account name from the password database (its uid), never from $LOGNAME."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (some containers)
        return str(os.getuid())
