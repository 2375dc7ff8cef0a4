"""A replica's digest: what it tells its peers every λ, and the one check of it.

Every λ each replica sends its :class:`Digest` to every peer ([THEMIS] §3.1,
λ-delayed fairness): its capacity and node bandwidth, its active policy with
that policy's version, and its jobs as :class:`DigestJobs`, one array per field.
:func:`validate` is the only check a digest gets, whether it was decoded from
the wire (``controller/digest_wire.py``) or built in process
(``controller/local_digest.py``), and it checks every job at once, as array
operations, naming the first bad field of the first bad job (``jobs[3].nodes``).

Time inside a digest is the sender's own: ``released_at`` and ``posted_at`` are
instants on the sender's clock and ``sent_at`` the instant it built the digest
on that clock; the merge reads the differences (≤ 0 s), so no clock
synchronisation between hosts is needed, and a job whose only change is that
time passed has the same columns in two digests (what a delta leaves out,
``controller/delta.py``). ``sent_at`` 0 (a replica of an earlier version): the
times are those offsets already.

A digest is full (``base_sequence`` 0) or a delta on an earlier digest of the
same sender: its jobs are those that arrived or changed since, ``left`` the ids
of those that left; :func:`validate` checks it as it checks a full one.

Ordering: a replica's digests are ordered by ``(incarnation, sequence)``.
``sequence`` counts exchanges and restarts from 0 when the process restarts;
``incarnation`` is a start token that must grow with every restart of the same
replica id (the start time in ns). See ``controller/membership.py``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from burstctl.common.limits import (
    MAX_BUFFER_BYTES,
    MAX_COUNTER,
    MAX_JOBS,
    MAX_NODES,
    MAX_PERIOD_VOL,
    MAX_PERIOD_W,
    MAX_PRIORITY,
    MAX_RATE,
    MAX_TEXT,
    identifier_problem,
)
from burstctl.controller import catalog as cat
from burstctl.policies.view import JobId

ReplicaId = str


class DigestError(ValueError):
    """A digest that must not touch the global view; ``field`` names the bad field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(slots=True)
class JobDigest:
    """One job of a digest as plain values (a row of :class:`DigestJobs`)."""

    job_id: JobId
    user: str
    group: str
    nodes: int  # p_i
    priority: float
    demand: float  # local demand on this replica, bytes/s; 0 without an open operation
    usage_bytes: float  # bytes moved on this replica since its previous digest
    progress: float  # P_i as this replica computed it, seconds (eq. 6)
    released_at: float  # τ_i ≤ sent_at, seconds, on the sender's clock
    posted_at: float | None = None  # R_i ≤ sent_at of the open operation here; None: none
    remaining: float | None = None  # V_i of the open operation here, bytes; None: unknown
    open_op: bool = False  # the job has an open operation on this replica
    transferred: float = 0.0  # bytes this job moved on this replica in all (P_i's V part)
    # the job's period here: declared, or learned from its phases here (None: none)
    period_w: float | None = None  # compute seconds per iteration
    period_vol: float | None = None  # bytes per iteration (declared: the job's; learned: here)
    period_learned: bool = False
    resident: float = 0.0  # bytes of the job on this replica's burst buffer
    pending: float = 0.0  # of them, not on the parallel file system yet
    mean_volume: float = 0.0  # of a periodic job's completed operations here (0: none yet)


_FLOAT_FIELDS = (
    "priority",
    "demand",
    "usage_bytes",
    "progress",
    "released_at",
    "posted_at",
    "remaining",
    "transferred",
    "period_w",
    "period_vol",
    "resident",
    "pending",
    "mean_volume",
)
# float columns where NaN marks an absent value (None in a row)
OPTIONAL_FIELDS = ("posted_at", "remaining", "period_w", "period_vol")
JOB_TEXT_FIELDS = ("job_id", "user", "group")
JOB_ARRAY_FIELDS = ("nodes", "open_op", "period_learned", *_FLOAT_FIELDS)
ROW_FIELDS = tuple(JobDigest.__dataclass_fields__)
_BOOL_FIELDS = ("open_op", "period_learned")
_KINDS = {"nodes": ("i", "u"), **dict.fromkeys(_BOOL_FIELDS, ("b",))}  # floats: "f", "i", "u"
# the types a list's entries may have; the float fields take int and float
_TYPES: dict[str, set[type]] = {"nodes": {int}, **{name: {bool} for name in _BOOL_FIELDS}}


