"""The Headrace Python client: async-first producers, consumers and admin, with sync twins.

Modules:
    errors          ClientError and one class per gRPC status code; from_rpc_error;
                    publish_outcome: whether a failed send's records were written
    _types          TopicInfo, PartitionInfo, RecordMetadata, SentRecords, lag records,
                    DeadLetterEntry, ReplayResult, PublishOutcome; OfflineTopic and
                    SubscriptionListing (cluster-wide listings)
    _async.producer AsyncProducer: batching, per-partition pipelining, retries, idempotence
    _async._accumulator  Accumulator: one partition's batches, their sender task and
                    its stream, retries and recovery (the producer's per-partition half)
    _async.consumer AsyncConsumer: lifecycle, receiving and credit
    _async._consumer_acks  AckBatcher: the consumer's acks, coalesced and sent when due
    _async._consumer_session  Sessions: the consumer's Subscribe streams and reconnects
    _async.admin    AsyncAdminClient: topics, subscriptions and dead-letter queues
    _survey         Survey: which owner to ask for which topics in a cluster-wide listing
    _async.fetcher  AsyncFetcher: reads by offset (Fetch) and position commits (AckUpTo)
    _message        Message: a lazy view of one received record
    _signal         Signal: asyncio.Event without its loop lookup per wait (the consumer)
    _batching       PendingBatch and the per-record futures send returns (RecordFuture,
                    ThreadRecordFuture); BufferBudget: the bytes both producers may queue
    _retry          backoff_s() / route_backoff_s(): the pause before a retried call
    _grpc_env       gRPC's fork handlers off by default (grpc/grpc#43055), before grpc loads
    _channel        every channel's options: message limits, the reconnect backoff cap,
                    TLS and the bearer token (check_security checks them up front)
    _connection     ConnectionSettings: broker address, reconnect cap, token, TLS files,
                    said once; ConnectionOptions: the keywords every client takes for them
    _seeds          parse_brokers: ``broker`` as one HOST:PORT or a list of seed brokers,
                    each entry checked
    _routes         RouteTable: seeds, the cache topic -> owner, what a refusal or a
                    broken connection means (pure; docs/protocol.md section 11)
    _async._routing Router: a client's calls to each topic's owner, a channel per address,
                    refusals followed, Lookups on a seed
    _shared         the consumers of one loop that connect alike share a channel
    _sync           Producer, Consumer, AdminClient: blocking twins over a loop thread,
                    their forwards generated (``python -m client._sync._generate``);
                    Fetcher on gRPC's blocking API, routed by _sync._routing

The record batch codec is the wire contract's own, :mod:`proto.batch` (imported, never
copied). Imports ``proto`` only (DESIGN section 1).
"""

import client._grpc_env  # noqa: F401 - first: turns gRPC's fork handlers off before grpc loads

# isort: split

from client._async.admin import AsyncAdminClient
from client._async.consumer import AsyncConsumer
from client._async.fetcher import AsyncFetcher, FetchResult
from client._async.producer import AsyncProducer
from client._batching import RecordFuture
from client._channel import check_security
from client._connection import ConnectionOptions
from client._message import Message
from client._seeds import parse_brokers
from client._sync.admin import AdminClient
from client._sync.consumer import Consumer
from client._sync.fetcher import Fetcher
from client._sync.producer import Producer
from client._types import (
    DEFAULT_BROKER,
    DeadLetterEntry,
    FollowerInfo,
    LogFollowerInfo,
    OfflineTopic,
    PartitionInfo,
    PartitionLag,
    PublishedRange,
    PublishOutcome,
    Queued,
    RecordMetadata,
    ReplayResult,
    SentRecords,
    SkippedDeadLetter,
    SubscriptionInfo,
    SubscriptionListing,
    TopicInfo,
)
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
    Refused,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from proto.batch import RecordBatch, partition_for

__all__ = [
    "DEFAULT_BROKER",
    "AdminClient",
    "AlreadyExists",
    "AsyncAdminClient",
    "AsyncConsumer",
    "AsyncFetcher",
    "AsyncProducer",
    "ClientClosed",
    "ClientError",
    "ConnectionOptions",
    "Consumer",
    "DataLoss",
    "DeadLetterEntry",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FetchResult",
    "Fetcher",
    "FollowerInfo",
    "InvalidArgument",
    "LogFollowerInfo",
    "Message",
    "NotFound",
    "OfflineTopic",
    "OutOfRange",
    "PartitionInfo",
    "PartitionLag",
    "PermissionDenied",
    "Producer",
    "PublishOutcome",
    "PublishedRange",
    "Queued",
    "RecordBatch",
    "RecordFuture",
    "RecordMetadata",
    "Refused",
    "ReplayResult",
    "ResourceExhausted",
    "SentRecords",
    "SkippedDeadLetter",
    "SubscriptionInfo",
    "SubscriptionListing",
    "TopicInfo",
    "Unauthenticated",
    "Unavailable",
    "check_security",
    "parse_brokers",
    "partition_for",
]
