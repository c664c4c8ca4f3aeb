"""List every topic and subscription of a cluster through one seed (docs/client/guide.md)."""

import asyncio
import os

from client import AsyncAdminClient

SEEDS = os.environ.get("HEADRACE_BROKER", "127.0.0.1:52380,127.0.0.1:52381,127.0.0.1:52382")


async def main() -> None:
    async with AsyncAdminClient(SEEDS) as admin:
        for t in await admin.list_topics():
            print(t.name, t.owner, t.offline or "online", [p.head for p in t.partitions])
        listing = await admin.subscription_listing()
        for s in listing.subscriptions:
            print(s.topic, s.subscription, s.owner, s.lag)
        for gone in listing.offline:  # their subscriptions are unknown, not absent
            print(gone.topic, gone.owner, gone.reason, gone.message)


asyncio.run(main())
