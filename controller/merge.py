"""The global view of several replicas and each replica's share of it, as pure functions.

From the live digests every replica computes, with the same deterministic code,
one ``SystemView`` of the union of the jobs with capacity Σ_r B_r
(:func:`merge`), each job's global target (the active policy's decision on that
view, ``policies.decision.decide``), the split of the targets over the replicas
the jobs are present on (:func:`split_targets`, ``controller/split.py``) and its
own share (:meth:`Merged.share`). See ``docs/replicas.md``, "The global view".

The merge treats the digests of one exchange as taken at one common instant
(the view's ``now`` is 0; a digest's times are read as offsets from its own
``sent_at``, on the sender's clock), which is off by at most
the spread of the send instants within an exchange plus transit time, normally
well under λ. Everything iterates in sorted ids, so every replica holding the
same digests gets bit-identical results, whatever order they arrived in.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress

import numpy as np

from burstctl.controller.digest import Digest, ReplicaId
from burstctl.controller.split import Edge, SplitProblem, split
from burstctl.policies.view import BufferView, JobId, JobView, Periodic, SystemView


@dataclass(frozen=True, slots=True)
class Conflict:
    """A replica reports metadata of a job that differs from the lowest replica id's."""

    job_id: JobId
    field: str
    replica_id: ReplicaId
    value: object
    used: object


@dataclass(frozen=True, slots=True)
class Layout:
    """What a merge computes from the digests' job ids, users and groups alone: every
    entry's job, the entries grouped by job, and whose user or group differs from its
    job's first entry. ``merge`` takes it again for digests whose ``job_id``, ``user``
    and ``group`` columns are the very same objects (a delta that changes no job's set
    or text keeps them: ``controller/delta.py``), and skips that work."""

    keys: tuple[tuple[str, ...], ...]  # per digest: its job_id, user and group columns
    ids: list[JobId]  # per entry
    users: list[str]
    groups: list[str]
    names: list[JobId]
    job_of: np.ndarray
    order: np.ndarray
    starts: np.ndarray
    text_differs: np.ndarray  # per entry: user or group differs from its job's first entry

    @staticmethod
    def keys_of(digests: Sequence[Digest]) -> tuple[tuple[str, ...], ...]:
        return tuple(t for d in digests for t in (d.jobs.job_id, d.jobs.user, d.jobs.group))

    def fits(self, keys: tuple[tuple[str, ...], ...]) -> bool:
        return len(keys) == len(self.keys) and all(
            a is b for a, b in zip(keys, self.keys, strict=True)
        )

    @classmethod
    def of(cls, digests: Sequence[Digest], keys: tuple[tuple[str, ...], ...]) -> Layout:
        columns = [d.jobs for d in digests]
        ids = [job_id for c in columns for job_id in c.job_id]
        users = [u for c in columns for u in c.user]
        groups = [g for c in columns for g in c.group]
        names = sorted(set(ids))  # the view's job order
        position = {job_id: k for k, job_id in enumerate(names)}
        job_of = np.fromiter(map(position.__getitem__, ids), dtype=np.intp, count=len(ids))
        order = np.argsort(job_of, kind="stable")  # entries grouped by job, replica id order
        starts = np.searchsorted(job_of[order], np.arange(len(names)))
        differs = np.zeros(len(ids), dtype=bool)
        if len(ids) > len(names):  # a job on several replicas: its entries may disagree
            first = order[starts][job_of].tolist()  # per entry: its job's first entry
            text = [users[e] != users[f] or groups[e] != groups[f] for e, f in enumerate(first)]
            differs = np.array(text, dtype=bool)
        return cls(keys, ids, users, groups, names, job_of, order, starts, differs)


