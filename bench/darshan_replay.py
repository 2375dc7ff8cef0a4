"""The Darshan replay at full size: every log the ``darshan`` wheel ships under every policy,
and one log's jobs live against a controller beside the simulator.

Part 1 (``logs``, every registered policy): each log of ``darshan/tests/input`` alone, then
``--copies`` copies of it, each ``--stagger-share`` × its run time after the one before
(they contend), then all the logs at once: the jobs, their
I/O phases, the time ``burstctl sim replay`` takes in this process (read, mapping, every
registered policy) and on the command line (a fresh interpreter), and each policy's yields
and metrics.

Part 2 (``live``, the ``--policy`` ones): ``--copies`` copies of ``--live-log`` replayed by
``burstctl sim replay --live`` for ``--live-seconds`` against a ``burstctl controller``
child process (one per policy, stopped by pid), the live yields beside the simulator's and
the tolerance of ``cli/sim/replay_live.py``.

Prints JSON (and writes it with ``--out``).

    python bench/darshan_replay.py [--copies 3] [--stagger-share 0.1] [--bins 100]
        [--live-log sample.darshan] [--live-bins 20] [--live-seconds 30]
        [--policy fair-share --policy fcfs ...] [--skip-live] [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import ControllerProcess

from burstctl.cli.sim.replay_live import (
    controller_env,
    controller_flags,
    tolerance,
)
from burstctl.simulator.replay.darshan import DarshanLog, read_log
from burstctl.simulator.replay.mapping import Replay, replay_jobs
from burstctl.simulator.replay.runs import run_policies

INPUT = Path(str(importlib.resources.files("darshan") / "tests" / "input"))
B_LIVE = 64 << 20


def summary(replay: Replay, policies: list[str]) -> dict[str, Any]:
    started = time.perf_counter()
    runs = run_policies(replay, policies)
    return {
        "jobs": [j.name for j in replay.jobs],
        "io_phases": [replay.io_phases(i) for i in range(len(replay.jobs))],
        "horizon": replay.window.horizon,
        "bandwidth": replay.bandwidth,
        "policies_seconds": time.perf_counter() - started,
        "yields": {
            r.policy: [round(y, 4) for y in r.yields] if r.result else r.error for r in runs
        },
        "metrics": {
            r.policy: [round(r.result.min_yield, 4), round(r.result.efficiency, 4)]
            for r in runs
            if r.result is not None
        },
    }


def cli_seconds(*args: str | Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "burstctl", "sim", "replay", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return time.perf_counter() - started


def logs_part(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    logs: list[DarshanLog] = []
    for path in sorted(INPUT.glob("*.darshan")):
        started = time.perf_counter()
        log = read_log(path)
        read = time.perf_counter() - started
        logs.append(log)
        alone = replay_jobs([log], bins=args.bins)
        stagger = args.stagger_share * alone.jobs[0].span
        copies = replay_jobs([log] * args.copies, bins=args.bins, stagger=stagger)
        out[path.name] = {
            "ranks": log.nprocs,
            "run_time": log.run_time,
            "transfers": len(log.transfers),
            "bytes": log.nbytes,
            "dxt": log.dxt,
            "read_seconds": read,
            "cli_seconds": cli_seconds(path, "--bins", str(args.bins)),
            "alone": summary(alone, []),
            f"copies_{args.copies}_stagger_{stagger:.6g}": summary(copies, []),
        }
    out["all_logs"] = summary(replay_jobs(logs, bins=args.bins), [])
    return out


def live_part(args: argparse.Namespace) -> dict[str, Any]:
    path = INPUT / args.live_log
    log = read_log(path)
    stagger = args.stagger_share * log.run_time
    replay = replay_jobs([log] * args.copies, bins=args.live_bins, stagger=stagger)
    scale = replay.window.horizon / args.live_seconds
    out: dict[str, Any] = {
        "log": args.live_log,
        "copies": args.copies,
        "stagger": stagger,
        "bins": args.live_bins,
        "io_phases": [replay.io_phases(i) for i in range(len(replay.jobs))],
        "horizon": replay.window.horizon,
        "live_seconds": args.live_seconds,
        "time_scale": scale,
        "tolerance": tolerance(replay, scale),
        "policies": {},
    }
    for name in args.policy:
        with tempfile.TemporaryDirectory(prefix="burstctl-replay-") as state:
            ctl = ControllerProcess(
                Path(state),
                ["--policy", name, *controller_flags(replay, B_LIVE)],
                env=controller_env(replay),
            )
            ctl.start()
            try:
                assert ctl.address is not None
                # the command itself, in a process of its own, as a user runs it
                done = subprocess.run(
                    [
                        sys.executable, "-m", "burstctl", "sim", "replay",
                        *[str(path)] * args.copies, "--bins", str(args.live_bins),
                        "--stagger", repr(stagger), "--policy", name, "--live", ctl.address,
                        "--live-bandwidth", str(B_LIVE), "--time-scale", repr(scale),
                        "--format", "json",
                    ],
                    capture_output=True, text=True, check=False, timeout=args.live_seconds + 60,
                )  # fmt: skip
            finally:
                ctl.stop()
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        out["policies"][name] = [
            {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
            for row in json.loads(done.stdout)["jobs"]
        ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--stagger-share", type=float, default=0.1)
    parser.add_argument("--bins", type=int, default=100)
    parser.add_argument("--live-log", default="sample.darshan")
    parser.add_argument("--live-bins", type=int, default=20)
    parser.add_argument("--live-seconds", type=float, default=30.0)
    parser.add_argument("--policy", action="append", default=[])
    parser.add_argument("--skip-live", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not args.policy:
        args.policy = ["fair-share", "fcfs", "greedy-yield", "size-fair"]
    result: dict[str, Any] = {"logs": logs_part(args)}
    if not args.skip_live:
        result["live"] = live_part(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
