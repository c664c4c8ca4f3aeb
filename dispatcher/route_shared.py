"""Shared routing: each slice to the next consumer with credit, round robin. Pure.

A slice (the unacknowledged run of one batch, as the sender hands it over) goes whole to
one consumer; the next slice starts the search at the consumer after it. Records of one
key may go to different consumers, and out of order across them. See
:mod:`dispatcher.routing` for the interface.
"""

from __future__ import annotations

from collections.abc import Mapping

from dispatcher.partition_book import BatchContext, Consumer, PartitionBook
from dispatcher.routing import Outlet, Router


class SharedRouter(Router):
    """Every consumer may receive; slices go round robin among those with credit."""

    def __init__(self) -> None:
        self._members: list[Consumer] = []
        self._next = 0  # the next consumer to try

    def consumers_changed(self, consumers: Mapping[str, Consumer]) -> list[Consumer]:
        self._members = list(consumers.values())
        return self._members

    def assign(
        self, part: PartitionBook, ctx: BatchContext, lo: int, hi: int, outlet: Outlet
    ) -> None:
        members = self._members
        n = len(members)
        for i in range(n):
            candidate = members[(self._next + i) % n]
            if candidate.credit > 0:
                self._next = (self._next + i + 1) % n
                outlet.give(part, ctx, lo, hi, candidate)
                return
        part.waiting.add(lo, hi, ctx.now)
