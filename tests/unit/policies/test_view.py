"""``JobView``, ``Columns`` and ``SystemView``: immutable rows, a read-only columnar view
built from rows or over columns, with a value's manners."""

from __future__ import annotations

import copy
import pickle

import pytest
from support.views import job

from burstctl.policies import JobView, SystemView
from burstctl.policies.view import FIELDS, Columns

VALUES = ("j", "u", "g", 4, 2.0, 10.0, 5.0, -1.0, 8.0, 3.0, 5.0, -9.0, 1.5, 0.5, 7.0, 3)


def row(job_id: str, index: int, demand: float = 1.0) -> JobView:
    return job(job_id, 1.0, demand, index=index)


def test_a_job_view_is_an_immutable_value() -> None:
    built = JobView(*VALUES)
    by_name = JobView(**dict(zip(FIELDS, VALUES, strict=True)))
    assert type(built) is JobView and built == by_name and hash(built) == hash(by_name)
    assert tuple(built) == VALUES
    assert repr(built).startswith("JobView(job_id='j'")
    assert built != built._replace(demand=1.0)
    assert built._replace(demand=1.0).demand == 1.0
    assert pickle.loads(pickle.dumps(built)) == built
    assert copy.copy(built) == built and copy.deepcopy(built) == built
    with pytest.raises(AttributeError):
        built.demand = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"missing"):
        JobView("j", "u")  # type: ignore[call-arg]
    defaults = JobView("j", "u", "g", 1, 1.0, 2.0, 2.0)
    assert (defaults.posted_at, defaults.remaining, defaults.index) == (None, None, 0)
    assert (defaults.active, JobView(*VALUES[:6], 0.0).active) == (True, False)


def test_a_system_view_copies_its_jobs_and_is_read_only() -> None:
    jobs = {"b": row("b", 1), "a": row("a", 0)}
    view = SystemView(now=3.0, capacity=1.0, node_bandwidth=0.5, jobs=jobs, seed=7, horizon=9.0)
    jobs["c"] = row("c", 2)  # the caller's dict is not the view's
    assert set(view.jobs) == {"a", "b"}
    with pytest.raises(TypeError):
        view.jobs["d"] = row("d", 3)  # type: ignore[index]
    for name in ("now", "jobs", "columns", "active"):
        with pytest.raises(AttributeError, match="read-only"):
            setattr(view, name, 4.0)
    with pytest.raises(AttributeError, match="read-only"):
        del view.now
    assert view == SystemView(3.0, 1.0, 0.5, {"a": row("a", 0), "b": row("b", 1)}, 7, 9.0)
    assert view != SystemView(3.0, 1.0, 0.5, {"a": row("a", 0)}, 7, 9.0)
    assert view.observed and SystemView(0.0, 1.0, 1.0).jobs == {}
    assert "jobs={'b'" in repr(view)
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


def test_the_columns_of_a_view_built_from_rows_are_in_the_stable_order() -> None:
    shuffled = {"c": row("c", 5), "z": row("z", 0, demand=0.0), "a": row("a", 1)}
    view = SystemView(0.0, 1.0, 1.0, shuffled)
    columns = view.columns
    assert list(columns.job_id) == ["z", "a", "c"] and list(columns.index) == [0, 1, 5]
    assert list(view.rows) == [0, 1, 2] and list(view.active) == [1, 2]  # z is idle
    assert view.row_of == {"z": 0, "a": 1, "c": 2}
    assert [columns.job(r) for r in view.active] == view.active_jobs()
    assert list(columns.demand) == [0.0, 1.0, 1.0]


def test_a_view_over_columns_reads_them_in_place_and_is_moved_by_its_owner() -> None:
    m = 4
    cap = [1.0, 2.0, 3.0, 4.0]
    progress = [0.0] * m
    columns = Columns(
        job_id=[f"{i}" for i in range(m)], user=["u"] * m, group=["g"] * m, nodes=[1] * m,
        priority=[1.0] * m, cap=cap, demand=cap, posted_at=[0.0] * m, volume=[5.0] * m,
        remaining=[4.0] * m, moved=[1.0] * m, released_at=[0.0] * m, progress=progress,
        last_work=[0.0] * m, mean_volume=[0.0] * m, index=range(m),
    )  # fmt: skip
    in_io = [0, 2]
    view = SystemView.of_columns(1.0, 10.0, 10.0, columns, in_io, in_io)
    assert list(view.jobs) == ["0", "2"] and view.jobs["2"].cap == 3.0
    in_io.append(3)  # the owner's next decision: its lists, changed in place
    progress[3] = 7.0
    view.now = 2.0  # (the owner's; a view from JobView rows is read-only)
    assert view.now == 2.0 and view.row_of == {"0": 0, "2": 2, "3": 3}
    assert view.active_jobs()[-1] == JobView("3", "u", "g", 1, 1.0, 4.0, 4.0, 0.0, 5.0, 4.0,
                                             1.0, 0.0, 7.0, 0.0, 0.0, 3)  # fmt: skip
    with pytest.raises(TypeError, match="every field"):
        Columns(job_id=[])
