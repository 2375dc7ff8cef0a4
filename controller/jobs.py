"""The job table: soft state rebuilt from client sessions.

Jobs appear with the first ``Hello`` of one of their sessions, turn inactive
when their last session closes or stops heartbeating, and are removed
``job_retention`` seconds later. For each job the table keeps what policies
read (bandwidth-sharing paper §3): the post time R_i of the pending operation,
its volume and remaining volume V_i, τ_i, W_i^(done), V_i^(transferred), and a
demand ceiling derived from the sessions' usage reports.

Demand (what a job can use right now):
- a session without an open operation wants nothing;
- a session that is waiting on its bucket, or has not reported since its
  operation was posted, wants as much as it may get (b_i);
- otherwise it wants its measured rate (EWMA over reports) times a headroom,
  so that a job that asks for 5 MiB/s is given a little more than 5 and the rest
  goes to jobs that wait; if it then wants more it waits, and says so at once.

The table is single-threaded (the controller's event loop) and does no I/O.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from burstctl.common.limits import DEFAULT_MAX_OPEN_OPS, MAX_JOBS
from burstctl.controller.signal import Signal
from burstctl.policies.accounting import JobAccount, job_view
from burstctl.policies.schedule import Schedule
from burstctl.policies.view import BufferView, JobView, Periodic, SystemView, job_cap

log = logging.getLogger(__name__)

# A wait fraction above this in a report means the session wanted more.
WAIT_FRACTION_HUNGRY = 0.02
# Weight of the newest sample in the measured-rate EWMA.
RATE_EWMA_ALPHA = 0.5


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

    def __add__(self, other: Counters) -> Counters:
        return _combine(self, other, lambda x, y: x + y)

    def beyond(self, booked: Counters) -> Counters:
        """What these totals add to the totals ``booked`` before, per field (never < 0)."""
        return _combine(self, booked, lambda x, y: max(x - y, 0))

    def at_least(self, other: Counters) -> Counters:
        return _combine(self, other, max)


def _combine(a: Counters, b: Counters, op: Callable[[Any, Any], Any]) -> Counters:
    return Counters(
        bytes=op(a.bytes, b.bytes),
        bytes_read=op(a.bytes_read, b.bytes_read),
        bytes_written=op(a.bytes_written, b.bytes_written),
        ops=op(a.ops, b.ops),
        metadata_ops=op(a.metadata_ops, b.metadata_ops),
        wait_seconds=op(a.wait_seconds, b.wait_seconds),
    )


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
class SessionState:
    """One client stream attached to a job."""

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
    offered: float = 0.0  # last rate handed to the outbox (an increase may be held back)
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
    sessions: dict[int, SessionState] = field(default_factory=dict)
    # What the job moved, over its sessions and the controller's restarts (admin views
    # and metrics only; the policies read JobAccount); ``booked`` holds each session's
    # cumulative totals as last booked, by client_id (see ``JobTable.usage``).
    counters: Counters = field(default_factory=Counters)
    booked: dict[str, Counters] = field(default_factory=dict)
    # Drain streams (docs/capacity.md) and the bytes they copied to the PFS, booked apart
    # from the job's own I/O (``drain_booked``: each drain client's totals as last booked).
    drains: dict[int, SessionState] = field(default_factory=dict)
    drained: int = 0
    drain_booked: dict[str, int] = field(default_factory=dict)

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


class ProtocolError(ValueError):
    """A client message that breaks the protocol; ``field`` names the culprit."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.detail = message


class LimitError(Exception):
    """A limit of the controller reached (RESOURCE_EXHAUSTED); ``field`` names the culprit.

    ``retry``: the refusal is one of load (a full table), so retrying later may succeed and
    the client is told when; otherwise the client asked for more than any session may have.
    """

    def __init__(self, field_name: str, message: str, *, retry: bool = False) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.detail = message
        self.retry = retry


