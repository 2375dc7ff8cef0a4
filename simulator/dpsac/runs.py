"""DPSAC experiments: the runs, summaries and campaigns of ``burstctl sim dpsac``,
``sim dpsac-join`` and ``sim dpsac-plot`` (docs/simulator.md, "DPSAC")."""

from __future__ import annotations

import csv
import random
import statistics
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from burstctl.simulator.campaign import Cluster, Row, RowFile, map_cases, run_campaign
from burstctl.simulator.dpsac.methods import METHODS, UPDATERS, make_scheduler
from burstctl.simulator.dpsac.model import Params, Result, Simulation, Step, stderr
from burstctl.simulator.dpsac.workloads import (
    JOINERS,
    KINDS,
    AppKind,
    set_apps,
    table3_apps,
    teio,
    with_instances,
)

DEFAULT_JOINS = 5


def run_seeds(seed: int, runs: int) -> list[int]:
    """The seeds of ``runs`` runs derived from ``seed``: seed, seed + 1, …"""
    return [seed + r for r in range(runs)]


def simulate(
    apps: Sequence[tuple[AppKind, float]],
    method: str,
    seed: int,
    params: Params | None = None,
    updater: str | None = None,
    on_step: Callable[[Step], None] | None = None,
) -> Result:
    """One run of ``method`` on ``apps`` ((kind, arrival) pairs) with ``random.Random(seed)``
    (the releases first, so every method of one seed sees the same releases)."""
    sim = Simulation(
        apps, make_scheduler(method, updater), params or Params(), random.Random(seed), on_step
    )
    sim.run()
    return sim.result(seed)


@dataclass(frozen=True, slots=True)
class Summary:
    """A method's mean over runs."""

    label: str  # "set 3" or "join eap"
    method: str
    runs: int
    sys_eff: float
    sys_eff_se: float
    dilation: float
    dilation_se: float
    sched_seconds: float  # mean CPU seconds in the scheduler per run
    teio_over_b: float
    results: tuple[Result, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "label": self.label,
            "method": self.method,
            "runs": self.runs,
            "sys_eff": self.sys_eff,
            "sys_eff_se": self.sys_eff_se,
            "dilation": self.dilation,
            "dilation_se": self.dilation_se,
            "sched_seconds": self.sched_seconds,
            "teio_over_b": self.teio_over_b,
        }


def summarise(label: str, method: str, results: Sequence[Result], teio_over_b: float) -> Summary:
    se = [r.sys_eff for r in results]
    dil = [r.dilation for r in results]
    return Summary(
        label,
        method,
        len(results),
        statistics.fmean(se),
        stderr(se),
        statistics.fmean(dil),
        stderr(dil),
        statistics.fmean(r.sched_seconds for r in results),
        teio_over_b,
        tuple(results),
    )


def set_workload(number: int) -> list[tuple[AppKind, float]]:
    """Table 2's set ``number``: every application arrives at t = 0."""
    return [(k, 0.0) for k in set_apps(number)]


def join_workload(joiner: str, joins: int = DEFAULT_JOINS) -> list[tuple[AppKind, float]]:
    """Table 3's batch at t = 0, then one ``joiner`` (Table 4) at each m·period, m = 1..joins."""
    if joiner not in JOINERS:
        raise ValueError(f"joiner: must be one of {', '.join(JOINERS)}, got {joiner!r}")
    if joins < 0:
        raise ValueError(f"joins must be >= 0, got {joins}")
    j = JOINERS[joiner]
    kind = with_instances(KINDS[j.kind], j.instances)
    return [(k, 0.0) for k in table3_apps()] + [(kind, m * j.period) for m in range(1, joins + 1)]


@dataclass(frozen=True, slots=True)
class Case:
    """One run of a campaign: ``method`` (with ``updater``) on ``apps`` with ``seed``."""

    label: str
    apps: tuple[tuple[AppKind, float], ...]
    method: str
    seed: int
    params: Params | None
    updater: str | None = None

    def describe(self) -> str:
        return f"{self.label} {self.updater or self.method} seed {self.seed}"


def run_case(case: Case) -> Result:
    return simulate(case.apps, case.method, case.seed, case.params, updater=case.updater)


def case_rows(case: Case) -> list[Row]:
    """`run_case` as the one row of a runs file: the case's keys, then the `Result`."""
    return [{"label": case.label, "updater": case.updater, **asdict(run_case(case))}]


def _case_key(case: Case) -> Hashable:
    return (case.label, case.method, case.updater, case.seed)


def _row_key(row: Row) -> Hashable:
    return (row["label"], row["method"], row["updater"], int(row["seed"]))


def result_of(row: Row) -> Result:
    """The `Result` of a runs-file row (JSON keeps every value exactly)."""
    return Result(**{f.name: row[f.name] for f in fields(Result)})


def runs_file(path: Path, params: Mapping[str, Any] | None = None) -> RowFile[Case]:
    """The runs file of a DPSAC campaign (``--runs-file``/``--resume``): JSON lines, one
    run per line, keyed by (label, method, updater, seed); ``params``: as `RowFile`'s."""
    names = ("label", "updater", *(f.name for f in fields(Result)))
    return RowFile(path, "json", names, _case_key, _row_key, lambda _c: 1, params)


