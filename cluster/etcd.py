"""EtcdStore: the one door to etcd. The only module that imports the etcd client library.

Role: a small, typed surface over etcd v3 (``etcd3aio`` on grpc.aio) with exactly what the
cluster needs, so that a change of client library is a change of this file:

- reads: :meth:`EtcdStore.get` and :meth:`EtcdStore.get_prefix`, each giving
  :class:`KeyValue` rows (value, ``create_revision``, ``mod_revision``, lease);
- compare-and-set: :meth:`EtcdStore.txn` with :class:`Compare` guards (absent,
  ``create_revision``, ``mod_revision``, lease) and :class:`Op` writes (put with a lease,
  delete);
- leases: :meth:`EtcdStore.grant`, :meth:`EtcdStore.revoke`, and
  :meth:`EtcdStore.keepalive_once` (one request on a keepalive stream; the caller, not
  a hidden task, decides when, and records when it sent it);
- :meth:`EtcdStore.watch_prefix`: :class:`WatchBatch` items, or one final
  :class:`RelistNeeded` when the caller's picture can no longer be patched by events;
- :meth:`EtcdStore.endpoint_health`: each endpoint asked on its own, for cluster status.

Two facts of the client library this wrapper exists to contain:

1. It retries a request on ``UNAVAILABLE``. A transaction that was applied and whose
   reply was lost comes back, on the retry, as "compare failed". So a failed
   :meth:`EtcdStore.txn` means "not applied by *this* attempt": every caller re-reads and
   checks whether the state is already what it wanted (see ``cluster.controller``,
   ``cluster.member``).
2. Its watch reconnects silently, and after a compaction skips to
   ``compact_revision + 1``: events in between are lost. So :meth:`watch_prefix` ends with
   :class:`RelistNeeded` on the first compaction notice or stream restart; the caller lists
   the prefix again and watches from that listing's revision + 1 (``cluster.view``).

Errors: every failure is translated here, once, to :mod:`cluster.errors`
(:class:`~cluster.errors.EtcdUnavailableError` when the outcome is unknown,
:class:`~cluster.errors.EtcdRequestError` when etcd refused).

Task-safety: an :class:`EtcdStore` may be used from many tasks at once (one gRPC channel;
each call is independent).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import etcd3aio
import grpc
from etcd3aio import Etcd3Client, SortOrder, SortTarget, prefix_range_end
from etcd3aio._protobuf import WatchCreateRequest, WatchRequest, WatchStub
from etcd3aio.kv import KVService

from cluster.errors import ClusterError, EtcdRequestError, EtcdUnavailableError

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 5.0
"""Seconds one request may take, retries included, before it is reported unavailable."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd holds it. ``lease`` is 0 for a key with no lease."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True, slots=True)
class Listing:
    """The keys under a prefix, and the store revision they were read at."""

    items: list[KeyValue]
    revision: int


