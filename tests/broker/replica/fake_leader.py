"""A fake leader for the follower's tests: the Replication service on a real grpc.aio
server on loopback, answering from a real leader log (``broker.replica.leader`` is not
used, so the follower's tests stand on their own).

It answers as the proto says (docs/protocol.md, "Replication between brokers"): the
whole fetch is refused for another topic or epoch; per log, the KIP-320 divergence check
first, then out of range, then the durable batches from the fetch offset (up to
``max_bytes`` over all logs, one whole batch at least), the leader's epoch entries at or
after the asked epoch, its high watermark (its durable end: no followers counted), log
start and end; a fetch with nothing to send waits for a durable append up to
``max_wait_ms``. ``refuse`` makes every fetch answer that error instead; ``requests``
keeps every fetch received, ``reports`` every progress report (``ReplicaStream``'s
``progress_only`` messages, which are not answered).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc

from broker.partition import Partition
from broker.replica.service import fetch_stream
from broker.topics import Topic
from cluster.records import TopicRecord, TopicState
from proto import replication_pb2 as pb
from proto import replication_pb2_grpc as pb_grpc
from proto.batch import encode_columns, restamp
from wal import FileSystem, LogConfig

Context = grpc.aio.ServicerContext[Any, Any]
TOPIC = "orders"
TOPIC_ID = "9f0c1d2e3a4b5c6d"
#: Small segments, so a few hundred batches span many of them.
CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=512)


def record(epoch: int, leader: str = "b1") -> TopicRecord:
    """The record of ``orders`` led by ``leader`` at ``epoch``, replicas b1 and b2."""
    return TopicRecord(
        TOPIC,
        TOPIC_ID,
        2,
        0,
        leader,
        epoch,
        TopicState.READY,
        replicas=("b1", "b2"),
        isr=("b1", "b2"),
    )


async def open_topic(
    directory: Path, partitions: int = 2, config: LogConfig = CONFIG, fs: FileSystem | None = None
) -> Topic:
    """The topic ``orders`` with its partitions under ``directory`` (made if absent), on
    ``fs`` (default: the real file system)."""
    fs = fs or FileSystem()
    parts = [await Partition.open(i, str(directory), config, fs) for i in range(partitions)]
    return Topic(TOPIC, parts, TOPIC_ID)


async def close_topic(topic: Topic) -> None:
    for partition in topic.partitions:
        await partition.aclose()


def batch(producer: int, seq: int, count: int = 3) -> bytes:
    """A producer's batch of ``count`` records at sequence ``seq``."""
    values = [b"p%d-s%d-%s" % (producer, seq + i, b"x" * ((seq + i) % 40)) for i in range(count)]
    return restamp(encode_columns(values), producer, seq)


class Publisher:
    """One idempotent producer appending to every partition of a topic as its leader."""

    def __init__(self, producer: int = 7) -> None:
        self.producer = producer
        self._next: dict[int, int] = {}

    async def publish(self, topic: Topic, epoch: int | None, batches: int) -> None:
        """Append ``batches`` batches of 3 records to every partition at ``epoch`` (the
        epoch assigned at the head first, as a leader does; ``None``: no epoch, as
        before the topic was replicated)."""
        for partition in topic.partitions:
            if epoch is not None:
                partition.log.leader_epochs.assign(epoch, partition.writer.head)
            for _ in range(batches):
                seq = self._next.get(partition.index, 0)
                await partition.append(batch(self.producer, seq))
                self._next[partition.index] = seq + 3


