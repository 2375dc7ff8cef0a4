"""DeficitCom's front and the published strategies' means, per pressure (issue 21).

``run``: simulates ``deficit-com`` with each λ of ``--weights`` and each β of
``--budgets`` (default 0) on the synthetic instances of ``burstctl sim sweep``
(same generator, same seeds, same flags, v1 windows), one CSV row per run with
the sweep's columns; the policy column reads ``deficit-com@λ`` (β = 0) or
``deficit-com@λ/β``. ``plot``: reads sweep CSVs and draws, per pressure, every
strategy's mean MinYield against its mean Efficiency with ± one standard error
(a Pareto plot), and prints the table of means and standard errors.

    python bench/deficit_com_front.py run --weights 0.5 --budgets 0 0.01 0.03 \
        --pressure 1.1 --first-seed 0 --seeds 30 --workers 2 > front.csv
    python bench/deficit_com_front.py plot --csv sweep.csv --csv front.csv --out pareto.png
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from burstctl.policies.deficit_com import DeficitCom, DeficitComParams
from burstctl.simulator.bws.generate import GeneratorParams, generate
from burstctl.simulator.bws.instance import prepare_window
from burstctl.simulator.bws.runs import simulate

# The target of issue 21 at W = 1.1: mean MinYield and mean Efficiency at least these
TARGET = (0.879, 0.895)


def _one(task: tuple[float, int, float, float]) -> dict[str, Any]:
    pressure, seed, weight, budget = task
    win = prepare_window(generate(GeneratorParams(pressure=pressure), seed), 1.0)
    label = f"w{pressure}-nH20-seed{seed}"
    policy = DeficitCom(DeficitComParams(weight=weight, budget=budget))
    result = simulate(win, policy, instance=label)
    row = {"pressure_goal": pressure, "seed": seed, **result.as_dict(), "error": ""}
    row["policy"] = f"deficit-com@{weight:g}" + (f"/{budget:g}" if budget else "")
    return row


def run(
    weights: Sequence[float],
    budgets: Sequence[float],
    pressures: Sequence[float],
    seeds: Sequence[int],
    workers: int,
) -> None:
    tasks = [(w, s, lam, b) for w in pressures for s in seeds for lam in weights for b in budgets]
    writer: csv.DictWriter[str] | None = None
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for row in pool.map(_one, tasks):
            if writer is None:
                writer = csv.DictWriter(sys.stdout, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)
            sys.stdout.flush()


def _se(xs: Sequence[float]) -> float:
    """Standard error of the mean."""
    return statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0


def means(
    rows: Iterable[Mapping[str, str]],
) -> dict[float, dict[str, tuple[float, float, float, float, int]]]:
    """(pressure → policy → (mean MinYield, its SE, mean Efficiency, its SE, n))."""
    samples: dict[float, dict[str, tuple[list[float], list[float]]]] = {}
    for row in rows:
        if row.get("error"):
            continue
        by_policy = samples.setdefault(float(row["pressure_goal"]), {})
        my, ef = by_policy.setdefault(row["policy"], ([], []))
        my.append(float(row["min_yield"]))
        ef.append(float(row["efficiency"]))
    out: dict[float, dict[str, tuple[float, float, float, float, int]]] = {}
    for w, by_policy in samples.items():
        for name, (my, ef) in by_policy.items():
            n = len(my)
            out.setdefault(w, {})[name] = (
                statistics.fmean(my),
                _se(my),
                statistics.fmean(ef),
                _se(ef),
                n,
            )
    return out


def plot(csv_files: Sequence[Path], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: list[dict[str, str]] = []
    for path in csv_files:
        with path.open() as f:
            rows.extend(csv.DictReader(f))
    table = means(rows)
    print("| W | policy | n | MinYield ± SE | Efficiency ± SE |")
    print("|---|---|---|---|---|")
    for w in sorted(table):
        for name, (my, my_se, ef, ef_se, n) in sorted(table[w].items(), key=lambda kv: -kv[1][0]):
            print(f"| {w:g} | {name} | {n} | {my:.4f} ± {my_se:.4f} | {ef:.4f} ± {ef_se:.4f} |")
    pressures = sorted(table)
    names = sorted({n for by_policy in table.values() for n in by_policy})
    colours = {n: plt.get_cmap("tab20")(i % 20) for i, n in enumerate(names)}
    # top row: every strategy; bottom row: the yield-keeping ones, close up
    fig, axes = plt.subplots(2, len(pressures), figsize=(5 * len(pressures), 8.5), squeeze=False)
    for col, w in enumerate(pressures):
        top = max(v[0] for v in table[w].values())
        for row, ax in enumerate(axes[:, col]):
            for name, (my, my_se, ef, ef_se, _) in sorted(table[w].items()):
                if row == 1 and my < top - 0.015:
                    continue
                ours = name.startswith("deficit-com")
                ax.errorbar(
                    ef, my, xerr=ef_se, yerr=my_se, fmt="o" if ours else "s", ms=5,
                    color=colours[name], capsize=2, label=name,
                )  # fmt: skip
            if w == 1.1:
                ax.axhline(TARGET[0], color="grey", ls=":", lw=0.8)
                ax.axvline(TARGET[1], color="grey", ls=":", lw=0.8)
            ax.set_title(f"W = {w:g}" + (" (close up)" if row else "") + ", mean ± 1 SE")
            ax.set_xlabel("Efficiency")
            ax.grid(alpha=0.3)
        axes[0, col].legend(fontsize=6, loc="lower right")
    for ax in axes[:, 0]:
        ax.set_ylabel("MinYield")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--weights", type=float, nargs="+", required=True)
    r.add_argument("--budgets", type=float, nargs="+", default=[0.0])
    r.add_argument("--pressure", type=float, nargs="+", required=True)
    r.add_argument("--first-seed", type=int, default=0)
    r.add_argument("--seeds", type=int, default=30)
    r.add_argument("--workers", type=int, default=1)
    p = sub.add_parser("plot")
    p.add_argument("--csv", type=Path, action="append", required=True)
    p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "run":
        seeds = range(args.first_seed, args.first_seed + args.seeds)
        run(args.weights, args.budgets, args.pressure, seeds, args.workers)
    else:
        plot(args.csv, args.out)


if __name__ == "__main__":
    main()
