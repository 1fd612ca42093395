"""The server's token: read from a 0600 file of one's own, or generated and kept 0600."""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from spark_ops.errors import InputError, excerpt
from spark_ops.files import write_file

DEFAULT_TOKEN_PATH = Path("~/.local/state/spark-ops/serve.token")  # beside boots.json
COOKIE = "spark_ops_session"
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 4096


class TokenError(InputError):
    """The token file cannot be trusted or read (its mode, its owner, its content): exit 2."""


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in `path`, refused unless the file is ours, a regular file and mode 0600."""
    target = Path(path).expanduser()
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise TokenError(
            f"--token-file {target}: cannot open: {exc.strerror}",
            hint="give a regular file (not a symlink) holding the token on one line",
        ) from exc
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise TokenError(f"--token-file {target}: not a regular file")
        if info.st_uid != os.getuid():
            raise TokenError(
                f"--token-file {target}: owned by uid {info.st_uid}, not by you (uid "
                f"{os.getuid()})",
                hint=f"use a file you own: chown {os.getuid()} {target}",
            )
        mode = stat.S_IMODE(info.st_mode)
        if mode != 0o600:
            raise TokenError(
                f"--token-file {target}: mode {mode:04o}, only 0600 is allowed (anyone who "
                "reads the token reads the cluster)",
                hint=f"chmod 600 {target}",
            )
        raw = f.read(MAX_TOKEN_CHARS + 2)
    return _valid(raw, str(target))


def _valid(raw: bytes, where: str) -> str:
    """The token text of a file: one line of printable ASCII, long enough."""
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenError(f"{where}: the token must be printable ASCII") from None
    if len(token) > MAX_TOKEN_CHARS:
        raise TokenError(f"{where}: the token is longer than {MAX_TOKEN_CHARS} characters")
    if len(token) < MIN_TOKEN_CHARS or not all(33 <= ord(c) < 127 for c in token):
        raise TokenError(
            f"{where}: token {excerpt(token, 8)} refused: give at least {MIN_TOKEN_CHARS} "
            "printable ASCII characters without spaces on one line",
            hint="python3 -c 'import secrets; print(secrets.token_urlsafe(32))' > FILE",
        )
    return token


def kept_token(path: str | os.PathLike[str] | None = None) -> tuple[str, Path]:
    """The server's own token: the one kept at `path` (0600), else a new one written there."""
    target = Path(path if path is not None else DEFAULT_TOKEN_PATH).expanduser()
    if target.exists() or target.is_symlink():
        return read_token_file(target), target
    token = secrets.token_urlsafe(32)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # created 0600 empty first: the one writer keeps an existing file's mode, so the token is
    # never readable by others, not even for the time of the rename
    with contextlib.suppress(FileExistsError):
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    write_file(target, token + "\n", error=TokenError)
    return read_token_file(target), target


def same_token(given: str | None, token: str) -> bool:
    """True when `given` is the token (constant-time comparison)."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode("ascii"))
