"""PerSched against the online bandwidth-sharing strategies, on the same sets.

Owns ``burstctl sim persched-compare``: for a PerSched set ([PERSCHED] §2: apps
``(w, vol_io, β)``, platform ``(b, B)``) it computes PERSCHED's pattern and runs each
of the eight online strategies of the bandwidth-sharing paper ([BWS] §4) in the
bandwidth-sharing simulator (``simulator/bws``) on the equivalent instance, and reports the
same two metrics for all of them: SysEff and Dilation ([PERSCHED] eqs. (1), (2)).

The equivalent instance. Application k becomes one instance line with bandwidth
``β·b`` (GB/s; the simulator clips it to B), work-first phases ``w, vol_io, w, vol_io,
…``, and enough iterations to run solo past the horizon H; the window is cut at H
exactly, and B normalises volumes and caps (``prepare_window(…, bandwidth=B)``).
So an I/O phase alone takes ``vol_io / min(β·b, B) = time_io`` and the model is the
same. Every application starts its first compute phase at t = 0.

The horizon. H = ``periods`` × max(T, maxₖ(w + time_io)), T the PerSched period
(default 10 periods), so that every application runs at least 10 iterations and the
online strategies reach their steady state.

The metrics. PerSched's ρ̃_per = n_per·w/T is the fraction of time an application
computes. For an online run, ρ̃ = ρ·P(H)/H, with P the application's progress in
dedicated-equivalent seconds ([BWS] eq. (6)'s numerator: 1 per second of compute,
β/b per second of I/O at rate β): its completed iterations, each worth
``w + time_io``, plus the dedicated-equivalent part of the current one, over the
elapsed time. Over whole periods of a pattern this is n_per·w/T again, so the columns
are comparable, and since P(H) ≤ H, ρ̃ ≤ ρ: no online strategy can beat the eq. (5)
upper bound. Counting only completed iterations would undercount an application with
few long iterations by up to one iteration over H. SysEff = (1/N) Σ β·ρ̃ and
Dilation = maxₖ ρ/ρ̃ = 1/minₖ(P/H), i.e. the inverse of [BWS]'s MinYield.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from burstctl.policies.persched import (
    JUPITER_TMIN,
    App,
    AppSet,
    PerSchedResult,
    Platform,
    jupiter_set,
    persched,
    rho,
    time_io,
)
from burstctl.policies.persched.synthetic import MACHINES, synthetic_set
from burstctl.simulator.bws.fluid import Run, SimulationError
from burstctl.simulator.bws.instance import (
    WORK_FIRST,
    Application,
    Window,
    prepare_window,
    solo_duration,
)
from burstctl.simulator.bws.runs import create_policy
from burstctl.simulator.campaign import Cluster, Row, RowFile, map_cases, run_campaign

# The eight online strategies of [BWS] (§4.1–§4.3), by their registry names.
ONLINE_STRATEGIES: tuple[str, ...] = (
    "fair-share",
    "fcfs",
    "greedy-yield",
    "greedy-com",
    "periodic-greedy-yield",
    "look-ahead-greedy-yield",
    "set-10",
    "best-next-event",
)
DEFAULT_PERIODS = 10.0


@dataclass(frozen=True, slots=True)
class NamedSet:
    """A set and how the output names it (``set 3``, ``mira seed 7``, a file name)."""

    label: str
    app_set: AppSet
    tmin: float | None = None  # PerSched's T_min; None: maxₖ(w + time_io)


@dataclass(frozen=True, slots=True)
class OnlineResult:
    """One online strategy's run on a set's instance, with PerSched's metrics."""

    strategy: str
    sys_eff: float
    dilation: float  # inf if an application made no progress
    rho_tilde: tuple[float, ...]  # per application, in set order
    iterations: tuple[int, ...]  # completed iterations per application
    events: int
    wall_seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "sys_eff": self.sys_eff,
            "dilation": _finite(self.dilation),
            "rho_tilde": list(self.rho_tilde),
            "iterations": list(self.iterations),
            "events": self.events,
            "wall_seconds": self.wall_seconds,
        }


