"""The job table's records: what it keeps per job, per session and per open operation.

``JobMeta`` (a job's metadata: the weight the policies read), ``JobState`` (one job of the
table: its sessions, its counters and the accounting policies read, ``JobAccount``),
``SessionRecord`` (the table's record of one client session: its open operations
``PostedOp``, its demand and the allocation bookkeeping the scheduler keeps on it),
``Counters`` (what a job or a session moved) and ``Outbox`` (where the scheduler offers a
session its allocations: its gRPC stream, ``controller/outbox.py``). Plain data; the job
table (``controller/jobs.py``) is the one that changes them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from burstctl.policies.accounting import JobAccount
from burstctl.policies.periods import PhaseLog
from burstctl.policies.schedule import Schedule


class Outbox(Protocol):
    """The session's stream, as the scheduler sees it."""

    def offer(self, rate: float, burst: float, epoch: int, lease: float, policy: str) -> None: ...


@runtime_checkable
class WindowsOutbox(Protocol):
    """An outbox that also carries a periodic pattern of windows (``Allocation.windows``);
    one that does not gets the pattern's mean rate only."""

    def offer_windows(
        self, rate: float, burst: float, epoch: int, lease: float, policy: str, windows: Schedule
    ) -> None: ...


class OpKind(enum.Enum):
    READ = "read"
    WRITE = "write"
    METADATA = "metadata"


@dataclass(slots=True)
class PostedOp:
    """An operation a session posted and has not completed."""

    op_id: int
    kind: OpKind
    volume: int  # 0 = unknown
    posted_at: float
    moved: int = 0  # bytes attributed to it so far


@dataclass(frozen=True, slots=True)
class Counters:
    """What a job (or one session, cumulatively) moved: the accounting the admin views show."""

    bytes: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    ops: int = 0
    metadata_ops: int = 0
    wait_seconds: float = 0.0

    # Written out field by field: these run for every usage report.
    def __add__(self, other: Counters) -> Counters:
        return Counters(
            self.bytes + other.bytes,
            self.bytes_read + other.bytes_read,
            self.bytes_written + other.bytes_written,
            self.ops + other.ops,
            self.metadata_ops + other.metadata_ops,
            self.wait_seconds + other.wait_seconds,
        )

    def beyond(self, booked: Counters) -> Counters:
        """What these totals add to the totals ``booked`` before, per field (never < 0)."""
        return Counters(
            max(self.bytes - booked.bytes, 0),
            max(self.bytes_read - booked.bytes_read, 0),
            max(self.bytes_written - booked.bytes_written, 0),
            max(self.ops - booked.ops, 0),
            max(self.metadata_ops - booked.metadata_ops, 0),
            max(self.wait_seconds - booked.wait_seconds, 0),
        )

    def at_least(self, other: Counters) -> Counters:
        return Counters(
            max(self.bytes, other.bytes),
            max(self.bytes_read, other.bytes_read),
            max(self.bytes_written, other.bytes_written),
            max(self.ops, other.ops),
            max(self.metadata_ops, other.metadata_ops),
            max(self.wait_seconds, other.wait_seconds),
        )

    def as_dict(self) -> dict[str, int | float]:
        """The fields by name (``dataclasses.asdict`` without its recursion: the ledger writes
        one per job and session every save)."""
        return {
            "bytes": self.bytes,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "ops": self.ops,
            "metadata_ops": self.metadata_ops,
            "wait_seconds": self.wait_seconds,
        }


# Sessions' booked totals a job remembers (one per client_id, least recently reporting
# dropped first): a session that said Goodbye is forgotten at once (it reports no more), so
# what stays is the live sessions and those that may reconnect after a broken stream.
MAX_BOOKED_SESSIONS = 256


@dataclass(slots=True)
class JobMeta:
    job_id: str
    user: str
    group: str
    nodes: int
    priority: float
    # a periodic job's declared period (policy persched): compute s and bytes per iteration
    w: float = 0.0  # 0: not declared
    vol_io: float = 0.0
    app: str = ""  # the application name of its profile (controller/profiles.py); "": none


