"""The ownership interface: a single broker refuses nothing; a refusal round-trips as JSON."""

from __future__ import annotations

import msgspec
import pytest

from cluster.ownership import Ownership, Refusal, SingleBroker


@pytest.mark.parametrize("write", [True, False])
def test_single_broker_serves_every_topic(write: bool) -> None:
    """A broker with no cluster is asked about any topic, read or write: it answers None
    (serve it here), so single-broker behaviour is unchanged."""
    ownership: Ownership = SingleBroker()
    assert ownership.refusal("orders", write=write) is None


def test_refusal_is_frozen_and_encodes() -> None:
    """A Refusal is immutable and survives a JSON round trip unchanged (the lead may log or
    ship it as JSON); an unknown reason is rejected on decode."""
    refusal = Refusal("not-owner", "orders", "b2", "127.0.0.1:7002", 3, "owned by b2")
    with pytest.raises(AttributeError):
        refusal.epoch = 4  # type: ignore[misc]
    raw = msgspec.json.encode(refusal)
    assert msgspec.json.decode(raw, type=Refusal) == refusal
    bad = raw.replace(b"not-owner", b"sleepy")
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(bad, type=Refusal)
