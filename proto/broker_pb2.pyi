from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubscriptionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBSCRIPTION_TYPE_UNSPECIFIED: _ClassVar[SubscriptionType]
    EXCLUSIVE: _ClassVar[SubscriptionType]
    FAILOVER: _ClassVar[SubscriptionType]
    SHARED: _ClassVar[SubscriptionType]
    KEY_SHARED: _ClassVar[SubscriptionType]

class DeliveryMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DELIVERY_MODE_UNSPECIFIED: _ClassVar[DeliveryMode]
    AT_LEAST_ONCE: _ClassVar[DeliveryMode]
    AT_MOST_ONCE: _ClassVar[DeliveryMode]

class InitialPosition(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INITIAL_POSITION_UNSPECIFIED: _ClassVar[InitialPosition]
    EARLIEST: _ClassVar[InitialPosition]
    LATEST: _ClassVar[InitialPosition]
SUBSCRIPTION_TYPE_UNSPECIFIED: SubscriptionType
EXCLUSIVE: SubscriptionType
FAILOVER: SubscriptionType
SHARED: SubscriptionType
KEY_SHARED: SubscriptionType
DELIVERY_MODE_UNSPECIFIED: DeliveryMode
AT_LEAST_ONCE: DeliveryMode
AT_MOST_ONCE: DeliveryMode
INITIAL_POSITION_UNSPECIFIED: InitialPosition
EARLIEST: InitialPosition
LATEST: InitialPosition

class PublishRequest(_message.Message):
    __slots__ = ("topic", "partition", "batch", "request_id", "records", "producer_id", "base_sequence")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    BASE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    batch: bytes
    request_id: int
    records: _containers.RepeatedCompositeFieldContainer[Record]
    producer_id: int
    base_sequence: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., batch: _Optional[bytes] = ..., request_id: _Optional[int] = ..., records: _Optional[_Iterable[_Union[Record, _Mapping]]] = ..., producer_id: _Optional[int] = ..., base_sequence: _Optional[int] = ...) -> None: ...

