from proto import broker_pb2 as _broker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateTopicRequest(_message.Message):
    __slots__ = ("name", "partitions", "replication_factor", "min_insync_replicas")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: int
    replication_factor: int
    min_insync_replicas: int
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ..., min_insync_replicas: _Optional[int] = ...) -> None: ...

class PartitionInfo(_message.Message):
    __slots__ = ("partition", "first_offset", "head", "size_bytes", "segments", "followers")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    first_offset: int
    head: int
    size_bytes: int
    segments: int
    followers: _containers.RepeatedCompositeFieldContainer[FollowerInfo]
    def __init__(self, partition: _Optional[int] = ..., first_offset: _Optional[int] = ..., head: _Optional[int] = ..., size_bytes: _Optional[int] = ..., segments: _Optional[int] = ..., followers: _Optional[_Iterable[_Union[FollowerInfo, _Mapping]]] = ...) -> None: ...

class FollowerInfo(_message.Message):
    __slots__ = ("node", "fetch_offset", "lag_records", "lag_s", "in_sync")
    NODE_FIELD_NUMBER: _ClassVar[int]
    FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LAG_S_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    node: str
    fetch_offset: int
    lag_records: int
    lag_s: float
    in_sync: bool
    def __init__(self, node: _Optional[str] = ..., fetch_offset: _Optional[int] = ..., lag_records: _Optional[int] = ..., lag_s: _Optional[float] = ..., in_sync: _Optional[bool] = ...) -> None: ...

class TopicInfo(_message.Message):
    __slots__ = ("name", "partitions", "fsync", "topic_id", "leader", "epoch", "replicas", "isr", "min_insync_replicas", "log_followers")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    FSYNC_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LOG_FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionInfo]
    fsync: str
    topic_id: str
    leader: str
    epoch: int
    replicas: _containers.RepeatedScalarFieldContainer[str]
    isr: _containers.RepeatedScalarFieldContainer[str]
    min_insync_replicas: int
    log_followers: _containers.RepeatedCompositeFieldContainer[LogFollowerInfo]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionInfo, _Mapping]]] = ..., fsync: _Optional[str] = ..., topic_id: _Optional[str] = ..., leader: _Optional[str] = ..., epoch: _Optional[int] = ..., replicas: _Optional[_Iterable[str]] = ..., isr: _Optional[_Iterable[str]] = ..., min_insync_replicas: _Optional[int] = ..., log_followers: _Optional[_Iterable[_Union[LogFollowerInfo, _Mapping]]] = ...) -> None: ...

class LogFollowerInfo(_message.Message):
    __slots__ = ("log", "node", "lag_records", "lag_s", "in_sync")
    LOG_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LAG_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LAG_S_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    log: str
    node: str
    lag_records: int
    lag_s: float
    in_sync: bool
    def __init__(self, log: _Optional[str] = ..., node: _Optional[str] = ..., lag_records: _Optional[int] = ..., lag_s: _Optional[float] = ..., in_sync: _Optional[bool] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics", "node_id")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    node_id: str
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ..., node_id: _Optional[str] = ...) -> None: ...

class DescribeTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListSubscriptionsRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class PartitionLag(_message.Message):
    __slots__ = ("partition", "cursor", "head", "lag", "in_flight", "oldest_unacked_age_s", "state", "reason", "ingress_rate", "ack_rate", "drain_s", "trend")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNACKED_AGE_S_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    INGRESS_RATE_FIELD_NUMBER: _ClassVar[int]
    ACK_RATE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_S_FIELD_NUMBER: _ClassVar[int]
    TREND_FIELD_NUMBER: _ClassVar[int]
    partition: int
    cursor: int
    head: int
    lag: int
    in_flight: int
    oldest_unacked_age_s: float
    state: str
    reason: str
    ingress_rate: float
    ack_rate: float
    drain_s: float
    trend: str
    def __init__(self, partition: _Optional[int] = ..., cursor: _Optional[int] = ..., head: _Optional[int] = ..., lag: _Optional[int] = ..., in_flight: _Optional[int] = ..., oldest_unacked_age_s: _Optional[float] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ..., ingress_rate: _Optional[float] = ..., ack_rate: _Optional[float] = ..., drain_s: _Optional[float] = ..., trend: _Optional[str] = ...) -> None: ...

class SubscriptionInfo(_message.Message):
    __slots__ = ("topic", "subscription", "type", "partitions", "consumers", "mode", "committer")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    COMMITTER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    type: _broker_pb2.SubscriptionType
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionLag]
    consumers: _containers.RepeatedScalarFieldContainer[str]
    mode: _broker_pb2.DeliveryMode
    committer: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., type: _Optional[_Union[_broker_pb2.SubscriptionType, str]] = ..., partitions: _Optional[_Iterable[_Union[PartitionLag, _Mapping]]] = ..., consumers: _Optional[_Iterable[str]] = ..., mode: _Optional[_Union[_broker_pb2.DeliveryMode, str]] = ..., committer: _Optional[str] = ...) -> None: ...

class ListSubscriptionsResponse(_message.Message):
    __slots__ = ("subscriptions", "node_id")
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[SubscriptionInfo]
    node_id: str
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[SubscriptionInfo, _Mapping]]] = ..., node_id: _Optional[str] = ...) -> None: ...

