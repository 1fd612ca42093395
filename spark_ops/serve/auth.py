"""The server's token: read from a 0600 file of one's own, or generated and kept 0600."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path

from spark_ops.errors import InputError, excerpt
from spark_ops.files import write_file
from spark_ops.log import get_logger

DEFAULT_TOKEN_PATH = Path("~/.local/state/spark-ops/serve.token")  # beside boots.json
COOKIE = "spark_ops_session"
SESSION_S = 12 * 3600  # a browser session lasts this long, and no longer than the server's run
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
    info = os.fstat(fd)  # owner, mode and kind of the very file read (no swap in between)
    if not stat.S_ISREG(info.st_mode):  # a directory too (fdopen would refuse it, fd leaked)
        os.close(fd)
        raise TokenError(f"--token-file {target}: not a regular file")
    with os.fdopen(fd, "rb") as f:
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
    if target.is_symlink() or (target.exists() and not _left_empty(target)):
        return read_token_file(target), target
    token = secrets.token_urlsafe(32)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # created 0600 empty first: the one writer keeps an existing file's mode, so the token is
    # never readable by others, not even for the time of the rename
    with contextlib.suppress(FileExistsError):
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    write_file(target, token + "\n", error=TokenError)
    return read_token_file(target), target


def _left_empty(target: Path) -> bool:
    """True for the empty 0600 regular file of ours a killed `serve` left before writing its
    token there (it gets a new token; anything else is read, and refused, as it is)."""
    try:
        st = target.lstat()
    except OSError:
        return False
    mode_ok = stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    return stat.S_ISREG(st.st_mode) and st.st_size == 0 and mode_ok


def same_token(given: str | None, token: str) -> bool:
    """True when `given` is the token (constant-time comparison)."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), token.encode("ascii"))


class Sessions:
    """The session cookies of one server run: `EXPIRY.MAC`, an HMAC of the expiry and the token it
    was issued under, keyed by a key made at start. A cookie ends at its expiry, when the token
    changes (a rotated token ends every session of the old one) or when the server stops (a new
    run has a new key), and never holds or reveals the token."""

    def __init__(self, lifetime: float = SESSION_S, clock: Callable[[], float] = time.time) -> None:
        """A fresh key; cookies issued now last `lifetime` seconds by `clock`."""
        self.key = secrets.token_bytes(32)
        self.lifetime = lifetime
        self.clock = clock

    def _mac(self, expiry: str, token: str) -> str:
        """The MAC of an expiry and the token's digest under this run's key."""
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()
        msg = f"{expiry}.{digest}".encode("ascii")
        return hmac.new(self.key, msg, hashlib.sha256).hexdigest()

    def issue(self, token: str = "") -> str:
        """A new cookie value, valid while `token` is the server's token."""
        expiry = str(int(self.clock() + self.lifetime))
        return f"{expiry}.{self._mac(expiry, token)}"

    def valid(self, value: str | None, token: str = "") -> bool:
        """True for a cookie this run issued under `token` that has not expired (constant-time;
        any text)."""
        if not value:
            return False
        expiry, _, mac = value.partition(".")
        if not expiry.isascii() or not expiry.isdigit() or len(expiry) > 12:
            return False
        good = hmac.compare_digest(
            mac.encode("utf-8", "surrogateescape"), self._mac(expiry, token).encode("ascii")
        )
        return good and int(expiry) > self.clock()


TOKEN_RECHECK_S = 1.0  # the token file is looked at again at most this often


class TokenSource:
    """The token a running server checks: its file is re-read when it changes (rotation works), and
    while the file is gone or refused nobody is let in; each change is logged once (issue 34)."""

    def __init__(self, token: str, path: str | os.PathLike[str] | None = None) -> None:
        """The token read at start, and the file it came from (None: fixed for the run)."""
        self.token: str | None = token
        self.path = Path(path).expanduser() if path is not None else None
        self.seen = self._signature()
        self.checked = time.monotonic()
        self.problem = ""
        self.log = get_logger(op="serve")

    def _signature(self) -> tuple[int, ...] | None:
        """What says the file changed: inode, size, mtime and ctime (None: gone)."""
        if self.path is None:
            return ()
        try:
            st = os.lstat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def current(self) -> str | None:
        """The token now, or None while the file is gone or refused."""
        if self.path is None or time.monotonic() - self.checked < TOKEN_RECHECK_S:
            return self.token
        self.checked = time.monotonic()
        sig = self._signature()
        if sig == self.seen:
            return self.token
        self.seen = sig
        if sig is None:
            self._refuse(f"the token file {self.path} was removed: every request is refused")
            return None
        try:
            self.token = read_token_file(self.path)
        except TokenError as exc:
            self._refuse(f"the token file changed and is refused ({exc.message})")
            return None
        self.problem = ""
        self.log.warning("token file re-read: the new token is in force", file=str(self.path))
        return self.token

    def _refuse(self, why: str) -> None:
        """Let nobody in, and say why once."""
        self.token = None
        if why != self.problem:
            self.problem = why
            self.log.error(why + " until a valid token file is back")


SECRET_RE = re.compile(
    r"(?i)(authorization\s*:\s*|bearer\s+|cookie\s*:\s*|set-cookie\s*:\s*|token=|"
    + re.escape(COOKIE)
    + r"=)[^\s&;,'\"]*"
)


def redact(text: str) -> str:
    """Text with every token, cookie and Authorization value replaced by [redacted]."""
    return SECRET_RE.sub(lambda m: m.group(1) + "[redacted]", text)


class RedactFilter(logging.Filter):
    """Keeps secrets and tracebacks of bad requests out of the HTTP server's log records: the
    message is rendered, redacted, and its exception named by its type only."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place; never drop it."""
        try:
            text = record.getMessage()
        except (TypeError, ValueError):
            text = str(record.msg)
        if record.exc_info and record.exc_info[0] is not None:
            text += f" ({record.exc_info[0].__name__})"
        record.msg, record.args = redact(text)[:500], ()
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


HTTP_LOGGERS = ("aiohttp.server", "aiohttp.web", "aiohttp.access", "aiohttp.internal")


def guard_http_logs() -> None:
    """Put RedactFilter on aiohttp's server loggers (once)."""
    for name in HTTP_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactFilter) for f in logger.filters):
            logger.addFilter(RedactFilter())
