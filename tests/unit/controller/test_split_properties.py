"""Properties of the split with global job caps, drawn by hypothesis (issue 15, finding 6).

The invariant (docs/replicas.md, "Caps across replicas"): for every instance of jobs
with targets t_j and caps b_j ≥ t_j, replicas with capacities B_r and local demands
d_jr on a random bipartite placement, ``split`` returns x with

- 0 ≤ x_jr ≤ d_jr (no negative rate, none above local demand);
- Σ_j x_jr ≤ B_r on every replica;
- Σ_r x_jr ≤ b_j for every job, surplus included;
- the targets met as before: Σ_j min(Σ_r x_jr, t_j) is the maximum flow of the
  target network (source →t_j→ job →d_jr→ replica →B_r→ sink);
- work conserving where demand allows: Σ x is the maximum flow of the cap network
  (the same with b_j for t_j), which no split within the caps, the demands and the
  capacities can beat;
- and when no cap binds, exactly the split without caps.

The same through ``merge``: random digests, every registered sharing of the global
view, each job's sum over the replicas at most its b_j = min(p_j·b, Σ B_r), also
with a replica's column held fixed (a dead replica's last rates, ``PeerSync``).
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
from digests import REGISTRY, digest, job
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from burstctl.controller.merge import ceilings, merge, split_targets
from burstctl.controller.split import SplitProblem, split
from burstctl.policies.decision import decide

# Sized by the hypothesis profile (tests/conftest.py): `ci` for make test, `thorough` for
# make test-all.
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
RATE = st.one_of(
    st.integers(0, 40).map(float),  # integers: ties
    st.floats(0.0, 40.0, allow_nan=False, allow_infinity=False),
)


@st.composite
def instances(draw: st.DrawFn) -> SplitProblem:
    replicas_n = draw(st.integers(1, 5))
    jobs_n = draw(st.integers(1, 8))
    capacity = np.array([draw(RATE) for _ in range(replicas_n)])
    cap = np.array([draw(RATE) for _ in range(jobs_n)])
    # a target at most the cap (decide enforces it), often exactly the cap
    target = np.array([draw(st.sampled_from([1.0, 0.5, 0.0, draw(st.floats(0, 1))])) for _ in cap])
    target = target * cap
    job_of, replica_of, demand = [], [], []
    for j in range(jobs_n):
        for r in draw(st.sets(st.integers(0, replicas_n - 1), min_size=1)):
            job_of.append(j)
            replica_of.append(r)
            demand.append(draw(RATE))
    return SplitProblem(
        [f"j{j}" for j in range(jobs_n)],
        [f"r{r}" for r in range(replicas_n)],
        target,
        capacity,
        np.array(job_of, dtype=np.intp),
        np.array(replica_of, dtype=np.intp),
        np.array(demand),
        cap,
    )


def max_flow(p: SplitProblem, job_capacity: np.ndarray) -> float:
    """Edmonds–Karp on source →(job_capacity) job →(d_jr) replica →(B_r) sink."""
    jobs_n, replicas_n = len(p.jobs), len(p.replicas)
    n = jobs_n + replicas_n + 2
    s, t = 0, n - 1
    c = [[0.0] * n for _ in range(n)]
    for j in range(jobs_n):
        c[s][1 + j] = float(job_capacity[j])
    for r in range(replicas_n):
        c[1 + jobs_n + r][t] = float(p.capacity[r])
        for j in range(jobs_n):
            c[1 + j][1 + jobs_n + r] = float(p.demand[r, j])
    total = 0.0
    while True:
        parent = [-1] * n
        parent[s] = s
        queue = deque([s])
        while queue and parent[t] < 0:
            u = queue.popleft()
            for v in range(n):
                if parent[v] < 0 and c[u][v] > 1e-12:
                    parent[v] = u
                    queue.append(v)
        if parent[t] < 0:
            return total
        push, v = math.inf, t
        while v != s:
            push, v = min(push, c[parent[v]][v]), parent[v]
        v = t
        while v != s:
            c[parent[v]][v] -= push
            c[v][parent[v]] += push
            v = parent[v]
        total += push


def sums(p: SplitProblem, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    per_job = np.bincount(p.col, weights=x, minlength=len(p.jobs))
    per_replica = np.bincount(p.row, weights=x, minlength=len(p.replicas))
    return per_job, per_replica


@SETTINGS
@given(instances())
def test_caps_capacities_and_demands_hold_and_the_split_is_work_conserving(
    p: SplitProblem,
) -> None:
    x = split(p)
    tol = 1e-9 * p.scale
    per_job, per_replica = sums(p, x)
    demand = p.demand[p.row, p.col]
    assert (x >= 0.0).all() and (x <= demand + tol).all()
    assert (per_replica <= p.capacity + tol).all()
    assert (per_job <= p.cap + tol).all(), (per_job, p.cap)
    # pass 1's targets are still met, as far as the graph admits
    routed = float(np.minimum(per_job, p.target).sum())
    assert routed >= max_flow(p, p.target) - 1e-7 * p.scale
    # and nothing within the caps could carry more
    assert float(x.sum()) >= max_flow(p, p.cap) - 1e-7 * p.scale


@SETTINGS
@given(instances())
def test_a_cap_that_does_not_bind_changes_nothing(p: SplitProblem) -> None:
    free = SplitProblem(
        p.jobs,
        p.replicas,
        p.target,
        p.capacity,
        p.col,
        p.row,
        p.demand[p.row, p.col],
    )
    x_free = split(free)
    per_job, _ = sums(p, x_free)
    loose = SplitProblem(
        p.jobs,
        p.replicas,
        p.target,
        p.capacity,
        p.col,
        p.row,
        p.demand[p.row, p.col],
        np.maximum(p.cap, per_job),  # at least what each job gets anyway
    )
    assert split(loose).tolist() == x_free.tolist()


POLICIES = ["fair-share", "size-fair", "greedy-yield", "group>user>size", "fcfs"]


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[object], str, dict[str, dict[str, float]]]:
    """Digests of 1–4 replicas (b = 4, B_r 0–60) of up to 6 jobs, a policy, and
    rates for the jobs of one replica to hold fixed."""
    replicas_n = draw(st.integers(1, 4))
    nodes = {f"J{k}": draw(st.integers(1, 8)) for k in range(draw(st.integers(1, 6)))}
    users = {j: draw(st.sampled_from(["u1", "u2", "u3"])) for j in nodes}
    digests = []
    for r in range(replicas_n):
        here = draw(st.lists(st.sampled_from(sorted(nodes)), unique=True, max_size=len(nodes)))
        rows = [
            job(j, nodes[j], demand=draw(st.floats(0.0, 40.0)), user=users[j], group=users[j])
            for j in sorted(here)
        ]
        capacity = float(draw(st.integers(0, 60)))
        digests.append(digest(f"r{r}", rows, capacity=capacity, node_bandwidth=4.0))
    fixed: dict[str, dict[str, float]] = {}
    if replicas_n > 1 and draw(st.booleans()):
        dead = digests[-1]
        fixed[dead.replica_id] = {
            j: draw(st.floats(0.0, 40.0)) for j in dead.jobs.job_id if draw(st.booleans())
        }
    return digests, draw(st.sampled_from(POLICIES)), fixed


@SETTINGS
@given(clusters())
def test_through_the_merge_no_job_passes_its_cap_over_all_replicas(
    case: tuple[list[object], str, dict[str, dict[str, float]]],
) -> None:
    digests, policy, fixed = case
    merged = merge(digests)  # type: ignore[arg-type]
    targets = decide(REGISTRY.create(policy), merged.view).rates
    x = split_targets(merged, targets, fixed)
    assert merged.cap is not None
    cap = merged.cap
    per_job = np.bincount(merged.job_of, weights=x, minlength=len(merged.names))
    held = np.array([r in fixed for r in merged.replicas])[merged.replica_of]
    given_ = np.array(
        [
            fixed[merged.replicas[r]].get(merged.names[j], 0.0) if h else 0.0
            for j, r, h in zip(merged.job_of, merged.replica_of, held, strict=True)
        ]
    )
    tol = 1e-9 * max(1.0, float(merged.capacity.sum()))
    assert (x >= 0.0).all()
    assert np.array_equal(x[held], given_[held])  # a held column is taken as it is
    free = x[~held] <= merged.demand[~held] + tol
    assert free.all()
    live = np.bincount(merged.replica_of[~held], weights=x[~held], minlength=len(merged.replicas))
    assert (live <= merged.capacity + tol).all()
    # the live replicas never take a job past b_j minus what the held column gives it
    used = np.bincount(merged.job_of, weights=given_, minlength=len(merged.names))
    assert (per_job - used <= np.maximum(cap - used, 0.0) + tol).all(), (per_job, cap, used)
    # each job's ceilings over the replicas add up to at most b_j (or what it has)
    top = ceilings(merged, x)
    assert (top >= x - tol).all()
    ceiling_sum = np.bincount(merged.job_of, weights=top, minlength=len(merged.names))
    assert (ceiling_sum <= np.maximum(cap, per_job) + tol).all()
