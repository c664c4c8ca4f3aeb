"""Click parameter types of the ``headrace`` client commands: a broker address and a name.

Role: catch a malformed value while the command line is parsed, so it is a usage error
(exit 2) that names the value and the form expected, not a DNS error or a broker's refusal
a round trip later.

- :data:`BROKER_ADDRESS` takes ``HOST:PORT``: ``HOST`` a host name, an IPv4 address or an
  IPv6 address in brackets; ``PORT`` from 1 to 65535. ``127.0.0.1:50051``,
  ``broker-1.example.com:443`` and ``[::1]:50051`` pass; ``garbage``, ``:50051`` (an empty
  host is refused rather than guessed), ``host:99999`` and ``::1:50051`` do not.
- :data:`TOPIC_NAME` and :data:`SUBSCRIPTION_NAME` apply the broker's own name rule,
  imported from :mod:`proto.names` (one copy of it for broker and CLI).

Imports nothing of ours but :mod:`proto.names`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import click

from proto.names import NAME_RULE, is_valid_name

#: A host name or IPv4 address: labels of letters, digits, ``-`` and ``_``, dot-separated.
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_-]+)*\.?")
#: The inside of an IPv6 literal's brackets (hex groups, an IPv4 tail, a ``%zone``).
_IPV6 = re.compile(r"[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(%[A-Za-z0-9_.-]+)?")
if TYPE_CHECKING:  # generic in click 8.2 and later; plain at run time, for click 8.1
    _StrType = click.ParamType[str, Any]
else:
    _StrType = click.ParamType

_EXAMPLE = "e.g. 127.0.0.1:50051, broker.example.com:50051 or [::1]:50051"


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


class BrokerAddress(_StrType):
    """``HOST:PORT`` of a broker, checked as :func:`address_problem` says."""

    name = "HOST:PORT"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        text = str(value)
        problem = address_problem(text)
        if problem is not None:
            self.fail(f"{text!r} is not HOST:PORT: it {problem} ({_EXAMPLE})", param, ctx)
        return text


class Name(_StrType):
    """A topic or subscription name under the broker's rule (:mod:`proto.names`)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = kind.upper()

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        text = str(value)
        if not is_valid_name(text):
            self.fail(f"{text!r} is not a valid {self.kind} name: {NAME_RULE}", param, ctx)
        return text


BROKER_ADDRESS = BrokerAddress()
TOPIC_NAME = Name("topic")
SUBSCRIPTION_NAME = Name("subscription")