class FakeLeader:
    """Leads ``topic`` at ``epoch``; see the module docstring."""

    def __init__(self, topic: Topic, epoch: int) -> None:
        self.topic = topic
        self.epoch = epoch
        self.refuse: pb.ReplicaError | None = None
        self.requests: list[pb.ReplicaFetchRequest] = []
        self.reports: list[pb.ReplicaFetchRequest] = []
        #: The ``authorization`` metadata of each fetch (None: absent).
        self.authorizations: list[str | None] = []
        self._data = asyncio.Event()
        for partition in topic.partitions:
            partition.writer.add_durable_listener(self._on_durable)

    def _on_durable(self, _end: int) -> None:
        self._data.set()

    async def ReplicaFetch(  # noqa: N802 - the RPC's name
        self, request: pb.ReplicaFetchRequest, context: Context
    ) -> pb.ReplicaFetchResponse:
        self.requests.append(request)
        metadata = dict(context.invocation_metadata() or ())
        value = metadata.get("authorization")
        self.authorizations.append(value.decode() if isinstance(value, bytes) else value)
        if self.refuse is not None:
            return pb.ReplicaFetchResponse(error=self.refuse, message="told to refuse")
        if (request.topic, request.topic_id) != (TOPIC, TOPIC_ID):
            return pb.ReplicaFetchResponse(error=pb.UNKNOWN_TOPIC)
        if request.leader_epoch != self.epoch:
            error = (
                pb.FENCED_LEADER_EPOCH
                if request.leader_epoch < self.epoch
                else pb.UNKNOWN_LEADER_EPOCH
            )
            return pb.ReplicaFetchResponse(error=error, leader_epoch=self.epoch)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.max_wait_ms / 1000
        while True:
            self._data.clear()
            logs = await self._answer(request)
            if any(_worth(d) for d in logs) or loop.time() >= deadline:
                return pb.ReplicaFetchResponse(leader_epoch=self.epoch, logs=logs)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._data.wait(), deadline - loop.time())

    async def ReplicaStream(  # noqa: N802 - the RPC's name
        self, requests: AsyncIterator[pb.ReplicaFetchRequest], context: Context
    ) -> AsyncIterator[pb.ReplicaFetchResponse]:
        async def fetch(request: pb.ReplicaFetchRequest) -> pb.ReplicaFetchResponse:
            return await self.ReplicaFetch(request, context)

        async for answer in fetch_stream(requests, context, fetch, self.reports.append):
            yield answer

    async def _answer(self, request: pb.ReplicaFetchRequest) -> list[pb.LogData]:
        budget, out = request.max_bytes, []
        for ask in request.logs:
            data = await self._answer_log(ask, budget)
            budget -= len(data.batches)
            out.append(data)
        return out

    async def _answer_log(self, ask: pb.LogFetch, budget: int) -> pb.LogData:
        partition = self.topic.partitions[int(ask.log.removeprefix("p/"))]
        writer, epochs = partition.writer, partition.log.leader_epochs
        end, start = writer.durable_end, writer.first_offset
        data = pb.LogData(log=ask.log, high_watermark=end, log_start=start, log_end=end)
        data.epochs.extend(
            pb.EpochStart(epoch=e.epoch, start_offset=e.start_offset)
            for e in epochs.entries()
            if e.epoch >= ask.last_fetched_epoch
        )
        if ask.last_fetched_epoch >= 0:
            found, epoch_end = epochs.end_offset_for(ask.last_fetched_epoch)
            if found < 0:
                oldest = epochs.entries()
                epoch_end = oldest[0].start_offset if oldest else 0
            if found < ask.last_fetched_epoch or epoch_end < ask.fetch_offset:
                data.diverging.CopyFrom(
                    pb.Divergence(epoch=found, end_offset=min(epoch_end, ask.fetch_offset))
                )
                return data
        if not start <= ask.fetch_offset <= end:
            data.error = pb.OFFSET_OUT_OF_RANGE
            return data
        if ask.fetch_offset < end and budget > 0:
            data.batches = await writer.read_raw(ask.fetch_offset, budget, durable=True)
        return data

    async def OffsetForLeaderEpoch(  # noqa: N802 - the RPC's name
        self, request: pb.OffsetForLeaderEpochRequest, context: Context
    ) -> pb.OffsetForLeaderEpochResponse:
        partition = self.topic.partitions[int(request.log.removeprefix("p/"))]
        epoch, end = partition.log.leader_epochs.end_offset_for(request.epoch)
        return pb.OffsetForLeaderEpochResponse(epoch=epoch, end_offset=end)


def _worth(data: pb.LogData) -> bool:
    return bool(data.batches) or data.error != 0 or data.HasField("diverging")


@asynccontextmanager
async def serving(leader: FakeLeader, port: int = 0) -> AsyncIterator[int]:
    """Serve ``leader`` on 127.0.0.1 (``port``, or any free one); yields the port."""
    server = grpc.aio.server()
    pb_grpc.add_ReplicationServicer_to_server(leader, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield bound
    finally:
        await server.stop(0)
