"""Router: the async shell of a client's routing; one channel per broker address.

Role: every async client (producer, admin client, fetcher; the consumer for its Lookups)
sends a topic's calls through :meth:`Router.call`, which picks the address from its
:class:`~client._routes.RouteTable` (the owner when cached, else the seed in use), makes
the call there, and after a failure does what the table says: resend at once to the
owner a refusal named; back off (full-jitter exponential,
:func:`client._retry.route_backoff_s`: from 50 ms, doubling, at most 250 ms before a
Lookup, so a new leader is found soon after its election; at most 2 s before a plain
retry) and look the topic up on any reachable seed; or move to the next seed. The
call's deadline bounds all of it; at the deadline the last error is raised (a
:class:`~client.errors.Refused` when the topic was still not served).

Channels: one per broker address, opened on first use with the client's
:class:`~client._connection.ConnectionSettings` (``broker`` replaced by the address),
closed by :meth:`aclose`. A channel given to the client (``channel=``) stands for the
first seed and is not closed here.

Single broker: nothing changes. The first call goes to the seed; a single broker never
refuses, so no Lookup is ever made (``tests/client/test_routing.py`` counts them).

Not thread-safe: a router belongs to its client's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from client._connection import ConnectionSettings
from client._retry import route_backoff_s
from client._routes import LOOKUP_TIMEOUT_S, MAX_REDIRECTS, RouteTable, Step, unreached
from client.errors import ClientError, NotFound, from_rpc_error
from proto import admin_pb2_grpc, broker_pb2_grpc, cluster_pb2_grpc
from proto import cluster_pb2 as _cluster
from proto.shown import shown_text

logger = logging.getLogger(__name__)

R = TypeVar("R")


@dataclasses.dataclass(slots=True)
class Link:
    """One broker address: its channel and the stubs on it."""

    address: str
    channel: grpc.aio.Channel
    owned: bool
    broker: broker_pb2_grpc.BrokerStub = dataclasses.field(init=False)
    admin: admin_pb2_grpc.AdminStub = dataclasses.field(init=False)
    cluster: cluster_pb2_grpc.ClusterStub = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.broker = broker_pb2_grpc.BrokerStub(self.channel)
        self.admin = admin_pb2_grpc.AdminStub(self.channel)
        self.cluster = cluster_pb2_grpc.ClusterStub(self.channel)


class Router:
    """Routes a client's calls to each topic's owner (module docstring).

    Args:
        settings: The client's connection settings; ``settings.broker`` holds the seeds.
        channel: A channel to use for the first seed (not closed by the router).

    Raises:
        ValueError: A bad seed or setting (:meth:`ConnectionSettings.check`), checked
            here though channels open at their first call.
    """

    def __init__(
        self, settings: ConnectionSettings, channel: grpc.aio.Channel | None = None
    ) -> None:
        self.settings = settings
        self.table = RouteTable(settings.broker)
        self._links: dict[str, Link] = {}
        if channel is None:
            settings.check()  # a bad token or TLS file raises here, not at the first call
        else:
            seed = self.table.seeds[0]
            self._links[seed] = Link(seed, channel, owned=False)
        self._rng = random.Random()

    def link(self, address: str) -> Link:
        """The channel and stubs of ``address``, opened on first use."""
        link = self._links.get(address)
        if link is None:
            settings = dataclasses.replace(self.settings, broker=address)
            link = self._links[address] = Link(address, settings.aio_channel(), owned=True)
        return link

    def link_for(self, topic: str | None) -> Link:
        """The link a call of ``topic`` goes to now."""
        return self.link(self.table.address(topic))

    async def call(
        self,
        topic: str | None,
        fn: Callable[[Link, float], Awaitable[R]],
        *,
        timeout_s: float,
        what: str,
        retry: bool = True,
    ) -> R:
        """``await fn(link, remaining_s)`` at the address of ``topic``, following
        refusals and moving between seeds until it succeeds or ``timeout_s`` has passed.

        Args:
            topic: The topic the call names; ``None`` for a call any broker answers.
            retry: Whether the call may be resent after an unknown outcome (UNAVAILABLE);
                after a refusal, or a broker never reached, every call is resent.

        Raises:
            ClientError: The last error, as :mod:`client.errors` translates it.
        """
        deadline = time.monotonic() + timeout_s
        attempt = redirects = 0
        unreached_at: set[str] = set()
        error: ClientError | None = None
        try:
            while True:
                link = self.link_for(topic)
                try:
                    return await fn(link, max(deadline - time.monotonic(), 0.001))
                except grpc.RpcError as exc:
                    error = from_rpc_error(exc)
                    step = self.table.after(topic, link.address, error, retry=retry)
                    if unreached(error):
                        unreached_at.add(link.address)
                        if not retry and len(unreached_at) >= len(self.table.seeds):
                            raise error from exc  # every seed tried: none can be reached
                    if step is Step.RAISE:
                        raise error from exc
                    if step is Step.NOW and redirects < MAX_REDIRECTS:
                        redirects += 1
                        logger.debug("%s: %s; going to %s", what, error, self.table.address(topic))
                        continue
                    pause = route_backoff_s(attempt, self._rng, lookup=step is not Step.BACKOFF)
                    if time.monotonic() + pause >= deadline:
                        raise error from exc
                    logger.info(
                        "%s failed (%s); retrying in %.3f s", what, shown_text(str(error)), pause
                    )
                await asyncio.sleep(pause)
                attempt += 1
                redirects = 0
                if step in (Step.LOOKUP, Step.NOW) and topic:
                    await self.refresh([topic], deadline)
        finally:
            # A raised error's traceback holds this frame: unbinding it here leaves no
            # cycle (error -> traceback -> frame -> error) that only the cyclic GC frees,
            # with this client's channel in it, after every failed call.
            error = None

    async def refresh(self, topics: Sequence[str], deadline: float) -> None:
        """Look ``topics`` up on the first seed that answers and cache the routes; a
        failure is logged, not raised (the call that wanted it goes on as it can)."""
        try:
            await self.lookup(topics, timeout_s=max(deadline - time.monotonic(), 0.001))
        except ClientError as exc:
            logger.info("looking up %s failed: %s", ", ".join(topics), shown_text(str(exc)))

    async def lookup(self, topics: Sequence[str], *, timeout_s: float) -> list[str]:
        """Ask each seed in turn (the one in use first) where ``topics`` are, cache the
        answer, and return the topics that do not exist.

        Raises:
            ClientError: No seed answered (the last one's error).
        """
        asked, response = await self.lookup_response(topics, timeout_s=timeout_s)
        return self.table.learn_lookup(asked, response)

    async def lookup_response(
        self, topics: Sequence[str], *, timeout_s: float
    ) -> tuple[str, _cluster.LookupResponse]:
        """As :meth:`lookup`, but return the address that answered and its answer (its
        routes are not cached: :meth:`lookup` does that).

        Raises:
            ClientError: No seed answered (the last one's error).
        """
        request = _cluster.LookupRequest(topics=list(topics))
        deadline = time.monotonic() + timeout_s
        error: ClientError = NotFound("no seed broker to ask")
        try:
            for address in self.table.lookup_order():
                remaining = min(deadline - time.monotonic(), LOOKUP_TIMEOUT_S)
                if remaining <= 0:
                    break
                self.table.lookups += 1
                try:
                    response = await self.link(address).cluster.Lookup(request, timeout=remaining)
                except grpc.RpcError as exc:
                    error = from_rpc_error(exc)
                    if error.code not in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                    ):
                        raise error from exc
                    continue
                return address, response
            raise error
        finally:
            del error  # no cycle through this frame (as in :meth:`call`)

    async def aclose(self) -> None:
        """Close every channel the router opened."""
        links, self._links = list(self._links.values()), {}
        for link in links:
            if link.owned:
                await link.channel.close()
