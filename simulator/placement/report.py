"""Figures and readings of a ``burstctl sim placement-sweep`` (docs/simulator.md,
"[DIST-IO] placement"): the paper's figure types as PNGs and, for each ordering the
paper claims (GC < GNC < Random in I/O-spread, the slowdowns, BestBdw at low load), the
paired differences over sets with 95 % confidence intervals.

Sets are grouped by I/O-load(π_sys) (the paper's x axis) in bins of ``BIN`` wide.
"Low load" is I/O-load(π_sys) < ``LOW``, "high load" ≥ ``HIGH``. matplotlib (extra
``[plot]``) is imported only by the plotting functions.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BIN = 0.1
LOW = 0.3
HIGH = 0.8
GNC = "greedy-non-clairvoyant"
GC = "greedy-clairvoyant"

Row = dict[str, Any]


def _key(r: Row) -> tuple[float, int]:
    return (float(r["target"]), int(r["set"]))


def _index(rows: Sequence[Row]) -> dict[tuple[str, str, bool], dict[tuple[float, int], Row]]:
    out: dict[tuple[str, str, bool], dict[tuple[float, int], Row]] = defaultdict(dict)
    for r in rows:
        out[(r["allocator"], r["placement"], bool(r["inaccurate"]))][_key(r)] = r
    return out


def ci95(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of its 95 % confidence interval (normal approximation)."""
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return mean, math.inf
    return mean, 1.96 * statistics.stdev(xs) / math.sqrt(len(xs))


def paired(
    rows: Sequence[Row],
    a: tuple[str, str],
    b: tuple[str, str],
    metric: str,
    keep: Callable[[Row], bool] = lambda r: True,
    relative: bool = False,
    inaccurate: tuple[bool, bool] = (False, False),
) -> tuple[float, float, int, float]:
    """Mean of metric(a) − metric(b) over the sets both ran (and ``keep`` accepts, judged
    on a's row), its 95 % half-width, the number of sets, and the fraction of sets where
    a < b. ``relative``: the difference in % of b."""
    idx = _index(rows)
    ra, rb = idx[(*a, inaccurate[0])], idx[(*b, inaccurate[1])]
    diffs, below = [], 0
    for key, x in ra.items():
        y = rb.get(key)
        if y is None or not keep(x):
            continue
        d = float(x[metric]) - float(y[metric])
        diffs.append(100.0 * d / float(y[metric]) if relative else d)
        below += float(x[metric]) < float(y[metric])
    if not diffs:
        return math.nan, math.nan, 0, math.nan
    mean, half = ci95(diffs)
    return mean, half, len(diffs), below / len(diffs)


def _low(r: Row) -> bool:
    return float(r["load"]) < LOW


