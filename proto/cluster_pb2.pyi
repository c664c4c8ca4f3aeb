from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LookupRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("routes", "brokers", "controller", "revision", "node_id")
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    routes: _containers.RepeatedCompositeFieldContainer[TopicRoute]
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerInfo]
    controller: str
    revision: int
    node_id: str
    def __init__(self, routes: _Optional[_Iterable[_Union[TopicRoute, _Mapping]]] = ..., brokers: _Optional[_Iterable[_Union[BrokerInfo, _Mapping]]] = ..., controller: _Optional[str] = ..., revision: _Optional[int] = ..., node_id: _Optional[str] = ...) -> None: ...

class TopicRoute(_message.Message):
    __slots__ = ("topic", "owner_node", "owner_address", "epoch", "state", "online", "partitions", "reason", "replicas", "isr", "min_insync")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    OWNER_NODE_FIELD_NUMBER: _ClassVar[int]
    OWNER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ONLINE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    owner_node: str
    owner_address: str
    epoch: int
    state: str
    online: bool
    partitions: int
    reason: str
    replicas: _containers.RepeatedScalarFieldContainer[str]
    isr: _containers.RepeatedScalarFieldContainer[str]
    min_insync: int
    def __init__(self, topic: _Optional[str] = ..., owner_node: _Optional[str] = ..., owner_address: _Optional[str] = ..., epoch: _Optional[int] = ..., state: _Optional[str] = ..., online: _Optional[bool] = ..., partitions: _Optional[int] = ..., reason: _Optional[str] = ..., replicas: _Optional[_Iterable[str]] = ..., isr: _Optional[_Iterable[str]] = ..., min_insync: _Optional[int] = ...) -> None: ...

class BrokerInfo(_message.Message):
    __slots__ = ("node_id", "address", "alive", "topics", "partitions", "session_age_s")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SESSION_AGE_S_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    alive: bool
    topics: int
    partitions: int
    session_age_s: float
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., alive: _Optional[bool] = ..., topics: _Optional[int] = ..., partitions: _Optional[int] = ..., session_age_s: _Optional[float] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EtcdEndpoint(_message.Message):
    __slots__ = ("endpoint", "healthy", "error")
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    healthy: bool
    error: str
    def __init__(self, endpoint: _Optional[str] = ..., healthy: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class OfflineTopic(_message.Message):
    __slots__ = ("topic", "owner_node", "reason", "message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    OWNER_NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    owner_node: str
    reason: str
    message: str
    def __init__(self, topic: _Optional[str] = ..., owner_node: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class StrayTopic(_message.Message):
    __slots__ = ("topic", "local_id", "cluster_id", "owner_node", "path", "message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LOCAL_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_NODE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    local_id: str
    cluster_id: str
    owner_node: str
    path: str
    message: str
    def __init__(self, topic: _Optional[str] = ..., local_id: _Optional[str] = ..., cluster_id: _Optional[str] = ..., owner_node: _Optional[str] = ..., path: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class UnderReplicatedTopic(_message.Message):
    __slots__ = ("topic", "owner_node", "epoch", "replicas", "isr", "min_insync", "message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    OWNER_NODE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    owner_node: str
    epoch: int
    replicas: _containers.RepeatedScalarFieldContainer[str]
    isr: _containers.RepeatedScalarFieldContainer[str]
    min_insync: int
    message: str
    def __init__(self, topic: _Optional[str] = ..., owner_node: _Optional[str] = ..., epoch: _Optional[int] = ..., replicas: _Optional[_Iterable[str]] = ..., isr: _Optional[_Iterable[str]] = ..., min_insync: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("node_id", "cluster_id", "brokers", "controller", "etcd", "offline_topics", "revision", "strays", "under_replicated")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    ETCD_FIELD_NUMBER: _ClassVar[int]
    OFFLINE_TOPICS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    STRAYS_FIELD_NUMBER: _ClassVar[int]
    UNDER_REPLICATED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    cluster_id: str
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerInfo]
    controller: str
    etcd: _containers.RepeatedCompositeFieldContainer[EtcdEndpoint]
    offline_topics: _containers.RepeatedCompositeFieldContainer[OfflineTopic]
    revision: int
    strays: _containers.RepeatedCompositeFieldContainer[StrayTopic]
    under_replicated: _containers.RepeatedCompositeFieldContainer[UnderReplicatedTopic]
    def __init__(self, node_id: _Optional[str] = ..., cluster_id: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[BrokerInfo, _Mapping]]] = ..., controller: _Optional[str] = ..., etcd: _Optional[_Iterable[_Union[EtcdEndpoint, _Mapping]]] = ..., offline_topics: _Optional[_Iterable[_Union[OfflineTopic, _Mapping]]] = ..., revision: _Optional[int] = ..., strays: _Optional[_Iterable[_Union[StrayTopic, _Mapping]]] = ..., under_replicated: _Optional[_Iterable[_Union[UnderReplicatedTopic, _Mapping]]] = ...) -> None: ...
