"""AsyncFetcher: reads by offset and position commits, for readers that keep their own
position.

Role: the client side of the ``Fetch`` and ``AckUpTo`` RPCs. A reader such as the Spark
connector decides which offsets to read (its checkpoint is its position), pulls record
batches with :meth:`AsyncFetcher.fetch`, and tells the broker how far it has durably got
with :meth:`AsyncFetcher.ack_up_to`, so ``headrace lag`` and retention follow it.

Fetched batches are decoded (and their CRC checked) here, once, and returned whole: a
batch may start before the offset asked for, and the caller slices it. The columns of a
:class:`~proto.batch.RecordBatch` are offset arrays plus data buffers, so they can
be wrapped as Arrow arrays without touching each record.

Retryable errors (the broker restarting: UNAVAILABLE) are retried with backoff until
``timeout_s``; other errors are raised at once, as :mod:`client.errors` classes.

Routing (``broker`` a list of seeds, :mod:`client._async._routing`): each call goes to
its topic's owner, found lazily; a refusal (nothing done) is followed, to the owner it
names at once, or after a backoff and a Lookup, within ``timeout_s``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, Unpack

import grpc

from client._async._routing import Link, Router
from client._connection import ConnectionOptions, ConnectionSettings
from client._types import DEFAULT_BROKER
from client.errors import ClientError
from proto import broker_pb2 as _pb
from proto.batch import RecordBatch, decode_batch

#: Largest response a fetcher accepts, bytes: the broker caps one Fetch at 16 MiB of
#: batches, plus framing.
MAX_MESSAGE = 64 << 20
#: Default ``max_bytes`` of one fetch.
DEFAULT_FETCH_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class FetchResult:
    """One Fetch's answer.

    Attributes:
        batches: Whole record batches in offset order. The first may start before the
            offset asked for, and the last may run past an ``end_offset``: slice them.
            Empty when nothing at or after the offset is durable yet.
        high_water_mark: The partition's head when the broker answered: every offset below
            it is durable.
        first_offset: The first offset the partition still retains. Above the offset asked
            for means retention deleted the records in between.
    """

    batches: list[RecordBatch]
    high_water_mark: int
    first_offset: int


def fetch_request(
    topic: str,
    partition: int,
    offset: int,
    *,
    end_offset: int | None,
    max_bytes: int,
    max_wait_ms: int,
) -> _pb.FetchRequest:
    """The FetchRequest both fetchers send."""
    return _pb.FetchRequest(
        topic=topic,
        partition=partition,
        offset=offset,
        max_bytes=max_bytes,
        end_offset=end_offset or 0,
        max_wait_ms=max_wait_ms,
    )


def fetch_result(topic: str, partition: int, got: _pb.FetchResponse) -> FetchResult:
    """Decode (and CRC-check) a FetchResponse's batches.

    Raises:
        CorruptBatchError: A batch failed its CRC on the way.
        ClientError: A batch came truncated.
    """
    batches = []
    for data in got.batches:
        batch = decode_batch(data)
        if batch is None:  # the broker sends whole batches only
            raise ClientError(f"{topic}/{partition}: the broker sent a truncated batch")
        batches.append(batch)
    return FetchResult(batches, got.high_water_mark, got.first_offset)


def ack_request(
    topic: str, subscription: str, partition: int, offset: int, committer: str = ""
) -> _pb.AckUpToRequest:
    """The AckUpToRequest both fetchers send."""
    return _pb.AckUpToRequest(
        topic=topic,
        subscription=subscription,
        partition=partition,
        offset=offset,
        committer=committer,
    )


class AsyncFetcher:
    """Offset-addressed reads and position commits. Task-safe; an async context manager.

    Args:
        broker: ``host:port`` of the broker, or seed brokers: ``"h1:p1,h2:p2"`` or a
            sequence of addresses (each topic's calls go to its owner).
        timeout_s: How long one call may take, retries included, seconds. Default 30.
        channel: An existing channel to use for the first seed (not closed by this
            client).
        **connection: The connection keywords, the same for every client class
            (:class:`~client.ConnectionOptions`): ``reconnect_backoff_max_s``,
            ``token``, ``tls_ca``, ``tls_cert`` and ``tls_key``. Unused with ``channel``
            (that channel's own settings apply); a bad one raises ``ValueError`` here.
    """

    def __init__(
        self,
        broker: str | Sequence[str] = DEFAULT_BROKER,
        *,
        timeout_s: float = 30.0,
        channel: grpc.aio.Channel | None = None,
        **connection: Unpack[ConnectionOptions],
    ) -> None:
        #: Where the broker is and how to reach it (unused with ``channel``).
        self.connection = ConnectionSettings.of("AsyncFetcher", broker, connection)
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        #: Where each topic's calls go.
        self.router = Router(self.connection, channel)
        self._timeout = timeout_s

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        end_offset: int | None = None,
        max_bytes: int = DEFAULT_FETCH_BYTES,
        max_wait_ms: int = 0,
    ) -> FetchResult:
        """Durable batches of one partition from ``offset`` on.

        Args:
            topic: The topic.
            partition: The partition.
            offset: The first offset wanted.
            end_offset: Return no batch that starts at or after this offset.
            max_bytes: Soft size limit; at least one batch comes back when one is durable.
            max_wait_ms: Wait up to this long for data when none is durable yet.

        Raises:
            NotFound: The topic does not exist.
            InvalidArgument: A negative partition or offset, or ``max_wait_ms`` too long.
            CorruptBatchError: A batch failed its CRC on the way (never expected).
        """
        request = fetch_request(
            topic,
            partition,
            offset,
            end_offset=end_offset,
            max_bytes=max_bytes,
            max_wait_ms=max_wait_ms,
        )
        got: _pb.FetchResponse = await self._retrying(
            topic, lambda link: link.broker.Fetch, request, self._timeout + max_wait_ms / 1000
        )
        return fetch_result(topic, partition, got)

    async def ack_up_to(
        self, topic: str, subscription: str, partition: int, offset: int, *, committer: str = ""
    ) -> int:
        """Acknowledge everything below ``offset`` on one partition for ``subscription``
        (created at the earliest offsets if it does not exist); saved before the answer.

        ``committer`` names who commits (the Spark source sends ``"spark"``, at most 200
        printable characters): the broker saves it with the subscription, shows it in
        ``subscriptions describe``, and then refuses a consumer that attaches without
        ``force`` (its acks would move this reader's cursor). ``""`` records nothing.

        Returns:
            The subscription's cursor after the call: ``max(cursor, offset)``.
        """
        request = ack_request(topic, subscription, partition, offset, committer)
        got: _pb.AckUpToResponse = await self._retrying(
            topic, lambda link: link.broker.AckUpTo, request
        )
        return got.cursor

    async def _retrying(
        self,
        topic: str,
        method: Callable[[Link], Any],
        request: object,
        timeout_s: float | None = None,
    ) -> Any:
        return await self.router.call(
            topic,
            lambda link, timeout: method(link)(request, timeout=timeout),
            timeout_s=timeout_s or self._timeout,
            what=type(request).__name__,
        )

    async def close(self) -> None:
        """The same as :meth:`aclose`: the sync twin's name for it."""
        await self.aclose()

    async def aclose(self) -> None:
        """Close the channels this client opened."""
        await self.router.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