@dataclass(eq=False, slots=True)
class SessionRecord:
    """The job table's record of one client session (one ``Session`` stream) of a job."""

    sid: int
    job: JobState
    client_id: str
    host: str
    opened_at: float
    last_heard: float
    ops: dict[int, PostedOp] = field(default_factory=dict)
    reported_since_post: bool = False
    idle_since: float | None = None  # when its last open operation completed
    hungry: bool = False
    measured_rate: float | None = None
    signalled_rate: float | None = None  # the measured rate the table last signalled a change for
    closed: bool = False
    # allocation bookkeeping, owned by the scheduler
    rate: float | None = None  # last rate pushed (None: nothing pushed yet)
    # the rate the client may pace at: the last rate handed to the outbox (an increase may be
    # held back), at first the Hello's pacing_rate (what it kept from an earlier stream)
    offered: float = 0.0
    offered_peak: float = 0.0  # the highest window rate of the pattern last handed, if any
    epoch: int = 0
    pushed_at: float = 0.0
    outbox: Outbox | None = None  # where the scheduler offers allocations
    schedule: Schedule | None = None  # the pattern of windows last pushed with ``rate``
    decided: int = 0  # number of the last decision that served it
    claim: JobMeta | None = None  # the metadata its Hello was admitted with (controller/trust.py)
    # A drain stream (Hello.purpose = DRAIN, docs/capacity.md): the job's copy from the burst
    # buffer to the PFS. Not a session of ``job.sessions`` (no row, no phase, no fairness):
    # one of ``job.drains``, its bytes booked as ``job.drained``.
    drain: bool = False

    def demand(self, cap: float, headroom: float) -> float:
        if not self.ops or self.closed:
            return 0.0
        if self.hungry or not self.reported_since_post or self.measured_rate is None:
            return cap
        return min(cap, self.measured_rate * headroom)

    def attribute(self, nbytes: int) -> dict[OpKind, int]:
        """Assigns moved bytes to open operations, oldest first, up to their volume;
        returns the bytes per operation kind.

        ``ops`` is in post order (dicts keep insertion order); what is left over
        goes to the newest operation.
        """
        ops = list(self.ops.values())
        by_kind: dict[OpKind, int] = {}
        for op in ops[:-1]:
            take = min(max(0, op.volume - op.moved) if op.volume > 0 else nbytes, nbytes)
            op.moved += take
            nbytes -= take
            if take:
                by_kind[op.kind] = by_kind.get(op.kind, 0) + take
        if ops:
            ops[-1].moved += nbytes
            by_kind[ops[-1].kind] = by_kind.get(ops[-1].kind, 0) + nbytes
        return by_kind


class JobStatus(enum.Enum):
    ACTIVE = "active"  # at least one live session
    INACTIVE = "inactive"  # no live session; removed after the retention time


@dataclass(eq=False, slots=True, kw_only=True)
class JobState(JobAccount):
    """One job of the table: its metadata, sessions and counters, and the accounting
    policies read (``JobAccount``: τ_i, phases, W_i^(done), V_i^(transferred))."""

    meta: JobMeta
    status: JobStatus = JobStatus.ACTIVE
    inactive_since: float | None = None
    sessions: dict[int, SessionRecord] = field(default_factory=dict)
    # What the job moved, over its sessions and the controller's restarts (admin views
    # and metrics only; the policies read JobAccount); ``booked`` holds each session's
    # cumulative totals as last booked, by client_id (see ``JobTable.usage``).
    counters: Counters = field(default_factory=Counters)
    booked: dict[str, Counters] = field(default_factory=dict)
    # Drain streams (docs/capacity.md) and the bytes they copied to the PFS, booked apart
    # from the job's own I/O (``drain_booked``: each drain client's totals as last booked).
    drains: dict[int, SessionRecord] = field(default_factory=dict)
    drained: int = 0
    drain_booked: dict[str, int] = field(default_factory=dict)
    # Its I/O phases as observed, and the period learned from them (policies/periods.py).
    phases: PhaseLog = field(default_factory=PhaseLog)
    # Metadata operations per second the whole job may make (0: no limit); each live session
    # here is offered its share (controller/metadata_qos.py).
    metadata_limit: float = 0.0

    @property
    def bytes_moved(self) -> int:
        return self.counters.bytes

    @property
    def bytes_read(self) -> int:
        return self.counters.bytes_read

    @property
    def bytes_written(self) -> int:
        return self.counters.bytes_written

    @property
    def ops_moved(self) -> int:
        return self.counters.ops

    @property
    def metadata_ops(self) -> int:
        return self.counters.metadata_ops

    @property
    def wait_seconds(self) -> float:
        return self.counters.wait_seconds

    @property
    def job_id(self) -> str:
        return self.meta.job_id

    def open_ops(self) -> Iterator[PostedOp]:
        for s in self.sessions.values():
            yield from s.ops.values()

    def update_phase(self, now: float) -> bool:
        """In I/O while any session has an open operation; True when that changed."""
        return self.set_phase(any(s.ops for s in self.sessions.values()), now)
