"""Helpers of the subscription tests: one-record appends, and taking deliveries off a
consumer session until a number of records arrived."""

from __future__ import annotations

import asyncio

from dispatcher import ConsumerSession, Delivery
from wal import LogWriter, encode_columns


async def singles(writer: LogWriter, count: int) -> None:
    """``count`` one-record batches; record ``i`` holds ``i`` as two big-endian bytes."""
    for i in range(count):
        await writer.append(encode_columns([i.to_bytes(2, "big")]))


async def take(session: ConsumerSession, records: int) -> list[Delivery]:
    """Deliveries until ``records`` records arrived (5 s at most)."""
    out: list[Delivery] = []
    async with asyncio.timeout(5):
        while sum(d.record_count for d in out) < records:
            delivery = await session.next()
            assert delivery is not None
            out.append(delivery)
    return out
