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

The table is single-threaded (the controller's event loop) and does no I/O. What it
keeps per job, session and operation is in ``controller/records.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from burstctl.common.limits import DEFAULT_MAX_OPEN_OPS, MAX_JOBS
from burstctl.controller.records import (
    MAX_BOOKED_SESSIONS,
    Counters,
    JobMeta,
    JobState,
    JobStatus,
    OpKind,
    Outbox,
    PostedOp,
    SessionRecord,
)
from burstctl.controller.signal import Signal
from burstctl.policies.accounting import job_view
from burstctl.policies.periods import Phase
from burstctl.policies.view import BufferView, JobView, Periodic, SystemView, job_cap

log = logging.getLogger(__name__)

# A wait fraction above this in a report means the session wanted more.
WAIT_FRACTION_HUNGRY = 0.02
# Weight of the newest sample in the measured-rate EWMA.
RATE_EWMA_ALPHA = 0.5


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
    changes: the peer exchange); ``phase_ended(job, phase)`` when an I/O phase ended, with
    the phase as observed (``JobState.phases``, which also learns the job's period from it;
    the application profiles record it); ``job_added(job)`` with each job new to the table
    (the ledger carries its saved counters in).

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
        self.phase_ended: Signal[[JobState, Phase]] = Signal()
        self.job_added: Signal[[JobState]] = Signal()
        self.jobs: dict[str, JobState] = {}
        self.sessions: dict[int, SessionRecord] = {}
        self._next_sid = 1
        self._next_job = 0
        # Incremental view: rows of jobs in S(t), rebuilt only for jobs that changed.
        self._rows: dict[str, JobView] = {}
        self._periodic: dict[str, Periodic] = {}  # live jobs with a declared period
        self._dirty: set[str] = set()
        self._row_params: tuple[float, float] | None = None
        self.new_sessions: list[SessionRecord] = []  # not yet given a first allocation
        self.draining: dict[str, None] = {}  # jobs with a drain stream open (docs/capacity.md)
        self.drained_total = 0  # bytes drain streams copied to the PFS (/metrics; the ledger's)
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
    ) -> SessionRecord:
        """Opens a session with the metadata it was admitted with (``controller/trust.py``
        decides who may join which job). ``drain``: a drain stream (`SessionRecord.drain`);
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
        session = SessionRecord(
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

    def close_session(self, session: SessionRecord) -> None:
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
            in_io = job.in_io()
            if in_io:
                job.phases.start(now, job.counters.bytes)
            else:
                phase = job.phases.end(now, job.counters.bytes)
                if phase is not None:
                    self.phase_ended(job, phase)
            self.io_changed(job, in_io, now)

    # -- client events --------------------------------------------------------
    def post(self, session: SessionRecord, op_id: int, kind: OpKind, volume: int) -> None:
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

    def complete(self, session: SessionRecord, op_id: int, quiet: float = 0.0) -> bool:
        """Completes an open operation; False (and nothing changes) if it is not open.
        ``quiet``: seconds it stayed open after its last byte (the client's quiet gap)."""
        now = self._clock()
        session.last_heard = now
        op = session.ops.pop(op_id, None)
        if op is None:
            return False
        if quiet > 0.0 and not session.drain:
            session.job.phases.last_byte(now - quiet)
        if not session.drain:  # a drain's operations are no phase of the job's
            session.job.op_completed(op.volume, op.moved)
        if not session.ops:
            session.idle_since = now
        self._update_phase(session.job, now)
        self._changed(session.job)
        return True

    def usage(
        self,
        session: SessionRecord,
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
            job.phases.moved(now)
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

    def _drained(self, session: SessionRecord, nbytes: int, totals: Counters | None) -> None:
        """Books a drain stream's bytes as the job's ``drained`` (totals beyond what was
        booked for its client, as `usage` does for the job's own counters)."""
        job = session.job
        if totals is None:
            more = nbytes
        else:
            key = session.client_id
            booked = job.drain_booked.pop(key, None)
            more = max(0, totals.bytes - booked) if booked is not None else totals.bytes
            job.drain_booked[key] = max(totals.bytes, booked or 0)
            while len(job.drain_booked) > MAX_BOOKED_SESSIONS:
                del job.drain_booked[next(iter(job.drain_booked))]
        if more:  # the ledger saves it (an idle drain's heartbeat costs it nothing)
            job.drained += more
            self.drained_total += more
            self.counters_version += 1
            self.counted.add(job.job_id)

    def goodbye(self, session: SessionRecord) -> None:
        """The session leaves on purpose, after its last report: its booked totals are not
        needed any more (a later session with the same client_id starts from 0)."""
        if session.drain:
            if session.job.drain_booked.pop(session.client_id, None) is not None:
                self.counters_version += 1  # the ledger forgets it too
                self.counted.add(session.job.job_id)
            return
        if session.job.booked.pop(session.client_id, None) is not None:
            self.counters_version += 1  # the ledger forgets it too
            self.counted.add(session.job.job_id)

    # -- housekeeping ---------------------------------------------------------
    def expire(self, grace: float = 0.0) -> list[SessionRecord]:
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
            period = self.periodic_of(job) if live and job is not None else None
            if period is not None:
                periodic[job_id] = period
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

    def periodic_of(self, job: JobState) -> Periodic | None:
        """The job's period as the policies use it: declared (registration or client), else
        learned from its phases once confident (docs/persched.md, "Learned periods"), else
        None."""
        meta = job.meta
        if meta.w > 0 and meta.vol_io > 0:
            return Periodic(meta.nodes, meta.w, meta.vol_io)
        learned = job.phases.estimate
        if learned is None or not learned.confident:
            return None
        return Periodic(meta.nodes, learned.w, learned.vol_io, True, learned.confidence)

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
