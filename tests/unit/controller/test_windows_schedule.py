"""Time-dependent allocations on the controller (issue 17): what ``decide`` makes of a
policy's schedules, how the scheduler pushes and splits them, and the origin on the wire."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from support import views

from burstctl.controller.config import load_config
from burstctl.controller.jobs import JobTable
from burstctl.controller.outbox import StreamOutbox
from burstctl.controller.records import JobMeta, OpKind
from burstctl.controller.scheduler import Scheduler
from burstctl.controller.state import PolicySlot, StateStore
from burstctl.policies.base import Policy, PolicyParams
from burstctl.policies.decision import decide
from burstctl.policies.fair_share import FairShare
from burstctl.policies.registry import default_registry
from burstctl.policies.schedule import Schedule, Window
from burstctl.policies.view import JobId, JobView, SystemView

MiB = 1 << 20


def job(job_id: str, demand: float | None = None, index: int = 0) -> JobView:
    """A job with b_i = b = 8 MiB/s."""
    return views.job(job_id, 8 * MiB, demand, index=index)


class Params(PolicyParams):
    start: float = 0.0
    end: float = 0.3
    rate: float = 4.0 * MiB
    period: float = 1.0
    jobs: tuple[str, ...] = ("a",)
    between_end: float = 0.0  # > 0: a periodic job between iterations holds [start, this)


class Scheduled(Policy):
    """Fair share, and one window per period for ``jobs``."""

    name = "scheduled"
    Params = Params

    def allocate(self, view: SystemView) -> Mapping[JobId, float]:
        return FairShare().allocate(view)

    def schedules(self, view: SystemView) -> Mapping[JobId, Schedule]:
        p = self.params
        assert isinstance(p, Params)
        return {j: Schedule(p.period, (Window(p.start, p.end, p.rate),)) for j in p.jobs}

    def between(self, view: SystemView) -> Mapping[JobId, Schedule]:
        p = self.params
        assert isinstance(p, Params)
        if not p.between_end:
            return {}
        return {j: Schedule(p.period, (Window(p.start, p.between_end, p.rate),)) for j in p.jobs}


view = functools.partial(views.view, capacity=40 * MiB, node_bandwidth=8 * MiB)


# -------------------------------------------------------------------------- decide


def test_a_policy_without_schedules_decides_as_before() -> None:
    decision = decide(FairShare(), view(job("a"), job("b", index=1)))
    assert decision.schedules == {}
    assert decision.refused == ()
    assert not decision.clamped


def test_a_scheduled_job_gets_its_pattern_and_its_mean_rate() -> None:
    decision = decide(Scheduled(), view(job("a"), job("b", index=1)))
    assert set(decision.schedules) == {"a"}
    assert decision.rates["a"] == pytest.approx(0.3 * 4 * MiB)
    assert decision.rates["b"] == 8 * MiB  # the policy's rate for the others
    assert not decision.clamped


def test_window_rates_above_the_cap_are_capped() -> None:
    decision = decide(Scheduled(Params(rate=20 * MiB)), view(job("a")))
    schedule = decision.schedules["a"]
    assert schedule.peak_rate() == 8 * MiB
    assert decision.rates["a"] == pytest.approx(0.3 * 8 * MiB)
    assert decision.fixes == (("a", 20 * MiB),)


def test_scaled_down_to_capacity_the_windows_scale_with_the_rate() -> None:
    # two jobs at a mean of 0.5 * 8 MiB/s each on B = 6 MiB/s: scaled by 6/8
    policy = Scheduled(Params(end=0.5, rate=8 * MiB, jobs=("a", "b")))
    decision = decide(policy, view(job("a"), job("b", index=1), capacity=6 * MiB))
    assert decision.scaled
    for j in ("a", "b"):
        assert decision.schedules[j].mean_rate() == pytest.approx(decision.rates[j])
        assert decision.schedules[j].peak_rate() == pytest.approx(6 * MiB)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        (Params(end=0.0), "end_seconds"),
        (Params(start=-0.1), "start_seconds"),
        (Params(end=math.nan), "end_seconds"),
        (Params(rate=-1.0), "rate"),
        (Params(period=0.0), "period_seconds"),
        (Params(end=1.5), "end_seconds"),  # longer than the period
    ],
)
def test_a_malformed_schedule_is_refused_and_the_job_keeps_its_rate(
    params: Params, field: str
) -> None:
    decision = decide(Scheduled(params), view(job("a"), job("b", index=1)))
    assert decision.schedules == {}
    assert [j for j, _ in decision.refused] == ["a"]
    assert field in decision.refused[0][1]
    assert decision.clamped
    assert decision.rates == {"a": 8 * MiB, "b": 8 * MiB}


def test_no_schedule_for_a_job_without_demand_nor_with_a_global_split() -> None:
    idle = view(job("a", demand=0.0), job("b", index=1))
    assert decide(Scheduled(), idle).schedules == {}
    split = decide(Scheduled(), view(job("a"), job("b", index=1)), {"a": MiB, "b": MiB})
    assert split.schedules == {}


# -------------------------------------------------------------------------- the wire


def test_the_origin_goes_out_as_seconds_to_the_next_period_start() -> None:
    now = [12.3]
    stream = StreamOutbox("r", clock=lambda: now[0])
    schedule = Schedule(1.0, (Window(0.8, 1.2, 5.0),), origin=10.0)
    windows = stream._windows(schedule)
    assert windows.period_seconds == 1.0
    assert windows.origin_seconds == pytest.approx(0.7)
    assert [(w.start_seconds, w.end_seconds, w.rate) for w in windows.window] == [(0.8, 1.2, 5.0)]
    now[0] = 9.75  # before the origin: periods repeat backwards too
    assert stream._windows(schedule).origin_seconds == pytest.approx(0.25)
    now[0] = 10.0 + 1e-17  # a remainder that rounds to the period is 0
    assert 0.0 <= stream._windows(schedule).origin_seconds < 1.0


# -------------------------------------------------------------------------- the scheduler


class Recorder:
    """An outbox that records what it was offered (with windows or not)."""

    def __init__(self) -> None:
        self.offers: list[tuple[float, Schedule | None]] = []

    def offer(self, rate: float, burst: float, epoch: int, lease: float, policy: str) -> None:
        self.offers.append((rate, None))

    def offer_windows(
        self, rate: float, burst: float, epoch: int, lease: float, policy: str, windows: Schedule
    ) -> None:
        self.offers.append((rate, windows))


class PlainOutbox:
    def __init__(self) -> None:
        self.rates: list[float] = []

    def offer(self, rate: float, burst: float, epoch: int, lease: float, policy: str) -> None:
        self.rates.append(rate)


def scheduler(tmp_path: Path, params: dict[str, Any]) -> tuple[Scheduler, JobTable, PolicySlot]:
    registry = default_registry()
    registry.register(Scheduled.name, Scheduled)
    config = load_config(
        capacity=40 * MiB, node_bandwidth=8 * MiB, push_tolerance=0.0, state_dir=tmp_path
    )
    table = JobTable(lambda: 100.0, heartbeat_timeout=1e9, job_retention=1e9, demand_headroom=1.1)
    slot = PolicySlot(registry, StateStore(tmp_path), (Scheduled.name, params), replica_id="r")
    return Scheduler(table, slot, config, clock=lambda: 100.0), table, slot


async def test_a_new_schedule_is_pushed_even_when_the_mean_rate_is_the_same(
    tmp_path: Path,
) -> None:
    sched, table, slot = scheduler(tmp_path, {})
    outbox = Recorder()
    session = table.open_session(JobMeta("a", "u", "g", 1, 1.0), "c", "h", outbox=outbox)
    table.post(session, 1, OpKind.WRITE, 0)
    sched.rebalance()
    rate, first = outbox.offers[-1]
    assert first is not None and first.windows == (Window(0.0, 0.3, 4 * MiB),)
    assert rate == pytest.approx(0.3 * 4 * MiB)
    sched.rebalance()  # nothing changed: nothing pushed
    assert len(outbox.offers) == 1
    slot.switch(Scheduled.name, {"start": 0.5, "end": 0.8})  # same mean, other phase
    sched.rebalance()
    assert len(outbox.offers) == 2
    assert outbox.offers[-1][1] is not None
    assert outbox.offers[-1][1].windows == (Window(0.5, 0.8, 4 * MiB),)


async def test_the_sessions_of_a_job_share_its_windows(tmp_path: Path) -> None:
    sched, table, _ = scheduler(tmp_path, {})
    meta = JobMeta("a", "u", "g", 1, 1.0)
    outboxes = []
    for i in range(2):
        outbox = Recorder()
        session = table.open_session(meta, f"c{i}", "h", outbox=outbox)
        outboxes.append(outbox)
        table.post(session, 1, OpKind.WRITE, 0)
    sched.rebalance()
    peaks = []
    for outbox in outboxes:
        rate, schedule = outbox.offers[-1]
        assert schedule is not None
        assert schedule.mean_rate() == pytest.approx(rate)
        peaks.append(schedule.peak_rate())
    assert sum(peaks) == pytest.approx(4 * MiB)


async def test_an_outbox_without_windows_gets_the_mean_rate(tmp_path: Path) -> None:
    sched, table, _ = scheduler(tmp_path, {})
    outbox = PlainOutbox()
    session = table.open_session(JobMeta("a", "u", "g", 1, 1.0), "c", "h", outbox=outbox)
    table.post(session, 1, OpKind.WRITE, 0)
    sched.rebalance()
    assert outbox.rates[-1] == pytest.approx(0.3 * 4 * MiB)


async def test_a_periodic_job_between_iterations_holds_what_the_policy_gives_it(
    tmp_path: Path,
) -> None:
    # PerSched's loans (policies/persched/lending.py): a job that computes gives a window up.
    sched, table, slot = scheduler(tmp_path, {})
    meta = JobMeta("a", "u", "g", 1, 1.0, w=0.5, vol_io=float(MiB))
    outboxes = [Recorder() for _ in range(2)]
    sessions = [
        table.open_session(meta, f"c{i}", "h", outbox=outbox) for i, outbox in enumerate(outboxes)
    ]
    for session in sessions:
        table.post(session, 1, OpKind.WRITE, 0)
    sched.rebalance()
    for session in sessions:
        table.complete(session, 1)
    sched.rebalance()  # computing: each session keeps the windows it holds
    assert [len(o.offers) for o in outboxes] == [1, 1]
    slot.switch(Scheduled.name, {"between_end": 0.1})
    sched.rebalance()
    peaks = []
    for outbox in outboxes:
        rate, schedule = outbox.offers[-1]
        assert schedule is not None and schedule.windows[0].end == 0.1
        assert rate == pytest.approx(schedule.mean_rate())
        peaks.append(schedule.peak_rate())
    assert sum(peaks) == pytest.approx(4 * MiB)  # each session its share
    sched.rebalance()  # the same again: nothing pushed
    assert [len(o.offers) for o in outboxes] == [2, 2]
