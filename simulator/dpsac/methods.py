"""The three schedulers the DPSAC simulator compares ([DPSAC] §5.2): DPSAC (clustered,
probabilistic), MCIOS (the same in one cluster) and BIOS (greedy in priority order).

The algorithms (clustering, partition, Dist, Algorithm 3, priorities, updaters) are those
of ``burstctl.policies.dpsac``; these classes only drive them on a ``model.Simulation``.
"""

from __future__ import annotations

from collections.abc import Sequence

from burstctl.policies.dpsac.algorithm3 import full_probability, schedule
from burstctl.policies.dpsac.clustering import cluster
from burstctl.policies.dpsac.dist import LoadDistribution, to_units
from burstctl.policies.dpsac.model import App
from burstctl.policies.dpsac.partition import Part, partition
from burstctl.policies.dpsac.priorities import Efficiency, minmax
from burstctl.policies.dpsac.updaters import Updater, make_updater
from burstctl.simulator.dpsac.model import Partition, Scheduler, SimApp, Simulation
from burstctl.simulator.dpsac.workloads import (
    NODE_RATE,
)

METHODS: tuple[str, ...] = ("dpsac", "mcios", "bios")
UPDATERS: tuple[str, ...] = ("st", "dt", "ok")
K_MAX = 5  # K_C, the most clusters DPSAC makes ([DPSAC] §4.2)
GAMMA = 0.5  # MinMax-0.5, the priority of all three methods ([DPSAC] §5.2)


def _order(sim: Simulation, apps: Sequence[SimApp]) -> list[SimApp]:
    """``apps`` in MinMax-0.5 order at ``sim.t`` (``policies.dpsac.priorities``)."""
    effs = [Efficiency(str(a.index), a.rho_tilde(sim.t), a.kind.rho, a.kind.nodes) for a in apps]
    by_id = {str(a.index): a for a in apps}
    return [by_id[e.app_id] for e in minmax(effs, GAMMA)]


class Bios:
    """BIOS ([DPSAC] §5.2, after [BWS]-style greedy ordering): one partition (all of S and
    B), every application in I/O granted its B_i in MinMax-0.5 order, whatever the buffer
    holds. The platform then serves them in that order: the PFS first, the buffer while it
    has room, and the rest blocks."""

    name = "bios"

    def layout(self, sim: Simulation) -> None:
        p = sim.params
        sim.partitions = [
            Partition(p.capacity, p.bandwidth, p.time_unit([a.kind for a in sim.apps]))
        ]
        for a in sim.apps:
            a.partition = 0

    def decide(self, sim: Simulation, k: int, active: list[SimApp]) -> list[tuple[SimApp, float]]:
        return [(a, a.kind.bandwidth) for a in _order(sim, active)]

    def join(self, sim: Simulation, app: SimApp) -> None:
        app.partition = 0

    def exit(self, sim: Simulation, app: SimApp) -> None:
        pass


