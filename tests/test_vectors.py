"""The conformance vectors (docs/protocol/vectors/) agree with our codec and our broker.

Each valid vector decodes to its JSON and re-encodes byte-identically; a real broker over
gRPC accepts it and a Fetch returns the same bytes with the offsets the log assigned. Each
invalid vector is refused with its status and a message containing its substring.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from proto.vectors import (
    INVALID_VECTORS,
    VALID,
    VECTORS_DIR,
    decoded_json,
    differences,
    encode_json,
)
from tests.broker.conftest import broker_config, serving
from wal import decode_batch

VALID_NAMES = sorted(p.stem for p in VECTORS_DIR.glob("*.json"))
INVALID_NAMES = sorted(p.stem for p in (VECTORS_DIR / "invalid").glob("*.json"))


def load(stem: Path) -> tuple[bytes, dict[str, object]]:
    data = stem.with_suffix(".bin").read_bytes()
    doc = json.loads(stem.with_suffix(".json").read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return data, doc


def test_committed_vectors_are_what_the_codec_writes() -> None:
    """Scenario: regenerate every vector. Expected: the committed files are identical and
    complete (nothing missing, nothing extra), as `python -m proto.vectors --check` says."""
    assert differences(VECTORS_DIR) == []
    assert sorted(v.name for v in VALID) == VALID_NAMES
    assert sorted(v.name for v in INVALID_VECTORS) == INVALID_NAMES


def test_the_check_names_a_changed_file(tmp_path: Path) -> None:
    """Scenario: a committed vector differs by one byte, one is missing, one is extra.
    Expected: `--check` reports each of them by name."""
    from proto.vectors import write

    write(tmp_path)
    target = tmp_path / "one_record.bin"
    target.write_bytes(target.read_bytes()[:-1] + b"\x01")
    (tmp_path / "invalid" / "bad_crc.json").unlink()
    (tmp_path / "stray.bin").write_bytes(b"")
    problems = differences(tmp_path)
    assert problems == [
        "invalid/bad_crc.json: missing",
        "stray.bin: not written by proto.vectors",
        "one_record.bin: differs",
    ]


@pytest.mark.parametrize("name", VALID_NAMES)
def test_codec_decodes_each_valid_vector_to_its_json(name: str) -> None:
    """Scenario: decode NAME.bin. Expected: the JSON of the vector, field by field
    (headers read from the columns, in order, repeated names included)."""
    data, doc = load(VECTORS_DIR / name)
    batch = decode_batch(data)
    assert batch is not None
    assert batch.size == len(data)
    assert {"description": doc["description"], **decoded_json(batch)} == doc


@pytest.mark.parametrize("name", VALID_NAMES)
def test_codec_reencodes_each_valid_vector_byte_identically(name: str) -> None:
    """Scenario: encode the records of NAME.json. Expected: NAME.bin, byte for byte."""
    data, doc = load(VECTORS_DIR / name)
    assert encode_json(doc) == data


def test_the_unicode_and_empty_key_edge_cases_are_what_the_json_says() -> None:
    """Scenario: the keys and headers vectors, read independently of decoded_json.
    Expected: null vs empty keys stay distinct; the unicode header name round-trips."""
    keys = decode_batch((VECTORS_DIR / "keys_absent_and_empty.bin").read_bytes())
    assert keys is not None
    assert keys.keys() == [None, b"", b"k"]
    headers = decode_batch((VECTORS_DIR / "headers.bin").read_bytes())
    assert headers is not None
    assert headers.headers()[2] == {"caf\u00e9-\u00fc\u2713-\U0001f680": b""}


@pytest.mark.asyncio
async def test_broker_accepts_every_valid_vector_and_stores_it_byte_for_byte(
    tmp_path: Path,
) -> None:
    """Scenario: Publish each valid vector (real gRPC) to one partition, then Fetch from 0.
    Expected: each is accepted at the next offsets; the fetched batches are the vectors'
    bytes with only base_offset (bytes 0-8, outside the CRC) changed."""
    async with serving(broker_config(tmp_path / "data")) as (_, client):
        await client.admin.CreateTopic(admin.CreateTopicRequest(name="vectors", partitions=1))
        expected: list[bytes] = []
        offset = 0
        for name in VALID_NAMES:
            data, doc = load(VECTORS_DIR / name)
            records = doc["records"]
            assert isinstance(records, list)
            response = await client.broker.Publish(
                pb.PublishRequest(topic="vectors", partition=0, batch=data)
            )
            assert (response.base_offset, response.last_offset) == (
                offset,
                offset + len(records) - 1,
            ), name
            assert not response.duplicate
            expected.append(offset.to_bytes(8, "little") + data[8:])
            offset += len(records)
        fetched: list[bytes] = []
        while len(fetched) < len(expected):
            got = await client.broker.Fetch(
                pb.FetchRequest(
                    topic="vectors",
                    partition=0,
                    offset=sum(map(_count, fetched)),
                    max_bytes=4 << 20,
                )
            )
            assert got.batches
            fetched += got.batches
        assert fetched == expected


def _count(batch: bytes) -> int:
    return int.from_bytes(batch[20:24], "little")


@pytest.mark.parametrize("name", INVALID_NAMES)
@pytest.mark.asyncio
async def test_broker_refuses_each_invalid_vector_with_its_status(
    name: str, tmp_path: Path
) -> None:
    """Scenario: Publish invalid/NAME.bin (real gRPC). Expected: the vector's status code,
    a message containing its substring, and nothing appended."""
    data, doc = load(VECTORS_DIR / "invalid" / name)
    async with serving(broker_config(tmp_path / "data")) as (_, client):
        await client.admin.CreateTopic(admin.CreateTopicRequest(name="vectors", partitions=1))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.broker.Publish(pb.PublishRequest(topic="vectors", partition=0, batch=data))
        assert caught.value.code().name == doc["status"]
        message = caught.value.details() or ""
        assert isinstance(doc["message_contains"], str)
        assert doc["message_contains"] in message, message
        fetched = await client.broker.Fetch(pb.FetchRequest(topic="vectors", partition=0))
        assert fetched.high_water_mark == 0


def _consumer_names() -> dict[str, Any]:
    doc = json.loads((VECTORS_DIR / "names" / "consumer_name.json").read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


async def _open(client: Any, consumer_name: str) -> pb.SubscribeResponse:
    opening = pb.SubscribeRequest(
        open=pb.OpenSubscription(
            topic="vectors", subscription="names", type=pb.SHARED, consumer_name=consumer_name
        )
    )
    call = client.broker.Subscribe(iter([opening]))
    try:
        async for response in call:
            return response  # type: ignore[no-any-return]
    finally:
        call.cancel()
    raise AssertionError("the stream ended without an answer")


@pytest.mark.asyncio
async def test_broker_accepts_and_refuses_the_consumer_name_vectors(tmp_path: Path) -> None:
    """Scenario: open a Subscribe (real gRPC) with each consumer name of
    names/consumer_name.json. Expected: each valid name is subscribed; each invalid one
    (a newline, CR, NUL, escape sequence, bidi override, 201 characters...) is refused
    with the vector's status and a message naming consumer_name, before anything is
    created (the subscription does not exist after the refusals alone)."""
    doc = _consumer_names()
    assert doc["field"] == "consumer_name"
    async with serving(broker_config(tmp_path / "data")) as (broker, client):
        await client.admin.CreateTopic(admin.CreateTopicRequest(name="vectors", partitions=1))
        for bad in doc["invalid"]:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await _open(client, bad["name"])
            assert caught.value.code().name == bad["status"], bad["why"]
            assert bad["message_contains"] in (caught.value.details() or ""), bad["why"]
            assert (caught.value.details() or "").isprintable(), bad["why"]
        assert broker.subscriptions.subscriptions("vectors") == []
        for name in doc["valid"]:
            response = await _open(client, name)
            assert response.subscribed.subscription == "names", name
