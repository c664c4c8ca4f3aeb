"""The topic and subscription name rule, as the dispatcher and broker import it.

Role: a name only; the rule itself lives in :mod:`proto.names` (one copy, which the
``headrace`` CLI checks names with before it sends them).
"""

from __future__ import annotations

from proto.names import MAX_NAME_LENGTH, NAME_PATTERN, NAME_RULE, is_valid_name

__all__ = ["MAX_NAME_LENGTH", "NAME_PATTERN", "NAME_RULE", "is_valid_name"]
