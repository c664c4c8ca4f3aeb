"""How a value that a client chose is written into a log line, a metric label, an error
message or the CLI's output: escaped and bounded, never raw.

Role: the one escaping helper of the project (issue 38, CWE-117). A client can put any
character in a string field and any byte in a header: a ``\\n`` followed by a forged
``2026-12-06 12:00:00,000 ERROR ...`` line, a ``\\r`` that rewrites a terminal line, NUL,
an ANSI escape sequence that moves the cursor or recolours a table, or 5,000 characters.
:func:`shown` turns such a value into one printable line of bounded length, ``repr``
style, so what it shows cannot start a log line, end one, or move a cursor, and what a
person reads is still what the client sent.

Which values are trusted (written as they are) and which are shown through :func:`shown`:

- Trusted: values that passed a rule excluding control characters before they got here.
  Topic and subscription names (:func:`proto.names.is_valid_name`: ``A-Z a-z 0-9 . _ -``,
  checked wherever one arrives, so a name in a log line is one the broker accepted),
  consumer names (:func:`proto.names.is_valid_consumer_name`: printable, at most 200
  characters; checked on open), token ids (matched by the tokens file's pattern before
  use), numbers, enum members, and what the broker itself wrote (paths under its data
  directory, its config, its own messages).
- Untrusted, always shown through :func:`shown`: anything read from a request before it
  passed such a rule (a name that is being refused, a method path), header names and
  values, nack and dead-letter reasons, record keys and values, grpc metadata, Spark
  options, and text that a peer put into an error (``grpc`` details, an exception's
  message that quotes a request).

A rule of thumb: a value that reaches a message before it is validated is untrusted in
that message, even when the same field is trusted once it passed.

Example: ``shown("x\\n2026 ERROR forged")`` is ``'x\\\\n2026 ERROR forged'`` (the
newline written as the two characters backslash and ``n``); ``shown("A" * 5000)`` is the
first 200 characters in quotes followed by ``... (5000 characters)``; ``shown(b"\\x1b[2J")``
is ``b'\\\\x1b[2J'``.

Pure module: imports nothing of ours, and neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

#: The most characters (of a ``str``) or bytes (of a ``bytes``) of a value that
#: :func:`shown` writes; the rest is counted, not written.
SHOWN_LIMIT = 200


def shown(value: str | bytes | bytearray | memoryview, limit: int = SHOWN_LIMIT) -> str:
    """``value`` as one printable line of bounded length: its ``repr`` (quotes included,
    every control, format or separator character other than space escaped as ``\\n``,
    ``\\x1b``, ``\\u2028`` ...), cut to its first ``limit`` characters or bytes, with the
    full length said when it was cut.

    Examples:
        >>> shown("a\\nb")
        "'a\\\\nb'"
        >>> shown("xyz" * 3, limit=4)
        "'xyzx'... (9 characters)"
        >>> shown(b"\\x00\\xff")
        "b'\\\\x00\\\\xff'"
    """
    full = len(value)
    if isinstance(value, bytearray | memoryview):
        value = bytes(value[: limit + 1])
    if full <= limit:
        return repr(value)
    unit = "characters" if isinstance(value, str) else "bytes"
    return f"{value[:limit]!r}... ({full} {unit})"


def shown_text(text: str, limit: int = 2 * SHOWN_LIMIT) -> str:
    """``text`` (a message that may quote a client's value, such as an exception's or a
    peer's) with every non-printable character escaped as :func:`shown` would, without
    the quotes, and cut to ``limit`` characters; for messages of our own whose pieces
    cannot each be passed through :func:`shown`.

    Example: ``shown_text("bad name 'a\\nb'")`` is ``bad name 'a\\\\nb'``.
    """
    if text.isprintable() and len(text) <= limit:
        return text
    cut = text[:limit]
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return escaped if len(text) <= limit else f"{escaped}... ({len(text)} characters)"