class Record(_message.Message):
    __slots__ = ("key", "value", "headers", "timestamp_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    timestamp_ms: int
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class DecodedRecord(_message.Message):
    __slots__ = ("offset", "timestamp_ms", "key", "value", "headers")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    offset: int
    timestamp_ms: int
    key: bytes
    value: bytes
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    def __init__(self, offset: _Optional[int] = ..., timestamp_ms: _Optional[int] = ..., key: _Optional[bytes] = ..., value: _Optional[bytes] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("request_id", "partition", "base_offset", "last_offset", "duplicate", "error_code", "error_message", "in_flight_hint", "redirect")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_HINT_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    partition: int
    base_offset: int
    last_offset: int
    duplicate: bool
    error_code: int
    error_message: str
    in_flight_hint: int
    redirect: Redirect
    def __init__(self, request_id: _Optional[int] = ..., partition: _Optional[int] = ..., base_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., duplicate: _Optional[bool] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., in_flight_hint: _Optional[int] = ..., redirect: _Optional[_Union[Redirect, _Mapping]] = ...) -> None: ...

class Redirect(_message.Message):
    __slots__ = ("reason", "topic", "owner_node", "owner_address", "owner_epoch")
    REASON_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    OWNER_NODE_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    OWNER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    reason: str
    topic: str
    owner_node: str
    owner_address: str
    owner_epoch: int
    def __init__(self, reason: _Optional[str] = ..., topic: _Optional[str] = ..., owner_node: _Optional[str] = ..., owner_address: _Optional[str] = ..., owner_epoch: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("open", "credit", "ack", "drain")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    CREDIT_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    open: OpenSubscription
    credit: int
    ack: Acks
    drain: Drain
    def __init__(self, open: _Optional[_Union[OpenSubscription, _Mapping]] = ..., credit: _Optional[int] = ..., ack: _Optional[_Union[Acks, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OpenSubscription(_message.Message):
    __slots__ = ("topic", "subscription", "type", "initial_position", "consumer_name", "initial_credit", "mode", "decoded", "force")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    INITIAL_POSITION_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_NAME_FIELD_NUMBER: _ClassVar[int]
    INITIAL_CREDIT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DECODED_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    type: SubscriptionType
    initial_position: InitialPosition
    consumer_name: str
    initial_credit: int
    mode: DeliveryMode
    decoded: bool
    force: bool
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., type: _Optional[_Union[SubscriptionType, str]] = ..., initial_position: _Optional[_Union[InitialPosition, str]] = ..., consumer_name: _Optional[str] = ..., initial_credit: _Optional[int] = ..., mode: _Optional[_Union[DeliveryMode, str]] = ..., decoded: _Optional[bool] = ..., force: _Optional[bool] = ...) -> None: ...

class Acks(_message.Message):
    __slots__ = ("ranges", "up_to", "nacks", "releases")
    RANGES_FIELD_NUMBER: _ClassVar[int]
    UP_TO_FIELD_NUMBER: _ClassVar[int]
    NACKS_FIELD_NUMBER: _ClassVar[int]
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    ranges: _containers.RepeatedCompositeFieldContainer[OffsetRange]
    up_to: _containers.RepeatedCompositeFieldContainer[PartitionOffset]
    nacks: _containers.RepeatedCompositeFieldContainer[Nack]
    releases: _containers.RepeatedCompositeFieldContainer[OffsetRange]
    def __init__(self, ranges: _Optional[_Iterable[_Union[OffsetRange, _Mapping]]] = ..., up_to: _Optional[_Iterable[_Union[PartitionOffset, _Mapping]]] = ..., nacks: _Optional[_Iterable[_Union[Nack, _Mapping]]] = ..., releases: _Optional[_Iterable[_Union[OffsetRange, _Mapping]]] = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ("partition", "begin", "end", "delay_ms", "reason", "dead_letter")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_FIELD_NUMBER: _ClassVar[int]
    partition: int
    begin: int
    end: int
    delay_ms: int
    reason: str
    dead_letter: bool
    def __init__(self, partition: _Optional[int] = ..., begin: _Optional[int] = ..., end: _Optional[int] = ..., delay_ms: _Optional[int] = ..., reason: _Optional[str] = ..., dead_letter: _Optional[bool] = ...) -> None: ...

class OffsetRange(_message.Message):
    __slots__ = ("partition", "begin", "end")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    partition: int
    begin: int
    end: int
    def __init__(self, partition: _Optional[int] = ..., begin: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class PartitionOffset(_message.Message):
    __slots__ = ("partition", "offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("subscribed", "delivery", "drained")
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    DRAINED_FIELD_NUMBER: _ClassVar[int]
    subscribed: Subscribed
    delivery: Delivery
    drained: Drained
    def __init__(self, subscribed: _Optional[_Union[Subscribed, _Mapping]] = ..., delivery: _Optional[_Union[Delivery, _Mapping]] = ..., drained: _Optional[_Union[Drained, _Mapping]] = ...) -> None: ...

class Drained(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Subscribed(_message.Message):
    __slots__ = ("topic", "subscription", "partitions", "consumer_id", "max_unacked")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_UNACKED_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    partitions: int
    consumer_id: str
    max_unacked: int
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., partitions: _Optional[int] = ..., consumer_id: _Optional[str] = ..., max_unacked: _Optional[int] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("topic", "partition", "batch", "from_offset", "to_offset", "redeliveries", "records")
    class RedeliveriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    FROM_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TO_OFFSET_FIELD_NUMBER: _ClassVar[int]
    REDELIVERIES_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    batch: bytes
    from_offset: int
    to_offset: int
    redeliveries: _containers.ScalarMap[int, int]
    records: _containers.RepeatedCompositeFieldContainer[DecodedRecord]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., batch: _Optional[bytes] = ..., from_offset: _Optional[int] = ..., to_offset: _Optional[int] = ..., redeliveries: _Optional[_Mapping[int, int]] = ..., records: _Optional[_Iterable[_Union[DecodedRecord, _Mapping]]] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("topic", "partition", "offset", "max_bytes", "end_offset", "max_wait_ms", "decoded")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    DECODED_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    max_bytes: int
    end_offset: int
    max_wait_ms: int
    decoded: bool
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ..., end_offset: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., decoded: _Optional[bool] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("batches", "high_water_mark", "first_offset", "records")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATER_MARK_FIELD_NUMBER: _ClassVar[int]
    FIRST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedScalarFieldContainer[bytes]
    high_water_mark: int
    first_offset: int
    records: _containers.RepeatedCompositeFieldContainer[DecodedRecord]
    def __init__(self, batches: _Optional[_Iterable[bytes]] = ..., high_water_mark: _Optional[int] = ..., first_offset: _Optional[int] = ..., records: _Optional[_Iterable[_Union[DecodedRecord, _Mapping]]] = ...) -> None: ...

class AckUpToRequest(_message.Message):
    __slots__ = ("topic", "subscription", "partition", "offset", "committer")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITTER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    partition: int
    offset: int
    committer: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., committer: _Optional[str] = ...) -> None: ...

class AckUpToResponse(_message.Message):
    __slots__ = ("cursor",)
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    cursor: int
    def __init__(self, cursor: _Optional[int] = ...) -> None: ...
