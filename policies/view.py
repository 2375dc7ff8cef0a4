"""The snapshot a policy reads: ``SystemView``, its per-job ``Columns`` and ``JobView`` rows.

The controller builds views from its job table and the simulator from its
model; policies see nothing else. Symbols follow the bandwidth-sharing paper
([BWS] §3).

A view is columnar. Its jobs are *rows* of :class:`Columns`, parallel lists
indexed by row, numbered in the jobs' stable order (``index``, then job id), so
that every tie a policy breaks by row is broken in that order whatever order
the view was given its jobs in. ``SystemView.active`` lists the rows of S(t) in
that order. A policy that computes over numbers reads the columns (one list
per field, no object per job); one that reads jobs as objects asks for
``view.jobs`` or ``view.active_jobs()``, the :class:`JobView` rows, built from
the columns when the view was built from columns (cached for the view).

Two ways to build one: ``SystemView(now, capacity, node_bandwidth, jobs=...)``
from ``JobView`` rows (the controller, tests: the columns are filled from them
on first use), or :meth:`SystemView.of_columns` over columns the caller keeps
(the simulator, whose lists are its own state: such a view stands for the
system at ``now`` during the decision, and a policy keeps nothing of it but
values).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import gt, itemgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

JobId = str

# y_i(τ_i) is 0/0; the paper says fresh applications "have the same yield
# (equal to 0)". Only tie order depends on it.
FRESH_YIELD = 0.0


class JobView(NamedTuple):
    """One job as a policy sees it at the view's time: an immutable record.

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
    # stable order of jobs (first seen / input order); breaks ties (shadows tuple.index)
    index: int = 0  # type: ignore[assignment]

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


FIELDS: tuple[str, ...] = JobView._fields
_FIELD_OF = {name: itemgetter(k) for k, name in enumerate(FIELDS)}
_INDEX = itemgetter(FIELDS.index("index"))
_STABLE_ORDER = itemgetter(FIELDS.index("index"), FIELDS.index("job_id"))


class Columns:
    """The jobs of one or more views as parallel columns, one per ``JobView`` field,
    indexed by row; rows are numbered in the stable order (``index``, then job id).

    Built over the caller's sequences (every field given: the simulator's lists, read
    in place), or from ``JobView`` rows (:meth:`of_jobs`: each column is filled on
    first use). A column is any sequence indexed by row; a value that is rarely read
    may be a sequence that computes it. ``job(row)`` is the row as a ``JobView``.
    """

    __slots__ = FIELDS

    if TYPE_CHECKING:
        job_id: Sequence[JobId]
        user: Sequence[str]
        group: Sequence[str]
        nodes: Sequence[int]
        priority: Sequence[float]
        cap: Sequence[float]
        demand: Sequence[float]
        posted_at: Sequence[float | None]
        volume: Sequence[float]
        remaining: Sequence[float | None]
        moved: Sequence[float]
        released_at: Sequence[float]
        progress: Sequence[float]
        last_work: Sequence[float]
        mean_volume: Sequence[float]
        index: Sequence[int]

    def __init__(self, **columns: Sequence[Any]) -> None:
        if set(columns) != set(FIELDS):
            raise TypeError(f"Columns takes every field of JobView: {', '.join(FIELDS)}")
        for name, column in columns.items():
            setattr(self, name, column)

    @staticmethod
    def of_jobs(jobs: Iterable[JobView]) -> Columns:
        """The columns of ``jobs``, in the stable order whatever their order here."""
        return _JobColumns(jobs)

    def job(self, row: int) -> JobView:
        """Row ``row`` as a ``JobView`` (built from the columns)."""
        return JobView(
            self.job_id[row],
            self.user[row],
            self.group[row],
            self.nodes[row],
            self.priority[row],
            self.cap[row],
            self.demand[row],
            self.posted_at[row],
            self.volume[row],
            self.remaining[row],
            self.moved[row],
            self.released_at[row],
            self.progress[row],
            self.last_work[row],
            self.mean_volume[row],
            self.index[row],
        )


