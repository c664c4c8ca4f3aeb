"""Server processes as the benches run them: spawn, wait until serving, restart, stop.

Owns :func:`free_port` and :func:`distinct_ports`, :class:`ServerProcess` (start with its
output in a log file, SIGKILL, SIGTERM-then-SIGKILL), :func:`wait_until_serving` (poll a
client operation until it succeeds or a deadline passes), :func:`restart_to_serving` (the
``restart_to_serving_s`` convention), :func:`rss_mib` (VmRSS from /proc), and, for child
processes, :func:`stdin_closed` (how the parent tells them to stop). Every system of the
``pubsub`` scenario (:mod:`bench._pubsub_system`) and the other scenarios' brokers and
peers run through these.

Invariant: ``restart_to_serving`` times from the spawn of the new process (the old one
already reaped) to the first successful client operation against it.

Depends on nothing of Headrace's and on no client library: the probe is the caller's.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO

#: One client operation with its own short timeout; raising means "not serving yet".
Probe = Callable[[], Awaitable[object]]


class ServerFailedError(RuntimeError):
    """Raised when a server process exits early or never starts serving."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def distinct_ports(count: int) -> list[int]:
    """``count`` different TCP ports on 127.0.0.1 that nothing listens on right now (for
    servers started together: :func:`free_port` may hand out the same port twice)."""
    ports: list[int] = []
    while len(ports) < count:
        if (port := free_port()) not in ports:
            ports.append(port)
    return ports


class ServerProcess:
    """One server child process, its stdout and stderr appended to ``log_path``.

    Can be started again after it stopped (same argv, same log). Not task-safe: owned by
    the system that runs it.
    """

    def __init__(self, argv: Sequence[str], log_path: Path) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        """Spawn the process (it must not be running)."""
        if self.is_running:
            raise ServerFailedError(f"{self.argv[0]} is already running")
        self._close_log()
        self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        """The running process's id."""
        if self._proc is None or self._proc.poll() is not None:
            raise ServerFailedError(f"{self.argv[0]} is not running")
        return self._proc.pid

    @property
    def is_running(self) -> bool:
        """Whether the process was started and has not exited."""
        return self._proc is not None and self._proc.poll() is None

    def exit_code(self) -> int | None:
        """The exit status once the process has exited; ``None`` while it runs or before it ran."""
        return None if self._proc is None else self._proc.poll()

    def kill(self) -> None:
        """SIGKILL the process and reap it."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; safe to call when not running."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()

    def log_tail(self, lines: int = 10) -> str:
        """The last ``lines`` lines the process printed."""
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


async def wait_until_serving(
    probe: Probe,
    *,
    timeout_s: float,
    process: ServerProcess | None = None,
    interval_s: float = 0.002,
) -> float:
    """Call ``probe`` until it returns without raising; return the seconds that took.

    Args:
        probe: One client operation with its own short timeout; raising means "not yet".
        timeout_s: Give up after this many seconds.
        process: When given, fail at once if it exits.
        interval_s: Pause between attempts, seconds.

    Raises:
        ServerFailedError: ``process`` exited, or ``timeout_s`` passed without success.
    """
    start = time.perf_counter()
    last: Exception | None = None
    while True:
        if process is not None and process.exit_code() is not None:
            raise ServerFailedError(
                f"{process.argv[0]} exited with status {process.exit_code()}:\n"
                + process.log_tail()
            )
        try:
            await probe()
        except Exception as exc:  # any failure of the probe means "not serving yet"
            last = exc
        else:
            return time.perf_counter() - start
        if time.perf_counter() - start >= timeout_s:
            raise ServerFailedError(f"not serving after {timeout_s:g} s: {last!r}") from last
        await asyncio.sleep(interval_s)


async def restart_to_serving(
    process: ServerProcess, probe: Probe, *, timeout_s: float = 60.0
) -> float:
    """SIGKILL ``process``, start it again and return the seconds from its spawn until
    ``probe`` (a client operation on a fresh connection) first succeeds."""
    process.kill()
    start = time.perf_counter()
    process.start()
    await wait_until_serving(probe, timeout_s=timeout_s, process=process)
    return time.perf_counter() - start


def parse_vmrss_mib(status: str) -> float:
    """The ``VmRSS`` of a /proc/<pid>/status text, in MiB (the kernel reports kB)."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            fields = line.split()
            return int(fields[1]) / 1024
    raise ValueError("no VmRSS line (is the process a zombie?)")


def rss_mib(pid: int) -> float:
    """The resident set size of process ``pid``, MiB."""
    return parse_vmrss_mib(Path(f"/proc/{pid}/status").read_text(encoding="ascii"))


async def stdin_closed() -> None:
    """Return once stdin reaches its end: how a bench asks a child process to stop."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), sys.stdin
    )
    try:
        await reader.read()
    finally:
        transport.close()
