"""Fetcher: the blocking twin of :class:`~client._async.fetcher.AsyncFetcher`.

Role: offset-addressed reads and position commits for code without an event loop (the
Spark connector's driver and executors). Each method runs the :class:`AsyncFetcher`
method of the same name on the client's own loop thread (:mod:`client._sync._bridge`);
results and errors are the async ones unchanged. The loop thread starts lazily in the
process that first calls, so a fetcher made after a ``fork()`` (Spark's Python workers)
works.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

from client._async.fetcher import DEFAULT_FETCH_BYTES, AsyncFetcher, FetchResult
from client._sync._bridge import LoopThread
from client._types import DEFAULT_BROKER


class Fetcher:
    """Offset-addressed reads and position commits, blocking. Thread-safe; a context
    manager.

    Args:
        broker: ``host:port`` of the broker. Default ``127.0.0.1:50051``.
        timeout_s: How long one call may take, retries included, seconds. Default 30.
    """

    def __init__(self, broker: str = DEFAULT_BROKER, *, timeout_s: float = 30.0) -> None:
        self._bridge = LoopThread("Fetcher", "AsyncFetcher")
        self._fetcher = self._bridge.create(AsyncFetcher, broker, timeout_s=timeout_s)

    def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        end_offset: int | None = None,
        max_bytes: int = DEFAULT_FETCH_BYTES,
        max_wait_ms: int = 0,
    ) -> FetchResult:
        """Durable batches of one partition from ``offset`` on: see
        :meth:`AsyncFetcher.fetch`."""
        return self._bridge.run(
            self._fetcher.fetch(
                topic,
                partition,
                offset,
                end_offset=end_offset,
                max_bytes=max_bytes,
                max_wait_ms=max_wait_ms,
            )
        )

    def ack_up_to(self, topic: str, subscription: str, partition: int, offset: int) -> int:
        """Acknowledge everything below ``offset``: see :meth:`AsyncFetcher.ack_up_to`."""
        return self._bridge.run(self._fetcher.ack_up_to(topic, subscription, partition, offset))

    def close(self) -> None:
        """Close the channel and join the loop thread. Idempotent; later calls raise
        ``ClientClosed``."""
        self._bridge.close(self._fetcher.aclose())

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
