"""Split each job's global target rate over the controller replicas it is present on.

Several replicas (one per storage server) share one global view after each
λ all-gather (ThemisIO notes §4). Every replica runs :func:`split` on that view
and applies its own column, so the code is pure and deterministic: ties and
float sums follow sorted ids, never dict order.

Two passes (see ``docs/replicas.md``, "Splitting global targets over replicas"):

1. Targets (:func:`split_targets`). Route as much of the targets as the
   bipartite job × replica graph admits (a maximum flow: job capacity t_j,
   edge capacity d_jr, replica capacity B_r), with replica loads L_r chosen as
   the lexicographically optimal base of the polymatroid of routable loads,
   weighted by B_r (Fujishige 1980): the smallest utilisation L_r/B_r is as
   large as it can be, then the next one, and so on; equivalently the largest
   utilisation is as small as it can be and Σ L_r²/B_r is minimal.
2. Surplus. On each replica, capacity left after pass 1 is water-filled with
   equal weights over the present jobs' unmet local demand. Because pass 1 is
   a maximum flow, only jobs already at their target can have unmet demand on
   a replica with leftover capacity, so a job exceeds its target only with
   capacity no job below its target could use there.

Cost: pass 1 enumerates replica subsets (O(3^R) plus O(J · 2^k) for a job on k
replicas) and runs one Dinic max flow whose phases are bounded by the path
length, 2R + 1; fine for R up to about 12 replicas per policy domain.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from burstctl.policies.sharing import water_fill
from burstctl.policies.view import JobId

ReplicaId = str
Edge = tuple[JobId, ReplicaId]


def split(
    targets: Mapping[JobId, float],
    capacity: Mapping[ReplicaId, float],
    demand: Mapping[Edge, float],
) -> dict[Edge, float]:
    """Rate of every (job, replica) in ``demand``: targets first, then local surplus.

    ``targets`` is each job's global rate (the policy on the global view with
    capacity Σ B_r; a missing job has target 0), ``capacity`` each replica's
    B_r, ``demand`` each job's local demand on the replicas it is present on.
    Raises ``ValueError`` on negative or non-finite inputs and on a replica in
    ``demand`` without a capacity.
    """
    base = split_targets(targets, capacity, demand)
    rates = dict(base)
    for r in sorted({r for _, r in demand}):
        edges = [(j, rr) for j, rr in base if rr == r]
        leftover = capacity[r] - math.fsum(base[e] for e in edges)
        unmet = {j: demand[(j, rr)] - base[(j, rr)] for j, rr in edges}
        unmet = {j: u for j, u in unmet.items() if u > 0.0}
        if leftover <= 0.0 or not unmet:
            continue
        # Work conservation: hand the leftover to whoever here still wants it.
        extra = water_fill(unmet, dict.fromkeys(unmet, 1.0), leftover)
        for j, x in extra.items():
            rates[(j, r)] = min(demand[(j, r)], base[(j, r)] + x)
    return rates


def split_targets(
    targets: Mapping[JobId, float],
    capacity: Mapping[ReplicaId, float],
    demand: Mapping[Edge, float],
) -> dict[Edge, float]:
    """Pass 1 of :func:`split`: a balanced maximum flow of the targets, no surplus.

    Σ over a job ≤ its target, Σ over a replica ≤ B_r, each rate ≤ local
    demand; Σ of all rates is the maximum flow of the job × replica graph.
    """
    t, cap, d = _checked(targets, capacity, demand)
    jobs = sorted({j for j, _ in d})
    replicas = sorted(cap)
    loads = _balanced_loads(jobs, replicas, t, cap, d)
    return _route(jobs, replicas, t, d, loads)


def _checked(
    targets: Mapping[JobId, float],
    capacity: Mapping[ReplicaId, float],
    demand: Mapping[Edge, float],
) -> tuple[dict[JobId, float], dict[ReplicaId, float], dict[Edge, float]]:
    for what, values in (("target", targets), ("capacity", capacity), ("demand", demand)):
        for key, v in values.items():
            if not (math.isfinite(v) and v >= 0.0):
                raise ValueError(f"{what} of {key!r} must be finite and >= 0, got {v!r}")
    for j, r in demand:
        if r not in capacity:
            raise ValueError(f"replica {r!r} has demand from job {j!r} but no capacity")
    d = {e: float(demand[e]) for e in sorted(demand)}
    t = {j: float(targets.get(j, 0.0)) for j in sorted({j for j, _ in d})}
    return t, {r: float(capacity[r]) for r in sorted(capacity)}, d


def _balanced_loads(
    jobs: list[JobId],
    replicas: list[ReplicaId],
    t: Mapping[JobId, float],
    cap: Mapping[ReplicaId, float],
    d: Mapping[Edge, float],
) -> dict[ReplicaId, float]:
    """L_r: the lexicographically optimal base, weights B_r, of the routable loads.

    g(S), the most the jobs can push into replica set S, is a polymatroid rank
    function; by max-flow/min-cut on the bipartite graph
    g(S) = min over T ⊆ S of B(S \\ T) + h(T), with h(T) = Σ_j min(t_j, d_j(T)).
    Fujishige's decomposition: λ = min_S g(S)/B(S) over the replicas not yet
    fixed (after contracting the fixed ones), every replica of the largest
    minimiser gets λ·B_r, repeat.
    """
    live = [r for r in replicas if cap[r] > 0.0]
    bit = {r: 1 << i for i, r in enumerate(live)}
    full = (1 << len(live)) - 1
    # h is summed per presence pattern P, so each pattern's 2^|P| subsets are visited once.
    by_pattern: dict[int, dict[int, float]] = {}
    for j in jobs:
        if t[j] <= 0.0:
            continue
        mine = [(bit[r], d[(j, r)]) for r in live if d.get((j, r), 0.0) > 0.0]
        if not mine:
            continue
        pattern = 0
        sums = {0: 0.0}
        for b, dem in mine:  # d_j(s) for every s ⊆ P, built one replica at a time
            sums.update({s | b: v + dem for s, v in sums.items()})
            pattern |= b
        acc = by_pattern.setdefault(pattern, dict.fromkeys(sums, 0.0))
        for s, v in sums.items():
            acc[s] += min(t[j], v)
    patterns = sorted(by_pattern.items())
    h = [math.fsum(acc[m & p] for p, acc in patterns) for m in range(full + 1)]
    b_of = [0.0] * (full + 1)
    for m in range(1, full + 1):
        low = m & -m
        b_of[m] = b_of[m ^ low] + cap[live[low.bit_length() - 1]]
    g = [0.0] * (full + 1)
    for s in range(1, full + 1):
        best = b_of[s]  # T = ∅: cut every replica of S at its capacity
        sub = s
        while sub:
            best = min(best, b_of[s ^ sub] + h[sub])
            sub = (sub - 1) & s
        g[s] = best

    loads = dict.fromkeys(replicas, 0.0)
    fixed = 0
    while fixed != full:
        rest = full & ~fixed
        chosen = rest
        chosen_key = (math.inf, 0)
        sub = rest
        while sub:
            level = (g[sub | fixed] - g[fixed]) / b_of[sub]
            key = (level, -sub.bit_count())  # the largest minimiser, then the lowest mask
            if key <= chosen_key:
                chosen, chosen_key = sub, key
            sub = (sub - 1) & rest
        level = min(1.0, max(0.0, chosen_key[0]))
        for r in live:
            if chosen & bit[r]:
                loads[r] = level * cap[r]  # L_r = λ_k · B_r
        fixed |= chosen
    return loads


def _route(
    jobs: list[JobId],
    replicas: list[ReplicaId],
    t: Mapping[JobId, float],
    d: Mapping[Edge, float],
    loads: Mapping[ReplicaId, float],
) -> dict[Edge, float]:
    """A flow with job capacity t_j, edge capacity d_jr and replica capacity L_r."""
    net = _Network(len(jobs) + len(replicas) + 2)
    source, sink = 0, len(jobs) + len(replicas) + 1
    job_node = {j: 1 + i for i, j in enumerate(jobs)}
    rep_node = {r: 1 + len(jobs) + i for i, r in enumerate(replicas)}
    for j in jobs:
        net.add(source, job_node[j], t[j])
    edge_arc = {(j, r): net.add(job_node[j], rep_node[r], dem) for (j, r), dem in d.items()}
    for r in replicas:
        net.add(rep_node[r], sink, loads[r])
    scale = max([1.0, *t.values(), *loads.values()])
    net.max_flow(source, sink, eps=1e-12 * scale)
    return {e: min(d[e], max(0.0, net.flow(arc))) for e, arc in edge_arc.items()}


class _Network:
    """Dinic's max flow on float capacities; arcs 2k and 2k+1 are a pair."""

    def __init__(self, nodes: int) -> None:
        self.adj: list[list[int]] = [[] for _ in range(nodes)]
        self.head: list[int] = []
        self.cap: list[float] = []

    def add(self, u: int, v: int, capacity: float) -> int:
        arc = len(self.head)
        self.adj[u].append(arc)
        self.head.append(v)
        self.cap.append(capacity)
        self.adj[v].append(arc + 1)
        self.head.append(u)
        self.cap.append(0.0)
        return arc

    def flow(self, arc: int) -> float:
        return self.cap[arc ^ 1]

    def max_flow(self, source: int, sink: int, eps: float) -> None:
        while True:
            level = self._levels(source, eps)
            if level[sink] < 0:
                return
            nxt = [0] * len(self.adj)
            # Each push saturates its bottleneck arc exactly, so this terminates.
            while self._push(source, sink, math.inf, level, nxt, eps) > 0.0:
                pass

    def _levels(self, source: int, eps: float) -> list[int]:
        level = [-1] * len(self.adj)
        level[source] = 0
        frontier = [source]
        while frontier:
            ahead = []
            for u in frontier:
                for arc in self.adj[u]:
                    v = self.head[arc]
                    if level[v] < 0 and self.cap[arc] > eps:
                        level[v] = level[u] + 1
                        ahead.append(v)
            frontier = ahead
        return level

    def _push(
        self, u: int, sink: int, limit: float, level: list[int], nxt: list[int], eps: float
    ) -> float:
        if u == sink:
            return limit
        arcs = self.adj[u]
        while nxt[u] < len(arcs):
            arc = arcs[nxt[u]]
            v = self.head[arc]
            if self.cap[arc] > eps and level[v] == level[u] + 1:
                got = self._push(v, sink, min(limit, self.cap[arc]), level, nxt, eps)
                if got > 0.0:
                    self.cap[arc] -= got
                    self.cap[arc ^ 1] += got
                    return got
            nxt[u] += 1
        return 0.0
