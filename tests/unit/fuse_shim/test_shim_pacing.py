"""The mount's pacer: lazy sessions per job, phases, quiet gaps, last close, idle sessions."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest
from support import wait_until

from burstctl.client.job import JobInfo
from burstctl.fuse_shim.attribution import Attributor, Caller
from burstctl.fuse_shim.pacing import Pacer, PacingOptions


class FakeOperation:
    def __init__(self, session: FakeSession, kind: str, volume: int) -> None:
        self.session, self.kind, self.volume = session, kind, volume

    def __enter__(self) -> FakeOperation:
        if self.session.closed:
            raise RuntimeError("session is closed")
        self.session.events.append(("posted", self.kind, self.volume))
        return self

    def __exit__(self, *exc: object) -> None:
        self.session.events.append(("completed", self.kind, self.volume))


class FakeSession:
    """Records what the pacer asks of a client session; ``gate`` can hold acquires."""

    def __init__(self, job: JobInfo) -> None:
        self.job = job
        self.events: list[tuple[Any, ...]] = []
        self.closed = False
        self.gate: threading.Event | None = None
        self.cond = threading.Condition()

    def acquire(self, nbytes: int, kind: str = "write") -> None:
        if self.closed:
            raise RuntimeError("session is closed")
        self.events.append(("acquire", nbytes, kind))
        if self.gate is not None:
            with self.cond:
                self.cond.wait_for(lambda: self.closed or self.gate.is_set(), 10)  # type: ignore[union-attr]
            if self.closed:
                raise RuntimeError("session is closed")

    def open_gate(self) -> None:
        with self.cond:
            assert self.gate is not None
            self.gate.set()
            self.cond.notify_all()

    def operation(self, kind: str, volume: int = 0) -> FakeOperation:
        return FakeOperation(self, kind, volume)

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.events.append(("closed",))


ENVS: dict[int, Mapping[str, str]] = {
    100: {"BURSTCTL_JOB_ID": "a"},
    101: {"BURSTCTL_JOB_ID": "a"},
    200: {"BURSTCTL_JOB_ID": "b"},
}
A, A2, B = Caller(100, 5000, 5000), Caller(101, 5000, 5000), Caller(200, 5000, 5000)


class Rig:
    def __init__(self, **options: Any) -> None:
        self.now = 0.0
        self.sessions: list[FakeSession] = []
        attributor = Attributor(read_process=lambda pid: (ENVS.get(pid), None))
        self.pacer = Pacer(
            PacingOptions(controller="fake:1", **options),
            attributor,
            session_factory=self._make,
            clock=lambda: self.now,
            start_thread=False,
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
    assert a.events == [
        ("posted", "write", 0),
        ("acquire", 4096, "write"),
        ("acquire", 100, "read"),
    ]


def test_a_phase_ends_after_the_quiet_gap_and_the_next_request_opens_another() -> None:
    rig = Rig(quiet_gap=0.05)
    rig.pacer.data(A, "write", 1)
    rig.now = 0.04
    rig.pacer.data(A, "write", 1)
    rig.now = 0.08
    assert rig.pacer.sweep() == pytest.approx(0.09)  # 0.04 + 0.05
    (a,) = rig.of("a")
    assert [e[0] for e in a.events] == ["posted", "acquire", "acquire"]
    rig.now = 0.1
    rig.pacer.sweep()
    assert a.events[-1] == ("completed", "write", 0)
    rig.now = 0.5
    rig.pacer.data(A, "read", 1)
    assert a.events[-2:] == [("posted", "read", 0), ("acquire", 1, "read")]
    assert rig.pacer.jobs()["a"].phases == 2


def test_the_last_close_ends_the_phase_at_once() -> None:
    rig = Rig(quiet_gap=60)
    rig.pacer.opened(A, 10)
    rig.pacer.opened(A2, 11)  # the same job, another process
    rig.pacer.data(A, "write", 1)
    rig.pacer.released(10)
    (a,) = rig.of("a")
    assert ("completed", "write", 0) not in a.events
    rig.pacer.released(11)
    assert a.events[-1] == ("completed", "write", 0)
    rig.pacer.released(11)  # unknown handles are ignored


def test_a_request_in_flight_keeps_its_phase_open() -> None:
    rig = Rig(quiet_gap=0.05)
    rig.pacer.data(A, "write", 1)
    (a,) = rig.of("a")
    a.gate = threading.Event()
    blocked = threading.Thread(target=rig.pacer.data, args=(A, "write", 2))
    blocked.start()
    wait_until(lambda: len(a.events) == 3)
    rig.now = 10.0
    assert rig.pacer.sweep() == pytest.approx(10.05)
    assert a.events[-1][0] == "acquire"  # not completed while a request waits
    a.open_gate()
    blocked.join(10)
    rig.now = 10.1
    rig.pacer.sweep()
    assert a.events[-1] == ("completed", "write", 0)


def test_metadata_is_free_by_default_and_paced_when_it_has_a_cost() -> None:
    rig = Rig()
    rig.pacer.metadata(A)
    assert rig.sessions == []
    rig = Rig(metadata_cost=512)
    rig.pacer.metadata(A)
    (a,) = rig.of("a")
    assert a.events == [("posted", "metadata", 0), ("acquire", 512, "metadata")]


def test_an_idle_session_is_closed_and_a_new_request_opens_another() -> None:
    rig = Rig(quiet_gap=0.05, session_idle=1.0)
    rig.pacer.opened(A, 10)
    rig.pacer.data(A, "write", 1)
    rig.now = 0.5
    rig.pacer.sweep()
    (first,) = rig.of("a")
    assert not first.closed
    rig.now = 1.01
    assert rig.pacer.sweep() == float("inf")
    assert first.closed and first.events[-2:] == [("completed", "write", 0), ("closed",)]
    assert "a" in rig.pacer.jobs()  # its file is still open
    rig.pacer.data(A, "write", 1)
    assert len(rig.of("a")) == 2 and not rig.of("a")[1].closed
    rig.pacer.released(10)
    rig.now = 5.0
    rig.pacer.sweep()
    assert rig.pacer.jobs() == {}  # nothing open, no session: forgotten


def test_close_ends_phases_closes_sessions_and_lets_requests_through() -> None:
    rig = Rig()
    rig.pacer.data(A, "write", 1)
    rig.pacer.data(B, "write", 1)
    (a,) = rig.of("a")
    a.gate = threading.Event()
    blocked = threading.Thread(target=rig.pacer.data, args=(A, "write", 2))
    blocked.start()
    wait_until(lambda: len(a.events) == 3)
    rig.pacer.close()
    blocked.join(10)
    assert not blocked.is_alive()  # released by the close, without an exception
    assert all(s.closed for s in rig.sessions)
    assert ("completed", "write", 0) in a.events
    rig.pacer.data(A, "write", 1)  # after close: unpaced, no new session
    assert len(rig.sessions) == 2
    rig.pacer.close()  # idempotent


def test_the_sweeper_thread_ends_phases_on_its_own() -> None:
    sessions: list[FakeSession] = []
    pacer = Pacer(
        PacingOptions(controller="fake:1", quiet_gap=0.02, session_idle=0.2),
        Attributor(read_process=lambda pid: (ENVS.get(pid), None)),
        session_factory=lambda job: sessions.append(FakeSession(job)) or sessions[-1],
    )
    try:
        pacer.data(A, "write", 1)
        wait_until(lambda: ("completed", "write", 0) in sessions[0].events, timeout=5)
        wait_until(lambda: sessions[0].closed, timeout=5)
        pacer.data(A, "read", 1)
        wait_until(lambda: len(sessions) == 2 and sessions[1].closed, timeout=5)
    finally:
        pacer.close()


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="quiet_gap"):
        PacingOptions(controller="x:1", quiet_gap=-1)
    with pytest.raises(ValueError, match="metadata_cost"):
        PacingOptions(controller="x:1", metadata_cost=-5)
