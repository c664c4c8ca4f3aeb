"""How ``headrace serve`` writes its log: one record per line, as text or as JSON.

Role: the two formats of the broker's log (``--log-format``, ``[broker] log_format``) and
:func:`configure`, which ``serve`` calls once before the broker starts. Every record goes
to stderr.

- ``text`` (the default): ``2026-12-06 12:00:00,000 INFO broker.app: message``, then the
  traceback, if any, on the lines after it. The message is escaped as a whole
  (:func:`proto.shown.shown_text`, without a cut): the call sites already show a client's
  values through :mod:`proto.shown`, and this is the second fence, for text that reaches
  a message some other way (a library's log, an exception's words). So every line of the
  log starts with a timestamp and a level, or belongs to the traceback printed under one.
- ``json``: one JSON object per line, for log shippers::

      {"time": "2026-12-06T12:00:00.000Z", "level": "INFO", "logger": "broker.app",
       "message": "headrace serving on 127.0.0.1:50051 ...", "exception": "Traceback..."}

  ``exception`` is present only with a traceback, and any ``extra=`` field a call passed
  is added under its own name (a value JSON cannot carry is written as its ``repr``).
  Escaping is by construction: ``json.dumps`` writes every control character as
  ``\\uXXXX`` and a line break inside a message or traceback as ``\\n``.

Worked example: a record whose message is ``consumer 'a\\nb' refused`` is, in text,
``... INFO x: consumer 'a\\nb' refused`` on one line, and in JSON
``{"time": ..., "message": "consumer 'a\\\\nb' refused"}``.
"""

from __future__ import annotations

import enum
import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

from proto.shown import shown_text

#: The text format's layout (the one ``serve`` always had).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Attributes every ``LogRecord`` has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
#: No message is cut by the text format's escaping: it only escapes.
_NO_CUT = 1 << 62


class LogFormat(enum.Enum):
    """The format of the broker's log."""

    TEXT = "text"
    JSON = "json"


class TextFormatter(logging.Formatter):
    """:data:`TEXT_FORMAT`, with the message's control characters escaped, so a record is
    one line (plus its traceback's)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = shown_text(record.message, _NO_CUT)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601, milliseconds), ``level``,
    ``logger``, ``message``, ``exception`` when there is a traceback, and the record's
    ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in doc:
                doc[key] = value
        return json.dumps(doc, default=repr)


def formatter(log_format: LogFormat) -> logging.Formatter:
    """The formatter of ``log_format``."""
    return JsonFormatter() if log_format is LogFormat.JSON else TextFormatter()


def configure(level: str, log_format: LogFormat, stream: TextIO | None = None) -> None:
    """Send every record at ``level`` or above to ``stream`` (stderr) in ``log_format``,
    replacing any handler the root logger had."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level, handlers=[handler], force=True)
