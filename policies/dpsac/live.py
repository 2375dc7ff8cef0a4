"""DPSAC, live: probabilistic admission to the burst buffer by cluster ([DPSAC] §4).

Every job of the view is an application of [DPSAC] §3.2: B_i = its cap b_i, and its I/O-phase
length l_i and period T_i are declared (``view.periodic``: l_i = vol_io/b_i, T_i = w + l_i) or
learned (l_i = mean_volume/b_i, T_i = last_work + l_i); a job with neither does I/O for one
time unit in every unit (l_i = Δ, P_i = 1). P_i = l_i/T_i, ρ_i = 1 − P_i, ρ̃_i(t) = the job's
yield at the view's time ([BWS] eq. (6)), β_i = its nodes.

With a burst buffer (``view.buffer``: S = size, B = drain bandwidth, resident bytes per job)
the jobs are clustered on l_i (Algorithm 1; joins, exits and later batches through the chosen
updater, §4.5), the clusters partitioned (§4.3: quota U_k·S, PFS share U_k·B·Δ), each cluster
keeps its load distribution Dist incrementally (Algorithm 2), and each decision runs Algorithm
3 per cluster with L_k = Σ resident bytes of its jobs: a selected job gets its B_i (its grant
over Δ, at most its demand, and at most what is left of the buffer bandwidth ``capacity``,
served in priority order), the others 0. This is not work-conserving, on purpose: a job
DPSAC defers waits (§4.4.3).

Without a buffer (``view.buffer`` None) it is BIOS ([DPSAC] §5.2): the priority order, each
job in turn taking min(demand, what is left of ``capacity``).

State: the clustering and the Dists, derived from the views only; the draws of a decision
come from a ``random.Random`` seeded by (``view.seed``, ``view.now``), so the same view on the
same state gives the same rates. docs/dpsac.md, "The live policy".
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from burstctl.policies.base import Policy, PolicyParams
from burstctl.policies.dpsac.algorithm3 import full_probability, schedule
from burstctl.policies.dpsac.dist import LoadDistribution, to_units
from burstctl.policies.dpsac.model import App
from burstctl.policies.dpsac.partition import partition
from burstctl.policies.dpsac.priorities import Efficiency, by_name
from burstctl.policies.dpsac.updaters import Updater, make_updater
from burstctl.policies.sharing import greedy_fill
from burstctl.policies.view import JobId, JobView, Periodic, SystemView

# A cluster's Dist counts rates in quanta of (its largest B_i·Δ when it was built) / RESOLUTION:
# at most this many load units per job at build time, so Dist stays O(RESOLUTION · n)
RESOLUTION = 32


class DpsacParams(PolicyParams):
    k_max: int = Field(5, ge=1, le=16, description="K_C: the most clusters the elbow may choose")
    priority: Literal["minmax", "min-dilation", "max-sys-eff"] = Field(
        "minmax", description="the order inside a cluster (MinMax-γ, MinDilation, MaxSysEff)"
    )
    gamma: float = Field(0.5, ge=0.0, le=1.0, description="γ of MinMax-γ")
    updater: Literal["st", "dt", "ok"] = Field(
        "ok", description="how joins and exits update the clusters (ST, DT or online K-means)"
    )
    time_unit: float = Field(
        1.0,
        gt=0.0,
        le=3600.0,
        description="Δ, seconds: rates become volumes per time unit (B_i·Δ, B·Δ) for "
        "Algorithm 3 and Dist; a job with no known period does I/O for Δ every Δ",
    )


def job_model(job: JobView, declared: Periodic | None, delta: float) -> App:
    """The job as an [DPSAC] application: rate b_i·Δ (bytes per time unit), P_i, l_i (s)."""
    cap = job.cap
    if declared is not None and cap > 0.0:
        length = declared.vol_io / cap
        period = declared.w + length
    elif job.mean_volume > 0.0 and cap > 0.0:
        length = job.mean_volume / cap
        period = job.last_work + length
    else:
        length = period = delta
    p = min(1.0, max(0.0, length / period)) if period > 0.0 else 1.0
    return App(job.job_id, cap * delta, p, length)


@dataclass(slots=True)
class _Cluster:
    dist: LoadDistribution
    units: dict[JobId, tuple[int, float]]  # the (b_units, p) each member was added with


class DpsacPolicy(Policy):
    """[DPSAC] over the live burst buffer; BIOS when the view has none."""

    name = "dpsac"
    Params = DpsacParams
    keeps_state = True  # the clustering of the jobs of its views
    conserving = False  # a job it defers waits, also between the replicas' exchanges

    def __init__(self, params: PolicyParams | None = None) -> None:
        super().__init__(params)
        assert isinstance(self.params, DpsacParams)
        p = self.params
        self._order = by_name(p.priority, p.gamma)
        self._updater: Updater | None = None
        self._apps: dict[JobId, App] = {}
        self._clusters: list[_Cluster] = []
        self.rebuilds = 0  # Dist rebuilds after a structural change (for tests and the doc)

    # -- the model ------------------------------------------------------------------------
    @staticmethod
    def _efficiencies(
        view: SystemView, jobs: list[JobView], apps: Mapping[JobId, App]
    ) -> list[Efficiency]:
        """ρ̃_i(t), ρ_i = 1 − P_i and β_i of ``jobs``, in their order."""
        return [
            Efficiency(job.job_id, job.yield_at(view.now), 1.0 - apps[job.job_id].p, job.nodes)
            for job in jobs
        ]

    def _sync(self, view: SystemView) -> None:
        """Brings the clustering and the Dists up to the view's jobs (joins, exits, changed
        models); rebuilds every Dist after a structural change."""
        assert isinstance(self.params, DpsacParams)
        delta = self.params.time_unit
        models = {j: job_model(job, view.periodic.get(j), delta) for j, job in view.jobs.items()}
        if self._updater is None:
            self._updater = make_updater(
                self.params.updater, self.params.k_max, random.Random(f"dpsac-ok:{view.seed}")
            )
        up = self._updater
        gone = [j for j in self._apps if j not in models or models[j] != self._apps[j]]
        for j in gone:
            if not up.changed and j in up:
                self._dist_remove(up.cluster_of(j), j)
            up.on_exit(j)
            del self._apps[j]
        fresh = [models[j] for j in models if j not in self._apps]
        if len(fresh) > 1 or len(up) == 0:
            up.on_batch([(a.app_id, a.length) for a in fresh])
            self._apps.update((a.app_id, a) for a in fresh)
        else:
            for app in fresh:
                k = up.on_join(app.app_id, app.length)
                self._apps[app.app_id] = app
                if not up.changed:
                    self._dist_add(k, app)
        if up.changed or len(self._clusters) != len(up.clusters):
            self._rebuild()

    def _rebuild(self) -> None:
        assert self._updater is not None
        self.rebuilds += 1
        self._clusters = []
        for members in self._updater.clusters:
            top = max((self._apps[j].rate for j in members), default=0.0)
            quantum = top / RESOLUTION if top > 0.0 else 1.0
            cluster = _Cluster(LoadDistribution(quantum), {})
            self._clusters.append(cluster)
        for k, members in enumerate(self._updater.clusters):
            for j in members:
                self._dist_add(k, self._apps[j])
        self._updater.changed = False

    def _dist_add(self, k: int, app: App) -> None:
        cluster = self._clusters[k]
        units = to_units(app.rate, cluster.dist.quantum)
        cluster.dist.add(units, app.p)
        cluster.units[app.app_id] = (units, app.p)

    def _dist_remove(self, k: int, job_id: JobId) -> None:
        cluster = self._clusters[k]
        units, p = cluster.units.pop(job_id)
        cluster.dist.remove(units, p)

    # -- the decision ----------------------------------------------------------------------
    def allocate(self, view: SystemView) -> dict[JobId, float]:
        active = view.active_jobs()
        if not active:
            return {}
        buffer = view.buffer
        by_id = {j.job_id: j for j in active}
        if buffer is None:  # BIOS: the order, greedy up to the capacity; no clustering kept
            self._updater, self._apps, self._clusters = None, {}, []
            assert isinstance(self.params, DpsacParams)
            delta = self.params.time_unit
            models = {j.job_id: job_model(j, view.periodic.get(j.job_id), delta) for j in active}
            order = self._order(self._efficiencies(view, active, models))
            demand = {j: job.demand for j, job in by_id.items()}
            return dict(greedy_fill([e.app_id for e in order], demand, view.capacity))
        self._sync(view)
        assert self._updater is not None and isinstance(self.params, DpsacParams)
        delta = self.params.time_unit
        clusters = self._updater.clusters
        parts = partition(clusters, self._apps, buffer.size, buffer.drain_bandwidth * delta)
        rng = random.Random(f"dpsac:{view.seed}:{view.now!r}")
        grants: dict[JobId, float] = {}
        for k, members in enumerate(clusters):
            here = [by_id[j] for j in members if j in by_id]
            if not here:
                continue
            part = parts[k]
            load = math.fsum(buffer.resident.get(j, 0.0) for j in members)
            p_full = full_probability(self._clusters[k].dist, part.quota, part.pfs, load)
            order = self._order(self._efficiencies(view, here, self._apps))
            apps = [(e.app_id, self._apps[e.app_id].rate) for e in order]
            tick = schedule(apps, part.pfs, part.quota, load, p_full, rng)
            grants.update((j, volume / delta) for j, volume in tick.granted)
        # the selected jobs, in the global priority order, up to the buffer's bandwidth
        selected = [j for j in active if j.job_id in grants]
        order = self._order(self._efficiencies(view, selected, self._apps))
        left = view.capacity
        rates: dict[JobId, float] = {}
        for e in order:
            job = by_id[e.app_id]
            give = min(grants[e.app_id], job.demand, left)
            if give > 0.0:
                rates[e.app_id] = give
                left -= give
        return rates

    def period(self, view: SystemView) -> float | None:
        """Δ while a burst buffer is modelled and a job does I/O: Algorithm 3 draws again every
        time unit ([DPSAC] §4.4.3), not only at events. None for BIOS (no draws)."""
        if view.buffer is None or not any(j.demand > 0.0 for j in view.jobs.values()):
            return None
        assert isinstance(self.params, DpsacParams)
        return self.params.time_unit

    @property
    def clustering(self) -> list[list[JobId]]:
        """The current clusters' job ids (empty before the first view with a buffer)."""
        return self._updater.clusters if self._updater is not None else []

    def distribution(self, k: int) -> LoadDistribution:
        """Cluster k's Dist (for tests and tools)."""
        return self._clusters[k].dist
