"""Every key of the broker's TOML file as a row: its table, kind, unit, allowed range and
meaning, read from the msgspec Structs of :mod:`broker.config_schema`.

Role: a flat view of the schema for :mod:`broker.config_reference` (which renders it as the
configuration reference page) and the tests. Nothing here is a fact of its own: the
kind comes from each field's type, the range from its :class:`msgspec.Meta` (``ge`` /
``le``), the meaning from its ``description`` and the rest from its ``extra``; the parser
enforces the same Structs, so the page cannot show a range the parser does not draw.
Defaults are not copied here: the reference reads them from a default
:class:`~broker.config.BrokerConfig` through each key's ``attr``.

Worked example: ``[dispatch] ack_timeout_ms``, declared ``Annotated[int, meta(..., ge=0,
le=86_400_000, unit="ms", zero="never", attr="dispatch.defaults.ack_timeout_s",
scale=1000)]``, is the row ``Key("dispatch", "ack_timeout_ms", Kind.INTEGER, "ms", ...,
low=0, high=86_400_000, zero="never", attr="dispatch.defaults.ack_timeout_s",
scale=1000)``: the file holds milliseconds, the config holds seconds (``30.0``), so its
default renders as ``30000``.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import enum
import typing
from dataclasses import dataclass
from typing import Any

import msgspec

from broker import config_schema as schema
from broker.config_errors import unwrap


class Kind(enum.Enum):
    """The TOML type of a key's value."""

    INTEGER = "integer"
    NUMBER = "number"  # integer or float
    BOOLEAN = "boolean"
    STRING = "string"
    ADDRESS = "string host:port"
    ADDRESSES = "array of strings host:port"
    CHOICE = "string, one of"
    TABLE = "table"


@dataclass(frozen=True, slots=True)
class Key:
    """One key of the config file.

    Attributes:
        table: The TOML table that holds it (``broker``, ``wal``, ``dispatch``, ...).
        name: The key.
        kind: Its TOML type.
        unit: What a number counts (``bytes``, ``ms``, ``records``); ``""`` for none.
        meaning: One sentence or two: what it does.
        low: Smallest value allowed (inclusive), or ``None``.
        high: Largest value allowed (inclusive), or ``None`` for no upper bound.
        choices: The enum whose values a ``CHOICE`` key takes.
        zero: What 0 means when 0 is special (``"no quota"``), else ``""``.
        unset: What leaving the key out means when there is no default value (``"never"``).
        attr: Where a :class:`~broker.config.BrokerConfig` holds its value, dotted
            (``"wal.segment_bytes"``); ``""`` when the key is a table of overrides.
        scale: The file's value is the held value times this (1000: ms in the file,
            seconds held).
    """

    table: str
    name: str
    kind: Kind
    unit: str
    meaning: str
    low: float | None = None
    high: float | None = None
    choices: type[enum.Enum] | None = None
    zero: str = ""
    unset: str = ""
    attr: str = ""
    scale: float = 1


#: The tables in the order of the reference page, each with its Struct.
TABLES: dict[str, type[msgspec.Struct]] = {
    "broker": schema.BrokerTable,
    "wal": schema.WalTable,
    "heartbeat": schema.HeartbeatTable,
    "backlog": schema.BacklogTable,
    "dispatch": schema.DispatchTable,
    "dlq": schema.DlqTable,
    "limits": schema.LimitsTable,
    "security": schema.SecurityTable,
    "subscriptions": schema.SubscriptionsTable,
    "cluster": schema.ClusterTable,
}


def rows(table: str, struct: type[msgspec.Struct]) -> tuple[Key, ...]:
    """The keys of ``[table]``, one per field of ``struct``, in declaration order."""
    hints = typing.get_type_hints(struct, include_extras=True)
    return tuple(_row(table, name, hints[name]) for name in struct.__struct_fields__)


def _row(table: str, name: str, hint: Any) -> Key:
    base, meta = unwrap(hint)
    extra = dict(meta.extra or {}) if meta is not None else {}
    kind = _kind(base, extra)
    attr = "" if kind is Kind.TABLE else name if table == "broker" else f"{table}.{name}"
    return Key(
        table,
        name,
        kind,
        extra.get("unit", ""),
        (meta.description or "") if meta is not None else "",
        low=meta.ge if meta is not None else None,
        high=meta.le if meta is not None else None,
        choices=base if kind is Kind.CHOICE else None,
        zero=extra.get("zero", ""),
        unset=extra.get("unset", ""),
        attr=extra.get("attr", attr),
        scale=extra.get("scale", 1),
    )


def _kind(base: Any, extra: dict[str, Any]) -> Kind:
    if typing.get_origin(base) is dict:
        return Kind.TABLE
    if typing.get_origin(base) is list and extra.get("kind") == "address":
        return Kind.ADDRESSES
    if isinstance(base, type) and issubclass(base, enum.Enum):
        return Kind.CHOICE
    if base is str:
        return Kind.ADDRESS if extra.get("kind") == "address" else Kind.STRING
    kinds = {bool: Kind.BOOLEAN, int: Kind.INTEGER, float: Kind.NUMBER}
    return kinds[base]


#: Every key, table by table, in the order of the reference page.
KEYS: tuple[Key, ...] = tuple(k for table, struct in TABLES.items() for k in rows(table, struct))


def key(table: str, name: str) -> Key:
    """The key ``name`` of ``[table]``.

    Raises:
        KeyError: no such key.
    """
    for k in KEYS:
        if (k.table, k.name) == (table, name):
            return k
    raise KeyError(f"[{table}] {name}")
