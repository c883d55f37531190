from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetRequest(_message.Message):
    __slots__ = ("job", "operator", "state", "key", "from_ms", "to_ms", "limit", "min_batch", "savepoint", "allow_stale")
    JOB_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    TO_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    MIN_BATCH_FIELD_NUMBER: _ClassVar[int]
    SAVEPOINT_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STALE_FIELD_NUMBER: _ClassVar[int]
    job: str
    operator: str
    state: str
    key: str
    from_ms: int
    to_ms: int
    limit: int
    min_batch: int
    savepoint: str
    allow_stale: bool
    def __init__(self, job: _Optional[str] = ..., operator: _Optional[str] = ..., state: _Optional[str] = ..., key: _Optional[str] = ..., from_ms: _Optional[int] = ..., to_ms: _Optional[int] = ..., limit: _Optional[int] = ..., min_batch: _Optional[int] = ..., savepoint: _Optional[str] = ..., allow_stale: _Optional[bool] = ...) -> None: ...

class MultiGetRequest(_message.Message):
    __slots__ = ("job", "operator", "state", "keys", "from_ms", "to_ms", "limit", "min_batch", "savepoint", "states", "allow_stale")
    JOB_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    TO_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    MIN_BATCH_FIELD_NUMBER: _ClassVar[int]
    SAVEPOINT_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STALE_FIELD_NUMBER: _ClassVar[int]
    job: str
    operator: str
    state: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    from_ms: int
    to_ms: int
    limit: int
    min_batch: int
    savepoint: str
    states: _containers.RepeatedScalarFieldContainer[str]
    allow_stale: bool
    def __init__(self, job: _Optional[str] = ..., operator: _Optional[str] = ..., state: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., from_ms: _Optional[int] = ..., to_ms: _Optional[int] = ..., limit: _Optional[int] = ..., min_batch: _Optional[int] = ..., savepoint: _Optional[str] = ..., states: _Optional[_Iterable[str]] = ..., allow_stale: _Optional[bool] = ...) -> None: ...

class Window(_message.Message):
    __slots__ = ("start_ms", "end_ms", "int_value", "double_value")
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    start_ms: int
    end_ms: int
    int_value: int
    double_value: float
    def __init__(self, start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., int_value: _Optional[int] = ..., double_value: _Optional[float] = ...) -> None: ...

class StateValue(_message.Message):
    __slots__ = ("job", "operator", "state", "key", "found", "batch", "watermark_ms", "windows", "next_from_ms")
    JOB_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FROM_MS_FIELD_NUMBER: _ClassVar[int]
    job: str
    operator: str
    state: str
    key: str
    found: bool
    batch: int
    watermark_ms: int
    windows: _containers.RepeatedCompositeFieldContainer[Window]
    next_from_ms: int
    def __init__(self, job: _Optional[str] = ..., operator: _Optional[str] = ..., state: _Optional[str] = ..., key: _Optional[str] = ..., found: _Optional[bool] = ..., batch: _Optional[int] = ..., watermark_ms: _Optional[int] = ..., windows: _Optional[_Iterable[_Union[Window, _Mapping]]] = ..., next_from_ms: _Optional[int] = ...) -> None: ...

class MultiGetResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[StateValue]
    def __init__(self, results: _Optional[_Iterable[_Union[StateValue, _Mapping]]] = ...) -> None: ...

class TopRequest(_message.Message):
    __slots__ = ("job", "operator", "state", "n", "ascending", "window_start_ms", "min_batch", "savepoint", "allow_stale")
    JOB_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    ASCENDING_FIELD_NUMBER: _ClassVar[int]
    WINDOW_START_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_BATCH_FIELD_NUMBER: _ClassVar[int]
    SAVEPOINT_FIELD_NUMBER: _ClassVar[int]
    ALLOW_STALE_FIELD_NUMBER: _ClassVar[int]
    job: str
    operator: str
    state: str
    n: int
    ascending: bool
    window_start_ms: int
    min_batch: int
    savepoint: str
    allow_stale: bool
    def __init__(self, job: _Optional[str] = ..., operator: _Optional[str] = ..., state: _Optional[str] = ..., n: _Optional[int] = ..., ascending: _Optional[bool] = ..., window_start_ms: _Optional[int] = ..., min_batch: _Optional[int] = ..., savepoint: _Optional[str] = ..., allow_stale: _Optional[bool] = ...) -> None: ...