def _high(r: Row) -> bool:
    return float(r["load"]) >= HIGH


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares y = slope·x + intercept; returns (slope, intercept, R²)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    intercept = my - slope * mx
    ss_tot = sum((y - my) ** 2 for y in ys)
    ss_res = sum((y - slope * x - intercept) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, intercept, 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0


def _fmt(label: str, res: tuple[float, float, int, float], unit: str = "") -> str:
    mean, half, n, frac = res
    return (
        f"- {label}: mean difference {mean:+.4f}{unit} ± {half:.4f}{unit} (95 % CI), "
        f"{n} sets, first lower in {100 * frac:.0f} %"
    )


def readings(rows: Sequence[Row]) -> list[str]:
    """Markdown lines, one block per ordering the paper claims (module docstring)."""
    acc = [r for r in rows if not r["inaccurate"]]
    allocs = list(dict.fromkeys(r["allocator"] for r in acc))
    n_sets = len({_key(r) for r in acc})
    out = [
        f"Sets: {n_sets} (all load points); low load: I/O-load(π_sys) < {LOW}, "
        f"high load: ≥ {HIGH}.",
        "",
    ]
    out.append("### I/O-spread: GC < GNC < Random (per allocator)")
    for al in allocs:
        out.append(_fmt(f"{al}: GC − GNC", paired(rows, (al, GC), (al, GNC), "io_spread")))
        out.append(
            _fmt(f"{al}: GNC − Random", paired(rows, (al, GNC), (al, "random"), "io_spread"))
        )
    out += ["", "### Mean-I/O-SlowDown: GC ≈ GNC < Random (per allocator, % of the second)"]
    for al in allocs:
        out.append(
            _fmt(
                f"{al}: GC vs GNC",
                paired(rows, (al, GC), (al, GNC), "mean_slowdown", relative=True),
                " %",
            )
        )
        out.append(
            _fmt(
                f"{al}: GNC vs Random",
                paired(rows, (al, GNC), (al, "random"), "mean_slowdown", relative=True),
                " %",
            )
        )
    out += ["", "### Mean-I/O-SlowDown by allocator (GNC placement), mean ± 95 % CI"]
    for name, keep in (("low load", _low), ("high load", _high), ("all", lambda r: True)):
        parts = []
        for al in allocs:
            xs = [
                float(r["mean_slowdown"])
                for r in acc
                if r["allocator"] == al and r["placement"] == GNC and keep(r)
            ]
            if xs:
                m, h = ci95(xs)
                parts.append(f"{al} {m:.3f} ± {h:.3f} (n={len(xs)})")
        out.append(f"- {name}: " + "; ".join(parts))
    out += ["", "### BestBdw best at low load (GNC; BestBdw − other, % of other)"]
    for al in allocs:
        if al != "best-bdw":
            out.append(
                _fmt(
                    f"best-bdw vs {al}, low load",
                    paired(rows, ("best-bdw", GNC), (al, GNC), "mean_slowdown", _low, True),
                    " %",
                )
            )
    out += ["", "### Nsys-Allocator better than BestBdw at high load (GNC, % of BestBdw)"]
    out.append(
        _fmt(
            "nsys-allocator vs best-bdw, high load",
            paired(rows, ("nsys-allocator", GNC), ("best-bdw", GNC), "mean_slowdown", _high, True),
            " %",
        )
    )
    out += ["", "### MCKP worst (GNC; MCKP − other, % of other, all loads)"]
    for al in allocs:
        if al != "mckp":
            out.append(
                _fmt(
                    f"mckp vs {al}",
                    paired(rows, ("mckp", GNC), (al, GNC), "mean_slowdown", relative=True),
                    " %",
                )
            )
    out += ["", "### ρ_con against I/O-load(π_sys) per allocator (GNC), least squares"]
    for al in allocs:
        pts = [
            (float(r["load"]), float(r["rho_con"]))
            for r in acc
            if r["allocator"] == al and r["placement"] == GNC
        ]
        if len(pts) > 2:
            slope, icpt, r2 = linear_fit([p[0] for p in pts], [p[1] for p in pts])
            out.append(
                f"- {al}: ρ_con ≈ {slope:.3f}·load {icpt:+.3f}, R² = {r2:.3f}, {len(pts)} sets"
            )
    out += ["", "### Machine-IdleTime: TCPU-Allocator < BestBdw at high load (GNC)"]
    for name, keep in (("high load", _high), ("low load", _low)):
        out.append(
            _fmt(
                f"tcpu-allocator − best-bdw, {name}",
                paired(rows, ("tcpu-allocator", GNC), ("best-bdw", GNC), "machine_idle_time", keep),
            )
        )
    out += ["", "### Robustness: % worsening of Mean-I/O-SlowDown with profile-class inputs"]
    for al, pl in dict.fromkeys((r["allocator"], r["placement"]) for r in rows if r["inaccurate"]):
        for name, keep in (("all", lambda r: True), ("low load", _low), ("high load", _high)):
            out.append(
                _fmt(
                    f"{al} + {pl}, {name}",
                    paired(rows, (al, pl), (al, pl), "mean_slowdown", keep, True, (True, False)),
                    " %",
                )
            )
        worst = _worst_bin(rows, al, pl)
        if worst is not None:
            out.append(
                f"  - worst load bin: {worst[1]:+.2f} % at I/O-load(π_sys) ≈ "
                f"{worst[0]:.2f} ({worst[2]} sets)"
            )
    return out


def _bins(rows: Sequence[Row]) -> dict[float, list[Row]]:
    out: dict[float, list[Row]] = defaultdict(list)
    for r in rows:
        out[round((math.floor(float(r["load"]) / BIN) + 0.5) * BIN, 6)].append(r)
    return dict(sorted(out.items()))


def _worst_bin(rows: Sequence[Row], al: str, pl: str) -> tuple[float, float, int] | None:
    acc = {
        _key(r): r
        for r in rows
        if r["allocator"] == al and r["placement"] == pl and not r["inaccurate"]
    }
    inac = [r for r in rows if r["allocator"] == al and r["placement"] == pl and r["inaccurate"]]
    worst = None
    for centre, group in _bins(inac).items():
        pct = [
            100 * (float(r["mean_slowdown"]) / float(acc[_key(r)]["mean_slowdown"]) - 1)
            for r in group
            if _key(r) in acc
        ]
        if len(pct) >= 5:
            m = statistics.fmean(pct)
            if worst is None or m > worst[1]:
                worst = (centre, m, len(pct))
    return worst


# ----------------------------------------------------------------------- figures


def _series(
    rows: Sequence[Row], metric: str
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per load bin (≥ 5 sets): centre, mean, 10th and 90th percentile of ``metric``."""
    xs, mean, lo, hi = [], [], [], []
    for centre, group in _bins(rows).items():
        vals = sorted(float(r[metric]) for r in group)
        if len(vals) < 5:
            continue
        q = statistics.quantiles(vals, n=10, method="inclusive")
        xs.append(centre)
        mean.append(statistics.fmean(vals))
        lo.append(q[0])
        hi.append(q[-1])
    return xs, mean, lo, hi


def plots(rows: Sequence[Row], out: Path) -> list[Path]:
    """The PNGs of the paper's figure types into directory ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    acc = [r for r in rows if not r["inaccurate"]]
    allocs = list(dict.fromkeys(r["allocator"] for r in acc))
    places = list(dict.fromkeys(r["placement"] for r in acc))
    paths = []

    def pick(al: str | None, pl: str | None, src: Sequence[Row] = acc) -> list[Row]:
        return [
            r
            for r in src
            if (al is None or r["allocator"] == al) and (pl is None or r["placement"] == pl)
        ]

    def lines(ax: Any, groups: dict[str, list[Row]], metric: str, band: bool = True) -> None:
        for label, group in groups.items():
            xs, m, lo, hi = _series(group, metric)
            if not xs:
                continue
            (line,) = ax.plot(xs, m, marker="o", ms=3, label=label)
            if band:
                ax.fill_between(xs, lo, hi, alpha=0.15, color=line.get_color())
        ax.set_xlabel("I/O-load(π_sys)")
        ax.grid(alpha=0.3)

    def legend(ax: Any, among: Any) -> None:
        """On ``ax``, one entry per label drawn on any of ``among``: a panel without data
        (a placement with no rows) still gets the others' legend, and no figure gets an
        empty one."""
        entries: dict[str, Any] = {}
        for a in among:
            for handle, label in zip(*a.get_legend_handles_labels(), strict=True):
                entries.setdefault(label, handle)
        if entries:
            ax.legend(list(entries.values()), list(entries), fontsize=7)

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    # Fig. 5: Mean-I/O-SlowDown vs load per allocator, one panel per placement
    fig, axes = plt.subplots(
        1, len(places), figsize=(5 * len(places), 4), sharey=True, squeeze=False
    )
    for ax, pl in zip(axes[0], places, strict=True):
        lines(ax, {al: pick(al, pl) for al in allocs}, "mean_slowdown")
        ax.set_title(pl)
        ax.set_yscale("log")
    axes[0][0].set_ylabel("Mean-I/O-SlowDown (mean, 10–90 % band)")
    legend(axes[0][0], axes[0])
    save(fig, "mean_slowdown_vs_load.png")
    # Figs. 6–7: I/O-spread per placement, panels BestBdw / Nsys / Random allocators
    chosen = [a for a in ("best-bdw", "nsys-allocator", "random") if a in allocs] or allocs[:1]
    fig, axes = plt.subplots(
        1, len(chosen), figsize=(5 * len(chosen), 4), sharey=True, squeeze=False
    )
    for ax, al in zip(axes[0], chosen, strict=True):
        lines(ax, {pl: pick(al, pl) for pl in places}, "io_spread")
        ax.set_title(al)
    axes[0][0].set_ylabel("I/O-spread (mean, 10–90 % band)")
    legend(axes[0][0], axes[0])
    save(fig, "io_spread_vs_load.png")
    # Fig. 9: ρ_io and ρ_con vs load per allocator (GNC)
    pl0 = GNC if GNC in places else places[0]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), squeeze=False)
    for ax, metric in zip(axes[0], ("rho_io", "rho_con"), strict=True):
        lines(ax, {al: pick(al, pl0) for al in allocs}, metric, band=False)
        ax.set_title(f"{metric} ({pl0})")
    legend(axes[0][0], axes[0])
    save(fig, "rho_io_rho_con_vs_load.png")
    # Fig. 10: Machine-IdleTime vs load per allocator (GNC)
    fig, ax = plt.subplots(figsize=(6, 4))
    lines(ax, {al: pick(al, pl0) for al in allocs}, "machine_idle_time", band=False)
    ax.set_ylabel("Machine-IdleTime")
    ax.set_title(pl0)
    legend(ax, [ax])
    save(fig, "machine_idle_time_vs_load.png")
    # Fig. 12a: % worsening with profile-class inputs
    inac = [r for r in rows if r["inaccurate"]]
    if inac:
        acc_by = {(r["allocator"], r["placement"], _key(r)): r for r in acc}
        fig, ax = plt.subplots(figsize=(6, 4))
        groups: dict[str, list[Row]] = defaultdict(list)
        for r in inac:
            base = acc_by.get((r["allocator"], r["placement"], _key(r)))
            if base is not None:
                pct = 100 * (float(r["mean_slowdown"]) / float(base["mean_slowdown"]) - 1)
                groups[f"{r['allocator']} + {r['placement']}"].append({**r, "worsening": pct})
        lines(ax, dict(groups), "worsening")
        ax.set_ylabel("Mean-I/O-SlowDown worsening, %")
        legend(ax, [ax])
        save(fig, "robustness_vs_load.png")
    return paths
