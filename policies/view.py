"""The immutable snapshot a policy reads: ``SystemView`` and its ``JobView`` rows.

The controller builds views from its job table and the simulator from its
model; policies see nothing else. Symbols follow the bandwidth-sharing paper
(``shared/papers/bandwidth-sharing-strategies.txt`` §3, notes §1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, make_dataclass
from operator import attrgetter
from types import MappingProxyType
from typing import Any

JobId = str

# y_i(τ_i) is 0/0; the paper says fresh applications "have the same yield
# (equal to 0)". Only tie order depends on it.
FRESH_YIELD = 0.0


@dataclass(frozen=True, slots=True)
class JobView:
    """One job as a policy sees it at the view's time.

    Volumes are in bytes for the controller and in normalised units for the
    simulator; policies only compare and divide them by ``cap``, so either works.
    """

    job_id: JobId
    user: str
    group: str
    nodes: int  # p_i
    priority: float
    cap: float  # b_i = min(p_i * b, B), eq. (1), bytes/s
    demand: float  # ceiling the job can use now, bytes/s, <= cap; 0 = idle (not in S(t))
    posted_at: float | None = None  # R_i: post time of the pending operation (None: none)
    volume: float = 0.0  # v_i of the pending operation; 0 = unknown
    remaining: float | None = None  # V_i: remaining volume of the pending op; None = unknown
    moved: float = 0.0  # volume moved so far by the pending operation
    released_at: float = 0.0  # τ_i
    progress: float = 0.0  # P_i = W_i^(done) + V_i^(transferred) / b_i, seconds (eq. 6)
    last_work: float = 0.0  # w_i: length of the work phase before the pending operation
    mean_volume: float = 0.0  # mean volume of the job's completed operations (0: none yet)
    index: int = 0  # stable order of jobs (first seen / input order); breaks ties

    @property
    def active(self) -> bool:
        """In S(t): has a pending operation and wants bandwidth."""
        return self.demand > 0.0

    def yield_at(self, now: float) -> float:
        """y_i(t) = (W_i^(done)(t) + V_i^(transferred)(t) / b_i) / (t − τ_i), eq. (6)."""
        elapsed = now - self.released_at
        if elapsed <= 0.0:
            return FRESH_YIELD
        return self.progress / elapsed

    def remaining_estimate(self) -> float:
        """V_i, or when the client did not say (volume 0): what the job's past
        operations suggest is left, ``mean_volume − moved`` (0 with no history)."""
        if self.remaining is not None:
            return self.remaining
        return max(0.0, self.mean_volume - self.moved)


@dataclass(frozen=True, slots=True)
class SystemView:
    """Everything a policy may read: time, capacity and the jobs.

    The controller passes the jobs of S(t) only; the simulator may pass all
    applications (computing ones with ``demand`` 0).
    """

    now: float
    capacity: float  # B, bytes/s
    node_bandwidth: float  # b, bytes/s per node
    jobs: Mapping[JobId, JobView] = field(default_factory=dict)
    seed: int = 0  # for policies that draw; same seed → same rates
    horizon: float | None = None  # T_end of the simulated window; None when live
    # S(t) in stable order when the builder vouched for it (``of_fresh``); not a field
    # a policy reads: ``active_jobs()`` returns it
    _active: tuple[JobView, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_capacity(self.capacity)
        object.__setattr__(self, "jobs", MappingProxyType(dict(self.jobs)))

    @classmethod
    def of_fresh(
        cls,
        now: float,
        capacity: float,
        node_bandwidth: float,
        jobs: dict[JobId, JobView],
        seed: int = 0,
        horizon: float | None = None,
        *,
        all_active_in_order: bool = False,
    ) -> SystemView:
        """The view ``SystemView(...)`` builds, faster, for a caller that hands over a
        ``jobs`` dict made for this view alone and never touches it again (the
        simulator builds one per decision): no defensive copy, and none of the
        frozen ``__init__``'s per-field overhead.

        ``all_active_in_order``: the caller vouches that every job is active and
        that ``jobs`` iterates in the stable order (``index``, then id), so
        ``active_jobs()`` needs neither filter nor sort.
        """
        _check_capacity(capacity)
        view = object.__new__(cls)
        set_field = object.__setattr__  # as the frozen dataclass __init__ does
        set_field(view, "now", now)
        set_field(view, "capacity", capacity)
        set_field(view, "node_bandwidth", node_bandwidth)
        set_field(view, "jobs", MappingProxyType(jobs))
        set_field(view, "seed", seed)
        set_field(view, "horizon", horizon)
        set_field(view, "_active", tuple(jobs.values()) if all_active_in_order else None)
        return view

    def active_jobs(self) -> list[JobView]:
        """S(t), in the jobs' stable order (``index``, then id)."""
        if self._active is not None:
            return list(self._active)
        active = [j for j in self.jobs.values() if j.demand > 0.0]  # JobView.active
        active.sort(key=_STABLE_ORDER)
        return active


# (index, job_id): a C-level key, cheaper than a lambda on this hot path
_STABLE_ORDER = attrgetter("index", "job_id")


def _check_capacity(capacity: float) -> None:
    if not (math.isfinite(capacity) and capacity >= 0.0):
        raise ValueError(f"capacity must be finite and >= 0, got {capacity!r}")


def _row_builder() -> Callable[..., JobView]:
    """``job_row``: builds a :class:`JobView` from all 16 field values, positionally.

    The frozen dataclass ``__init__`` sets each field through ``object.__setattr__``:
    ~4.4 µs for a row here, and a replica merges ~1,000 rows per exchange
    (``GlobalView``). This builds the row as an unfrozen twin
    with the same slots in the same order (~0.6 µs) and then makes it a
    ``JobView`` by assigning ``__class__``, which CPython allows between classes
    of identical layout. The result is a plain ``JobView``: equal, hashable,
    frozen. If this interpreter refuses the assignment, ``JobView`` itself is used.
    """
    names = [f.name for f in fields(JobView)]
    twin = make_dataclass("_JobViewTwin", names, slots=True)

    def job_row(*values: Any) -> JobView:
        row = twin(*values)
        row.__class__ = JobView
        return row  # type: ignore[no-any-return]

    probe: tuple[Any, ...] = tuple(range(len(names)))
    try:
        fast = job_row(*probe)
    except TypeError:  # another interpreter or layout: the constructor, slower
        return JobView
    if fast != JobView(*probe) or type(fast) is not JobView:
        return JobView
    return job_row


job_row = _row_builder()


def job_cap(nodes: int, node_bandwidth: float, capacity: float) -> float:
    """b_i = min(p_i · b, B), eq. (1)."""
    return min(nodes * node_bandwidth, capacity)
