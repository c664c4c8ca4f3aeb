"""The Cluster service: a single broker answers Lookup and ClusterStatus as node
``local``, over real gRPC on loopback; another source's views reach the wire whole."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

from broker.app import Broker
from broker.cluster_service import lookup_response, status_response
from broker.config import SecurityConfig
from broker.config_cluster import ClusterConfig
from cluster.answers import BrokerEntry, LookupResult, Route
from cluster.answers import EndpointEntry as Endpoint
from cluster.answers import OfflineTopic as Offline
from cluster.answers import StatusResult as Status
from proto import admin_pb2 as admin
from proto import cluster_pb2 as cluster
from tests.broker.auth.test_interceptor import bearer, make_tokens
from tests.broker.conftest import Client, broker_config, serving


class Stub:
    """The Cluster service's two RPCs on a channel (typed; the generated stub is not)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.Lookup = channel.unary_unary(
            "/headrace.v1.Cluster/Lookup",
            request_serializer=cluster.LookupRequest.SerializeToString,
            response_deserializer=cluster.LookupResponse.FromString,
        )
        self.ClusterStatus = channel.unary_unary(
            "/headrace.v1.Cluster/ClusterStatus",
            request_serializer=cluster.ClusterStatusRequest.SerializeToString,
            response_deserializer=cluster.ClusterStatusResponse.FromString,
        )


@pytest.mark.asyncio
async def test_a_single_broker_owns_every_topic_it_holds(tmp_path: Path) -> None:
    """Scenario: a single broker with topics orders (3 partitions) and audit (1); Lookup
    of orders, nothing, audit and orders again, then Lookup of every topic. Expected: one
    route per asked name in order: orders and audit owned by 'local' at this broker's
    bound address, epoch 0, ready, online, with their partitions, 'local' their one
    replica and in-sync set, min_insync 1; 'nothing' absent with no owner; every topic
    by name when none is asked; one broker, 'local', alive, owning 2 topics and 4
    partitions; answered by node 'local', controller 'local'; revision 0."""
    async with serving(broker_config(tmp_path / "data")) as (broker, client):
        for name, partitions in (("orders", 3), ("audit", 1)):
            await client.admin.CreateTopic(
                admin.CreateTopicRequest(name=name, partitions=partitions)
            )
        stub = Stub(client.channel)
        here = f"127.0.0.1:{broker.port}"
        answer = await stub.Lookup(
            cluster.LookupRequest(topics=["orders", "nothing", "audit", "orders"])
        )
        orders = cluster.TopicRoute(
            topic="orders", owner_node="local", owner_address=here, epoch=0, state="ready",
            online=True, partitions=3, replicas=["local"], isr=["local"], min_insync=1,
        )  # fmt: skip
        audit = cluster.TopicRoute(
            topic="audit", owner_node="local", owner_address=here, state="ready", online=True,
            partitions=1, replicas=["local"], isr=["local"], min_insync=1,
        )  # fmt: skip
        nothing = cluster.TopicRoute(topic="nothing", state="absent")
        assert list(answer.routes) == [orders, nothing, audit, orders]
        assert (answer.node_id, answer.controller, answer.revision) == ("local", "local", 0)
        (me,) = answer.brokers
        assert (me.node_id, me.address, me.alive, me.topics, me.partitions) == (
            "local", here, True, 2, 4,
        )  # fmt: skip
        assert me.session_age_s >= 0
        every = await stub.Lookup(cluster.LookupRequest())
        assert [r.topic for r in every.routes] == ["audit", "orders"]


@pytest.mark.asyncio
async def test_a_single_broker_status_has_no_etcd_and_nothing_offline(tmp_path: Path) -> None:
    """Scenario: ClusterStatus of a single broker with one topic. Expected: node and
    controller 'local', no cluster id, one live broker with 1 topic, no etcd endpoint, no
    offline topic."""
    async with serving(broker_config(tmp_path / "data")) as (_, client):
        await client.admin.CreateTopic(admin.CreateTopicRequest(name="orders", partitions=2))
        status = await Stub(client.channel).ClusterStatus(cluster.ClusterStatusRequest())
        assert (status.node_id, status.cluster_id, status.controller) == ("local", "", "local")
        assert [(b.node_id, b.alive, b.topics, b.partitions) for b in status.brokers] == [
            ("local", True, 1, 2)
        ]
        assert (list(status.etcd), list(status.offline_topics), status.revision) == ([], [], 0)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("topics", "field"),
    [(["orders", ""], "topics[1]"), (["a/b"], "topics[0]"), (["x" * 201], "topics[0]")],
)
async def test_an_invalid_name_in_a_lookup_is_invalid_argument(
    tmp_path: Path, topics: list[str], field: str
) -> None:
    """Scenario: a Lookup naming an empty, a slashed and a 201-character topic name.
    Expected: INVALID_ARGUMENT naming topics[i] (no route can exist for it)."""
    async with serving(broker_config(tmp_path / "data")) as (_, client):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await Stub(client.channel).Lookup(cluster.LookupRequest(topics=topics))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (caught.value.details() or "").startswith(field + ":")


