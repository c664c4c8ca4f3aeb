"""A full disk and other I/O errors, end to end over real gRPC on loopback.

Claims (issue 14, B and C):

- a publish that finds the disk full fails with ``RESOURCE_EXHAUSTED``, saying the disk is
  full and naming the segment file; it is counted in ``headrace_publish_disk_full_requests_total``;
- meanwhile fetches, subscription streams and acks are served, and nothing acknowledged is
  lost; a subscription state save that fails leaves the old file whole and is retried;
- once space is freed the broker accepts publishes again by itself, without a restart, and
  every acknowledged record reads back byte for byte, also after a restart;
- other I/O errors reach clients as ``UNAVAILABLE`` with the file and the cause.

The first test is deterministic (:class:`wal.FaultyFs` fills and frees the "disk"); the
last runs a real ``headrace serve`` on a 4 MiB tmpfs (root only; skipped otherwise).
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.app import Broker
from broker.error_status import status_for
from broker.metrics import BrokerMetrics
from dispatcher.cursor_recovery import read_states
from proto import admin_pb2 as admin
from proto import admin_pb2_grpc, broker_pb2_grpc
from proto import broker_pb2 as pb
from tests._helpers import eventually
from tests.broker.conftest import Client, broker_config, serving
from tests.broker.test_serve_process import _serve_child, free_port, wait_serving
from tests.broker.test_service import batch, create, fetched_values
from wal import DiskFullError, Fault, FaultyFs, WalIOError


def value(i: int) -> bytes:
    """A payload that names its record and has some bulk."""
    return b"record-%06d:" % i + bytes([i % 251]) * 200


async def _requests(
    queue: asyncio.Queue[pb.SubscribeRequest],
) -> AsyncIterator[pb.SubscribeRequest]:
    while True:
        yield await queue.get()


def _saved_cursor(data: Path) -> int:
    """The cursor of subscription ``s`` of topic ``t`` as saved on disk."""
    return read_states(str(data / "subscriptions"), "t")["s"].partitions[0].cursor


@pytest.mark.asyncio
async def test_full_disk_rejects_publishes_serves_the_rest_and_recovers_by_itself(
    tmp_path: Path,
) -> None:
    """Scenario: 5 records published and a subscription stream opened; then every write to the
    disk fails with ENOSPC; 3 publishes, a fetch and a stream ack arrive; then space is
    freed and one more record is published; then the broker restarts. Expected: the 3
    publishes fail with RESOURCE_EXHAUSTED naming the full disk and the segment file
    and are counted; the fetch returns the 5 records; the ack's save fails, leaves what
    was saved whole (no temp file left) and is counted as a failed cursor flush; a
    commit (AckUpTo, saved before its reply) fails with RESOURCE_EXHAUSTED naming the
    cursor journal; after freeing, the publish is acknowledged at offset 5 with no
    restart, the stream delivers it, the ack is saved by a later flush, the commit
    succeeds, the flush time and the journal's size are exported; after the restart all
    6 records read back byte for byte and both saved cursors hold."""
    data = tmp_path / "data"
    fs, metrics = FaultyFs(), BrokerMetrics()
    config = broker_config(data, cursor_flush_interval_ms=20)
    async with (
        Broker(config, fs=fs, metrics=metrics) as running,
        grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel,
    ):
        client = Client(channel)
        await create(client, "t")
        for i in range(5):
            await client.broker.Publish(pb.PublishRequest(topic="t", batch=batch(value(i))))
        queue: asyncio.Queue[pb.SubscribeRequest] = asyncio.Queue()
        queue.put_nowait(
            pb.SubscribeRequest(
                open=pb.OpenSubscription(topic="t", subscription="s", initial_credit=100)
            )
        )
        call = client.broker.Subscribe(_requests(queue))
        assert (await call.read()).subscribed.partitions == 1
        seen: list[tuple[int, bytes]] = []
        while len(seen) < 5:
            seen += fetched_values(pb.FetchResponse(batches=[(await call.read()).delivery.batch]))
        assert _saved_cursor(data) == 0
        commit = pb.AckUpToRequest(topic="t", subscription="spark", offset=1)
        assert (await client.broker.AckUpTo(commit)).cursor == 1

        fs.faults.append(Fault("pwritev", error=errno.ENOSPC, times=None))  # the disk fills
        for _ in range(3):
            await _rejected(
                client.broker.Publish(pb.PublishRequest(topic="t", batch=batch(b"x"))),
                data / "topics" / "t" / "0",
            )
        assert metrics.publish_disk_full.labels("t", "0")._value.get() == 3
        got = await client.broker.Fetch(pb.FetchRequest(topic="t", offset=0))
        assert fetched_values(got) == [(i, value(i)) for i in range(5)]
        assert got.high_water_mark == 5
        before = fs.faults[0].seen
        queue.put_nowait(pb.SubscribeRequest(ack=pb.Acks(ranges=[pb.OffsetRange(begin=0, end=5)])))
        await eventually(lambda: fs.faults[0].seen > before + 1)  # flushes tried, and failed
        assert _saved_cursor(data) == 0
        failed = _metric(metrics, "headrace_cursor_flush_failures_total")
        assert failed >= 1
        commit = pb.AckUpToRequest(topic="t", subscription="spark", offset=3)
        # a commit is saved before its reply
        await _rejected(
            client.broker.AckUpTo(commit), data / "subscriptions" / "t" / "cursors.journal"
        )
        assert not [p for p in (data / "subscriptions" / "t").iterdir() if p.name.endswith(".tmp")]

        fs.faults.clear()  # space freed
        done = await client.broker.Publish(pb.PublishRequest(topic="t", batch=batch(value(5))))
        assert (done.base_offset, done.last_offset) == (5, 5)
        delivered = fetched_values(pb.FetchResponse(batches=[(await call.read()).delivery.batch]))
        assert delivered == [(5, value(5))]
        await eventually(lambda: _saved_cursor(data) == 5)
        assert (await client.broker.AckUpTo(commit)).cursor == 3
        assert _metric(metrics, "headrace_cursor_flush_failures_total") >= failed
        assert _metric(metrics, "headrace_cursor_flush_seconds_count") >= 1
        journal = data / "subscriptions" / "t" / "cursors.journal"
        assert _metric(metrics, "headrace_cursor_journal_bytes", topic="t") == (
            journal.stat().st_size
        )
        call.cancel()

    async with serving(config) as (_, client):
        got = await client.broker.Fetch(pb.FetchRequest(topic="t", offset=0))
        assert fetched_values(got) == [(i, value(i)) for i in range(6)]
        for name, cursor in [("s", 5), ("spark", 3)]:
            described = await client.admin.DescribeSubscription(
                admin.DescribeSubscriptionRequest(topic="t", subscription=name)
            )
            assert described.partitions[0].cursor == cursor


def _metric(metrics: BrokerMetrics, name: str, **labels: str) -> float:
    """The value of one sample on ``metrics``'s exposition, read by the Prometheus parser."""
    text = generate_latest(metrics.registry).decode()
    [value] = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and s.labels == labels
    ]
    return value


