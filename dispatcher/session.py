"""One consumer attached to a subscription, and the deliveries waiting for it.

Owns :class:`ConsumerSession` (a consumer's identity, its outbox, whether it drains, the
credit it was granted in commands not yet applied) and :data:`DRAINED`, the marker a
draining consumer's outbox ends with. :class:`~dispatcher.subscription.Subscription` makes
sessions (``attach``) and is the only one that puts into an outbox, from its dispatch task;
the broker's Subscribe stream takes from it.

Invariants:
- An outbox holds at most the credit granted: the dispatch task never puts more.
- Nothing follows :data:`DRAINED` in an outbox, and ``None`` is the last thing it ever
  holds (the subscription let the consumer go).

Imports ``asyncio`` (the outbox is an ``asyncio.Queue``; use it from one event loop) and
the pure ``dispatcher.protocol`` only.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Final

from dispatcher.protocol import Delivery

_consumer_ids = itertools.count(1)


#: Put in a draining consumer's outbox after its last delivery (:meth:`Subscription.drain`):
#: a marker, compared by identity, that carries no records and names no partition.
DRAINED: Final = Delivery(-1, b"", 0, 0, {})


class ConsumerSession:
    """One attached consumer and the deliveries waiting for it."""

    __slots__ = ("consumer_id", "draining", "ended_by", "name", "outbox", "pending_credit")

    def __init__(self, name: str) -> None:
        self.consumer_id = f"c{next(_consumer_ids)}"
        self.name = name or self.consumer_id
        #: Why the subscription let this consumer go, when not for shutdown (e.g. the
        #: subscription was deleted): what its stream should end with.
        self.ended_by: Exception | None = None
        #: Bounded by the credit: the dispatch task never puts more than was granted.
        self.outbox: asyncio.Queue[Delivery | None] = asyncio.Queue()
        #: Set by :meth:`Subscription.drain`: nothing more goes into the outbox.
        self.draining = False
        #: Credit granted (at attach, or by grants) in commands not yet applied: counted
        #: against ``max_credit_per_consumer`` at once.
        self.pending_credit = 0

    async def next(self) -> Delivery | None:
        """The next delivery, :data:`DRAINED` after the last one a draining consumer gets,
        or ``None`` once the subscription has let this consumer go."""
        return await self.outbox.get()
