"""Child process of ``test_fetcher``'s kill test: a follower fetching until it is killed.

Usage: ``python -m tests.broker.replica._follower_child DIR PORT`` (from the repository
root). It opens the topic ``orders`` (2 partitions) under ``DIR``, follows the fake
leader on 127.0.0.1:PORT at epoch 1 with 2 KiB fetches (so it appends many times),
prints ``ready`` and runs until it is killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import grpc

from broker.replica.fetcher import FollowerTopic
from tests.broker.replica.fake_leader import open_topic, record


async def main(directory: str, port: int) -> None:
    topic = await open_topic(Path(directory))
    follower = FollowerTopic(
        topic,
        record(1),
        "b2",
        f"127.0.0.1:{port}",
        channel=grpc.aio.insecure_channel,
        credential=None,
        max_bytes=2048,
        max_wait_ms=100,
    )
    await follower.start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
