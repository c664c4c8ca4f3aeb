"""Click parameter types of the ``headrace`` client commands: topic and subscription names.

Role: catch a malformed value while the command line is parsed, so it is a usage error
(exit 2) that names the value and the form expected, not a DNS error or a broker's refusal
a round trip later.

- :data:`TOPIC_NAME` and :data:`SUBSCRIPTION_NAME` apply the broker's own name rule,
  imported from :mod:`proto.names` (one copy of it for broker and CLI).

The ``--broker`` type (``HOST:PORT`` or seed brokers) is :data:`broker.cli_client.BROKER_ADDRESS`:
it applies the client library's rule (:func:`client.parse_brokers`), and of the CLI's
modules only those named in the import contract may import ``client``.

Imports nothing of ours but :mod:`proto.names`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from proto.names import NAME_RULE, is_valid_name

if TYPE_CHECKING:  # generic in click 8.2 and later; plain at run time, for click 8.1
    _StrType = click.ParamType[str, Any]
else:
    _StrType = click.ParamType


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


TOPIC_NAME = Name("topic")
SUBSCRIPTION_NAME = Name("subscription")
