"""A broker's session in etcd: its lease, kept alive, and the clock that says when it may
no longer write.

Role: grant the lease, register ``brokers/<node_id>`` under it, renew it every TTL/3, and
answer :meth:`Session.may_write` from this process's own monotonic clock. When etcd says
the lease is gone, make a new session (new lease, registered again) and raise
:attr:`Session.generation`, so that the member re-claims its topics before it writes.

The write rule (:class:`WriteWindow`, pure): etcd expires a lease ``granted TTL`` after
it last *received* a keepalive; this broker only knows when it *sent* one. Every renewal
therefore counts from the send time of the request whose reply renewed it, which is no
later than etcd's receipt, minus a margin for clock rate drift::

    write_deadline = sent_at(last acknowledged keepalive) + granted_ttl - margin
    margin         = max(0.5 s, ttl / 5)
    may_write(now) = now < write_deadline

Worked example, TTL 2 s (margin 0.5 s): a keepalive sent at t=10.0 and answered at t=10.3
gives a deadline of 11.5. If etcd is then unreachable, writes stop at 11.5, while etcd
expires the lease no earlier than 12.0 (it received the request at >= 10.0). Another broker
can claim a topic only after that expiry, so two brokers never write one topic at once.

Registration: ``brokers/<node_id>`` is created on absence under this session's lease. If
the key exists under another lease (this node id's previous process, SIGKILLed; or a live
duplicate), wait up to one TTL (plus :data:`EXPIRY_SLACK_S`) for it to expire, then fail with
:class:`~cluster.errors.DuplicateNodeError` naming the holder's address.

Task-safety: one keepalive task (started by :meth:`Session.start`) owns the lease state;
other tasks only read it (single event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from cluster.errors import ClusterError, DuplicateNodeError, EtcdUnavailableError
from cluster.etcd import Compare, EtcdStore, KeyValue, Op
from cluster.records import BrokerRecord, Keys, decode, encode

log = logging.getLogger(__name__)

Clock = Callable[[], float]
"""Monotonic seconds (``time.monotonic`` in production; ``tests._helpers.ManualClock``
in tests), as the rest of Headrace injects clocks."""

RETRY_S = 0.2
"""Seconds between attempts while etcd does not answer a keepalive or a re-session."""


EXPIRY_SLACK_S = 1.5
"""Seconds past a TTL that etcd may take to delete an expired lease's keys: it checks
expiry every 500 ms and commits each revoke through Raft (measured here: a 2 s lease of a
crashed holder went 2.0 to 2.7 s after its last keepalive)."""


KEEPALIVE_RETRY_S = 0.02
"""Seconds before a keepalive that got no answer is sent again (to the next endpoint)."""

KEEPALIVE_LOG_EVERY = 100
"""While etcd does not answer, a keepalive is retried at once on the next endpoint, many
times a second: the warning is logged at the first and then every this many."""

REVOKE_WITHIN_S = 2.0
"""How long a leave waits for etcd to revoke the lease (milliseconds when etcd answers);
with etcd gone the lease runs out on its clock instead of holding the stop up."""


def margin_for(ttl_s: float) -> float:
    """Seconds by which this broker stops writing before its lease could expire."""
    return max(0.5, ttl_s / 5)


@dataclass(slots=True)
class WriteWindow:
    """Until when this broker may write, from the keepalives acknowledged so far. Pure.

    Not task-safe: owned by :class:`Session`.
    """

    margin_s: float
    deadline: float = float("-inf")

    def renewed(self, sent_at: float, granted_ttl_s: float) -> None:
        """A keepalive (or grant) sent at ``sent_at`` was answered with ``granted_ttl_s``."""
        self.deadline = max(self.deadline, sent_at + granted_ttl_s - self.margin_s)

    def lost(self) -> None:
        """The lease is gone: no write until a new session is renewed."""
        self.deadline = float("-inf")

    def may_write(self, now: float) -> bool:
        """True while ``now`` is before the deadline."""
        return now < self.deadline


class Session:
    """A broker's lease and registration. Start with :meth:`start`, end with :meth:`aclose`.

    Args:
        store: the etcd connection.
        keys: the cluster's key layout.
        broker: this broker's record (``session_ms`` is filled in at each registration).
        ttl_s: lease TTL, whole seconds (2..60).
        clock: monotonic seconds; the write deadline is on it.
        wall_ms: wall-clock milliseconds, for ``session_ms``.
    """

    def __init__(
        self,
        store: EtcdStore,
        keys: Keys,
        broker: BrokerRecord,
        ttl_s: int,
        *,
        clock: Clock = time.monotonic,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        self._store = store
        self._keys = keys
        self._broker = broker
        self._ttl_s = ttl_s
        self._clock = clock
        self._wall_ms = wall_ms
        self._window = WriteWindow(margin_for(ttl_s))
        self._lease = 0
        self._generation = 0
        self._started_at = 0.0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    @property
    def node_id(self) -> str:
        return self._broker.node_id

    @property
    def lease(self) -> int:
        """The current lease id; 0 before the first registration."""
        return self._lease

    @property
    def generation(self) -> int:
        """How many sessions this process has made: 1 after :meth:`start`, +1 at each
        re-session. A member re-claims its topics once per generation."""
        return self._generation

    @property
    def ttl_s(self) -> int:
        return self._ttl_s

    def may_write(self, now: float | None = None) -> bool:
        """True while the lease cannot have expired yet by this process's clock."""
        return self._window.may_write(self._clock() if now is None else now)

    def age_s(self) -> float:
        """Seconds since the current session began (0 before it began)."""
        return max(0.0, self._clock() - self._started_at) if self._generation else 0.0

    async def start(self) -> None:
        """Grant a lease, register, and start the keepalive task.

        Raises:
            DuplicateNodeError: a live broker holds this node id for longer than one TTL.
            EtcdUnavailableError: etcd did not answer.
        """
        await self._new_session()
        self._task = asyncio.create_task(self._keep_alive(), name=f"session-{self.node_id}")

    async def aclose(self) -> None:
        """Stop renewing and revoke the lease (the registration goes at once)."""
        await self.abandon()
        if self._lease:
            with contextlib.suppress(ClusterError, TimeoutError):
                async with asyncio.timeout(REVOKE_WITHIN_S):
                    await self._store.revoke(self._lease)

    async def abandon(self) -> None:
        """Stop renewing WITHOUT revoking: the lease runs out on etcd's clock, as after a
        SIGKILL of this process. For tests, and for a shutdown that must not look clean."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._window.lost()

    async def wait_generation(self, after: int) -> int:
        """Wait until :attr:`generation` is above ``after``; returns it."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._generation > after)
            return self._generation

    async def _new_session(self) -> None:
        await self._wait_free()
        sent_at = self._clock()
        lease, granted = await self._store.grant(self._ttl_s)
        record = msgspec.structs.replace(self._broker, session_ms=self._wall_ms())
        if not await self._register(lease, record):
            await self._store.revoke(lease)
            raise self._duplicate(await self._store.get(self._keys.broker(self.node_id)))
        self._lease = lease
        self._window = WriteWindow(margin_for(granted))
        self._window.renewed(sent_at, granted)
        self._started_at = sent_at
        async with self._changed:
            self._generation += 1
            self._changed.notify_all()
        log.info(
            "broker %s: session %d began (lease %x, ttl %d s)",
            self.node_id,
            self._generation,
            lease,
            granted,
        )

    async def _wait_free(self) -> None:
        """Wait up to one TTL (plus :data:`EXPIRY_SLACK_S`) for ``brokers/<me>`` to be
        absent: a previous process's lease running out.

        Raises:
            DuplicateNodeError: still held after that.
        """
        key = self._keys.broker(self.node_id)
        deadline = self._clock() + self._ttl_s + EXPIRY_SLACK_S
        while (held := await self._store.get(key)) is not None:
            if self._clock() >= deadline:
                raise self._duplicate(held)
            await asyncio.sleep(min(RETRY_S, self._ttl_s / 10))

    async def _register(self, lease: int, record: BrokerRecord) -> bool:
        """Create ``brokers/<me>`` under ``lease`` on absence; True when it is ours (re-read:
        a retried transaction may answer "failed" for a put that applied)."""
        key = self._keys.broker(self.node_id)
        await self._store.txn([Compare.absent(key)], [Op.put(key, encode(record), lease=lease)])
        held = await self._store.get(key)
        return held is not None and held.lease == lease

    def _duplicate(self, held: KeyValue | None) -> DuplicateNodeError:
        address = decode(held.key, held.value, BrokerRecord).address if held else ""
        return DuplicateNodeError(self.node_id, address, self._ttl_s + EXPIRY_SLACK_S)

    async def _keep_alive(self) -> None:
        """Renew every TTL/3; on a lost lease make a new session. Runs until cancelled."""
        delay = self._ttl_s / 3
        unanswered = 0  # keepalives not answered in a row: logged at the 1st and every 100th
        while True:
            await asyncio.sleep(delay)
            delay = self._ttl_s / 3
            sent_at = self._clock()
            try:
                # A sixth of the TTL: a keepalive sent to a frozen etcd member must give
                # way to one on a live member well before the write window closes.
                ttl = await self._store.keepalive_once(self._lease, timeout_s=self._ttl_s / 6)
            except EtcdUnavailableError as exc:
                unanswered += 1
                if unanswered == 1 or unanswered % KEEPALIVE_LOG_EVERY == 0:
                    log.warning(
                        "broker %s: keepalive not answered (%d in a row): %s",
                        self.node_id,
                        unanswered,
                        exc,
                    )
                delay = KEEPALIVE_RETRY_S  # the next endpoint, at once: the window closes
                continue
            if unanswered:
                log.info("broker %s: keepalive answered after %d not", self.node_id, unanswered)
                unanswered = 0
            if ttl > 0:
                self._window.renewed(sent_at, ttl)
                continue
            log.warning(
                "broker %s: lease %x is gone; making a new session", self.node_id, self._lease
            )
            self._window.lost()
            await self._resession()

    async def _resession(self) -> None:
        while True:
            try:
                await self._new_session()
                return
            except (EtcdUnavailableError, DuplicateNodeError) as exc:
                log.error("broker %s: no new session yet: %s", self.node_id, exc)
                await asyncio.sleep(RETRY_S)