class EventKind(enum.Enum):
    """What happened to a key."""

    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A put or delete. For a delete, ``kv.value`` is empty and ``kv.mod_revision`` is the
    revision of the delete."""

    kind: EventKind
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class WatchBatch:
    """The events of one watch response, all at or below ``revision``."""

    events: list[WatchEvent]
    revision: int


@dataclass(frozen=True, slots=True)
class RelistNeeded:
    """The watch can no longer be trusted to have delivered every event: list again."""

    reason: str


@dataclass(frozen=True, slots=True)
class Compare:
    """One guard of a transaction. Build with the class methods."""

    key: str
    target: str  # "create" | "mod" | "lease"
    value: int

    @classmethod
    def absent(cls, key: str) -> Compare:
        """True while ``key`` does not exist (its ``create_revision`` is 0)."""
        return cls(key, "create", 0)

    @classmethod
    def created_at(cls, key: str, revision: int) -> Compare:
        """True while ``key`` is the very key created at ``revision`` (not a re-creation)."""
        return cls(key, "create", revision)

    @classmethod
    def modified_at(cls, key: str, revision: int) -> Compare:
        """True while ``key`` was last written at ``revision`` (nobody wrote it since)."""
        return cls(key, "mod", revision)

    @classmethod
    def leased_by(cls, key: str, lease: int) -> Compare:
        """True while ``key`` exists and is attached to ``lease``."""
        return cls(key, "lease", lease)


@dataclass(frozen=True, slots=True)
class Op:
    """One write of a transaction: a put (``value`` not None) or a delete."""

    key: str
    value: bytes | None = None
    lease: int = 0

    @classmethod
    def put(cls, key: str, value: bytes, *, lease: int = 0) -> Op:
        """Write ``value`` at ``key``, attached to ``lease`` (0: none)."""
        return cls(key, value, lease)

    @classmethod
    def delete(cls, key: str) -> Op:
        """Delete ``key``."""
        return cls(key)


@dataclass(frozen=True, slots=True)
class TxnResult:
    """Whether the guards held (and the writes were applied), and the store revision after."""

    succeeded: bool
    revision: int


@dataclass(frozen=True, slots=True)
class EndpointHealth:
    """One etcd endpoint as it answered a status request on its own."""

    endpoint: str
    healthy: bool
    is_leader: bool
    version: str
    error: str  # "" when healthy


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for TLS toward etcd: the CA that signed etcd's certificate, and this
    broker's client certificate and key (both or neither)."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None


class EtcdStore:
    """A connection to an etcd cluster (several endpoints, round-robin, retried).

    Open with :meth:`connect`, close with :meth:`aclose` (or ``async with``).
    Task-safe: see the module docstring.
    """

    def __init__(self, client: Etcd3Client, endpoints: list[str], timeout_s: float) -> None:
        self._client = client
        self._endpoints = endpoints
        self._timeout_s = timeout_s
        self._tls: tuple[bytes | None, bytes | None, bytes | None] = (None, None, None)

    @classmethod
    async def connect(
        cls,
        endpoints: Sequence[str],
        *,
        tls: TlsFiles | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> EtcdStore:
        """Open a channel to ``endpoints`` (``host:port`` each). Nothing is sent yet.

        Args:
            endpoints: etcd client endpoints; requests go round-robin, retried on another
                when one is unavailable.
            tls: CA and optional client certificate; None: plaintext.
            timeout_s: seconds each request may take, retries included (default 5).

        Raises:
            EtcdRequestError: a TLS file could not be read.
        """
        pems = _read_tls(tls)
        client = _client(list(endpoints), pems, watch_backoff_s=0.1)
        await client.connect()
        store = cls(client, list(endpoints), timeout_s)
        store._tls = pems
        return store

    @property
    def endpoints(self) -> list[str]:
        """The endpoints this store was opened with."""
        return list(self._endpoints)

    async def aclose(self) -> None:
        """Close the channel; calls in flight fail."""
        await self._client.close()

    async def __aenter__(self) -> EtcdStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- reads ---------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        """The key as etcd holds it now (a linearizable read), or None if absent."""
        response = await self._call("get", lambda t: self._kv().get(key, timeout=t, max_attempts=1))
        return _key_value(response.kvs[0]) if response.kvs else None

    async def get_prefix(self, prefix: str) -> Listing:
        """Every key under ``prefix`` (sorted by key) and the revision of the read."""
        response = await self._call(
            "get_prefix",
            lambda t: self._kv().get(prefix, prefix_range_end(prefix), timeout=t, max_attempts=1),
        )
        items = sorted((_key_value(kv) for kv in response.kvs), key=lambda kv: kv.key)
        return Listing(items, int(response.header.revision))

    async def newest_revision(self, prefix: str) -> int:
        """The highest ``mod_revision`` among the keys under ``prefix`` (0 if none): one
        cheap read that tells whether a watcher has missed a put."""
        response = await self._call(
            "newest_revision",
            lambda t: self._kv().get(
                prefix,
                prefix_range_end(prefix),
                limit=1,
                sort_order=SortOrder.DESCEND,
                sort_target=SortTarget.MOD,
                keys_only=True,
                timeout=t,
                max_attempts=1,
            ),
        )
        return int(response.kvs[0].mod_revision) if response.kvs else 0

    # -- writes --------------------------------------------------------------------------

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        """Apply ``success`` if every guard holds, else ``failure``; atomically.

        A False result after an unavailable member may mean "already applied by an
        attempt whose reply was lost" (module docstring, fact 1): re-read to know.

        Raises:
            EtcdUnavailableError: no answer in time; the outcome is unknown.
        """
        response = await self._call(
            "txn",
            lambda t: self._kv().txn(
                [_compare(c) for c in compares],
                [_op(o) for o in success],
                [_op(o) for o in failure],
                timeout=t,
                max_attempts=1,
            ),
        )
        return TxnResult(bool(response.succeeded), int(response.header.revision))

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write ``key`` unconditionally; returns the store revision of the write."""
        response = await self._call(
            "put", lambda t: self._kv().put(key, value, lease=lease, timeout=t, max_attempts=1)
        )
        return int(response.header.revision)

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix``; returns how many were deleted."""
        response = await self._call(
            "delete_prefix",
            lambda t: self._kv().delete(
                prefix, prefix_range_end(prefix), timeout=t, max_attempts=1
            ),
        )
        return int(response.deleted)

    # -- leases --------------------------------------------------------------------------

    async def grant(self, ttl_s: int) -> tuple[int, int]:
        """Grant a lease; returns ``(lease id, granted TTL in seconds)``."""
        lease = self._client.lease
        assert lease is not None
        response = await self._call(
            "lease grant", lambda t: lease.grant(ttl_s, timeout=t, max_attempts=1)
        )
        return int(response.ID), int(response.TTL)

    async def revoke(self, lease_id: int) -> None:
        """Revoke a lease: every key attached to it is deleted at once. A lease that is
        already gone is not an error."""
        lease = self._client.lease
        assert lease is not None
        try:
            await self._call(
                "lease revoke", lambda t: lease.revoke(lease_id, timeout=t, max_attempts=1)
            )
        except EtcdRequestError as exc:
            if "not found" not in exc.detail:
                raise

    async def keepalive_once(self, lease_id: int, timeout_s: float) -> int:
        """Send one keepalive for ``lease_id`` and return the TTL etcd answered.

        A TTL <= 0 means the lease is gone (expired or revoked). Each call opens its own
        keepalive stream, so a call after a dead member goes to the next endpoint.

        Raises:
            EtcdUnavailableError: no answer within ``timeout_s``.
        """
        lease = self._client.lease
        assert lease is not None
        stream = lease.keep_alive(lease_id)
        try:
            async with asyncio.timeout(timeout_s):
                async for response in stream:
                    return int(response.TTL)
        except (TimeoutError, grpc.aio.AioRpcError) as exc:
            raise self._unavailable("lease keepalive", exc) from exc
        finally:
            stream.cancel()
        raise EtcdUnavailableError("lease keepalive", self._endpoints, "stream ended")

    # -- watch ---------------------------------------------------------------------------

    async def watch_prefix(
        self, prefix: str, start_revision: int
    ) -> AsyncGenerator[WatchBatch | RelistNeeded, None]:
        """Events under ``prefix`` from ``start_revision`` on, as :class:`WatchBatch` items.

        Ends with one :class:`RelistNeeded` when etcd reports a compaction (events were
        lost), cancels the watch, or the stream breaks: the caller lists again and watches
        from that listing's revision + 1.

        The stream is our own, on the client's channel, written to with ``call.write``:
        etcd3aio 0.3.0's ``watch()`` feeds its stream from a generator that awaits a future
        nothing resolves, so each broken stream left gRPC's feeding task pending, and its
        destruction logged ``Task was destroyed but it is pending`` at ERROR (found by the
        cluster chaos test, an etcd member SIGKILLed). With no request iterator there is no
        such task, and a broken stream ends here with a relist instead of the library's
        silent resume.
        """
        channel = self._client._channel  # private, but ours: the one channel this store opened
        if channel is None:
            raise ClusterError("the etcd store is closed")
        call = WatchStub(channel).Watch()
        create = WatchCreateRequest(
            key=prefix.encode(),
            range_end=prefix_range_end(prefix),
            start_revision=start_revision,
        )
        try:
            await call.write(WatchRequest(create_request=create))
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    yield RelistNeeded("watch stream ended")
                    return
                if response.compact_revision > 0:
                    yield RelistNeeded(f"compacted at revision {response.compact_revision}")
                    return
                if response.canceled:
                    yield RelistNeeded(f"watch canceled: {response.cancel_reason}")
                    return
                if response.events:
                    events = [_event(e) for e in response.events]
                    yield WatchBatch(events, int(response.header.revision))
        except grpc.aio.AioRpcError as exc:
            yield RelistNeeded(f"watch stream broke: {_describe(exc)}")
        finally:
            call.cancel()

    # -- status --------------------------------------------------------------------------

    async def endpoint_health(self, timeout_s: float = 1.0) -> list[EndpointHealth]:
        """Ask each endpoint on its own channel for its status, all at once."""
        asks = (self._one_health(endpoint, timeout_s) for endpoint in self._endpoints)
        return list(await asyncio.gather(*asks))

    async def _one_health(self, endpoint: str, timeout_s: float) -> EndpointHealth:
        client = _client([endpoint], self._tls, attempts=1)
        try:
            await client.connect()
            assert client.maintenance is not None
            async with asyncio.timeout(timeout_s):
                status = await client.maintenance.status(timeout=timeout_s)
            leader = int(status.leader) == int(status.header.member_id)
            errors = "; ".join(str(e) for e in status.errors)
            return EndpointHealth(endpoint, not errors, leader, str(status.version), errors)
        except (TimeoutError, grpc.aio.AioRpcError, etcd3aio.EtcdError) as exc:
            return EndpointHealth(endpoint, False, False, "", _describe(exc))
        finally:
            await client.close()

    # -- plumbing ------------------------------------------------------------------------

    def _kv(self) -> KVService:
        kv = self._client.kv
        if kv is None:
            raise ClusterError("the etcd store is closed")
        return kv

    async def _call(self, operation: str, call: Callable[[float], Awaitable[T]]) -> T:
        """Run ``call(attempt_timeout)`` until it answers or :attr:`timeout_s` is spent,
        each attempt on the next endpoint (round-robin), and translate its errors (STYLE
        rule 17).

        Why attempts of a third of the timeout, and not the library's own retry: its
        retry loop shares one deadline with the first attempt, so a request sent to a
        frozen member (SIGSTOP, a dead host: the TCP connection stays up) would spend the
        whole timeout there. A short attempt moves on to a live member in time.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        attempt_s = max(0.5, self._timeout_s / 3)
        while True:
            left = deadline - loop.time()
            try:
                return await call(min(attempt_s, max(left, 0.05)))
            except (TimeoutError, etcd3aio.EtcdConnectionError, etcd3aio.EtcdTransientError) as exc:
                if deadline - loop.time() <= 0.05:
                    raise self._unavailable(operation, exc) from exc
                await asyncio.sleep(0.02)
            except etcd3aio.EtcdError as exc:
                raise EtcdRequestError(operation, _describe(exc)) from exc
            except grpc.aio.AioRpcError as exc:
                raise EtcdRequestError(operation, _describe(exc)) from exc

    def _unavailable(self, operation: str, exc: BaseException) -> EtcdUnavailableError:
        return EtcdUnavailableError(operation, self._endpoints, _describe(exc))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__


