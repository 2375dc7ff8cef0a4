"""``JobView`` and ``SystemView``: one constructor each, fast, with a value's manners."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from burstctl.policies import JobView, SystemView
from burstctl.policies.view import _Twin, _ViewTwin

VALUES = ("j", "u", "g", 4, 2.0, 10.0, 5.0, -1.0, 8.0, 3.0, 5.0, -9.0, 1.5, 0.5, 7.0, 3)


def row(job_id: str, index: int, demand: float = 1.0) -> JobView:
    return JobView(job_id, "u", "g", 1, 1.0, 1.0, demand, 0.0, index=index)


def test_twins_have_the_layout_of_the_classes_they_stand_for() -> None:
    # __class__ assignment needs the same slots in the same order
    assert _Twin.__slots__ == JobView.__slots__
    assert _ViewTwin.__slots__ == SystemView.__slots__


def test_a_job_view_is_a_frozen_value() -> None:
    built = JobView(*VALUES)
    names = [f.name for f in dataclasses.fields(JobView)]
    by_name = JobView(**dict(zip(names, VALUES, strict=True)))
    assert type(built) is JobView and built == by_name and hash(built) == hash(by_name)
    assert dataclasses.astuple(built) == VALUES
    assert repr(built).startswith("JobView(job_id='j'")
    assert built != dataclasses.replace(built, demand=1.0)
    assert dataclasses.replace(built, demand=1.0).demand == 1.0
    assert pickle.loads(pickle.dumps(built)) == built
    assert copy.copy(built) == built and copy.deepcopy(built) == built
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.demand = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"JobView.*missing"):
        JobView("j", "u")  # type: ignore[call-arg]
    defaults = JobView("j", "u", "g", 1, 1.0, 2.0, 2.0)
    assert (defaults.posted_at, defaults.remaining, defaults.index) == (None, None, 0)


def test_a_system_view_copies_its_jobs_and_is_frozen() -> None:
    jobs = {"b": row("b", 1), "a": row("a", 0)}
    view = SystemView(now=3.0, capacity=1.0, node_bandwidth=0.5, jobs=jobs, seed=7, horizon=9.0)
    jobs["c"] = row("c", 2)  # the caller's dict is not the view's
    assert set(view.jobs) == {"a", "b"}
    with pytest.raises(TypeError):
        view.jobs["d"] = row("d", 3)  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.now = 4.0  # type: ignore[misc]
    assert view == SystemView(3.0, 1.0, 0.5, {"a": row("a", 0), "b": row("b", 1)}, 7, 9.0)
    assert view.observed and SystemView(0.0, 1.0, 1.0).jobs == {}
    assert dataclasses.replace(view, now=5.0).jobs == view.jobs
    for capacity in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="capacity"):
            SystemView(0.0, capacity, 1.0)


def test_active_jobs_are_in_the_stable_order_whatever_the_input_order() -> None:
    idle = row("z", 0, demand=0.0)
    in_order = {"a": row("a", 0), "b": row("b", 1), "c": row("c", 5)}
    shuffled = {"c": row("c", 5), "z": idle, "a": row("a", 0), "b": row("b", 1)}
    expected = [row("a", 0), row("b", 1), row("c", 5)]
    assert SystemView(0.0, 1.0, 1.0, in_order).active_jobs() == expected
    assert SystemView(0.0, 1.0, 1.0, shuffled).active_jobs() == expected
    # equal indices: by job id
    tied = {"y": row("y", 1), "x": row("x", 1), "w": row("w", 0)}
    assert [j.job_id for j in SystemView(0.0, 1.0, 1.0, tied).active_jobs()] == ["w", "x", "y"]
    view = SystemView(0.0, 1.0, 1.0, in_order)
    view.active_jobs().pop()  # the caller's list, not the view's
    assert view.active_jobs() == expected
