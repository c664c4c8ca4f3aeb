"""The broker's log formats (:mod:`broker.logs`): records formatted with no process.

The real ``headrace serve`` process in each format is tested in
tests/broker/test_serve_logs.py and, under RPC fuzzing, tests/fuzz/test_log_fuzz.py.
"""

from __future__ import annotations

import io
import json
import logging
import re
import sys

import pytest

from broker.config import BrokerConfig
from broker.errors import ConfigError
from broker.logs import JsonFormatter, LogFormat, TextFormatter, configure

FORGED = "x\n2026-12-06 12:00:00,000 ERROR broker.auth: token granted (forged)\r\x1b[2K\x00"
TEXT_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) ")


def _record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("bad\nvalue")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("broker.test", logging.INFO, __file__, 1, msg, args, exc_info)


def test_text_format_escapes_the_message_so_a_record_is_one_line() -> None:
    """Scenario: a record whose argument holds a newline, a forged record, CR, an escape
    sequence and NUL (a value that reached a message unescaped). Expected: one line,
    starting with the timestamp and level, every control character written escaped."""
    line = TextFormatter().format(_record("consumer %s attached", FORGED))
    assert "\n" not in line
    assert line.isprintable()
    assert TEXT_RECORD.match(line)
    assert "x\\n2026-12-06 12:00:00,000 ERROR" in line
    assert "\\r\\x1b[2K\\x00" in line


def test_text_format_keeps_the_traceback_on_the_lines_after_the_record() -> None:
    """Scenario: a record with an exception. Expected: the first line is the record, the
    traceback follows it (as before: a person reads it)."""
    lines = TextFormatter().format(_record("failed", exc=True)).splitlines()
    assert TEXT_RECORD.match(lines[0])
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-2:] == ["ValueError: bad", "value"]


def test_json_format_is_one_object_per_line_with_the_fields() -> None:
    """Scenario: the forged value as the message's argument, an exception, and an
    ``extra`` field holding bytes. Expected: one line; it parses as JSON with time (UTC,
    ms, Z), level, logger, message (the value intact), exception (the traceback) and the
    extra field (as its repr)."""
    record = _record("consumer %s attached", FORGED, exc=True)
    record.consumer = b"\x1b[2J"
    line = JsonFormatter().format(record)
    assert "\n" not in line
    assert "\r" not in line
    assert line.isprintable()
    doc = json.loads(line)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", doc["time"])
    assert (doc["level"], doc["logger"]) == ("INFO", "broker.test")
    assert doc["message"] == f"consumer {FORGED} attached"
    assert doc["exception"].startswith("Traceback (most recent call last):")
    assert doc["exception"].endswith("ValueError: bad\nvalue")
    assert doc["consumer"] == repr(b"\x1b[2J")


@pytest.mark.parametrize(("log_format", "first"), [(LogFormat.TEXT, "2"), (LogFormat.JSON, "{")])
def test_configure_replaces_the_handlers_and_sets_the_level(
    log_format: LogFormat, first: str
) -> None:
    """Scenario: configure DEBUG in each format onto a stream, log at DEBUG. Expected:
    the record is on the stream, in that format; afterwards the previous handlers come
    back (pytest's own)."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    stream = io.StringIO()
    try:
        configure("DEBUG", log_format, stream)
        logging.getLogger("broker.test").debug("hello %s", "a\nb")
    finally:
        root.handlers[:], root.level = saved, level
    (line,) = stream.getvalue().splitlines()
    assert line.startswith(first)
    assert "hello a\\nb" in line


@pytest.mark.parametrize(
    ("value", "expected"), [("json", LogFormat.JSON), ("text", LogFormat.TEXT), (None, None)]
)
def test_the_config_key_chooses_the_format(value: str | None, expected: LogFormat | None) -> None:
    """Scenario: ``[broker] log_format`` set to each format, or left out. Expected: that
    format; text when left out."""
    doc = {"broker": {} if value is None else {"log_format": value}}
    assert BrokerConfig.from_mapping(doc).log_format is (expected or LogFormat.TEXT)


def test_an_unknown_log_format_names_the_key_and_the_choices() -> None:
    """Scenario: ``log_format = "yaml"``. Expected: ConfigError naming the key, the value
    and both choices."""
    with pytest.raises(ConfigError, match=r"\[broker\] log_format = 'yaml': must be one of text"):
        BrokerConfig.from_mapping({"broker": {"log_format": "yaml"}})
