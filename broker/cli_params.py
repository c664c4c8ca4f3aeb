"""Click parameter types of the ``headrace`` client commands: broker addresses and a name.

Role: catch a malformed value while the command line is parsed, so it is a usage error
(exit 2) that names the value and the form expected, not a DNS error or a broker's refusal
a round trip later.

- :data:`BROKER_ADDRESS` takes ``HOST:PORT``, or seed brokers separated by commas
  (``h1:p1,h2:p2``: the command finds each topic's owner from them): ``HOST`` a host
  name, an IPv4 address or an IPv6 address in brackets; ``PORT`` from 1 to 65535.
  ``127.0.0.1:50051``, ``broker-1.example.com:443`` and ``[::1]:50051`` pass; ``garbage``,
  ``:50051`` (an empty host is refused rather than guessed), ``host:99999`` and
  ``::1:50051`` do not; a bad entry of a list is named with its place. The rule is the
  client library's (:func:`client.parse_brokers`), one copy for both.
- :data:`TOPIC_NAME` and :data:`SUBSCRIPTION_NAME` apply the broker's own name rule,
  imported from :mod:`proto.names` (one copy of it for broker and CLI).

Imports nothing of ours but :mod:`proto.names` and the client's seed rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from client._seeds import address_problem, parse_brokers
from proto.names import NAME_RULE, is_valid_name

if TYPE_CHECKING:  # generic in click 8.2 and later; plain at run time, for click 8.1
    _StrType = click.ParamType[str, Any]
else:
    _StrType = click.ParamType


class BrokerAddress(_StrType):
    """``HOST:PORT`` of a broker, or seeds ``HOST:PORT,HOST:PORT``, each checked as
    :func:`address_problem` says; converted to the seeds joined by commas."""

    name = "HOST:PORT[,HOST:PORT...]"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> str:
        try:
            return ",".join(parse_brokers(str(value)))
        except ValueError as exc:
            self.fail(str(exc).removeprefix("broker "), param, ctx)


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


__all__ = ["BROKER_ADDRESS", "SUBSCRIPTION_NAME", "TOPIC_NAME", "address_problem"]
