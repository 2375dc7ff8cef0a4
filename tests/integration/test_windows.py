"""Time-dependent allocations end to end (issue 17): a policy gives a job a periodic pattern
of windows, the real controller sends it in the job's Allocation, and the real client session
paces to it locally, with no RPC per window.

The controller runs in this test's event loop, the client session on its own thread; both
read ``time.monotonic``, so the client's completion times are compared with the pattern on
the controller's clock: this checks the clock agreement too (docs/protocol.md, "Windows").
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import pytest
from support import async_wait_until

from burstctl.client import JobInfo, Session
from burstctl.controller.app import Replica
from burstctl.policies.base import Policy, PolicyParams
from burstctl.policies.registry import default_registry
from burstctl.policies.schedule import Schedule, Window
from burstctl.policies.view import JobId, SystemView

pytestmark = pytest.mark.integration

MiB = 1 << 20
KiB = 1 << 10
R = 8 * MiB  # the window's rate: b_i of a one-node job (node_bandwidth 8 MiB/s)
PERIOD, START, END = 1.0, 0.0, 0.3
# An acquire that completes this long after its window's end still counts as inside: the
# thread's wake-up after the grant (two cores shared by the whole test run), plus the
# one-way delay of the Allocation that anchors the client's phase.
LATE = 0.03


class ProbeParams(PolicyParams):
    job: str = "periodic"  # gets the schedule
    bad_job: str = ""  # gets a malformed schedule (end <= start)


class WindowsProbe(Policy):
    """Fair share of B for every active job; ``job`` gets one window of PERIOD at rate R,
    with its origin at 0 on the view's clock (stable across decisions)."""

    name = "windows-probe"
    Params = ProbeParams

    def allocate(self, view: SystemView) -> Mapping[JobId, float]:
        active = view.active_jobs()
        share = view.capacity / len(active) if active else 0.0
        return {j.job_id: min(share, j.cap) for j in active}

    def schedules(self, view: SystemView) -> Mapping[JobId, Schedule]:
        assert isinstance(self.params, ProbeParams)
        found = {self.params.job: Schedule(PERIOD, (Window(START, END, R),), origin=0.0)}
        if self.params.bad_job:
            found[self.params.bad_job] = Schedule(PERIOD, (Window(0.5, 0.5, R),))
        return found


@pytest.fixture
def probe_replica(
    replica_factory: Callable[..., Awaitable[Replica]],
) -> Callable[..., Awaitable[Replica]]:
    """Replicas (conftest's ``replica_factory``) running `WindowsProbe` with ``params``."""
    registry = default_registry()
    registry.register(WindowsProbe.name, WindowsProbe)

    async def make(**params: str) -> Replica:
        return await replica_factory(registry, policy=WindowsProbe.name, policy_params=params)

    return make


@contextlib.asynccontextmanager
async def holding(*sessions: Session) -> AsyncIterator[None]:
    """Each session acquires 4 KiB at a time in one open operation until the block ends,
    in a thread of its own; then the sessions are closed."""
    stop = threading.Event()

    def hold(session: Session) -> None:
        with session.operation("write"):
            while not stop.is_set():
                session.acquire(4 * KiB)

    workers = [asyncio.create_task(asyncio.to_thread(hold, s)) for s in sessions]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*workers)
        for session in sessions:
            session.close()


def pump(session: Session, chunk: int, seconds: float) -> list[float]:
    """Acquires ``chunk`` bytes back to back for ``seconds``: each completion time."""
    done: list[float] = []
    deadline = time.monotonic() + seconds
    with session.operation("write"):
        while time.monotonic() < deadline:
            session.acquire(chunk)
            done.append(time.monotonic())
    return done


def late_by(t: float) -> float:
    """How long after its window's end ``t`` is (0 inside a window)."""
    phase = t % PERIOD
    return 0.0 if START <= phase <= END else phase - END


@pytest.mark.serial  # the rate is measured over whole periods: alone, not beside other tests
async def test_a_session_paces_to_its_windows(
    probe_replica: Callable[..., Awaitable[Replica]],
) -> None:
    replica = await probe_replica()
    chunk = 64 * KiB
    with Session(replica.grpc_address, JobInfo("periodic", "ann", "phys")) as session:
        assert await asyncio.to_thread(session.wait_attached, 5)
        done = await asyncio.to_thread(pump, session, chunk, 3.6 * PERIOD)
        pattern = session.pattern
    assert pattern is not None, "the session never paced to the windows"
    assert pattern.period == PERIOD
    # The client's phase is the controller's, within the message's delay.
    assert abs((pattern.origin - 0.0 + PERIOD / 2) % PERIOD - PERIOD / 2) < 0.01
    assert done
    outside = [t for t in done if late_by(t) > LATE]
    inside_share = 1 - len(outside) / len(done)
    assert inside_share >= 0.99, (
        f"{len(outside)} of {len(done)} acquires completed outside the windows, "
        f"late by up to {max(late_by(t) for t in outside):.3f} s"
    )
    # Throughput over the whole periods the pump ran: 0.3 R per second, within 10 %.
    first = int(done[0] // PERIOD) + 1
    last = int(done[-1] // PERIOD)
    assert last - first >= 2
    moved = chunk * sum(1 for t in done if first * PERIOD <= t < last * PERIOD)
    rate = moved / ((last - first) * PERIOD)
    assert rate == pytest.approx((END - START) * R, rel=0.10), (
        f"{rate / MiB:.3f} MiB/s for {(END - START) * R / MiB:.3f}; inside {inside_share:.4f}"
    )


async def test_a_malformed_schedule_is_refused_and_the_others_are_served(
    probe_replica: Callable[..., Awaitable[Replica]],
) -> None:
    replica = await probe_replica(job="good", bad_job="bad")
    good = Session(replica.grpc_address, JobInfo("good", "ann", "phys"))
    bad = Session(replica.grpc_address, JobInfo("bad", "bob", "chem"))
    async with holding(good, bad):
        await async_wait_until(
            lambda: good.pattern is not None and bad.rate > 0, 10, message="both allocations"
        )
        assert bad.pattern is None  # a plain rate: its policy rate, the schedule refused
        assert bad.rate == pytest.approx(replica.config.node_bandwidth)
        last = replica.scheduler.last
        assert last is not None
        assert [job for job, _ in last.refused] == ["bad"]
        assert "end_seconds" in last.refused[0][1]
