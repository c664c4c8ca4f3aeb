"""The cluster's internal credential in etcd (:mod:`cluster.internal_credential`), on a
real three-member etcd."""

from __future__ import annotations

import asyncio

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


@pytest.mark.asyncio
async def test_a_damaged_record_is_an_error(store: EtcdStore, prefix: str) -> None:
    """Scenario: the key holds JSON of another shape. Expected: RecordError naming it."""
    keys = Keys(prefix)
    await store.put(key(keys), b'{"nope": 1}')
    with pytest.raises(RecordError, match="internal-credential"):
        await ensure(store, keys, 1)
