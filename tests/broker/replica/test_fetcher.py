"""Tests of :class:`broker.replica.fetcher.FollowerTopic` against a fake leader: the
Replication service on a real grpc.aio server on loopback, answering from a real leader
log (:mod:`tests.broker.replica.fake_leader`).

The topic ``orders`` has 2 partitions and 4 KiB segments, so a few hundred batches span
many segments. The leader's producer (id 7) publishes batches of 3 records. "Identical"
means every ``.log`` file of each partition directory has the same name and bytes on
both, and the leader-epoch histories are equal.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from broker.replica.fetcher import FollowerTopic
from broker.topics import Topic
from proto import replication_pb2 as pb
from tests._helpers import eventually
from tests.broker.replica.fake_leader import (
    FakeLeader,
    Publisher,
    batch,
    close_topic,
    open_topic,
    record,
    serving,
)
from tests.wal._replica import boundaries, log_bytes, log_files
from wal import Fault, FaultyFs

ROOT = Path(__file__).resolve().parents[3]


@asynccontextmanager
async def following(
    topic: Topic, port: int, epoch: int = 1, **options: Any
) -> AsyncIterator[FollowerTopic]:
    """A started follower of ``topic`` (node b2) whose leader is on ``port``."""
    settings: dict[str, Any] = {
        "credential": None,
        "max_wait_ms": 100,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.1,
        **options,
    }
    follower = FollowerTopic(
        topic,
        record(epoch),
        "b2",
        f"127.0.0.1:{port}",
        channel=grpc.aio.insecure_channel,
        **settings,
    )
    await follower.start()
    try:
        yield follower
    finally:
        await follower.aclose()


async def caught_up(follower: FollowerTopic, leader: Topic, timeout_s: float = 15.0) -> None:
    """Wait until the follower's every log is at the leader's durable end."""
    ends = {f"p/{p.index}": p.writer.durable_end for p in leader.partitions}
    await eventually(lambda: follower.fetch_offsets == ends, timeout_s)


def assert_identical(leader: Topic, follower: Topic) -> None:
    """Every partition's segment files and epoch history are the leader's."""
    for mine, theirs in zip(follower.partitions, leader.partitions, strict=True):
        assert log_files(mine.log.path) == log_files(theirs.log.path)
        assert mine.log.leader_epochs.entries() == theirs.log.leader_epochs.entries()


@pytest.mark.asyncio
async def test_a_follower_ends_byte_identical_to_its_leader(tmp_path: Path) -> None:
    """Scenario: the leader holds 150 batches per partition at epoch 1 (several
    segments); an empty follower follows it with 3 KiB fetches while the leader publishes
    50 more. Expected: the follower's segment files and epochs are the leader's, byte for
    byte; its mark is the leader's (all committed); promoted (commits released), it
    answers the producer's retry of its last batch as a duplicate at the leader's
    offsets, with no scan of the log."""
    leader = await open_topic(tmp_path / "leader")
    follower_topic = await open_topic(tmp_path / "follower")
    producer = Publisher()
    await producer.publish(leader, 1, 150)
    async with (
        serving(FakeLeader(leader, 1)) as port,
        following(follower_topic, port, max_bytes=3072) as follower,
    ):
        await producer.publish(leader, 1, 50)
        await caught_up(follower, leader)
        await eventually(lambda: follower.lag == {"p/0": 0, "p/1": 0})
    assert_identical(leader, follower_topic)
    assert follower.failures == 0
    for mine, theirs in zip(follower_topic.partitions, leader.partitions, strict=True):
        assert len(log_files(mine.log.path)) > 3
        assert mine.writer.high_water_mark == theirs.writer.durable_end
        mine.writer.release_commits()
        last = batch(7, 3 * 199)
        assert await mine.append(last) == await theirs.append(last)
        assert (await mine.append(last))[1]  # a duplicate
        assert mine.writer.head == theirs.writer.head  # nothing appended twice
    await close_topic(leader)
    await close_topic(follower_topic)


@pytest.mark.asyncio
async def test_an_extra_tail_from_an_old_epoch_is_cut_at_the_divergence(tmp_path: Path) -> None:
    """Scenario: leader and follower share 40 batches of epoch 1. The follower then led at
    epoch 2 and appended 30 batches of producer 9 that no one else has (its own tail);
    the new leader, at epoch 3, appended 20 batches of its own from the shared end. The
    follower follows at epoch 3. Expected: each log is cut exactly at the shared end (one
    truncation per partition, never below it), then catches up byte-identical with epochs
    [(1, 0), (3, shared end)]; producer 9 is forgotten (the table was rebuilt)."""
    leader = await open_topic(tmp_path / "leader")
    follower_topic = await open_topic(tmp_path / "follower")
    await Publisher().publish(leader, 1, 40)
    async with serving(FakeLeader(leader, 1)) as port, following(follower_topic, port) as f:
        await caught_up(f, leader)
    shared = [p.writer.head for p in leader.partitions]
    for p in follower_topic.partitions:
        p.writer.release_commits()
    await Publisher(9).publish(follower_topic, 2, 30)
    await Publisher(11).publish(leader, 3, 20)
    fake = FakeLeader(leader, 3)
    async with serving(fake) as port, following(follower_topic, port, epoch=3) as follower:
        await caught_up(follower, leader)
        assert follower.truncations == 2
    assert_identical(leader, follower_topic)
    for i, (p, end) in enumerate(zip(follower_topic.partitions, shared, strict=True)):
        asked = [
            (ask.fetch_offset, ask.last_fetched_epoch)
            for r in fake.requests
            for ask in r.logs
            if ask.log == f"p/{i}"
        ]
        assert asked[0] == (end + 90, 2)  # its own tail: 30 batches of 3 at epoch 2
        assert (end, 1) in asked  # cut exactly at the shared end...
        assert min(offset for offset, _ in asked) == end  # ...and never below it
        assert [tuple(e) for e in p.log.leader_epochs.entries()] == [(1, 0), (3, end)]
        assert p.producer_count == 2  # 7 and 11; 9 went with its tail
    await close_topic(leader)
    await close_topic(follower_topic)


@pytest.mark.asyncio
async def test_a_wiped_follower_re_replicates_from_the_leaders_log_start(tmp_path: Path) -> None:
    """Scenario: the leader's retention deleted its first segments (log start above 0);
    the follower's disk was wiped (an empty topic directory). Expected: the first fetch
    is out of range below the log start; each log is emptied and restarts at the
    leader's log start (one restart per partition) and catches up byte-identical: the
    same segment files from the log start, the same epochs [(1, log start)]."""
    leader = await open_topic(tmp_path / "leader")
    await Publisher().publish(leader, 1, 150)
    for p in leader.partitions:
        await p.writer.delete_before(p.log.segment_infos()[3].base_offset)
        assert p.writer.first_offset > 0
    follower_topic = await open_topic(tmp_path / "follower")
    async with serving(FakeLeader(leader, 1)) as port, following(follower_topic, port) as follower:
        await caught_up(follower, leader)
        assert follower.restarts == 2
    assert_identical(leader, follower_topic)
    for mine, theirs in zip(follower_topic.partitions, leader.partitions, strict=True):
        assert mine.writer.first_offset == theirs.writer.first_offset
        assert [e.start_offset for e in mine.log.leader_epochs.entries()] == [
            theirs.writer.first_offset
        ]
    await close_topic(leader)
    await close_topic(follower_topic)


@pytest.mark.asyncio
async def test_the_leader_killed_mid_stream_backs_off_then_resumes(tmp_path: Path) -> None:
    """Scenario: the follower catches up with 1 KiB fetches; the leader's server stops
    mid-stream for 0.6 s while the leader log grows by 50 batches, then serves again on
    the same port. Expected: while it is down the follower fails with UNAVAILABLE and
    backs off (its failures counted, far fewer than a hot loop's, its logs unchanged);
    once back it resumes from where it stopped and ends byte-identical."""
    leader = await open_topic(tmp_path / "leader")
    follower_topic = await open_topic(tmp_path / "follower")
    producer = Publisher()
    await producer.publish(leader, 1, 150)
    fake = FakeLeader(leader, 1)
    async with following(follower_topic, 0, max_bytes=1024) as follower:
        async with serving(fake) as port:
            follower.update(record(1), f"127.0.0.1:{port}")
            await eventually(lambda: follower.fetch_offsets["p/1"] > 0)
            served = follower.failures  # those before update(): no leader at port 0
        # A failure after the stop: the append in flight then (pipelined) has ended.
        await eventually(lambda: follower.failures > served)
        assert follower.lag["p/0"] > 0  # the leader's end, as last told, is ahead
        stopped_at = follower.fetch_offsets
        failures = follower.failures
        await producer.publish(leader, 1, 50)
        await asyncio.sleep(0.6)
        assert follower.fetch_offsets == stopped_at
        assert follower.last_error is not None
        assert "UNAVAILABLE" in follower.last_error
        assert 2 <= follower.failures - failures <= 40
        async with serving(fake, port):
            await caught_up(follower, leader, timeout_s=20)
            assert follower.last_error is None
    assert stopped_at["p/1"] < leader.partitions[1].writer.head
    assert_identical(leader, follower_topic)
    await close_topic(leader)
    await close_topic(follower_topic)


@pytest.mark.asyncio
async def test_update_moves_to_the_new_leader_at_once(tmp_path: Path) -> None:
    """Scenario: the follower is held in a 30 s long poll by leader A (nothing new), which
    then refuses as fenced; update() names leader B at epoch 2. Expected: the follower
    leaves A's poll at once and fetches from B at epoch 2 within a second; B's data
    arrives."""
    old = await open_topic(tmp_path / "a")
    new = await open_topic(tmp_path / "b")
    follower_topic = await open_topic(tmp_path / "follower")
    await Publisher().publish(new, 2, 10)
    a, b = FakeLeader(old, 1), FakeLeader(new, 2)
    async with (
        serving(a) as port_a,
        serving(b) as port_b,
        following(follower_topic, port_a, max_wait_ms=30_000) as follower,
    ):
        await eventually(lambda: bool(a.requests))
        a.refuse = pb.FENCED_LEADER_EPOCH
        loop = asyncio.get_running_loop()
        started = loop.time()
        follower.update(record(2, leader="b3"), f"127.0.0.1:{port_b}")
        await caught_up(follower, new, timeout_s=5)
        assert loop.time() - started < 1.0
        assert b.requests[0].leader_epoch == 2
    assert_identical(new, follower_topic)
    for topic in (old, new, follower_topic):
        await close_topic(topic)


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["aclose", "cancel"])
async def test_a_follower_stopped_mid_append_keeps_whole_batches_and_resumes(
    tmp_path: Path, how: str
) -> None:
    """Scenario: a follower copies 300 batches per partition in 1 KiB fetches and is
    stopped mid-stream: aclose(), or its task cancelled. Expected: the stop returns
    promptly; each log is a prefix of the leader's bytes ending on a batch boundary
    (checked after a reopen); a new follower resumes from that head (its first fetch
    asks for it) and ends byte-identical."""
    leader = await open_topic(tmp_path / "leader")
    await Publisher().publish(leader, 1, 300)
    follower_topic = await open_topic(tmp_path / "follower")
    fake = FakeLeader(leader, 1)
    async with serving(fake) as port:
        follower = FollowerTopic(
            follower_topic,
            record(1),
            "b2",
            f"127.0.0.1:{port}",
            channel=grpc.aio.insecure_channel,
            credential=None,
            max_bytes=1024,
        )
        await follower.start()
        await eventually(lambda: follower.fetch_offsets["p/0"] >= 90)
        if how == "cancel":
            assert follower._task is not None
            follower._task.cancel()
            await asyncio.wait([follower._task])
        async with asyncio.timeout(2):
            await follower.aclose()
        await close_topic(follower_topic)
        reopened = await open_topic(tmp_path / "follower")
        heads = [p.writer.head for p in reopened.partitions]
        for mine, theirs in zip(reopened.partitions, leader.partitions, strict=True):
            kept, full = log_bytes(mine.log.path), log_bytes(theirs.log.path)
            assert full.startswith(kept)
            assert len(kept) in boundaries(full)
            assert 0 < mine.writer.head < theirs.writer.head
        fake.requests.clear()
        async with following(reopened, port) as resumed:
            await caught_up(resumed, leader)
        first = fake.requests[0]
        assert {ask.log: ask.fetch_offset for ask in first.logs} == {
            f"p/{i}": head for i, head in enumerate(heads)
        }
    assert_identical(leader, reopened)
    await close_topic(leader)
    await close_topic(reopened)


@pytest.mark.asyncio
@pytest.mark.parametrize("progress", [6_000, 20_000, 45_000])
async def test_a_follower_killed_mid_append_leaves_whole_batches(
    tmp_path: Path, progress: int
) -> None:
    """Scenario: a follower process copies 400 batches per partition in 2 KiB fetches
    (fsync always) and is SIGKILLed once its partition 0 holds ``progress`` bytes.
    Expected: reopened, each log is a prefix of the leader's bytes ending on a batch
    boundary, its epochs the leader's (none starting past its head); a follower started
    on it resumes from its durable end and ends byte-identical."""
    leader = await open_topic(tmp_path / "leader")
    await Publisher().publish(leader, 1, 400)
    directory = tmp_path / "follower"
    async with serving(FakeLeader(leader, 1)) as port:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.broker.replica._follower_child",
            str(directory),
            str(port),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert child.stdout is not None
            assert await child.stdout.readline() == b"ready\n"
            await eventually(lambda: _log_size(directory / "0") >= progress, 20)
            os.kill(child.pid, signal.SIGKILL)
        finally:
            if child.returncode is None:
                child.kill()
            await child.wait()
        follower_topic = await open_topic(directory)
        for mine, theirs in zip(follower_topic.partitions, leader.partitions, strict=True):
            kept, full = log_bytes(mine.log.path), log_bytes(theirs.log.path)
            assert full.startswith(kept)
            assert len(kept) in boundaries(full)
            for entry in mine.log.leader_epochs.entries():
                assert entry in theirs.log.leader_epochs.entries()
        assert 0 < follower_topic.partitions[0].writer.head < leader.partitions[0].writer.head
        async with following(follower_topic, port) as follower:
            await caught_up(follower, leader)
    assert_identical(leader, follower_topic)
    await close_topic(leader)
    await close_topic(follower_topic)


def _log_size(directory: Path) -> int:
    if not directory.exists():
        return 0
    return sum(p.stat().st_size for p in directory.iterdir() if p.suffix == ".log")


@pytest.mark.asyncio
@pytest.mark.parametrize("credential", [None, "hri_" + "ab" * 32])
async def test_the_internal_credential_is_sent_as_a_bearer_token(
    tmp_path: Path, credential: str | None
) -> None:
    """Scenario: a follower made with the cluster's internal credential, or none.
    Expected: every fetch carries ``authorization: Bearer <credential>``, or no such
    metadata at all."""
    leader = await open_topic(tmp_path / "leader")
    follower_topic = await open_topic(tmp_path / "follower")
    await Publisher().publish(leader, 1, 5)
    fake = FakeLeader(leader, 1)
    async with (
        serving(fake) as port,
        following(follower_topic, port, credential=credential) as follower,
    ):
        await caught_up(follower, leader)
    expected = None if credential is None else f"Bearer {credential}"
    assert fake.authorizations
    assert set(fake.authorizations) == {expected}
    await close_topic(leader)
    await close_topic(follower_topic)


@pytest.mark.asyncio
@pytest.mark.parametrize(("copied", "own"), [(30, 0), (40, 0), (40, 10)])
async def test_records_without_epochs_are_kept_only_below_the_leaders_first_epoch(
    tmp_path: Path, copied: int, own: int
) -> None:
    """Scenario: the leader's first 40 batches predate epochs (the topic was not
    replicated then); at epoch 5 it appended 20 more (its epochs: [(5, 120)]). The
    follower holds the leader's first ``copied`` batches and ``own`` batches of its own
    after them, and no epoch entry (nothing dates them). Expected: what lies below the
    leader's first epoch start (120) is kept, byte for byte; anything past it is cut
    there (one cut per partition only when ``own``); the follower ends byte-identical
    with epochs [(5, 120)]."""
    leader = await open_topic(tmp_path / "leader")
    producer = Publisher()
    await producer.publish(leader, None, 40)
    follower_topic = await open_topic(tmp_path / "follower")
    for mine, theirs in zip(follower_topic.partitions, leader.partitions, strict=True):
        while mine.writer.head < 3 * copied:
            data = await theirs.writer.read_raw(mine.writer.head, 1, durable=True)
            await mine.writer.append_replicated(data)
        for i in range(own):
            await mine.append(batch(9, 3 * i))
        assert mine.log.leader_epochs.entries() == []
    await producer.publish(leader, 5, 20)
    async with (
        serving(FakeLeader(leader, 5)) as port,
        following(follower_topic, port, epoch=5) as follower,
    ):
        await caught_up(follower, leader)
        assert follower.truncations == (2 if own else 0)
    assert_identical(leader, follower_topic)
    for p in follower_topic.partitions:
        assert [tuple(e) for e in p.log.leader_epochs.entries()] == [(5, 120)]
    await close_topic(leader)
    await close_topic(follower_topic)


@pytest.mark.asyncio
@pytest.mark.parametrize("partial", [0, 700], ids=["nothing-written", "torn-write"])
async def test_a_full_disk_mid_stream_is_backed_off_and_healed(
    tmp_path: Path, partial: int
) -> None:
    """Scenario: the follower copies 60 batches of epoch 1 and 60 of epoch 2 per
    partition in 1 KiB fetches; from its 10th write to partition 0 the disk is full (each
    write refused, or torn after 700 bytes and cut back) for 0.3 s. Expected: the
    appends fail with DiskFullError and are backed off (partition 1 goes on), the log
    keeps whole batches only, and once space is back it catches up byte-identical, its
    epochs the leader's; promoted, it answers the producer's retry as a duplicate."""
    leader = await open_topic(tmp_path / "leader")
    producer = Publisher()
    await producer.publish(leader, 1, 60)
    await producer.publish(leader, 2, 60)
    directory = tmp_path / "follower"
    fault = Fault("pwritev", errno.ENOSPC, after=10, times=None, partial=partial)
    fs = FaultyFs(faults=[dataclasses.replace(fault, path_contains=str(directory / "0") + os.sep)])
    follower_topic = await open_topic(directory, fs=fs)
    async with serving(FakeLeader(leader, 2)) as port:
        async with following(follower_topic, port, epoch=2, max_bytes=1024) as follower:
            await eventually(lambda: follower.failures > 0)
            assert follower.last_error is not None
            assert "DiskFullError" in follower.last_error
            p1_end = leader.partitions[1].writer.durable_end
            await eventually(lambda: follower.fetch_offsets["p/1"] == p1_end)  # it goes on
            await asyncio.sleep(0.3)
            stuck = follower.fetch_offsets["p/0"]
            kept = log_bytes(follower_topic.partitions[0].log.path)
            assert len(kept) in boundaries(log_bytes(leader.partitions[0].log.path))
            fs.faults.clear()
            await caught_up(follower, leader)
        assert 0 < stuck < leader.partitions[0].writer.head
    assert_identical(leader, follower_topic)
    for mine, theirs in zip(follower_topic.partitions, leader.partitions, strict=True):
        mine.writer.release_commits()
        retry = batch(7, 3 * 119)
        assert await mine.append(retry) == await theirs.append(retry)
    await close_topic(leader)
    await close_topic(follower_topic)


class _TimedLeader(FakeLeader):
    """A :class:`FakeLeader` that notes when each fetch arrived (monotonic seconds)."""

    def __init__(self, topic: Topic, epoch: int) -> None:
        super().__init__(topic, epoch)
        self.times: list[float] = []

    async def ReplicaFetch(  # noqa: N802 - the RPC's name
        self, request: pb.ReplicaFetchRequest, context: Any
    ) -> pb.ReplicaFetchResponse:
        self.times.append(time.monotonic())
        return await super().ReplicaFetch(request, context)


@pytest.mark.asyncio
async def test_a_new_leader_still_starting_is_asked_again_within_milliseconds(
    tmp_path: Path,
) -> None:
    """Scenario: the follower (the production backoff: 50 ms base, 2 s cap) starts
    following a leader that answers NOT_LEADER, as the winner of an election does until
    it has begun its epoch; then the leader serves.
    Expected: the follower asks again every ~10 ms, not after 25-50, 50-100, 100-200,
    200-400 ms (its first five fetches within 0.3 s, where the backoff needs at least
    0.375 s); once the leader serves it catches up; its usual backoff applies after
    STARTING_RETRIES quick tries (a broker that never leads is not asked in a hot loop)."""
    leader = await open_topic(tmp_path / "leader")
    follower_topic = await open_topic(tmp_path / "follower")
    await Publisher().publish(leader, 1, 5)
    fake = _TimedLeader(leader, 1)
    fake.refuse = pb.NOT_LEADER
    async with (
        serving(fake) as port,
        following(follower_topic, port, backoff_base_s=0.05, backoff_max_s=2.0) as follower,
    ):
        await eventually(lambda: len(fake.times) >= 5, 5)
        assert fake.times[4] - fake.times[0] < 0.3, fake.times
        fake.refuse = None
        await caught_up(follower, leader, timeout_s=5)
        assert follower.last_error is None
        fake.refuse = pb.NOT_LEADER  # it led and no longer does: the usual backoff
        asked = len(fake.requests)
        await asyncio.sleep(0.4)
        assert len(fake.requests) - asked <= 6  # 10 ms retries would make ~30
    assert_identical(leader, follower_topic)
    await close_topic(leader)
    await close_topic(follower_topic)