@dataclass(frozen=True, slots=True)
class Merged:
    """The global view and the digests' entries it merged (one entry per job present
    on a replica, digests concatenated in replica id order)."""

    view: SystemView
    names: list[JobId]  # every job id of every digest, sorted
    replicas: list[ReplicaId]  # the digests' replica ids, sorted
    capacity: np.ndarray  # B_r by replica index
    job_of: np.ndarray  # per entry: index in names
    replica_of: np.ndarray  # per entry: index in replicas
    demand: np.ndarray  # per entry: the job's local demand there
    conflicts: tuple[Conflict, ...] = ()
    # by index in names: b_j = min(p_j·b, Σ B_r), the most a job gets over all replicas
    cap: np.ndarray | None = None
    layout: Layout | None = None  # for the next merge (``merge``'s ``layout``)

    def share(self, x: np.ndarray, replica_id: ReplicaId) -> dict[JobId, float]:
        """``replica_id``'s rate for each of its jobs, from the split ``x`` per entry."""
        own = self.replica_of == self.replicas.index(replica_id)
        names = self.names
        jobs = [names[j] for j in self.job_of[own].tolist()]
        return dict(zip(jobs, x[own].tolist(), strict=True))

    def by_edge(self, x: np.ndarray) -> dict[Edge, float]:
        """x_jr of every (job, replica) entry, in (job, replica) order."""
        order = np.lexsort((self.replica_of, self.job_of))
        names, replicas = self.names, self.replicas
        edges = [
            (names[j], replicas[r])
            for j, r in zip(
                self.job_of[order].tolist(), self.replica_of[order].tolist(), strict=True
            )
        ]
        return dict(zip(edges, x[order].tolist(), strict=True))


