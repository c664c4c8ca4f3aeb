"""Cluster mode with ``[cluster] tokens`` (``headrace serve --cluster-tokens``): real
``headrace serve`` processes over a real three-member etcd check bearer tokens kept in
etcd, so a token made once with ``headrace tokens create --cluster-etcd`` works on every
broker and its revocation reaches every broker; and a cluster broker's ``/metrics``.

Also the pure rules of the switch: it needs ``etcd``, is refused together with
``[security] tokens_file`` (one source of tokens), and counts as tokens for the exposure
check.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from broker.app import check_exposure
from broker.auth.grants import make_grant
from broker.auth.rules import RULES
from broker.auth.tokens import mint
from broker.config import BrokerConfig, SecurityConfig
from broker.config_cluster import ClusterConfig, check_cluster
from broker.errors import ConfigError, InsecureListenError
from proto import admin_pb2 as _admin
from proto import admin_pb2_grpc as _admin_grpc
from tests.broker.test_cli_client import CLI
from tests.broker.test_serve_process import free_port
from tests.cluster.broker_processes import Brokers, ClusterBroker, refusal_of
from tests.cluster.etcd_harness import EtcdCluster

TOKEN = re.compile(r"hr_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")
LOCAL = ("127.0.0.1:2379",)
TOPICS = ["alpha", "beta", "gamma"]


def test_cluster_tokens_need_etcd() -> None:
    """Scenario: [cluster] tokens = true without etcd.
    Expected: ConfigError in one line saying tokens need etcd."""
    with pytest.raises(ConfigError, match=r"^\[cluster\] tokens needs etcd"):
        ClusterConfig(tokens=True)


def test_cluster_tokens_and_a_tokens_file_are_refused_together() -> None:
    """Scenario: [cluster] tokens = true with etcd, and [security] tokens_file set too.
    Expected: check_cluster refuses with one line naming both and what to drop; either
    one alone passes."""
    cluster = ClusterConfig(etcd=LOCAL, node_id="b1", tokens=True)
    with pytest.raises(ConfigError, match="two sources of tokens") as refused:
        check_cluster(cluster, "127.0.0.1:50051", insecure=False, tokens_file="t.json")
    assert "[security] tokens_file = 't.json'" in str(refused.value)
    assert "--cluster-tokens" in str(refused.value)
    assert "\n" not in str(refused.value)
    check_cluster(cluster, "127.0.0.1:50051", insecure=False)
    check_cluster(cluster.replace(tokens=False), "127.0.0.1:50051", insecure=False, tokens_file="t")


def test_serve_refuses_cluster_tokens_with_a_tokens_file(tmp_path: Path) -> None:
    """Scenario: `headrace serve --cluster-etcd ... --node-id b1 --cluster-tokens
    --tokens-file t.json` (a process), then `--cluster-tokens` alone without etcd.
    Expected: exit 2 (usage) with one line naming both sources; then exit 2 saying
    tokens need etcd; no data directory made."""
    data = tmp_path / "data"
    base = [*CLI, "serve", "--data-dir", str(data), "--metrics-listen", ""]
    both = subprocess.run(
        [*base, "--cluster-etcd", LOCAL[0], "--node-id", "b1", "--cluster-tokens",
         "--tokens-file", str(tmp_path / "t.json")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert both.returncode == 2, both.stderr
    assert "two sources of tokens" in both.stderr
    alone = subprocess.run(
        [*base, "--cluster-tokens"], capture_output=True, text=True, timeout=60, check=False
    )
    assert alone.returncode == 2, alone.stderr
    assert "[cluster] tokens needs etcd" in alone.stderr
    assert not data.exists()


@pytest.mark.parametrize(("tls", "refused"), [(False, "in clear text"), (True, None)])
def test_cluster_tokens_count_as_tokens_for_exposure(tls: bool, refused: str | None) -> None:
    """Scenario: a broker listening on 0.0.0.0 with [cluster] tokens and no tokens file,
    with and without TLS.
    Expected: without TLS refused for tokens in clear text (not for having no tokens);
    with TLS it may serve (cluster tokens protect as a tokens file does)."""
    security = SecurityConfig(tls_cert="c.pem", tls_key="k.pem") if tls else SecurityConfig()
    config = BrokerConfig(
        listen="0.0.0.0:50051",
        security=security,
        cluster=ClusterConfig(etcd=LOCAL, node_id="b1", advertise="10.0.0.1:50051", tokens=True),
    )
    if refused is None:
        check_exposure(config)
        return
    with pytest.raises(InsecureListenError, match=refused):
        check_exposure(config)


def test_a_filtered_listing_keeps_the_answering_brokers_node_id() -> None:
    """Scenario: a cluster member's ListTopics and ListSubscriptions answers (node_id b2)
    go through the token filter of a token that may see topic `a` only.
    Expected: only `a`'s rows are left, and node_id stays b2 (without it a client takes
    the answer for a single broker's and lists no other broker's topics)."""
    _, entry = mint("viewer", [make_grant("consume", "a", "*")], "2026-12-06T00:00:00Z")
    topics = _admin.ListTopicsResponse(
        topics=[_admin.TopicInfo(name="a"), _admin.TopicInfo(name="b")], node_id="b2"
    )
    rule = RULES["/headrace.v1.Admin/ListTopics"]
    assert rule.visible is not None
    seen = rule.visible(topics, entry)
    assert [t.name for t in seen.topics] == ["a"]
    assert seen.node_id == "b2"
    subscriptions = _admin.ListSubscriptionsResponse(
        subscriptions=[
            _admin.SubscriptionInfo(topic="a", subscription="s"),
            _admin.SubscriptionInfo(topic="b", subscription="s"),
        ],
        node_id="b2",
    )
    rule = RULES["/headrace.v1.Admin/ListSubscriptions"]
    assert rule.visible is not None
    seen = rule.visible(subscriptions, entry)
    assert [s.topic for s in seen.subscriptions] == ["a"]
    assert seen.node_id == "b2"


async def headrace(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``headrace ARGS`` as a process, off the event loop."""
    return await asyncio.to_thread(
        subprocess.run,
        [*CLI, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


async def list_topics(address: str, token: str | None) -> grpc.StatusCode:
    """A raw ListTopics at ``address`` with ``token`` (None: no authorization header);
    its status code."""
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    async with grpc.aio.insecure_channel(address) as channel:
        stub = _admin_grpc.AdminStub(channel)
        try:
            await stub.ListTopics(_admin.ListTopicsRequest(), metadata=metadata, timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def until_status(
    brokers: Brokers, token: str | None, code: grpc.StatusCode, within_s: float
) -> float:
    """Seconds until every broker answers ``code`` to ``token``; fails after ``within_s``."""
    start = time.monotonic()
    while True:
        got = {b.node_id: await list_topics(b.address, token) for b in brokers.all}
        if all(c == code for c in got.values()):
            return time.monotonic() - start
        assert time.monotonic() - start < within_s, f"not {code} within {within_s} s: {got}"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def brokers_with(
    root: Path,
    etcd: EtcdCluster,
    prefix: str,
    count: int,
    *extra: str,
    metrics_ports: dict[str, int] | None = None,
) -> AsyncIterator[Brokers]:
    """``count`` brokers as :func:`tests.cluster.broker_processes.cluster_brokers` starts
    them, each with ``extra`` serve flags; with ``metrics_ports`` each gets a metrics
    listener of its own, its port put there by node id."""
    brokers = [ClusterBroker(root, f"b{i + 1}", etcd, prefix) for i in range(count)]
    for broker in brokers:
        broker.command.extend(extra)
        if metrics_ports is not None:
            port = metrics_ports[broker.node_id] = free_port()
            broker.command[broker.command.index("--metrics-listen") + 1] = f"127.0.0.1:{port}"
    try:
        for broker in brokers:
            broker.spawn()
        for broker in brokers:
            await broker.wait_serving(30.0)
        yield Brokers(brokers)
    finally:
        for broker in brokers:
            with contextlib.suppress(Exception):
                broker.stop()
            broker.kill()


@pytest.fixture
def default_prefix(etcd: EtcdCluster) -> Iterator[str]:
    """The default prefix (what `tokens create --cluster-etcd` writes under), cleared
    after the test (the module's etcd is its own)."""
    yield "/headrace/"
    etcd.etcdctl("del", "--prefix", "/headrace/")


@pytest.mark.asyncio(loop_scope="function")
@pytest.mark.timeout(240)
async def test_a_token_made_in_etcd_works_on_every_broker_and_its_revocation_reaches_all(
    tmp_path: Path, etcd: EtcdCluster, default_prefix: str
) -> None:
    """Scenario: three brokers serve with --cluster-tokens (the default prefix). A call
    with no token, then `headrace tokens create --cluster-etcd` (a process) makes an admin
    token; three topics are created, produced to and consumed through the CLI with
    --token and the seed list of all three; then `headrace tokens revoke --cluster-etcd`.
    Expected: before the token, every broker answers UNAUTHENTICATED; the token is
    accepted by all three within 2 s of the create returning; the topics are owned by
    the three brokers, one each, and each CLI command exits 0 (consume prints the 5
    records); the same commands without --token exit 1; after the revoke every broker
    refuses the token (UNAUTHENTICATED) within 2 s, and the CLI with it exits 1."""
    endpoints = ",".join(etcd.endpoints)
    async with brokers_with(tmp_path, etcd, default_prefix, 3, "--cluster-tokens") as brokers:
        await until_status(brokers, None, grpc.StatusCode.UNAUTHENTICATED, 0.0)
        made = await headrace(
            "tokens", "create", "--name", "ops", "--grant", "admin:*",
            "--cluster-etcd", endpoints,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip()
        assert TOKEN.fullmatch(token)
        took = await until_status(brokers, token, grpc.StatusCode.OK, 2.0)
        assert took < 2.0

        seeds = ["--broker", brokers.seeds, "--token", token]
        for topic in TOPICS:
            created = await headrace("topics", "create", topic, "--partitions", "1", *seeds)
            assert created.returncode == 0, created.stderr
        owners = await owners_with_token(brokers, token)
        assert Counter(owners.values()) == {"b1": 1, "b2": 1, "b3": 1}
        lines = "".join(f"v{i}\n" for i in range(5))
        for topic in TOPICS:
            sent = await headrace("produce", topic, *seeds, stdin=lines)
            assert sent.returncode == 0, sent.stderr
            read = await headrace("consume", topic, "-s", "s", "--count", "5", *seeds)
            assert read.returncode == 0, read.stderr
            assert read.stdout.split() == [f"v{i}" for i in range(5)]
        anonymous = await headrace("topics", "list", "--broker", brokers.seeds)
        assert anonymous.returncode == 1
        assert len(anonymous.stderr.strip().splitlines()) == 1, anonymous.stderr

        gone = await headrace("tokens", "revoke", "ops", "--cluster-etcd", endpoints)
        assert gone.returncode == 0, gone.stderr
        took = await until_status(brokers, token, grpc.StatusCode.UNAUTHENTICATED, 2.0)
        assert took < 2.0
        after = await headrace("topics", "list", *seeds)
        assert after.returncode == 1
        assert len(after.stderr.strip().splitlines()) == 1, after.stderr


async def owners_with_token(brokers: Brokers, token: str) -> dict[str, str]:
    """Each topic's owner, once all are online, through the CLI's JSON listing."""
    deadline = time.monotonic() + 20
    while True:
        listed = await headrace(
            "topics", "list", "--json", "--broker", brokers.seeds, "--token", token
        )
        assert listed.returncode == 0, listed.stderr
        rows = json.loads(listed.stdout)
        found = {r["name"]: r.get("owner") for r in rows if not r.get("offline")}
        if all(found.get(t) for t in TOPICS):
            return {t: str(found[t]) for t in TOPICS}
        assert time.monotonic() < deadline, rows
        await asyncio.sleep(0.2)


def scrape(port: int) -> str:
    """The text of ``/metrics`` at ``port`` on loopback."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text: str = answer.read().decode()
    return text


@pytest.mark.asyncio(loop_scope="function")
@pytest.mark.timeout(180)
async def test_a_cluster_brokers_metrics_name_its_node_and_count_refusals(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: two brokers with metrics listeners; a topic placed on one of them; a
    DescribeTopic of it sent twice to the other (the non-owner).
    Expected: each /metrics has headrace_node_info with its own node id and
    headrace_cluster_session_alive 1; the non-owner's
    headrace_cluster_refusals_total{reason="not-owner"} is 2 and the owner's has no
    not-owner refusal."""
    ports: dict[str, int] = {}
    async with brokers_with(tmp_path, etcd, prefix, 2, metrics_ports=ports) as brokers:
        made = await headrace("topics", "create", "orders", "--broker", brokers.seeds)
        assert made.returncode == 0, made.stderr
        owner = await brokers.owner("orders")
        [other] = [b for b in brokers.all if b.node_id != owner]
        for _ in range(2):
            facts = await refusal_of(other.address, "orders")
            assert facts["headrace-refusal"] == "not-owner", facts
        counted = 'headrace_cluster_refusals_total{reason="not-owner"} 2.0'
        for broker in brokers.all:
            text = await asyncio.to_thread(scrape, ports[broker.node_id])
            assert f'headrace_node_info{{node_id="{broker.node_id}"}} 1.0' in text
            assert "headrace_cluster_session_alive 1.0" in text
            assert (counted in text) == (broker is other), text
