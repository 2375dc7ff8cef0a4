"""The global view several controller replicas share: digests, their merge, global targets.

Every λ each replica sends its :class:`Digest` to every peer (ThemisIO notes §4,
λ-delayed fairness) and feeds what it receives to :meth:`GlobalView.receive`.
From the live digests every replica computes, with the same deterministic code,
each job's global target (the active policy on one ``SystemView`` of the union
of the jobs, capacity Σ_r B_r) and its split over the replicas
(``controller/split.py``), and applies its own column. See ``docs/replicas.md``,
"The global view".

Pure: no networking and no clock; the caller passes ``now`` (a monotonic clock
of its own) to :meth:`GlobalView.receive` and :meth:`GlobalView.expire`.

Time inside a digest is relative: ``released_at`` and ``posted_at`` are offsets
(≤ 0, seconds) from the instant the sender built the digest, measured on the
sender's own clock. No clock synchronisation between hosts is needed; the merge
treats the digests of one exchange as taken at one common instant (the global
view's ``now`` is 0), which is off by at most the spread of the send instants
within an exchange plus transit time, normally well under λ.

Ordering: a replica's digests are ordered by ``(incarnation, epoch)``. ``epoch``
counts exchanges and restarts from 0 when the process restarts; ``incarnation``
is a start token that must grow with every restart of the same replica id
(e.g. the start time in ns from ``time.time_ns()``, or a counter persisted on
local disk). A higher incarnation replaces the old one whatever its epoch; a
lower one, for a replica id already known, is an impostor or a zombie of a
previous run and is rejected.
"""

from __future__ import annotations

import enum
import json
import logging
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from burstctl.controller.split import Edge, ReplicaId, split_entries
from burstctl.policies.base import Policy
from burstctl.policies.registry import PolicyRegistry
from burstctl.policies.view import JobId, JobView, SystemView, job_row

log = logging.getLogger(__name__)

# Bounds beyond which a value is taken for a bug or an attack, not a measurement.
MAX_RATE = 1e15  # bytes/s: 1 PB/s for one storage server or one job
MAX_NODES = 10_000_000
MAX_JOBS = 100_000
MAX_ID_LENGTH = 256
MAX_COUNTER = 2**63 - 1  # epochs, incarnations, versions: int64 on the wire