def merge(digests: Sequence[Digest], layout: Layout | None = None) -> Merged:
    """One view of the union of ``digests``' jobs (sorted by replica id) with
    capacity Σ_r B_r.

    Per job: metadata (user, group, nodes, priority) from the first replica in
    id order that has it (the others' differences are listed as conflicts);
    demand Σ_r d_jr capped at b_i; τ_i and R_i the earliest; V_i the sum when
    every replica knows it; P_i = W_i^(done) + V_i^(transferred)/b_i (eq. 6) with
    the transferred bytes summed over the replicas and the work time the largest
    any replica saw (each replica reports P_i and its bytes, so W_i^(done) =
    P_i − V/b_i with that replica's own b_i). Only jobs with an open operation
    somewhere are in the view (S(t)); ``index`` is the job id order.

    Computed on the digests' columns: every entry of every digest is
    concatenated in replica id order, grouped by job (a stable sort keeps that
    order within a job) and reduced per group; sums add in replica id order.
    ``layout``: the previous merge's (``Merged.layout``), used again when it fits.
    """
    capacity = math.fsum(d.capacity for d in digests)
    b = min(d.node_bandwidth for d in digests)
    columns = [d.jobs for d in digests]
    sizes = [len(c) for c in columns]
    replicas = [d.replica_id for d in digests]
    capacities = np.array([d.capacity for d in digests], dtype=np.float64)
    periodic, buffer = _periodic(digests), _buffer(digests)
    # A policy that draws (dpsac) draws anew at every exchange, the same on every replica.
    seed = zlib.crc32(repr([(d.replica_id, d.incarnation, d.sequence) for d in digests]).encode())
    extra = {"periodic": periodic, "buffer": buffer, "seed": seed, "observed": False}
    if not sum(sizes):
        view = SystemView(0.0, capacity, b, {}, **extra)
        none = np.zeros(0, dtype=np.intp)
        return Merged(view, [], replicas, capacities, none, none, np.zeros(0), cap=np.zeros(0))
    keys = Layout.keys_of(digests)
    if layout is None or not layout.fits(keys):
        layout = Layout.of(digests, keys)
    ids, users, groups, names = layout.ids, layout.users, layout.groups, layout.names
    job_of, order, starts = layout.job_of, layout.order, layout.starts
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
    sent_at = np.repeat([d.sent_at for d in digests], sizes)  # times → offsets (≤ 0)
    posted_at = np.fmin.reduceat((column("posted_at") - sent_at)[order], starts)  # NaN: none
    remaining = column("remaining")
    unknown = np.logical_or.reduceat((open_op & np.isnan(remaining))[order], starts)
    remaining = np.add.reduceat(np.where(open_op, remaining, 0.0)[order], starts)
    remaining[unknown] = math.nan
    released_at = np.minimum.reduceat((column("released_at") - sent_at)[order], starts)
    work = column("progress") - np.divide(
        transferred, local_cap, out=np.zeros_like(transferred), where=local_cap > 0
    )
    work = np.maximum(0.0, np.maximum.reduceat(work[order], starts))
    moved = np.add.reduceat(transferred[order], starts)
    progress = work + np.divide(moved, cap, out=np.zeros_like(moved), where=cap > 0)

    priority = column("priority")
    replica_of = np.repeat(np.arange(len(digests), dtype=np.intp), sizes)
    conflicts: tuple[Conflict, ...] = ()
    if len(ids) > len(names):
        metadata = {"user": users, "group": groups, "nodes": nodes, "priority": priority}
        differs = layout.text_differs | (nodes != nodes[first[job_of]])
        differs |= priority != priority[first[job_of]]
        conflicts = _conflicts(
            ids, [replicas[r] for r in replica_of], first[job_of], metadata, differs
        )
    in_view = np.flatnonzero(np.logical_or.reduceat(open_op[order], starts))
    at = first[in_view]
    rows: dict[JobId, JobView] = {}
    for k, e, nodes_k, priority_k, cap_k, demand_k, posted_k, remaining_k, released_k, p_k in zip(
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
        rows[job_id] = JobView(
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
            p_k,  # progress
            0.0,  # last_work
            0.0,  # mean_volume
            k,  # index
        )
    view = SystemView(0.0, capacity, b, rows, **extra)
    return Merged(
        view, names, replicas, capacities, job_of, replica_of, entry_demand, conflicts, cap, layout
    )


def _periodic(digests: Sequence[Digest]) -> dict[JobId, Periodic]:
    """Every job's period over the replicas (digests in replica id order): a declared
    period (nodes, w and the job's vol_io) from the lowest replica id that has one; else a
    learned one once every replica the job is on learned it (one replica's bytes are part of
    an iteration's): its w from the lowest replica id, its vol_io the sum of the bytes per
    iteration each replica learned (each sees its own part of the job's I/O)."""
    declared: dict[JobId, Periodic] = {}
    learned: dict[JobId, Periodic] = {}
    unlearned: set[JobId] = set()  # on a replica that has no period for it
    for digest in digests:
        jobs = digest.jobs
        if np.isnan(jobs.period_w).any():
            unlearned.update(compress(jobs.job_id, np.isnan(jobs.period_w).tolist()))
        for i in np.flatnonzero(~np.isnan(jobs.period_w)).tolist():
            job_id = jobs.job_id[i]
            nodes, w, vol = int(jobs.nodes[i]), float(jobs.period_w[i]), float(jobs.period_vol[i])
            if not jobs.period_learned[i]:
                declared.setdefault(job_id, Periodic(nodes, w, vol))
            elif job_id in learned:
                first = learned[job_id]
                learned[job_id] = Periodic(first.nodes, first.w, first.vol_io + vol, learned=True)
            else:
                learned[job_id] = Periodic(nodes, w, vol, learned=True)
    return {**{j: p for j, p in learned.items() if j not in unlearned}, **declared}


def _buffer(digests: Sequence[Digest]) -> BufferView | None:
    """The replicas' burst buffers as one (None when none has one): sizes, fills and drain
    bandwidths summed, and each job's resident and pending bytes summed over the replicas."""
    books = [d for d in digests if d.buffer.size > 0.0]
    if not books:
        return None
    resident: dict[JobId, float] = {}
    pending: dict[JobId, float] = {}
    for digest in books:
        jobs = digest.jobs
        for held, column in ((resident, jobs.resident), (pending, jobs.pending)):
            for i in np.flatnonzero(column > 0.0).tolist():
                job_id = jobs.job_id[i]
                held[job_id] = held.get(job_id, 0.0) + float(column[i])
    return BufferView(
        size=math.fsum(d.buffer.size for d in books),
        used=math.fsum(d.buffer.used for d in books),
        drain_bandwidth=math.fsum(d.buffer.drain_bandwidth for d in books),
        resident=resident,
        pending=pending,
    )


# The digest columns each field of the merged view is computed from; released_at and
# posted_at are also read against each digest's sent_at, so they move with time.
_SOURCES: dict[str, frozenset[str]] = {
    "user": frozenset({"user"}),
    "group": frozenset({"group"}),
    "nodes": frozenset({"nodes"}),
    "priority": frozenset({"priority"}),
    "cap": frozenset({"nodes"}),
    "demand": frozenset({"demand", "nodes"}),
    "remaining": frozenset({"remaining", "open_op"}),
    "progress": frozenset({"progress", "transferred", "nodes"}),
}
# What the view's jobs and order, the split and the ceilings read whatever the policy.
_ALWAYS = frozenset({"job_id", "open_op", "nodes", "demand"})


def columns_read(fields: frozenset[str] | None) -> frozenset[str] | None:
    """The digest columns that a policy reading the view's ``fields`` (``Policy.reads``)
    and the split depend on, through :func:`merge`; None when one of them moves with
    time (released_at, posted_at), is unknown, or ``fields`` is None: then equal
    columns do not mean equal targets."""
    if fields is None or not fields <= _SOURCES.keys():
        return None
    return _ALWAYS.union(*(_SOURCES[f] for f in fields))


def _conflicts(
    ids: list[JobId],
    rids: list[ReplicaId],
    ref: np.ndarray,
    metadata: dict[str, object],
    differs: np.ndarray,
) -> tuple[Conflict, ...]:
    """Per entry (digests concatenated): its job id, replica id, ``ref`` the entry of its
    job on the lowest replica id, the merge's columns of user, group (lists), nodes and
    priority (arrays), and whether any of them differs from ``ref``'s: the conflicts."""
    users, groups = metadata["user"], metadata["group"]
    nodes, priority = metadata["nodes"], metadata["priority"]
    assert isinstance(users, list) and isinstance(groups, list)
    assert isinstance(nodes, np.ndarray) and isinstance(priority, np.ndarray)
    ref_list = ref.tolist()
    suspects = np.flatnonzero(differs).tolist()
    fields = {"user": users, "group": groups, "nodes": nodes.tolist()}
    fields["priority"] = priority.tolist()
    out = []
    for e in suspects:
        f = ref_list[e]
        for name, values in fields.items():
            if values[e] != values[f]:
                out.append(Conflict(ids[e], name, rids[e], values[e], values[f]))
    return tuple(out)


def split_targets(
    merged: Merged,
    targets: Mapping[JobId, float],
    fixed: Mapping[ReplicaId, Mapping[JobId, float]] | None = None,
) -> np.ndarray:
    """x for every entry of ``merged``: the global ``targets`` split over the replicas
    each job is present on (``controller/split.py``), no job above its global cap b_j
    in all (surplus included).

    ``fixed``: replicas whose column is not split but taken as given, job id →
    rate (a job not listed: 0), e.g. a dead replica whose sessions may still hold
    their last rates (``PeerSync``). Those rates count against each job's target
    and cap; the other replicas split what is left of them.
    """
    target = np.array([targets.get(j, 0.0) for j in merged.names], dtype=np.float64)
    names, replicas = merged.names, merged.replicas
    cap = merged.cap if merged.cap is not None else np.full(len(names), np.inf)
    job_of, replica_of = merged.job_of, merged.replica_of
    if not fixed:
        problem = SplitProblem(
            names, replicas, target, merged.capacity, job_of, replica_of, merged.demand, cap
        )
        return split(problem)
    held = np.array([r in fixed for r in replicas], dtype=bool)
    frozen = held[replica_of]
    given = np.array(
        [
            max(0.0, float(fixed[replicas[r]].get(names[j], 0.0))) if f else 0.0
            for j, r, f in zip(job_of.tolist(), replica_of.tolist(), frozen.tolist(), strict=True)
        ],
        dtype=np.float64,
    )
    used = np.bincount(job_of, weights=given, minlength=len(names))
    free = ~frozen
    problem = SplitProblem(
        names,
        replicas,
        np.maximum(target - used, 0.0),
        np.where(held, 0.0, merged.capacity),
        job_of[free],
        replica_of[free],
        merged.demand[free],
        np.maximum(cap - used, 0.0),
    )
    x = given.copy()
    x[free] = split(problem)
    return x


def ceilings(merged: Merged, x: np.ndarray) -> np.ndarray:
    """Per entry: the most its replica may give the job until the next exchange.

    x_jr plus a part of the job's global headroom b_j − Σ_r x_jr, shared over the
    replicas the job is present on pro rata to their capacity B_r (equally when
    they all have none). Every replica computes the same matrix, so the
    ceilings of one job sum to b_j at most: a replica that tops a job up with
    capacity freed since the exchange (``policies.decision.blend``) cannot take
    it past its global cap together with the others.
    """
    if merged.cap is None or not len(x):
        return np.asarray(x, dtype=np.float64).copy()
    jobs_n = len(merged.names)
    job_of, replica_of = merged.job_of, merged.replica_of
    total = np.bincount(job_of, weights=x, minlength=jobs_n)
    headroom = np.maximum(merged.cap - total, 0.0)
    weight = merged.capacity[replica_of]
    weights = np.bincount(job_of, weights=weight, minlength=jobs_n)
    count = np.bincount(job_of, minlength=jobs_n).astype(np.float64)
    part = np.where(
        weights[job_of] > 0.0,
        weight / np.where(weights[job_of] > 0.0, weights[job_of], 1.0),
        1.0 / count[job_of],
    )
    return np.asarray(x + headroom[job_of] * part, dtype=np.float64)
