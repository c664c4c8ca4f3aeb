from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicaError(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_ERROR_NONE: _ClassVar[ReplicaError]
    NOT_LEADER: _ClassVar[ReplicaError]
    FENCED_LEADER_EPOCH: _ClassVar[ReplicaError]
    UNKNOWN_LEADER_EPOCH: _ClassVar[ReplicaError]
    UNKNOWN_TOPIC: _ClassVar[ReplicaError]
    NOT_REPLICA: _ClassVar[ReplicaError]
    OFFSET_OUT_OF_RANGE: _ClassVar[ReplicaError]
    UNKNOWN_LOG: _ClassVar[ReplicaError]
REPLICA_ERROR_NONE: ReplicaError
NOT_LEADER: ReplicaError
FENCED_LEADER_EPOCH: ReplicaError
UNKNOWN_LEADER_EPOCH: ReplicaError
UNKNOWN_TOPIC: ReplicaError
NOT_REPLICA: ReplicaError
OFFSET_OUT_OF_RANGE: ReplicaError
UNKNOWN_LOG: ReplicaError

class ReplicaFetchRequest(_message.Message):
    __slots__ = ("topic", "topic_id", "replica_node", "leader_epoch", "logs", "max_bytes", "max_wait_ms", "progress_only")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NODE_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_ONLY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    topic_id: str
    replica_node: str
    leader_epoch: int
    logs: _containers.RepeatedCompositeFieldContainer[LogFetch]
    max_bytes: int
    max_wait_ms: int
    progress_only: bool
    def __init__(self, topic: _Optional[str] = ..., topic_id: _Optional[str] = ..., replica_node: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., logs: _Optional[_Iterable[_Union[LogFetch, _Mapping]]] = ..., max_bytes: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., progress_only: _Optional[bool] = ...) -> None: ...

class LogFetch(_message.Message):
    __slots__ = ("log", "fetch_offset", "last_fetched_epoch", "durable_offset")
    LOG_FIELD_NUMBER: _ClassVar[int]
    FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_FETCHED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    DURABLE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    log: str
    fetch_offset: int
    last_fetched_epoch: int
    durable_offset: int
    def __init__(self, log: _Optional[str] = ..., fetch_offset: _Optional[int] = ..., last_fetched_epoch: _Optional[int] = ..., durable_offset: _Optional[int] = ...) -> None: ...

class ReplicaFetchResponse(_message.Message):
    __slots__ = ("error", "leader_epoch", "logs", "message", "log_ids")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LOG_IDS_FIELD_NUMBER: _ClassVar[int]
    error: ReplicaError
    leader_epoch: int
    logs: _containers.RepeatedCompositeFieldContainer[LogData]
    message: str
    log_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, error: _Optional[_Union[ReplicaError, str]] = ..., leader_epoch: _Optional[int] = ..., logs: _Optional[_Iterable[_Union[LogData, _Mapping]]] = ..., message: _Optional[str] = ..., log_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class LogData(_message.Message):
    __slots__ = ("log", "error", "high_watermark", "log_start", "log_end", "batches", "diverging", "epochs")
    LOG_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_START_FIELD_NUMBER: _ClassVar[int]
    LOG_END_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    DIVERGING_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    log: str
    error: ReplicaError
    high_watermark: int
    log_start: int
    log_end: int
    batches: bytes
    diverging: Divergence
    epochs: _containers.RepeatedCompositeFieldContainer[EpochStart]
    def __init__(self, log: _Optional[str] = ..., error: _Optional[_Union[ReplicaError, str]] = ..., high_watermark: _Optional[int] = ..., log_start: _Optional[int] = ..., log_end: _Optional[int] = ..., batches: _Optional[bytes] = ..., diverging: _Optional[_Union[Divergence, _Mapping]] = ..., epochs: _Optional[_Iterable[_Union[EpochStart, _Mapping]]] = ...) -> None: ...

class Divergence(_message.Message):
    __slots__ = ("epoch", "end_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    end_offset: int
    def __init__(self, epoch: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class EpochStart(_message.Message):
    __slots__ = ("epoch", "start_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start_offset: int
    def __init__(self, epoch: _Optional[int] = ..., start_offset: _Optional[int] = ...) -> None: ...

class OffsetForLeaderEpochRequest(_message.Message):
    __slots__ = ("topic", "topic_id", "log", "epoch", "replica_node")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICA_NODE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    topic_id: str
    log: str
    epoch: int
    replica_node: str
    def __init__(self, topic: _Optional[str] = ..., topic_id: _Optional[str] = ..., log: _Optional[str] = ..., epoch: _Optional[int] = ..., replica_node: _Optional[str] = ...) -> None: ...

class OffsetForLeaderEpochResponse(_message.Message):
    __slots__ = ("error", "epoch", "end_offset", "message")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error: ReplicaError
    epoch: int
    end_offset: int
    message: str
    def __init__(self, error: _Optional[_Union[ReplicaError, str]] = ..., epoch: _Optional[int] = ..., end_offset: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...
