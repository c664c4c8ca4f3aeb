"""How subscriptions are set up: their delivery settings, where they start, their names.

Owns :class:`DispatchConfig` (every subscription's :class:`~dispatcher.protocol.DispatchPolicy`
by default and per ``"topic/subscription"``, and the dead-letter queues' settings),
:class:`InitialPosition` (where a new subscription starts) and
:func:`check_subscription_name` (a name refused with the rule it breaks). The registry
(:mod:`dispatcher.registry`) applies them; ``broker.config`` builds a
:class:`DispatchConfig` from the config file.

Example: ``DispatchConfig(subscriptions={"orders/billing": DispatchPolicy(max_deliveries=3)})``
gives subscription ``billing`` of ``orders`` at most 3 deliveries and every other
subscription the defaults; ``policy_for`` then sets the type and mode the subscription
was created with, which no override changes.

Pure: imports neither ``asyncio``, ``os`` nor ``time``; of ours only the pure
``dispatcher.protocol``, ``dispatcher.dead_letter_config``, ``dispatcher.errors`` and
``dispatcher.names``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from dispatcher.dead_letter_config import DlqConfig
from dispatcher.errors import InvalidSubscriptionError
from dispatcher.names import NAME_RULE, is_valid_name
from dispatcher.protocol import DeliveryMode, DispatchPolicy, SubscriptionType
from proto.shown import shown


class InitialPosition(enum.Enum):
    """Where a new subscription starts."""

    EARLIEST = "earliest"
    LATEST = "latest"


def check_subscription_name(name: str) -> None:
    """Raise ``InvalidSubscriptionError`` unless ``name`` is a valid subscription name."""
    if not is_valid_name(name):
        raise InvalidSubscriptionError(
            "subscription", f"{shown(name)} is not a valid subscription name: {NAME_RULE}"
        )


@dataclass(frozen=True, slots=True)
class DispatchConfig:
    """How subscriptions deliver, by default and per subscription.

    Attributes:
        defaults: The policy of every subscription without an override (its ``type`` and
            ``mode`` come from the subscription itself).
        subscriptions: Per ``"topic/subscription"``, a policy whose fields replace the
            defaults (again except ``type`` and ``mode``).
        dlq: The dead-letter queue settings of every subscription.
    """

    defaults: DispatchPolicy = field(default_factory=DispatchPolicy)
    subscriptions: Mapping[str, DispatchPolicy] = field(default_factory=dict)
    dlq: DlqConfig = field(default_factory=DlqConfig)

    def policy_for(
        self, topic: str, name: str, type_: SubscriptionType, mode: DeliveryMode
    ) -> DispatchPolicy:
        """The policy of subscription ``name`` of ``topic`` with that type and mode."""
        base = self.subscriptions.get(f"{topic}/{name}", self.defaults)
        return dataclasses.replace(base, type=type_, mode=mode)
