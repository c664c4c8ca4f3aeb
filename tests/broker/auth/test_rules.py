"""The authorization table: every RPC of every service has a row, and rows check what
they say."""

from __future__ import annotations

import re

import pytest

from broker.auth.grants import Grant, Role, parse_grant
from broker.auth.rules import OPEN_SERVICES, RULES, authorize, service_of
from broker.auth.tokens import TokenEntry
from broker.errors import PermissionDeniedError
from proto import admin_pb2 as admin
from proto import broker_pb2 as pb
from proto import cluster_pb2 as cluster
from proto import replication_pb2 as replication


def every_rpc() -> list[str]:
    """Full method names of every RPC in the Broker, Admin, Cluster and Replication service
    descriptors."""
    return [
        f"/{service.full_name}/{method.name}"
        for module in (pb, admin, cluster, replication)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


def test_every_rpc_has_a_row_and_every_row_an_rpc() -> None:
    """Scenario: walk every service's descriptor. Expected: each RPC has a row in RULES
    (an RPC added to a .proto without one fails here) and no row names a missing RPC."""
    rpcs = every_rpc()
    assert len(rpcs) >= 20
    assert sorted(set(rpcs) - set(RULES)) == []
    assert sorted(set(RULES) - set(rpcs)) == []


def test_no_service_of_ours_is_open() -> None:
    """Scenario: the open services. Expected: only health and reflection, none of ours."""
    assert {service_of(m) for m in every_rpc()} & OPEN_SERVICES == set()
    assert all(s.startswith("grpc.") for s in OPEN_SERVICES)


def entry(*grants: Grant) -> TokenEntry:
    return TokenEntry("ab12ab12ab12", "etl", "0" * 64, grants, "2026-11-24T08:00:00Z")


B, A = "/headrace.v1.Broker/", "/headrace.v1.Admin/"
ORDERS = Grant(Role.CONSUME, "orders", "billing")
CASES = [
    (B + "Publish", pb.PublishRequest(topic="orders"), Grant(Role.PRODUCE, "orders"), ORDERS,
     "lacks role produce on topic 'orders'"),
    (B + "PublishStream", pb.PublishRequest(topic="orders"), Grant(Role.PRODUCE, "ord*"),
     Grant(Role.PRODUCE, "other"), "lacks role produce on topic 'orders'"),
    (B + "Subscribe", pb.SubscribeRequest(open=pb.OpenSubscription(topic="orders",
     subscription="billing")), ORDERS, Grant(Role.CONSUME, "orders", "audit"),
     "lacks role consume on subscription 'orders/billing'"),
    (B + "Fetch", pb.FetchRequest(topic="orders"), ORDERS, Grant(Role.PRODUCE, "orders"),
     "lacks role consume on topic 'orders'"),
    (B + "AckUpTo", pb.AckUpToRequest(topic="orders", subscription="billing"), ORDERS,
     Grant(Role.CONSUME, "orders", "x"), "lacks role consume on subscription 'orders/billing'"),
    (A + "CreateTopic", admin.CreateTopicRequest(name="orders"), Grant(Role.ADMIN, "*"),
     Grant(Role.PRODUCE, "*"), "lacks role admin on topic 'orders'"),
    (A + "DeleteTopic", admin.DeleteTopicRequest(name="orders"), Grant(Role.ADMIN, "orders"),
     ORDERS, "lacks role admin on topic 'orders'"),
    (A + "DescribeTopic", admin.DescribeTopicRequest(name="orders"), Grant(Role.PRODUCE,
     "orders"), Grant(Role.ADMIN, "other"), "lacks role produce or consume on topic 'orders'"),
    (A + "Seek", admin.SeekRequest(topic="orders", subscription="billing"), ORDERS,
     Grant(Role.PRODUCE, "orders"), "lacks role consume on subscription 'orders/billing'"),
    (A + "PurgeDeadLetters", admin.PurgeDeadLettersRequest(topic="orders",
     subscription="billing"), Grant(Role.ADMIN, "orders"), ORDERS,
     "lacks role admin on subscription 'orders/billing'"),
]  # fmt: skip


@pytest.mark.parametrize(("method", "request_", "allowed", "denied", "message"), CASES)
def test_rows_check_role_and_resource(
    method: str, request_: object, allowed: Grant, denied: Grant, message: str
) -> None:
    """Scenario: a request checked against its RPC's row with a grant that covers it and
    one that does not (wrong role, topic or subscription). Expected: the first passes; the
    second raises PermissionDeniedError naming the token, the role and the resource."""
    rule = RULES[method]
    authorize(rule, entry(allowed), request_)
    with pytest.raises(PermissionDeniedError, match=re.escape(message)) as caught:
        authorize(rule, entry(denied), request_)
    assert "token 'etl' (hr_ab12ab12ab12_…)" in str(caught.value)


@pytest.mark.parametrize(
    ("role", "hint"),
    [
        ("admin", "(`headrace tokens create ... --grant admin:PATTERN`)"),
        (
            "produce or consume",
            "(`headrace tokens create ... --grant produce:PATTERN` or `--grant consume:PATTERN`)",
        ),
    ],
)
def test_the_hint_is_a_grant_that_parses(role: str, hint: str) -> None:
    """Scenario: a refusal needing one role, and one that any of two roles would lift
    (DescribeTopic). Expected: the hint shows one well-formed ``--grant ROLE:PATTERN`` per
    role (never ``--grant produce or consume:PATTERN``), each of which parse_grant accepts."""
    message = str(PermissionDeniedError("etl", "ab12ab12ab12", role, "topic", "orders"))
    assert message.endswith("; ask an admin for a grant " + hint)
    grants = re.findall(r"--grant (\S+?)`", message)
    assert len(grants) == len(role.split(" or "))
    for grant in grants:
        parse_grant(grant.replace("PATTERN", "orders"))


def test_list_subscriptions_of_a_named_topic_needs_a_grant_on_it() -> None:
    """Scenario: ListSubscriptions naming topic 'secret', and naming none, with a token
    that has grants on orders only. Expected: refused for 'secret' (so the answer cannot
    tell whether it exists), allowed with no topic (then filtered)."""
    token = entry(ORDERS)
    rule = RULES[A + "ListSubscriptions"]
    with pytest.raises(PermissionDeniedError, match="on topic 'secret'"):
        authorize(rule, token, admin.ListSubscriptionsRequest(topic="secret"))
    authorize(rule, token, admin.ListSubscriptionsRequest())
    authorize(rule, token, admin.ListSubscriptionsRequest(topic="orders"))


def test_subscribe_credits_and_acks_need_no_grant_of_their_own() -> None:
    """Scenario: a Subscribe credit request (after the open was checked). Expected: no
    resource, so no refusal even for a token without a consume grant."""
    authorize(
        RULES[B + "Subscribe"], entry(Grant(Role.PRODUCE, "x")), pb.SubscribeRequest(credit=5)
    )


def test_list_answers_show_only_what_the_token_may_see() -> None:
    """Scenario: ListTopics and ListSubscriptions answers filtered for a token with consume
    on orders/billing and produce on audit. Expected: topics orders and audit (not secret);
    only the subscription orders/billing (not orders/ops, not audit/x)."""
    token = entry(ORDERS, Grant(Role.PRODUCE, "audit"))
    topics = admin.ListTopicsResponse(
        topics=[admin.TopicInfo(name=n) for n in ("orders", "secret", "audit")]
    )
    visible = RULES[A + "ListTopics"].visible
    assert visible is not None
    assert [t.name for t in visible(topics, token).topics] == ["orders", "audit"]
    subs = admin.ListSubscriptionsResponse(
        subscriptions=[
            admin.SubscriptionInfo(topic=t, subscription=s)
            for t, s in (("orders", "billing"), ("orders", "ops"), ("audit", "x"))
        ]
    )
    visible = RULES[A + "ListSubscriptions"].visible
    assert visible is not None
    got = visible(subs, token).subscriptions
    assert [(s.topic, s.subscription) for s in got] == [("orders", "billing")]


def test_cluster_answers_show_only_the_topics_the_token_may_see() -> None:
    """Scenario: a Lookup answer with routes of orders, secret and audit, and a
    ClusterStatus answer with secret and orders offline, filtered for a token with grants
    on orders and audit. Expected: the routes of orders and audit, in order, and only
    orders offline; brokers, controller and revision unchanged; anyone with a token may
    call both (no resource)."""
    token = entry(ORDERS, Grant(Role.PRODUCE, "audit"))
    broker = cluster.BrokerInfo(node_id="b1", address="10.0.0.1:50051", alive=True)
    lookup = cluster.LookupResponse(
        routes=[
            cluster.TopicRoute(topic=n, owner_node="b1") for n in ("orders", "secret", "audit")
        ],
        brokers=[broker],
        controller="b1",
        revision=42,
    )
    rule = RULES["/headrace.v1.Cluster/Lookup"]
    authorize(rule, entry(), cluster.LookupRequest(topics=["secret"]))
    assert rule.visible is not None
    got = rule.visible(lookup, token)
    assert [r.topic for r in got.routes] == ["orders", "audit"]
    assert (list(got.brokers), got.controller, got.revision) == ([broker], "b1", 42)
    status = cluster.ClusterStatusResponse(
        node_id="b1",
        brokers=[broker],
        offline_topics=[
            cluster.OfflineTopic(topic=n, reason="offline") for n in ("secret", "orders")
        ],
    )
    rule = RULES["/headrace.v1.Cluster/ClusterStatus"]
    authorize(rule, entry(), cluster.ClusterStatusRequest())
    assert rule.visible is not None
    shown = rule.visible(status, token)
    assert [t.topic for t in shown.offline_topics] == ["orders"]
    assert (shown.node_id, list(shown.brokers)) == ("b1", [broker])


def test_internal_rows_are_exactly_the_replication_service() -> None:
    """Scenario: the rows marked internal (only the brokers' internal credential passes
    them). Expected: exactly the Replication service's RPCs, and no other row is."""
    internal = {m for m, rule in RULES.items() if rule.internal}
    assert internal == {m for m in every_rpc() if service_of(m) == "headrace.v1.Replication"}
    assert len(internal) == 3  # ReplicaFetch, ReplicaStream, OffsetForLeaderEpoch
