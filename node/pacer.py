"""Per-job pacing, for both shims: one client session per (job, user), all on one runtime.

For each job that does I/O through a shim, a `Pacer` keeps a `PacedJob`: its client session
(`burstctl.node.sessions`; created lazily on the job's first paced request, on the node's
`ClientRuntime`, so every job shares one loop thread and one channel), its requests in flight
and its open files (the mount's open files; the agent's attached processes).

- The mount paces each request itself: every read and write acquires its bytes from the job's
  session before it touches the backing file (`Pacer.data`), every metadata operation its
  job's metadata limit and ``metadata_cost`` bytes (`Pacer.metadata`; docs/fuse.md, "Metadata
  operations"). The node agent's processes pace themselves on a shared page (docs/preload.md);
  the agent books what they moved (`Pacer.admit`, `record`, `waiting`).
- I/O phases are the session's implicit operations: the first paced request after a quiet gap
  posts one (volume unknown), and the session completes it after ``quiet_gap`` seconds without
  a request. The pacer adds one rule: a job's last close ends its phase at once
  (`Session.end_phase`), unless the phase began less than `SHORT_PHASE` seconds ago (then the
  quiet gap ends it: a job working through many small files is one phase).
- A session is closed (Goodbye) once its job has had no request for ``session_idle`` seconds;
  the next request opens a new one. The idle sweep (`Pacer.sweep`, a timer on the runtime's
  loop) never waits for a job's lock (a request thread may hold it while it waits for that
  loop): a busy job is looked at again shortly.

The burst buffer (docs/capacity.md): the mount's sessions track it (``buffer=True``): a write
acquires its bandwidth, then its space (`Pacer.data` with ``space``); `Pacer.report_buffer`
hands each job's gauges (from the stage-out's index) to its session, and to its next one. The
stage-out's copies are paced on a second session per job, its drain session
(``purpose="drain"``, `Pacer.drain`), closed by the same idle sweep.

Controller trouble never fails a request (the session falls back; one closed under a request
lets it through unpaced). Only the kernel's interrupt ends a waiting request (`Interrupted`
through `data` and `metadata`, docs/fuse.md), which leaves as any request leaves.

Who may join a job is the controller's call (docs/security.md). Sessions are per (job, user),
so two users naming one job never share a session. The first request of a new session for a job
the caller named waits (at most ``attach_timeout``) for the controller's first answer; a session
the controller refuses with ``PERMISSION_DENIED`` is closed, `Attributor.deny` sends that uid's
requests naming the job to its own default job, and the request is paced again there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable

from burstctl.client.job import JobInfo
from burstctl.client.runtime import CLOSE_TIMEOUT, ClientRuntime
from burstctl.node.attribution import Attributor, Caller
from burstctl.node.sessions import (
    JobSession,
    PacingConfig,
    SessionFactory,
    client_session_factory,
    close_session,
    report_gauges,
)

logger = logging.getLogger(__name__)

# When a job's lock is taken during a sweep, how soon the sweep looks at that job again.
_BUSY_RECHECK = 0.05
# A job's last close ends its phase at once only once the phase has lasted this long: a job
# that opens, writes and closes thousands of small files (tar, a build) is one phase ended by
# the quiet gap, not one operation posted and completed per file.
SHORT_PHASE = 1.0


# What a refusal that redirects a caller to its own default job starts with (Session.refused).
_NOT_YOURS = "PERMISSION_DENIED"


class PacedJob:
    """One job's session and counters, as the pacer sees them; guarded by its own lock."""

    __slots__ = (
        "buffer",
        "drain",
        "drain_inflight",
        "drain_last",
        "forgotten",
        "held",
        "inflight",
        "job",
        "last_active",
        "lock",
        "open_files",
        "phase_started",
        "session",
        "untried",
    )

    def __init__(self, job: JobInfo, now: float) -> None:
        self.job = job
        self.lock = threading.Lock()
        self.session: JobSession | None = None
        self.inflight = 0
        self.open_files = 0
        self.last_active = now
        # When the job's current I/O phase began, as the pacer saw it (None: none open).
        self.phase_started: float | None = None
        self.forgotten = False  # dropped from the pacer by a sweep: look the job up again
        # The stage-out: the job's drain session, its copies in flight, when it last copied,
        # and the job's last buffer report (resident, pending, drain_error).
        self.drain: JobSession | None = None
        self.drain_inflight = 0
        self.drain_last = now
        self.buffer: tuple[int, int, str] | None = None
        self.untried = False  # its session opened by a report: its first request checks it
        # The session a wait elsewhere is held on (`Pacer.waiting`), counted in ``inflight``.
        self.held: JobSession | None = None


