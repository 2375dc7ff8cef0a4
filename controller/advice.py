"""Live placement advice: the adapter from a replica to ``policies/placement``.

The mapping of [DIST-IO] onto burstctl (its §IV and the notes' runtime mapping): an I/O
resource is one live replica (this one and the peers the membership holds live), N their
number; an application is a job, Q_j its node count; Q^cpu the config field
``placement_compute_nodes``, else the sum of the advised jobs' nodes. What each job is known
by comes from the profile store (controller/profiles.py) under its application key, or from
the job description of ``POST /v1/placement``; ``information.advise`` chooses the allocator
and information level each job's data allow and falls back where they do not.

Replicas are ordered by capacity (highest first), then id: the model treats resources as
identical, so capacity only breaks ties of the placement towards the faster replicas.

This module computes; it holds no state and does no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from burstctl.policies.placement.model import App

# The names the REST API accepts (those of policies/placement's registries; a unit test checks).

# The advice is deterministic for one state: the same seed for every request.
ADVICE_SEED = 19


@dataclass(frozen=True, slots=True)
class Resource:
    """One live replica as an I/O resource."""

    replica_id: str
    address: str  # its gRPC address, where a client opens a session
    capacity: float


@dataclass(frozen=True, slots=True)
class JobInput:
    """What the advice knows of one job."""

    job_id: str
    nodes: int
    volume_per_phase: float | None = None  # bytes
    compute_seconds: float | None = None
    phases: int | None = None
    bandwidth: Mapping[int, float] = field(default_factory=dict)  # b_j(n), bytes/s


@dataclass(frozen=True, slots=True)
class JobAdvice:
    job_id: str
    replicas: list[str]
    addresses: list[str]
    count: int
    allocator_used: str
    level: int
    fallback: str | None


@dataclass(frozen=True, slots=True)
class Advice:
    replicas: list[str]
    io_load: float | None
    allocator: str | None
    placement: str | None
    jobs: list[JobAdvice]
    placement_used: str | None = None
    placement_note: str = ""


def order(resources: Sequence[Resource]) -> list[Resource]:
    return sorted(resources, key=lambda r: (-r.capacity, r.replica_id))


def q_cpu(jobs: Sequence[JobInput], configured: int | None) -> int:
    return configured if configured is not None else max(1, sum(j.nodes for j in jobs))


def to_app(job: JobInput) -> App:
    """The model's application for one job: only what is known is given (the information
    level follows from it)."""
    from burstctl.policies.placement.model import App, Profile

    phases = job.phases or 1
    v_io = job.volume_per_phase * phases if job.volume_per_phase else None
    t_cpu = job.compute_seconds * phases if job.compute_seconds is not None else None
    profile = Profile.from_points(dict(job.bandwidth)) if job.bandwidth else None
    return App(
        app_id=job.job_id,
        q=job.nodes,
        t_cpu=t_cpu,
        v_io=v_io,
        phases=phases,
        profile=profile,
    )


def _advise(
    jobs: Sequence[JobInput],
    n: int,
    qcpu: int,
    allocator: str | None,
    placement: str | None,
) -> Any:
    from burstctl.policies.placement import information

    return information.advise(
        [to_app(j) for j in jobs],
        n,
        qcpu,
        allocator=allocator,
        placement=placement,
        rng=random.Random(ADVICE_SEED),
    )


def advise_all(
    resources: Sequence[Resource],
    jobs: Sequence[JobInput],
    *,
    compute_nodes: int | None,
    allocator: str | None = None,
    placement: str | None = None,
) -> Advice:
    """The advice for every job over the live replicas (``GET /v1/placement``)."""
    ordered = order(resources)
    ids = [r.replica_id for r in ordered]
    if not jobs or not ordered:
        return Advice(ids, 0.0 if ordered else None, allocator, placement, [])
    result = _advise(jobs, len(ordered), q_cpu(jobs, compute_nodes), allocator, placement)
    out = [_job_advice(result, i, j, ordered) for i, j in enumerate(jobs)]
    return Advice(
        ids,
        float(result.io_load),
        allocator,
        placement,
        out,
        result.placement_used,
        result.placement_note,
    )


def advise_one(
    resources: Sequence[Resource],
    new: JobInput,
    others: Sequence[JobInput],
    present: Mapping[str, Sequence[str]],
    *,
    compute_nodes: int | None,
    allocator: str | None = None,
    placement: str | None = None,
) -> Advice:
    """The advice for ``new`` given the others (``POST /v1/placement``).

    The others keep their placement (the notes' §4.5: data on a burst buffer does not move):
    where they have sessions (``present``: job id -> replica ids), else where the advice over
    them alone puts them. Only ``new`` is placed; its count comes from the allocator run over
    all of them together, and its replicas are the ones holding the fewest jobs (the balanced
    count of Greedy-Non-Clairvoyant, applied to one more job), capacity breaking ties.
    """
    ordered = order(resources)
    ids = [r.replica_id for r in ordered]
    if not ordered:
        return Advice([], None, allocator, placement, [])
    others = [j for j in others if j.job_id != new.job_id]
    everyone = [*others, new]
    qcpu = q_cpu(everyone, compute_nodes)
    result = _advise(everyone, len(ordered), qcpu, allocator, placement)
    mine = _job_advice(result, len(others), new, ordered)
    held = {rid: 0 for rid in ids}
    if others:
        before = _advise(others, len(ordered), qcpu, allocator, placement)
        for i, job in enumerate(others):
            where = present.get(job.job_id) or _job_advice(before, i, job, ordered).replicas
            for rid in where:
                if rid in held:
                    held[rid] += 1
    rank = {rid: i for i, rid in enumerate(ids)}
    chosen = sorted(ids, key=lambda rid: (held[rid], rank[rid]))[: mine.count]
    chosen.sort(key=rank.__getitem__)
    address = {r.replica_id: r.address for r in ordered}
    advised = JobAdvice(
        new.job_id,
        chosen,
        [address[rid] for rid in chosen],
        mine.count,
        mine.allocator_used,
        mine.level,
        mine.fallback,
    )
    return Advice(ids, float(result.io_load), allocator, placement, [advised], "incremental")


def _job_advice(result: Any, i: int, job: JobInput, ordered: Sequence[Resource]) -> JobAdvice:
    """Job ``i`` of an ``information.Advice``, resources as replicas."""
    count = int(result.allocation[i])
    indices = sorted(int(k) for k in result.placement[i])
    return JobAdvice(
        job.job_id,
        [ordered[k].replica_id for k in indices],
        [ordered[k].address for k in indices],
        count,
        str(result.per_app_allocator[i]),
        to_app(job).level,
        result.fallbacks.get(job.job_id),
    )