class JobTable:
    """Jobs and sessions of one replica.

    ``changed`` fires at every mutation that may change a decision;
    ``io_changed(job, in_io, now)`` when a job enters or leaves its I/O phase (S(t)
    changes: the peer exchange, the application profiles); ``job_added(job)`` with each
    job new to the table (the ledger carries its saved counters in).

    Bounded: at most ``max_jobs`` jobs (a new job beyond it takes the place of the job
    inactive the longest, and is refused with ``LimitError`` when every job is active) and
    ``max_open_ops`` open operations per session.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        heartbeat_timeout: float,
        job_retention: float,
        demand_headroom: float,
        max_jobs: int = MAX_JOBS,
        max_open_ops: int = DEFAULT_MAX_OPEN_OPS,
    ) -> None:
        self._clock = clock
        self.heartbeat_timeout = heartbeat_timeout
        self.job_retention = job_retention
        self.demand_headroom = demand_headroom
        self.max_jobs = max_jobs
        self.max_open_ops = max_open_ops
        # Inactive jobs, the longest inactive first: who makes room in a full table.
        self._inactive: dict[str, None] = {}
        self.changed: Signal[[]] = Signal()
        self.io_changed: Signal[[JobState, bool, float]] = Signal()
        self.job_added: Signal[[JobState]] = Signal()
        self.jobs: dict[str, JobState] = {}
        self.sessions: dict[int, SessionState] = {}
        self._next_sid = 1
        self._next_job = 0
        # Incremental view: rows of jobs in S(t), rebuilt only for jobs that changed.
        self._rows: dict[str, JobView] = {}
        self._periodic: dict[str, Periodic] = {}  # live jobs with a declared period
        self._dirty: set[str] = set()
        self._row_params: tuple[float, float] | None = None
        self.new_sessions: list[SessionState] = []  # not yet given a first allocation
        self.draining: dict[str, None] = {}  # jobs with a drain stream open (docs/capacity.md)
        self.drained_total = 0  # bytes drain streams copied to the PFS since start (/metrics)
        # Authoritative metadata (POST /v1/jobs, a Slurm prolog): wins over what clients claim.
        self.registered: dict[str, JobMeta] = {}
        self.counters_version = 0  # bumped whenever a job's counters change
        self.counted: set[str] = set()  # jobs whose counters changed since the ledger looked

    def _changed(self, job: JobState) -> None:
        self._dirty.add(job.job_id)
        self.changed()

    # -- sessions -------------------------------------------------------------
    def open_session(
        self,
        meta: JobMeta,
        client_id: str,
        host: str,
        *,
        drain: bool = False,
        outbox: Outbox | None = None,
    ) -> SessionState:
        """Opens a session with the metadata it was admitted with (``controller/trust.py``
        decides who may join which job). ``drain``: a drain stream (`SessionState.drain`);
        ``outbox``: where the scheduler offers its allocations (its gRPC stream).

        A registered job's metadata is the registration's. An unregistered job's is the most
        conservative claim of its live sessions (fewest nodes, lowest priority; user and
        group of the oldest): a claim binds no session but its own, and a job whose sessions
        are all gone takes the next session's claim afresh.
        """
        now = self._clock()
        registered = self.registered.get(meta.job_id)
        claim = meta
        if registered is not None:
            meta = registered
        job = self.jobs.get(meta.job_id)
        if job is None:
            self._make_room()
            job = self.jobs[meta.job_id] = JobState(meta=meta, first_seen=now, index=self._next_job)
            self._next_job += 1
            self.job_added(job)
        else:
            job.status = JobStatus.ACTIVE
            job.inactive_since = None
            self._inactive.pop(job.job_id, None)
        session = SessionState(
            sid=self._next_sid,
            job=job,
            client_id=client_id,
            host=host,
            opened_at=now,
            last_heard=now,
            claim=claim,
            drain=drain,
            outbox=outbox,
        )
        self._next_sid += 1
        self.sessions[session.sid] = session
        if drain:  # the scheduler's drain pass gives it its first allocation
            job.drains[session.sid] = session
            self.draining[job.job_id] = None
            self.changed()
            return session
        job.sessions[session.sid] = session
        self.new_sessions.append(session)
        self._merge_claims(job)
        self._changed(job)
        return session

    def _merge_claims(self, job: JobState) -> None:
        """An unregistered job's metadata from its live sessions' claims (`open_session`)."""
        registered = self.registered.get(job.job_id)
        if registered is not None:
            job.meta = registered
            return
        claims = [s.claim for s in job.sessions.values() if s.claim is not None]
        if not claims:
            return
        first = claims[0]
        merged = JobMeta(
            job_id=job.job_id,
            user=first.user,
            group=first.group,
            nodes=min(c.nodes for c in claims),
            priority=min(c.priority for c in claims),
            w=first.w,  # the oldest session's declared period
            vol_io=first.vol_io,
            app=first.app,
        )
        if merged != job.meta:
            if len(claims) > 1:
                log.info("job %s: its sessions' claims give %s", job.job_id, merged)
            job.meta = merged

    def close_session(self, session: SessionState) -> None:
        if session.closed:
            return
        now = self._clock()
        session.closed = True
        session.ops.clear()
        self.sessions.pop(session.sid, None)
        job = session.job
        job.sessions.pop(session.sid, None)
        if job.drains.pop(session.sid, None) is not None and not job.drains:
            self.draining.pop(job.job_id, None)
        self._update_phase(job, now)
        if not job.sessions and not job.drains:
            job.status = JobStatus.INACTIVE
            job.inactive_since = now
            self._inactive[job.job_id] = None
        else:
            self._merge_claims(job)
        self._changed(job)

    def _make_room(self) -> None:
        """Room for one more job: drops the job inactive the longest if the table is full;
        ``LimitError`` if every job in it is active."""
        if len(self.jobs) < self.max_jobs:
            return
        if not self._inactive:
            raise LimitError(
                "hello.job_id",
                f"the job table is full: max_jobs = {self.max_jobs} jobs, all active",
                retry=True,
            )
        oldest = next(iter(self._inactive))
        self._drop_job(oldest)
        log.info("job table full (max_jobs = %d): dropped inactive job %s", self.max_jobs, oldest)

    def _drop_job(self, job_id: str) -> None:
        del self.jobs[job_id]
        self._inactive.pop(job_id, None)
        self._dirty.add(job_id)

    def register(self, meta: JobMeta) -> None:
        """Makes ``meta`` the job's authoritative metadata, for its present and future
        sessions."""
        self.registered[meta.job_id] = meta
        self.set_meta(meta)

    def set_meta(self, meta: JobMeta) -> None:
        """Replaces a known job's metadata (its weight for the policies) at once."""
        job = self.jobs.get(meta.job_id)
        if job is not None and job.meta != meta:
            job.meta = meta
            self._changed(job)

    def retire(self, job_id: str) -> bool:
        """Forgets a registration (False if there was none). Sessions still open keep
        the job's metadata until they close."""
        return self.registered.pop(job_id, None) is not None

    def _update_phase(self, job: JobState, now: float) -> None:
        if job.update_phase(now):
            self.io_changed(job, job.in_io(), now)

    # -- client events --------------------------------------------------------
    def post(self, session: SessionState, op_id: int, kind: OpKind, volume: int) -> None:
        if op_id <= 0:
            raise ProtocolError("op_posted.op_id", "must be > 0")
        if op_id in session.ops:
            raise ProtocolError("op_posted.op_id", f"operation {op_id} is already open")
        if len(session.ops) >= self.max_open_ops:
            raise LimitError(
                "op_posted.op_id",
                f"more than max_open_ops = {self.max_open_ops} operations open on this session",
            )
        now = self._clock()
        session.last_heard = now
        session.ops[op_id] = PostedOp(op_id, kind, volume, now)
        session.reported_since_post = False
        self._update_phase(session.job, now)
        self._changed(session.job)

    def complete(self, session: SessionState, op_id: int) -> bool:
        """Completes an open operation; False (and nothing changes) if it is not open."""
        now = self._clock()
        session.last_heard = now
        op = session.ops.pop(op_id, None)
        if op is None:
            return False
        if not session.drain:  # a drain's operations are no phase of the job's
            session.job.op_completed(op.volume, op.moved)
        if not session.ops:
            session.idle_since = now
        self._update_phase(session.job, now)
        self._changed(session.job)
        return True

    def usage(
        self,
        session: SessionState,
        nbytes: int,
        ops: int,
        wait_seconds: float,
        interval: float,
        waiting: bool,
        totals: Counters | None = None,
    ) -> None:
        """A Usage report. ``nbytes``/``ops``/``wait_seconds`` (since the previous report)
        drive the demand; the job's counters book ``totals`` (the session's cumulative
        counters) beyond what was booked for its client_id, so a report lost with a stream
        or a restart is booked by the next one. Without totals (a minimal client) the
        deltas are booked, bytes under the kind of the open operations they fill."""
        now = self._clock()
        session.last_heard = now
        job = session.job
        if session.drain:
            self._drained(session, nbytes, totals)
        elif job.in_io() and nbytes:
            job.transfer(nbytes)
            self._dirty.add(job.job_id)  # V_i^(transferred) and V_i move; no decision needed
        by_kind = session.attribute(nbytes) if nbytes else {}
        before, booked_moved = job.counters, False
        if session.drain:
            pass  # booked as drained above, never as the job's own I/O
        elif totals is not None:
            key = session.client_id
            booked = job.booked.pop(key, None)
            job.counters += totals.beyond(booked) if booked is not None else totals
            job.booked[key] = totals.at_least(booked) if booked is not None else totals
            booked_moved = job.booked[key] != booked
            while len(job.booked) > MAX_BOOKED_SESSIONS:
                del job.booked[next(iter(job.booked))]
        else:
            metadata = bool(session.ops) and next(reversed(session.ops.values())).kind is (
                OpKind.METADATA
            )
            job.counters += Counters(
                bytes=nbytes,
                bytes_read=by_kind.get(OpKind.READ, 0),
                bytes_written=by_kind.get(OpKind.WRITE, 0),
                ops=ops,
                metadata_ops=ops if metadata else 0,
                wait_seconds=wait_seconds,
            )
        if booked_moved or job.counters != before:  # an idle heartbeat costs the ledger nothing
            self.counters_version += 1
            self.counted.add(job.job_id)
        was_hungry = session.hungry
        session.hungry = waiting or (
            interval > 0 and wait_seconds > WAIT_FRACTION_HUNGRY * interval
        )
        if interval > 0 and session.ops:
            sample = nbytes / interval
            prev = session.measured_rate
            session.measured_rate = (
                sample
                if prev is None or not session.reported_since_post
                else RATE_EWMA_ALPHA * sample + (1 - RATE_EWMA_ALPHA) * prev
            )
        first_report = not session.reported_since_post and bool(session.ops)
        session.reported_since_post = True
        # Compared with the rate last signalled, not the previous report, so that
        # an EWMA drifting in small steps still moves the ceiling once it adds up.
        if (
            first_report
            or was_hungry != session.hungry
            or (not session.hungry and _moved(session.signalled_rate, session.measured_rate))
        ):
            session.signalled_rate = session.measured_rate
            self._changed(job)

    def _drained(self, session: SessionState, nbytes: int, totals: Counters | None) -> None:
        """Books a drain stream's bytes as the job's ``drained`` (totals beyond what was
        booked for its client, as `usage` does for the job's own counters)."""
        job = session.job
        if totals is None:
            job.drained += nbytes
            self.drained_total += nbytes
            return
        key = session.client_id
        booked = job.drain_booked.pop(key, None)
        more = max(0, totals.bytes - booked) if booked is not None else totals.bytes
        job.drained += more
        self.drained_total += more
        job.drain_booked[key] = max(totals.bytes, booked or 0)
        while len(job.drain_booked) > MAX_BOOKED_SESSIONS:
            del job.drain_booked[next(iter(job.drain_booked))]

    def goodbye(self, session: SessionState) -> None:
        """The session leaves on purpose, after its last report: its booked totals are not
        needed any more (a later session with the same client_id starts from 0)."""
        if session.drain:
            session.job.drain_booked.pop(session.client_id, None)
            return
        if session.job.booked.pop(session.client_id, None) is not None:
            self.counters_version += 1  # the ledger forgets it too
            self.counted.add(session.job.job_id)

    # -- housekeeping ---------------------------------------------------------
    def expire(self, grace: float = 0.0) -> list[SessionState]:
        """Closes sessions silent for the heartbeat timeout (plus ``grace``); drops
        long-inactive jobs."""
        now = self._clock()
        limit = self.heartbeat_timeout + grace
        dead = [s for s in self.sessions.values() if now - s.last_heard > limit]
        for s in dead:
            self.close_session(s)
        # The longest inactive first (``_inactive`` is in that order): the scan stops at the
        # first job still within its retention, not at the end of a large table.
        while self._inactive:
            job_id = next(iter(self._inactive))
            job = self.jobs.get(job_id)
            if job is not None and (
                job.inactive_since is None or now - job.inactive_since < self.job_retention
            ):
                break
            if job is None:
                del self._inactive[job_id]
            else:
                self._drop_job(job_id)
        return dead

    # -- views ----------------------------------------------------------------
    def job_demand(self, job: JobState, cap: float) -> float:
        return min(cap, sum(s.demand(cap, self.demand_headroom) for s in job.sessions.values()))

    @property
    def clock(self) -> Callable[[], float]:
        """The table's clock: the time of its views (``SystemView.now``)."""
        return self._clock

    def view(
        self,
        capacity: float,
        node_bandwidth: float,
        seed: int = 0,
        buffer: BufferView | None = None,
    ) -> SystemView:
        """The jobs of S(t) (those with an open operation) as policies see them.

        Rows are cached and rebuilt only for jobs that changed since the last
        view: a job in S(t) is in its I/O phase, so its W_i^(done) is constant
        until its next event, and its transferred volume (hence P_i) changes
        only with a Usage report, which marks it changed.
        """
        now = self._clock()
        if self._row_params != (capacity, node_bandwidth):
            self._row_params = (capacity, node_bandwidth)
            self._dirty.update(self.jobs)
            self._rows.clear()
        periodic = self._periodic
        for job_id in self._dirty:
            job = self.jobs.get(job_id)
            live = job is not None and job.status is JobStatus.ACTIVE
            if live and job is not None and job.meta.w > 0 and job.meta.vol_io > 0:
                periodic[job_id] = Periodic(job.meta.nodes, job.meta.w, job.meta.vol_io)
            else:
                periodic.pop(job_id, None)
            if job is None or not live or not job.in_io():
                self._rows.pop(job_id, None)
            else:
                self._rows[job_id] = self._row(
                    job, now, job_cap(job.meta.nodes, node_bandwidth, capacity)
                )
        self._dirty.clear()
        return SystemView(
            now=now,
            capacity=capacity,
            node_bandwidth=node_bandwidth,
            jobs=self._rows,
            seed=seed,
            periodic=periodic,
            buffer=buffer,
        )

    def _row(self, job: JobState, now: float, cap: float) -> JobView:
        meta = job.meta
        return job_view(
            job,
            job.open_ops(),
            job_id=meta.job_id,
            user=meta.user,
            group=meta.group,
            nodes=meta.nodes,
            priority=meta.priority,
            cap=cap,
            demand=self.job_demand(job, cap),
            now=now,
        )


def _moved(old: float | None, new: float | None) -> bool:
    """A measured rate moved enough (10 %) to change a satisfied job's ceiling."""
    if old is None or new is None:
        return old is not new
    return abs(new - old) > 0.1 * max(old, 1.0)
