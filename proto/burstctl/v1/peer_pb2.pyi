from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DigestJobs(_message.Message):
    __slots__ = ("job_id", "user", "group", "nodes", "priority", "demand", "usage_bytes", "progress", "released_at", "posted_at", "remaining", "open_op", "transferred", "period_w", "period_vol", "period_learned", "resident", "pending", "mean_volume")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    USAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_AT_FIELD_NUMBER: _ClassVar[int]
    POSTED_AT_FIELD_NUMBER: _ClassVar[int]
    REMAINING_FIELD_NUMBER: _ClassVar[int]
    OPEN_OP_FIELD_NUMBER: _ClassVar[int]
    TRANSFERRED_FIELD_NUMBER: _ClassVar[int]
    PERIOD_W_FIELD_NUMBER: _ClassVar[int]
    PERIOD_VOL_FIELD_NUMBER: _ClassVar[int]
    PERIOD_LEARNED_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    MEAN_VOLUME_FIELD_NUMBER: _ClassVar[int]
    job_id: _containers.RepeatedScalarFieldContainer[str]
    user: _containers.RepeatedScalarFieldContainer[str]
    group: _containers.RepeatedScalarFieldContainer[str]
    nodes: _containers.RepeatedScalarFieldContainer[int]
    priority: _containers.RepeatedScalarFieldContainer[float]
    demand: _containers.RepeatedScalarFieldContainer[float]
    usage_bytes: _containers.RepeatedScalarFieldContainer[float]
    progress: _containers.RepeatedScalarFieldContainer[float]
    released_at: _containers.RepeatedScalarFieldContainer[float]
    posted_at: _containers.RepeatedScalarFieldContainer[float]
    remaining: _containers.RepeatedScalarFieldContainer[float]
    open_op: _containers.RepeatedScalarFieldContainer[bool]
    transferred: _containers.RepeatedScalarFieldContainer[float]
    period_w: _containers.RepeatedScalarFieldContainer[float]
    period_vol: _containers.RepeatedScalarFieldContainer[float]
    period_learned: _containers.RepeatedScalarFieldContainer[bool]
    resident: _containers.RepeatedScalarFieldContainer[float]
    pending: _containers.RepeatedScalarFieldContainer[float]
    mean_volume: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, job_id: _Optional[_Iterable[str]] = ..., user: _Optional[_Iterable[str]] = ..., group: _Optional[_Iterable[str]] = ..., nodes: _Optional[_Iterable[int]] = ..., priority: _Optional[_Iterable[float]] = ..., demand: _Optional[_Iterable[float]] = ..., usage_bytes: _Optional[_Iterable[float]] = ..., progress: _Optional[_Iterable[float]] = ..., released_at: _Optional[_Iterable[float]] = ..., posted_at: _Optional[_Iterable[float]] = ..., remaining: _Optional[_Iterable[float]] = ..., open_op: _Optional[_Iterable[bool]] = ..., transferred: _Optional[_Iterable[float]] = ..., period_w: _Optional[_Iterable[float]] = ..., period_vol: _Optional[_Iterable[float]] = ..., period_learned: _Optional[_Iterable[bool]] = ..., resident: _Optional[_Iterable[float]] = ..., pending: _Optional[_Iterable[float]] = ..., mean_volume: _Optional[_Iterable[float]] = ...) -> None: ...

class BufferBooks(_message.Message):
    __slots__ = ("size", "used", "drain_bandwidth")
    SIZE_FIELD_NUMBER: _ClassVar[int]
    USED_FIELD_NUMBER: _ClassVar[int]
    DRAIN_BANDWIDTH_FIELD_NUMBER: _ClassVar[int]
    size: float
    used: float
    drain_bandwidth: float
    def __init__(self, size: _Optional[float] = ..., used: _Optional[float] = ..., drain_bandwidth: _Optional[float] = ...) -> None: ...

class PatternOrigin(_message.Message):
    __slots__ = ("key", "origin")
    KEY_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    key: str
    origin: float
    def __init__(self, key: _Optional[str] = ..., origin: _Optional[float] = ...) -> None: ...