class DigestError(ValueError):
    """A digest that must not touch the global view; ``field`` names the bad field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(slots=True)
class JobDigest:
    """One job as one replica sees it at the digest's send instant.

    Treated as immutable but not frozen: a frozen dataclass sets each field
    through ``object.__setattr__``, which made building them ~5× slower, and a
    replica builds about 2J of them per exchange (bench/replica_sync.py).
    """

    job_id: JobId
    user: str
    group: str
    nodes: int  # p_i
    priority: float
    demand: float  # local demand on this replica, bytes/s; 0 without an open operation
    usage_bytes: float  # bytes moved on this replica since its previous digest
    progress: float  # P_i as this replica computed it, seconds (eq. 6)
    released_at: float  # τ_i − t_send ≤ 0, seconds, on the sender's clock
    posted_at: float | None = None  # R_i − t_send ≤ 0 of the open operation here; None: none
    remaining: float | None = None  # V_i of the open operation here, bytes; None: unknown
    open_op: bool = False  # the job has an open operation on this replica
    transferred: float = 0.0  # bytes this job moved on this replica in all (P_i's V part)


_FLOAT_FIELDS = (
    "priority",
    "demand",
    "usage_bytes",
    "progress",
    "released_at",
    "posted_at",
    "remaining",
    "transferred",
)
# JobColumns' fields by kind (in any order: every field has a column of its own name
# on the wire, peer.proto's JobColumns).
JOB_TEXT_FIELDS = ("job_id", "user", "group")
JOB_ARRAY_FIELDS = ("nodes", "open_op", *_FLOAT_FIELDS)


class JobColumns:
    """The jobs of one digest as columns: entry i of every column is job i.

    The form a digest takes on the wire (``peer.proto``, ``JobColumns``) and
    the form the merge reads: one numpy array per numeric field and one tuple
    per text field, so checking and merging the ~2J entries a replica receives
    per exchange costs a few array operations instead of a Python object per
    job. ``posted_at`` and ``remaining`` are NaN where a :class:`JobDigest` has
    None. Rows come back as :class:`JobDigest` (indexing, iteration), so the
    two forms are interchangeable; equality compares contents (NaN equals NaN).
    Read-only: the arrays are not writeable.
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

    def __init__(self, **columns: Any) -> None:
        """One keyword per :class:`JobDigest` field, each a sequence (or array);
        the lengths are checked by :func:`validate`, not here."""
        missing = {f for f in self.__slots__ if f not in columns}
        extra = set(columns) - set(self.__slots__)
        if missing or extra:
            raise TypeError(f"JobColumns: missing {sorted(missing)}, unknown {sorted(extra)}")
        for name in JOB_TEXT_FIELDS:
            object.__setattr__(self, name, tuple(columns[name]))
        arrays: dict[str, tuple[Any, type[np.generic]]] = {
            name: (columns[name], np.float64) for name in _FLOAT_FIELDS
        }
        arrays["nodes"] = (columns["nodes"], np.int64)
        arrays["open_op"] = (columns["open_op"], np.bool_)
        for name, (values, dtype) in arrays.items():
            array = np.array(values, dtype=dtype)  # a copy: the caller's list may change
            array.flags.writeable = False
            object.__setattr__(self, name, array)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("JobColumns is read-only")

    @classmethod
    def from_rows(cls, rows: Iterable[JobDigest]) -> JobColumns:
        """Columns of ``rows`` (valid ones: a bad type fails the conversion)."""
        rows = tuple(rows)
        nan = math.nan
        return cls(
            job_id=[r.job_id for r in rows],
            user=[r.user for r in rows],
            group=[r.group for r in rows],
            nodes=[r.nodes for r in rows],
            priority=[r.priority for r in rows],
            demand=[r.demand for r in rows],
            usage_bytes=[r.usage_bytes for r in rows],
            progress=[r.progress for r in rows],
            released_at=[r.released_at for r in rows],
            posted_at=[nan if r.posted_at is None else r.posted_at for r in rows],
            remaining=[nan if r.remaining is None else r.remaining for r in rows],
            open_op=[r.open_op for r in rows],
            transferred=[r.transferred for r in rows],
        )

    def __len__(self) -> int:
        return len(self.job_id)

    def __getitem__(self, i: int) -> JobDigest:
        posted, remaining = self.posted_at[i].item(), self.remaining[i].item()
        return JobDigest(
            self.job_id[i],
            self.user[i],
            self.group[i],
            self.nodes[i].item(),
            self.priority[i].item(),
            self.demand[i].item(),
            self.usage_bytes[i].item(),
            self.progress[i].item(),
            self.released_at[i].item(),
            None if posted != posted else posted,
            None if remaining != remaining else remaining,
            self.open_op[i].item(),
            self.transferred[i].item(),
        )

    def __iter__(self) -> Iterator[JobDigest]:
        return iter(self.rows())

    def rows(self) -> tuple[JobDigest, ...]:
        """Every job as a :class:`JobDigest` with plain Python values."""
        posted = [None if p != p else p for p in self.posted_at.tolist()]
        remaining = [None if r != r else r for r in self.remaining.tolist()]
        return tuple(
            JobDigest(*row)
            for row in zip(
                self.job_id,
                self.user,
                self.group,
                self.nodes.tolist(),
                self.priority.tolist(),
                self.demand.tolist(),
                self.usage_bytes.tolist(),
                self.progress.tolist(),
                self.released_at.tolist(),
                posted,
                remaining,
                self.open_op.tolist(),
                self.transferred.tolist(),
                strict=False,
            )
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, tuple):
            return self.rows() == other
        if not isinstance(other, JobColumns):
            return NotImplemented
        return (
            (self.job_id, self.user, self.group) == (other.job_id, other.user, other.group)
            and np.array_equal(self.nodes, other.nodes)
            and np.array_equal(self.open_op, other.open_op)
            and all(
                np.array_equal(getattr(self, f), getattr(other, f), equal_nan=True)
                for f in _FLOAT_FIELDS
            )
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        more = ", …" if len(self) > 5 else ""
        return f"JobColumns({len(self)} jobs: {', '.join(self.job_id[:5])}{more})"


@dataclass(frozen=True, slots=True)
class Digest:
    """What one replica tells its peers every λ.

    ``jobs``: a tuple of :class:`JobDigest` (built in process) or a
    :class:`JobColumns` (decoded from the wire); :meth:`columns` gives the
    columns either way.
    """

    replica_id: ReplicaId
    incarnation: int  # start token; grows with every restart (module docstring)
    epoch: int  # exchange counter within one incarnation
    capacity: float  # B_r, bytes/s
    node_bandwidth: float  # b, bytes/s per compute node (b_i = min(p_i · b, B), eq. (1))
    policy: str  # registry name or sharing spec
    policy_params: Mapping[str, Any] = field(default_factory=dict)  # read-only
    policy_version: int = 0  # a switch sets max version seen + 1
    jobs: tuple[JobDigest, ...] | JobColumns = ()
    _columns: JobColumns | None = field(default=None, init=False, repr=False, compare=False)

    def columns(self) -> JobColumns:
        """``jobs`` as columns (converted once, for a digest built from rows)."""
        if isinstance(self.jobs, JobColumns):
            return self.jobs
        if self._columns is None:
            object.__setattr__(self, "_columns", JobColumns.from_rows(self.jobs))
        assert self._columns is not None
        return self._columns


class Status(enum.Enum):
    ACCEPTED = "accepted"
    STALE = "stale"  # older than what is held: ignored
    DUPLICATE = "duplicate"  # the same digest again: ignored
    REJECTED = "rejected"  # invalid or not trusted: ignored, logged


@dataclass(frozen=True, slots=True)
class Outcome:
    status: Status
    reason: str = ""
    field: str | None = None  # for REJECTED by validation: the bad field

    @property
    def accepted(self) -> bool:
        return self.status is Status.ACCEPTED


@dataclass(frozen=True, slots=True)
class ActivePolicy:
    """The policy every replica enforces: highest ``(version, replica_id)`` wins."""

    name: str
    params: Mapping[str, Any]
    version: int
    replica_id: ReplicaId


# ---------------------------------------------------------------------------
# Validation


def validate(digest: Digest) -> None:
    """Raise :class:`DigestError` naming the first bad field of ``digest``."""
    if not isinstance(digest, Digest):
        raise DigestError("digest", f"expected a Digest, got {type(digest).__name__}")
    _identifier("replica_id", digest.replica_id)
    _counter("incarnation", digest.incarnation)
    _counter("epoch", digest.epoch)
    _number("capacity", digest.capacity, low=0.0, high=MAX_RATE)
    _number("node_bandwidth", digest.node_bandwidth, low=0.0, high=MAX_RATE, strict=True)
    _identifier("policy", digest.policy)
    if not isinstance(digest.policy_params, Mapping):
        raise DigestError("policy_params", "must be a mapping")
    for key in digest.policy_params:
        if not isinstance(key, str):
            raise DigestError("policy_params", f"keys must be strings, got {key!r}")
    try:
        json.dumps(dict(digest.policy_params), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise DigestError("policy_params", f"must be plain JSON values: {exc}") from None
    _counter("policy_version", digest.policy_version)
    if isinstance(digest.jobs, JobColumns):
        _validate_columns(digest.jobs)
        return
    if not isinstance(digest.jobs, tuple):
        raise DigestError(
            "jobs", f"must be a tuple or a JobColumns, got {type(digest.jobs).__name__}"
        )
    if len(digest.jobs) > MAX_JOBS:
        raise DigestError("jobs", f"{len(digest.jobs)} jobs, more than {MAX_JOBS}")
    seen: set[str] = set()
    for i, job in enumerate(digest.jobs):
        if not _valid_job(job):
            _validate_job(f"jobs[{i}]", job)
        if job.job_id in seen:
            raise DigestError(f"jobs[{i}].job_id", f"duplicate job id {job.job_id!r}")
        seen.add(job.job_id)


def _validate_columns(cols: JobColumns) -> None:
    """:func:`validate` for columns: the same checks, as array operations.

    Raises the very error the row-by-row check gives for the first bad job
    (its row is checked by :func:`_validate_job` to name the field)."""
    n = len(cols.job_id)
    if n > MAX_JOBS:
        raise DigestError("jobs", f"{n} jobs, more than {MAX_JOBS}")
    for name in JobColumns.__slots__:
        if len(getattr(cols, name)) != n:
            raise DigestError(f"jobs.{name}", f"{len(getattr(cols, name))} entries for {n} job ids")
    first_bad = n
    for name in ("job_id", "user", "group"):
        column = getattr(cols, name)
        if not _valid_ids(column):
            first_bad = min(first_bad, next(i for i, v in enumerate(column) if not _valid_id(v)))
    inf = math.inf
    with np.errstate(invalid="ignore"):  # NaN compares False: it fails every range below
        good = (cols.nodes >= 1) & (cols.nodes <= MAX_NODES)
        good &= (cols.priority > 0.0) & (cols.priority <= MAX_RATE)
        good &= (cols.demand >= 0.0) & (cols.demand <= MAX_RATE)
        for name in ("usage_bytes", "progress", "transferred"):
            column = getattr(cols, name)
            good &= (column >= 0.0) & (column < inf)
        good &= (cols.released_at > -inf) & (cols.released_at <= 0.0)
        posted, remaining = cols.posted_at, cols.remaining
        good &= np.isnan(posted) | ((posted > -inf) & (posted <= 0.0))
        good &= np.isnan(remaining) | ((remaining >= 0.0) & (remaining < inf))
        good &= cols.open_op | (cols.demand <= 0.0)
    if not good.all():
        first_bad = min(first_bad, int(np.argmin(good)))
    first_dup = n
    if len(set(cols.job_id)) != n:
        seen: set[str] = set()
        for i, job_id in enumerate(cols.job_id):
            if job_id in seen:
                first_dup = i
                break
            seen.add(job_id)
    if first_bad < n and first_bad <= first_dup:
        at = f"jobs[{first_bad}]"
        _validate_job(at, cols[first_bad])
        raise DigestError(at, "invalid job")  # the two checks disagree: a bug, still refused
    if first_dup < n:
        job_id = cols.job_id[first_dup]
        raise DigestError(f"jobs[{first_dup}].job_id", f"duplicate job id {job_id!r}")


def _valid_ids(column: tuple[str, ...]) -> bool:
    """Every entry 1..MAX_ID_LENGTH printable characters, in three C-level passes."""
    if not column:
        return True
    try:
        printable = "".join(column).isprintable()  # a non-string fails the join
    except TypeError:
        return False
    lengths = list(map(len, column))
    return printable and min(lengths) > 0 and max(lengths) <= MAX_ID_LENGTH


_NUMBER = (float, int)


def _valid_job(job: object) -> bool:
    """The checks of :func:`_validate_job` in one expression, without building field
    names: the common, valid case costs ~1 µs. NaN fails every comparison."""
    return (
        type(job) is JobDigest
        and _valid_id(job.job_id)
        and _valid_id(job.user)
        and _valid_id(job.group)
        and type(job.nodes) is int
        and 1 <= job.nodes <= MAX_NODES
        and type(job.priority) in _NUMBER
        and 0.0 < job.priority <= MAX_RATE
        and type(job.demand) in _NUMBER
        and 0.0 <= job.demand <= MAX_RATE
        and type(job.usage_bytes) in _NUMBER
        and 0.0 <= job.usage_bytes < math.inf
        and type(job.progress) in _NUMBER
        and 0.0 <= job.progress < math.inf
        and type(job.transferred) in _NUMBER
        and 0.0 <= job.transferred < math.inf
        and type(job.released_at) in _NUMBER
        and -math.inf < job.released_at <= 0.0
        and (
            job.posted_at is None
            or (type(job.posted_at) in _NUMBER and -math.inf < job.posted_at <= 0.0)
        )
        and (
            job.remaining is None
            or (type(job.remaining) in _NUMBER and 0.0 <= job.remaining < math.inf)
        )
        and type(job.open_op) is bool
        and (job.open_op or job.demand <= 0.0)
    )


def _valid_id(value: object) -> bool:
    return type(value) is str and 0 < len(value) <= MAX_ID_LENGTH and value.isprintable()


def _validate_job(at: str, job: JobDigest) -> None:
    """Raise :class:`DigestError` naming the first bad field of ``job``."""
    if not isinstance(job, JobDigest):
        raise DigestError(at, f"expected a JobDigest, got {type(job).__name__}")
    _identifier(f"{at}.job_id", job.job_id)
    _identifier(f"{at}.user", job.user)
    _identifier(f"{at}.group", job.group)
    if not _is_int(job.nodes) or not 1 <= job.nodes <= MAX_NODES:
        raise DigestError(
            f"{at}.nodes", f"must be an integer in [1, {MAX_NODES}], got {job.nodes!r}"
        )
    _number(f"{at}.priority", job.priority, low=0.0, high=MAX_RATE, strict=True)
    _number(f"{at}.demand", job.demand, low=0.0, high=MAX_RATE)
    _number(f"{at}.usage_bytes", job.usage_bytes, low=0.0, high=math.inf)
    _number(f"{at}.progress", job.progress, low=0.0, high=math.inf)
    _number(f"{at}.transferred", job.transferred, low=0.0, high=math.inf)
    _number(f"{at}.released_at", job.released_at, low=-math.inf, high=0.0)
    if job.posted_at is not None:
        _number(f"{at}.posted_at", job.posted_at, low=-math.inf, high=0.0)
    if job.remaining is not None:
        _number(f"{at}.remaining", job.remaining, low=0.0, high=math.inf)
    if not isinstance(job.open_op, bool):
        raise DigestError(f"{at}.open_op", f"must be a bool, got {job.open_op!r}")
    if job.demand > 0.0 and not job.open_op:
        raise DigestError(f"{at}.demand", "demand > 0 without an open operation")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _identifier(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise DigestError(name, f"must be a string, got {type(value).__name__}")
    if not value or len(value) > MAX_ID_LENGTH or not value.isprintable():
        raise DigestError(name, f"must be 1..{MAX_ID_LENGTH} printable characters")


def _counter(name: str, value: object) -> None:
    if not _is_int(value):
        raise DigestError(name, f"must be an integer, got {type(value).__name__}")
    assert isinstance(value, int)
    if not 0 <= value <= MAX_COUNTER:
        raise DigestError(name, f"must be in [0, 2^63 − 1], got {value}")


def _number(name: str, value: object, *, low: float, high: float, strict: bool = False) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise DigestError(name, f"must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise DigestError(name, f"must be finite, got {value!r}")
    if value < low or (strict and value == low):
        raise DigestError(name, f"must be {'>' if strict else '>='} {low}, got {value!r}")
    if value > high:
        raise DigestError(name, f"must be <= {high}, got {value!r}")


# ---------------------------------------------------------------------------
# The view


@dataclass(frozen=True, slots=True)
class PeerState:
    """One peer as this replica holds it (``GlobalView.peer_states``)."""

    replica_id: ReplicaId
    live: bool
    heard_age: float  # seconds since its last accepted digest, receiver's clock
    incarnation: int
    epoch: int
    capacity: float
    policy: str
    policy_version: int
    jobs: int  # jobs in its last digest


@dataclass(slots=True)
class _Peer:
    digest: Digest
    heard_at: float  # receiver's clock, last accepted digest
    live: bool = True


class GlobalView:
    """The latest digest of every peer, as one replica (``self_id``) holds them.

    ``peers``: the replica ids allowed to report (the configured peer list);
    None accepts any id. ``registry``: when given, a digest whose policy this
    replica cannot build is rejected at the door, so an unknown policy never wins.
    """

    def __init__(
        self,
        self_id: ReplicaId,
        *,
        peers: Iterable[ReplicaId] | None = None,
        registry: PolicyRegistry | None = None,
    ) -> None:
        _identifier("self_id", self_id)
        self.self_id = self_id
        self.peers = frozenset(peers) if peers is not None else None
        self._registry = registry
        # kept after expiry, so an old digest cannot bring a peer back from the dead
        self._held: dict[ReplicaId, _Peer] = {}
        self._policy: tuple[tuple[str, str], Policy] | None = None
        self._conflicts: set[tuple[JobId, str, ReplicaId]] = set()
        self._self_checked: Digest | None = None
        self._buildable: set[tuple[str, str]] = set()  # (policy, params JSON) known good

    # -- exchange ---------------------------------------------------------------
    def receive(self, digest: Digest, now: float, *, validated: bool = False) -> Outcome:
        """Merge one peer's digest received at ``now``; never raises for a bad digest.

        ``validated``: the caller already ran :func:`validate` on this very digest
        (``digest_from_proto`` does), so it is not checked twice.
        """
        try:
            if not validated:
                validate(digest)
            self._check_policy(digest)
        except DigestError as exc:
            rid = getattr(digest, "replica_id", "?")
            log.warning("rejected digest from replica %r: %s", rid, exc)
            return Outcome(Status.REJECTED, str(exc), exc.field)
        rid = digest.replica_id
        if rid == self.self_id:
            return self._reject(rid, "replica_id", "a peer claims this replica's own id")
        if self.peers is not None and rid not in self.peers:
            return self._reject(rid, "replica_id", "not a configured peer")
        held = self._held.get(rid)
        if held is not None:
            old = held.digest
            if digest.incarnation < old.incarnation:
                return self._reject(
                    rid,
                    "incarnation",
                    f"incarnation {digest.incarnation} is lower than the known "
                    f"{old.incarnation}: an impostor or a previous run",
                )
            if digest.incarnation == old.incarnation:
                if digest.epoch < old.epoch:
                    return Outcome(Status.STALE, f"epoch {digest.epoch} < held {old.epoch}")
                if digest.epoch == old.epoch:
                    if digest == old:
                        return Outcome(Status.DUPLICATE, f"epoch {digest.epoch} already held")
                    return self._reject(
                        rid, "epoch", f"a different digest for the held epoch {digest.epoch}"
                    )
            if not held.live:
                log.info("replica %r rejoins the global view", rid)
        self._held[rid] = _Peer(digest, now)
        return Outcome(Status.ACCEPTED)

    def _reject(self, rid: ReplicaId, field: str, reason: str) -> Outcome:
        log.warning("rejected digest from replica %r: %s: %s", rid, field, reason)
        return Outcome(Status.REJECTED, f"{field}: {reason}", field)

    def _check_policy(self, digest: Digest) -> None:
        if self._registry is None:
            return
        # Every digest carries the policy; building it (pydantic validation) once per
        # distinct (name, params) is enough. The key is valid JSON: validate() checked.
        key = (digest.policy, json.dumps(dict(digest.policy_params), sort_keys=True))
        if key in self._buildable:
            return
        try:
            self._registry.create(digest.policy, digest.policy_params)
        except (KeyError, ValueError, TypeError) as exc:
            raise DigestError("policy", f"cannot build {digest.policy!r}: {exc}") from None
        if len(self._buildable) >= 64:  # a bound, should peers cycle through many
            self._buildable.clear()
        self._buildable.add(key)

    def expire(self, now: float, interval: float, missed: int) -> list[ReplicaId]:
        """Drop peers silent for more than ``missed`` · ``interval``; the dropped ids.

        Their jobs leave the global view, so their shares fall back to what the
        survivors decide among themselves; a newer digest brings them back.
        """
        if not (math.isfinite(interval) and interval > 0.0):
            raise ValueError(f"interval must be finite and > 0, got {interval!r}")
        if not (_is_int(missed) and missed >= 1):
            raise ValueError(f"missed must be an integer >= 1, got {missed!r}")
        dropped = []
        for rid in sorted(self._held):
            peer = self._held[rid]
            if peer.live and now - peer.heard_at > missed * interval:
                peer.live = False
                dropped.append(rid)
                log.warning("replica %r missed %d exchanges; leaves the global view", rid, missed)
        return dropped

    def live_peers(self) -> list[ReplicaId]:
        return sorted(rid for rid, p in self._held.items() if p.live)

    def peer_states(self, now: float) -> list[PeerState]:
        """Every peer ever heard from, in id order: what the admin views report."""
        return [
            PeerState(
                replica_id=rid,
                live=p.live,
                heard_age=max(0.0, now - p.heard_at),
                incarnation=p.digest.incarnation,
                epoch=p.digest.epoch,
                capacity=p.digest.capacity,
                policy=p.digest.policy,
                policy_version=p.digest.policy_version,
                jobs=len(p.digest.jobs),
            )
            for rid, p in sorted(self._held.items())
        ]

    def highest_policy_version(self) -> int:
        """The highest policy version any peer has reported, live or not (0: none)."""
        return max((p.digest.policy_version for p in self._held.values()), default=0)

    def digests(self, self_digest: Digest | None = None) -> list[Digest]:
        """The live digests (plus ``self_digest``) in replica id order."""
        out = {rid: p.digest for rid, p in self._held.items() if p.live}
        if self_digest is not None:
            if self_digest.replica_id != self.self_id:
                raise ValueError(
                    f"self digest is from {self_digest.replica_id!r}, this view is {self.self_id!r}"
                )
            if self_digest is not self._self_checked:  # the same digest is asked for often
                validate(self_digest)
                self._self_checked = self_digest
            out[self.self_id] = self_digest
        return [out[rid] for rid in sorted(out)]

    # -- policy -------------------------------------------------------------------
    def active_policy(self, self_digest: Digest | None = None) -> ActivePolicy | None:
        """The highest ``(policy_version, replica_id)`` among the live digests and
        ``self_digest``; None when there are none. A replica whose own policy
        differs adopts this one (keeping its version) before its next digest."""
        best = max(
            self.digests(self_digest),
            key=lambda d: (d.policy_version, d.replica_id),
            default=None,
        )
        if best is None:
            return None
        return ActivePolicy(best.policy, best.policy_params, best.policy_version, best.replica_id)

    def _policy_for(self, active: ActivePolicy, registry: PolicyRegistry) -> Policy:
        # One instance per (name, params): a policy that learns online keeps its state.
        key = (active.name, json.dumps(dict(active.params), sort_keys=True))
        if self._policy is None or self._policy[0] != key:
            self._policy = (key, registry.create(active.name, active.params))
        return self._policy[1]

    # -- targets ------------------------------------------------------------------
    def system_view(self, self_digest: Digest) -> SystemView:
        """One view of the union of the live replicas' jobs with capacity Σ_r B_r
        (:meth:`_merge`, which says how each job is merged)."""
        return self._merge(self_digest).view

    def _merge(self, self_digest: Digest) -> _Merged:
        """One view of the union of the live replicas' jobs with capacity Σ_r B_r.

        Per job: metadata (user, group, nodes, priority) from the first replica
        in id order that has it (conflicts are logged once and ignored);
        demand Σ_r d_jr capped at b_i; τ_i and R_i the earliest; V_i the sum
        when every replica knows it; P_i = W_i^(done) + V_i^(transferred)/b_i
        (eq. 6) with the transferred bytes summed over the replicas and the work
        time the largest any replica saw (each replica reports P_i and its
        bytes, so W_i^(done) = P_i − V/b_i with that replica's own b_i). Only jobs
        with an open operation somewhere are in the view (S(t)); ``index`` is the
        job id order.

        Computed on the digests' columns: every entry of every digest is
        concatenated in replica id order, grouped by job (a stable sort keeps
        that order within a job) and reduced per group; sums add in replica id
        order, so every replica gets the same bits from the same digests.
        """
        digests = self.digests(self_digest)
        capacity = math.fsum(d.capacity for d in digests)
        b = min(d.node_bandwidth for d in digests)
        columns = [d.columns() for d in digests]
        sizes = [len(c) for c in columns]
        replicas = [d.replica_id for d in digests]
        capacities = np.array([d.capacity for d in digests], dtype=np.float64)
        ids = [job_id for c in columns for job_id in c.job_id]
        if not ids:
            view = SystemView(now=0.0, capacity=capacity, node_bandwidth=b, jobs={})
            none = np.zeros(0, dtype=np.intp)
            return _Merged(view, [], replicas, capacities, none, none, np.zeros(0))
        names = sorted(set(ids))  # the view's job order
        position = {job_id: k for k, job_id in enumerate(names)}
        job_of = np.fromiter(map(position.__getitem__, ids), dtype=np.intp, count=len(ids))
        order = np.argsort(job_of, kind="stable")  # entries grouped by job, replica id order
        starts = np.searchsorted(job_of[order], np.arange(len(names)))
        first = order[starts]  # per job: its entry on the lowest replica id

        def column(name: str) -> np.ndarray:
            return np.concatenate([getattr(c, name) for c in columns])

        nodes, open_op = column("nodes"), column("open_op")
        transferred, entry_demand = column("transferred"), column("demand")
        local_cap = np.minimum(  # job_cap on each entry's own replica
            nodes * np.repeat([d.node_bandwidth for d in digests], sizes),
            np.repeat([d.capacity for d in digests], sizes),
        )
        cap = np.minimum(nodes[first] * b, capacity)  # job_cap, eq. (1)
        demand = np.minimum(cap, np.add.reduceat(entry_demand[order], starts))
        posted_at = np.fmin.reduceat(column("posted_at")[order], starts)  # NaN: none open
        remaining = column("remaining")
        unknown = np.logical_or.reduceat((open_op & np.isnan(remaining))[order], starts)
        remaining = np.add.reduceat(np.where(open_op, remaining, 0.0)[order], starts)
        remaining[unknown] = math.nan
        released_at = np.minimum.reduceat(column("released_at")[order], starts)
        work = column("progress") - np.divide(
            transferred, local_cap, out=np.zeros_like(transferred), where=local_cap > 0
        )
        work = np.maximum(0.0, np.maximum.reduceat(work[order], starts))
        moved = np.add.reduceat(transferred[order], starts)
        progress = work + np.divide(moved, cap, out=np.zeros_like(moved), where=cap > 0)

        users = [u for c in columns for u in c.user]
        groups = [g for c in columns for g in c.group]
        priority = column("priority")
        replica_of = np.repeat(np.arange(len(digests), dtype=np.intp), sizes)
        if len(ids) > len(names):
            metadata = {"user": users, "group": groups, "nodes": nodes, "priority": priority}
            self._log_conflicts(ids, [replicas[r] for r in replica_of], first[job_of], metadata)
        in_view = np.flatnonzero(np.logical_or.reduceat(open_op[order], starts))
        at = first[in_view]
        rows: dict[JobId, JobView] = {}
        for (
            k,
            e,
            nodes_k,
            priority_k,
            cap_k,
            demand_k,
            posted_k,
            remaining_k,
            released_k,
            progress_k,
        ) in zip(
            in_view.tolist(),
            at.tolist(),
            nodes[at].tolist(),
            priority[at].tolist(),
            cap[in_view].tolist(),
            demand[in_view].tolist(),
            posted_at[in_view].tolist(),
            remaining[in_view].tolist(),
            released_at[in_view].tolist(),
            progress[in_view].tolist(),
            strict=True,
        ):
            job_id = names[k]
            # job_row: ~1,000 rows per exchange; every field, in JobView's order
            # (pinned by tests/unit/simulator/test_sim_engine.py).
            rows[job_id] = job_row(
                job_id,
                users[e],
                groups[e],
                nodes_k,
                priority_k,
                cap_k,
                demand_k,
                None if posted_k != posted_k else posted_k,
                0.0,  # volume: not exchanged (remaining is)
                None if remaining_k != remaining_k else remaining_k,
                0.0,  # moved
                released_k,
                progress_k,
                0.0,  # last_work
                0.0,  # mean_volume
                k,
            )
        view = SystemView(now=0.0, capacity=capacity, node_bandwidth=b, jobs=rows)
        return _Merged(view, names, replicas, capacities, job_of, replica_of, entry_demand)

    def _log_conflicts(
        self,
        ids: list[JobId],
        rids: list[ReplicaId],
        ref: np.ndarray,
        metadata: dict[str, Any],
    ) -> None:
        """Warn once per (job, field, replica) whose metadata differs from the first
        replica's (the one the view uses). Per entry (digests concatenated): its job id,
        replica id, ``ref`` the entry of its job on the lowest replica id, and the
        merge's columns of user, group (lists), nodes and priority (arrays)."""
        users, groups = metadata["user"], metadata["group"]
        nodes, priority = metadata["nodes"], metadata["priority"]
        differs = (nodes != nodes[ref]) | (priority != priority[ref])
        ref_list = ref.tolist()
        text = [users[e] != users[f] or groups[e] != groups[f] for e, f in enumerate(ref_list)]
        suspects = np.flatnonzero(differs | np.array(text, dtype=bool)).tolist()
        if not suspects:
            return
        fields = {"user": users, "group": groups, "nodes": nodes.tolist()}
        fields["priority"] = priority.tolist()
        for e in suspects:
            f = ref_list[e]
            for name, values in fields.items():
                key = (ids[e], name, rids[e])
                if values[e] != values[f] and key not in self._conflicts:
                    self._conflicts.add(key)
                    log.warning(
                        "job %r: replica %r reports %s=%r, using %r",
                        ids[e],
                        rids[e],
                        name,
                        values[e],
                        values[f],
                    )

    def global_targets(self, self_digest: Digest, registry: PolicyRegistry) -> dict[JobId, float]:
        """t_j: the active policy on :meth:`system_view`, in job id order."""
        return self._targets_of(self._merge(self_digest), self_digest, registry)

    def _targets_of(
        self, merged: _Merged, self_digest: Digest, registry: PolicyRegistry
    ) -> dict[JobId, float]:
        active = self.active_policy(self_digest)
        assert active is not None  # self_digest is always there
        rates = self._policy_for(active, registry).allocate(merged.view)
        return {j: float(rates.get(j, 0.0)) for j in sorted(merged.view.jobs)}

    def _split(self, self_digest: Digest, registry: PolicyRegistry) -> tuple[_Merged, np.ndarray]:
        """The merge and x for each of its entries (``split_entries``)."""
        merged = self._merge(self_digest)
        t = self._targets_of(merged, self_digest, registry)
        target = np.array([t.get(j, 0.0) for j in merged.names], dtype=np.float64)
        x = split_entries(
            merged.names,
            merged.replicas,
            target,
            merged.capacity,
            merged.job_of,
            merged.replica_of,
            merged.demand,
        )
        return merged, x

    def targets(self, self_digest: Digest, registry: PolicyRegistry) -> dict[Edge, float]:
        """x_jr for every job on every live replica it is present on, in (job, replica)
        order: the global targets split over the replicas (``controller/split.py``).

        Every replica holding the same digests gets bit-identical results,
        whatever order they arrived in: everything iterates in sorted ids.
        ``self_digest`` must be the digest this replica sent in the same
        exchange, not a fresher one, or its peers compute with different input.
        """
        merged, x = self._split(self_digest, registry)
        order = np.lexsort((merged.replica_of, merged.job_of))
        names, replicas = merged.names, merged.replicas
        edges = [
            (names[j], replicas[r])
            for j, r in zip(
                merged.job_of[order].tolist(), merged.replica_of[order].tolist(), strict=True
            )
        ]
        return dict(zip(edges, x[order].tolist(), strict=True))

    def column(self, self_digest: Digest, registry: PolicyRegistry) -> dict[JobId, float]:
        """This replica's column of :meth:`targets` (x_j,self for its own jobs), without
        building the other replicas' entries."""
        merged, x = self._split(self_digest, registry)
        own = merged.replica_of == merged.replicas.index(self.self_id)
        names = merged.names
        jobs = [names[j] for j in merged.job_of[own].tolist()]
        return dict(zip(jobs, x[own].tolist(), strict=True))


@dataclass(frozen=True, slots=True)
class _Merged:
    """The global view and the digests' entries it merged, as split_entries takes them."""

    view: SystemView
    names: list[JobId]  # every job id of every digest, sorted
    replicas: list[ReplicaId]  # the digests' replica ids, sorted
    capacity: np.ndarray  # B_r by replica index
    job_of: np.ndarray  # per entry (digests concatenated in replica order): index in names
    replica_of: np.ndarray  # per entry: index in replicas
    demand: np.ndarray  # per entry: the job's local demand there
