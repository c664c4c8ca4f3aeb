"""Exclusive routing: one consumer at a time gets everything. Pure.

A second consumer is refused (``SubscriptionBusyError``, naming the one attached) until
the first leaves. With one consumer at most, sending is failover's rule (the active
consumer is the only one), so :class:`ExclusiveRouter` is
:class:`~dispatcher.route_failover.FailoverRouter` plus that refusal. See
:mod:`dispatcher.routing` for the interface.
"""

from __future__ import annotations

from collections.abc import Mapping

from dispatcher.errors import SubscriptionBusyError
from dispatcher.partition_book import Consumer
from dispatcher.route_failover import FailoverRouter


class ExclusiveRouter(FailoverRouter):
    """Failover's routing, with one consumer at most.

    Args:
        names: Topic and subscription, for the refusal's message.
    """

    def __init__(self, names: tuple[str, str]) -> None:
        super().__init__()
        self._names = names

    def check_attach(self, consumers: Mapping[str, Consumer]) -> None:
        if consumers:
            holder = next(iter(consumers.values())).name
            raise SubscriptionBusyError(*self._names, holder)
