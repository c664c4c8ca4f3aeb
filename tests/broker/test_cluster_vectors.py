"""The cluster conformance vectors (docs/protocol/vectors/cluster/) agree with the broker.

For each refusal vector, a real broker whose ownership refuses with the vector's refusal
answers a Publish and a Subscribe with its status, details and exactly its trailers, and
a PublishStream request with its response; a client reading those trailers back decides
the vector's action. The Lookup vector parses as a LookupResponse, the broker answers it
as written, and each route's pick is the vector's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from broker.app import Broker
from broker.error_status import status_for, trailers_for
from broker.errors import TopicRefusedError
from cluster.answers import BrokerEntry, LookupResult, Route
from cluster.ownership import Refusal
from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from proto import cluster_pb2 as cluster
from proto.cluster_vectors import CLUSTER, REFUSALS, lookup_example
from proto.refusal import action, from_trailers, route_action
from proto.vectors import VECTORS_DIR
from tests.broker.conftest import Client, broker_config

FOLDER = VECTORS_DIR / CLUSTER
REFUSAL_FILES = sorted(FOLDER.glob("refusal_*.json"))


def load(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def refusal_of(doc: dict[str, Any]) -> Refusal:
    r = doc["refusal"]
    return Refusal(
        r["reason"], r["topic"], r["owner_node"], r["owner_address"], r["owner_epoch"],
        r["message"],
    )  # fmt: skip


class Refusing:
    """An Ownership that refuses every topic with one refusal."""

    def __init__(self, refusal: Refusal) -> None:
        self.refusal_given = refusal

    def refusal(self, topic: str, *, write: bool) -> Refusal | None:
        return self.refusal_given


@asynccontextmanager
async def refusing_broker(tmp_path: Path, refusal: Refusal) -> AsyncIterator[Client]:
    async with (
        Broker(broker_config(tmp_path / "data"), ownership=Refusing(refusal)) as broker,
        grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel,
    ):
        client = Client(channel)
        await client.admin.CreateTopic(admin.CreateTopicRequest(name="orders", partitions=1))
        yield client


def test_there_is_a_vector_per_reason() -> None:
    """Scenario: the refusal vectors on disk. Expected: one per case written by
    proto.cluster_vectors (the check in tests/test_vectors.py keeps them current), and
    every reason of the spec appears in one."""
    assert [p.name for p in REFUSAL_FILES] == sorted(f"refusal_{c.name}.json" for c in REFUSALS)
    reasons = {load(p)["refusal"]["reason"] for p in REFUSAL_FILES}
    assert reasons == {
        "not-owner", "offline", "no-session", "data-missing", "creating", "not-enough-replicas"
    }  # fmt: skip


@pytest.mark.parametrize("path", REFUSAL_FILES, ids=lambda p: p.stem)
def test_the_status_table_gives_what_the_vector_says(path: Path) -> None:
    """Scenario: the broker's error table on the vector's refusal. Expected: ABORTED (the
    vector's status and number), its message, and exactly its trailers in its order."""
    doc = load(path)
    exc = TopicRefusedError(refusal_of(doc))
    code, message = status_for(exc)
    assert (code.name, code.value[0], message) == (
        doc["status"], doc["status_code"], doc["refusal"]["message"],
    )  # fmt: skip
    assert [list(t) for t in trailers_for(exc)] == doc["trailers"]


def trailers_in_order(exc: grpc.aio.AioRpcError) -> list[list[str]]:
    return [
        [k, v if isinstance(v, str) else v.decode()]
        for k, v in exc.trailing_metadata() or ()
        if k.startswith("headrace-")
    ]


@pytest.mark.asyncio
@pytest.mark.parametrize("path", REFUSAL_FILES, ids=lambda p: p.stem)
async def test_a_real_broker_answers_as_the_vector_says(tmp_path: Path, path: Path) -> None:
    """Scenario: a broker refusing with the vector's refusal gets a Publish, a Subscribe
    open and a PublishStream request. Expected: the unary call and the stream open end
    with the vector's status, message and trailers; the stream request's response is the
    vector's publish_stream_response (the stream stays open); a client that reads the
    trailers back decides the vector's action and retry address."""
    doc = load(path)
    async with refusing_broker(tmp_path, refusal_of(doc)) as c:
        request = pb.PublishRequest(topic="orders", partition=0, records=[pb.Record(value=b"x")])
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await c.broker.Publish(request)
        call = c.broker.Subscribe()
        await call.write(
            pb.SubscribeRequest(open=pb.OpenSubscription(topic="orders", subscription="s"))
        )
        with pytest.raises(grpc.aio.AioRpcError) as opened:
            await call.read()
        for caught in (unary.value, opened.value):
            assert caught.code().name == doc["status"]
            assert caught.details() == doc["refusal"]["message"]
            assert trailers_in_order(caught) == doc["trailers"]
        stream = c.broker.PublishStream()
        await stream.write(request)
        response = await stream.read()
        await stream.done_writing()
        assert json_format.MessageToDict(
            response, preserving_proto_field_name=True
        ) == without_defaults(doc["publish_stream_response"])
    received = from_trailers([(k, v) for k, v in trailers_in_order(unary.value)])
    assert received is not None
    todo = action(received)
    assert todo.value == doc["client"]["action"]
    assert (received.owner_address if todo.value == "redirect" else "") == doc["client"]["retry_at"]


def without_defaults(doc: dict[str, Any]) -> dict[str, Any]:
    """A message's JSON with the fields proto3 JSON leaves out (0, "") left out, int64
    as a string: how MessageToDict prints it."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            out[key] = without_defaults(value)
        elif value not in (0, ""):
            out[key] = str(value) if key == "owner_epoch" else value
    return out


def test_the_lookup_vector_parses_and_each_pick_follows_the_rule() -> None:
    """Scenario: the Lookup vector's response parsed as proto3 JSON. Expected: the
    LookupResponse proto.cluster_vectors wrote; each pick is route_action of its route:
    call the online route's owner, not-found for the absent one, backoff otherwise."""
    doc = load(FOLDER / "lookup.json")
    parsed = json_format.ParseDict(doc["response"], cluster.LookupResponse())
    assert parsed == lookup_example()[1]
    assert [p["action"] for p in doc["picks"]] == ["call", "backoff", "backoff", "not-found"]
    for route, pick in zip(parsed.routes, doc["picks"], strict=True):
        todo = route_action(
            state=route.state, online=route.online, owner_address=route.owner_address
        )
        assert (route.topic, todo.value) == (pick["topic"], pick["action"])
        assert pick["address"] == (route.owner_address if todo.value == "call" else "")


class VectorSource:
    """A ClusterSource answering with the Lookup vector's routes and brokers."""

    def __init__(self, response: cluster.LookupResponse) -> None:
        self.response = response

    async def lookup(self, topics: Sequence[str]) -> LookupResult:
        r = self.response
        return LookupResult(
            r.node_id,
            tuple(
                Route(x.topic, x.owner_node, x.owner_address, x.epoch, x.state, x.online,
                      x.partitions, x.reason, replicas=tuple(x.replicas), isr=tuple(x.isr),
                      min_insync=x.min_insync)
                for x in r.routes
            ),
            tuple(
                BrokerEntry(b.node_id, b.address, b.alive, b.topics, b.partitions,
                            b.session_age_s)
                for b in r.brokers
            ),
            r.controller,
            r.revision,
        )  # fmt: skip

    async def status(self) -> Any:
        raise NotImplementedError


@pytest.mark.asyncio
async def test_a_real_broker_answers_the_lookup_vector(tmp_path: Path) -> None:
    """Scenario: a broker whose cluster source holds the vector's view gets the vector's
    Lookup request. Expected: the answer, in proto3 JSON, is the vector's response."""
    request, response = lookup_example()
    async with (
        Broker(broker_config(tmp_path / "data"), cluster=VectorSource(response)) as broker,
        grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel,
    ):
        lookup = channel.unary_unary(
            "/headrace.v1.Cluster/Lookup",
            request_serializer=cluster.LookupRequest.SerializeToString,
            response_deserializer=cluster.LookupResponse.FromString,
        )
        answer = await lookup(request)
    doc = load(FOLDER / "lookup.json")
    assert answer == json_format.ParseDict(doc["response"], cluster.LookupResponse())