class Probabilistic:
    """DPSAC and MCIOS: Algorithm 3 per partition and time unit ([DPSAC] §4.4.3).

    DPSAC clusters the I/O-phase lengths l_i (Algorithm 1, K ≤ K_C by the elbow rule),
    gives cluster k the quota U_k·S and the PFS share U_k·B (§4.3) and the time unit
    Δ_k = the mean l_i of the cluster; MCIOS is the same with one cluster (U = 1, Δ the
    mean l_i of all applications). Algorithm 3 works in volumes per time unit: a rate B_i
    becomes B_i·Δ_k, and Dist counts in quanta of one node's rate × Δ_k (so B_i is β_i
    quanta). Its grants (volumes per Δ_k) become rates again.

    With an ``updater`` (the join experiment) the clusters are the updater's: a join goes
    into the cluster it names, Dist takes one more pass and U_k are recomputed for every
    partition (levels kept; Δ_k kept); an exit leaves the parameters alone (§4.5: "corrected
    when a new application is added") and takes the application out of Dist. When the
    updater reports ``changed`` (a split, a dropped cluster, a replaced centre), the
    partitions are laid out anew and the data already buffered is spread over them in
    proportion to their quotas."""

    def __init__(self, name: str, clustered: bool, updater: str | None = None) -> None:
        self.name = name
        self.clustered = clustered
        self.updater_name = updater
        self.updater: Updater | None = None
        self.dists: list[LoadDistribution] = []

    @staticmethod
    def model(a: SimApp) -> App:
        return App(str(a.index), a.kind.bandwidth, a.kind.p, a.kind.checkpoint)

    def layout(self, sim: Simulation) -> None:
        present = [a for a in sim.apps if sim.joined[a.index]]
        if self.updater_name is not None:
            self.updater = make_updater(self.updater_name, K_MAX, sim.rng)
            self.updater.on_batch([(str(a.index), a.kind.checkpoint) for a in present])
            self.updater.changed = False
            self._lay_out(sim, self._groups(sim))
        elif not self.clustered or len(present) <= 1:
            self._lay_out(sim, [present])
        else:
            c = cluster([a.kind.checkpoint for a in present], K_MAX)
            self._lay_out(sim, [[present[i] for i in members] for members in c.members])

    def _groups(self, sim: Simulation) -> list[list[SimApp]]:
        assert self.updater is not None
        return [[sim.apps[int(i)] for i in members] for members in self.updater.clusters]

    def _parts(self, sim: Simulation, groups: list[list[SimApp]]) -> list[Part]:
        models = {str(a.index): self.model(a) for g in groups for a in g}
        ids = [[str(a.index) for a in g] for g in groups]
        return partition(ids, models, sim.params.capacity, sim.params.bandwidth)

    def _lay_out(self, sim: Simulation, groups: list[list[SimApp]]) -> None:
        groups = groups or [[]]  # empty clusters stay: indices are the updater's
        total = sum(q.level for q in sim.partitions)
        sim.partitions = []
        self.dists = []
        for k, (g, part) in enumerate(zip(groups, self._parts(sim, groups), strict=True)):
            unit = sim.params.time_unit([a.kind for a in g])
            sim.partitions.append(Partition(part.quota, part.pfs, unit, level=total * part.share))
            dist = LoadDistribution(quantum=NODE_RATE * unit)
            for a in g:
                a.partition = k
                if a.finish is None:
                    dist.add(self._units(a, unit, dist), a.kind.p)
            self.dists.append(dist)

    @staticmethod
    def _units(a: SimApp, unit: float, dist: LoadDistribution) -> int:
        return to_units(a.kind.bandwidth * unit, dist.quantum)

    def decide(self, sim: Simulation, k: int, active: list[SimApp]) -> list[tuple[SimApp, float]]:
        part = sim.partitions[k]
        unit = part.unit
        ordered = _order(sim, active)
        p_full = full_probability(self.dists[k], part.cap, part.share * unit, part.level)
        tick = schedule(
            [(str(a.index), a.kind.bandwidth * unit) for a in ordered],
            part.share * unit,
            part.cap,
            part.level,
            min(1.0, max(0.0, p_full)),
            sim.rng,
        )
        return [(sim.apps[int(i)], v / unit) for i, v in tick.granted]

    def join(self, sim: Simulation, app: SimApp) -> None:
        if self.updater is None:  # no updater: into the closest cluster by time unit
            k = min(
                range(len(sim.partitions)),
                key=lambda k: abs(sim.partitions[k].unit - app.kind.checkpoint),
            )
            groups = [
                [a for a in sim.members(j) if a is not app] for j in range(len(sim.partitions))
            ]
            groups[k].append(app)
        else:
            k = self.updater.on_join(str(app.index), app.kind.checkpoint)
            if self.updater.changed:
                self.updater.changed = False
                self._relayout(sim)
                return
            groups = self._groups(sim)
        app.partition = k
        self.dists[k].add(self._units(app, sim.partitions[k].unit, self.dists[k]), app.kind.p)
        for part, new in zip(sim.partitions, self._parts(sim, groups), strict=True):
            part.cap, part.share = new.quota, new.pfs  # U_k again; levels and Δ_k kept
            part.dirty = True

    def exit(self, sim: Simulation, app: SimApp) -> None:
        if self.updater is not None:
            self.updater.on_exit(str(app.index))
            if self.updater.changed:
                self.updater.changed = False
                self._relayout(sim)
                return
        k = app.partition
        self.dists[k].remove(self._units(app, sim.partitions[k].unit, self.dists[k]), app.kind.p)

    def _relayout(self, sim: Simulation) -> None:
        self._lay_out(sim, self._groups(sim))
        for p in sim.partitions:
            p.dirty = True


def make_scheduler(method: str, updater: str | None = None) -> Scheduler:
    """``dpsac``, ``mcios`` or ``bios`` (an updater only with ``dpsac``)."""
    if method not in METHODS:
        raise ValueError(f"method: must be one of {', '.join(METHODS)}, got {method!r}")
    if updater is not None and method != "dpsac":
        raise ValueError("an updater goes with the dpsac method only")
    if method == "bios":
        return Bios()
    return Probabilistic(method, clustered=method == "dpsac", updater=updater)