def _run(
    cases: list[Case],
    where: Cluster | None,
    progress: Callable[[str], None] | None,
    out: RowFile[Case] | None = None,
    resume: bool = False,
) -> list[Result]:
    if out is not None:
        # Every run through the file: the summaries come from its rows, resumed or not.
        run_campaign(
            case_rows,
            cases,
            where or Cluster(workers=1),
            out=out,
            resume=resume,
            progress=progress,
            label=Case.describe,
        )
        return [result_of(rows[0]) for rows in out.case_rows()]
    if where is None:
        return [run_case(c) for c in cases]
    return map_cases(run_case, cases, where, progress=progress, label=Case.describe)


def run_set(
    number: int,
    methods: Sequence[str] = METHODS,
    runs: int = 5,
    seed: int = 0,
    params: Params | None = None,
    where: Cluster | None = None,
    progress: Callable[[str], None] | None = None,
    out: RowFile[Case] | None = None,
    resume: bool = False,
) -> list[Summary]:
    """Each method on set ``number``, ``runs`` runs, seeds from ``seed``; the runs on
    ``where`` (`campaign.Cluster`; default: in this process). ``out`` (`runs_file`): each
    run is appended to it as it finishes and the summaries are computed from its rows;
    ``resume``: the runs already there are not run again."""
    return run_sets([number], methods, runs, seed, params, where, progress, out, resume)


def run_sets(
    numbers: Sequence[int],
    methods: Sequence[str] = METHODS,
    runs: int = 5,
    seed: int = 0,
    params: Params | None = None,
    where: Cluster | None = None,
    progress: Callable[[str], None] | None = None,
    out: RowFile[Case] | None = None,
    resume: bool = False,
) -> list[Summary]:
    """`run_set` of each set in ``numbers``, as one campaign."""
    apps = {n: tuple(set_workload(n)) for n in numbers}
    seeds = run_seeds(seed, runs)
    cases = [
        Case(f"set {n}", apps[n], m, s, params) for n in numbers for m in methods for s in seeds
    ]
    results = iter(_run(cases, where, progress, out, resume))
    bandwidth = (params or Params()).bandwidth
    return [
        summarise(
            f"set {n}",
            m,
            [next(results) for _ in seeds],
            teio([k for k, _ in apps[n]]) / bandwidth,
        )
        for n in numbers
        for m in methods
    ]


def run_join(
    joiner: str,
    updaters: Sequence[str] = UPDATERS,
    runs: int = 5,
    seed: int = 0,
    params: Params | None = None,
    joins: int = DEFAULT_JOINS,
    where: Cluster | None = None,
    progress: Callable[[str], None] | None = None,
    out: RowFile[Case] | None = None,
    resume: bool = False,
) -> list[Summary]:
    """DPSAC with each updater on Table 3's batch plus ``joins`` joiners of kind ``joiner``;
    the runs on ``where`` (default: in this process); ``out``, ``resume``: as
    `run_set`'s."""
    apps = tuple(join_workload(joiner, joins))
    ratio = teio([k for k, _ in apps]) / (params or Params()).bandwidth
    seeds = run_seeds(seed, runs)
    cases = [Case(f"join {joiner}", apps, "dpsac", s, params, u) for u in updaters for s in seeds]
    results = iter(_run(cases, where, progress, out, resume))
    return [summarise(f"join {joiner}", u, [next(results) for _ in seeds], ratio) for u in updaters]


def table(summaries: Sequence[Summary], head: str = "method") -> list[str]:
    """A text table: one line per summary."""
    lines = [
        f"{'':<10} {head:<7} {'runs':>4} {'SysEff':>8} {'±se':>7} {'Dilation':>9} {'±se':>7}"
        f" {'sched s':>8} {'TEIO/B':>7}"
    ]
    for s in summaries:
        lines.append(
            f"{s.label:<10} {s.method:<7} {s.runs:>4} {s.sys_eff:>8.4f} {s.sys_eff_se:>7.4f}"
            f" {s.dilation:>9.4f} {s.dilation_se:>7.4f} {s.sched_seconds:>8.3f}"
            f" {s.teio_over_b:>7.4f}"
        )
    return lines


CSV_FIELDS = (
    "label",
    "method",
    "runs",
    "sys_eff",
    "sys_eff_se",
    "dilation",
    "dilation_se",
    "sched_seconds",
    "teio_over_b",
)


def write_csv(summaries: Sequence[Summary], out: Path) -> Path:
    """One row per summary (``CSV_FIELDS``)."""
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        for s in summaries:
            writer.writerow(s.to_json())
    return out


def plot_sets(summaries: Sequence[Summary], out: Path) -> Path:
    """SysEff and Dilation per set, one line per method with standard-error bars (the
    layout of [DPSAC] Fig. 6). matplotlib is imported here only (extra ``[plot]``)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(s.label for s in summaries))
    methods = list(dict.fromkeys(s.method for s in summaries))
    by = {(s.label, s.method): s for s in summaries}
    xs = range(1, len(labels) + 1)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for m in methods:
        rows = [by[(lab, m)] for lab in labels]
        axes[0].errorbar(
            xs, [r.sys_eff for r in rows], yerr=[r.sys_eff_se for r in rows], marker="o", label=m
        )
        axes[1].errorbar(
            xs, [r.dilation for r in rows], yerr=[r.dilation_se for r in rows], marker="o", label=m
        )
    for ax, title in zip(axes, ("SysEff", "Dilation"), strict=True):
        ax.set_xticks(list(xs), [lab.replace("set ", "#") for lab in labels])
        ax.set_xlabel("set (Table 2)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
