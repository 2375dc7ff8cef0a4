"""Pacing for the mount: one client session per job, I/O phases, and their lifecycles.

For each job that does I/O through the mount, a `Pacer` keeps a `JobState`: a
`burstctl.client.Session` (created lazily on the job's first paced request), the job's current
I/O phase, its in-flight requests and its open files.

- Every read and write acquires its bytes from the job's session before it touches the backing
  file. Metadata operations acquire ``metadata_cost`` bytes of kind ``metadata``; with the
  default cost of 0 they are neither paced nor posted.
- Phases: the first paced request after a quiet gap posts an operation of unknown volume
  (``Session.operation(kind, 0)``); it completes once the job has been quiet for
  ``quiet_gap`` seconds, or at once when the job's last open file is closed.
- A session is closed (Goodbye) once its job has been quiet for ``session_idle`` seconds; the
  next request opens a new one.

A background thread (``burstctl-pacer``) runs `Pacer.sweep` at the next deadline. Controller
trouble never fails a request: the session falls back as configured, and a session closed under
a request (shutdown, idle race) lets the request through unpaced.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from burstctl.client.fallback import Fallback
from burstctl.client.job import JobInfo
from burstctl.fuse_shim.attribution import Attributor, Caller

logger = logging.getLogger(__name__)

DEFAULT_QUIET_GAP = 0.05
DEFAULT_SESSION_IDLE = 10.0
DEFAULT_ATTACH_TIMEOUT = 2.0


class PhaseHandle(Protocol):
    """What `Session.operation` returns (entered now, exited when the phase ends)."""

    def __enter__(self) -> object: ...

    def __exit__(self, *exc: object) -> object: ...


class SessionLike(Protocol):
    """The part of `burstctl.client.Session` the pacer uses (tests pass fakes)."""

    def acquire(self, nbytes: int, kind: str = "write") -> None: ...

    def operation(self, kind: str, volume: int = 0) -> PhaseHandle: ...

    def close(self) -> None: ...


SessionFactory = Callable[[JobInfo], SessionLike]


@dataclass(frozen=True, slots=True)
class PacingOptions:
    """How the mount paces: the controller, the fallback and the timing parameters."""

    controller: str
    fallback: Fallback = field(default_factory=lambda: Fallback.parse("keep-last"))
    quiet_gap: float = DEFAULT_QUIET_GAP
    session_idle: float = DEFAULT_SESSION_IDLE
    metadata_cost: int = 0
    attach_timeout: float = DEFAULT_ATTACH_TIMEOUT

    def __post_init__(self) -> None:
        for name in ("quiet_gap", "session_idle", "attach_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        if self.metadata_cost < 0:
            raise ValueError(f"metadata_cost must be >= 0 bytes, got {self.metadata_cost!r}")


def client_session_factory(options: PacingOptions) -> SessionFactory:
    """Sessions of the client runtime, one per job, with the mount's options."""

    def make(job: JobInfo) -> SessionLike:
        from burstctl.client.session import Session

        return Session(
            options.controller,
            job,
            options.fallback,
            quiet_gap=options.quiet_gap,
            attach_timeout=options.attach_timeout,
        )

    return make


class JobState:
    """One job's session, phase and counters; guarded by its own lock."""

    __slots__ = (
        "inflight",
        "job",
        "last_active",
        "lock",
        "open_files",
        "phase",
        "phases",
        "session",
    )

    def __init__(self, job: JobInfo, now: float) -> None:
        self.job = job
        self.lock = threading.Lock()
        self.session: SessionLike | None = None
        self.phase: PhaseHandle | None = None
        self.inflight = 0
        self.open_files = 0
        self.last_active = now
        self.phases = 0  # phases posted so far, for tests and logs


