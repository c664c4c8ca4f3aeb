"""Pure converters between protobuf messages and broker domain values.

Role: keep servicers thin (pb -> domain -> pb). No I/O, no asyncio.
"""

from __future__ import annotations

from proto import admin_pb2 as _admin
from proto import broker_pb2 as _pb
from wal import AppendResult, Log


def publish_response(
    request_id: int, partition: int, result: AppendResult, *, duplicate: bool = False
) -> _pb.PublishResponse:
    """The response to one appended batch."""
    return _pb.PublishResponse(
        request_id=request_id,
        partition=partition,
        base_offset=result.first_offset,
        last_offset=result.last_offset,
        duplicate=duplicate,
    )


def partition_info(partition: int, log: Log) -> _admin.PartitionInfo:
    """One partition's heads, size and segment count."""
    return _admin.PartitionInfo(
        partition=partition,
        first_offset=log.first_offset,
        head=log.head,
        size_bytes=log.size_bytes,
        segments=log.segment_count,
    )
