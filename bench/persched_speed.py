"""PERSCHED pattern computation time: the ten Jupiter sets and 100 synthetic Mira sets.

For each Jupiter set of [PERSCHED] Table 2 (K' = 10, ε = 0.01, the authors' T_min)
the best of ``--repeat`` wall times of ``persched``, with the periods built and the
periods skipped by their bound; then the same for ``--synthetic`` seeded Mira sets
([PERSCHED] §4.4, T_min = max(w + time_io)), summarised. Target: every Jupiter set
under 2 s. [PERSCHED] §4.3 reports 4 ms (set 10) to 1.8 s (set 5) in C++. Prints JSON.

    python bench/persched_speed.py [--repeat 3] [--synthetic 100] [--machine mira]
                                   [--no-prune]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable

from burstctl.policies.persched import JUPITER_TMIN, PerSchedResult, jupiter_set, persched
from burstctl.policies.persched.synthetic import MACHINES, synthetic_set


def _timed(run: Callable[[], PerSchedResult], repeat: int) -> tuple[float, PerSchedResult]:
    best = float("inf")
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - t0)
    assert result is not None
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--synthetic", type=int, default=100)
    parser.add_argument("--machine", choices=sorted(MACHINES), default="mira")
    parser.add_argument("--no-prune", action="store_true", help="Build every period.")
    args = parser.parse_args()
    prune = not args.no_prune
    jupiter = []
    for number in range(1, 11):
        s = jupiter_set(number)
        wall, r = _timed(
            lambda s=s, n=number: persched(s.apps, s.platform, tmin=JUPITER_TMIN[n], prune=prune),
            args.repeat,
        )
        jupiter.append(
            {
                "set": number,
                "seconds": round(wall, 4),
                "sys_eff": round(r.sys_eff, 6),
                "dilation": round(r.dilation, 6),
                "period": round(r.period, 2),
                "max_instances": max(r.pattern.counts()),
                "periods_built": r.periods_built,
                "periods_skipped": r.periods_skipped,
            }
        )
    machine = MACHINES[args.machine]
    times, ratios, built = [], [], []
    for seed in range(args.synthetic):
        s = synthetic_set(machine, seed)
        wall, r = _timed(lambda s=s: persched(s.apps, s.platform, prune=prune), 1)
        times.append(wall)
        ratios.append(r.sys_eff / r.upper_bound)
        built.append(r.periods_built)
    synthetic = {
        "machine": machine.name,
        "sets": args.synthetic,
        "seeds": f"0-{args.synthetic - 1}",
        "seconds_min": round(min(times), 4),
        "seconds_median": round(statistics.median(times), 4),
        "seconds_max": round(max(times), 4),
        "seconds_total": round(sum(times), 3),
        "sys_eff_over_upper_bound_mean": round(statistics.fmean(ratios), 4),
        "periods_built_median": statistics.median(built),
    }
    json.dump(
        {
            "benchmark": "persched_speed",
            "python": platform.python_version(),
            "prune": prune,
            "repeat": args.repeat,
            "jupiter": jupiter,
            "jupiter_max_seconds": max(row["seconds"] for row in jupiter),
            "synthetic": synthetic,
        },
        sys.stdout,
        indent=2,
    )
    print()


if __name__ == "__main__":
    main()