class TopEntry(_message.Message):
    __slots__ = ("key", "int_value", "double_value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    int_value: int
    double_value: float
    def __init__(self, key: _Optional[str] = ..., int_value: _Optional[int] = ..., double_value: _Optional[float] = ...) -> None: ...

class TopResponse(_message.Message):
    __slots__ = ("job", "operator", "state", "start_ms", "end_ms", "batch", "watermark_ms", "entries")
    JOB_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    job: str
    operator: str
    state: str
    start_ms: int
    end_ms: int
    batch: int
    watermark_ms: int
    entries: _containers.RepeatedCompositeFieldContainer[TopEntry]
    def __init__(self, job: _Optional[str] = ..., operator: _Optional[str] = ..., state: _Optional[str] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., batch: _Optional[int] = ..., watermark_ms: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[TopEntry, _Mapping]]] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("job", "operator", "state", "keys", "top_n", "ascending", "from_batch")
    JOB_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    ASCENDING_FIELD_NUMBER: _ClassVar[int]
    FROM_BATCH_FIELD_NUMBER: _ClassVar[int]
    job: str
    operator: str
    state: str
    keys: _containers.RepeatedScalarFieldContainer[str]
    top_n: int
    ascending: bool
    from_batch: int
    def __init__(self, job: _Optional[str] = ..., operator: _Optional[str] = ..., state: _Optional[str] = ..., keys: _Optional[_Iterable[str]] = ..., top_n: _Optional[int] = ..., ascending: _Optional[bool] = ..., from_batch: _Optional[int] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("batch", "watermark_ms", "committed_ms", "coalesced", "snapshot", "changes", "top")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_MS_FIELD_NUMBER: _ClassVar[int]
    COALESCED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    batch: int
    watermark_ms: int
    committed_ms: int
    coalesced: bool
    snapshot: bool
    changes: _containers.RepeatedCompositeFieldContainer[StateValue]
    top: TopResponse
    def __init__(self, batch: _Optional[int] = ..., watermark_ms: _Optional[int] = ..., committed_ms: _Optional[int] = ..., coalesced: _Optional[bool] = ..., snapshot: _Optional[bool] = ..., changes: _Optional[_Iterable[_Union[StateValue, _Mapping]]] = ..., top: _Optional[_Union[TopResponse, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[JobInfo]
    def __init__(self, jobs: _Optional[_Iterable[_Union[JobInfo, _Mapping]]] = ...) -> None: ...

class DescribeJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class WindowSpec(_message.Message):
    __slots__ = ("kind", "size_ms", "slide_ms", "gap_ms")
    KIND_FIELD_NUMBER: _ClassVar[int]
    SIZE_MS_FIELD_NUMBER: _ClassVar[int]
    SLIDE_MS_FIELD_NUMBER: _ClassVar[int]
    GAP_MS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    size_ms: int
    slide_ms: int
    gap_ms: int
    def __init__(self, kind: _Optional[str] = ..., size_ms: _Optional[int] = ..., slide_ms: _Optional[int] = ..., gap_ms: _Optional[int] = ...) -> None: ...

class StateInfo(_message.Message):
    __slots__ = ("name", "type")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ...) -> None: ...

class OperatorInfo(_message.Message):
    __slots__ = ("name", "key", "states", "window", "partitions", "retention_ms", "last_batch", "watermark_ms", "partitions_available")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_BATCH_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    key: str
    states: _containers.RepeatedCompositeFieldContainer[StateInfo]
    window: WindowSpec
    partitions: int
    retention_ms: int
    last_batch: int
    watermark_ms: int
    partitions_available: int
    def __init__(self, name: _Optional[str] = ..., key: _Optional[str] = ..., states: _Optional[_Iterable[_Union[StateInfo, _Mapping]]] = ..., window: _Optional[_Union[WindowSpec, _Mapping]] = ..., partitions: _Optional[int] = ..., retention_ms: _Optional[int] = ..., last_batch: _Optional[int] = ..., watermark_ms: _Optional[int] = ..., partitions_available: _Optional[int] = ...) -> None: ...

class JobInfo(_message.Message):
    __slots__ = ("name", "operators")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OPERATORS_FIELD_NUMBER: _ClassVar[int]
    name: str
    operators: _containers.RepeatedCompositeFieldContainer[OperatorInfo]
    def __init__(self, name: _Optional[str] = ..., operators: _Optional[_Iterable[_Union[OperatorInfo, _Mapping]]] = ...) -> None: ...

class ReadAddress(_message.Message):
    __slots__ = ("router", "url", "grpc")
    ROUTER_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    GRPC_FIELD_NUMBER: _ClassVar[int]
    router: str
    url: str
    grpc: str
    def __init__(self, router: _Optional[str] = ..., url: _Optional[str] = ..., grpc: _Optional[str] = ...) -> None: ...

class PartitionHolder(_message.Message):
    __slots__ = ("server", "ready", "read_at")
    SERVER_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    READ_AT_FIELD_NUMBER: _ClassVar[int]
    server: str
    ready: bool
    read_at: _containers.RepeatedCompositeFieldContainer[ReadAddress]
    def __init__(self, server: _Optional[str] = ..., ready: _Optional[bool] = ..., read_at: _Optional[_Iterable[_Union[ReadAddress, _Mapping]]] = ...) -> None: ...

class PartitionOwners(_message.Message):
    __slots__ = ("partition", "owner", "followers")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    owner: PartitionHolder
    followers: _containers.RepeatedCompositeFieldContainer[PartitionHolder]
    def __init__(self, partition: _Optional[int] = ..., owner: _Optional[_Union[PartitionHolder, _Mapping]] = ..., followers: _Optional[_Iterable[_Union[PartitionHolder, _Mapping]]] = ...) -> None: ...

class OperatorMap(_message.Message):
    __slots__ = ("operator", "partitions", "owners")
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    operator: str
    partitions: int
    owners: _containers.RepeatedCompositeFieldContainer[PartitionOwners]
    def __init__(self, operator: _Optional[str] = ..., partitions: _Optional[int] = ..., owners: _Optional[_Iterable[_Union[PartitionOwners, _Mapping]]] = ...) -> None: ...

class ClusterMap(_message.Message):
    __slots__ = ("job", "epoch", "operators")
    JOB_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    OPERATORS_FIELD_NUMBER: _ClassVar[int]
    job: str
    epoch: int
    operators: _containers.RepeatedCompositeFieldContainer[OperatorMap]
    def __init__(self, job: _Optional[str] = ..., epoch: _Optional[int] = ..., operators: _Optional[_Iterable[_Union[OperatorMap, _Mapping]]] = ...) -> None: ...