class Pacer:
    """Attributes requests to jobs and paces them through per-job client sessions."""

    def __init__(
        self,
        options: PacingOptions,
        attributor: Attributor,
        *,
        session_factory: SessionFactory | None = None,
        clock: Callable[[], float] = time.monotonic,
        start_thread: bool = True,
    ) -> None:
        self.options = options
        self.attributor = attributor
        self._make_session = session_factory or client_session_factory(options)
        self._clock = clock
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._jobs: dict[str, JobState] = {}
        self._files: dict[int, JobState] = {}  # open file handle -> the job that opened it
        self._closing = False
        self._thread: threading.Thread | None = None
        if start_thread:
            self._thread = threading.Thread(target=self._run, name="burstctl-pacer", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ the request path

    def job_state(self, caller: Caller) -> JobState:
        """The state of the caller's job, created on first sight."""
        job = self.attributor.job_for(caller)
        with self._lock:
            state = self._jobs.get(job.job_id)
            if state is None:
                state = self._jobs[job.job_id] = JobState(job, self._clock())
            return state

    def data(self, caller: Caller, kind: str, nbytes: int) -> None:
        """Paces a read or write of ``nbytes`` before it is done."""
        self._pace(self.job_state(caller), kind, nbytes)

    def metadata(self, caller: Caller) -> None:
        """Paces one metadata operation (a no-op while the metadata cost is 0)."""
        if self.options.metadata_cost > 0:
            self._pace(self.job_state(caller), "metadata", self.options.metadata_cost)

    def opened(self, caller: Caller, fh: int) -> None:
        """Records that ``caller``'s job opened the backing file handle ``fh``."""
        state = self.job_state(caller)
        with state.lock:
            state.open_files += 1
        with self._lock:
            self._files[fh] = state

    def released(self, fh: int) -> None:
        """Records the close of ``fh``; the job's last close ends its phase."""
        with self._lock:
            state = self._files.pop(fh, None)
        if state is None:
            return
        phase = None
        with state.lock:
            state.open_files -= 1
            if state.open_files == 0 and state.inflight == 0:
                phase, state.phase = state.phase, None
        if phase is not None:
            _end_phase(state.job, phase)

    def _pace(self, state: JobState, kind: str, nbytes: int) -> None:
        session = self._begin(state, kind)
        if session is None:
            return
        try:
            session.acquire(nbytes, kind)
        except RuntimeError:
            pass  # the session was closed under us (shutdown or idle close): let the I/O go
        finally:
            with state.lock:
                state.inflight -= 1
                state.last_active = self._clock()

    def _begin(self, state: JobState, kind: str) -> SessionLike | None:
        """Counts a request in flight, with a session and an open phase; None when closing."""
        new_phase = False
        with state.lock:
            if self._closing:
                return None
            if state.session is None:
                state.session = self._make_session(state.job)
                logger.info("job %s: session opened", state.job.job_id)
            session = state.session
            state.inflight += 1
            state.last_active = self._clock()
            if state.phase is None:
                try:
                    phase = session.operation(kind, 0)
                    phase.__enter__()
                except (RuntimeError, ValueError) as err:
                    logger.debug("job %s: no phase posted: %s", state.job.job_id, err)
                else:
                    state.phase = phase
                    state.phases += 1
                    new_phase = True
        if new_phase:
            with self._wakeup:
                self._wakeup.notify()
        return session

    # ------------------------------------------------------------------ quiet gaps and idling

    def sweep(self, now: float | None = None) -> float:
        """Ends quiet phases and closes idle sessions; returns the next deadline (or inf)."""
        now = self._clock() if now is None else now
        gap, idle = self.options.quiet_gap, self.options.session_idle
        ended: list[tuple[JobInfo, PhaseHandle]] = []
        to_close: list[tuple[JobInfo, SessionLike]] = []
        next_at = math.inf
        with self._lock:
            states = list(self._jobs.values())
        for state in states:
            with state.lock:
                if state.inflight:
                    next_at = min(next_at, now + max(gap, 0.01))
                    continue
                if state.phase is not None:
                    if now - state.last_active >= gap:
                        ended.append((state.job, state.phase))
                        state.phase = None
                    else:
                        next_at = min(next_at, state.last_active + gap)
                        continue
                if state.session is not None:
                    if now - state.last_active >= idle:
                        to_close.append((state.job, state.session))
                        state.session = None
                    else:
                        next_at = min(next_at, state.last_active + idle)
            if state.session is None and state.phase is None:
                with self._lock, state.lock:
                    if (
                        state.session is None
                        and state.open_files == 0
                        and state.inflight == 0
                        and self._jobs.get(state.job.job_id) is state
                    ):
                        del self._jobs[state.job.job_id]
        for job, phase in ended:
            _end_phase(job, phase)
        for job, session in to_close:
            _close_session(job, session, "quiet")
        return next_at

    def _run(self) -> None:
        next_at = math.inf
        while True:
            with self._wakeup:
                if self._closing:
                    return
                timeout = next_at - self._clock()
                if timeout > 0:
                    # Waits for the next deadline, or for a new phase to look after.
                    self._wakeup.wait(None if math.isinf(timeout) else timeout)
                if self._closing:
                    return
            try:
                next_at = self.sweep()
            except Exception:  # never let the sweeper die: phases would never end
                logger.exception("pacer sweep failed")
                next_at = self._clock() + 1.0

    # ------------------------------------------------------------------ inspection and close

    def jobs(self) -> dict[str, JobState]:
        """A snapshot of the known jobs by id."""
        with self._lock:
            return dict(self._jobs)

    def close(self) -> None:
        """Ends every phase and closes every session (blocked acquires are let through)."""
        with self._wakeup:
            self._closing = True
            self._wakeup.notify_all()
            states = list(self._jobs.values())
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        closers = []
        for state in states:
            with state.lock:
                phase, state.phase = state.phase, None
                session, state.session = state.session, None
            if phase is not None:
                _end_phase(state.job, phase)
            if session is not None:
                # In parallel: each says Goodbye, which a dead controller makes wait.
                closer = threading.Thread(
                    target=_close_session,
                    args=(state.job, session, "unmount"),
                    name=f"burstctl-close-{state.job.job_id}",
                )
                closer.start()
                closers.append(closer)
        for closer in closers:
            closer.join()


def _end_phase(job: JobInfo, phase: PhaseHandle) -> None:
    try:
        phase.__exit__(None, None, None)
    except Exception:
        logger.exception("job %s: could not complete its I/O phase", job.job_id)


def _close_session(job: JobInfo, session: SessionLike, why: str) -> None:
    try:
        session.close()
    except Exception:
        logger.exception("job %s: closing its session failed", job.job_id)
    else:
        logger.info("job %s: session closed (%s)", job.job_id, why)
