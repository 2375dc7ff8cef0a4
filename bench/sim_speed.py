"""Simulator speed against the authors' C++ simulator, on one W = 1.1 window.

Generates one synthetic instance ([BWS] §6.2: 60 applications, h = 2e6) with a
fixed seed, writes it to a file, and per bandwidth-sharing strategy reports:

- ``loop_seconds``: the ``simulate`` call on the prepared window (the event
  loop and the metrics; the window is parsed and prepared once, outside);
- ``process_seconds``: a fresh ``python -m burstctl sim run`` on the file,
  timed from outside (interpreter start-up, imports, parsing included);
- ``cpp_seconds``: the authors' simulator ([BWS-SIM] ``simu.cc``, built with
  ``g++ -O2``) on the same file, whole process, timed from outside, when
  ``--reference-simu`` gives its binary; otherwise the figures recorded in
  ``RECORDED_CPP`` (labelled ``cpp_source: recorded``);
- ``loop_over_cpp``: loop_seconds / cpp_seconds (the target is ≤ 3).

Every time is the median of ``--repeats`` runs (the machine is shared and noisy).
``--profile`` adds each strategy's top functions by own time (cProfile) to the
JSON. Prints JSON.

    python bench/sim_speed.py [--pressure 1.1] [--seed 1] [--repeats 5]
        [--policy NAME ...] [--reference-simu /tmp/stochasticIO/simu]
        [--no-process] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from burstctl.simulator.bws.generate import GeneratorParams, generate
from burstctl.simulator.bws.instance import format_instance, prepare_window
from burstctl.simulator.bws.runs import simulate

# Our strategy → the reference's heuristic name (set-10 learns ω: Set10Learn;
# periodic-greedy-yield is the reference's fixedWindow).
REFERENCE_NAMES = {
    "fcfs": "FCFS",
    "fair-share": "fairShare",
    "set-10": "Set10Learn",
    "greedy-yield": "greedyYield",
    "greedy-com": "greedyCom",
    "look-ahead-greedy-yield": "lookAheadGreedyYield",
    "periodic-greedy-yield": "fixedWindow",
    "best-next-event": "nextEvLexMin",
}

# The C++ simulator on this instance (W = 1.1, seed 1), whole process, seconds, on the
# 2-core sandbox, 2026-11-25, g++ 12 -O2: medians of 5 under light load; best-next-event
# one run (docs/benchmarks.md).
RECORDED_CPP = {
    "fcfs": 0.091,
    "fair-share": 0.108,
    "set-10": 0.141,
    "greedy-yield": 0.115,
    "greedy-com": 0.114,
    "look-ahead-greedy-yield": 0.265,
    "periodic-greedy-yield": 0.148,
    "best-next-event": 10.6,
}


def _median_wall(command: list[str], repeats: int, cwd: str | None = None) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(command, check=True, cwd=cwd, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _cpp_seconds(simu: Path, instance: Path, policy: str, repeats: int, tmp: str) -> float:
    args = Path(tmp, f"args_{policy}.txt")
    out = Path(tmp, f"out_{policy}.txt")
    args.write_text(f"{instance} 1 1 {REFERENCE_NAMES[policy]} v1 {out}\n")
    return _median_wall([str(simu), str(args)], repeats, cwd=tmp)


def _profile(window: Any, policy: str, top: int = 6) -> list[dict[str, Any]]:
    profiler = cProfile.Profile()
    profiler.enable()
    simulate(window, policy)
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (filename, line, func), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{Path(filename).name}:{line}({func})",
                "calls": calls,
                "own_seconds": round(own, 3),
                "cumulative_seconds": round(cumulative, 3),
            }
        )
    rows.sort(key=lambda r: -r["own_seconds"])
    return rows[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pressure", type=float, default=1.1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--policy", nargs="+", default=list(REFERENCE_NAMES))
    parser.add_argument("--reference-simu", type=Path, help="the authors' simu binary")
    parser.add_argument("--no-process", action="store_true", help="skip the subprocess times")
    parser.add_argument("--profile", action="store_true", help="add a cProfile summary")
    args = parser.parse_args()
    instance = generate(GeneratorParams(pressure=args.pressure), args.seed)
    window = prepare_window(instance)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, f"w{args.pressure}_{args.seed}.txt")
        path.write_text(format_instance(instance))
        for name in args.policy:
            loops = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                result = simulate(window, name)
                loops.append(time.perf_counter() - t0)
            loop = statistics.median(loops)
            run: dict[str, Any] = {
                "policy": name,
                "decisions": result.events,
                "loop_seconds": round(loop, 4),
                "loop_seconds_min": round(min(loops), 4),
                "decisions_per_second": round(result.events / loop),
                "min_yield": result.min_yield,
                "efficiency": result.efficiency,
            }
            if not args.no_process:
                command = [sys.executable, "-m", "burstctl", "sim", "run", "--policy", name]
                command += ["--instance", str(path)]
                run["process_seconds"] = round(_median_wall(command, args.repeats), 4)
            if name in REFERENCE_NAMES:
                if args.reference_simu is not None:
                    simu = args.reference_simu.resolve()
                    cpp = _cpp_seconds(simu, path, name, args.repeats, tmp)
                    run["cpp_seconds"], run["cpp_source"] = round(cpp, 4), "measured"
                else:
                    cpp = RECORDED_CPP[name]
                    run["cpp_seconds"], run["cpp_source"] = cpp, "recorded"
                run["loop_over_cpp"] = round(loop / cpp, 2)
            if args.profile:
                run["profile"] = _profile(window, name)
            runs.append(run)
            print(json.dumps(run), file=sys.stderr)  # progress
    json.dump(
        {
            "benchmark": "sim_speed",
            "pressure": args.pressure,
            "seed": args.seed,
            "applications": len(window.apps),
            "horizon": window.horizon,
            "repeats": args.repeats,
            "statistic": "median",
            "cpus": os.cpu_count(),
            "runs": runs,
        },
        sys.stdout,
        indent=2,
    )
    print()


if __name__ == "__main__":
    main()
