"""The escaping helper (:mod:`proto.shown`): pure, no loop, no disk."""

from __future__ import annotations

import ast

import pytest

from proto.shown import SHOWN_LIMIT, shown, shown_text

#: What a hostile client sends to forge or hide log lines and move a terminal's cursor.
HOSTILE = [
    "x\n2026-12-06 12:00:00,000 ERROR broker.auth: forged",
    "x\r2026-12-06 12:00:00,000 ERROR forged",
    "a\x00b",
    "\x1b[2J\x1b[H",
    "\x1b]0;title\x07",
    "tab\there",
    "del\x7f",
    "line\u2028sep\u2029para",
    "\u202egnp.exe",
    "\x85next-line",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_hostile_string_becomes_one_printable_line(value: str) -> None:
    """Scenario: a string holding a newline, CR, NUL, escape sequence, bidi override...
    Expected: the result is printable (no control, format or separator character but the
    space), so it can neither end a log line nor move a cursor; it is the repr, which
    reads back to the value."""
    out = shown(value)
    assert out.isprintable()
    assert not {"\n", "\r", "\x1b", "\x00"} & set(out)
    assert out == repr(value)
    assert ast.literal_eval(out) == value


@pytest.mark.parametrize("value", [b"\x1b[2J\n\r\x00", bytearray(b"\xff\n"), memoryview(b"a\nb")])
def test_bytes_are_shown_as_their_repr(value: bytes | bytearray | memoryview) -> None:
    """Scenario: header values as bytes, bytearray and memoryview. Expected: ``b'...'``
    with every non-printable byte escaped."""
    out = shown(value)
    assert out == repr(bytes(value))
    assert out.isprintable()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a" * SHOWN_LIMIT, repr("a" * SHOWN_LIMIT)),
        ("a" * (SHOWN_LIMIT + 1), repr("a" * SHOWN_LIMIT) + f"... ({SHOWN_LIMIT + 1} characters)"),
        ("\n" * 5000, repr("\n" * SHOWN_LIMIT) + "... (5000 characters)"),
        (b"b" * 300, repr(b"b" * SHOWN_LIMIT) + "... (300 bytes)"),
        (memoryview(b"m" * 1000), repr(b"m" * SHOWN_LIMIT) + "... (1000 bytes)"),
    ],
)
def test_long_values_are_cut_and_their_length_said(
    value: str | bytes | memoryview, expected: str
) -> None:
    """Scenario: values at and past the limit of 200. Expected: at the limit the whole
    repr; past it the first 200 characters or bytes, then the full length."""
    assert shown(value) == expected


def test_a_smaller_limit_is_honoured() -> None:
    """Scenario: limit 4. Expected: 4 characters written, 9 counted."""
    assert shown("xyz" * 3, limit=4) == "'xyzx'... (9 characters)"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain message 'orders'", "plain message 'orders'"),
        ("bad name 'a\nb'", "bad name 'a\\nb'"),
        ("nul\x00 esc\x1b[31m", "nul\\x00 esc\\x1b[31m"),
        ("y" * 401, "y" * 400 + "... (401 characters)"),
    ],
)
def test_shown_text_escapes_a_whole_message_without_quoting_it(text: str, expected: str) -> None:
    """Scenario: a message that may quote a client's value (an exception's, a peer's).
    Expected: printable text left alone; anything else escaped in place, cut at 400."""
    out = shown_text(text)
    assert out == expected
    assert out.isprintable()
