"""``headrace serve`` as a real process for the fuzz tests: its stderr (the log) kept in a
file, its memory read from ``/proc``, and hostile calls sent to it over real gRPC.

:class:`ServeProcess` starts the broker with a tokens file holding one token, ``fuzz``,
that is admin of the topic :data:`PLAY` only: every call the fuzzer aims elsewhere is
refused by the interceptor, which logs the refusal at DEBUG with the resource the request
named (the path by which a client's name used to reach the log unescaped).

:func:`check_text_log` and :func:`check_json_log` hold a log to the rule of issue 38:
every line is one of the broker's own records, or part of a traceback it printed.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import grpc

from tests.broker.auth.test_interceptor import make_tokens
from tests.broker.test_serve_process import ROOT, free_port, wait_serving
from tests.fuzz._strategies import FORGED_PREFIX

PLAY, SUB = "play", "sub"
#: A record line of the text format: timestamp, level, logger, then the message.
TEXT_RECORD = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [A-Za-z_][\w.]*: "
)
#: The first line of a traceback (or a stack) printed under a record.
_TRACE_STARTS = ("Traceback (most recent call last):", "Stack (most recent call last):")


@dataclass
class ServeProcess:
    """A ``headrace serve`` child on a free port with its data in ``root/data`` and its
    stderr in ``root/broker.log``."""

    root: Path
    log_format: str | None = None  # None: the default (text); "json" via --log-format
    config_text: str = ""  # a TOML file's content, passed with --config when given
    port: int = 0
    token: str = ""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.root / "broker.log"

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),)

    def __enter__(self) -> Self:
        tokens = self.root / "tokens.json"
        self.token = make_tokens(tokens, {"fuzz": f"admin:{PLAY}:*"})["fuzz"]
        self.port = free_port()
        argv = [sys.executable, "-c", "from broker.cli import main; main()", "serve"]
        argv += ["--data-dir", str(self.root / "data"), "--listen", f"127.0.0.1:{self.port}"]
        argv += ["--metrics-listen", "", "--tokens-file", str(tokens), "--log-level", "DEBUG"]
        if self.log_format is not None:
            argv += ["--log-format", self.log_format]
        if self.config_text:
            config = self.root / "broker.toml"
            config.write_text(self.config_text, encoding="utf-8")
            argv += ["--config", str(config)]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stderr=log, stdout=subprocess.DEVNULL)
        try:
            wait_serving(self.port, time.monotonic() + 30)
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        return self

    def rss_kib(self) -> tuple[int, int]:
        """The broker's resident set now and its high-water mark, KiB (VmRSS, VmHWM)."""
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text(encoding="ascii")
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])

    def stop(self) -> int:
        """SIGTERM, wait; the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def log(self) -> str:
        """The whole log, as text (it must be UTF-8)."""
        return self.log_path.read_bytes().decode("utf-8")

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(f"127.0.0.1:{self.port}")


def _banner(lines: list[str]) -> range:
    """Where ``serve``'s banner is in ``lines`` (text format: printed to stderr, not
    logged): its first line, the "Try" line, and the indented commands."""
    starts = [i for i, line in enumerate(lines) if line.startswith("headrace: serving on ")]
    assert len(starts) <= 1, "the banner is printed once"
    if not starts:
        return range(0)
    i = starts[0]
    assert lines[i + 1].startswith("Try, in another terminal")
    end = i + 2
    while end < len(lines) and lines[end].startswith("  "):
        end += 1
    return range(i, end)


def check_text_log(text: str) -> list[str]:
    """Hold a text-format log to the rule: each line is a record (timestamp, level,
    logger), a line of a traceback printed right under a record, or the banner; no line
    holds a control character (tabs of a traceback aside); no forged record got through.
    Returns the record lines."""
    lines = text.split("\n")
    assert lines[-1] == "", "the log ends with a newline"
    lines = lines[:-1]
    banner = _banner(lines)
    records: list[str] = []
    in_trace = False
    for n, line in enumerate(lines):
        where = f"log line {n + 1}: {line[:200]!r}"
        assert line.replace("\t", " ").isprintable(), where
        assert not line.startswith(FORGED_PREFIX[:10]), where
        if n in banner:
            continue
        if TEXT_RECORD.match(line):
            records.append(line)
            in_trace = False
        elif records and (in_trace or line in _TRACE_STARTS):
            in_trace = True
        else:
            raise AssertionError(f"{where} is neither a record nor part of a traceback")
    return records


def check_json_log(text: str) -> list[dict[str, object]]:
    """Hold a JSON-format log to the rule: each line is one JSON object with ``time``,
    ``level``, ``logger`` and ``message`` (strings), printable ASCII; a traceback is inside
    its record's ``exception``. Returns the records."""
    lines = text.split("\n")
    assert lines[-1] == "", "the log ends with a newline"
    records: list[dict[str, object]] = []
    for n, line in enumerate(lines[:-1]):
        where = f"log line {n + 1}: {line[:200]!r}"
        assert line.isascii(), where
        assert line.isprintable(), where
        doc = json.loads(line)
        assert isinstance(doc, dict), where
        assert {"time", "level", "logger", "message"} <= doc.keys(), where
        assert all(isinstance(doc[k], str) for k in ("time", "level", "logger", "message"))
        assert not str(doc["message"]).startswith(FORGED_PREFIX[:10]), where
        records.append(doc)
    return records
