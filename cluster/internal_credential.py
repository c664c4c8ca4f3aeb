"""The brokers' internal credential: the bearer secret with which brokers call each other's
Replication service (issue 37) when tokens are on.

Role: one random secret per cluster, kept in etcd at ``P internal-credential`` (no
lease), made by the first broker that asks for it (a put-if-absent transaction, so every
broker ends up with the same one whoever raced) and read by every broker at start.
A broker sends it as ``authorization: Bearer hri_<64 hex>`` on ReplicaStream,
ReplicaFetch and OffsetForLeaderEpoch; its auth interceptor lets that secret call the
Replication service and nothing else, and lets no user token call Replication
(``broker.auth.rules``).

Why etcd: whoever can read the cluster's keys already controls the cluster (topic
records, tokens' hashes, leadership), so the secret adds no new trust; it is kept in
clear because brokers must send it, not only check it. Rotating it: delete the key and
restart the brokers one by one (each makes or reads the new one; a broker with the old
one is refused PERMISSION_DENIED by those with the new one until it restarts).

Imports etcd and :mod:`cluster.records` only inside :func:`ensure`: a single broker's
auth interceptor uses :func:`matches` without loading the etcd client or the records.

Value: ``{"secret": "hri_...", "created_ms": ...}`` (:class:`InternalCredentialRecord`).
"""

from __future__ import annotations

import hmac
import secrets
from typing import TYPE_CHECKING

import msgspec

from cluster.errors import EtcdRequestError

if TYPE_CHECKING:  # the broker's auth imports this module; etcd only where ensure runs
    from cluster.etcd import EtcdStore
    from cluster.records import Keys

#: Every internal credential starts with it (a user token starts ``hr_``).
PREFIX = "hri_"


class InternalCredentialRecord(msgspec.Struct, frozen=True):
    """The cluster's internal credential."""

    secret: str
    created_ms: int


def key(keys: Keys) -> str:
    """The etcd key of the internal credential."""
    return keys.prefix + "internal-credential"


def new_secret() -> str:
    """A fresh credential: ``hri_`` and 64 hex digits (256 random bits)."""
    return PREFIX + secrets.token_hex(32)


def matches(presented: str, secret: str | None) -> bool:
    """Whether ``presented`` is the internal credential (constant time; never for None)."""
    if not secret or not presented.startswith(PREFIX):
        return False
    return hmac.compare_digest(presented.encode(), secret.encode())


#: Put-if-absent and read again at most this many times while the key keeps vanishing.
ENSURE_ATTEMPTS = 10


async def ensure(store: EtcdStore, keys: Keys, now_ms: int) -> str:
    """The cluster's internal credential, made now if the cluster has none.

    Put-if-absent, then read: what is read is every broker's credential. Deleted between
    the two (a rotation), it is put-if-absent again, never put outright: another broker
    may have made the next one meanwhile, and an outright put would leave the two with
    different secrets.

    Raises:
        EtcdUnavailableError: etcd did not answer.
        EtcdRequestError: the key vanished :data:`ENSURE_ATTEMPTS` times in a row.
        RecordError: the key holds something that is not a credential record.
    """
    from cluster.etcd import Compare, Op  # noqa: PLC0415 - see the TYPE_CHECKING import
    from cluster.records import decode, encode  # noqa: PLC0415 - likewise

    record = InternalCredentialRecord(new_secret(), now_ms)
    at = key(keys)
    for _ in range(ENSURE_ATTEMPTS):
        await store.txn([Compare.absent(at)], [Op.put(at, encode(record))])
        kv = await store.get(at)
        if kv is not None:
            return decode(at, kv.value, InternalCredentialRecord).secret
    raise EtcdRequestError(
        f"get {at}",
        f"the internal credential was deleted {ENSURE_ATTEMPTS} times as it was made; "
        "stop what deletes it (a rotation deletes it once), then restart this broker",
    )
