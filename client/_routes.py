"""RouteTable: where a client sends each topic's calls, and what it does after a failure.

Role: the pure half of routing (docs/protocol.md section 11), shared by the async
:class:`~client._async._routing.Router` and the blocking fetcher's. It holds the seed
brokers (:mod:`client._seeds`), the one in use (``home``: the first that answered), and
a cache ``topic -> (owner address, epoch)``. It decides; the shells call, sleep and look
up.

Rules:
- **Lazy.** A topic not in the cache goes to ``home``: no Lookup before the first call,
  so a single broker costs no extra round trip, ever.
- A **refusal** (:class:`~client.errors.Refused`: nothing was done) drops the topic's
  route; ``not-owner`` with an address other than the one just called caches that owner
  and says :data:`Step.NOW` (resend at once); anything else says :data:`Step.LOOKUP`
  (back off, look the topic up, resend where the new route says).
- An **unreachable broker or broken connection** (UNAVAILABLE, a deadline): a topic
  routed to an owner drops its route and looks up again (:data:`Step.LOOKUP`); a call
  that went to ``home`` moves ``home`` to the next seed (no Lookup: the next seed
  refuses with the owner if it has to), at once when the broker was not reached
  (:data:`Step.NOW`), else after a backoff. One seed and no route: today's behaviour
  (the call retried with backoff when it may be, else raised).
- Any other error is the call's own answer (:data:`Step.RAISE`).
- A Lookup answer (:meth:`learn_lookup`) caches every online route; one whose owner is
  the answering node keeps the address that was asked (it reached that node already).

Example: seeds ``a:1,b:2``; ``orders`` is owned by ``b``. A publish of ``orders`` goes to
``a`` (home, not cached), is refused ``not-owner`` naming ``b:2``: the table caches
``orders -> b:2`` and says NOW; the resend reaches ``b:2``. Later ``b`` dies: the call
fails UNAVAILABLE, the route is dropped, LOOKUP: after a backoff a Lookup on ``a`` says
``offline``, and the call backs off and looks up again until its deadline.

Not task-safe by itself: each client uses its table on one event loop (or, the blocking
fetcher, under its callers' GIL: dict updates are atomic and a stale read is harmless,
it only costs one more refusal).

Pure module: imports neither ``asyncio``, ``os`` nor ``time``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from client._seeds import parse_brokers
from client.errors import ClientError, Refused
from proto import cluster_pb2 as _cluster
from proto.refusal import Action, RouteAction, action, route_action

#: Redirects in a row (each to a new address) before a call backs off instead: bounds a
#: loop between two brokers whose views disagree for a moment.
MAX_REDIRECTS = 4
#: The longest one Lookup may take, seconds (within the call's own deadline).
LOOKUP_TIMEOUT_S = 5.0


class Step(enum.Enum):
    """What a caller does after a failed call."""

    #: Resend at once (to the address :meth:`RouteTable.address` now gives).
    NOW = "now"
    #: Back off, then resend (to the next seed, or the same broker).
    BACKOFF = "backoff"
    #: Back off, look the topic up, then resend where the new route says.
    LOOKUP = "lookup"
    #: Give up: raise the error.
    RAISE = "raise"


@dataclass(frozen=True, slots=True)
class Route:
    """A cached route: the owner's address and its epoch of the topic."""

    address: str
    epoch: int


#: The statuses of a broker that could not be reached or a connection that broke.
_UNREACHED = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


def unreached(error: ClientError) -> bool:
    """Whether ``error`` says the call did not reach its broker at all (connection
    refused, no route to it): nothing was sent, so any call may go to another seed."""
    text = str(error).lower()
    return error.code == grpc.StatusCode.UNAVAILABLE and (
        "failed to connect" in text or "connection refused" in text or "dns" in text
    )


class RouteTable:
    """The seeds, the one in use, and the cached routes of one client (module docstring).

    Args:
        broker: One ``HOST:PORT``, a comma-separated list, or a sequence of them.

    Raises:
        ValueError: A bad seed (see :func:`client._seeds.parse_brokers`).
    """

    def __init__(self, broker: str | Sequence[str]) -> None:
        self.seeds = parse_brokers(broker)
        self._home = 0
        self._routes: dict[str, Route] = {}
        #: Lookup calls made (tests assert that a single broker makes none).
        self.lookups = 0

    @property
    def home(self) -> str:
        """The seed in use: calls of topics not in the cache go there."""
        return self.seeds[self._home]

    def address(self, topic: str | None) -> str:
        """Where a call of ``topic`` goes (``None``: a call of no topic, to ``home``)."""
        route = self._routes.get(topic) if topic else None
        return route.address if route is not None else self.home

    def route(self, topic: str) -> Route | None:
        """The cached route of ``topic``, if any."""
        return self._routes.get(topic)

    def forget(self, topic: str) -> None:
        """Drop the cached route of ``topic``."""
        self._routes.pop(topic, None)

    def next_home(self, failed: str) -> None:
        """``failed`` (the home seed) did not answer: use the next seed."""
        if self.home == failed:
            self._home = (self._home + 1) % len(self.seeds)

    def after(self, topic: str | None, address: str, error: ClientError, *, retry: bool) -> Step:
        """What to do after a call of ``topic`` to ``address`` failed with ``error``.

        Args:
            retry: Whether the call may be resent after an unknown outcome (UNAVAILABLE,
                a deadline); a non-idempotent call may still go to another seed when it
                did not reach its broker at all (:func:`unreached`).
        """
        if isinstance(error, Refused):
            return self._refused(topic or error.redirection.topic, address, error)
        if error.code not in _UNREACHED:
            return Step.RAISE
        if not (retry or unreached(error)):
            return Step.RAISE
        if topic and topic in self._routes:
            self.forget(topic)
            return Step.LOOKUP
        if len(self.seeds) == 1:
            return Step.BACKOFF if retry else Step.RAISE
        self.next_home(address)
        return Step.NOW if unreached(error) else Step.BACKOFF

    def _refused(self, topic: str, address: str, error: Refused) -> Step:
        r = error.redirection
        self.forget(topic)
        if action(r) is Action.REDIRECT and r.owner_address != address:
            self._routes[topic] = Route(r.owner_address, r.owner_epoch)
            return Step.NOW
        return Step.LOOKUP

    def lookup_order(self) -> list[str]:
        """The seeds to ask a Lookup of, ``home`` first."""
        n = len(self.seeds)
        return [self.seeds[(self._home + i) % n] for i in range(n)]

    def learn_lookup(self, asked: str, response: _cluster.LookupResponse) -> list[str]:
        """Cache the routes of a Lookup answered by the broker at ``asked`` (which becomes
        ``home`` when it is a seed); return the topics it says do not exist.

        When it names a topic that is not served now (an election under way, an owner
        down), the next Lookup asks the next seed first: the answering broker's own view
        may be the stale one (a leader cut off from etcd still names itself), and another
        broker's may already hold the new leader."""
        if asked in self.seeds:
            self._home = self.seeds.index(asked)
        absent = []
        waiting = False
        for r in response.routes:
            what = route_action(state=r.state, online=r.online, owner_address=r.owner_address)
            if what is RouteAction.CALL:
                mine = bool(response.node_id) and r.owner_node == response.node_id
                self._routes[r.topic] = Route(asked if mine else r.owner_address, r.epoch)
            else:
                self.forget(r.topic)
                if what is RouteAction.NOT_FOUND:
                    absent.append(r.topic)
                else:
                    waiting = True
        if waiting and asked in self.seeds:
            self._home = (self.seeds.index(asked) + 1) % len(self.seeds)
        return absent