class _JobColumns(Columns):
    """Columns of ``JobView`` rows: the rows sorted into the stable order when made, each
    column filled on first use."""

    __slots__ = ("_built", "_jobs")

    def __init__(self, jobs: Iterable[JobView]) -> None:  # (no super: every column lazy)
        # The stable order: by index (a C-level key), then by job id where indices are
        # equal (only in views a builder gave equal indices).
        ordered = sorted(jobs, key=_INDEX)
        if len(set(map(_INDEX, ordered))) < len(ordered):
            ordered.sort(key=_STABLE_ORDER)
        self._jobs = ordered
        self._built: dict[str, list[Any]] = {}

    def job(self, row: int) -> JobView:
        return self._jobs[row]


def _lazy_column(name: str) -> property:
    """A column of ``_JobColumns``, built from its rows on first use."""
    get = _FIELD_OF[name]

    def column(self: _JobColumns) -> list[Any]:
        built = self._built
        values = built.get(name)
        if values is None:
            values = built[name] = list(map(get, self._jobs))
        return values

    return property(column)


for _name in FIELDS:
    setattr(_JobColumns, _name, _lazy_column(_name))
del _name


def remaining_estimate(columns: Columns, row: int) -> float:
    """``JobView.remaining_estimate`` of ``row``: V_i, or ``mean_volume − moved``."""
    remaining = columns.remaining[row]
    if remaining is not None:
        return remaining
    return max(0.0, columns.mean_volume[row] - columns.moved[row])


@dataclass(frozen=True, slots=True)
class Periodic:
    """A periodic job ([PERSCHED]): ``w`` seconds of compute, then ``vol_io`` bytes of I/O,
    per iteration, on ``nodes`` nodes. Declared by the job (``learned`` False), or learned
    from its observed phases (``policies/periods.py``) with ``confidence`` in [0, 1]."""

    nodes: int
    w: float
    vol_io: float
    learned: bool = False  # learned from the job's phases, not declared
    confidence: float = 1.0  # of a learned period, in [0, 1]


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


_SCALARS = (
    "now",
    "capacity",
    "node_bandwidth",
    "seed",
    "horizon",
    "observed",
    "periodic",
    "buffer",
)


