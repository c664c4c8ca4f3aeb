"""The cluster's configuration defaults: their rules (the TOML file's, key by key), the
precedence a broker applies, and the document in a real three-member etcd
(:class:`cluster.config_defaults.EtcdDefaults`, :class:`cluster.config_defaults.DefaultsView`)
with ``headrace cluster config`` as a real process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.cluster_defaults import BUILTIN, KEYS, TABLES, TopicDefaults, parse_value
from broker.errors import ConfigError
from cluster.config_defaults import DefaultsView, EtcdDefaults, defaults_key
from cluster.etcd import EtcdStore
from cluster.records import DefaultsRecord, Keys
from cluster.replicas import replication_settings
from tests.broker.test_cli_client import CLI
from tests.cluster.etcd_harness import EtcdCluster
from wal import LogConfig
from wal.config import FsyncPolicy


def test_every_key_names_its_file_table() -> None:
    """Scenario: the document's keys and the broker's table of their file tables.
    Expected: the same keys in the same order (one list, no key without its rule), and
    the document's key is under the prefix."""
    assert tuple(TABLES) == KEYS
    assert Keys("/p/").config_defaults == defaults_key(Keys("/p/")) == "/p/config/defaults"


@pytest.mark.parametrize(
    ("key", "text", "value"),
    [
        ("default_partitions", "1", 1),
        ("default_partitions", "10_000", 10_000),
        ("auto_create_topics", "false", False),
        ("retention_ms", "86400000", 86_400_000),
        ("retention_bytes", "1", 1),
        ("fsync", "interval", "interval"),
        ("fsync_interval_ms", "3600000", 3_600_000),
        ("replication_factor", "3", 3),
        ("min_insync_replicas", "64", 64),
    ],
)
def test_a_good_value_is_taken_in_toml_spelling(key: str, text: str, value: object) -> None:
    """Scenario: KEY=VALUE as typed, at the edges of each key's range.
    Expected: the typed value (an int, a bool, a policy's name)."""
    assert parse_value(key, text) == value


