"""Tokens in etcd (cluster mode): `headrace tokens --cluster-etcd` as real processes, and
each broker's watched view of them (:class:`broker.auth.cluster_tokens.EtcdTokenSource`)
on a real three-member etcd."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.auth.cluster_tokens import EtcdTokenSource, open_token_source, to_record
from broker.auth.grants import make_grant
from broker.auth.tokens import TokenSet, mint
from broker.config_cluster import ClusterConfig
from broker.errors import AuthenticationError
from cluster.errors import TokenError
from cluster.etcd import EtcdStore
from cluster.records import Keys
from cluster.tokens import EtcdTokens, token_key
from tests.broker.test_cli_client import CLI
from tests.cluster.etcd_harness import EtcdCluster

TOKEN = re.compile(r"hr_[0-9a-f]{12}_[A-Za-z0-9_-]{43}")
pytestmark = pytest.mark.asyncio


async def headrace(*args: str) -> subprocess.CompletedProcess[str]:
    """``headrace ARGS`` as a process, off the event loop."""
    return await asyncio.to_thread(
        subprocess.run, [*CLI, *args], capture_output=True, text=True, timeout=60, check=False
    )


async def until(check: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until ``check()`` holds (polled every 10 ms); fails after ``timeout_s``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


def accepts(source: EtcdTokenSource, token: str) -> bool:
    try:
        source.current().authenticate(token)
    except AuthenticationError:
        return False
    return True


def revoked(source: EtcdTokenSource, token: str) -> bool:
    try:
        source.current().authenticate(token)
    except AuthenticationError as exc:
        return exc.reason == "revoked"
    return False


async def test_a_token_made_once_works_on_every_broker_and_its_revocation_reaches_all(
    etcd: EtcdCluster, tmp_path: Path
) -> None:
    """Scenario: two brokers' token views, each on its own etcd member, watch a cluster
    (its own prefix, from a --config); `headrace tokens create --config` (a process) makes
    a token; then `headrace tokens revoke` revokes it.
    Expected: both views accept the token within 2 s of the create returning, etcd holds
    its hash and never its secret, `tokens list --json` shows it; after the revoke both
    refuse it as revoked within 2 s, and the list shows it revoked."""
    prefix = "/headrace-tokens-test/"
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[cluster]\netcd = {json.dumps(etcd.endpoints)}\nnode_id = "cli"\nprefix = "{prefix}"\n'
    )
    keys = Keys(prefix)
    stores = [await EtcdStore.connect([e]) for e in (etcd.endpoints[0], etcd.endpoints[2])]
    brokers = [EtcdTokenSource(store, keys) for store in stores]
    try:
        for broker in brokers:
            assert await broker.start() == 0
        made = await headrace(
            "tokens", "create", "--name", "etl", "--grant", "consume:orders.*",
            "--config", str(config),
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        token = made.stdout.strip()
        assert TOKEN.fullmatch(token)
        assert "it is shown only this once" in made.stderr
        for broker in brokers:
            took = await until(lambda b=broker: accepts(b, token), 2.0)  # type: ignore[misc]
            assert took < 2.0
        entry = brokers[1].current().authenticate(token)
        assert entry.name == "etl"
        assert str(entry.grants[0]) == "consume:orders.*"
        stored = etcd.etcdctl("get", "--prefix", prefix)
        assert token.split("_")[2] not in stored
        assert token not in stored
        assert entry.sha256 in stored
        listed = await headrace("tokens", "list", "--json", "--config", str(config))
        assert [(t["name"], t["revoked"]) for t in json.loads(listed.stdout)] == [("etl", False)]

        gone = await headrace("tokens", "revoke", "etl", "--config", str(config))
        assert gone.returncode == 0, gone.stderr
        assert gone.stdout.startswith(f"revoked token 'etl' (hr_{entry.id}_")
        for broker in brokers:
            took = await until(lambda b=broker: revoked(b, token), 2.0)  # type: ignore[misc]
            assert took < 2.0
        again = await headrace("tokens", "revoke", entry.id, "--config", str(config))
        assert "(it was already revoked)" in again.stdout
        listed = await headrace("tokens", "list", "--config", str(config))
        assert "etl" in listed.stdout
        assert "revoked" in listed.stdout
    finally:
        for broker in brokers:
            await broker.aclose()
        await stores[0].delete_prefix(prefix)
        for store in stores:
            await store.aclose()


async def test_cluster_etcd_flag_uses_the_default_prefix(etcd: EtcdCluster) -> None:
    """Scenario: `tokens create --cluster-etcd` with every endpoint, then a second create
    of the same name through one member.
    Expected: the token's key is under /headrace/tokens/; the second create fails with
    exit code 1 and one line saying the name exists; list shows one token."""
    endpoints = ",".join(etcd.endpoints)
    try:
        first = await headrace(
            "tokens", "create", "--name", "ops", "--role", "admin", "--topics", "*",
            "--cluster-etcd", endpoints,
        )  # fmt: skip
        assert first.returncode == 0, first.stderr
        token_id = first.stdout.strip()[3:15]
        assert etcd.etcdctl("get", "--print-value-only", f"/headrace/tokens/{token_id}")
        second = await headrace(
            "tokens", "create", "--name", "ops", "--grant", "admin:*",
            "--cluster-etcd", etcd.endpoints[2],
        )  # fmt: skip
        assert second.returncode == 1
        assert "a token named 'ops' exists" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        listed = await headrace("tokens", "list", "--json", "--cluster-etcd", endpoints)
        assert [t["id"] for t in json.loads(listed.stdout)] == [token_id]
    finally:
        etcd.etcdctl("del", "--prefix", "/headrace/")


async def test_two_creates_of_one_name_at_once_make_one_token(
    store: EtcdStore, prefix: str
) -> None:
    """Scenario: 8 tasks create a token named `race` at the same moment (distinct ids).
    Expected: exactly one succeeds; the other 7 get TokenError naming the name; etcd
    holds one token key."""
    tokens = EtcdTokens(store, Keys(prefix))
    grant = make_grant("produce", "x", "*")
    entries = [mint("race", [grant], "2026-12-06T00:00:00Z")[1] for _ in range(8)]
    results = await asyncio.gather(
        *(tokens.create(to_record(e)) for e in entries), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, TokenError)]
    assert len([r for r in results if r is None]) == 1
    assert len(errors) == 7
    assert all("'race' exists" in str(e) for e in errors)
    listed = await tokens.list()
    assert len(listed) == 1
    winner = listed[0].id
    assert await store.get(token_key(Keys(prefix), winner)) is not None


async def test_a_bad_record_is_left_out_and_the_others_stay(store: EtcdStore, prefix: str) -> None:
    """Scenario: a broker's view holds a good token; someone puts a record with a bad
    grant role, then one that is not JSON, by hand.
    Expected: the good token keeps authenticating; the view holds one token."""
    keys = Keys(prefix)
    token, entry = mint("good", [make_grant("admin", "*", "*")], "2026-12-06T00:00:00Z")
    await EtcdTokens(store, keys).create(to_record(entry))
    source = EtcdTokenSource(store, keys)
    await source.start()
    try:
        await store.put(
            token_key(keys, "0123456789ab"),
            json.dumps({"id": "0123456789ab", "name": "bad", "sha256": "0" * 64,
                        "grants": [{"role": "root", "topics": "*"}],
                        "created": "x"}).encode(),
        )  # fmt: skip
        await store.put(token_key(keys, "ba0123456789"), b"not json")
        await asyncio.sleep(0.3)
        assert isinstance(source.current(), TokenSet)
        assert len(source.current()) == 1
        assert source.current().authenticate(token).name == "good"
    finally:
        await source.aclose()


async def test_a_source_opened_from_the_cluster_config_owns_its_connection(
    etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: open_token_source([cluster] etcd = every member, the test's prefix), as a
    broker would at start; a token is created through another connection; the source is
    closed.
    Expected: the source starts with 0 tokens, accepts the new token within 2 s, and
    after aclose (which closes its own connection) the last set stays in force."""
    cluster = ClusterConfig(etcd=tuple(etcd.endpoints), node_id="b1", prefix=prefix)
    source = await open_token_source(cluster)
    assert len(source.current()) == 0
    async with await EtcdStore.connect(etcd.endpoints) as other:
        token, entry = mint("svc", [make_grant("produce", "*", "*")], "2026-12-06T00:00:00Z")
        await EtcdTokens(other, Keys(prefix)).create(to_record(entry))
        try:
            await until(lambda: accepts(source, token), 2.0)
        finally:
            await source.aclose()
        assert source.current().authenticate(token).name == "svc"
        await other.delete_prefix(prefix)
