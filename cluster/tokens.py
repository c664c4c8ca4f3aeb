"""Bearer tokens in etcd: one key per token, changed by compare-and-set, and a watched view.

Role: the etcd side of ``headrace tokens`` in cluster mode. The token format, the hash and
the grants' rules stay in ``broker.auth`` (this package may not import ``broker``): here a
token is a :class:`TokenRecord`, the same fields as an entry of the tokens file, JSON
encoded. Only the SHA-256 of the secret is stored, never the secret.

Keys (``P`` is the cluster's prefix, ``/headrace/`` by default):

=============================  ==========================  =====
key                            value                       lease
=============================  ==========================  =====
``P tokens/<id>``              :class:`TokenRecord`        none
``P token-names/<name>``       the token's id (text)       none
=============================  ==========================  =====

The name key makes a name unique across the cluster: a create is one transaction that
compares both keys absent and puts both. A revoke is a compare-and-set on the token key's
``mod_revision``. As every caller of :meth:`cluster.etcd.EtcdStore.txn` must, a failed
compare is re-read before it is reported (a retried transaction may have been applied by
an attempt whose reply was lost).

:class:`TokenView` is what each broker reads: a list+watch of ``P tokens/``
(:class:`cluster.watched.WatchedPrefix`), listed again when the watch asks (compaction, a
restarted stream) or fails. Each change replaces :attr:`TokenView.records` with a new
tuple and calls ``on_change``; a revocation reaches every broker within the watch's delay
(milliseconds; the test measures it).

Task-safety: :class:`EtcdTokens` holds no state; :class:`TokenView` is written by its own
task and read by any task on the same loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from cluster.errors import TokenError
from cluster.etcd import Compare, EtcdStore, EventKind, KeyValue, Listing, Op, WatchEvent
from cluster.records import Keys, decode, encode
from cluster.watched import WatchedPrefix

log = logging.getLogger(__name__)

MAX_TOKENS = 10_000
"""Most tokens a cluster may hold (the tokens file's limit too)."""

_CAS_ATTEMPTS = 5


class GrantRecord(msgspec.Struct, frozen=True):
    """One grant of a token, as the tokens file writes it."""

    role: str
    topics: str
    subscriptions: str = "*"


class TokenRecord(msgspec.Struct, frozen=True):
    """A token as etcd holds it: the tokens file's entry (no secret; its SHA-256, hex)."""

    id: str
    name: str
    sha256: str
    grants: tuple[GrantRecord, ...]
    created: str
    revoked: bool = False


def tokens_prefix(keys: Keys) -> str:
    """The prefix of every token key."""
    return keys.prefix + "tokens/"


def token_key(keys: Keys, token_id: str) -> str:
    """The key of token ``token_id``."""
    return tokens_prefix(keys) + token_id


def name_key(keys: Keys, name: str) -> str:
    """The key that reserves the token name ``name``."""
    return keys.prefix + "token-names/" + name


def _records(items: list[KeyValue]) -> list[TokenRecord]:
    records = [decode(kv.key, kv.value, TokenRecord) for kv in items]
    return sorted(records, key=lambda r: (r.created, r.id))


class EtcdTokens:
    """Create, list and revoke the cluster's tokens in etcd.

    Args:
        store: the etcd connection.
        keys: the cluster's key layout (its prefix).
    """

    def __init__(self, store: EtcdStore, keys: Keys) -> None:
        self._store = store
        self._keys = keys

    async def list(self) -> list[TokenRecord]:
        """Every token, oldest first."""
        return _records((await self._store.get_prefix(tokens_prefix(self._keys))).items)

    async def create(self, record: TokenRecord) -> None:
        """Store a new token; its id and name must be free.

        Raises:
            TokenError: the name (or id) is taken, or the cluster holds ``MAX_TOKENS``.
            EtcdUnavailableError: no answer; whether it was stored is unknown.
        """
        listing = await self._store.get_prefix(tokens_prefix(self._keys))
        if len(listing.items) >= MAX_TOKENS:
            raise TokenError(f"the cluster holds {MAX_TOKENS} tokens, the most allowed")
        key, names = token_key(self._keys, record.id), name_key(self._keys, record.name)
        result = await self._store.txn(
            [Compare.absent(key), Compare.absent(names)],
            [Op.put(key, encode(record)), Op.put(names, record.id.encode())],
        )
        if result.succeeded:
            return
        stored = await self._store.get(key)
        if stored is not None and decode(key, stored.value, TokenRecord).sha256 == record.sha256:
            return  # applied by an attempt whose reply was lost
        if stored is not None:
            raise TokenError(f"token id {record.id} exists")
        raise TokenError(
            f"a token named {record.name!r} exists (revoked tokens keep their names); "
            "pick another name"
        )

    async def find(self, id_or_name: str) -> TokenRecord | None:
        """The token with this id (``hr_`` prefix optional) or, failing that, this name."""
        found = await self._find(id_or_name)
        return None if found is None else decode(found.key, found.value, TokenRecord)

    async def revoke(self, id_or_name: str) -> tuple[TokenRecord, bool]:
        """Mark a token revoked (it stays listed); returns it and whether it already was.

        Raises:
            TokenError: no such token, or it kept changing under this call.
            EtcdUnavailableError: no answer; whether it was revoked is unknown.
        """
        for _ in range(_CAS_ATTEMPTS):
            kv = await self._find(id_or_name)
            if kv is None:
                raise TokenError(f"no token with id or name {id_or_name!r} in the cluster")
            record = decode(kv.key, kv.value, TokenRecord)
            if record.revoked:
                return record, True
            done = msgspec.structs.replace(record, revoked=True)
            result = await self._store.txn(
                [Compare.modified_at(kv.key, kv.mod_revision)], [Op.put(kv.key, encode(done))]
            )
            if result.succeeded:
                return done, False
            # a failed compare: changed meanwhile, or applied and the reply lost; re-read
            again = await self._store.get(kv.key)
            if again is not None and decode(kv.key, again.value, TokenRecord).revoked:
                return done, False
        raise TokenError(f"token {id_or_name!r} kept changing; try again")

    async def _find(self, id_or_name: str) -> KeyValue | None:
        token_id = id_or_name.removeprefix("hr_")
        kv = await self._store.get(token_key(self._keys, token_id))
        if kv is not None:
            return kv
        reserved = await self._store.get(name_key(self._keys, id_or_name))
        if reserved is None:
            return None
        return await self._store.get(token_key(self._keys, reserved.value.decode()))


class TokenView:
    """The cluster's tokens as this broker sees them: a
    :class:`~cluster.watched.WatchedPrefix` of ``P tokens/``.

    Args:
        store: the etcd connection.
        keys: the cluster's key layout.
        on_change: called with the new records after each change (on the view's task).
    """

    def __init__(
        self,
        store: EtcdStore,
        keys: Keys,
        on_change: Callable[[tuple[TokenRecord, ...]], None] = lambda _: None,
    ) -> None:
        self._on_change = on_change
        self._by_key: dict[str, TokenRecord] = {}
        self.records: tuple[TokenRecord, ...] = ()
        """Every token, oldest first; replaced (never changed in place) at each change."""
        self._watched = WatchedPrefix(
            store, tokens_prefix(keys), name="token-view", replace=self._list, apply=self._patch
        )

    @property
    def relists(self) -> int:
        """How many times the view listed again after its watch ended or asked."""
        return self._watched.relists

    async def start(self) -> None:
        """List the tokens and start watching.

        Raises:
            EtcdUnavailableError: the first listing got no answer.
        """
        await self._watched.start()

    async def aclose(self) -> None:
        """Stop watching; :attr:`records` stays as it was."""
        await self._watched.aclose()

    def _list(self, listing: Listing) -> None:
        by_key: dict[str, TokenRecord] = {}
        for kv in listing.items:
            self._keep(by_key, kv)
        self._by_key = by_key
        self._publish()

    def _patch(self, events: list[WatchEvent]) -> None:
        for event in events:
            if event.kind is EventKind.PUT:
                self._keep(self._by_key, event.kv)
            else:
                self._by_key.pop(event.kv.key, None)
        self._publish()

    def _keep(self, by_key: dict[str, TokenRecord], kv: KeyValue) -> None:
        try:
            by_key[kv.key] = decode(kv.key, kv.value, TokenRecord)
        except Exception as exc:  # a bad record is left out, loudly, not the whole set
            log.error("token record %s cannot be read and is ignored: %s", kv.key, exc)
            by_key.pop(kv.key, None)

    def _publish(self) -> None:
        self.records = tuple(sorted(self._by_key.values(), key=lambda r: (r.created, r.id)))
        self._on_change(self.records)