class DigestJobs:
    """The jobs of one digest as columns: entry i of every column is job i.

    One numpy array per numeric field and one tuple per text field, the form
    the wire carries (``peer.proto``, ``DigestJobs``) and the merge reads.
    ``posted_at`` and ``remaining`` are NaN where a row has None. Rows come back
    as :class:`JobDigest` (indexing, iteration); equality compares contents
    (NaN equals NaN). Read-only. A column of the wrong type (text for a number,
    a fraction for ``nodes``) is refused here; ranges are :func:`validate`'s.
    """

    __slots__ = JOB_TEXT_FIELDS + JOB_ARRAY_FIELDS

    job_id: tuple[str, ...]
    user: tuple[str, ...]
    group: tuple[str, ...]
    nodes: np.ndarray  # int64
    priority: np.ndarray  # float64, like every field of _FLOAT_FIELDS
    demand: np.ndarray
    usage_bytes: np.ndarray
    progress: np.ndarray
    released_at: np.ndarray
    posted_at: np.ndarray  # NaN: no open operation
    remaining: np.ndarray  # NaN: unknown
    open_op: np.ndarray  # bool
    transferred: np.ndarray
    period_w: np.ndarray  # NaN: no period
    period_vol: np.ndarray  # NaN: no period
    period_learned: np.ndarray  # bool
    resident: np.ndarray
    pending: np.ndarray
    mean_volume: np.ndarray

    def __init__(self, **columns: Any) -> None:
        missing = {f for f in self.__slots__ if f not in columns}
        extra = set(columns) - set(self.__slots__)
        if missing or extra:
            raise TypeError(f"DigestJobs: missing {sorted(missing)}, unknown {sorted(extra)}")
        for name in JOB_TEXT_FIELDS:
            object.__setattr__(self, name, tuple(columns[name]))
        for name in JOB_ARRAY_FIELDS:
            values = columns[name]
            raw = np.array(values)  # a copy: the caller's list may change
            kinds = _KINDS.get(name, ("f", "i", "u"))
            # numpy turns [8, True] into integers: a Python list's own types count too
            types: set[type] = set(map(type, values)) if isinstance(values, list | tuple) else set()
            if (raw.size and (raw.ndim != 1 or raw.dtype.kind not in kinds)) or not (
                types <= _TYPES.get(name, {int, float})
            ):
                expected = "integers" if name == "nodes" else "numbers"
                raise DigestError(
                    f"jobs.{name}", f"must be {'booleans' if name in _BOOL_FIELDS else expected}"
                )
            dtype = (
                np.int64 if name == "nodes" else np.bool_ if name in _BOOL_FIELDS else np.float64
            )
            array: np.ndarray = raw.astype(dtype).reshape(-1)
            array.flags.writeable = False
            object.__setattr__(self, name, array)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("DigestJobs is read-only")

    @classmethod
    def from_rows(cls, rows: Iterable[JobDigest]) -> DigestJobs:
        rows = tuple(rows)
        nan = math.nan
        values: dict[str, list[Any]] = {name: [] for name in ROW_FIELDS}
        for row in rows:
            for name in ROW_FIELDS:
                values[name].append(getattr(row, name))
        for name in OPTIONAL_FIELDS:
            values[name] = [nan if v is None else v for v in values[name]]
        return cls(**values)

    def __len__(self) -> int:
        return len(self.job_id)

    def __getitem__(self, i: int) -> JobDigest:
        return self.rows()[i]

    def __iter__(self) -> Iterator[JobDigest]:
        return iter(self.rows())

    def rows(self) -> tuple[JobDigest, ...]:
        """Every job as a :class:`JobDigest` with plain Python values."""
        columns = [
            list(getattr(self, name)) if name in JOB_TEXT_FIELDS else getattr(self, name).tolist()
            for name in ROW_FIELDS
        ]
        rows = []
        for values in zip(*columns, strict=True):
            row = JobDigest(*values)
            for name in OPTIONAL_FIELDS:
                value = getattr(row, name)
                if value != value:
                    setattr(row, name, None)
            rows.append(row)
        return tuple(rows)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DigestJobs):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in JOB_TEXT_FIELDS) and all(
            np.array_equal(getattr(self, f), getattr(other, f), equal_nan=f in _FLOAT_FIELDS)
            for f in JOB_ARRAY_FIELDS
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        more = ", …" if len(self) > 5 else ""
        return f"DigestJobs({len(self)} jobs: {', '.join(self.job_id[:5])}{more})"


@dataclass(frozen=True, slots=True)
class BufferHeader:
    """The sender's burst buffer: its size S_r (0: none), the bytes on it or promised to
    writers, and its drain bandwidth to the parallel file system (0: not configured)."""

    size: float = 0.0
    used: float = 0.0
    drain_bandwidth: float = 0.0


NO_BUFFER = BufferHeader()


@dataclass(frozen=True, slots=True)
class PatternOrigin:
    """The periodic pattern the sender coordinates (``key`` names it; "" none) and the
    start of one of its periods, an instant on the sender's clock."""

    key: str = ""
    origin: float = 0.0


NO_PATTERN = PatternOrigin()


@dataclass(frozen=True, slots=True)
class Digest:
    """What one replica tells its peers every λ. ``jobs`` may be given as rows
    (:class:`JobDigest`); it is kept as :class:`DigestJobs`."""

    replica_id: ReplicaId
    incarnation: int  # start token; grows with every restart (module docstring)
    sequence: int  # exchange counter within one incarnation
    capacity: float  # B_r, bytes/s
    node_bandwidth: float  # b, bytes/s per compute node (b_i = min(p_i · b, B), eq. (1))
    policy: str  # registry name or sharing spec
    policy_params: Mapping[str, Any] = field(default_factory=dict)
    policy_version: int = 0  # a switch sets max version seen + 1
    jobs: DigestJobs = field(default_factory=lambda: DigestJobs.from_rows(()))
    policy_origin: ReplicaId = ""  # where the version was switched; "" (or absent): the sender
    sent_at: float = 0.0  # when the sender built it, its clock; 0: the times are offsets
    base_sequence: int = 0  # 0: full; else a delta on this sequence (controller/delta.py)
    left: tuple[JobId, ...] = ()  # a delta's jobs that left since its base
    catalog: tuple[cat.CatalogRecord, ...] = ()  # all (full) or the changed (delta)
    buffer: BufferHeader = field(default_factory=lambda: NO_BUFFER)  # the sender's buffer
    pattern: PatternOrigin = field(default_factory=lambda: NO_PATTERN)  # persched's origin

    def __post_init__(self) -> None:
        if not isinstance(self.jobs, DigestJobs):
            object.__setattr__(self, "jobs", DigestJobs.from_rows(self.jobs))
        if not self.policy_origin:
            object.__setattr__(self, "policy_origin", self.replica_id)
        if not isinstance(self.left, tuple):
            object.__setattr__(self, "left", tuple(self.left))

    @property
    def election_key(self) -> tuple[int, ReplicaId]:
        """What the policy election compares: the highest wins (membership.py)."""
        return self.policy_version, self.policy_origin


def same_columns(a: Digest, b: Digest, columns: Iterable[str]) -> bool:
    """``a`` and ``b`` say the same in their header (but for sequence and send instant,
    and the buffer and pattern, which only policies that name no ``reads`` see) and in the
    job ``columns`` (``job_id`` among them). One ``jobs`` object for both is
    the cheap case (``Membership`` and ``delta.advance`` keep it while no job changes)."""
    return (
        a.replica_id == b.replica_id
        and a.incarnation == b.incarnation
        and a.capacity == b.capacity
        and a.node_bandwidth == b.node_bandwidth
        and a.policy == b.policy
        and a.policy_params == b.policy_params
        and a.election_key == b.election_key
        and not a.base_sequence
        and not b.base_sequence
        and (a.jobs is b.jobs or all(_same_column(a.jobs, b.jobs, c) for c in columns))
    )


def _same_column(a: DigestJobs, b: DigestJobs, name: str) -> bool:
    x, y = getattr(a, name), getattr(b, name)
    if name in JOB_TEXT_FIELDS:
        return bool(x == y)
    return x.shape == y.shape and np.array_equal(x, y, equal_nan=name in _FLOAT_FIELDS)


# ---------------------------------------------------------------------------
# The check

_INF = math.inf


_Check = Callable[[DigestJobs, float], np.ndarray]


def _finite_non_negative(name: str) -> _Check:
    def good(c: DigestJobs, _sent_at: float) -> np.ndarray:
        column = getattr(c, name)
        return (column >= 0.0) & (column < _INF)

    return good


def _must_be(what: str) -> Callable[[Any], str]:
    return lambda v: f"must be {what}, got {v!r}"


# Per job field, in the order a bad job's fields are named: whether each entry is
# good given the send instant (NaN compares False, so it fails every range), and the
# message for a bad one.
_CHECKS: tuple[tuple[str, _Check, Callable[[Any], str]], ...] = (
    (
        "nodes",
        lambda c, _: (c.nodes >= 1) & (c.nodes <= MAX_NODES),
        lambda v: f"must be an integer in [1, {MAX_NODES}], got {v!r}",
    ),
    (
        "priority",
        lambda c, _: (c.priority > 0.0) & (c.priority <= MAX_PRIORITY),
        lambda v: f"must be in (0, {MAX_PRIORITY:g}], got {v!r}",
    ),
    (
        "demand",
        lambda c, _: (c.demand >= 0.0) & (c.demand <= MAX_RATE),
        lambda v: f"must be in [0, {MAX_RATE:g}] bytes/s, got {v!r}",
    ),
    *(
        (name, _finite_non_negative(name), _must_be("finite and >= 0"))
        for name in ("usage_bytes", "progress", "transferred")
    ),
    (
        "released_at",
        lambda c, t: (c.released_at > -_INF) & (c.released_at <= t),
        _must_be("finite and <= sent_at (the send instant)"),
    ),
    (
        "posted_at",
        lambda c, t: np.isnan(c.posted_at) | ((c.posted_at > -_INF) & (c.posted_at <= t)),
        _must_be("finite and <= sent_at (the send instant), or absent"),
    ),
    (
        "remaining",
        lambda c, _: np.isnan(c.remaining) | ((c.remaining >= 0.0) & (c.remaining < _INF)),
        _must_be("finite and >= 0, or absent"),
    ),
    (
        "demand",
        lambda c, _: c.open_op | (c.demand <= 0.0),
        lambda v: "demand > 0 without an open operation",
    ),
    (
        "period_w",
        lambda c, _: np.isnan(c.period_w) | ((c.period_w > 0.0) & (c.period_w <= MAX_PERIOD_W)),
        _must_be(f"in (0, {MAX_PERIOD_W:g}] seconds, or absent"),
    ),
    (
        "period_vol",
        lambda c, _: (
            np.isnan(c.period_vol) | ((c.period_vol > 0.0) & (c.period_vol <= MAX_PERIOD_VOL))
        ),
        _must_be(f"in (0, {MAX_PERIOD_VOL:g}] bytes, or absent"),
    ),
    (
        "period_vol",
        lambda c, _: np.isnan(c.period_w) == np.isnan(c.period_vol),
        lambda v: "a period has both period_w and period_vol, or neither",
    ),
    (
        "period_learned",
        lambda c, _: ~c.period_learned | ~np.isnan(c.period_w),
        lambda v: "a learned period without period_w",
    ),
    *(
        (name, _finite_non_negative(name), _must_be("finite and >= 0"))
        for name in ("resident", "pending", "mean_volume")
    ),
)


def validate(digest: Digest) -> None:
    """Raise :class:`DigestError` naming the first bad field of ``digest``."""
    if not isinstance(digest, Digest):
        raise DigestError("digest", f"expected a Digest, got {type(digest).__name__}")
    _identifier("replica_id", digest.replica_id)
    _counter("incarnation", digest.incarnation)
    _counter("sequence", digest.sequence)
    _number("capacity", digest.capacity, low=0.0, high=MAX_RATE, low_open=False)
    _number("node_bandwidth", digest.node_bandwidth, low=0.0, high=MAX_RATE, low_open=True)
    _identifier("policy", digest.policy)
    params = digest.policy_params
    if not isinstance(params, Mapping) or not all(isinstance(k, str) for k in params):
        raise DigestError("policy_params", "must be a mapping with string keys")
    try:
        json.dumps(dict(params), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DigestError("policy_params", f"must be plain JSON values: {exc}") from None
    _counter("policy_version", digest.policy_version)
    _identifier("policy_origin", digest.policy_origin)
    _number("sent_at", digest.sent_at, low=0.0, high=_INF, low_open=False)
    _counter("base_sequence", digest.base_sequence)
    if digest.base_sequence >= max(1, digest.sequence):
        raise DigestError(
            "base_sequence",
            f"a delta applies to an earlier sequence, got {digest.base_sequence} "
            f"on sequence {digest.sequence}",
        )
    _validate_left(digest)
    if (problem := cat.records_problem(digest.catalog)) is not None:
        raise DigestError(*problem)
    _validate_header(digest)
    _validate_jobs(digest.jobs, digest.sent_at)


def _validate_header(digest: Digest) -> None:
    """The buffer's books and the pattern's origin."""
    books = digest.buffer
    for name in ("size", "used"):
        _number(
            f"buffer.{name}", getattr(books, name), low=0.0, high=MAX_BUFFER_BYTES, low_open=False
        )
    _number("buffer.drain_bandwidth", books.drain_bandwidth, low=0.0, high=MAX_RATE, low_open=False)
    pattern = digest.pattern
    if pattern.key:
        _identifier("pattern.key", pattern.key)
        _number("pattern.origin", pattern.origin, low=-_INF, high=digest.sent_at, low_open=False)


def _validate_left(digest: Digest) -> None:
    left = digest.left
    if not left:
        return
    if not digest.base_sequence:
        raise DigestError("left", "only a delta (base_sequence > 0) lists jobs that left")
    if len(left) > MAX_JOBS:
        raise DigestError("left", f"{len(left)} job ids, more than {MAX_JOBS}")
    if not _all_identifiers(left) or len(set(left)) != len(left):
        seen: set[object] = set()
        for i, job_id in enumerate(left):
            problem = identifier_problem(job_id)
            if problem:
                raise DigestError(f"left[{i}]", problem)
            if job_id in seen:
                raise DigestError(f"left[{i}]", f"duplicate job id {job_id!r}")
            seen.add(job_id)


def _validate_jobs(jobs: DigestJobs, sent_at: float) -> None:
    n = len(jobs.job_id)
    if n > MAX_JOBS:
        raise DigestError("jobs", f"{n} jobs, more than {MAX_JOBS}")
    for name in DigestJobs.__slots__:
        if len(getattr(jobs, name)) != n:
            raise DigestError(f"jobs.{name}", f"{len(getattr(jobs, name))} entries for {n} job ids")
    bad_text = [name for name in JOB_TEXT_FIELDS if not _all_identifiers(getattr(jobs, name))]
    with np.errstate(invalid="ignore"):
        checks = [(name, good(jobs, sent_at), message) for name, good, message in _CHECKS]
    first_bad = n
    for name in bad_text:
        column = getattr(jobs, name)
        first_bad = min(first_bad, next(i for i, v in enumerate(column) if identifier_problem(v)))
    for _, good_mask, _ in checks:
        if not good_mask.all():
            first_bad = min(first_bad, int(np.argmin(good_mask)))
    first_dup = n
    if len(set(jobs.job_id)) != n:
        seen: set[str] = set()
        for i, job_id in enumerate(jobs.job_id):
            if job_id in seen:
                first_dup = i
                break
            seen.add(job_id)
    if first_bad < n and first_bad <= first_dup:
        at = f"jobs[{first_bad}]"
        for name in JOB_TEXT_FIELDS:
            problem = identifier_problem(getattr(jobs, name)[first_bad])
            if problem:
                raise DigestError(f"{at}.{name}", problem)
        for name, good_mask, message in checks:
            if not good_mask[first_bad]:
                raise DigestError(f"{at}.{name}", message(getattr(jobs, name)[first_bad].item()))
    if first_dup < n:
        job_id = jobs.job_id[first_dup]
        raise DigestError(f"jobs[{first_dup}].job_id", f"duplicate job id {job_id!r}")


def _all_identifiers(column: tuple[str, ...]) -> bool:
    """Every entry 1..MAX_TEXT printable characters, in three C-level passes."""
    if not column:
        return True
    try:
        printable = "".join(column).isprintable()  # a non-string fails the join
    except TypeError:
        return False
    lengths = list(map(len, column))
    return printable and min(lengths) > 0 and max(lengths) <= MAX_TEXT


def _identifier(name: str, value: object) -> None:
    problem = identifier_problem(value)
    if problem:
        raise DigestError(name, problem)


def _counter(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise DigestError(name, f"must be an integer, got {type(value).__name__}")
    if not 0 <= value <= MAX_COUNTER:
        raise DigestError(name, f"must be in [0, 2^63 − 1], got {value}")


def _number(name: str, value: object, *, low: float, high: float, low_open: bool) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise DigestError(name, f"must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise DigestError(name, f"must be finite, got {value!r}")
    if value < low or (low_open and value == low):
        raise DigestError(name, f"must be {'>' if low_open else '>='} {low}, got {value!r}")
    if value > high:
        raise DigestError(name, f"must be <= {high}, got {value!r}")