async def _rejected(call: Awaitable[object], where: Path) -> None:
    """``call`` fails with RESOURCE_EXHAUSTED, saying the disk is full and naming ``where``."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "disk is full" in (info.value.details() or "")
    assert str(where) in (info.value.details() or "")


@pytest.mark.parametrize(
    ("error", "code", "words"),
    [
        pytest.param(
            DiskFullError("append", "/d/t/0/00.log", errno.ENOSPC),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            ["/d/t/0/00.log", "disk is full", "ENOSPC"],
            id="disk-full",
        ),
        pytest.param(
            WalIOError("save DLQ state", "/d/dlq/t/s/state.json", errno.ENOSPC, "no space"),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            ["/d/dlq/t/s/state.json", "disk is full"],
            id="wal-io-error-that-is-a-full-disk",
        ),
        pytest.param(
            OSError(errno.ENOSPC, "No space left on device", "/d/subscriptions/t/s.json.tmp"),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            ["/d/subscriptions/t/s.json.tmp", "disk is full"],
            id="bare-oserror-full-disk",
        ),
        pytest.param(
            WalIOError("read", "/d/t/0", errno.EIO, "Input/output error (EIO)"),
            grpc.StatusCode.UNAVAILABLE,
            ["/d/t/0", "Input/output error"],
            id="wal-io-error",
        ),
        pytest.param(
            OSError(errno.EROFS, "Read-only file system", "/d/subscriptions/t/s.json.tmp"),
            grpc.StatusCode.UNAVAILABLE,
            ["/d/subscriptions/t/s.json.tmp", "Read-only file system", "EROFS"],
            id="bare-oserror",
        ),
    ],
)
def test_io_errors_have_a_status_and_a_message_naming_file_and_cause(
    error: BaseException, code: grpc.StatusCode, words: list[str]
) -> None:
    """Scenario: I/O errors as the servicers meet them. Expected: a full disk is
    RESOURCE_EXHAUSTED, any other I/O error UNAVAILABLE (never INTERNAL), and the message
    names the file and the cause."""
    got_code, message = status_for(error)
    assert got_code == code
    for word in words:
        assert word in message
    assert "\n" not in message


# -- a real broker on a real, small filesystem -------------------------------------------


@pytest.fixture
def small_fs() -> Iterator[Path]:
    """A fresh 4 MiB tmpfs, unmounted afterwards; skips when it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    mount = Path(tempfile.mkdtemp(prefix="headrace-4m-"))
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if made.returncode != 0:
        mount.rmdir()
        pytest.skip(f"cannot mount a tmpfs: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        shutil.rmtree(mount, ignore_errors=True)


def test_real_broker_on_a_full_tmpfs_rejects_then_accepts_again(small_fs: Path) -> None:
    """Scenario: `headrace serve` on a 4 MiB tmpfs with a 1 MiB ballast file; a producer
    publishes 8 KiB records over gRPC until one fails; a consumer fetches; the ballast is
    deleted; the producer publishes again. Expected: the failure is RESOURCE_EXHAUSTED
    saying the disk is full; the fetch returns every acknowledged record byte for byte;
    after the ballast is gone the next publish is acknowledged right after the last one,
    with the same broker process (no restart), which still answers health checks."""
    ballast = small_fs / "ballast"
    ballast.write_bytes(b"\1" * (1 << 20))
    port = free_port()
    proc = _serve_child(small_fs / "data", port)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            _fill_consume_free_publish(broker_pb2_grpc.BrokerStub(channel), channel, ballast)
        assert proc.poll() is None, "the broker exited"
        wait_serving(port, time.monotonic() + 5)
    finally:
        proc.terminate()
        proc.wait(20)


def _fill_consume_free_publish(
    stub: broker_pb2_grpc.BrokerStub, channel: grpc.Channel, ballast: Path
) -> None:
    admin_pb2_grpc.AdminStub(channel).CreateTopic(admin.CreateTopicRequest(name="t", partitions=1))
    acked: list[bytes] = []
    failure: grpc.RpcError | None = None
    for i in range(2000):  # 16 MiB: far more than fits
        data = b"%06d" % i + bytes([i % 251]) * 8186
        try:
            stub.Publish(pb.PublishRequest(topic="t", batch=batch(data)), timeout=10)
        except grpc.RpcError as exc:
            failure = exc
            break
        acked.append(data)
    assert failure is not None, "the disk never filled"
    assert failure.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, failure.details()
    assert "disk is full" in (failure.details() or "")
    assert len(acked) > 10
    fetched: list[tuple[int, bytes]] = []
    while len(fetched) < len(acked):
        got = stub.Fetch(pb.FetchRequest(topic="t", offset=len(fetched)), timeout=10)
        fetched += fetched_values(got)
    assert fetched == list(enumerate(acked))
    ballast.unlink()
    done = stub.Publish(pb.PublishRequest(topic="t", batch=batch(b"after")), timeout=10)
    assert done.base_offset == len(acked)
    got = stub.Fetch(pb.FetchRequest(topic="t", offset=len(acked)), timeout=10)
    assert fetched_values(got) == [(len(acked), b"after")]
