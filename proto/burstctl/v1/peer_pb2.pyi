from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobDigest(_message.Message):
    __slots__ = ("job_id", "user", "group", "nodes", "priority", "demand", "usage_bytes", "progress", "released_at", "posted_at", "remaining", "open_op", "transferred")
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
    job_id: str
    user: str
    group: str
    nodes: int
    priority: float
    demand: float
    usage_bytes: float
    progress: float
    released_at: float
    posted_at: float
    remaining: float
    open_op: bool
    transferred: float
    def __init__(self, job_id: _Optional[str] = ..., user: _Optional[str] = ..., group: _Optional[str] = ..., nodes: _Optional[int] = ..., priority: _Optional[float] = ..., demand: _Optional[float] = ..., usage_bytes: _Optional[float] = ..., progress: _Optional[float] = ..., released_at: _Optional[float] = ..., posted_at: _Optional[float] = ..., remaining: _Optional[float] = ..., open_op: _Optional[bool] = ..., transferred: _Optional[float] = ...) -> None: ...

class Digest(_message.Message):
    __slots__ = ("replica_id", "incarnation", "epoch", "capacity", "node_bandwidth", "policy", "policy_params_json", "policy_version", "jobs")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    NODE_BANDWIDTH_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    POLICY_PARAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    incarnation: int
    epoch: int
    capacity: float
    node_bandwidth: float
    policy: str
    policy_params_json: str
    policy_version: int
    jobs: _containers.RepeatedCompositeFieldContainer[JobDigest]
    def __init__(self, replica_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., epoch: _Optional[int] = ..., capacity: _Optional[float] = ..., node_bandwidth: _Optional[float] = ..., policy: _Optional[str] = ..., policy_params_json: _Optional[str] = ..., policy_version: _Optional[int] = ..., jobs: _Optional[_Iterable[_Union[JobDigest, _Mapping]]] = ...) -> None: ...

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
