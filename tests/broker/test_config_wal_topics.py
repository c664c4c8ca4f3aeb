"""``[wal.topics.<name>]``: a topic's own log settings (its fsync policy, segment size,
retention) over ``[wal]``, in the config file and in a running broker. The bad tables
are tested with every other bad config file, in test_config.py."""

from __future__ import annotations

import collections
import os
from pathlib import Path

import pytest

from broker.app import Broker
from broker.config import BrokerConfig
from broker.errors import ConfigError
from client import AsyncAdminClient, AsyncProducer
from tests.broker.conftest import broker_config
from tests.client.conftest import address
from wal import FaultyFs, FsyncPolicy, LogConfig
from wal.config import HEADER_LIMITS

CONFIG = """
[wal]
fsync = "always"
segment_bytes = 1048576

[wal.topics.metrics]
fsync = "never"
retention_ms = 86400000

[wal.topics."audit.log"]
segment_bytes = 65536
"""


def test_a_topic_table_overrides_wal_and_inherits_the_rest(tmp_path: Path) -> None:
    """Scenario: ``[wal]`` and two topic tables. Expected: each topic's settings are
    ``[wal]`` with its own keys set; a topic without a table has ``[wal]``'s; the header
    limits of ``[limits]`` apply to every topic."""
    path = tmp_path / "headrace.toml"
    path.write_text(CONFIG + "[limits]\nmax_headers_per_record = 8\n", encoding="utf-8")
    config = BrokerConfig.from_toml(str(path))
    limits = {name: getattr(config.limits, name) for name in HEADER_LIMITS}
    assert limits["max_headers_per_record"] == 8
    assert config.log_config == LogConfig(segment_bytes=1 << 20, **limits)
    assert config.topic_log_configs == {
        "metrics": LogConfig(
            segment_bytes=1 << 20, fsync=FsyncPolicy.NEVER, retention_ms=86_400_000, **limits
        ),
        "audit.log": LogConfig(segment_bytes=65_536, **limits),
    }


def test_wal_topics_given_in_code_are_checked() -> None:
    """Scenario: a BrokerConfig built in code with a bad topic name. Expected:
    ConfigError naming it."""
    with pytest.raises(ConfigError, match="'a b' is not a valid topic name"):
        BrokerConfig(wal_topics={"a b": LogConfig()})


class _CountingFs(FaultyFs):
    """The real file system (no faults set), counting fdatasync calls per file."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: collections.Counter[str] = collections.Counter()

    def fdatasync(self, fd: int) -> None:
        self.syncs[self.path_of(fd)] += 1
        super().fdatasync(fd)

    def log_syncs(self, topic: str) -> int:
        """fdatasync calls on the ``.log`` files of ``topic``'s partitions."""
        marker = f"{os.sep}topics{os.sep}{topic}{os.sep}"
        return sum(n for p, n in self.syncs.items() if marker in p and p.endswith(".log"))


@pytest.mark.asyncio(loop_scope="function")
async def test_each_topic_is_synced_under_its_own_policy(tmp_path: Path) -> None:
    """Scenario: a broker whose ``[wal]`` fsync is ``always``, with ``[wal.topics.fast]``
    fsync ``never``; 20 acknowledged publishes to each of ``fast`` (created at run time)
    and ``safe``. Expected: ``safe``'s log was fdatasynced before each ack (at least once
    per publish); ``fast``'s never after it was created, while its records are all there;
    create, describe and list say each topic's policy."""
    config = broker_config(tmp_path / "data").replace(
        wal_topics={"fast": LogConfig(segment_bytes=64 << 10, fsync=FsyncPolicy.NEVER)}
    )
    fs = _CountingFs()
    async with Broker(config, fs=fs) as broker:
        async with AsyncAdminClient(address(broker)) as admin:
            created = await admin.create_topic("fast", 1)
            await admin.create_topic("safe", 1)
            described = await admin.describe_topic("safe")
            listed = {t.name: t.fsync for t in await admin.list_topics()}
        assert (created.fsync, described.fsync) == ("never", "always")
        assert listed == {"fast": "never", "safe": "always"}
        before = {t: fs.log_syncs(t) for t in ("fast", "safe")}  # creating a segment syncs
        async with AsyncProducer(address(broker)) as producer:
            for i in range(20):
                await producer.publish("fast", b"f%d" % i)
                await producer.publish("safe", b"s%d" % i)
        assert broker.topics.wal_config("fast").fsync is FsyncPolicy.NEVER
        assert broker.topics.wal_config("safe").fsync is FsyncPolicy.ALWAYS
        assert fs.log_syncs("fast") - before["fast"] == 0
        assert fs.log_syncs("safe") - before["safe"] >= 20
        heads = [broker.topics.get(t).partitions[0].writer.head for t in ("fast", "safe")]
        assert heads == [20, 20]