class DescribeSubscriptionRequest(_message.Message):
    __slots__ = ("topic", "subscription")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class SeekRequest(_message.Message):
    __slots__ = ("topic", "subscription", "earliest", "latest", "offset", "timestamp_ms", "partition_offsets")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    earliest: bool
    latest: bool
    offset: int
    timestamp_ms: int
    partition_offsets: PartitionOffsets
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., earliest: _Optional[bool] = ..., latest: _Optional[bool] = ..., offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., partition_offsets: _Optional[_Union[PartitionOffsets, _Mapping]] = ...) -> None: ...

class PartitionOffsets(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[_broker_pb2.PartitionOffset]
    def __init__(self, offsets: _Optional[_Iterable[_Union[_broker_pb2.PartitionOffset, _Mapping]]] = ...) -> None: ...

class OffsetsForTimeRequest(_message.Message):
    __slots__ = ("topic", "timestamp_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class OffsetsForTimeResponse(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[_broker_pb2.PartitionOffset]
    def __init__(self, offsets: _Optional[_Iterable[_Union[_broker_pb2.PartitionOffset, _Mapping]]] = ...) -> None: ...

class DeadLetterEntry(_message.Message):
    __slots__ = ("sequence", "topic", "partition", "offset", "subscription", "key", "value", "headers", "timestamp_ms", "attempts", "reason", "attempt_times_ms", "dead_lettered_ms", "truncated", "original_size", "replay_count", "header_list")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_TIMES_MS_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_MS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    ORIGINAL_SIZE_FIELD_NUMBER: _ClassVar[int]
    REPLAY_COUNT_FIELD_NUMBER: _ClassVar[int]
    HEADER_LIST_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    topic: str
    partition: int
    offset: int
    subscription: str
    key: bytes
    value: bytes
    headers: _containers.ScalarMap[str, bytes]
    timestamp_ms: int
    attempts: int
    reason: str
    attempt_times_ms: _containers.RepeatedScalarFieldContainer[int]
    dead_lettered_ms: int
    truncated: bool
    original_size: int
    replay_count: int
    header_list: _containers.RepeatedCompositeFieldContainer[_broker_pb2.Header]
    def __init__(self, sequence: _Optional[int] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., subscription: _Optional[str] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, bytes]] = ..., timestamp_ms: _Optional[int] = ..., attempts: _Optional[int] = ..., reason: _Optional[str] = ..., attempt_times_ms: _Optional[_Iterable[int]] = ..., dead_lettered_ms: _Optional[int] = ..., truncated: _Optional[bool] = ..., original_size: _Optional[int] = ..., replay_count: _Optional[int] = ..., header_list: _Optional[_Iterable[_Union[_broker_pb2.Header, _Mapping]]] = ...) -> None: ...

class PeekDeadLettersRequest(_message.Message):
    __slots__ = ("topic", "subscription", "from_sequence", "limit", "reason")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    from_sequence: int
    limit: int
    reason: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., from_sequence: _Optional[int] = ..., limit: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class PeekDeadLettersResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[DeadLetterEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[DeadLetterEntry, _Mapping]]] = ...) -> None: ...

class CountDeadLettersRequest(_message.Message):
    __slots__ = ("topic", "subscription")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class CountDeadLettersResponse(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class AckDeadLettersRequest(_message.Message):
    __slots__ = ("topic", "subscription", "up_to_sequence")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    UP_TO_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    up_to_sequence: int
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., up_to_sequence: _Optional[int] = ...) -> None: ...

class AckDeadLettersResponse(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class PurgeDeadLettersRequest(_message.Message):
    __slots__ = ("topic", "subscription")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class PurgeDeadLettersResponse(_message.Message):
    __slots__ = ("purged",)
    PURGED_FIELD_NUMBER: _ClassVar[int]
    purged: int
    def __init__(self, purged: _Optional[int] = ...) -> None: ...

class ReplayDeadLettersRequest(_message.Message):
    __slots__ = ("topic", "subscription", "limit", "up_to_sequence", "rate_per_s")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    UP_TO_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    limit: int
    up_to_sequence: int
    rate_per_s: int
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., limit: _Optional[int] = ..., up_to_sequence: _Optional[int] = ..., rate_per_s: _Optional[int] = ...) -> None: ...

class SkippedDeadLetter(_message.Message):
    __slots__ = ("sequence", "reason")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    reason: str
    def __init__(self, sequence: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ReplayDeadLettersResponse(_message.Message):
    __slots__ = ("replayed", "skipped", "remaining")
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    replayed: int
    skipped: _containers.RepeatedCompositeFieldContainer[SkippedDeadLetter]
    remaining: int
    def __init__(self, replayed: _Optional[int] = ..., skipped: _Optional[_Iterable[_Union[SkippedDeadLetter, _Mapping]]] = ..., remaining: _Optional[int] = ...) -> None: ...

class DeleteSubscriptionRequest(_message.Message):
    __slots__ = ("topic", "subscription", "force")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    force: bool
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class DeleteSubscriptionResponse(_message.Message):
    __slots__ = ("detached_consumers",)
    DETACHED_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    detached_consumers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, detached_consumers: _Optional[_Iterable[str]] = ...) -> None: ...
