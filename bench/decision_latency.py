"""Decision latency of the scheduler alone, without gRPC.

Builds a job table with N sessions (one job each), then repeats: apply K random
events (post, completion, usage report), make one decision (view → policy →
clamp → split → offers). Times each decision with perf_counter. Offers go to a
null outbox, so what is measured is the controller's own work per decision
(the target: p99 ≤ 2 ms at 1,000 jobs). Prints JSON.

    python bench/decision_latency.py [--sessions 10 100 1000] [--events 1 16]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from burstctl.controller.config import load_config
from burstctl.controller.jobs import JobMeta, JobTable, OpKind
from burstctl.controller.scheduler import Scheduler
from burstctl.controller.state import PolicySlot, StateStore
from burstctl.policies.registry import default_registry


class NullOutbox:
    def offer(self, rate: float, burst: float, epoch: int, lease: float, policy: str) -> None:
        pass


def run(sessions: int, events: int, decisions: int, policy_name: str, seed: int) -> dict:
    rng = random.Random(seed)
    now = [0.0]
    state = tempfile.mkdtemp(prefix="burstctl-bench-")
    config = load_config(
        capacity="1GiB/s", node_bandwidth="256MiB/s", release_delay=0.0, state_dir=state
    )
    table = JobTable(
        lambda: now[0],
        heartbeat_timeout=1e9,
        job_retention=1e9,
        demand_headroom=config.demand_headroom,
    )
    slot = PolicySlot(
        default_registry(), StateStore(Path(state)), (policy_name, {}), replica_id="r"
    )
    scheduler = Scheduler(table, slot, config, clock=lambda: now[0])
    sess = []
    for i in range(sessions):
        meta = JobMeta(f"j{i}", "u", "g", rng.choice([1, 2, 4, 8]), 1.0)
        s = table.open_session(meta, "c", "h", outbox=NullOutbox())
        sess.append(s)
    open_op = [0] * sessions
    next_op = [0] * sessions
    scheduler.rebalance()
    samples = []
    active = []
    for _ in range(decisions):
        for _ in range(events):
            now[0] += 1e-4
            i = rng.randrange(sessions)
            r = rng.random()
            if open_op[i] and r < 0.4:
                table.complete(sess[i], open_op[i])
                open_op[i] = 0
            elif not open_op[i] and r < 0.8:
                next_op[i] += 1
                open_op[i] = next_op[i]
                table.post(sess[i], open_op[i], OpKind.WRITE, rng.choice([0, 1 << 26]))
            else:
                table.usage(
                    sess[i], rng.randrange(1 << 22), 8, rng.random() * 0.1, 0.25, rng.random() < 0.5
                )
        active.append(sum(1 for o in open_op if o))
        t0 = time.perf_counter()
        scheduler.rebalance()
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return {
        "sessions": sessions,
        "events_per_decision": events,
        "decisions": decisions,
        "active_jobs_mean": round(statistics.fmean(active), 1),
        "decision_ms": {
            "p50": round(samples[len(samples) // 2] * 1e3, 4),
            "p99": round(samples[int(0.99 * len(samples))] * 1e3, 4),
            "max": round(samples[-1] * 1e3, 4),
        },
        "pushes_per_decision": round(scheduler.stats.pushes / decisions, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--events", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--decisions", type=int, default=3000)
    parser.add_argument("--policy", default="fair-share")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    # the controller's own collector settings (cli/daemon.py)
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)
    report = {
        "benchmark": "decision_latency",
        "policy": args.policy,
        "runs": [
            run(n, k, args.decisions, args.policy, args.seed)
            for k in args.events
            for n in args.sessions
        ],
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
