from proto import broker_pb2 as _broker_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateTopicRequest(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: int
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[int] = ...) -> None: ...

class PartitionInfo(_message.Message):
    __slots__ = ("partition", "first_offset", "head", "size_bytes", "segments")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    first_offset: int
    head: int
    size_bytes: int
    segments: int
    def __init__(self, partition: _Optional[int] = ..., first_offset: _Optional[int] = ..., head: _Optional[int] = ..., size_bytes: _Optional[int] = ..., segments: _Optional[int] = ...) -> None: ...

class TopicInfo(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionInfo]
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionInfo, _Mapping]]] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ...) -> None: ...

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
    __slots__ = ("partition", "cursor", "head", "lag", "in_flight", "oldest_unacked_age_s", "state", "reason")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNACKED_AGE_S_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    partition: int
    cursor: int
    head: int
    lag: int
    in_flight: int
    oldest_unacked_age_s: float
    state: str
    reason: str
    def __init__(self, partition: _Optional[int] = ..., cursor: _Optional[int] = ..., head: _Optional[int] = ..., lag: _Optional[int] = ..., in_flight: _Optional[int] = ..., oldest_unacked_age_s: _Optional[float] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SubscriptionInfo(_message.Message):
    __slots__ = ("topic", "subscription", "type", "partitions", "consumers")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    type: _broker_pb2.SubscriptionType
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionLag]
    consumers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., type: _Optional[_Union[_broker_pb2.SubscriptionType, str]] = ..., partitions: _Optional[_Iterable[_Union[PartitionLag, _Mapping]]] = ..., consumers: _Optional[_Iterable[str]] = ...) -> None: ...

class ListSubscriptionsResponse(_message.Message):
    __slots__ = ("subscriptions",)
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[SubscriptionInfo]
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[SubscriptionInfo, _Mapping]]] = ...) -> None: ...

class DescribeSubscriptionRequest(_message.Message):
    __slots__ = ("topic", "subscription")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ...) -> None: ...

class SeekRequest(_message.Message):
    __slots__ = ("topic", "subscription", "earliest", "latest", "offset", "timestamp_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    EARLIEST_FIELD_NUMBER: _ClassVar[int]
    LATEST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    earliest: bool
    latest: bool
    offset: int
    timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., earliest: _Optional[bool] = ..., latest: _Optional[bool] = ..., offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...
