"""The shims' pacer: lazy sessions per job, the last close, idle sessions, unmount."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from burstctl.client import ClientRuntime
from burstctl.client.job import JobInfo, user_name
from burstctl.fuse_shim.config import MountConfig
from burstctl.node.attribution import Attributor, Caller
from burstctl.node.pacer import SHORT_PHASE, Pacer


class FakeSession:
    """Records what the pacer asks of a client session; ``gate`` can hold acquires."""

    def __init__(self, job: JobInfo) -> None:
        self.job = job
        self.events: list[tuple[Any, ...]] = []
        self.closed = False
        self.gate: threading.Event | None = None
        self.cond = threading.Condition()
        self.closed_on: threading.Thread | None = None
        self.refused: str | None = None
        self.waited_attached = 0

    def wait_attached(self, timeout: float | None = None) -> bool:
        self.waited_attached += 1
        return self.refused is None

    def acquire(self, nbytes: int, kind: str = "write") -> None:
        if self.closed:
            raise RuntimeError("session is closed")
        self.events.append(("acquire", nbytes, kind))
        if self.gate is not None:
            with self.cond:
                self.cond.wait_for(lambda: self.closed or self.gate.is_set(), 10)  # type: ignore[union-attr]
            if self.closed:
                raise RuntimeError("session is closed")

    def acquire_metadata(self) -> None:
        if self.closed:
            raise RuntimeError("session is closed")
        self.events.append(("acquire_metadata",))

    def record(self, nbytes: int, kind: str = "write", calls: int = 1) -> None:
        if self.closed:
            raise RuntimeError("session is closed")
        self.events.append(("record", nbytes, kind))

    def hold_waiting(self, waiting: bool) -> None:
        if self.closed:
            raise RuntimeError("session is closed")
        self.events.append(("hold", waiting))

    def open_gate(self) -> None:
        with self.cond:
            assert self.gate is not None
            self.gate.set()
            self.cond.notify_all()

    def end_phase(self) -> None:
        self.events.append(("end_phase",))

    def close_soon(self) -> concurrent.futures.Future[None]:
        with self.cond:
            self.closed = True
            self.closed_on = threading.current_thread()
            self.cond.notify_all()
        self.events.append(("closed",))
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        done.set_result(None)
        return done


ENVS: dict[int, Mapping[str, str]] = {
    100: {"BURSTCTL_JOB_ID": "a"},
    101: {"BURSTCTL_JOB_ID": "a"},
    200: {"BURSTCTL_JOB_ID": "b"},
}
A, A2, B = Caller(100, 5000, 5000), Caller(101, 5000, 5000), Caller(200, 5000, 5000)


def config(**options: Any) -> MountConfig:
    return MountConfig(Path("/backing"), Path("/mnt"), controller="fake:1", **options)


def attributor() -> Attributor:
    return Attributor(read_process=lambda pid: (ENVS.get(pid), None))


class Rig:
    """A pacer on fake sessions and a fake clock; the test runs its sweeps."""

    def __init__(self, **options: Any) -> None:
        self.now = 0.0
        self.sessions: list[FakeSession] = []
        self.pacer = Pacer(
            config(**options), attributor(), session_factory=self._make, clock=lambda: self.now
        )

    def _make(self, job: JobInfo) -> FakeSession:
        session = FakeSession(job)
        self.sessions.append(session)
        return session

    def of(self, job_id: str) -> list[FakeSession]:
        return [s for s in self.sessions if s.job.job_id == job_id]


def test_a_session_per_job_is_opened_on_its_first_paced_request() -> None:
    rig = Rig()
    assert rig.sessions == []
    rig.pacer.data(A, "write", 4096)
    rig.pacer.data(A2, "read", 100)  # another process of the same job
    rig.pacer.data(B, "read", 10)
    assert [s.job.job_id for s in rig.sessions] == ["a", "b"]
    (a,) = rig.of("a")
    # The phases are the session's own (its implicit operations): the pacer only acquires.
    assert a.events == [("acquire", 4096, "write"), ("acquire", 100, "read")]


def test_the_last_close_ends_the_phase_at_once() -> None:
    rig = Rig(quiet_gap=60)
    rig.pacer.opened(A, 10)
    rig.pacer.opened(A2, 11)  # the same job, another process
    rig.pacer.data(A, "write", 1)
    rig.now += SHORT_PHASE  # a phase that lasted
    rig.pacer.data(A, "write", 1)
    rig.pacer.released(10)
    (a,) = rig.of("a")
    assert ("end_phase",) not in a.events
    rig.pacer.released(11)
    assert a.events[-1] == ("end_phase",)
    rig.pacer.released(11)  # unknown handles are ignored
    assert a.events.count(("end_phase",)) == 1


def test_the_last_close_of_a_short_phase_leaves_it_to_the_quiet_gap() -> None:
    # Many small files in a row (tar): each close is the job's last, none ends the phase.
    rig = Rig(quiet_gap=60)
    for fh in range(100):
        rig.pacer.opened(A, fh)
        rig.pacer.data(A, "write", 4096)
        rig.pacer.released(fh)
        rig.now += SHORT_PHASE / 200
    (a,) = rig.of("a")
    assert ("end_phase",) not in a.events
    # Once the phase has lasted SHORT_PHASE, the next last close ends it.
    rig.now += SHORT_PHASE
    rig.pacer.opened(A, 1000)
    rig.pacer.data(A, "write", 4096)
    rig.pacer.released(1000)
    assert a.events.count(("end_phase",)) == 1
    # A request after a quiet gap starts a new (short) phase: its last close waits again.
    rig.now += 120
    rig.pacer.opened(A, 1001)
    rig.pacer.data(A, "write", 4096)
    rig.pacer.released(1001)
    assert a.events.count(("end_phase",)) == 1


def test_a_request_in_flight_at_the_last_close_leaves_the_phase_to_the_quiet_gap() -> None:
    rig = Rig()
    rig.pacer.opened(A, 10)
    rig.pacer.data(A, "write", 1)
    (a,) = rig.of("a")
    a.gate = threading.Event()
    blocked = threading.Thread(target=rig.pacer.data, args=(A2, "write", 2))
    blocked.start()
    wait_until(lambda: len(a.events) == 2)
    rig.pacer.released(10)
    assert ("end_phase",) not in a.events
    a.open_gate()
    blocked.join(10)


def test_metadata_is_one_operation_of_the_job_and_its_cost_in_bytes() -> None:
    # At the default cost of 0: one operation for the job's metadata limit, no bytes.
    rig = Rig()
    rig.pacer.metadata(A)
    (a,) = rig.of("a")
    assert a.events == [("acquire_metadata",)]
    rig = Rig(metadata_cost=512)
    rig.pacer.metadata(A)
    (a,) = rig.of("a")
    assert a.events == [("acquire", 512, "metadata")]


def test_a_users_default_job_opens_no_session_for_its_metadata_alone() -> None:
    rig = Rig()
    stray = Caller(300, 5000, 5000)  # names no job: its user's default job
    rig.pacer.metadata(stray)
    assert rig.sessions == []
    rig.pacer.data(stray, "read", 10)  # its I/O opens the session ...
    rig.pacer.metadata(stray)  # ... which then paces its metadata too
    (session,) = rig.sessions
    assert session.job.job_id.startswith("user:")
    assert session.events == [("acquire", 10, "read"), ("acquire_metadata",)]


def test_an_idle_session_is_closed_and_a_new_request_opens_another() -> None:
    rig = Rig(session_idle=1.0)
    rig.pacer.opened(A, 10)
    rig.pacer.data(A, "write", 1)
    rig.now = 0.5
    assert rig.pacer.sweep() == pytest.approx(1.0)
    (first,) = rig.of("a")
    assert not first.closed
    rig.now = 1.01
    assert rig.pacer.sweep() == float("inf")
    assert first.closed and first.events[-2:] == [("end_phase",), ("closed",)]
    assert "a" in rig.pacer.jobs()  # its file is still open
    rig.pacer.data(A, "write", 1)
    assert len(rig.of("a")) == 2 and not rig.of("a")[1].closed
    rig.pacer.released(10)
    rig.now = 5.0
    rig.pacer.sweep()
    assert rig.pacer.jobs() == {}  # nothing open, no session: forgotten
    rig.pacer.data(A, "read", 1)  # known again
    assert len(rig.of("a")) == 3 and "a" in rig.pacer.jobs()


def test_a_request_in_flight_keeps_its_session() -> None:
    rig = Rig(session_idle=1.0)
    rig.pacer.data(A, "write", 1)
    (a,) = rig.of("a")
    a.gate = threading.Event()
    blocked = threading.Thread(target=rig.pacer.data, args=(A, "write", 2))
    blocked.start()
    wait_until(lambda: len(a.events) == 2)
    rig.now = 10.0
    assert rig.pacer.sweep() == pytest.approx(11.0)
    assert not a.closed
    a.open_gate()
    blocked.join(10)


def test_the_sweep_never_waits_for_a_busy_job() -> None:
    # A request thread holds its job's lock while its session starts on the runtime's loop,
    # where the sweep runs: waiting for that lock there would deadlock the mount.
    rig = Rig(session_idle=1.0)
    rig.pacer.data(A, "write", 1)
    rig.pacer.data(B, "write", 1)
    rig.now = 5.0
    state = rig.pacer.jobs()["a"]
    with state.lock:
        swept: list[float] = []
        sweeper = threading.Thread(target=lambda: swept.append(rig.pacer.sweep()))
        sweeper.start()
        sweeper.join(5)
        assert not sweeper.is_alive(), "the sweep waited for the job's lock"
    assert swept == [pytest.approx(5.05)]  # the busy job is looked at again soon
    (a,), (b,) = rig.of("a"), rig.of("b")
    assert b.closed and not a.closed
    rig.pacer.sweep()
    assert a.closed


def test_close_ends_phases_closes_sessions_and_lets_requests_through() -> None:
    rig = Rig()
    rig.pacer.data(A, "write", 1)
    rig.pacer.data(B, "write", 1)
    (a,) = rig.of("a")
    a.gate = threading.Event()
    blocked = threading.Thread(target=rig.pacer.data, args=(A, "write", 2))
    blocked.start()
    wait_until(lambda: len(a.events) == 2)
    rig.pacer.close()
    blocked.join(10)
    assert not blocked.is_alive()  # released by the close, without an exception
    assert all(s.closed for s in rig.sessions)
    assert a.events[-2:] == [("end_phase",), ("closed",)]
    rig.pacer.data(A, "write", 1)  # after close: unpaced, no new session
    assert len(rig.sessions) == 2
    rig.pacer.close()  # idempotent


def test_idle_sessions_are_closed_on_the_runtimes_loop_without_a_thread_of_their_own() -> None:
    sessions: list[FakeSession] = []

    def make(job: JobInfo) -> FakeSession:
        sessions.append(FakeSession(job))
        return sessions[-1]

    with ClientRuntime() as runtime:
        threads = threading.active_count()
        pacer = Pacer(config(session_idle=0.2), attributor(), runtime=runtime, session_factory=make)
        try:
            pacer.data(A, "write", 1)
            pacer.data(B, "write", 1)
            assert threading.active_count() == threads
            wait_until(lambda: all(s.closed for s in sessions), timeout=5)
            assert {s.closed_on for s in sessions} == {runtime.thread}
            pacer.data(A, "read", 1)  # a new session, swept again
            wait_until(lambda: len(sessions) == 3 and sessions[2].closed, timeout=5)
            wait_until(lambda: pacer.jobs() == {}, timeout=5)
        finally:
            pacer.close()


def test_a_pacer_needs_sessions_from_somewhere() -> None:
    with pytest.raises(ValueError, match="runtime"):
        Pacer(config(), attributor())


def test_a_job_the_controller_refuses_sends_the_callers_io_to_its_own_default_job() -> None:
    # Issue 15, finding 3: the mount attributes a uid's I/O to a job only if the controller
    # lets that uid join it; otherwise to the uid's own default job.
    rig = Rig()
    make = rig.pacer._make_session

    def refusing(job: JobInfo) -> FakeSession:
        session = make(job)
        assert isinstance(session, FakeSession)
        if job.job_id == "a":
            session.refused = "PERMISSION_DENIED: hello.user: job 'a' is registered to another user"
        return session

    rig.pacer._make_session = refusing
    rig.pacer.data(A, "write", 10)
    (refused,) = rig.of("a")
    assert refused.waited_attached == 1 and refused.closed
    assert not [e for e in refused.events if e[0] == "acquire"]  # no byte paced as job a
    own = f"user:{user_name(A.uid)}"
    (mine,) = rig.of(own)
    assert mine.events == [("acquire", 10, "write")]
    rig.pacer.data(A2, "write", 5)  # another process of the uid: straight to its own job
    assert len(rig.of("a")) == 1 and mine.events[-1] == ("acquire", 5, "write")
    assert rig.pacer.attributor.denied("a", A.uid)


def test_two_users_naming_one_job_get_a_session_each() -> None:
    rig = Rig()
    other = Caller(101, 6000, 6000)
    rig.pacer.data(A, "write", 1)
    rig.pacer.data(other, "write", 1)
    sessions = rig.of("a")
    assert sorted(s.job.user for s in sessions) == sorted([user_name(5000), user_name(6000)])


class BufferSession(FakeSession):
    """A fake of a ``buffer=True`` client session: space and buffer reports recorded."""

    def acquire_space(self, nbytes: int, landed: bool = True) -> None:
        self.events.append(("space", nbytes) if landed else ("space", nbytes, "in flight"))

    def space_landed(self, nbytes: int) -> None:
        self.events.append(("landed", nbytes))

    def report_buffer(self, resident: int, pending: int, drain_error: str = "") -> None:
        self.events.append(("buffer", resident, pending, drain_error))


class BufferRig(Rig):
    """A pacer whose app sessions track the buffer, with drain sessions of their own."""

    def __init__(self, **options: Any) -> None:
        self.now = 0.0
        self.sessions: list[FakeSession] = []
        self.drains: list[FakeSession] = []
        self.pacer = Pacer(
            config(**options),
            attributor(),
            session_factory=self._make,
            drain_session_factory=self._drain,
            clock=lambda: self.now,
        )

    def _make(self, job: JobInfo) -> FakeSession:
        session = BufferSession(job)
        self.sessions.append(session)
        return session

    def _drain(self, job: JobInfo) -> FakeSession:
        session = FakeSession(job)
        self.drains.append(session)
        return session


def test_a_write_waits_for_its_space_after_its_bandwidth_a_read_does_not() -> None:
    rig = BufferRig()
    granted = rig.pacer.data(A, "write", 4096, space=True)
    assert rig.pacer.data(A, "read", 100) is None  # no space for a read
    (a,) = rig.of("a")
    assert granted is a
    # the write's space is in flight until the write landed and was reported
    assert a.events == [
        ("acquire", 4096, "write"),
        ("space", 4096, "in flight"),
        ("acquire", 100, "read"),
    ]
    rig.pacer.landed(a, 4096)
    assert a.events[-1] == ("landed", 4096)


def test_copies_are_paced_on_a_drain_session_of_their_own_closed_when_idle() -> None:
    rig = BufferRig(session_idle=10)
    job = rig.pacer.job_of(A)
    rig.pacer.data(A, "write", 10, space=True)
    rig.pacer.drain(job, 1 << 20)
    rig.pacer.drain(job, 5)
    (drain,) = rig.drains
    assert drain.events == [("acquire", 1 << 20, "write"), ("acquire", 5, "write")]
    (app,) = rig.of("a")
    assert ("acquire", 5, "write") not in app.events  # not booked as the job's I/O
    rig.now += 11
    rig.pacer.sweep()
    assert drain.closed and app.closed
    rig.pacer.drain(job, 7)  # a later copy opens another
    assert len(rig.drains) == 2 and rig.drains[1].events == [("acquire", 7, "write")]


def test_buffer_reports_reach_the_jobs_session_and_its_next_one() -> None:
    rig = BufferRig(session_idle=10)
    job = rig.pacer.job_of(A)
    rig.pacer.report_buffer(job, 100, 50, "")  # no session yet: one opens to carry it
    rig.pacer.data(A, "write", 1, space=True)
    (first,) = rig.of("a")
    assert first.events[0] == ("buffer", 100, 50, "")
    rig.pacer.report_buffer(job, 200, 0, "PFS_DIR not writable: Permission denied")
    assert first.events[-1] == ("buffer", 200, 0, "PFS_DIR not writable: Permission denied")


def test_a_job_whose_files_still_drain_keeps_its_session_until_they_are_on_the_pfs() -> None:
    """The evictions must reach the controller: a session closed while files pend would
    leave its resident parked at the last value, holding space the drain frees."""
    rig = BufferRig(session_idle=10, stage_out=Path("/pfs"))
    job = rig.pacer.job_of(A)
    rig.pacer.data(A, "write", 10, space=True)
    rig.pacer.report_buffer(job, 10 << 20, 10 << 20, "")  # written, not copied yet
    rig.now += 11
    rig.pacer.sweep()
    (app,) = rig.of("a")
    assert not app.closed  # idle, but its files pend
    rig.pacer.report_buffer(job, 0, 0, "")  # copied and evicted
    assert app.events[-1] == ("buffer", 0, 0, "")  # reported on the open session
    rig.now += 11
    rig.pacer.sweep()
    assert app.closed


def test_without_stage_out_nothing_drains_so_pending_bytes_keep_no_session_open() -> None:
    rig = BufferRig(session_idle=10)
    job = rig.pacer.job_of(A)
    rig.pacer.data(A, "write", 10, space=True)
    rig.pacer.report_buffer(job, 10 << 20, 10 << 20, "")  # on the buffer for good
    rig.now += 11
    rig.pacer.sweep()
    (app,) = rig.of("a")
    assert app.closed  # its resident stays parked on the controller's books
    rig.pacer.report_buffer(job, 10 << 20, 10 << 20, "")  # the same: nothing to tell
    assert len(rig.of("a")) == 1


def test_bytes_kept_on_the_buffer_keep_the_jobs_session_open_while_they_are_there() -> None:
    """With --evict keep the bytes stay on the buffer after their copy: the job's session
    stays open, idle, until they are gone (its evictions and deletions reach the books)."""
    rig = BufferRig(session_idle=10, stage_out=Path("/pfs"))
    job = rig.pacer.job_of(A)
    rig.pacer.data(A, "write", 10, space=True)
    rig.pacer.report_buffer(job, 10 << 20, 0, "")  # copied, kept
    for _ in range(3):
        rig.now += 11
        rig.pacer.sweep()
    (app,) = rig.of("a")
    assert not app.closed
    rig.pacer.report_buffer(job, 0, 0, "")  # the files deleted
    rig.now += 11
    rig.pacer.sweep()
    assert app.closed
    rig.pacer.report_buffer(job, 0, 0, "")  # the same: nothing more to tell
    assert len(rig.of("a")) == 1


def test_a_report_that_changed_while_the_job_had_no_session_opens_one() -> None:
    """A restarted mount reports the files it found (journal or scan) before the job does
    any I/O: its controller must hear them (they replace what it parked)."""
    rig = BufferRig(session_idle=10)
    job = rig.pacer.job_of(A)
    rig.pacer.report_buffer(job, 0, 0, "")  # a job whose files were all evicted
    (app,) = rig.of("a")
    assert app.events == [("buffer", 0, 0, "")]
    rig.now += 11
    rig.pacer.sweep()
    assert app.closed  # told, and nothing held: closed once idle


def test_a_session_opened_by_a_report_is_checked_at_its_first_request() -> None:
    """As if the request had opened it: a job the caller named waits for the controller's
    answer, and a refusal sends the caller to its own default job."""
    rig = BufferRig(session_idle=10)
    named = rig.pacer.job_of(A)
    rig.pacer.report_buffer(named, 4096, 4096, "")  # a restarted mount's report, first
    (first,) = rig.of("a")
    assert first.waited_attached == 0
    rig.pacer.data(A, "write", 10, space=True)
    assert first.waited_attached == 1  # the controller's answer, before any pacing
    rig.pacer.data(A, "write", 10, space=True)
    assert first.waited_attached == 1


# ---------------------------------------------------------------------- pacing done elsewhere
# (the node agent: the preload library paces from a shared page, the pacer books it)


def test_admit_opens_the_session_and_a_refusal_admits_the_callers_own_job() -> None:
    rig = Rig()
    make = rig.pacer._make_session

    def refusing(job: JobInfo) -> FakeSession:
        session = make(job)
        assert isinstance(session, FakeSession)
        if job.job_id == "b":
            session.refused = "PERMISSION_DENIED: job 'b' is registered to another user"
        return session

    rig.pacer._make_session = refusing
    job = rig.pacer.admit(A)
    assert job is not None and job.job_id == "a"
    (a,) = rig.of("a")
    assert a.waited_attached == 1 and a.events == []  # admitted: nothing booked yet
    own = rig.pacer.admit(B)
    assert own is not None and own.job_id == f"user:{user_name(B.uid)}"
    (b,) = rig.of("b")
    assert b.closed and rig.pacer.attributor.denied("b", B.uid)
    rig.pacer.record(own, "write", 7)
    assert rig.of(own.job_id)[0].events == [("record", 7, "write")]
    rig.pacer.close()
    assert rig.pacer.admit(A) is None


def test_record_books_without_waiting_and_reopens_a_swept_session() -> None:
    rig = Rig(session_idle=1.0)
    job = rig.pacer.admit(A)
    assert job is not None
    (a,) = rig.of("a")
    a.gate = threading.Event()  # an acquire would block: record must not
    rig.now = 0.5
    rig.pacer.record(job, "write", 100)
    rig.pacer.record(job, "read", 5)
    assert a.events == [("record", 100, "write"), ("record", 5, "read")]
    assert rig.pacer.sweep() == pytest.approx(1.5)  # idle counted from the last record
    rig.now = 2.0
    rig.pacer.sweep()
    assert a.closed and rig.pacer.session_of(job) is None
    rig.pacer.record(job, "write", 1)  # the next bytes open a session again
    assert len(rig.of("a")) == 2 and rig.of("a")[1].events == [("record", 1, "write")]
    assert rig.of("a")[1].waited_attached == 0  # booking never waits for the controller


def test_a_held_wait_is_one_waiter_and_keeps_the_session_from_the_sweep() -> None:
    rig = Rig(session_idle=1.0)
    job = rig.pacer.admit(A)
    assert job is not None
    rig.pacer.waiting(job, True)
    rig.pacer.waiting(job, True)
    (a,) = rig.of("a")
    assert a.events == [("hold", True)]
    rig.now = 10.0
    assert rig.pacer.sweep() == pytest.approx(11.0)
    assert not a.closed
    rig.pacer.waiting(job, False)
    rig.pacer.waiting(job, False)
    assert a.events == [("hold", True), ("hold", False)]
    rig.now = 11.5
    rig.pacer.sweep()
    assert a.closed
