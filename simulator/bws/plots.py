"""Boxplots of sweep results in the style of the bandwidth-sharing paper's Figure 2 ([BWS]).

One panel per pressure W, one box per policy: box at the 25th and 75th
percentiles, whiskers at the 10th and 90th, a marker at the mean (the
convention of [BWS] §6.2.2). Reads the rows ``burstctl sim sweep`` writes.
matplotlib is an optional dependency (extra ``[plot]``), imported only here.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def boxplots(
    rows: Iterable[Mapping[str, Any]],
    out: Path,
    metric: str = "min_yield",
    policies: Sequence[str] | None = None,
) -> Path:
    """Draws ``metric`` per policy and pressure into the PNG file ``out``."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    data: dict[float, dict[str, list[float]]] = {}
    for row in rows:
        if row.get("error"):
            continue
        value = row.get(metric)
        if value in (None, ""):
            raise ValueError(f"rows have no {metric!r} column")
        by_policy = data.setdefault(float(row["pressure_goal"]), {})
        by_policy.setdefault(str(row["policy"]), []).append(float(value))
    if not data:
        raise ValueError("no successful runs to plot")
    names = list(policies) if policies else sorted({p for d in data.values() for p in d})
    pressures = sorted(data)
    fig, axes = plt.subplots(1, len(pressures), figsize=(4 * len(pressures), 4), squeeze=False)
    for ax, w in zip(axes[0], pressures, strict=True):
        present = [p for p in names if data[w].get(p)]
        samples = [data[w][p] for p in present]
        ax.boxplot(samples, whis=(10, 90), showfliers=False, widths=0.6)
        ax.scatter(
            range(1, len(samples) + 1),
            [statistics.fmean(s) for s in samples],
            marker="D",
            s=14,
            zorder=3,
            label="mean",
        )
        ax.set_xticks(range(1, len(present) + 1), present, rotation=60, ha="right", fontsize=8)
        ax.set_title(f"W = {w:g}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel(metric.replace("_", " "))
    axes[0][0].legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
