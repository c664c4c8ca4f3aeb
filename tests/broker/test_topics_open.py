"""TopicRegistry.open: every partition of every topic opens concurrently, all or nothing."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import broker.partition
from broker.partition import Partition
from broker.topics import TopicRegistry
from wal import FileSystem, Log, LogConfig, WalIOError, encode_columns

TOPICS = {"a": 3, "b": 2, "c": 1}


async def fill(data_dir: Path) -> dict[tuple[str, int], int]:
    """Create the topics; partition p of each gets p + 1 batches from producer 100 + p; the
    registry closes as after a crash (no closing snapshot). Returns each head."""
    registry = TopicRegistry(str(data_dir), LogConfig())
    await registry.open()
    heads = {}
    for name, partitions in TOPICS.items():
        topic = await registry.create(name, partitions)
        for p in topic.partitions:
            for seq in range(p.index + 1):
                await p.append(encode_columns([name.encode()], producer_id=100, base_sequence=seq))
            heads[(name, p.index)] = p.log.head
            await p.writer.aclose()
    return heads


@pytest.mark.asyncio
async def test_partitions_open_concurrently_and_each_rebuilds_its_own_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: three topics with six partitions, reopened with ``open_concurrency`` 3;
    each rebuild waits at a barrier of three threads. Expected: the barrier is passed (three
    rebuilds ran at the same time: one at a time would break it on its timeout), every
    partition sits in its place with its own head, and its producer state is its own: the
    retry of its last batch is a duplicate at its own offset."""
    heads = await fill(tmp_path)
    barrier = threading.Barrier(3, timeout=10)
    met: list[bool] = []
    real = broker.partition._rebuild

    def rebuild(log: Log, snapshot: str, fs: FileSystem, now_ms: int, cap: int) -> object:
        if len(met) < 3:  # the first three to arrive: the other three open later
            met.append(True)
            barrier.wait()
        return real(log, snapshot, fs, now_ms, cap)

    monkeypatch.setattr(broker.partition, "_rebuild", rebuild)
    registry = TopicRegistry(str(tmp_path), LogConfig(), open_concurrency=3)
    await registry.open()
    try:
        assert registry.names() == sorted(TOPICS)
        for (name, index), head in heads.items():
            p = registry.get(name).partition(index)
            assert (p.index, p.log.head) == (index, head)
            again = encode_columns([name.encode()], producer_id=100, base_sequence=index)
            result, duplicate = await p.append(again)
            assert (result.first_offset, duplicate) == (index, True)
    finally:
        await registry.aclose()
    assert not barrier.broken


@pytest.mark.asyncio
async def test_a_partition_that_fails_to_open_closes_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scenario: partition 1 of topic ``a`` cannot be opened (its directory is a file).
    Expected: ``open`` raises that partition's error, and every partition that did open
    was closed again (nothing left running)."""
    await fill(tmp_path)
    broken = tmp_path / "topics" / "a" / "1"
    for child in broken.iterdir():
        child.unlink()
    broken.rmdir()
    broken.write_bytes(b"not a directory")
    closed: list[int] = []
    real_aclose = Partition.aclose

    async def aclose(self: Partition) -> None:
        closed.append(self.index)
        await real_aclose(self)

    monkeypatch.setattr(Partition, "aclose", aclose)
    registry = TopicRegistry(str(tmp_path), LogConfig(), open_concurrency=2)
    with pytest.raises(WalIOError):
        await registry.open()
    assert sorted(closed) == [0, 0, 0, 1, 2]  # a/0 a/2 b/0 b/1 c/0
    assert registry.names() == []
