"""The guard every topic-scoped RPC passes first: may this broker serve the topic now?

Role: the servicers (:mod:`broker.service`, :mod:`broker.admin_service`) call
:meth:`TopicGuard.check` as the first thing they do for a call that names a topic, with
``write=True`` when the call changes state. It asks the broker's
:class:`cluster.ownership.Ownership`; a :class:`~cluster.ownership.Refusal` becomes
:class:`~broker.errors.TopicRefusedError`, which :mod:`broker.error_status` answers with
``ABORTED`` and the trailers of :mod:`proto.refusal` (a ``Redirect`` on a
``PublishStream`` response). So a refused call did nothing: no record appended, no
subscription created, no cursor moved, and a client may resend it to the owner with the
same producer sequence.

Which calls are writes (the table ``tests/broker/test_topic_guard.py`` holds every RPC to):

=======================================  =====  ==========================================
RPC                                      write  why
=======================================  =====  ==========================================
Publish, PublishStream (each request)    yes    appends records
Subscribe (its ``open``)                 yes    creates the subscription or changes its
                                                consumers
AckUpTo, Seek                            yes    moves and saves a cursor
Ack/Purge/ReplayDeadLetters              yes    changes a dead-letter queue (replay also
                                                publishes)
DeleteTopic, DeleteSubscription          yes    deletes
Fetch, DescribeTopic, DescribeSubscription,
ListSubscriptions (naming a topic),
Peek/CountDeadLetters, OffsetsForTime    no     reads
CreateTopic, ListTopics,
ListSubscriptions (of every topic)       --     not topic-scoped: no guard
=======================================  =====  ==========================================

A name that is not a valid topic name is not refused here: no broker serves it, and the
servicer answers ``INVALID_ARGUMENT`` naming the field, as it always did. A refusal of
reason ``absent`` (the cluster holds no such topic, this broker has a stray local copy
it must not serve) is answered as the unknown topic it is: ``NOT_FOUND``.

With :class:`cluster.ownership.SingleBroker` (no cluster settings) nothing is ever
refused: a single broker behaves exactly as before cluster mode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from broker.errors import TopicNotFoundError, TopicRefusedError
from cluster.ownership import Ownership, Refusal, SingleBroker
from proto import broker_pb2 as _pb
from proto.names import is_valid_name
from proto.refusal import Redirection, trailers
from proto.shown import shown

logger = logging.getLogger(__name__)


class TopicGuard:
    """Asks :class:`~cluster.ownership.Ownership` before a topic-scoped call. Task-safe:
    no state of its own (``Ownership.refusal`` is synchronous and never waits)."""

    def __init__(
        self,
        ownership: Ownership | None = None,
        *,
        on_refusal: Callable[[str], None] = lambda _reason: None,
    ) -> None:
        self.ownership: Ownership = ownership or SingleBroker()
        self.on_refusal = on_refusal
        """Called with the reason of each refusal (the broker counts them:
        ``headrace_cluster_refusals_total{reason}``)."""

    def check(self, topic: str, *, write: bool) -> None:
        """Return if this broker serves ``topic`` now; else raise.

        Args:
            topic: The topic the call names.
            write: Whether the call changes state (see the module's table).

        Raises:
            TopicRefusedError: the ownership refused it; nothing was done.
            TopicNotFoundError: the cluster holds no such topic (a stray local copy of
                that name is never served); nothing was done.
        """
        refusal = self.ownership.refusal(topic, write=write)
        if refusal is None or not is_valid_name(topic):
            return
        if refusal.reason == "absent":
            raise TopicNotFoundError(topic)
        logger.debug(
            "refused a %s of topic %s: %s (owner %s at %s, epoch %d)",
            "write" if write else "read",
            shown(topic),
            refusal.reason,
            shown(refusal.owner_node),
            shown(refusal.owner_address),
            refusal.epoch,
        )
        self.on_refusal(refusal.reason)
        raise TopicRefusedError(refusal)


def redirection(refusal: Refusal) -> Redirection:
    """The wire facts of a refusal (its message travels as the status details)."""
    return Redirection(
        refusal.reason, refusal.topic, refusal.owner_node, refusal.owner_address, refusal.epoch
    )


def refusal_trailers(refusal: Refusal) -> tuple[tuple[str, str], ...]:
    """The trailing metadata of a call refused with ``refusal``."""
    return trailers(redirection(refusal))


def redirect_message(refusal: Refusal) -> _pb.Redirect:
    """The ``Redirect`` of a refused ``PublishStream`` request's response."""
    return _pb.Redirect(
        reason=refusal.reason,
        topic=refusal.topic,
        owner_node=refusal.owner_node,
        owner_address=refusal.owner_address,
        owner_epoch=refusal.epoch,
    )