class Pacer:
    """Attributes requests to jobs and paces them through per-job client sessions.

    Sessions come from ``session_factory``, by default sessions of the client runtime on
    ``runtime``. With a ``runtime`` the idle sweep runs on its loop; without one (tests) the
    caller runs `sweep` itself.
    """

    def __init__(
        self,
        config: PacingConfig,
        attributor: Attributor,
        *,
        runtime: ClientRuntime | None = None,
        session_factory: SessionFactory | None = None,
        drain_session_factory: SessionFactory | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if session_factory is None:
            if runtime is None:
                raise ValueError("a Pacer needs a client runtime or a session factory")
            session_factory = client_session_factory(config, runtime)
            if drain_session_factory is None and config.stage_out is not None:
                drain_session_factory = client_session_factory(config, runtime, "drain")
        self._make_drain = drain_session_factory
        self.attributor = attributor
        self._config = config
        self._runtime = runtime
        self._make_session = session_factory
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[tuple[str, str], PacedJob] = {}  # by (job id, user)
        self._files: dict[int, PacedJob] = {}  # open file handle -> the job that opened it
        self._closing = False
        # The sweep's timer, on the runtime's loop only.
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    # ------------------------------------------------------------------ the request path

    def _job_state(self, caller: Caller) -> PacedJob:
        """The state of the caller's job, created on first sight."""
        return self._state_of(self.attributor.job_for(caller))

    def _state_of(self, job: JobInfo) -> PacedJob:
        with self._lock:
            state = self._jobs.get((job.job_id, job.user))
            if state is None:
                state = self._jobs[job.job_id, job.user] = PacedJob(job, self._clock())
            return state

    def _locked_state(self, caller: Caller | JobInfo) -> PacedJob:
        """`_job_state`, returned with its lock held, never one a sweep has dropped."""
        while True:
            if isinstance(caller, JobInfo):
                state = self._state_of(caller)
            else:
                state = self._job_state(caller)
            state.lock.acquire()
            if not state.forgotten:
                return state
            state.lock.release()

    def data(
        self, caller: Caller, kind: str, nbytes: int, *, space: bool = False
    ) -> JobSession | None:
        """Paces a read or write of ``nbytes`` before it is done; with ``space`` (a write to
        the burst buffer), then waits until the job's space grant covers the bytes too.

        Returns the session that granted the space (None: none did): the caller calls
        `landed` with it once the write is done and the job's resident bytes are reported,
        so that a report taken meanwhile counts the bytes as granted, not as on the buffer
        (docs/capacity.md, "The space contract")."""
        return self._pace(caller, kind, nbytes, space=space)

    def landed(self, session: JobSession, nbytes: int) -> None:
        """``nbytes`` granted by ``session`` (`data`) are written and reported. Never raises."""
        land = getattr(session, "space_landed", None)
        if land is not None:
            try:
                land(nbytes)
            except Exception:  # a closed session: nothing left to report
                logger.debug("space landed on a closed session", exc_info=True)

    def job_of(self, caller: Caller) -> JobInfo:
        """The job a caller's requests are booked to."""
        return self.attributor.job_for(caller)

    # ------------------------------------------------------------------ the stage-out

    def drain(self, job: JobInfo, nbytes: int) -> None:
        """Paces ``nbytes`` of the job's copy to the PFS on its drain session (opened on first
        use, closed by the sweep once idle). Without a drain factory: unpaced."""
        if self._make_drain is None:
            return
        state = self._locked_state(job)
        try:
            if self._closing:
                return
            opened = state.drain is None
            if state.drain is None:
                state.drain = self._make_drain(state.job)
                logger.info("job %s: drain session opened", job.job_id)
            drain = state.drain
            state.drain_inflight += 1
            state.drain_last = self._clock()
        finally:
            state.lock.release()
        if opened:
            self._sweep_by(self._clock() + self._config.session_idle)
        try:
            drain.acquire(nbytes, "write")
        except RuntimeError:
            pass  # closed under us (unmount, idle race): the copy goes on unpaced
        finally:
            with state.lock:
                state.drain_inflight -= 1
                state.drain_last = self._clock()

    def report_buffer(self, job: JobInfo, resident: int, pending: int, error: str) -> None:
        """The job's bytes on the buffer, given to its session (and to its next one). Gauges
        that changed while the job has none (a restarted mount's first report) open one: the
        books must not keep a parked resident the buffer no longer holds (docs/capacity.md)."""
        state = self._locked_state(job)
        gauges = (resident, pending, error)
        try:
            opened = state.session is None and state.buffer != gauges and not self._closing
            state.buffer = gauges
            if opened:
                state.session = self._make_session(state.job)
                state.last_active, state.untried = self._clock(), True
                logger.info("job %s: session opened for its bytes on the buffer", job.job_id)
            session = state.session
        finally:
            state.lock.release()
        if opened:
            self._sweep_by(self._clock() + self._config.session_idle)
        if session is not None:
            report_gauges(session, gauges)

    def metadata(self, caller: Caller) -> None:
        """Paces one metadata operation (at a cost of 0: no phase; for a user's default job
        only on a session its I/O opened, a stray ``ls`` being no job's I/O)."""
        cost = self._config.metadata_cost
        job = None if cost else self.attributor.job_for(caller)
        if job is None or job.job_id != f"user:{job.user}" or self.session_of(job) is not None:
            self._pace(caller, "metadata", cost)

    def opened(self, caller: Caller, fh: int) -> None:
        """Records that ``caller``'s job opened the backing file handle ``fh``."""
        state = self._locked_state(caller)
        try:
            state.open_files += 1
        finally:
            state.lock.release()
        with self._lock:
            self._files[fh] = state

    def released(self, fh: int) -> None:
        """Records the close of ``fh``; the job's last close ends its phase (unless short)."""
        with self._lock:
            state = self._files.pop(fh, None)
        if state is None:
            return
        with state.lock:
            state.open_files -= 1
            if (
                state.open_files == 0
                and state.inflight == 0
                and state.session is not None
                and state.phase_started is not None
                and self._clock() - state.phase_started >= SHORT_PHASE
            ):
                # Under the job's lock, so no request of the job starts in between.
                state.session.end_phase()
                state.phase_started = None

    def _pace(
        self, caller: Caller, kind: str, nbytes: int, *, space: bool = False
    ) -> JobSession | None:
        entered = self._enter(caller)
        if entered is None:
            return None
        state, session = entered
        try:
            if session is None:
                return None  # closed under us while attaching: let the I/O go
            if kind != "metadata" or nbytes:
                session.acquire(nbytes, kind)
            else:  # no bytes: no phase either
                session.acquire_metadata()
            if space:
                acquire_space = getattr(session, "acquire_space", None)
                if acquire_space is not None:
                    acquire_space(nbytes, landed=False)
                    return session
        except RuntimeError:
            pass  # the session was closed under us (unmount or idle close): let the I/O go
        finally:
            self._leave(state)
        return None

    def _enter(self, caller: Caller) -> tuple[PacedJob, JobSession | None] | None:
        """Counts a request in flight on the caller's job, opening its session if needed; a
        new session of a job the caller named first waits for the controller's answer, and a
        refusal sends the caller to its own default job. Returns the job's state and session
        (None: closed under us) — the caller then calls `_leave` — or None once closing."""
        for _ in range(2):  # a second time only under the caller's own default job
            state = self._locked_state(caller)
            try:
                session, opened = self._begin(state)
            finally:
                state.lock.release()
            if session is None:
                return None
            if opened:
                self._sweep_by(self._clock() + self._config.session_idle)
            try:
                if opened and state.job.job_id != f"user:{state.job.user}":
                    # A job the caller named: is it the caller's to join? (module docstring)
                    session.wait_attached(self._config.attach_timeout)
                if self._redirected(state, session, caller):
                    self._leave(state)
                    continue
            except RuntimeError:
                return state, None  # closed under us (unmount or idle close)
            except BaseException:
                self._leave(state)
                raise
            return state, session
        return None

    def _leave(self, state: PacedJob) -> None:
        """A request counted by `_enter` or `_begin` is over."""
        with state.lock:
            state.inflight -= 1
            state.last_active = self._clock()

    # ------------------------------------------------------------------ pacing done elsewhere

    def admit(self, caller: Caller) -> JobInfo | None:
        """The job ``caller``'s I/O is booked to, its session opened as the first paced request
        opens it (waiting for the controller's answer for a named job; a refusal: the caller's
        own default job). For I/O paced elsewhere (the node agent, docs/preload.md), which
        then books it with `record`. None once closing."""
        entered = self._enter(caller)
        if entered is None:
            return None
        state, _ = entered
        self._leave(state)
        return state.job

    def record(self, job: JobInfo, kind: str, nbytes: int, calls: int = 1) -> None:
        """Books ``nbytes`` of ``kind`` that the job moved in ``calls`` calls, paced
        elsewhere, on its session without waiting (opening one if the sweep closed it). Never
        raises for a closed session."""
        state = self._locked_state(job)
        try:
            session, opened = self._begin(state)
        finally:
            state.lock.release()
        if session is None:
            return
        if opened:
            self._sweep_by(self._clock() + self._config.session_idle)
        try:
            session.record(nbytes, kind, calls)
        except RuntimeError:
            pass  # closed under us: nothing to book it on
        finally:
            self._leave(state)

    def waiting(self, job: JobInfo, waiting: bool) -> None:
        """The job's I/O paced elsewhere is (not) waiting for tokens: one waiter on its
        session while it is (`Session.hold_waiting`), which keeps the session from the idle
        sweep as a blocked request does. Idempotent."""
        state = self._locked_state(job)
        try:
            if waiting == (state.held is not None):
                return
            if waiting:
                session, opened = self._begin(state)
                if session is None:
                    return
                state.held = session
            else:
                session, opened, state.held = state.held, False, None
        finally:
            state.lock.release()
        if opened:
            self._sweep_by(self._clock() + self._config.session_idle)
        assert session is not None
        try:
            session.hold_waiting(waiting)
        except RuntimeError:
            pass  # closed under us
        finally:
            if not waiting:
                self._leave(state)

    def session_of(self, job: JobInfo) -> JobSession | None:
        """The job's open session (None: none now)."""
        with self._lock:
            state = self._jobs.get((job.job_id, job.user))
        return None if state is None else state.session

    def _redirected(self, state: PacedJob, session: JobSession, caller: Caller) -> bool:
        """True when the controller refused ``caller``'s uid the job of ``state``: the session is
        closed and the attributor sends the uid's requests to its own default job."""
        refused = session.refused
        if (
            refused is None
            or not refused.startswith(_NOT_YOURS)
            or state.job.job_id == f"user:{state.job.user}"  # nowhere else to go: fallback
        ):
            return False
        self.attributor.deny(state.job.job_id, caller.uid, refused)
        with state.lock:
            mine = state.session is session
            if mine:
                state.session = None
        if mine:
            close_session(state.job, session, "refused")
        return True

    def _begin(self, state: PacedJob) -> tuple[JobSession | None, bool]:
        """Counts a request in flight on the job's session, opening one if needed (its lock is
        held); returns the session (None once closing) and whether it is new."""
        if self._closing:
            return None, False
        opened, state.untried = state.session is None or state.untried, False
        if state.session is None:
            state.session = self._make_session(state.job)
            logger.info("job %s: session opened", state.job.job_id)
            if state.buffer is not None:
                report_gauges(state.session, state.buffer)
        now = self._clock()
        if (
            state.phase_started is None
            or opened
            or (state.inflight == 0 and now - state.last_active >= self._config.quiet_gap)
        ):
            state.phase_started = now  # a new phase: the session posts a new operation
        state.inflight += 1
        state.last_active = now
        return state.session, opened

    # ------------------------------------------------------------------ idle sessions

    def sweep(self, now: float | None = None) -> float:
        """Closes idle sessions and forgets jobs with nothing open; returns the next deadline.

        Never waits for a job's lock (see the module docstring); never waits for a session to
        close.
        """
        now = self._clock() if now is None else now
        idle = self._config.session_idle
        draining = self._config.stage_out is not None  # else a session's resident stays parked
        next_at = math.inf
        to_close: list[tuple[JobInfo, JobSession]] = []
        with self._lock:
            states = list(self._jobs.values())
        for state in states:
            if not state.lock.acquire(blocking=False):
                next_at = min(next_at, now + _BUSY_RECHECK)
                continue
            try:
                session = state.session
                # With --stage-out, a job with bytes on the buffer keeps its session, idle or
                # not, until none are left: its evictions must reach the books (docs/capacity.md).
                holding = draining and state.buffer is not None and state.buffer[0] > 0
                if session is not None:
                    if state.inflight == 0 and now - state.last_active >= idle and not holding:
                        to_close.append((state.job, session))
                        state.session = None
                    else:
                        # In flight or holding: idle at the earliest ``idle`` after it ends.
                        since = now if state.inflight or holding else state.last_active
                        next_at = min(next_at, since + idle)
                drain = state.drain
                if drain is not None:
                    if state.drain_inflight == 0 and now - state.drain_last >= idle:
                        to_close.append((state.job, drain))
                        state.drain = None
                    else:
                        since = now if state.drain_inflight else state.drain_last
                        next_at = min(next_at, since + idle)
                # A job the stage-out reports on is kept: its last gauges say what is news.
                idle_job = (
                    state.session is None
                    and state.drain is None
                    and state.open_files == 0
                    and state.inflight == 0
                    and state.buffer is None
                )
            finally:
                state.lock.release()
            if idle_job:
                self._forget(state)
        for job, session in to_close:
            close_session(job, session, "quiet")
        return next_at

    def _forget(self, state: PacedJob) -> None:
        key = (state.job.job_id, state.job.user)
        with self._lock:
            if self._jobs.get(key) is not state:
                return
            if not state.lock.acquire(blocking=False):
                return  # busy again: not idle
            try:
                if (
                    state.session is None
                    and state.drain is None
                    and state.open_files == 0
                    and state.inflight == 0
                    and state.buffer is None
                ):
                    state.forgotten = True
                    del self._jobs[key]
            finally:
                state.lock.release()

    def _sweep_by(self, at: float) -> None:
        """Makes sure a sweep runs on the runtime's loop by ``at`` (any thread)."""
        if self._runtime is not None:
            with contextlib.suppress(RuntimeError):  # the runtime is closed: nothing to sweep
                self._runtime.loop.call_soon_threadsafe(self._arm, at)

    def _arm(self, at: float) -> None:
        """On the loop: (re)sets the sweep's timer to ``at`` unless it fires sooner already."""
        if self._closing or (self._timer is not None and self._timer_at <= at):
            return
        if self._timer is not None:
            self._timer.cancel()
        assert self._runtime is not None
        self._timer_at = at
        delay = max(0.0, at - self._clock())
        self._timer = self._runtime.loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, math.inf
        try:
            next_at = self.sweep()
        except Exception:  # never let the sweep die: idle sessions would never close
            logger.exception("pacer sweep failed")
            next_at = self._clock() + 1.0
        if math.isfinite(next_at):
            self._arm(next_at)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf

    # ------------------------------------------------------------------ inspection and close

    def jobs(self) -> dict[str, PacedJob]:
        """A snapshot of the known jobs by id (of two users' states of one job id, one shows)."""
        with self._lock:
            return {job_id: state for (job_id, _), state in self._jobs.items()}

    def close(self) -> None:
        """Ends every phase and closes every session (blocked acquires are let through).

        Waits until each session has said Goodbye (in parallel on the runtime's loop); not to be
        called on that loop. Idempotent.
        """
        with self._lock:
            self._closing = True
            states = list(self._jobs.values())
        if self._runtime is not None:
            with contextlib.suppress(RuntimeError):
                self._runtime.loop.call_soon_threadsafe(self._cancel_timer)
        closing = []
        for state in states:
            with state.lock:
                session, state.session = state.session, None
                drain, state.drain = state.drain, None
            for one in (session, drain):
                if one is not None:
                    closing.append(close_session(state.job, one, "unmount"))
        concurrent.futures.wait(closing, CLOSE_TIMEOUT)