@pytest.mark.parametrize(
    ("key", "text", "says"),
    [
        ("default_partitions", "0", "default_partitions = 0: must be an integer from 1 to 10000"),
        ("default_partitions", "10001", "from 1 to 10000"),
        ("default_partitions", "true", "default_partitions = True"),
        ("auto_create_topics", "1", "auto_create_topics must be true or false"),
        ("retention_ms", "0", "retention_ms = 0: must be an integer >= 1"),
        ("fsync", "sometimes", "fsync = 'sometimes': must be one of always, interval, never"),
        ("fsync_interval_ms", "3600001", "from 1 to 3600000"),
        ("replication_factor", "0", "replication_factor = 0: must be an integer from 1 to 64"),
        ("min_insync_replicas", "65", "min_insync_replicas = 65: must be an integer from 1 to 64"),
        ("segment_bytes", "1024", "unknown setting segment_bytes; known: default_partitions"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_key_and_range(
    key: str, text: str, says: str
) -> None:
    """Scenario: a value the TOML file would refuse for that key, or a key that is not a
    cluster default. Expected: ConfigError, one line, naming the key and what is allowed
    (the file's own words)."""
    with pytest.raises(ConfigError) as refused:
        parse_value(key, text)
    assert says in str(refused.value)
    assert "\n" not in str(refused.value)


def test_the_cluster_default_wins_over_the_file_and_unset_gives_the_file_back() -> None:
    """Scenario: a broker whose file says 2 partitions, auto-create on, fsync always,
    retention 1 h; the cluster sets 5 partitions, auto-create off, fsync never.
    Expected: the cluster's values (the file's retention kept, as the cluster does not
    set it); after an empty document, the file's values again."""
    file_wal = LogConfig(retention_ms=3_600_000)
    defaults = TopicDefaults(2, True, file_wal)
    record = DefaultsRecord(default_partitions=5, auto_create_topics=False, fsync="never")
    assert defaults.apply(record) == []
    assert (defaults.default_partitions, defaults.auto_create_topics) == (5, False)
    assert defaults.wal.fsync is FsyncPolicy.NEVER
    assert defaults.wal.retention_ms == 3_600_000
    assert defaults.apply(DefaultsRecord()) == []
    assert (defaults.default_partitions, defaults.auto_create_topics) == (2, True)
    assert defaults.wal == file_wal


def test_replication_defaults_are_the_clusters_else_the_built_in_one() -> None:
    """Scenario: a broker's defaults with no cluster document, then a document setting
    replication_factor 1 and min_insync_replicas 1, then one written by hand with factor 0.
    Expected: issue 37's built-in 3 and 2, then 1 and 1, then the bad key left out, named,
    and the built-in factor 3 again beside the document's min_insync 1."""
    defaults = TopicDefaults(2, False, LogConfig())
    assert (defaults.replication_factor, defaults.min_insync_replicas) == (3, 2)
    assert BUILTIN == {"replication_factor": 3, "min_insync_replicas": 2}
    assert defaults.apply(DefaultsRecord(replication_factor=1, min_insync_replicas=1)) == []
    assert (defaults.replication_factor, defaults.min_insync_replicas) == (1, 1)
    messages = defaults.apply(DefaultsRecord(replication_factor=0, min_insync_replicas=1))
    assert len(messages) == 1
    assert "replication_factor = 0" in messages[0]
    assert (defaults.replication_factor, defaults.min_insync_replicas) == (3, 1)


@pytest.mark.parametrize(
    ("live", "expected"),
    [(5, (3, 2)), (3, (3, 2)), (2, (2, 2)), (1, (1, 1))],
)
def test_the_built_in_replication_defaults_on_clusters_of_each_size(
    live: int, expected: tuple[int, int]
) -> None:
    """Scenario: a topic created with neither factor nor min_insync, no cluster document,
    on a cluster with ``live`` brokers alive. Expected: 3 copies, 2 in sync for a
    publish, from three brokers up; two brokers make 2 copies that must both be in sync;
    a lone cluster broker makes 1 copy, min_insync 1."""
    defaults = TopicDefaults(1, False, LogConfig())
    got = replication_settings(
        None, None, defaults.replication_factor, defaults.min_insync_replicas, live
    )
    assert got == expected


def test_a_stored_value_out_of_range_is_left_out_and_named() -> None:
    """Scenario: a document written by hand with default_partitions 0 and fsync never.
    Expected: the bad key is left out (the file's value applies), named in the message;
    the good key applies."""
    defaults = TopicDefaults(2, False, LogConfig())
    messages = defaults.apply(DefaultsRecord(default_partitions=0, fsync="never"))
    assert len(messages) == 1
    assert "default_partitions = 0" in messages[0]
    assert defaults.default_partitions == 2
    assert defaults.wal.fsync is FsyncPolicy.NEVER


async def until(check: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until ``check()`` holds (polled every 10 ms); fails after ``timeout_s``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, f"not within {timeout_s} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


@pytest.mark.asyncio
async def test_changes_by_cas_reach_a_watching_view(store: EtcdStore, prefix: str) -> None:
    """Scenario: a view watches the defaults of an empty cluster; two writers set keys at
    once, then one key is unset. Expected: both writers' keys are kept (compare-and-set,
    none lost); the view sees each change within 2 s; after the unset the key is gone
    from the document and the view."""
    keys = Keys(prefix)
    seen: list[DefaultsRecord] = []
    view = DefaultsView(store, keys, seen.append)
    await view.start()
    try:
        assert view.record == DefaultsRecord()
        defaults = EtcdDefaults(store, keys)
        await asyncio.gather(
            defaults.change({"default_partitions": 4}), defaults.change({"fsync": "never"})
        )
        both = DefaultsRecord(default_partitions=4, fsync="never")
        assert await defaults.read() == both
        await until(lambda: view.record == both, 2.0)
        await defaults.change({}, ["fsync"])
        await until(lambda: view.record == DefaultsRecord(default_partitions=4), 2.0)
        raw = await store.get(defaults_key(keys))
        assert raw is not None
        assert json.loads(raw.value) == {"default_partitions": 4}
        assert seen[-1] == DefaultsRecord(default_partitions=4)
    finally:
        await view.aclose()


@pytest.mark.asyncio
async def test_a_document_that_does_not_decode_keeps_the_last_good_one(
    store: EtcdStore, prefix: str
) -> None:
    """Scenario: a view holds {default_partitions: 3}; someone writes a value that is not
    a defaults document (an unknown key). Expected: the view keeps {default_partitions: 3}
    and goes on watching: a good document written after it is seen. A change over a
    document that does not decode replaces it (the way to repair it)."""
    keys = Keys(prefix)
    await EtcdDefaults(store, keys).change({"default_partitions": 3})
    view = DefaultsView(store, keys)
    await view.start()
    try:
        assert view.record == DefaultsRecord(default_partitions=3)
        await store.put(defaults_key(keys), b'{"partitions_default": 3}')
        await asyncio.sleep(0.3)
        assert view.record == DefaultsRecord(default_partitions=3)
        await store.put(defaults_key(keys), b'{"fsync": "interval"}')
        await until(lambda: view.record == DefaultsRecord(fsync="interval"), 2.0)
        await store.put(defaults_key(keys), b"not json")
        stored = await EtcdDefaults(store, keys).change({"retention_bytes": 5})
        assert stored == DefaultsRecord(retention_bytes=5)
        await until(lambda: view.record == stored, 2.0)
    finally:
        await view.aclose()


def cli_config(root: Path, etcd: EtcdCluster, prefix: str) -> str:
    """A broker TOML file naming the test's etcd and prefix (what ``--config`` reads)."""
    path = root / "cli.toml"
    endpoints = ", ".join(f'"{e}"' for e in etcd.endpoints)
    path.write_text(f'[cluster]\netcd = [{endpoints}]\nnode_id = "cli"\nprefix = "{prefix}"\n')
    return str(path)


def config_cli(config: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``headrace cluster config ARGS --config CONFIG`` as a process."""
    return subprocess.run(
        [*CLI, "cluster", "config", *args, "--config", config],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def shown(config: str) -> dict[str, Any]:
    done = config_cli(config, "show", "--json")
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def test_the_cli_sets_shows_and_unsets_and_refuses_a_bad_value_whole(
    tmp_path: Path, etcd: EtcdCluster, prefix: str
) -> None:
    """Scenario: `headrace cluster config` (real processes) on a cluster without defaults:
    show; set two keys; set a good and a bad key together; unset one; show as a table.
    Expected: show --json names every key, null when unset; the set exits 0 and show lists
    both; the bad set exits 1 with one line naming the key and its range and changes
    nothing (not even the good key); unset exits 0 and show has the key null again; the
    table says '-' for an unset key, and built-in 3 and 2 for the replication keys."""
    config = cli_config(tmp_path, etcd, prefix)
    assert shown(config) == dict.fromkeys(KEYS)
    done = config_cli(config, "set", "default_partitions=3", "fsync=never")
    assert done.returncode == 0, done.stderr
    assert shown(config) == {**dict.fromkeys(KEYS), "default_partitions": 3, "fsync": "never"}
    bad = config_cli(config, "set", "retention_ms=1000", "default_partitions=0")
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "Error: cluster default default_partitions = 0: must be an integer from 1 to 10000"
    ]
    assert shown(config)["retention_ms"] is None
    assert config_cli(config, "unset", "fsync").returncode == 0
    assert shown(config) == {**dict.fromkeys(KEYS), "default_partitions": 3}
    table = config_cli(config, "show").stdout.splitlines()
    assert table[0].split() == ["key", "value", "over"]
    assert ["default_partitions", "3", "broker"] in [line.split() for line in table]
    assert ["fsync", "-", "wal"] in [line.split() for line in table]
    assert ["replication_factor", "-", "built-in", "3"] in [line.split() for line in table]
    assert ["min_insync_replicas", "-", "built-in", "2"] in [line.split() for line in table]
