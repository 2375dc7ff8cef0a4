"""Simulator speed: one W = 1.1 window (60 applications, h = 2e6) per policy.

Generates one synthetic instance ([BWS] §6.2) with a fixed seed, then times
``simulate`` for each registered policy: wall seconds and decisions per
second. Targets: GreedyYield under 1 s, LookAhead
under 10 s on this machine. Prints JSON.

    python bench/sim_speed.py [--pressure 1.1] [--seed 1] [--policy NAME ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from burstctl.policies.registry import default_registry
from burstctl.simulator.engine import simulate
from burstctl.simulator.generate import GeneratorParams, generate
from burstctl.simulator.instance import prepare_window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pressure", type=float, default=1.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", nargs="+", default=default_registry().names())
    args = parser.parse_args()
    t0 = time.perf_counter()
    window = prepare_window(generate(GeneratorParams(pressure=args.pressure), args.seed))
    setup = time.perf_counter() - t0
    runs = []
    for name in args.policy:
        t0 = time.perf_counter()
        result = simulate(window, name)
        wall = time.perf_counter() - t0
        runs.append(
            {
                "policy": name,
                "wall_seconds": round(wall, 3),
                "decisions": result.events,
                "decisions_per_second": round(result.events / wall),
                "min_yield": round(result.min_yield, 4),
                "efficiency": round(result.efficiency, 4),
            }
        )
    json.dump(
        {
            "benchmark": "sim_speed",
            "pressure": args.pressure,
            "seed": args.seed,
            "setup_seconds": round(setup, 3),
            "runs": runs,
        },
        sys.stdout,
        indent=2,
    )
    print()


if __name__ == "__main__":
    main()
