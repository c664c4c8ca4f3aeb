"""The consumers attached to one subscription, and which of them may receive. Pure.

:class:`ConsumerSet` keeps each attached :class:`~dispatcher.partition_book.Consumer` by
id, in the order they attached, with its credit; a consumer that drained (it closes
cleanly) keeps what it holds but gets no credit any more. Which consumers may receive
records at all is the subscription type's rule (:mod:`dispatcher.routing`): the router
hears of every change and says, and the set keeps its answer for the many checks a pass
makes (:meth:`ConsumerSet.any_credit`). What a consumer holds when it leaves is the
state's to take back.

Example: failover; A attaches with credit 10, then B with 10: A may receive, B stands
by. A drains: its credit is 0 and a grant to A adds nothing; ``any_credit()`` is False
until A leaves, when B may receive and ``any_credit()`` is True again.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatcher.partition_book import Consumer, PartitionBook
from dispatcher.routing import Router


class ConsumerSet:
    """Attached consumers, their credit, and those that may receive. Not task-safe: the
    state that owns it calls it, from its owner only.

    Args:
        router: The subscription type's router, told of every change.
    """

    __slots__ = ("_draining", "_order", "_router", "by_id", "eligible")

    def __init__(self, router: Router) -> None:
        self._router = router
        #: The attached consumers by id, in the order they attached.
        self.by_id: dict[str, Consumer] = {}
        #: Those that may receive records at all (failover: only the active one). Kept
        #: up to date by attach and detach: several reads a pass, do not change it.
        self.eligible: list[Consumer] = []
        self._draining: set[str] = set()  # consumers that drained: credit is ignored
        self._order = 0

    def check_attach(self) -> None:
        """Raise ``SubscriptionBusyError`` if the type takes no other consumer."""
        self._router.check_attach(self.by_id)

    def attach(
        self, consumer_id: str, name: str, credit: int, parts: Sequence[PartitionBook]
    ) -> None:
        """Attach a consumer (the router sets it up, seeing ``parts``)."""
        self._router.check_attach(self.by_id)
        self._order += 1
        consumer = Consumer(consumer_id, name, self._order, credit)
        self._router.joining(consumer, self.by_id, parts)
        self.by_id[consumer_id] = consumer
        self.eligible = self._router.consumers_changed(self.by_id)

    def detach(self, consumer_id: str) -> Consumer | None:
        """Detach a consumer; return it (with what it holds), or ``None`` if unknown."""
        consumer = self.by_id.pop(consumer_id, None)
        self._draining.discard(consumer_id)
        if consumer is not None:
            self.eligible = self._router.consumers_changed(self.by_id)
        return consumer

    def grant(self, consumer_id: str, credit: int) -> None:
        """Add credit, unless the consumer is unknown or drained."""
        consumer = self.by_id.get(consumer_id)
        if consumer is not None and consumer_id not in self._draining:
            consumer.credit += credit

    def drain(self, consumer_id: str) -> None:
        """The consumer gets nothing more: its credit goes to 0, and grants are ignored."""
        consumer = self.by_id.get(consumer_id)
        if consumer is not None:
            consumer.credit = min(consumer.credit, 0)
            self._draining.add(consumer_id)

    def any_credit(self) -> bool:
        """Whether some eligible consumer has credit (a loop: several calls a pass)."""
        for c in self.eligible:  # noqa: SIM110 - any() over a generator costs more
            if c.credit > 0:
                return True
        return False

    def names(self) -> list[str]:
        """The attached consumers' names, in the order they attached."""
        return [c.name for c in sorted(self.by_id.values(), key=lambda c: c.order)]