class Digest(_message.Message):
    __slots__ = ("replica_id", "incarnation", "sequence", "capacity", "node_bandwidth", "policy", "policy_params_json", "policy_version", "policy_origin", "jobs", "sent_at", "base_sequence", "left", "catalog", "buffer", "pattern")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    NODE_BANDWIDTH_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    POLICY_ORIGIN_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    BASE_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    BUFFER_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    incarnation: int
    sequence: int
    capacity: float
    node_bandwidth: float
    policy: str
    policy_params_json: str
    policy_version: int
    policy_origin: str
    jobs: DigestJobs
    sent_at: float
    base_sequence: int
    left: _containers.RepeatedScalarFieldContainer[str]
    catalog: _containers.RepeatedCompositeFieldContainer[CatalogRecord]
    buffer: BufferBooks
    pattern: PatternOrigin
    def __init__(self, replica_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., sequence: _Optional[int] = ..., capacity: _Optional[float] = ..., node_bandwidth: _Optional[float] = ..., policy: _Optional[str] = ..., policy_params_json: _Optional[str] = ..., policy_version: _Optional[int] = ..., policy_origin: _Optional[str] = ..., jobs: _Optional[_Union[DigestJobs, _Mapping]] = ..., sent_at: _Optional[float] = ..., base_sequence: _Optional[int] = ..., left: _Optional[_Iterable[str]] = ..., catalog: _Optional[_Iterable[_Union[CatalogRecord, _Mapping]]] = ..., buffer: _Optional[_Union[BufferBooks, _Mapping]] = ..., pattern: _Optional[_Union[PatternOrigin, _Mapping]] = ...) -> None: ...

class CatalogRecord(_message.Message):
    __slots__ = ("key", "version", "origin", "changed_at", "registration", "retired", "profile", "rule", "rule_removed")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    CHANGED_AT_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    RETIRED_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    RULE_REMOVED_FIELD_NUMBER: _ClassVar[int]
    key: str
    version: int
    origin: str
    changed_at: float
    registration: CatalogRegistration
    retired: CatalogRetired
    profile: CatalogProfile
    rule: CatalogRule
    rule_removed: CatalogRetired
    def __init__(self, key: _Optional[str] = ..., version: _Optional[int] = ..., origin: _Optional[str] = ..., changed_at: _Optional[float] = ..., registration: _Optional[_Union[CatalogRegistration, _Mapping]] = ..., retired: _Optional[_Union[CatalogRetired, _Mapping]] = ..., profile: _Optional[_Union[CatalogProfile, _Mapping]] = ..., rule: _Optional[_Union[CatalogRule, _Mapping]] = ..., rule_removed: _Optional[_Union[CatalogRetired, _Mapping]] = ...) -> None: ...

class CatalogRule(_message.Message):
    __slots__ = ("rank", "job", "user", "group", "app", "limit", "reservation", "weight", "metadata_ops")
    RANK_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    RESERVATION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    METADATA_OPS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    job: str
    user: str
    group: str
    app: str
    limit: float
    reservation: float
    weight: float
    metadata_ops: float
    def __init__(self, rank: _Optional[int] = ..., job: _Optional[str] = ..., user: _Optional[str] = ..., group: _Optional[str] = ..., app: _Optional[str] = ..., limit: _Optional[float] = ..., reservation: _Optional[float] = ..., weight: _Optional[float] = ..., metadata_ops: _Optional[float] = ...) -> None: ...

class CatalogRegistration(_message.Message):
    __slots__ = ("user", "group", "nodes", "priority", "w", "vol_io", "app")
    USER_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    W_FIELD_NUMBER: _ClassVar[int]
    VOL_IO_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    user: str
    group: str
    nodes: int
    priority: float
    w: float
    vol_io: float
    app: str
    def __init__(self, user: _Optional[str] = ..., group: _Optional[str] = ..., nodes: _Optional[int] = ..., priority: _Optional[float] = ..., w: _Optional[float] = ..., vol_io: _Optional[float] = ..., app: _Optional[str] = ...) -> None: ...

class CatalogRetired(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CatalogProfile(_message.Message):
    __slots__ = ("nodes", "volume_per_phase", "compute_seconds", "phases", "gaps", "bandwidth_replicas", "bandwidth")
    NODES_FIELD_NUMBER: _ClassVar[int]
    VOLUME_PER_PHASE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PHASES_FIELD_NUMBER: _ClassVar[int]
    GAPS_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    volume_per_phase: float
    compute_seconds: float
    phases: int
    gaps: int
    bandwidth_replicas: _containers.RepeatedScalarFieldContainer[int]
    bandwidth: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, nodes: _Optional[int] = ..., volume_per_phase: _Optional[float] = ..., compute_seconds: _Optional[float] = ..., phases: _Optional[int] = ..., gaps: _Optional[int] = ..., bandwidth_replicas: _Optional[_Iterable[int]] = ..., bandwidth: _Optional[_Iterable[float]] = ...) -> None: ...

class ExchangeReply(_message.Message):
    __slots__ = ("replica_id", "status", "field", "reason")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    status: str
    field: str
    reason: str
    def __init__(self, replica_id: _Optional[str] = ..., status: _Optional[str] = ..., field: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...
