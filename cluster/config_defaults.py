"""The cluster's configuration defaults: one JSON document in etcd, changed by CAS, watched.

Role: the etcd side of ``headrace cluster config``. The settings every broker must agree on
for a topic to behave the same whichever broker owns it are kept once, for the whole
cluster, under ``P config/defaults`` (``P`` is the prefix, ``/headrace/`` by default), as a
:class:`cluster.records.DefaultsRecord`. A key the document leaves out (``None``) is not a
cluster default: each broker uses its own file's value for it. What each key may hold
(ranges) is the broker's TOML schema's rule (``broker.config_schema``); this package may
not import ``broker``, so the broker checks a value before it is stored and again when
it reads one.

Worked example: ``headrace cluster config set default_partitions=3 fsync=never`` on an
empty cluster is one transaction comparing the key absent and putting
``{"default_partitions":3,"fsync":"never"}``; a later ``unset fsync`` reads the document
and its ``mod_revision`` (say 41), and puts ``{"default_partitions":3}`` comparing
``mod_revision == 41``. As every caller of :meth:`cluster.etcd.EtcdStore.txn` must, a
failed compare is re-read: a document already equal to the wanted one means an attempt
whose reply was lost applied it.

:class:`DefaultsView` is what each broker reads: the document, listed then watched
(:class:`cluster.watched.WatchedPrefix`), listed again when the watch asks (compaction, a
restarted stream) or fails; each change replaces :attr:`DefaultsView.record` and calls
``on_change``.

Task-safety: :class:`EtcdDefaults` holds no state; :class:`DefaultsView` is written by its
own task and read by any task on the same loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from cluster.errors import ClusterError, RecordError
from cluster.etcd import Compare, EtcdStore, EventKind, KeyValue, Listing, Op, WatchEvent
from cluster.records import DefaultsRecord, Keys, decode, encode
from cluster.watched import WatchedPrefix

log = logging.getLogger(__name__)

_CAS_ATTEMPTS = 5


def defaults_key(keys: Keys) -> str:
    """The key of the cluster's defaults document."""
    return keys.config_defaults


def _read(kv: KeyValue | None, key: str) -> DefaultsRecord:
    return DefaultsRecord() if kv is None else decode(key, kv.value, DefaultsRecord)


class EtcdDefaults:
    """Read and change the cluster's defaults in etcd.

    Args:
        store: the etcd connection.
        keys: the cluster's key layout (its prefix).
    """

    def __init__(self, store: EtcdStore, keys: Keys) -> None:
        self._store = store
        self._key = defaults_key(keys)

    async def read(self) -> DefaultsRecord:
        """The document (every key ``None`` when none was ever stored).

        Raises:
            RecordError: the stored value is not a defaults document.
            EtcdUnavailableError: no answer.
        """
        return _read(await self._store.get(self._key), self._key)

    async def change(
        self, values: Mapping[str, Any], removals: Iterable[str] = ()
    ) -> DefaultsRecord:
        """Set ``values`` and remove ``removals`` (keys of :data:`KEYS`, values already
        checked), by compare-and-set on the document; returns the document stored.

        A stored value that is not a defaults document is replaced (counted as empty).

        Raises:
            ClusterError: the document kept changing under this call.
            EtcdUnavailableError: no answer; whether it was changed is unknown.
        """
        changes = {**dict.fromkeys(removals), **values}
        for _ in range(_CAS_ATTEMPTS):
            kv = await self._store.get(self._key)
            wanted = msgspec.structs.replace(self._current(kv), **changes)
            compare = (
                Compare.absent(self._key)
                if kv is None
                else Compare.modified_at(self._key, kv.mod_revision)
            )
            result = await self._store.txn([compare], [Op.put(self._key, encode(wanted))])
            again = await self._store.get(self._key)
            if result.succeeded or self._current(again) == wanted:  # re-read: a lost reply
                log.info("cluster defaults changed: %s", wanted.set_values())
                return wanted
        raise ClusterError("the cluster's defaults kept changing; try again")

    def _current(self, kv: KeyValue | None) -> DefaultsRecord:
        """The stored document; one that is not a document counts as empty, so that a
        change replaces it (the way to repair it), logged."""
        try:
            return _read(kv, self._key)
        except RecordError as exc:
            log.warning("replacing the cluster's defaults that cannot be read: %s", exc)
            return DefaultsRecord()


class DefaultsView:
    """The cluster's defaults as this broker sees them: a
    :class:`~cluster.watched.WatchedPrefix` of the document's key.

    Args:
        store: the etcd connection.
        keys: the cluster's key layout.
        on_change: called with the new document after each change (on the view's task).
    """

    def __init__(
        self,
        store: EtcdStore,
        keys: Keys,
        on_change: Callable[[DefaultsRecord], None] = lambda _: None,
    ) -> None:
        self._key = defaults_key(keys)
        self._on_change = on_change
        self.record = DefaultsRecord()
        """The document as last read (replaced, never changed in place)."""
        self._watched = WatchedPrefix(
            store, self._key, name="defaults-view", replace=self._list, apply=self._patch
        )

    @property
    def relists(self) -> int:
        """How many times the view read again after its watch ended or asked."""
        return self._watched.relists

    async def start(self) -> None:
        """Read the document and start watching it.

        Raises:
            EtcdUnavailableError: the first read got no answer.
        """
        await self._watched.start()

    async def aclose(self) -> None:
        """Stop watching; :attr:`record` stays as it was."""
        await self._watched.aclose()

    def _list(self, listing: Listing) -> None:
        found = [kv for kv in listing.items if kv.key == self._key]
        self._keep(found[0] if found else None)

    def _patch(self, events: list[WatchEvent]) -> None:
        for event in events:
            if event.kv.key == self._key:
                self._keep(event.kv if event.kind is EventKind.PUT else None)

    def _keep(self, kv: KeyValue | None) -> None:
        try:
            record = _read(kv, self._key)
        except ClusterError as exc:  # a bad document is ignored, loudly; the last one stays
            log.error(
                "the cluster's defaults at %s cannot be read and are ignored: %s", self._key, exc
            )
            return
        if record != self.record:
            log.info("cluster defaults now: %s", record.set_values())
        self.record = record
        self._on_change(record)
