"""``SystemView.of_fresh``, the simulator's way to build views: the same view, faster."""

from __future__ import annotations

import dataclasses

import pytest

from burstctl.policies import JobView, SystemView


def row(job_id: str, index: int, demand: float = 1.0) -> JobView:
    return JobView(job_id, "u", "g", 1, 1.0, 1.0, demand, 0.0, index=index)


def test_of_fresh_builds_the_constructors_view() -> None:
    jobs = {"b": row("b", 1), "a": row("a", 0), "c": row("c", 2, demand=0.0)}
    built = SystemView(
        now=3.0, capacity=1.0, node_bandwidth=0.5, jobs=dict(jobs), seed=7, horizon=9.0
    )
    fresh = SystemView.of_fresh(3.0, 1.0, 0.5, dict(jobs), 7, 9.0)
    assert fresh == built
    assert repr(fresh) == repr(built)
    assert type(fresh.jobs) is type(built.jobs)  # read-only as well
    assert fresh.active_jobs() == built.active_jobs() == [jobs["a"], jobs["b"]]
    with pytest.raises(dataclasses.FrozenInstanceError):
        fresh.now = 4.0  # type: ignore[misc]


def test_of_fresh_checks_capacity() -> None:
    with pytest.raises(ValueError, match="capacity"):
        SystemView.of_fresh(0.0, -1.0, 1.0, {})


def test_all_active_in_order_skips_filter_and_sort() -> None:
    jobs = {"a": row("a", 0), "b": row("b", 1)}
    view = SystemView.of_fresh(0.0, 1.0, 1.0, jobs, all_active_in_order=True)
    active = view.active_jobs()
    assert active == [jobs["a"], jobs["b"]]
    active.pop()  # the caller's list, not the view's
    assert view.active_jobs() == [jobs["a"], jobs["b"]]
    assert view == SystemView(now=0.0, capacity=1.0, node_bandwidth=1.0, jobs=jobs)


def test_the_cache_is_not_part_of_the_views_value() -> None:
    view = SystemView.of_fresh(0.0, 1.0, 1.0, {"a": row("a", 0)}, all_active_in_order=True)
    assert "_active" not in repr(view)
    # replace() builds through the constructor: no stale cache carried over
    other = dataclasses.replace(view, jobs={"b": row("b", 0)})
    assert [j.job_id for j in other.active_jobs()] == ["b"]


def test_job_row_builds_the_constructors_row() -> None:
    from burstctl.policies.view import job_row

    values = ("j", "u", "g", 4, 2.0, 10.0, 5.0, -1.0, 8.0, 3.0, 5.0, -9.0, 1.5, 0.5, 7.0, 3)
    fast, built = job_row(*values), JobView(*values)
    assert type(fast) is JobView and isinstance(fast, JobView)
    assert fast == built and hash(fast) == hash(built) and repr(fast) == repr(built)
    assert dataclasses.astuple(fast) == values
    assert fast.yield_at(1.0) == built.yield_at(1.0)
    assert dataclasses.replace(fast, demand=1.0) == dataclasses.replace(built, demand=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.demand = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        job_row(*values[:-1])  # every field, no defaults
    assert job_row is not JobView  # this interpreter takes the fast path
