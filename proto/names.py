"""The one pattern for topic and subscription names: part of the wire contract.

Role: names become directory and file names on disk and labels in metrics, so they are
checked with one rule wherever one arrives: by the broker and dispatcher (through
:mod:`dispatcher.names`) and, before anything is sent, by the ``headrace`` CLI, which can
then answer a bad name with a usage error. It lives in ``proto`` because every side may
import ``proto`` (DESIGN's import arrows) and importing it costs nothing.

The rule (unchanged since the first release, so every existing name stays valid): 1 to
200 characters from ``A-Z a-z 0-9 . _ -``, the first a letter or digit (so never ``.``,
``..`` or a hidden file, and never a ``-`` that a shell would read as an option).

Example: ``orders``, ``orders.v2``, ``eu-west_1`` are valid; ``.hidden``, ``-x``,
``a/b``, ``über`` and a 201-character name are not.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``, and nothing of ours.
"""

from __future__ import annotations

import re

#: The pattern a whole topic or subscription name must match.
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}"
#: The longest name, characters.
MAX_NAME_LENGTH = 200
#: The rule in words, for error messages.
NAME_RULE = (
    f"use 1-{MAX_NAME_LENGTH} characters from A-Z a-z 0-9 . _ -, starting with a letter or "
    f"digit (pattern {NAME_PATTERN})"
)

_NAME = re.compile(NAME_PATTERN)


def is_valid_name(name: str) -> bool:
    """Whether ``name`` is a valid topic or subscription name."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None
