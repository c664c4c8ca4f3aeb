"""msgspec's validation errors in the config's own words: one line naming the setting.

Role: :func:`explain` turns a :class:`msgspec.ValidationError` raised while converting a
document into a :mod:`broker.config_schema` Struct into the message
:class:`~broker.errors.ConfigError` carries. msgspec names the failing path
(``$.wal.topics[...].fsync``) but not a dict's key nor the value; the path is walked again
through the document and the Structs' type hints to find both, and the key's
:class:`msgspec.Meta` says what is allowed.

The message shapes (``{where}`` is the file and table, ``[wal.topics.m]``):

- an unknown key: ``{where}: unknown setting(s) a, b; known: ...`` (every unknown key of
  the table, not only the first msgspec met);
- a table that is not one: ``{where}: broker must be a table ([broker]), not 5``, or for a
  table of tables or of values, ``[wal] topics must be a table of tables (...)``;
- a bad value: ``{where} {key} = {value!r}: must be {what}``, where ``what`` comes from the
  type and range (``an integer from 1 to 10000``, ``one of always, interval, never``,
  ``from 1 to 3600000 milliseconds``) unless the key's ``extra`` gives its own ``must``
  (``above`` when the value is over the top) or message ``form`` (:data:`NAMED`,
  :data:`DISPATCHER`, :data:`WAL`).

Worked example: ``{"wal": {"topics": {"m": {"segment_bytes": 0}}}}`` fails at
``$.wal.topics[...].segment_bytes``; the walk finds topic ``m`` (the one entry that does
not convert) and the value 0, and the message is ``headrace.toml [wal.topics.m]:
segment_bytes = 0: must be an integer from 128 to 2147483648``.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import enum
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

import msgspec
from msgspec import Meta

_AT = re.compile(r"(?P<problem>.*?)(?: - at `\$(?P<path>.*)`)?", re.S)
_STEP = re.compile(r"\.([A-Za-z_]\w*)|\[(\.\.\.|\d+)\]")
#: The message shapes a key may choose with ``form`` in its ``extra`` (VALUE by default).
VALUE = "{where} {key} = {value!r}: must be {what}"
NAMED = "{where} {key} must be {what}, not {value!r}"
DISPATCHER = "{where} {key}: {value!r} must be {what}"  # the dispatcher's own words
WAL = "{where}: {key} = {value!r}: must be {what}"  # wal.LogConfig's table prefix
_ENTRY = "{where}.{key} = {value!r}: must be {what}"  # a value in a table of name = value


def explain(
    exc: msgspec.ValidationError,
    doc: object,
    schema: type[msgspec.Struct],
    source: str,
    prefix: tuple[str, ...] = (),
) -> str:
    """The one-line message for ``exc``, raised converting ``doc`` into ``schema``.

    Args:
        exc: msgspec's error.
        doc: What was converted (the parsed file, or one table of it).
        schema: The Struct it was converted into.
        source: The file's name, first in the message (``""`` for none).
        prefix: The table names above ``doc`` (``("broker",)`` when ``doc`` is ``[broker]``).
    """
    found = _AT.fullmatch(str(exc))
    problem, path = (found["problem"], found["path"] or "") if found else (str(exc), "")
    try:
        return _line(_walk(doc, schema, path, list(prefix)).message(problem, source))
    except (TypeError, LookupError, StopIteration):  # the path did not lead where it said
        return _line(f"{source}: {problem} at {path or '$'}")


def _line(text: str) -> str:
    return text.replace("\n", " ")


def shown(name: object) -> str:
    """A key or table name as one printable line."""
    text = str(name)
    return text if text.isprintable() else repr(text)


def _where(source: str, names: list[str]) -> str:
    table = f"[{'.'.join(shown(n) for n in names)}]" if names else ""
    return " ".join(part for part in (source, table) if part) or "config"


class _Node:
    """Where a walk of the failing path ended: the value, its type and its names."""

    def __init__(self, value: object, tp: Any, names: list[str], entry: bool) -> None:
        self.value = value
        self.tp = tp
        self.names = names
        self.entry = entry  # reached through a dict's entry, not a Struct field

    def message(self, problem: str, source: str) -> str:
        base, meta = unwrap(self.tp)
        if problem.startswith("Object contains unknown field"):
            return self._unknown(base, source)
        if problem.startswith("Expected `object`"):
            return self._not_a_table(base, meta, source)
        return self._bad_value(base, meta, source, above="<" in problem)

    def _unknown(self, base: Any, source: str) -> str:
        known = sorted(base.__struct_fields__)
        assert isinstance(self.value, Mapping)
        unknown = ", ".join(shown(n) for n in sorted(set(self.value) - set(known), key=str))
        return f"{_where(source, self.names)}: unknown setting(s) {unknown}; known: " + ", ".join(
            known
        )

    def _not_a_table(self, base: Any, meta: Meta | None, source: str) -> str:
        name = shown(self.names[-1])
        where = _where(source, self.names[:-1])
        if self.entry or len(self.names) == 1:
            return f"{where}: {name} must be a table ([{name}]), not {self.value!r}"
        if _is_struct(typing.get_args(base)[1]):
            what = f"a table of tables ([{'.'.join(self.names)}.<name>])"
        else:
            what = _extra(meta).get("must", "a table")
        return f"{where} {name} must be {what}, not {self.value!r}"

    def _bad_value(self, base: Any, meta: Meta | None, source: str, *, above: bool) -> str:
        extra = _extra(meta)
        lo, hi = (meta.ge, meta.le) if meta is not None else (None, None)
        what = extra.get("above" if above and "above" in extra else "must") or _what(
            base, lo, hi, extra.get("unit", "")
        )
        what = what.format(lo=_num(lo), hi=_num(hi))
        if self.entry:  # a value of [heartbeat.topics]: named by its table
            form, where, key = _ENTRY, _where(source, self.names[:-2]), self.names[-2]
        else:
            form = extra.get("form") or (VALUE if base not in (bool, str) else NAMED)
            where, key = _where(source, self.names[:-1]), self.names[-1]
        return str(form).format(where=where, key=shown(key), value=self.value, what=what)


def _walk(doc: object, schema: Any, path: str, names: list[str]) -> _Node:
    """Follow ``path`` (msgspec's ``.field`` and ``[...]`` steps) through ``doc`` and the
    types of ``schema``; a dict step takes the entry that does not convert."""
    value, tp, entry = doc, schema, False
    for match in _STEP.finditer(path):
        base, _ = unwrap(tp)
        if match[1] is not None:
            tp = typing.get_type_hints(base, include_extras=True)[match[1]]
            value, entry = value[match[1]], False  # type: ignore[index]
            names.append(match[1])
            continue
        if typing.get_origin(base) is list:  # an array's item: named key[i]
            index = int(match[2])
            tp, value, entry = typing.get_args(base)[0], value[index], False  # type: ignore[index]
            names[-1] = f"{names[-1]}[{index}]"
            continue
        item_tp = typing.get_args(base)[1]
        assert isinstance(value, Mapping)
        name, value = next((k, v) for k, v in value.items() if not _converts(v, item_tp))
        tp, entry = item_tp, True
        names.append(str(name))
    return _Node(value, tp, names, entry)


def _converts(value: object, tp: Any) -> bool:
    try:
        msgspec.convert(value, tp)
    except msgspec.ValidationError:
        return False
    return True


def unwrap(tp: Any) -> tuple[Any, Meta | None]:
    """``tp`` without ``| UnsetType`` and ``Annotated``, and its :class:`Meta`."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not msgspec.UnsetType)
    meta = None
    if typing.get_origin(tp) is typing.Annotated:
        tp, *metadata = typing.get_args(tp)
        meta = next((m for m in metadata if isinstance(m, Meta)), None)
    return tp, meta


def _is_struct(tp: Any) -> bool:
    base, _ = unwrap(tp)
    return isinstance(base, type) and issubclass(base, msgspec.Struct)


def _extra(meta: Meta | None) -> dict[str, Any]:
    return dict(meta.extra or {}) if meta is not None else {}


def _what(base: Any, lo: float | None, hi: float | None, unit: str) -> str:
    """What a value of type ``base`` in [``lo``, ``hi``] is, in words."""
    if base is bool:
        return "true or false"
    if base is str:
        return "a string"
    if isinstance(base, type) and issubclass(base, enum.Enum):
        return "one of " + ", ".join(str(m.value) for m in base)
    span = "from {lo} to {hi}" if hi is not None else ">= {lo}"
    if base is int:
        return f"an integer {span}"
    return span + (" milliseconds" if unit == "ms" else "")


def _num(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
