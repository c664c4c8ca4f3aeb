"""The rules for topic, subscription and consumer names: part of the wire contract.

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

A consumer name (``OpenSubscription.consumer_name``) is free text shown in ``headrace
lag``, ``subscriptions describe`` and the broker's log, so it has a looser rule of its
own (issue 38): at most 200 characters, each printable, that is, none of Unicode's
control (Cc), format (Cf), surrogate (Cs), private-use (Co) or unassigned (Cn)
characters, nor a line, paragraph or space separator other than the space itself (what
``str.isprintable`` says). Empty is valid: the broker names the consumer. So ``worker
7``, ``host-1/pid 42`` and ``über`` are valid; ``a\nb``, ``\x1b[2J``, a NUL and a
201-character name are not.

A cluster node id (``[cluster] node_id``, ``--node-id``) is 1 to 64 characters of the
topic name rule's alphabet, the first a letter or digit: it is the last segment of an
etcd key, a metrics label and a word in logs and refusal trailers, so never ``/``, a space
or a control character. ``b1``, ``eu-west.b_2`` are valid; ``b 1``, ``a/b``, ``-b`` and 65
characters are not.

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

#: The longest consumer name, characters.
MAX_CONSUMER_NAME_LENGTH = 200
#: The consumer name rule in words, for error messages.
CONSUMER_NAME_RULE = (
    f"use at most {MAX_CONSUMER_NAME_LENGTH} printable characters (no control, format or "
    "separator characters other than the space), or leave it empty for the broker to pick one"
)

_NAME = re.compile(NAME_PATTERN)


def is_valid_name(name: str) -> bool:
    """Whether ``name`` is a valid topic or subscription name."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def is_valid_consumer_name(name: str) -> bool:
    """Whether ``name`` is a valid consumer name (``""`` included: the broker picks one)."""
    return isinstance(name, str) and len(name) <= MAX_CONSUMER_NAME_LENGTH and name.isprintable()


#: The pattern a whole cluster node id must match.
NODE_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
#: The node id rule in words, for error messages.
NODE_ID_RULE = (
    "use 1-64 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit "
    f"(pattern {NODE_ID_PATTERN})"
)
_NODE_ID = re.compile(NODE_ID_PATTERN)


def is_valid_node_id(node_id: str) -> bool:
    """Whether ``node_id`` is a valid cluster node id."""
    return isinstance(node_id, str) and _NODE_ID.fullmatch(node_id) is not None
