"""The adapter from a replica's jobs and live replicas to ``advise`` (controller/advice.py)."""

from __future__ import annotations

from burstctl.common.limits import ALLOCATOR_NAMES, PLACEMENT_NAMES
from burstctl.controller.advice import (
    JobInput,
    Resource,
    advise_all,
    advise_one,
)
from burstctl.policies.placement.allocators import ALLOCATORS
from burstctl.policies.placement.placements import PLACEMENTS

RES = [Resource("r1", "h1:1", 1.0), Resource("r2", "h2:1", 3.0), Resource("r3", "h3:1", 2.0)]


def test_the_rest_names_are_the_registries() -> None:
    assert set(ALLOCATOR_NAMES) == set(ALLOCATORS)
    assert set(PLACEMENT_NAMES) == set(PLACEMENTS)


def test_replicas_are_resources_capacity_first_and_jobs_map_to_their_addresses() -> None:
    jobs = [JobInput("A", 8), JobInput("B", 8)]
    out = advise_all(RES, jobs, compute_nodes=16, allocator="static")
    assert out.replicas == ["r2", "r3", "r1"]
    # Static: round(8·3/16) = 2 (half up) each; level 0: no fallback for static
    for j in out.jobs:
        assert j.count == 2 and j.level == 0 and j.fallback is None
        assert [{"r1": "h1:1", "r2": "h2:1", "r3": "h3:1"}[r] for r in j.replicas] == j.addresses


def test_a_level_0_job_falls_back_from_an_allocator_that_needs_data() -> None:
    jobs = [
        JobInput("A", 4),
        JobInput("B", 4, volume_per_phase=1e9, compute_seconds=10.0, phases=2,
                 bandwidth={1: 1e8, 2: 2e8}),
    ]  # fmt: skip
    out = advise_all(RES, jobs, compute_nodes=None, allocator="tcpu-allocator")
    a, b = out.jobs
    assert a.level == 0 and a.fallback is not None and a.allocator_used == "static"
    assert b.level == 2 and b.fallback is None and b.allocator_used == "tcpu-allocator"


def test_a_new_job_goes_where_the_fewest_jobs_are_and_the_others_stay() -> None:
    others = [JobInput("A", 8), JobInput("B", 8)]
    # A runs on r2 and r3 (its sessions); B's place comes from the advice over the others
    new = JobInput("N", 4)
    out = advise_one(
        RES, new, others, {"A": ["r2", "r3"], "B": ["r2"]}, compute_nodes=24, allocator="static"
    )
    (mine,) = out.jobs
    assert mine.count == 1  # round(4·3/24) = 1 (0.5 rounds half up)
    assert mine.replicas == ["r1"]  # r1 holds no job; r2 two, r3 one
    assert out.placement_used == "incremental"
    # The job itself among the others (registered already) is not counted twice.
    again = advise_one(
        RES, new, [*others, new], {"A": ["r2", "r3"], "B": ["r2"]}, compute_nodes=24,
        allocator="static",
    )  # fmt: skip
    assert again.jobs == out.jobs


def test_no_live_replica_and_no_job() -> None:
    assert advise_all([], [JobInput("A", 1)], compute_nodes=None).io_load is None
    empty = advise_all(RES, [], compute_nodes=None)
    assert empty.jobs == [] and empty.io_load == 0.0