@dataclass(frozen=True, slots=True)
class Comparison:
    """PerSched, its upper bound and the online strategies on one set."""

    label: str
    app_set: AppSet
    persched: PerSchedResult
    horizon: float  # H, seconds
    online: tuple[OnlineResult, ...]

    @property
    def upper_bound(self) -> float:
        return self.persched.upper_bound

    def best_sys_eff(self) -> OnlineResult:
        """The online strategy of largest SysEff (the first of equals, in run order)."""
        return max(self.online, key=lambda r: r.sys_eff)

    def best_dilation(self) -> OnlineResult:
        """The online strategy of least Dilation (the first of equals, in run order)."""
        return min(self.online, key=lambda r: r.dilation)

    def to_json(self) -> dict[str, Any]:
        p = self.persched
        platform = self.app_set.platform
        best_se, best_dil = self.best_sys_eff(), self.best_dilation()
        return {
            "set": self.label,
            "B": platform.B,
            "b": platform.b,
            "apps": [
                {
                    "name": a.name,
                    "w": a.w,
                    "vol_io": a.vol_io,
                    "beta": a.beta,
                    "time_io": time_io(a, platform),
                    "rho": rho(a, platform),
                }
                for a in self.app_set.apps
            ],
            "upper_bound": self.upper_bound,
            "horizon": self.horizon,
            "persched": {
                "sys_eff": p.sys_eff,
                "dilation": _finite(p.dilation),
                "period": p.period,
                "t_min": p.t_min,
                "counts": [e.n_per for e in p.pattern.apps],
            },
            "online": [r.to_json() for r in self.online],
            "best_online_sys_eff": {"strategy": best_se.strategy, "sys_eff": best_se.sys_eff},
            "best_online_dilation": {
                "strategy": best_dil.strategy,
                "dilation": _finite(best_dil.dilation),
            },
        }

    def rows(self) -> list[dict[str, Any]]:
        """Flat rows (one per method) for CSV: PerSched, the upper bound, each strategy."""
        return csv_rows(self.to_json())


