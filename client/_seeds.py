"""Seed brokers: the ``broker`` every client takes, as one address or a list of them.

Role: every client class (and the CLI's ``--broker``, env ``HEADRACE_BROKER``, and the
Spark option ``broker``) takes either one ``HOST:PORT`` or a comma-separated list of seed
brokers, ``"h1:p1,h2:p2"`` (in Python also a sequence of strings). A client connects to
the first seed that answers and learns from there where each topic lives
(:mod:`client._async._routing`); a single address works exactly as before.

Rules (:func:`address_problem`): ``HOST`` is a host name, an IPv4 address or an IPv6
address in brackets; ``PORT`` is 1 to 65535. ``127.0.0.1:50051``,
``broker-1.example.com:443`` and ``[::1]:50051`` pass; ``garbage``, ``:50051`` (an empty
host is refused rather than guessed), ``host:99999`` and ``::1:50051`` do not. A list
names its bad entry: ``parse_brokers("a:1,b")`` raises ``ValueError("broker entry 2 of
2, 'b', is not HOST:PORT: it has no :PORT ...")``. Blank entries (a trailing comma) and
repeats are dropped; an empty list is refused.

Pure module: imports neither ``asyncio``, ``os`` nor ``time``, and nothing of ours.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: A host name or IPv4 address: labels of letters, digits, ``-`` and ``_``, dot-separated.
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_-]+)*\.?")
#: The inside of an IPv6 literal's brackets (hex groups, an IPv4 tail, a ``%zone``).
_IPV6 = re.compile(r"[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(%[A-Za-z0-9_.-]+)?")

#: Examples of good addresses, for error messages.
EXAMPLE = "e.g. 127.0.0.1:50051, broker.example.com:50051 or [::1]:50051"


def address_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a broker's ``HOST:PORT``, or None when it is fine."""
    if "://" in value:
        return "has a scheme; give HOST:PORT alone"
    host, sep, port = value.rpartition(":")
    if not sep:
        return "has no :PORT"
    if not host:
        return "has no HOST before the :PORT"
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        return f"has port {port!r}; a port is a number from 1 to 65535"
    if host.startswith("[") and host.endswith("]"):
        return None if _IPV6.fullmatch(host[1:-1]) else f"has {host}, which is not an IPv6 address"
    if ":" in host:
        return "looks like an IPv6 address: put it in brackets, as in [::1]:50051"
    if not _HOST.fullmatch(host):
        return f"has host {host!r}, which is not a host name or IP address"
    return None


def parse_brokers(broker: str | Sequence[str]) -> tuple[str, ...]:
    """The seed brokers of ``broker``: one ``HOST:PORT``, a comma-separated list of them,
    or a sequence of strings (each of which may itself be a comma-separated list), in the
    order given, without blanks and repeats.

    Raises:
        ValueError: An entry is not ``HOST:PORT`` (the message names it and its place),
            or there is no entry at all.
    """
    parts = [broker] if isinstance(broker, str) else list(broker)
    entries = [e.strip() for part in parts for e in str(part).split(",")]
    entries = [e for e in entries if e]
    if not entries:
        raise ValueError(f"broker names no HOST:PORT ({EXAMPLE})")
    for place, entry in enumerate(entries, 1):
        problem = address_problem(entry)
        if problem is not None:
            what = (
                f"broker entry {place} of {len(entries)}, {entry!r},"
                if len(entries) > 1
                else f"broker {entry!r}"
            )
            raise ValueError(f"{what} is not HOST:PORT: it {problem} ({EXAMPLE})")
    return tuple(dict.fromkeys(entries))


def joined(broker: str | Sequence[str]) -> str:
    """``broker`` as one comma-separated string (hashable, as connection settings are);
    a single address comes back as it is. Nothing is checked here (see
    :func:`parse_brokers`)."""
    if isinstance(broker, str):
        return broker
    return ",".join(str(b).strip() for b in broker)
