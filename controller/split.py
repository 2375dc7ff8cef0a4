"""Split each job's global target rate over the controller replicas it is present on.

Several replicas (one per storage server) share one global view after each
λ all-gather ([THEMIS] §3.1, Figure 5). Every replica runs :func:`split` on that view
and applies its own share, so the code is pure and deterministic: jobs and
replicas are indexed in sorted id order, never dict order, and every float
operation (numpy included) runs in that fixed order.

Two passes (see ``docs/replicas.md``, "Splitting global targets over replicas"):

1. Targets. Route as much of the targets as the
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
   capacity no job below its target could use there. A job's sum over all
   replicas stays within its global cap b_j (``SplitProblem.cap``): surplus
   that would pass it is scaled down and the capacity freed is taken by a
   maximum flow of the cap network (:func:`_within_caps`).

Pass 1 is Fujishige's decomposition algorithm (S. Fujishige, "Lexicographically
optimal base of a polymatroid with respect to a weight vector", Math. Oper.
Res. 5, 1980; "Submodular Functions and Optimization", 2nd ed., 2005, §8.2)
for the rank g(S) = the most the jobs can push into replica set S, lowest
level first. The lowest level λ₁ = min_S g(S)/B(S) and its largest minimiser
come from Newton's (Dinkelbach's) iteration from above, each step one max
flow with replica capacities λ·B_r: a flow that saturates the candidate set X
proves λ is its level; otherwise the replicas not reachable from the source
in the residual graph (the sink side of the minimal min cut) are the largest
minimiser Y of g(S) − λ·B(S), strictly inside X, and λ becomes g(Y)/B(Y),
read off the same flow. A level set found is held at λ·B_r (contraction) and
the rest go on from the sets passed on the way, kept on a stack. Jobs whose
target covers all their local demand (and jobs on one replica) add the same
to every cut, so they are pooled into one job per replica, an exact
reduction, and get their pool's flow back pro rata to demand.

The max flows are Dinic's algorithm with the jobs as numpy vectors (one row
per replica): an augmenting path of the level graph is a path over replicas,
each hop moves flow through all jobs of its level at once, each in proportion
to what it can move, and a push empties at least one replica-level hop, which
stays empty for the rest of the phase.

Cost: O(R) max flows (each run fixes a level, or pushes a strictly smaller
candidate, or turns the first upper bound into an exact ratio), each warm
started from the previous flow (a capacity cut only scales a replica's row
down); a max flow is at most R + 1 Dinic phases of O(R) BFS steps and at
most R² + 2R pushes, each O(R) vector operations over J jobs. So O(R⁵·J)
arithmetic in the worst case and no subset enumeration; in practice one max
flow per level or two (measured by ``bench/split_speed.py``, docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from burstctl.policies.view import JobId

ReplicaId = str
Edge = tuple[JobId, ReplicaId]
Vector = npt.NDArray[np.float64]
Matrix = npt.NDArray[np.float64]  # one row per replica, one column per job

_EPS = 1e-12  # relative to the largest input: flows below it are rounding noise
_SATURATED = 1e-10  # relative: a max flow this close to λ·B(X) saturates X


def split(problem: SplitProblem, *, surplus: bool = True) -> Vector:
    """x_k for every entry k of ``problem``: targets first (pass 1), then, with
    ``surplus``, each replica's leftover capacity (pass 2). Each x_k is in
    [0, demand[k]], each replica's sum at most B_r and each job's sum over the
    replicas at most its cap b_j (and at most its target without ``surplus``)."""
    rates = _balanced_flow(problem)
    if surplus:
        rates = _with_surplus(problem, rates)
    row, col = problem.row, problem.col
    return np.clip(rates[row, col], 0.0, problem.demand[row, col])


class SplitProblem:
    """The inputs of :func:`split`, checked, as arrays.

    ``jobs`` and ``replicas`` sorted; ``target[j]`` (each job's global rate, the
    policy on the global view with capacity Σ B_r) and ``capacity[r]`` (B_r) by
    those indices; one entry k per job present on a replica (no pair twice): its
    job index ``job_of[k]``, replica index ``replica_of[k]`` and its local demand
    ``demand[k]``. ``cap[j]`` (optional, +inf by default) is job j's global cap
    b_j = min(p_j·b, Σ B_r): no split gives a job more than that over all its
    replicas, surplus included (a target above it is cut to it). Raises
    ``ValueError`` on negative or non-finite values (a cap may be +inf) and on
    indices out of range.
    """

    def __init__(
        self,
        jobs: Sequence[JobId],
        replicas: Sequence[ReplicaId],
        target: Vector,
        capacity: Vector,
        job_of: npt.NDArray[np.intp],
        replica_of: npt.NDArray[np.intp],
        demand: Vector,
        cap: Vector | None = None,
    ) -> None:
        n, jobs_n, replicas_n = len(demand), len(jobs), len(replicas)
        if not (len(job_of) == len(replica_of) == n):
            raise ValueError(
                f"{len(job_of)} job and {len(replica_of)} replica indices, {n} demands"
            )
        if len(target) != jobs_n or len(capacity) != replicas_n:
            raise ValueError(
                f"{len(target)} targets for {jobs_n} jobs or "
                f"{len(capacity)} capacities for {replicas_n} replicas"
            )
        for what, values in (("target", target), ("capacity", capacity), ("demand", demand)):
            bad = ~(np.isfinite(values) & (values >= 0.0))
            if bad.any():
                k = int(np.argmax(bad))
                raise ValueError(f"{what} [{k}] must be finite and >= 0, got {values[k]!r}")
        if cap is None:
            cap = np.full(jobs_n, np.inf)
        elif len(cap) != jobs_n:
            raise ValueError(f"{len(cap)} caps for {jobs_n} jobs")
        bad = ~(cap >= 0.0)  # NaN too; +inf: no cap
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(f"cap [{k}] must be >= 0, got {cap[k]!r}")
        if n and not (job_of.min() >= 0 and job_of.max() < jobs_n):
            raise ValueError("a job index is out of range")
        if n and not (replica_of.min() >= 0 and replica_of.max() < replicas_n):
            raise ValueError("a replica index is out of range")
        if len(np.unique(replica_of * jobs_n + job_of)) != n:
            raise ValueError("a (job, replica) pair appears twice")
        self.jobs = list(jobs)
        self.replicas = list(replicas)
        self.col = np.asarray(job_of, dtype=np.intp)
        self.row = np.asarray(replica_of, dtype=np.intp)
        self.capacity = np.asarray(capacity, dtype=np.float64)
        self.cap = np.asarray(cap, dtype=np.float64)
        # a target above the job's cap is routed only up to the cap
        self.target = np.minimum(np.asarray(target, dtype=np.float64), self.cap)
        self.demand = np.zeros((replicas_n, jobs_n))
        self.demand[self.row, self.col] = demand
        self.scale = max(1.0, *(float(np.max(a, initial=0.0)) for a in (target, capacity, demand)))


def _balanced_flow(problem: SplitProblem) -> Matrix:
    """x¹: a maximum flow whose replica loads are the lexicographically optimal base.

    ``fixed`` (F) holds the replicas at their final L_r; F is tight, so holding
    it there leaves the others the contracted rank f(X) = g(F ∪ X) − g(F). The
    open replicas run at λ·B_r. Newton from above starts at the upper bound
    λ = Σ_j min(t_j, Σ_r d_jr)/B. While the flow cannot saturate the candidate
    set X, its replicas on the sink side of the min cut (the largest minimiser
    Y of f − λ·B, nested in X) become the candidate, at λ = f(Y)/B(Y). A
    saturated candidate is the next level set; the candidate below it on the
    stack is next, with its ratio in the contraction.
    """
    b = problem.capacity
    # x_jr ≤ t_j anyway. A job whose target covers all its (capped) local demand, in
    # particular a job on one replica, adds its demand to every cut: modular, so all
    # of them on replica r act as one job with target and demand Σ_j d_jr there.
    demand: Matrix = np.minimum(problem.demand, problem.target)
    modular = problem.target >= demand.sum(axis=0)
    pooled = demand[:, modular].sum(axis=1)
    flow = _Flow(
        np.concatenate([problem.target[~modular], pooled]),
        np.concatenate([demand[:, ~modular], np.diag(pooled)], axis=1),
        problem.scale,
    )
    level_cap = np.zeros_like(b)  # L_r of the fixed replicas
    fixed = np.zeros(len(b), dtype=bool)
    open_ = b > 0.0
    tol = _SATURATED * problem.scale
    # g(all) ≤ Σ_j min(t_j, Σ_r d_jr): an upper bound to start Newton from.
    bound = float(np.minimum(flow.target, flow.demand[open_].sum(axis=0)).sum())
    # Nested candidate sets S = F ∪ X with g(S), or with the upper bound (exact=False).
    stack: list[tuple[npt.NDArray[np.bool_], float, bool]] = [(open_.copy(), bound, False)]
    while open_.any():
        s, g_s, exact = stack[-1]
        x = s & open_
        fixed_sum = float(level_cap[fixed].sum())
        level = min(1.0, max(0.0, (g_s - fixed_sum) / float(b[x].sum())))
        if exact and np.count_nonzero(x) == 1:  # f(X)/B(X) of one replica is its level
            level_cap[x] = level * b[x]
            fixed |= x
            open_ &= ~x
            stack.pop()
            continue
        cap = np.where(fixed, level_cap, np.where(open_, level * b, 0.0))
        flow.run(cap)
        load = flow.loads()
        short = cap - load
        y = x & ~flow.reachable
        # f(Y) = load(Y) + (load − L)(F) + (load − λB)(open \ Y), Y a minimiser at λ
        f_y = float(load[y].sum()) - float(short[fixed].sum()) - float(short[open_ & ~y].sum())
        same = bool((y == x).all())
        if (
            float(short[fixed | x].sum()) <= tol
            or not y.any()
            or (same and exact)  # only by rounding
        ):
            level_cap[x] = level * b[x]  # X saturates at λ ≥ f(X)/B(X): its level
            fixed |= x
            open_ &= ~x
            stack.pop()
        elif same:  # λ was an upper bound: now the ratio of X
            stack[-1] = (s, fixed_sum + f_y, True)
        else:
            stack.append((fixed | y, fixed_sum + f_y, True))
    if not np.array_equal(flow.cap, level_cap):
        flow.run(level_cap)
    # Back to jobs: a pooled job's flow is shared pro rata to the demands it pooled.
    rates: Matrix = np.empty_like(demand)
    kept = int(np.count_nonzero(~modular))
    rates[:, ~modular] = flow.x[:, :kept]
    share = np.divide(flow.x[:, kept:].diagonal(), pooled, out=np.zeros_like(b), where=pooled > 0)
    rates[:, modular] = demand[:, modular] * share[:, None]
    return rates


class _Flow:
    """Dinic's max flow on source →(t_j) job →(d_jr) replica →(cap_r) sink.

    ``x`` is the flow, one row per replica; ``slack``, ``room`` and ``ahead``
    are the residual capacities of the source, sink and job → replica arcs,
    updated with every push so that a saturated arc is exactly 0. ``run``
    keeps the current flow when the replica capacities change (a row above
    its new capacity is scaled down) and augments it to a maximum.
    """

    def __init__(self, target: Vector, demand: Matrix, scale: float) -> None:
        self.target = target
        self.demand = demand
        self.x = np.zeros_like(demand)
        self.eps = _EPS * scale
        self.reachable = np.zeros(len(demand), dtype=bool)
        self._refresh(np.zeros(len(demand)))

    def total(self) -> float:
        return float(self.x.sum())

    def loads(self) -> Vector:
        return np.asarray(self.x.sum(axis=1))

    def run(self, cap: Vector) -> None:
        over = self.loads() > cap
        if over.any():  # less capacity: drop flow pro rata, it is still a flow
            rows = np.flatnonzero(over)
            scaled = self.x[rows] * (cap[rows] / self.loads()[rows])[:, None]
            self.x[rows] = np.minimum(scaled, self.demand[rows])
        self._refresh(cap)
        for _ in range(2 * len(cap) + 2):  # Dinic: the s–t distance grows every phase
            if not self._phase():
                return

    def _refresh(self, cap: Vector) -> None:
        # Residuals from scratch; what is left below eps is rounding noise, so 0.
        self.cap = cap
        self.slack = _denoise(self.target - self.x.sum(axis=0), self.eps)
        self.ahead = _denoise(self.demand - self.x, self.eps)
        self.room = _denoise(cap - self.x.sum(axis=1), self.eps)

    def _phase(self) -> bool:
        """BFS levels, then a blocking flow over replica paths; False at a maximum."""
        eps = self.eps
        job_level = np.where(self.slack > eps, 0, -1)
        frontier = (job_level == 0).astype(np.float64)
        # 0/1 matrices of the residual arcs; a product with a 0/1 vector is a BFS step.
        onward = (self.ahead > eps).astype(np.float64)  # job → replica
        back = None  # replica → job, built when the BFS gets that far
        room = (self.room > eps).tolist()
        seen = [False] * len(room)
        layers: list[list[int]] = []
        while True:
            hit = (onward @ frontier).tolist()
            fresh = [r for r, h in enumerate(hit) if h > 0.0 and not seen[r]]
            if not fresh:
                break
            layers.append(fresh)
            for r in fresh:
                seen[r] = True
            if any(room[r] for r in fresh):
                levels = [(job_level == k).astype(np.float64) for k in range(len(layers))]
                self._blocking_flow(layers, levels)
                return True
            if back is None:
                back = (self.x > eps).astype(np.float64)
            reached = (back[fresh].sum(axis=0) > 0.0) & (job_level < 0)
            if not reached.any():
                break
            job_level[reached] = len(layers)
            frontier = reached.astype(np.float64)
        self.reachable = np.array(seen, dtype=bool)
        return False

    def _hop(self, frm: int, to: int, jobs: Vector) -> Vector:
        """What each job of a level (``jobs``: 1.0 or 0.0) can move from ``frm`` to ``to``."""
        move = np.minimum(self.slack if frm < 0 else self.x[frm], self.ahead[to])
        move *= jobs
        return move

    def _blocking_flow(self, layers: Sequence[Sequence[int]], levels: Sequence[Vector]) -> None:
        """Augment along replica paths of the level graph until none is left.

        ``levels[k]`` are the jobs that lead from layer k − 1 (the source for
        k = 0) to layer k. Hop capacities only shrink within a phase, so a hop
        or a replica found empty stays so (Dinic's current-arc pointers).
        """
        last = len(layers) - 1
        nxt = dict.fromkeys([-1, *(r for layer in layers for r in layer)], 0)
        dead: set[int] = set()
        path: list[int] = []  # replicas after the source
        moves: list[tuple[Vector, float]] = []  # per hop: what each job can move, its sum
        while True:
            depth = len(path)
            u = path[-1] if path else -1
            if depth == last + 1:  # u is in the last layer and has room to the sink
                self._augment(path, moves)
                path.clear()
                moves.clear()
                continue
            candidates = layers[depth]
            while nxt[u] < len(candidates):
                v = candidates[nxt[u]]
                if v not in dead and (depth < last or self.room[v] > self.eps):
                    move = self._hop(u, v, levels[depth])
                    total = float(move.sum())
                    if total > self.eps:
                        break
                nxt[u] += 1
            else:
                if u < 0:
                    return
                dead.add(u)
                path.pop()
                moves.pop()
                continue
            path.append(v)
            moves.append((move, total))

    def _augment(
        self,
        path: Sequence[int],
        moves: Sequence[tuple[Vector, float]],
    ) -> None:
        push = min(min(total for _, total in moves), float(self.room[path[-1]]))
        for k, (u, v) in enumerate(zip([-1, *path[:-1]], path, strict=True)):
            move, total = moves[k]
            # Every job of the hop moves the same fraction of what it can; at the
            # bottleneck that fraction is 1 and the hop is left exactly empty.
            moved = move * (push / total) if push < total else move
            if u < 0:
                self.slack -= moved
            else:
                self.x[u] -= moved
                self.ahead[u] += moved
            self.x[v] += moved
            self.ahead[v] -= moved
        last = path[-1]
        self.room[last] = 0.0 if push >= self.room[last] else self.room[last] - push


def _denoise(values: npt.NDArray[np.float64], eps: float) -> npt.NDArray[np.float64]:
    return np.where(values > eps, values, 0.0)


def _with_surplus(problem: SplitProblem, base: Matrix) -> Matrix:
    """Pass 2: each replica's leftover water-filled, equal weights, over unmet demand.

    The same rule as ``policies.sharing.water_fill`` with unit weights, for
    all replicas at once: sorted unmet demands u₁ ≤ … ≤ u_n, the level is
    θ = (leftover − Σ_{i<k} u_i)/(n − k) for the first k with u_k ≥ θ.
    """
    unmet = np.maximum(problem.demand - base, 0.0)
    leftover = problem.capacity - base.sum(axis=1)
    wanted = unmet.sum(axis=1)
    extra = np.zeros_like(base)
    full = (leftover > 0.0) & (wanted <= leftover)
    extra[full] = unmet[full]
    rows = np.flatnonzero((leftover > 0.0) & (wanted > leftover))
    if len(rows):
        u = np.sort(unmet[rows], axis=1)
        before = np.cumsum(u, axis=1) - u  # Σ_{i<k} u_i
        n = u.shape[1]
        theta = (leftover[rows, None] - before) / (n - np.arange(n))
        first = np.argmax(u >= theta, axis=1)
        level = theta[np.arange(len(rows)), first]
        extra[rows] = np.minimum(unmet[rows], level[:, None])
    rates: Matrix = np.minimum(base + extra, problem.demand)
    return _within_caps(problem, base, rates)


def _within_caps(problem: SplitProblem, base: Matrix, rates: Matrix) -> Matrix:
    """Pass 2 made to respect every job's global cap b_j, and still work conserving.

    Each replica's water-fill sees only its own leftover, so a job present on
    several replicas can collect surplus on each until its sum passes b_j.
    Such a job's surplus is scaled down, on all its replicas alike, until its
    sum is exactly b_j; the capacity that frees is then taken by a maximum flow
    on source →(b_j) job →(d_jr) replica →(B_r) sink, warm started from these
    rates (Dinic, as in pass 1). Augmenting
    never lowers a job's sum or a replica's load, so pass 1's targets stay
    met, and the result carries the maximum flow of that network: no split
    within the caps, the demands and the capacities carries more. When no
    cap binds, the water-fill is returned unchanged (it already fills every
    replica to min(B_r, Σ_j d_jr)).
    """
    cap = problem.cap
    total = rates.sum(axis=0)
    over = total > cap
    if not over.any():
        return rates
    routed = base.sum(axis=0)  # ≤ t_j ≤ b_j
    surplus = total - routed
    # A job over its cap by rounding alone has no surplus to scale (routed ≥ cap, surplus 0):
    # 0/0 there; the cut at the end takes it back to its cap.
    scalable = over & (surplus > 0.0)
    keep = np.divide(
        np.maximum(cap - routed, 0.0), surplus, out=np.ones_like(surplus), where=scalable
    )
    keep = np.minimum(keep, 1.0)
    capped = base + (rates - base) * keep
    flow = _Flow(cap, problem.demand, problem.scale)
    flow.x = np.minimum(capped, problem.demand)
    flow.run(problem.capacity)
    out: Matrix = flow.x
    sums = out.sum(axis=0)
    high = sums > cap  # by rounding only: cut to the cap exactly
    if high.any():
        out[:, high] *= cap[high] / sums[high]
    return out
