"""BlockingRouter: the blocking fetcher's routing, on gRPC's blocking API.

Role: :class:`~client._async._routing.Router` for the blocking
:class:`~client.Fetcher` (which runs in Spark's executors without an event loop): the
same :class:`~client._routes.RouteTable` decides where each topic's calls go and what a
failure means; this shell calls, sleeps (``time.sleep``) and looks up. One blocking
channel per broker address, opened on first use, closed by :meth:`close`.

Thread-safe: opening a channel holds a lock; the table's updates are single dict
operations (a thread that read a stale route pays one more refusal).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc

from client._connection import ConnectionSettings
from client._retry import route_backoff_s
from client._routes import LOOKUP_TIMEOUT_S, MAX_REDIRECTS, RouteTable, Step
from client.errors import ClientError, NotFound, from_rpc_error
from proto import broker_pb2_grpc, cluster_pb2_grpc
from proto import cluster_pb2 as _cluster
from proto.shown import shown_text

logger = logging.getLogger(__name__)

R = TypeVar("R")


@dataclasses.dataclass(slots=True)
class BlockingLink:
    """One broker address: its blocking channel and the stubs on it."""

    address: str
    channel: grpc.Channel
    broker: broker_pb2_grpc.BrokerStub = dataclasses.field(init=False)
    cluster: cluster_pb2_grpc.ClusterStub = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.broker = broker_pb2_grpc.BrokerStub(self.channel)
        self.cluster = cluster_pb2_grpc.ClusterStub(self.channel)


class BlockingRouter:
    """Routes the blocking fetcher's calls to each topic's owner (module docstring)."""

    def __init__(self, settings: ConnectionSettings) -> None:
        self.settings = settings
        settings.check()  # a bad token or TLS file raises here, not at the first call
        self.table = RouteTable(settings.broker)
        self._links: dict[str, BlockingLink] = {}
        self._lock = threading.Lock()
        self._rng = random.Random()

    def link(self, address: str) -> BlockingLink:
        """The channel and stubs of ``address``, opened on first use."""
        link = self._links.get(address)
        if link is None:
            with self._lock:
                link = self._links.get(address)
                if link is None:
                    settings = dataclasses.replace(self.settings, broker=address)
                    link = self._links[address] = BlockingLink(address, settings.blocking_channel())
        return link

    def link_for(self, topic: str | None) -> BlockingLink:
        """The link a call of ``topic`` goes to now."""
        return self.link(self.table.address(topic))

    def call(
        self,
        topic: str,
        fn: Callable[[BlockingLink, float], R],
        *,
        timeout_s: float,
        what: str,
    ) -> R:
        """``fn(link, remaining_s)`` at the address of ``topic``, following refusals,
        retrying an unknown outcome with backoff, moving between seeds, until
        ``timeout_s`` has passed (as :meth:`Router.call` with ``retry=True``).

        Raises:
            ClientError: The last error.
        """
        deadline = time.monotonic() + timeout_s
        attempt = redirects = 0
        error: ClientError | None = None
        try:
            while True:
                link = self.link_for(topic)
                try:
                    return fn(link, max(deadline - time.monotonic(), 0.001))
                except grpc.RpcError as exc:
                    error = from_rpc_error(exc)
                    step = self.table.after(topic, link.address, error, retry=True)
                    if step is Step.RAISE:
                        raise error from exc
                    if step is Step.NOW and redirects < MAX_REDIRECTS:
                        redirects += 1
                        continue
                    pause = route_backoff_s(attempt, self._rng, lookup=step is not Step.BACKOFF)
                    if time.monotonic() + pause >= deadline:
                        raise error from exc
                    logger.info(
                        "%s failed (%s); retrying in %.3f s", what, shown_text(str(error)), pause
                    )
                time.sleep(pause)
                attempt += 1
                redirects = 0
                if step in (Step.LOOKUP, Step.NOW):
                    self.refresh([topic], deadline)
        finally:
            error = None  # no cycle through this frame (as in the async Router.call)

    def refresh(self, topics: Sequence[str], deadline: float) -> None:
        """Look ``topics`` up on the first seed that answers; a failure is logged."""
        request = _cluster.LookupRequest(topics=list(topics))
        error: ClientError = NotFound("no seed broker to ask")
        for address in self.table.lookup_order():
            remaining = min(deadline - time.monotonic(), LOOKUP_TIMEOUT_S)
            if remaining <= 0:
                break
            self.table.lookups += 1
            try:
                response = self.link(address).cluster.Lookup(request, timeout=remaining)
            except grpc.RpcError as exc:
                error = from_rpc_error(exc)
                if error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    continue
                break
            self.table.learn_lookup(address, response)
            return
        logger.info("looking up %s failed: %s", ", ".join(topics), shown_text(str(error)))

    def close(self) -> None:
        """Close every channel."""
        with self._lock:
            links, self._links = list(self._links.values()), {}
        for link in links:
            link.channel.close()
