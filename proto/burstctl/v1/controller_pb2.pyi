from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OP_KIND_UNSPECIFIED: _ClassVar[OpKind]
    OP_KIND_READ: _ClassVar[OpKind]
    OP_KIND_WRITE: _ClassVar[OpKind]
    OP_KIND_METADATA: _ClassVar[OpKind]

class Purpose(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PURPOSE_APP: _ClassVar[Purpose]
    PURPOSE_DRAIN: _ClassVar[Purpose]
OP_KIND_UNSPECIFIED: OpKind
OP_KIND_READ: OpKind
OP_KIND_WRITE: OpKind
OP_KIND_METADATA: OpKind
PURPOSE_APP: Purpose
PURPOSE_DRAIN: Purpose

class Hello(_message.Message):
    __slots__ = ("job_id", "user", "group", "nodes", "priority", "client_id", "host", "period_w", "period_vol", "purpose", "buffer", "pacing_rate", "allotted")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PERIOD_W_FIELD_NUMBER: _ClassVar[int]
    PERIOD_VOL_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    PACING_RATE_FIELD_NUMBER: _ClassVar[int]
    ALLOTTED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    user: str
    group: str
    nodes: int
    priority: float
    client_id: str
    host: str
    period_w: float
    period_vol: float
    purpose: Purpose
    buffer: Buffer
    pacing_rate: float
    allotted: float
    def __init__(self, job_id: _Optional[str] = ..., user: _Optional[str] = ..., group: _Optional[str] = ..., nodes: _Optional[int] = ..., priority: _Optional[float] = ..., client_id: _Optional[str] = ..., host: _Optional[str] = ..., period_w: _Optional[float] = ..., period_vol: _Optional[float] = ..., purpose: _Optional[_Union[Purpose, str]] = ..., buffer: _Optional[_Union[Buffer, _Mapping]] = ..., pacing_rate: _Optional[float] = ..., allotted: _Optional[float] = ...) -> None: ...

class Buffer(_message.Message):
    __slots__ = ("resident", "pending", "added", "drain_error")
    RESIDENT_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    DRAIN_ERROR_FIELD_NUMBER: _ClassVar[int]
    resident: int
    pending: int
    added: int
    drain_error: str
    def __init__(self, resident: _Optional[int] = ..., pending: _Optional[int] = ..., added: _Optional[int] = ..., drain_error: _Optional[str] = ...) -> None: ...

class OpPosted(_message.Message):
    __slots__ = ("op_id", "kind", "volume")
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VOLUME_FIELD_NUMBER: _ClassVar[int]
    op_id: int
    kind: OpKind
    volume: int
    def __init__(self, op_id: _Optional[int] = ..., kind: _Optional[_Union[OpKind, str]] = ..., volume: _Optional[int] = ...) -> None: ...

class OpCompleted(_message.Message):
    __slots__ = ("op_id", "quiet_seconds")
    OP_ID_FIELD_NUMBER: _ClassVar[int]
    QUIET_SECONDS_FIELD_NUMBER: _ClassVar[int]
    op_id: int
    quiet_seconds: float
    def __init__(self, op_id: _Optional[int] = ..., quiet_seconds: _Optional[float] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("bytes", "ops", "wait_seconds", "interval_seconds", "waiting", "totals", "applied_epoch", "buffer")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    ops: int
    wait_seconds: float
    interval_seconds: float
    waiting: bool
    totals: Counters
    applied_epoch: int
    buffer: Buffer
    def __init__(self, bytes: _Optional[int] = ..., ops: _Optional[int] = ..., wait_seconds: _Optional[float] = ..., interval_seconds: _Optional[float] = ..., waiting: _Optional[bool] = ..., totals: _Optional[_Union[Counters, _Mapping]] = ..., applied_epoch: _Optional[int] = ..., buffer: _Optional[_Union[Buffer, _Mapping]] = ...) -> None: ...

class Counters(_message.Message):
    __slots__ = ("bytes", "bytes_read", "bytes_written", "ops", "metadata_ops", "wait_seconds")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_READ_FIELD_NUMBER: _ClassVar[int]
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    METADATA_OPS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    bytes_read: int
    bytes_written: int
    ops: int
    metadata_ops: int
    wait_seconds: float
    def __init__(self, bytes: _Optional[int] = ..., bytes_read: _Optional[int] = ..., bytes_written: _Optional[int] = ..., ops: _Optional[int] = ..., metadata_ops: _Optional[int] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class Goodbye(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Leave(_message.Message):
    __slots__ = ("pacing_rate",)
    PACING_RATE_FIELD_NUMBER: _ClassVar[int]
    pacing_rate: float
    def __init__(self, pacing_rate: _Optional[float] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ClientMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ClientMessage, _Mapping]]] = ...) -> None: ...

class ClientMessage(_message.Message):
    __slots__ = ("hello", "op_posted", "op_completed", "usage", "goodbye", "batch", "leave", "session")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    OP_POSTED_FIELD_NUMBER: _ClassVar[int]
    OP_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    LEAVE_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    op_posted: OpPosted
    op_completed: OpCompleted
    usage: Usage
    goodbye: Goodbye
    batch: Batch
    leave: Leave
    session: int
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., op_posted: _Optional[_Union[OpPosted, _Mapping]] = ..., op_completed: _Optional[_Union[OpCompleted, _Mapping]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., goodbye: _Optional[_Union[Goodbye, _Mapping]] = ..., batch: _Optional[_Union[Batch, _Mapping]] = ..., leave: _Optional[_Union[Leave, _Mapping]] = ..., session: _Optional[int] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("rate", "burst", "epoch", "lease_seconds", "policy", "replica_id", "windows", "space", "fallback_rate", "heartbeat_seconds", "advice", "metadata_rate")
    RATE_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    SPACE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_RATE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ADVICE_FIELD_NUMBER: _ClassVar[int]
    METADATA_RATE_FIELD_NUMBER: _ClassVar[int]
    rate: float
    burst: float
    epoch: int
    lease_seconds: float
    policy: str
    replica_id: str
    windows: Windows
    space: Space
    fallback_rate: float
    heartbeat_seconds: float
    advice: Advice
    metadata_rate: float
    def __init__(self, rate: _Optional[float] = ..., burst: _Optional[float] = ..., epoch: _Optional[int] = ..., lease_seconds: _Optional[float] = ..., policy: _Optional[str] = ..., replica_id: _Optional[str] = ..., windows: _Optional[_Union[Windows, _Mapping]] = ..., space: _Optional[_Union[Space, _Mapping]] = ..., fallback_rate: _Optional[float] = ..., heartbeat_seconds: _Optional[float] = ..., advice: _Optional[_Union[Advice, _Mapping]] = ..., metadata_rate: _Optional[float] = ...) -> None: ...

class Advice(_message.Message):
    __slots__ = ("replicas",)
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replicas: _Optional[_Iterable[str]] = ...) -> None: ...

class Space(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class Windows(_message.Message):
    __slots__ = ("period_seconds", "origin_seconds", "window")
    PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    period_seconds: float
    origin_seconds: float
    window: _containers.RepeatedCompositeFieldContainer[Window]
    def __init__(self, period_seconds: _Optional[float] = ..., origin_seconds: _Optional[float] = ..., window: _Optional[_Iterable[_Union[Window, _Mapping]]] = ...) -> None: ...

class Window(_message.Message):
    __slots__ = ("start_seconds", "end_seconds", "rate")
    START_SECONDS_FIELD_NUMBER: _ClassVar[int]
    END_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    start_seconds: float
    end_seconds: float
    rate: float
    def __init__(self, start_seconds: _Optional[float] = ..., end_seconds: _Optional[float] = ..., rate: _Optional[float] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "field", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: str
    field: str
    message: str
    def __init__(self, code: _Optional[str] = ..., field: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class SessionEnd(_message.Message):
    __slots__ = ("code", "message", "retry_after_ms")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_MS_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    retry_after_ms: int
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., retry_after_ms: _Optional[int] = ...) -> None: ...

class Renew(_message.Message):
    __slots__ = ("lease_seconds",)
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    lease_seconds: float
    def __init__(self, lease_seconds: _Optional[float] = ...) -> None: ...

class ServerBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ServerMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ServerMessage, _Mapping]]] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("allocation", "error", "end", "batch", "renew", "session")
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    RENEW_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    allocation: Allocation
    error: Error
    end: SessionEnd
    batch: ServerBatch
    renew: Renew
    session: int
    def __init__(self, allocation: _Optional[_Union[Allocation, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., end: _Optional[_Union[SessionEnd, _Mapping]] = ..., batch: _Optional[_Union[ServerBatch, _Mapping]] = ..., renew: _Optional[_Union[Renew, _Mapping]] = ..., session: _Optional[int] = ...) -> None: ...
