"""The cluster's internal credential in etcd (:mod:`cluster.internal_credential`), on a
real three-member etcd."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cluster.errors import RecordError
from cluster.etcd import EtcdStore
from cluster.internal_credential import PREFIX, ensure, key
from cluster.records import Keys


@pytest.mark.asyncio
async def test_every_broker_gets_the_same_credential(store: EtcdStore, prefix: str) -> None:
    """Scenario: five brokers ask for the credential at once, then one asks again.
    Expected: all get the same hri_ secret of 64 hex digits; asking again gives it again."""
    keys = Keys(prefix)
    got = await asyncio.gather(*(ensure(store, keys, i) for i in range(5)))
    assert len(set(got)) == 1
    secret = got[0]
    assert secret.startswith(PREFIX)
    assert len(secret) == len(PREFIX) + 64
    assert await ensure(store, keys, 99) == secret


@pytest.mark.asyncio
async def test_a_deleted_credential_is_made_anew(store: EtcdStore, prefix: str) -> None:
    """Scenario: the key deleted (a rotation), then asked for. Expected: a new secret."""
    keys = Keys(prefix)
    first = await ensure(store, keys, 1)
    await store.delete_prefix(key(keys))
    second = await ensure(store, keys, 2)
    assert second != first
    assert second.startswith(PREFIX)


class _RotatedWhileRead:
    """The real store, except that its first ``get`` of the credential meets a rotation
    in flight: the key is deleted just before the read (which finds nothing), and
    another broker makes the next credential just after it."""

    def __init__(self, store: EtcdStore, keys: Keys) -> None:
        self.store = store
        self.keys = keys
        self.other: str | None = None

    async def txn(self, *args: Any, **kwargs: Any) -> Any:
        return await self.store.txn(*args, **kwargs)

    async def put(self, *args: Any, **kwargs: Any) -> Any:
        return await self.store.put(*args, **kwargs)

    async def get(self, at: str) -> Any:
        if self.other is not None:
            return await self.store.get(at)
        await self.store.delete_prefix(at)
        found = await self.store.get(at)
        self.other = await ensure(self.store, self.keys, 2)
        return found


@pytest.mark.asyncio
async def test_a_rotation_between_making_and_reading_leaves_one_credential(
    store: EtcdStore, prefix: str
) -> None:
    """Scenario: broker A makes the credential; a rotation deletes it before A reads it
    back (A finds nothing), and broker B makes the next one at once.
    Expected: A ends with B's secret, and the key holds it: one credential for both
    (A never overwrites B's with its own)."""
    keys = Keys(prefix)
    rotated = _RotatedWhileRead(store, keys)
    mine = await ensure(rotated, keys, 1)  # type: ignore[arg-type]
    assert rotated.other is not None
    assert mine == rotated.other
    assert await ensure(store, keys, 3) == mine


@pytest.mark.asyncio
async def test_a_damaged_record_is_an_error(store: EtcdStore, prefix: str) -> None:
    """Scenario: the key holds JSON of another shape. Expected: RecordError naming it."""
    keys = Keys(prefix)
    await store.put(key(keys), b'{"nope": 1}')
    with pytest.raises(RecordError, match="internal-credential"):
        await ensure(store, keys, 1)
