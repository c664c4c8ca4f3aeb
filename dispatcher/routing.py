"""Routing: which consumer gets which records. Pure: no I/O, no clock.

:class:`~dispatcher.state.SubscriptionState` decides *what* may go out now (unacknowledged,
not leased, ready, within ``max_unacked``, not poison); its :class:`Router`, chosen once
from the subscription's type when the state is built, decides *to whom*. One module a
type, each behind this one interface:

    exclusive    dispatcher.route_exclusive    the one consumer; a second is refused
    failover     dispatcher.route_failover     the consumer that attached first; the others
                                               stand by
    shared       dispatcher.route_shared       each slice to the next consumer with credit
    key_shared   dispatcher.route_key_shared   each key to one consumer, by slot

A router reads consumers and one partition's book, and hands each run to the
:class:`Outlet` it is given (the :class:`~dispatcher.sending.Sender`): ``give`` sends it
to a consumer (the sender leases it, counts it and appends the ``Send``); ``set_aside``
makes it wait for the one consumer that may take it (key_shared: the owner of its keys
has no credit, or its fence holds it back). A run that no consumer can take now waits
(``part.waiting``, ready at once) for credit. The router also hears of every consumer
that joins or leaves (:class:`~dispatcher.consumer_set.ConsumerSet` tells it) and says
which consumers may receive at all. A failover takeover needs no rule of its own here: a
consumer that leaves gives its leases back to wait at once, and the next consumer gets
them first, in order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from dispatcher.partition_book import BatchContext, Consumer, PartitionBook


class Outlet(Protocol):
    """What a router hands records to (the sender)."""

    def give(
        self, part: PartitionBook, ctx: BatchContext, lo: int, hi: int, consumer: Consumer
    ) -> None:
        """Send ``[lo, hi)`` of ``ctx``'s batch to ``consumer`` (which has credit)."""

    def set_aside(self, part: PartitionBook, lo: int, hi: int, now: float) -> None:
        """Make ``[lo, hi)`` wait for the one consumer that may take it."""


class Router(Protocol):
    """How one subscription type shares records among consumers. Not task-safe: the
    state that owns it calls it, from its owner only. The routers subclass it for its
    two defaults (any number of consumers, nothing to set up for one that joins)."""

    def check_attach(self, consumers: Mapping[str, Consumer]) -> None:
        """Raise ``SubscriptionBusyError`` if the type takes no consumer beside
        ``consumers``; change nothing. By default any number may attach."""
        return

    def joining(
        self,
        consumer: Consumer,
        consumers: Mapping[str, Consumer],
        parts: Sequence[PartitionBook],
    ) -> None:
        """Set up ``consumer`` before it joins ``consumers``. By default nothing."""
        return

    def consumers_changed(self, consumers: Mapping[str, Consumer]) -> list[Consumer]:
        """Take the new set of consumers; return those that may receive records at all
        (the caller keeps the list and must not change it)."""
        ...

    def assign(
        self, part: PartitionBook, ctx: BatchContext, lo: int, hi: int, outlet: Outlet
    ) -> None:
        """Give ``[lo, hi)`` (``lo < hi``: unacknowledged, not leased, not poison) to
        consumers through ``outlet``; what none can take now waits."""
        ...
