from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KeyStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KEY_STATUS_UNSPECIFIED: _ClassVar[KeyStatus]
    FOUND: _ClassVar[KeyStatus]
    ABSENT: _ClassVar[KeyStatus]
    NOT_OWNED: _ClassVar[KeyStatus]
    RESTORING: _ClassVar[KeyStatus]
KEY_STATUS_UNSPECIFIED: KeyStatus
FOUND: KeyStatus
ABSENT: KeyStatus
NOT_OWNED: KeyStatus
RESTORING: KeyStatus

class PartitionDelta(_message.Message):
    __slots__ = ("partition", "has_delta", "rows", "fragments")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    HAS_DELTA_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    FRAGMENTS_FIELD_NUMBER: _ClassVar[int]
    partition: int
    has_delta: bool
    rows: int
    fragments: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, partition: _Optional[int] = ..., has_delta: _Optional[bool] = ..., rows: _Optional[int] = ..., fragments: _Optional[_Iterable[int]] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("job", "operator", "batch", "watermark_ms", "epoch", "partitions")
    JOB_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    job: str
    operator: str
    batch: int
    watermark_ms: int
    epoch: int
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionDelta]
    def __init__(self, job: _Optional[str] = ..., operator: _Optional[str] = ..., batch: _Optional[int] = ..., watermark_ms: _Optional[int] = ..., epoch: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[PartitionDelta, _Mapping]]] = ...) -> None: ...

class CommitReply(_message.Message):
    __slots__ = ("applied", "skipped", "caught_up_batches")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_FIELD_NUMBER: _ClassVar[int]
    CAUGHT_UP_BATCHES_FIELD_NUMBER: _ClassVar[int]
    applied: _containers.RepeatedScalarFieldContainer[int]
    skipped: _containers.RepeatedScalarFieldContainer[int]
    caught_up_batches: int
    def __init__(self, applied: _Optional[_Iterable[int]] = ..., skipped: _Optional[_Iterable[int]] = ..., caught_up_batches: _Optional[int] = ...) -> None: ...

