"""Split speed: one ``split`` call over J jobs × R replicas.

Builds seeded instances with B_r ∈ [500, 1500], d_jr ∈ [0, 5] and
t_j ∈ [0, 10], each job on 1–3 random replicas ("spread", at most R) or on every replica
("everywhere"), and times ``controller.split.split`` on each (on a ``SplitProblem``
built outside the timing from the arrays a replica's merge holds, as an exchange
calls it): milliseconds per call, best of --repeat. Target: the exchange of 1,000
jobs among 8 replicas costs under 10 % of one core at λ = 500 ms with all 8
replicas on one 2-core machine, i.e. ≤ 5 ms per call. Prints JSON.

    python bench/split_speed.py [--jobs 10 100 1000] [--replicas 2 4 8] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from burstctl.controller.split import Edge, SplitProblem, split

Instance = tuple[dict[str, float], dict[str, float], dict[Edge, float]]
PLACEMENTS = ("spread", "everywhere")


def instance(jobs: int, replicas: int, placement: str, seed: int) -> Instance:
    rng = random.Random(seed)
    names = [f"r{i:02d}" for i in range(replicas)]
    capacity = {r: rng.uniform(500.0, 1500.0) for r in names}
    demand: dict[Edge, float] = {}
    for i in range(jobs):
        spread = rng.sample(names, rng.randint(1, min(3, replicas)))
        for r in names if placement == "everywhere" else spread:
            demand[(f"j{i:05d}", r)] = rng.uniform(0.0, 5.0)
    targets = {f"j{i:05d}": rng.uniform(0.0, 10.0) for i in range(jobs)}
    return targets, capacity, demand


def best_ms(call: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def problem(inst: Instance) -> SplitProblem:
    """``inst`` as ``split`` takes it."""
    targets, capacity, demand = inst
    jobs = sorted({j for j, _ in demand})
    replicas = sorted(capacity)
    job_index = {j: i for i, j in enumerate(jobs)}
    replica_index = {r: i for i, r in enumerate(replicas)}
    return SplitProblem(
        jobs,
        replicas,
        np.array([targets.get(j, 0.0) for j in jobs]),
        np.array([capacity[r] for r in replicas]),
        np.array([job_index[j] for j, _ in demand], dtype=np.intp),
        np.array([replica_index[r] for _, r in demand], dtype=np.intp),
        np.array(list(demand.values())),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--replicas", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    runs = []
    for placement in PLACEMENTS:
        for replicas in args.replicas:
            for jobs in args.jobs:
                inst = instance(jobs, replicas, placement, args.seed)
                checked = problem(inst)
                runs.append(
                    {
                        "placement": placement,
                        "jobs": jobs,
                        "replicas": replicas,
                        "edges": len(inst[2]),
                        "ms_per_call": round(best_ms(partial(split, checked), args.repeat), 3),
                    }
                )
    json.dump(
        {
            "benchmark": "split_speed",
            "seed": args.seed,
            "repeat": args.repeat,
            "target_ms_1000_jobs_8_replicas": 5.0,
            "runs": runs,
        },
        sys.stdout,
        indent=2,
    )
    print()


if __name__ == "__main__":
    main()
