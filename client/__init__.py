"""The Headrace Python client: async-first producers and admin, with sync twins to come.

Modules:
    errors          ClientError and one class per gRPC status code; from_rpc_error
    _types          TopicInfo, PartitionInfo, RecordMetadata
    _async.producer AsyncProducer: batching, per-partition pipelining, retries, idempotence
    _async.admin    AsyncAdminClient: topics
    _wire           generated copy of the wal batch codec (python -m client._codegen)
    _codegen        the generator of _wire, with a --check mode for CI

Imports ``proto`` only (DESIGN section 1).
"""

from client._async.admin import AsyncAdminClient
from client._async.producer import AsyncProducer, partition_for
from client._types import DEFAULT_BROKER, PartitionInfo, RecordMetadata, TopicInfo
from client.errors import (
    AlreadyExists,
    ClientClosed,
    ClientError,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "DEFAULT_BROKER",
    "AlreadyExists",
    "AsyncAdminClient",
    "AsyncProducer",
    "ClientClosed",
    "ClientError",
    "DataLoss",
    "DeadlineExceeded",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PartitionInfo",
    "PermissionDenied",
    "RecordMetadata",
    "ResourceExhausted",
    "TopicInfo",
    "Unauthenticated",
    "Unavailable",
    "partition_for",
]
