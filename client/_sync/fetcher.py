"""Fetcher: the blocking twin of :class:`~client._async.fetcher.AsyncFetcher`.

Role: offset-addressed reads and position commits for code without an event loop (the
Spark connector's driver and its tasks). Same methods, requests, results and errors as
:class:`AsyncFetcher`, and the same request and decoding functions.

Unlike the other blocking twins, it is built on grpc's own blocking API rather than the
loop-thread bridge (:mod:`client._sync._bridge`). A fetcher holds no state that a loop
must own (no buffers, no sessions, no background tasks), and Spark tasks call it in a
tight loop: measured on the Spark read benchmark, the bridge's hand-off between the
calling thread and the loop thread took about a third of the Python worker's time.
grpc's blocking calls release the GIL while they wait, and ``Fetch.future`` gives
read-ahead without a thread of our own. A fetcher made after a ``fork()`` (Spark's
Python workers) opens its own channel.

That is this twin's one difference, kept for the Spark executors; it is written by hand
(``fetch_ahead`` is its own addition). Its constructor takes the connection keywords of
every client (:class:`~client._connection.ConnectionOptions`), and
``tests/client/test_sync.py`` holds its methods' parameters to :class:`AsyncFetcher`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar, Unpack

import grpc

from client._async.fetcher import (
    DEFAULT_FETCH_BYTES,
    FetchResult,
    ack_request,
    fetch_request,
    fetch_result,
)
from client._connection import ConnectionOptions, ConnectionSettings
from client._sync._bridge import Blocking
from client._sync._routing import BlockingLink, BlockingRouter
from client._types import DEFAULT_BROKER
from client.errors import ClientClosed, from_rpc_error
from proto import broker_pb2 as _pb

T = TypeVar("T")


class FetchAhead:
    """A fetch started by :meth:`Fetcher.fetch_ahead`; :meth:`result` waits for it."""

    def __init__(
        self,
        fetcher: Fetcher,
        future: Any,
        address: str,
        args: tuple[str, int, int, int | None, int],
    ) -> None:
        self._fetcher = fetcher
        self._future = future
        self._address = address
        self._args = args

    def result(self) -> FetchResult:
        """The answer. A retryable failure (the broker restarting) is retried as
        :meth:`Fetcher.fetch` retries it, from a fresh call; so is a refusal (the broker
        does not serve the topic), at the owner."""
        topic, partition, offset, end_offset, max_bytes = self._args
        try:
            got: _pb.FetchResponse = self._future.result()
        except grpc.RpcError as exc:
            error = from_rpc_error(exc)
            if not error.retryable:
                raise error from exc
            self._fetcher.router.table.after(topic, self._address, error, retry=True)
            return self._fetcher.fetch(
                topic, partition, offset, end_offset=end_offset, max_bytes=max_bytes
            )
        return fetch_result(topic, partition, got)

    def cancel(self) -> None:
        """Stop the call if it has not finished."""
        self._future.cancel()


class Fetcher(Blocking):
    """Offset-addressed reads and position commits, blocking. Thread-safe; a context
    manager.

    Args:
        broker: ``host:port`` of the broker, or seed brokers: ``"h1:p1,h2:p2"`` or a
            sequence of addresses (each topic's calls go to its owner, followed from a
            refusal or a Lookup as :class:`~client.AsyncFetcher` does). Default
            ``127.0.0.1:50051``.
        timeout_s: How long one call may take, retries included, seconds. Default 30.
        **connection: The connection keywords, the same for every client class
            (:class:`~client.ConnectionOptions`): ``reconnect_backoff_max_s``,
            ``token``, ``tls_ca``, ``tls_cert`` and ``tls_key``; a bad one raises
            ``ValueError`` here.
    """

    def __init__(
        self,
        broker: str | Sequence[str] = DEFAULT_BROKER,
        *,
        timeout_s: float = 30.0,
        **connection: Unpack[ConnectionOptions],
    ) -> None:
        #: Where the broker is and how to reach it.
        self.connection = ConnectionSettings.of("Fetcher", broker, connection)
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        #: Where each topic's calls go (a blocking channel per broker address).
        self.router = BlockingRouter(self.connection)
        self._timeout = timeout_s
        self._closed = False

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
        request = fetch_request(
            topic,
            partition,
            offset,
            end_offset=end_offset,
            max_bytes=max_bytes,
            max_wait_ms=max_wait_ms,
        )
        got: _pb.FetchResponse = self._retrying(
            topic, lambda link: link.broker.Fetch, request, self._timeout + max_wait_ms / 1000
        )
        return fetch_result(topic, partition, got)

    def fetch_ahead(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        end_offset: int | None = None,
        max_bytes: int = DEFAULT_FETCH_BYTES,
    ) -> FetchAhead:
        """Start :meth:`fetch` and return at once; ``.result()`` waits for its answer. A
        reader overlaps the next fetch with handing on the current batches this way."""
        self._check_open()
        request = fetch_request(
            topic, partition, offset, end_offset=end_offset, max_bytes=max_bytes, max_wait_ms=0
        )
        link = self.router.link_for(topic)
        future = link.broker.Fetch.future(request, timeout=self._timeout)
        args = (topic, partition, offset, end_offset, max_bytes)
        return FetchAhead(self, future, link.address, args)

    def ack_up_to(
        self, topic: str, subscription: str, partition: int, offset: int, *, committer: str = ""
    ) -> int:
        """Acknowledge everything below ``offset``: see :meth:`AsyncFetcher.ack_up_to`."""
        request = ack_request(topic, subscription, partition, offset, committer)
        got: _pb.AckUpToResponse = self._retrying(topic, lambda link: link.broker.AckUpTo, request)
        return got.cursor

    def _retrying(
        self,
        topic: str,
        method: Callable[[BlockingLink], Any],
        request: object,
        timeout_s: float = 0,
    ) -> Any:
        self._check_open()
        return self.router.call(
            topic,
            lambda link, timeout: method(link)(request, timeout=timeout),
            timeout_s=timeout_s or self._timeout,
            what=type(request).__name__,
        )

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosed("the Fetcher is closed")

    def close(self) -> None:
        """Close the channels. Idempotent; later calls raise ``ClientClosed``."""
        if not self._closed:
            self._closed = True
            self.router.close()