def _client(
    endpoints: list[str],
    pems: tuple[bytes | None, bytes | None, bytes | None],
    *,
    attempts: int = 3,
    watch_backoff_s: float = 0.25,
) -> Etcd3Client:
    ca, cert, key = pems
    return Etcd3Client(
        endpoints,
        rpc_max_attempts=attempts,
        watch_reconnect_backoff_seconds=watch_backoff_s,
        watch_max_reconnect_backoff_seconds=1.0,
        ca_cert=ca,
        cert_chain=cert,
        cert_key=key,
    )


def _read_tls(tls: TlsFiles | None) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The (CA, client certificate, client key) PEM bytes; all None for plaintext."""
    if tls is None:
        return None, None, None
    try:
        return (
            tls.ca.read_bytes(),
            tls.cert.read_bytes() if tls.cert else None,
            tls.key.read_bytes() if tls.key else None,
        )
    except OSError as exc:
        raise EtcdRequestError("connect", f"cannot read a TLS file: {exc}") from exc


def _key_value(kv: Any) -> KeyValue:
    return KeyValue(
        bytes(kv.key).decode(),
        bytes(kv.value),
        int(kv.create_revision),
        int(kv.mod_revision),
        int(kv.lease),
    )


def _event(event: Any) -> WatchEvent:
    kind = EventKind.DELETE if int(event.type) == 1 else EventKind.PUT
    return WatchEvent(kind, _key_value(event.kv))


def _compare(guard: Compare) -> Any:
    if guard.target == "create":
        return KVService.txn_compare_create_revision(guard.key, guard.value)
    compare = KVService.txn_compare_create_revision(guard.key, 0)  # a Compare to fill in
    if guard.target == "mod":
        compare.target = compare.MOD
        compare.mod_revision = guard.value
    else:
        compare.target = compare.LEASE
        compare.lease = guard.value
    return compare


def _op(op: Op) -> Any:
    if op.value is None:
        return KVService.txn_op_delete(op.key)
    return KVService.txn_op_put(op.key, op.value, lease=op.lease)
