"""Bearer tokens kept in etcd (cluster mode): the broker's side of :mod:`cluster.tokens`.

Role: convert between :class:`~broker.auth.tokens.TokenEntry` (the rules: names, grants,
hashes) and :class:`cluster.tokens.TokenRecord` (what etcd holds), and
:class:`EtcdTokenSource`, the token source an :class:`~broker.auth.AuthInterceptor` reads
in cluster mode: a :class:`~cluster.tokens.TokenView` (list+watch of ``P tokens/``) whose
every change becomes a new :class:`~broker.auth.tokens.TokenSet`. A token created through
any broker, or by ``headrace tokens create --cluster-etcd``, is accepted by every broker as
soon as its watch delivers the put (milliseconds); a revocation is refused as soon.

Invariants:
- :meth:`EtcdTokenSource.current` is a plain read (no I/O); the set it returns is
  replaced, never changed, so a call checks against one snapshot, and the interceptor's
  per-stream cache (keyed on the set's identity) re-checks after each change.
- A record that breaks the token rules (a hand-edited key) is left out and logged; the
  other tokens stay in force.
- While etcd is unreachable the last set seen stays in force (a revocation made then
  reaches this broker when its watch reconnects and lists again).
"""

from __future__ import annotations

import logging
from pathlib import Path

from broker.auth.grants import make_grant
from broker.auth.tokens import TokenEntry, TokenSet, check_name
from broker.config_cluster import ClusterConfig
from cluster.etcd import EtcdStore, TlsFiles
from cluster.records import Keys
from cluster.tokens import GrantRecord, TokenRecord, TokenView

logger = logging.getLogger(__name__)


def to_record(entry: TokenEntry) -> TokenRecord:
    """``entry`` as etcd stores it."""
    return TokenRecord(
        id=entry.id,
        name=entry.name,
        sha256=entry.sha256,
        grants=tuple(GrantRecord(g.role.value, g.topics, g.subscriptions) for g in entry.grants),
        created=entry.created,
        revoked=entry.revoked,
    )


def to_entry(record: TokenRecord) -> TokenEntry:
    """``record`` as a token entry, checked by the same rules as the tokens file's.

    Raises:
        ValueError: a name, grant or hash the rules refuse.
    """
    grants = tuple(make_grant(g.role, g.topics, g.subscriptions) for g in record.grants)
    if not grants:
        raise ValueError("a token needs at least one grant")
    if len(record.sha256) != 64 or not all(c in "0123456789abcdef" for c in record.sha256):
        raise ValueError("sha256 is not 64 lowercase hex characters")
    return TokenEntry(
        record.id, check_name(record.name), record.sha256, grants, record.created, record.revoked
    )


def token_set(records: tuple[TokenRecord, ...]) -> TokenSet:
    """The :class:`TokenSet` of ``records``; a record the rules refuse is logged and left out."""
    entries: list[TokenEntry] = []
    for record in records:
        try:
            entries.append(to_entry(record))
        except ValueError as exc:
            logger.error("token %s in etcd is invalid and is ignored: %s", record.id, exc)
    return TokenSet(entries)


def etcd_tls(cluster: ClusterConfig) -> TlsFiles | None:
    """The TLS files toward etcd of ``[cluster]`` (None: plaintext)."""
    if cluster.etcd_ca is None:
        return None
    cert, key = cluster.etcd_cert, cluster.etcd_key
    return TlsFiles(Path(cluster.etcd_ca), Path(cert) if cert else None, Path(key) if key else None)


async def open_token_source(cluster: ClusterConfig) -> EtcdTokenSource:
    """Connect to the cluster's etcd (its endpoints, TLS and prefix), list the tokens and
    start watching them; the source owns that connection (:meth:`EtcdTokenSource.aclose`
    closes it).

    Raises:
        cluster.errors.ClusterError: etcd did not answer, or a TLS file is unreadable.
    """
    store = await EtcdStore.connect(list(cluster.etcd or ()), tls=etcd_tls(cluster))
    source = EtcdTokenSource(store, Keys(cluster.prefix), owns_store=True)
    try:
        count = await source.start()
    except BaseException:
        await source.aclose()
        raise
    logger.info(
        "bearer tokens from etcd %s (%stokens/): %d tokens",
        ",".join(cluster.etcd or ()),
        cluster.prefix,
        count,
    )
    return source


class EtcdTokenSource:
    """The tokens in force on a cluster member: a watched view of the tokens in etcd.

    Start with :meth:`start` (lists the tokens, then watches), stop with :meth:`aclose`.
    Task-safe on one event loop.

    Args:
        store: the etcd connection.
        keys: the cluster's key layout.
        owns_store: :meth:`aclose` closes ``store`` too (default: the caller does).
    """

    def __init__(self, store: EtcdStore, keys: Keys, *, owns_store: bool = False) -> None:
        self._tokens = TokenSet()
        self._store = store if owns_store else None
        self._view = TokenView(store, keys, self._changed)

    async def start(self) -> int:
        """List the tokens and start watching; returns how many there are.

        Raises:
            cluster.errors.EtcdUnavailableError: etcd did not answer the first listing.
        """
        await self._view.start()
        return len(self._tokens)

    async def aclose(self) -> None:
        """Stop watching (and close the store if this source owns it); the last set
        stays in force."""
        await self._view.aclose()
        store, self._store = self._store, None
        if store is not None:
            await store.aclose()

    def current(self) -> TokenSet:
        """The tokens in force now."""
        return self._tokens

    def _changed(self, records: tuple[TokenRecord, ...]) -> None:
        self._tokens = token_set(records)
