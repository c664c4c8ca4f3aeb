"""Conformance vectors of the consumer name rule: ``docs/protocol/vectors/names/``.

Role: owns the consumer names a broker MUST accept in ``OpenSubscription.consumer_name``
and the ones it MUST refuse, and writes them as ``names/consumer_name.json``;
:func:`proto.vectors.write` calls :func:`write`, so ``python -m proto.vectors`` and its
``--check`` cover these files too. A client in any language checks its own validation
against the same file (``docs/protocol.md``, section "Conformance vectors").

JSON (written with ``ensure_ascii``, so every control character is visible as ``\\uXXXX``)::

    {"description": "...", "field": "consumer_name", "rule": "...",
     "valid": ["", "worker-7", ...],
     "invalid": [{"name": "a\\nb", "why": "a line feed", "status": "INVALID_ARGUMENT",
                  "message_contains": "consumer_name"}, ...]}

The rule itself is :func:`proto.names.is_valid_consumer_name`; the vectors are written
from this list, not from the rule, so a change of the rule that breaks a vector shows.

Pure module apart from :func:`write`: imports nothing of ours but :mod:`proto`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from proto.names import CONSUMER_NAME_RULE, MAX_CONSUMER_NAME_LENGTH

NAMES = "names"
_FIELD = "consumer_name"


@dataclass(frozen=True)
class BadName:
    """A consumer name every broker refuses on open, and why."""

    name: str
    why: str


#: Names a broker accepts as ``consumer_name`` (the empty one: it picks a name).
VALID_CONSUMER_NAMES: tuple[str, ...] = (
    "",
    "worker-7",
    "host-1/pid 42",
    "caf\u00e9 \u2713 \U0001f680",
    "x" * MAX_CONSUMER_NAME_LENGTH,
)
#: Names a broker refuses with INVALID_ARGUMENT naming ``consumer_name``.
INVALID_CONSUMER_NAMES: tuple[BadName, ...] = (
    BadName("x\n2026-12-06 12:00:00,000 ERROR broker.auth: forged", "a line feed"),
    BadName("x\rover", "a carriage return"),
    BadName("a\x00b", "a NUL"),
    BadName("\x1b[2J\x1b[H", "an ANSI escape sequence (clear the screen)"),
    BadName("tab\there", "a tab (a control character)"),
    BadName("del\x7f", "DEL (a control character)"),
    BadName("line\u2028separator", "U+2028 LINE SEPARATOR"),
    BadName("\u202egnp.exe", "U+202E RIGHT-TO-LEFT OVERRIDE (a format character)"),
    BadName("x" * (MAX_CONSUMER_NAME_LENGTH + 1), "201 characters"),
)


def document() -> dict[str, object]:
    """The JSON document of the consumer name vectors."""
    return {
        "description": (
            "OpenSubscription.consumer_name: a broker accepts each valid name and refuses "
            "each invalid one on open, with the status given and a message containing "
            "message_contains; a client library SHOULD refuse the invalid ones before "
            "sending. Enforced since issue 38."
        ),
        "field": _FIELD,
        "rule": CONSUMER_NAME_RULE,
        "valid": list(VALID_CONSUMER_NAMES),
        "invalid": [
            {
                "name": bad.name,
                "why": bad.why,
                "status": "INVALID_ARGUMENT",
                "message_contains": _FIELD,
            }
            for bad in INVALID_CONSUMER_NAMES
        ],
    }


def write(out: Path) -> list[Path]:
    """Write the name vectors under ``out`` (the vectors directory); return the files."""
    path = out / NAMES / f"{_FIELD}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document(), indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    return [path]