def csv_rows(compared: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`Comparison.rows` of a comparison in its JSON form (`Comparison.to_json`)."""
    p = compared["persched"]
    head = {
        "set": compared["set"],
        "horizon": compared["horizon"],
        "upper_bound": compared["upper_bound"],
    }
    rows = [
        {**head, "method": "persched", "sys_eff": p["sys_eff"], "dilation": p["dilation"]},
        {**head, "method": "upper-bound", "sys_eff": compared["upper_bound"], "dilation": 1.0},
    ]
    rows += [
        {**head, "method": r["strategy"], "sys_eff": r["sys_eff"], "dilation": r["dilation"]}
        for r in compared["online"]
    ]
    return rows


def _infinite(x: float | None) -> float:
    """A Dilation of the JSON form (None: infinite) as a float."""
    return math.inf if x is None else x


def _finite(x: float) -> float | None:
    return None if math.isinf(x) else x


def jupiter(number: int) -> NamedSet:
    """Jupiter set ``number`` of [PERSCHED] Table 2, with the authors' T_min."""
    return NamedSet(f"set {number}", jupiter_set(number), JUPITER_TMIN[number])


def synthetic_sets(machine: str, count: int, seed: int) -> list[NamedSet]:
    """``count`` synthetic sets of ``machine`` (``mira`` or ``intrepid``), seeds
    ``seed`` … ``seed + count − 1``."""
    if machine not in MACHINES:
        raise ValueError(f"machine: must be one of {', '.join(MACHINES)}, got {machine!r}")
    return [
        NamedSet(f"{machine} seed {s}", synthetic_set(MACHINES[machine], s))
        for s in range(seed, seed + count)
    ]


def build_instance(app_set: AppSet, horizon: float) -> list[Application]:
    """The simulator's instance of ``app_set``: per application, work-first phases
    ``w, vol_io, …`` at bandwidth β·b, up to the phase that reaches ``horizon`` solo.

    Phases are counted in the window's own arithmetic (``prepare_window``), so that
    a horizon falling exactly on a phase boundary does not leave a phase cut to 0.
    """
    platform = app_set.platform
    B = platform.B
    instance = []
    for app in app_set.apps:
        bandwidth = app.beta * platform.b
        cap = min(bandwidth, B) / B
        io_duration = (app.vol_io / B) / cap
        values: list[float] = []
        kept = 0.0
        while kept < horizon:
            io = len(values) % 2 == 1
            values.append(app.vol_io if io else app.w)
            kept += io_duration if io else app.w
        instance.append(
            Application(
                name=app.name,
                bandwidth=bandwidth,
                age=0.0,
                progress=0.0,
                age_phase=0.0,
                w_iter=app.w + time_io(app, platform),
                initial_type=WORK_FIRST,
                values=tuple(values),
            )
        )
    return instance


def build_window(app_set: AppSet, horizon: float) -> Window:
    """The prepared window [0, ``horizon``] of ``app_set``'s instance (B normalises)."""
    if not (math.isfinite(horizon) and horizon > 0.0):
        raise ValueError(f"horizon: must be > 0, got {horizon}")
    instance = build_instance(app_set, horizon)
    B = app_set.platform.B
    # T = window × minᵢ Sᵢ: the window that cuts exactly at the horizon
    shortest = min(solo_duration(a, B) for a in instance)
    return prepare_window(instance, min(1.0, horizon / shortest), B)


def run_online(app_set: AppSet, window: Window, strategy: str) -> OnlineResult:
    """Runs ``strategy`` on ``window`` (built from ``app_set``) and measures ρ̃ per
    application, SysEff and Dilation as the module docstring defines them."""
    apps, platform = app_set.apps, app_set.platform
    policy = create_policy(strategy, window)
    started = time.perf_counter()
    run = Run(window, policy, None, 0)
    run.loop()
    wall = time.perf_counter() - started
    H = window.horizon
    rhos = [rho(a, platform) for a in apps]
    fractions = [run._progress_now(i) / H for i in range(len(apps))]  # P(H)/H ≤ 1
    rho_tilde = tuple(r * f for r, f in zip(rhos, fractions, strict=True))
    # work-first: an iteration is complete when its I/O phase is
    iterations = tuple(run.io_completed())
    return OnlineResult(
        strategy=policy.name,
        sys_eff=_sys_eff(apps, rho_tilde, platform),
        dilation=math.inf if min(fractions) <= 0.0 else 1.0 / min(fractions),
        rho_tilde=rho_tilde,
        iterations=iterations,
        events=run.events,
        wall_seconds=wall,
    )


def _sys_eff(apps: Sequence[App], rho_tilde: Sequence[float], platform: Platform) -> float:
    total = math.fsum(a.beta * r for a, r in zip(apps, rho_tilde, strict=True))
    return total / platform.cores(apps)


def horizon_for(app_set: AppSet, period: float, periods: float = DEFAULT_PERIODS) -> float:
    """H = ``periods`` × max(T, maxₖ(w + time_io))."""
    platform = app_set.platform
    longest = max(a.w + time_io(a, platform) for a in app_set.apps)
    return periods * max(period, longest)


def compare(
    named: NamedSet,
    *,
    periods: float = DEFAULT_PERIODS,
    strategies: Sequence[str] = ONLINE_STRATEGIES,
    kprime: float = 10.0,
    epsilon: float = 0.01,
) -> Comparison:
    """PerSched (SysEff objective) and each of ``strategies`` on ``named``'s set."""
    if not (math.isfinite(periods) and periods > 0.0):
        raise ValueError(f"periods: must be > 0, got {periods}")
    if not strategies:
        raise ValueError("strategies: at least one is needed")
    app_set = named.app_set
    result = persched(
        app_set.apps, app_set.platform, kprime=kprime, epsilon=epsilon, tmin=named.tmin
    )
    horizon = horizon_for(app_set, result.period, periods)
    window = build_window(app_set, horizon)
    online = tuple(run_online(app_set, window, s) for s in strategies)
    return Comparison(named.label, app_set, result, window.horizon, online)


@dataclass(frozen=True, slots=True)
class CompareCase:
    """One set of a `compare_many` campaign (``index``: its place in the set list)."""

    named: NamedSet
    periods: float
    strategies: tuple[str, ...]
    index: int = 0


class CompareError(Exception):
    """A set of a campaign that could not be compared: ``kind`` is ``"input"`` (a
    ``ValueError``: the set) or ``"simulation"`` (a ``SimulationError``)."""

    def __init__(self, label: str, kind: str, message: str) -> None:
        super().__init__(f"{label}: {message}")
        self.label = label
        self.kind = kind
        self.message = message


def compare_case(case: CompareCase) -> Comparison | CompareError:
    """`compare` on one set; its failure as a value, so that a campaign reports the first
    failing set of the list whatever the order in which they ran."""
    try:
        return compare(case.named, periods=case.periods, strategies=case.strategies)
    except ValueError as exc:
        return CompareError(case.named.label, "input", str(exc))
    except SimulationError as exc:
        return CompareError(case.named.label, "simulation", str(exc))


def compare_many(
    named: Sequence[NamedSet],
    *,
    periods: float = DEFAULT_PERIODS,
    strategies: Sequence[str] = ONLINE_STRATEGIES,
    where: Cluster | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Comparison]:
    """`compare` on each set, in order, the sets running on ``where`` (`campaign.Cluster`;
    default: in this process). Raises the first failing set's `CompareError`."""
    cases = _cases(named, periods, strategies)
    if where is None:
        results = [compare_case(c) for c in cases]
    else:
        results = map_cases(compare_case, cases, where, progress=progress, label=_label)
    out = []
    for r in results:
        if isinstance(r, CompareError):
            raise r
        out.append(r)
    return out


def _cases(
    named: Sequence[NamedSet], periods: float, strategies: Sequence[str]
) -> list[CompareCase]:
    return [CompareCase(n, periods, tuple(strategies), i) for i, n in enumerate(named)]


def _label(case: CompareCase) -> str:
    return case.named.label


def case_rows(case: CompareCase) -> list[Row]:
    """`compare_case` as the one row of a runs file: ``index``, then the comparison's
    JSON form (`Comparison.to_json`), or ``set`` and its ``error`` (kind, message)."""
    result = compare_case(case)
    if isinstance(result, CompareError):
        error = {"kind": result.kind, "message": result.message}
        return [{"index": case.index, "set": case.named.label, "error": error}]
    return [{"index": case.index, **result.to_json()}]


def _case_key(case: CompareCase) -> Hashable:
    return (case.index, case.named.label)


def _row_key(row: Row) -> Hashable:
    return (int(row["index"]), row["set"])


def runs_file(path: Path, params: Mapping[str, Any] | None = None) -> RowFile[CompareCase]:
    """The runs file of a comparison campaign (``--runs-file``/``--resume``): JSON lines,
    one set per line, keyed by its place in the set list and its label; ``params``: as
    `RowFile`'s."""
    return RowFile(path, "json", ("index", "set"), _case_key, _row_key, lambda _c: 1, params)


def compare_json(
    named: Sequence[NamedSet],
    *,
    periods: float = DEFAULT_PERIODS,
    strategies: Sequence[str] = ONLINE_STRATEGIES,
    where: Cluster | None = None,
    progress: Callable[[str], None] | None = None,
    out: RowFile[CompareCase] | None = None,
    resume: bool = False,
) -> list[dict[str, Any]]:
    """`compare_many` in the JSON form (`Comparison.to_json`), what every output of
    ``sim persched-compare`` is drawn from. ``out`` (`runs_file`): each set's row is
    appended to it as it finishes and the result is read back from its rows; ``resume``:
    the sets already there are not run again. Raises the first failing set's
    `CompareError`."""
    if out is None:
        return [
            c.to_json()
            for c in compare_many(
                named, periods=periods, strategies=strategies, where=where, progress=progress
            )
        ]
    run_campaign(
        case_rows,
        _cases(named, periods, strategies),
        where or Cluster(workers=1),
        out=out,
        resume=resume,
        progress=progress,
        label=_label,
    )
    compared = []
    for (row,) in out.case_rows():
        row.pop("index")
        if "error" in row:
            raise CompareError(row["set"], row["error"]["kind"], row["error"]["message"])
        compared.append(row)
    return compared


# Dilation − 1 below this is drawn at it (a log axis has no 0).
_DILATION_FLOOR = 1e-6


def plot(comparisons: Sequence[Comparison], out: Path) -> Path:
    """`plot_json` of ``comparisons``."""
    return plot_json([c.to_json() for c in comparisons], out)


def plot_json(comparisons: Sequence[Mapping[str, Any]], out: Path) -> Path:
    """Per set (in the JSON form, `Comparison.to_json`), into the PNG file ``out``:
    SysEff over the eq. (5) upper bound (top; the bound is 1) and Dilation − 1 on a log
    axis (bottom; 0 is drawn at 1e-6), for PerSched and each online strategy. The metrics
    differ by fractions of a percent on the uncongested sets, which plain SysEff and
    Dilation axes would hide."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    if not comparisons:
        raise ValueError("no sets to plot")
    labels = [c["set"] for c in comparisons]
    xs = list(range(len(comparisons)))
    strategies = list(dict.fromkeys(r["strategy"] for c in comparisons for r in c["online"]))
    markers = "os^vD<>phX*"
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(max(7.0, 0.9 * len(comparisons) + 4.5), 7.5), sharex=True
    )

    def excess(d: float) -> float:
        return max(d - 1.0, _DILATION_FLOOR)

    top.axhline(1.0, color="k", lw=1.5, label="upper bound (eq. 5)")
    top.plot(
        xs, [c["persched"]["sys_eff"] / c["upper_bound"] for c in comparisons], "r*", ms=12,
        label="PerSched",
    )  # fmt: skip
    bottom.plot(
        xs, [excess(_infinite(c["persched"]["dilation"])) for c in comparisons], "r*", ms=12
    )
    n = max(len(strategies), 1)
    for k, name in enumerate(strategies):
        shift = (k - (n - 1) / 2) * 0.05
        pts = [
            (x + shift, r["sys_eff"] / c["upper_bound"], _infinite(r["dilation"]))
            for x, c in zip(xs, comparisons, strict=True)
            for r in c["online"]
            if r["strategy"] == name
        ]
        marker = markers[k % len(markers)]
        top.plot([p[0] for p in pts], [p[1] for p in pts], marker, ms=5, ls="", label=name)
        finite = [p for p in pts if math.isfinite(p[2])]
        bottom.plot([p[0] for p in finite], [excess(p[2]) for p in finite], marker, ms=5, ls="")
    top.set_ylabel("SysEff / upper bound")
    top.grid(alpha=0.3)
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    bottom.set_ylabel("Dilation − 1 (log)")
    bottom.set_yscale("log")
    bottom.grid(alpha=0.3, which="major")
    bottom.set_xticks(xs, labels, rotation=30, ha="right", fontsize=8)
    top.set_title("PerSched vs the online strategies of [BWS], in the simulator")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def table(comparisons: Iterable[Comparison]) -> list[str]:
    """`table_json` of ``comparisons``."""
    return table_json(c.to_json() for c in comparisons)


def table_json(comparisons: Iterable[Mapping[str, Any]]) -> list[str]:
    """Text lines: per set (in the JSON form, `Comparison.to_json`), PerSched, the upper
    bound and each strategy."""
    lines = []
    for c in comparisons:
        p = c["persched"]
        lines.append(
            f"{c['set']}: upper bound {c['upper_bound']:.4f}, PerSched period"
            f" {p['period']:.6g} s, horizon {c['horizon']:.6g} s"
        )
        lines.append(f"  {'method':<26} {'SysEff':>8} {'Dilation':>9}")
        lines.append(f"  {'PerSched':<26} {p['sys_eff']:>8.4f} {_infinite(p['dilation']):>9.4f}")
        for r in c["online"]:
            lines.append(
                f"  {r['strategy']:<26} {r['sys_eff']:>8.4f} {_infinite(r['dilation']):>9.4f}"
            )
        se, dil = c["best_online_sys_eff"], c["best_online_dilation"]
        lines.append(
            f"  best online SysEff {se['sys_eff']:.4f} ({se['strategy']}),"
            f" best online Dilation {_infinite(dil['dilation']):.4f} ({dil['strategy']})"
        )
    return lines
