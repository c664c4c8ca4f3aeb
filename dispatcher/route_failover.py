"""Failover routing: every record to the consumer that attached first. Pure.

The others stand by. When the active consumer leaves, its leases come back to wait at
once, and the consumer that attached next takes over: it gets them first, in order, and
then what was never sent. See :mod:`dispatcher.routing` for the interface.
"""

from __future__ import annotations

from collections.abc import Mapping

from dispatcher.partition_book import BatchContext, Consumer, PartitionBook
from dispatcher.routing import Outlet, Router


class FailoverRouter(Router):
    """The active consumer (the first attached) gets everything, while it has credit."""

    def __init__(self) -> None:
        self._active: Consumer | None = None

    def consumers_changed(self, consumers: Mapping[str, Consumer]) -> list[Consumer]:
        if not consumers:
            self._active = None
            return []
        self._active = min(consumers.values(), key=lambda c: c.order)
        return [self._active]

    def assign(
        self, part: PartitionBook, ctx: BatchContext, lo: int, hi: int, outlet: Outlet
    ) -> None:
        active = self._active
        if active is None or active.credit <= 0:
            part.waiting.add(lo, hi, ctx.now)
            return
        outlet.give(part, ctx, lo, hi, active)
