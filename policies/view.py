"""The immutable snapshot a policy reads: ``SystemView`` and its ``JobView`` rows.

The controller builds views from its job table and the simulator from its
model; policies see nothing else. Symbols follow the bandwidth-sharing paper
([BWS] §3).

Both classes have one constructor, and it is the fast one: a replica merges
about a thousand rows per exchange and the simulator builds a row for every
served application at every decision, so ``JobView(...)`` builds its row as an
unfrozen twin of identical layout and turns it into a ``JobView``
(``JobView.__new__``); ``SystemView`` is built the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, make_dataclass
from operator import attrgetter
from types import MappingProxyType
from typing import Any

JobId = str

# y_i(τ_i) is 0/0; the paper says fresh applications "have the same yield
# (equal to 0)". Only tie order depends on it.
FRESH_YIELD = 0.0


@dataclass(frozen=True, slots=True, init=False)
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

    def __new__(cls, *args: Any, **kwargs: Any) -> JobView:
        # A frozen dataclass's __init__ sets every field through object.__setattr__,
        # several times slower than a plain slots class. The twin has the same slots
        # in the same order, so CPython lets the instance change class afterwards;
        # the result is an ordinary, frozen JobView (a module test pins the layout).
        if not args and not kwargs:  # copy and pickle set the slots afterwards
            return object.__new__(cls)
        row = _Twin(*args, **kwargs)
        row.__class__ = cls
        return row  # type: ignore[no-any-return]

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


_Twin = make_dataclass(
    "JobView",  # its messages name the class users call
    [(f.name, f.type, field(default=f.default)) for f in fields(JobView)],
    slots=True,
)


@dataclass(frozen=True, slots=True)
class Periodic:
    """A job that declared its period ([PERSCHED]): ``w`` seconds of compute, then
    ``vol_io`` bytes of I/O, per iteration, on ``nodes`` nodes."""

    nodes: int
    w: float
    vol_io: float


NO_PERIODIC: Mapping[JobId, Periodic] = MappingProxyType({})
NO_BYTES: Mapping[JobId, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class BufferView:
    """The burst buffer behind the view ([DPSAC] §3.1): its capacity S, what is on it, and
    the bandwidth B at which it drains to the parallel file system (PFS).

    ``resident`` and ``pending`` hold only jobs with bytes on the buffer; ``used`` also counts
    space granted to writers and not filled yet, so ``used`` ≥ Σ ``resident``.
    """

    size: float  # S, bytes
    used: float  # bytes on the buffer or promised to writers, <= size
    drain_bandwidth: float  # B of [DPSAC], bytes/s to the PFS; 0 = not configured
    resident: Mapping[JobId, float] = field(default_factory=lambda: NO_BYTES)
    pending: Mapping[JobId, float] = field(default_factory=lambda: NO_BYTES)  # not on the PFS yet

    @property
    def free(self) -> float:
        return max(0.0, self.size - self.used)


@dataclass(frozen=True, slots=True, init=False)
class SystemView:
    """Everything a policy may read: time, capacity and the jobs.

    The controller passes the jobs of S(t) only; the simulator may pass all
    applications (computing ones with ``demand`` 0). ``jobs`` is copied, so the
    caller may go on changing its own dict.

    ``observed``: the jobs were seen directly (a replica's own job table, the
    simulator). A view merged from the digests of several replicas is False: its
    times are offsets and its volumes summaries, so a policy that learns from the
    views it is shown (Set-10) decides from it without learning.

    ``periodic``: every live job that declared its period, computing or not (a job of
    ``jobs`` is in S(t) only while in I/O); read by ``persched``. Empty by default.

    ``buffer``: the burst buffer's fill, when the controller has a capacity
    (``--bb-capacity``) or the simulator models one; read by ``dpsac``. None otherwise.
    """

    now: float
    capacity: float  # B, bytes/s
    node_bandwidth: float  # b, bytes/s per node
    jobs: Mapping[JobId, JobView] = field(default_factory=dict)
    seed: int = 0  # for policies that draw; same seed → same rates
    horizon: float | None = None  # T_end of the simulated window; None when live
    observed: bool = True
    periodic: Mapping[JobId, Periodic] = field(default_factory=lambda: NO_PERIODIC)
    buffer: BufferView | None = None

    def __new__(
        cls,
        now: float,
        capacity: float,
        node_bandwidth: float,
        jobs: Mapping[JobId, JobView] | None = None,
        seed: int = 0,
        horizon: float | None = None,
        observed: bool = True,
        periodic: Mapping[JobId, Periodic] | None = None,
        buffer: BufferView | None = None,
    ) -> SystemView:
        # Built like JobView (one view per decision in the simulator), with the checks
        # a __post_init__ would make.
        if not (math.isfinite(capacity) and capacity >= 0.0):
            raise ValueError(f"capacity must be finite and >= 0, got {capacity!r}")
        rows = MappingProxyType(dict(jobs) if jobs is not None else {})
        declared = NO_PERIODIC if not periodic else MappingProxyType(dict(periodic))
        view = _ViewTwin(
            now, capacity, node_bandwidth, rows, seed, horizon, observed, declared, buffer
        )
        view.__class__ = cls
        return view  # type: ignore[no-any-return]

    def active_jobs(self) -> list[JobView]:
        """S(t), in the jobs' stable order (``index``, then id)."""
        active = [j for j in self.jobs.values() if j.demand > 0.0]  # JobView.active
        last = -1  # builders usually list the jobs in index order already: then no sort
        for job in active:
            if job.index <= last:
                active.sort(key=_STABLE_ORDER)
                break
            last = job.index
        return active


_ViewTwin = make_dataclass("SystemView", [f.name for f in fields(SystemView)], slots=True)


# (index, job_id): a C-level key, cheaper than a lambda on this hot path
_STABLE_ORDER = attrgetter("index", "job_id")


def job_cap(nodes: int, node_bandwidth: float, capacity: float) -> float:
    """b_i = min(p_i · b, B), eq. (1)."""
    return min(nodes * node_bandwidth, capacity)
