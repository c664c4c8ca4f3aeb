"""The tokens file on disk: load, change atomically, and reload while the broker runs.

Role: the only module of :mod:`broker.auth` that touches files (through :mod:`wal.fs`, so
tests inject faults). The document format is in :mod:`broker.auth.tokens`.

Invariants:
- A change (create, revoke) is read-modify-write under ``flock`` on ``<file>.lock``, so two
  ``headrace tokens`` commands never lose each other's change; it is written as temp ->
  fsync -> chmod 0600 -> rename -> fsync(dir), so a reader sees the old file or the new one,
  never a mix, and a crash leaves one of them.
- The broker's view (:meth:`TokensFile.current`) stats the file at most every
  ``recheck_s`` seconds (default 1) and rereads it when its inode, size or mtime changed:
  a revocation takes effect within about a second, without a restart. If the new file does
  not load (torn by hand, invalid), the last good set stays in force and the error is
  logged, once per change of the file.
- A reread runs on the event loop, once per change: about 2 ms for 100 tokens, 10 ms for
  1,000 and 120 ms for the most a file may hold, 10,000 (measured on the dev machine);
  calls wait that long. A check between changes is one ``stat`` a second.

Worked example: the broker loads 2 tokens at t=0. At t=0.4 ``tokens revoke etl`` renames a
new file in (new inode). A call at t=0.7 is still checked against the old set (no stat
yet); the first call at or after t=1.0 stats, sees the new inode, rereads, and is refused
as revoked, and so is every later call.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator

from broker.auth.tokens import TokenSet, decode_tokens, encode_tokens
from broker.errors import TokensFileError
from wal.fs import FileSystem

logger = logging.getLogger(__name__)

#: How often the broker looks at the tokens file for changes, seconds.
RECHECK_S = 1.0

_Signature = tuple[int, int, int]  # inode, size, mtime in ns


class TokensFile:
    """One tokens file. The broker reads it through :meth:`current`; the ``headrace
    tokens`` commands change it through :meth:`update`. Not thread-safe; task-safe on one
    event loop (no awaits inside).

    Args:
        path: The file.
        fs: File operations. Default: the real ones.
        clock: Monotonic seconds. Default :func:`time.monotonic`.
        recheck_s: Least time between two looks at the file, seconds. Default 1.
    """

    def __init__(
        self,
        path: str,
        *,
        fs: FileSystem | None = None,
        clock: Callable[[], float] = time.monotonic,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self.path = path
        self._fs = fs or FileSystem()
        self._clock = clock
        self._recheck_s = recheck_s
        self._tokens: TokenSet | None = None
        self._signature: _Signature | None = None
        self._checked_at = 0.0
        self._failure = ""  # the last reload error logged, so it is logged once

    def load(self, *, missing_ok: bool = False) -> TokenSet:
        """Read and check the file now; becomes what :meth:`current` returns.

        Args:
            missing_ok: A missing file is an empty set (the first ``tokens create``).

        Raises:
            TokensFileError: Unreadable, missing (unless ``missing_ok``), or invalid.
        """
        try:
            signature = self._stat()
            tokens = self._read()
        except FileNotFoundError as exc:
            if not missing_ok:
                raise TokensFileError(
                    self.path,
                    "does not exist; create a token with `headrace tokens create "
                    f"--tokens-file {self.path} ...` first",
                ) from exc
            signature, tokens = None, TokenSet()
        except OSError as exc:  # stat: a directory on the path is unreadable
            raise TokensFileError(self.path, f"cannot read: {exc.strerror or exc}") from exc
        self._tokens, self._signature = tokens, signature
        self._checked_at = self._clock()
        return tokens

    def current(self) -> TokenSet:
        """The tokens in force: the last good load, refreshed if the file changed and
        ``recheck_s`` has passed since the last look.

        Raises:
            TokensFileError: Only before any load succeeded.
        """
        if self._tokens is None:
            return self.load()
        now = self._clock()
        if now - self._checked_at < self._recheck_s:
            return self._tokens
        self._checked_at = now
        try:
            signature = self._stat()
            if signature != self._signature:
                self._signature = signature  # a bad file is read once, not on every look
                self._tokens = self._read()
                self._failure = ""
                logger.info("tokens file %s reloaded: %d tokens", self.path, len(self._tokens))
        except (OSError, TokensFileError) as exc:
            self._log_failure(exc)
        return self._tokens

    def _log_failure(self, exc: Exception) -> None:
        problem = str(exc)
        if problem != self._failure:
            self._failure = problem
            logger.error(
                "tokens file %s changed but cannot be loaded; the %d tokens loaded before "
                "stay in force: %s",
                self.path,
                len(self._tokens or ()),
                problem,
            )

    def update(self, change: Callable[[TokenSet], TokenSet]) -> TokenSet:
        """Apply ``change`` to the file's tokens and write the result atomically, under
        the file's lock. A missing file counts as empty.

        Raises:
            TokensFileError: The file is invalid or cannot be written.
            ValueError: From ``change`` (nothing is written).
        """
        with self._locked():
            tokens = change(self.load(missing_ok=True))
            try:
                self._write(encode_tokens(tokens))
            except OSError as exc:
                raise TokensFileError(
                    self.path, f"cannot write: {exc.strerror or exc}; nothing was changed"
                ) from exc
            self._tokens = tokens
            return tokens

    def _stat(self) -> _Signature:
        st = os.stat(self.path)
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _read(self) -> TokenSet:
        try:
            data = self._fs.read_file(self.path)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise TokensFileError(self.path, f"cannot read: {exc.strerror or exc}") from exc
        try:
            return decode_tokens(data)
        except ValueError as exc:
            raise TokensFileError(self.path, str(exc)) from exc

    def _write(self, data: bytes) -> None:
        tmp = self.path + ".tmp"
        self._fs.remove(tmp)
        try:
            self._fs.write_new(tmp, data)  # written and synced
            os.chmod(tmp, 0o600)  # only hashes inside, but names and grants are nobody's
            self._fs.rename(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                self._fs.remove(tmp)
            raise
        self._fs.fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise TokensFileError(
                self.path, f"cannot lock: {exc.strerror or exc} ({exc.filename})"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