class SystemView:
    """Everything a policy may read: time, capacity and the jobs. Read-only.

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

    ``columns`` (indexed by row), ``rows`` (the rows of the view's jobs, increasing)
    and ``active`` (the rows of S(t), in the stable order) are the jobs as a policy
    that computes over numbers reads them (module docstring).
    """

    __slots__ = (*_SCALARS, "columns", "rows", "active", "_jobs")

    now: float
    capacity: float  # B, bytes/s
    node_bandwidth: float  # b, bytes/s per node
    seed: int  # for policies that draw; same seed → same rates
    horizon: float | None  # T_end of the simulated window; None when live
    observed: bool
    periodic: Mapping[JobId, Periodic]
    buffer: BufferView | None
    columns: Columns
    rows: Sequence[int]
    active: Sequence[int]
    _jobs: Mapping[JobId, JobView] | None  # given, or built from the columns (None)

    def __init__(
        self,
        now: float,
        capacity: float,
        node_bandwidth: float,
        jobs: Mapping[JobId, JobView] | None = None,
        seed: int = 0,
        horizon: float | None = None,
        observed: bool = True,
        periodic: Mapping[JobId, Periodic] | None = None,
        buffer: BufferView | None = None,
    ) -> None:
        if not (math.isfinite(capacity) and capacity >= 0.0):
            raise ValueError(f"capacity must be finite and >= 0, got {capacity!r}")
        given = MappingProxyType(dict(jobs) if jobs is not None else {})
        columns = Columns.of_jobs(given.values())
        rows = range(len(given))
        declared = NO_PERIODIC if not periodic else MappingProxyType(dict(periodic))
        fields = (now, capacity, node_bandwidth, seed, horizon, observed, declared, buffer)
        _init(self, fields, columns, rows, _active(columns, rows), given)

    @classmethod
    def of_columns(
        cls,
        now: float,
        capacity: float,
        node_bandwidth: float,
        columns: Columns,
        rows: Sequence[int],
        active: Sequence[int],
        seed: int = 0,
        horizon: float | None = None,
        observed: bool = True,
        periodic: Mapping[JobId, Periodic] = NO_PERIODIC,
        buffer: BufferView | None = None,
    ) -> SystemView:
        """A view whose jobs are ``rows`` of ``columns`` and S(t) ``active``, read in
        place: the caller's, not copied.

        ``rows`` are increasing, ``active`` the rows of ``rows`` with demand > 0 (in
        increasing order, the stable order); ``capacity`` is the caller's to check
        (finite, ≥ 0). Between two decisions the caller may change its sequences and
        move the view to the next decision's time, ``view.now = t`` (the one attribute
        it sets); ``jobs`` and ``row_of`` are then read anew from the rows.
        """
        view: SystemView = object.__new__(_MovedView)
        fields = (now, capacity, node_bandwidth, seed, horizon, observed, periodic, buffer)
        _init(view, fields, columns, rows, active, None)
        return view

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a SystemView is read-only: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"a SystemView is read-only: cannot delete {name!r}")

    @property
    def jobs(self) -> Mapping[JobId, JobView]:
        """The jobs as ``JobView`` rows, by job id (of a view over columns: read from
        its rows at each access)."""
        jobs = self._jobs
        if jobs is None:
            columns = self.columns
            ids = columns.job_id
            job = columns.job
            return MappingProxyType({ids[r]: job(r) for r in self.rows})
        return jobs

    def active_jobs(self) -> list[JobView]:
        """S(t) as ``JobView`` rows, in the stable order (a new list)."""
        job = self.columns.job
        return [job(r) for r in self.active]

    @property
    def row_of(self) -> dict[JobId, int]:
        """The row of each job of the view, by job id (a new dict)."""
        ids = self.columns.job_id
        return {ids[r]: r for r in self.rows}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SystemView):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in _SCALARS) and (
            self.jobs == other.jobs
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        scalars = ", ".join(f"{n}={getattr(self, n)!r}" for n in _SCALARS)
        return f"SystemView({scalars}, jobs={dict(self.jobs)!r})"


class _MovedView(SystemView):
    """A view over its owner's columns (:meth:`SystemView.of_columns`), which the owner
    moves to its next decision by setting ``now`` (a plain attribute write: the
    simulator does it at every event). A policy writes to no view."""

    __slots__ = ()
    # The generic store, both halves of the one slot (else every write goes through Python)
    __setattr__ = object.__setattr__  # type: ignore[assignment]
    __delattr__ = object.__delattr__  # type: ignore[assignment]


def _init(
    view: SystemView,
    fields: tuple[Any, ...],
    columns: Columns,
    rows: Sequence[int],
    active: Sequence[int],
    jobs: Mapping[JobId, JobView] | None,
) -> None:
    """Sets a new view's attributes: ``fields`` the scalars, in ``_SCALARS``' order."""
    for store, value in zip(_SCALAR_SETTERS, fields, strict=True):
        store(view, value)
    _set_columns(view, columns)
    _set_rows(view, rows)
    _set_active(view, active)
    _set_jobs(view, jobs)


# Each attribute's own setter, past the read-only __setattr__ (cheaper than _set by name).
_SCALAR_SETTERS = tuple(getattr(SystemView, name).__set__ for name in _SCALARS)
_set_columns = SystemView.columns.__set__  # type: ignore[attr-defined]
_set_rows = SystemView.rows.__set__  # type: ignore[attr-defined]
_set_active = SystemView.active.__set__  # type: ignore[attr-defined]
_set_jobs = SystemView._jobs.__set__  # type: ignore[union-attr]


def _active(columns: Columns, rows: range) -> list[int]:
    """The rows with demand > 0 of a view built from ``JobView`` rows (all its rows)."""
    return list(compress(rows, map(gt, columns.demand, repeat(0.0))))


# Rates by the rows of the view a policy decided on: (row, rate) pairs
RowRates: TypeAlias = list[tuple[int, float]]


def job_cap(nodes: int, node_bandwidth: float, capacity: float) -> float:
    """b_i = min(p_i · b, B), eq. (1)."""
    return min(nodes * node_bandwidth, capacity)