class TwoBrokers:
    """A ClusterSource of cluster's own types (:mod:`cluster.answers`)."""

    b1 = BrokerEntry("b1", "10.0.0.1:50051", True, 1, 3, 12.5)
    b2 = BrokerEntry("b2", "10.0.0.2:50051", False, 1, 1, 0.0)

    async def lookup(self, topics: Sequence[str]) -> LookupResult:
        route = Route("orders", "b2", "10.0.0.2:50051", 7, "ready", False, 1, "offline")
        return LookupResult("b1", (route,), (self.b1, self.b2), "b1", 1234)

    async def status(self) -> Status:
        return Status(
            "b1",
            "c0ffee",
            (self.b1, self.b2),
            "b1",
            (Endpoint("10.0.0.9:2379", False, "connection refused"),),
            (Offline("orders", "b2", "offline", "broker b2 is down; it comes back by itself"),),
            1234,
        )


@pytest.mark.asyncio
async def test_another_source_reaches_the_wire_whole(tmp_path: Path) -> None:
    """Scenario: a broker given a source with two brokers (b2 down), an offline topic and
    an unhealthy etcd endpoint. Expected: Lookup and ClusterStatus carry every field as
    the source gave it (the converters drop nothing)."""
    source = TwoBrokers()
    async with (
        Broker(broker_config(tmp_path / "data"), cluster=source) as broker,
        grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel,
    ):
        stub = Stub(channel)
        answer = await stub.Lookup(cluster.LookupRequest(topics=["orders"]))
        assert answer == lookup_response(await source.lookup(["orders"]))
        assert answer.routes[0].reason == "offline"
        assert answer.revision == 1234
        status = await stub.ClusterStatus(cluster.ClusterStatusRequest())
        assert status == status_response(await source.status())
        assert status.etcd[0].error == "connection refused"
        assert status.offline_topics[0].message.startswith("broker b2 is down")
        assert [b.session_age_s for b in status.brokers] == [12.5, 0.0]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("listen", "advertise", "expected"),
    [
        ("0.0.0.0:0", None, "{host}:{port}"),
        ("0.0.0.0:0", "broker.example:50051", "broker.example:50051"),
        ("127.0.0.1:0", None, "127.0.0.1:{port}"),
    ],
)
async def test_a_single_broker_names_an_address_clients_can_call(
    tmp_path: Path, listen: str, advertise: str | None, expected: str
) -> None:
    """Scenario: a single broker listening on every interface (with --insecure), with
    and without [cluster] advertise, and one on loopback. Expected: its route and broker
    entry name the advertised address when set, this host's name with the bound port on
    a wildcard listen, else the listen host with the bound port; never 0.0.0.0."""
    config = broker_config(
        tmp_path / "data",
        listen=listen,
        security=SecurityConfig(insecure=True),
        cluster=ClusterConfig(advertise=advertise),
    )
    async with (
        Broker(config) as broker,
        grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel,
    ):
        await Client(channel).admin.CreateTopic(admin.CreateTopicRequest(name="o", partitions=1))
        answer = await Stub(channel).Lookup(cluster.LookupRequest(topics=["o"]))
    want = expected.format(host=socket.gethostname(), port=broker.port)
    assert answer.routes[0].owner_address == want
    assert answer.brokers[0].address == want


@pytest.mark.asyncio
async def test_with_tokens_lookup_needs_one_and_shows_only_granted_topics(
    tmp_path: Path,
) -> None:
    """Scenario: a broker with a tokens file and topics orders and secret; Lookup of both
    with no token, and with a token that may consume orders only. Expected:
    UNAUTHENTICATED without a token; with it, only the orders route (the secret one is
    left out, not refused); ClusterStatus answers it too."""
    tokens = tmp_path / "tokens.json"
    token = make_tokens(tokens, {"reader": "consume:orders"})["reader"]
    config = broker_config(tmp_path / "data", security=SecurityConfig(tokens_file=str(tokens)))
    admin_token = make_tokens(tokens, {"root": "admin:*"})["root"]
    async with (
        Broker(config) as broker,
        grpc.aio.insecure_channel(f"127.0.0.1:{broker.port}") as channel,
    ):
        for name in ("orders", "secret"):
            await Client(channel).admin.CreateTopic(
                admin.CreateTopicRequest(name=name, partitions=1), metadata=bearer(admin_token)
            )
        stub = Stub(channel)
        request = cluster.LookupRequest(topics=["orders", "secret"])
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Lookup(request)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answer = await stub.Lookup(request, metadata=bearer(token))
        assert [r.topic for r in answer.routes] == ["orders"]
        status = await stub.ClusterStatus(cluster.ClusterStatusRequest(), metadata=bearer(token))
        assert status.node_id == "local"