class KeyQuery(_message.Message):
    __slots__ = ("key", "partition")
    KEY_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    key: str
    partition: int
    def __init__(self, key: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("job", "operator", "state", "keys", "range", "from_ms", "to_ms", "limit", "savepoint", "partitions")
    JOB_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    RANGE_FIELD_NUMBER: _ClassVar[int]
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    TO_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SAVEPOINT_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    job: str
    operator: str
    state: str
    keys: _containers.RepeatedCompositeFieldContainer[KeyQuery]
    range: bool
    from_ms: int
    to_ms: int
    limit: int
    savepoint: str
    partitions: int
    def __init__(self, job: _Optional[str] = ..., operator: _Optional[str] = ..., state: _Optional[str] = ..., keys: _Optional[_Iterable[_Union[KeyQuery, _Mapping]]] = ..., range: _Optional[bool] = ..., from_ms: _Optional[int] = ..., to_ms: _Optional[int] = ..., limit: _Optional[int] = ..., savepoint: _Optional[str] = ..., partitions: _Optional[int] = ...) -> None: ...

class Window(_message.Message):
    __slots__ = ("windowed", "start_ms", "end_ms", "int_value", "double_value")
    WINDOWED_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    windowed: bool
    start_ms: int
    end_ms: int
    int_value: int
    double_value: float
    def __init__(self, windowed: _Optional[bool] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., int_value: _Optional[int] = ..., double_value: _Optional[float] = ...) -> None: ...

class KeyResult(_message.Message):
    __slots__ = ("key", "status", "batch", "watermark_ms", "windows", "next_from_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FROM_MS_FIELD_NUMBER: _ClassVar[int]
    key: str
    status: KeyStatus
    batch: int
    watermark_ms: int
    windows: _containers.RepeatedCompositeFieldContainer[Window]
    next_from_ms: int
    def __init__(self, key: _Optional[str] = ..., status: _Optional[_Union[KeyStatus, str]] = ..., batch: _Optional[int] = ..., watermark_ms: _Optional[int] = ..., windows: _Optional[_Iterable[_Union[Window, _Mapping]]] = ..., next_from_ms: _Optional[int] = ...) -> None: ...

class LookupReply(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[KeyResult]
    def __init__(self, results: _Optional[_Iterable[_Union[KeyResult, _Mapping]]] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ("coordinator",)
    COORDINATOR_FIELD_NUMBER: _ClassVar[int]
    coordinator: str
    def __init__(self, coordinator: _Optional[str] = ...) -> None: ...

class PartitionInfo(_message.Message):
    __slots__ = ("job", "operator", "partition", "last_batch", "watermark_ms", "keys_estimate", "restoring", "epoch", "follower", "applied_ms")
    JOB_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LAST_BATCH_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    KEYS_ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    RESTORING_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    FOLLOWER_FIELD_NUMBER: _ClassVar[int]
    APPLIED_MS_FIELD_NUMBER: _ClassVar[int]
    job: str
    operator: str
    partition: int
    last_batch: int
    watermark_ms: int
    keys_estimate: int
    restoring: bool
    epoch: int
    follower: bool
    applied_ms: int
    def __init__(self, job: _Optional[str] = ..., operator: _Optional[str] = ..., partition: _Optional[int] = ..., last_batch: _Optional[int] = ..., watermark_ms: _Optional[int] = ..., keys_estimate: _Optional[int] = ..., restoring: _Optional[bool] = ..., epoch: _Optional[int] = ..., follower: _Optional[bool] = ..., applied_ms: _Optional[int] = ...) -> None: ...

class DescribeReply(_message.Message):
    __slots__ = ("server_id", "address", "partitions", "draining")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    address: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionInfo]
    draining: bool
    def __init__(self, server_id: _Optional[str] = ..., address: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionInfo, _Mapping]]] = ..., draining: _Optional[bool] = ...) -> None: ...

class TopRequest(_message.Message):
    __slots__ = ("job", "operator", "state", "partitions", "current", "start_ms", "n", "ascending", "partition_count", "savepoint")
    JOB_FIELD_NUMBER: _ClassVar[int]
    OPERATOR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    ASCENDING_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    SAVEPOINT_FIELD_NUMBER: _ClassVar[int]
    job: str
    operator: str
    state: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    current: bool
    start_ms: int
    n: int
    ascending: bool
    partition_count: int
    savepoint: str
    def __init__(self, job: _Optional[str] = ..., operator: _Optional[str] = ..., state: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ..., current: _Optional[bool] = ..., start_ms: _Optional[int] = ..., n: _Optional[int] = ..., ascending: _Optional[bool] = ..., partition_count: _Optional[int] = ..., savepoint: _Optional[str] = ...) -> None: ...

class TopEntry(_message.Message):
    __slots__ = ("key", "int_value", "double_value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    INT_VALUE_FIELD_NUMBER: _ClassVar[int]
    DOUBLE_VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    int_value: int
    double_value: float
    def __init__(self, key: _Optional[str] = ..., int_value: _Optional[int] = ..., double_value: _Optional[float] = ...) -> None: ...

class PartitionTop(_message.Message):
    __slots__ = ("partition", "status", "batch", "watermark_ms", "start_ms", "entries")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    WATERMARK_MS_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    partition: int
    status: KeyStatus
    batch: int
    watermark_ms: int
    start_ms: int
    entries: _containers.RepeatedCompositeFieldContainer[TopEntry]
    def __init__(self, partition: _Optional[int] = ..., status: _Optional[_Union[KeyStatus, str]] = ..., batch: _Optional[int] = ..., watermark_ms: _Optional[int] = ..., start_ms: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[TopEntry, _Mapping]]] = ...) -> None: ...

class TopReply(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionTop]
    def __init__(self, partitions: _Optional[_Iterable[_Union[PartitionTop, _Mapping]]] = ...) -> None: ...
