"""The one-line regex edit of `exec --edit`, run in a child process under a deadline.

Python's `re` holds the interpreter while it matches: a pattern that backtracks for ever (nested
repetition like `(a+)+$` on a long line) would freeze spark-ops whole, its event loop and its
SSH connections with it, and no timeout could fire. So the match runs here, in a process of its
own (`python -m spark_ops.linesub`, JSON on stdin and stdout, stdlib only), which the caller
kills at its deadline. The semantics are exactly `re`'s. One child serves a whole run: it gets
every distinct text the nodes hold (usually one) and answers for each, in order. The child also
arms SIGALRM at the deadline (plus a margin): if spark-ops itself is SIGKILLed, nobody is left to
kill the child, and a runaway match would otherwise spin for ever.
"""

from __future__ import annotations

import json
import math
import re
import signal
import sys
from typing import Any

# Every character str.splitlines ends a line at (lineedit's LINE_BREAKS too)
LINE_ENDS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def sub_line(pattern: str, replacement: str, text: str) -> dict[str, Any]:
    """The lines matching pattern (0-based), and when exactly one does, the text rewritten."""
    rx = re.compile(pattern)
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if rx.search(_body(line))]
    out: dict[str, Any] = {"hits": hits}
    if len(hits) == 1:
        i = hits[0]
        body = _body(lines[i])
        new_body = rx.sub(replacement, body, count=1)
        lines[i] = new_body + lines[i][len(body) :]
        out.update(text="".join(lines), old=body, new=new_body)
    return out


def _body(line: str) -> str:
    """A line of str.splitlines(keepends=True) without its end (`\r\n` or any one character
    splitlines ends a line at: YAML takes \x85, U+2028 and U+2029 for line ends too), so that
    `.*` never eats the end and joins the line to the next."""
    if line.endswith("\r\n"):
        return line[:-2]
    return line[:-1] if line and line[-1] in LINE_ENDS else line


def main() -> None:
    """Read {"pattern", "replacement", "texts": [...]} as JSON on stdin; answer a JSON list of
    sub_line's results, one per text, on stdout."""
    data = json.loads(sys.stdin.read())
    deadline = float(data.get("deadline_s") or 5.0)
    signal.alarm(max(1, math.ceil(deadline)) + 2)  # default action: the process ends
    done = [sub_line(data["pattern"], data["replacement"], text) for text in data["texts"]]
    json.dump(done, sys.stdout)


if __name__ == "__main__":
    main()
