"""Decision latency for other jobs while ``persched`` recomputes a pattern.

A real job table and scheduler on this process's event loop (offers go to a null outbox,
no gRPC), policy ``persched``. ``--others`` non-periodic jobs post and complete operations
every ``--interval`` seconds, each event a decision. Then the applications of a Jupiter set
([PERSCHED] Table 2; B = 3 GB/s after the reserve, b = 0.01 GB/s per node) arrive at once as
periodic jobs, and the pattern is recomputed. Measured during the recomputation: the longest
decision (``Scheduler.stats.latencies``) and the longest lag of the loop (a timer that
should fire every ``--interval``). Once with the recomputation offloaded to the worker
thread (the controller's way), once inside the decision (no offload), for comparison.
Prints JSON (and writes it with ``--out``).

    python bench/persched_live.py [--set 2] [--others 100] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from burstctl.controller.config import load_config
from burstctl.controller.jobs import JobTable
from burstctl.controller.records import JobMeta, OpKind
from burstctl.controller.scheduler import Scheduler
from burstctl.controller.state import PolicySlot, StateStore, offload_to_thread
from burstctl.policies.persched import jupiter_set
from burstctl.policies.persched.live import PerSchedLive
from burstctl.policies.registry import default_registry

RESERVE = 0.1


class NullOutbox:
    def offer(self, rate: float, burst: float, epoch: int, lease: float, policy: str) -> None:
        pass


async def run(set_number: int, others: int, interval: float, offload: bool, seed: int) -> dict:
    rng = random.Random(seed)
    apps = jupiter_set(set_number).apps
    b = 0.01e9
    capacity = 3e9 / (1 - RESERVE)  # PERSCHED's B = 3 GB/s after the reserve
    state = tempfile.mkdtemp(prefix="burstctl-bench-")
    config = load_config(capacity=capacity, node_bandwidth=b, state_dir=state)
    table = JobTable(
        time.monotonic,
        heartbeat_timeout=1e9,
        job_retention=1e9,
        demand_headroom=config.demand_headroom,
    )
    slot = PolicySlot(
        default_registry(),
        StateStore(Path(state)),
        ("persched", {"reserve": RESERVE}),
        replica_id="r",
        offload=offload_to_thread if offload else None,  # None: computes in the decision
    )
    scheduler = Scheduler(table, slot, config)
    policy = slot.policy
    assert isinstance(policy, PerSchedLive)
    sessions = []
    for i in range(others):
        s = table.open_session(JobMeta(f"o{i}", "u", "g", 1, 1.0), "c", "h", outbox=NullOutbox())
        sessions.append(s)
    loop_task = asyncio.get_running_loop().create_task(scheduler.run())
    lag: list[tuple[float, float]] = []  # (when, how late)
    stop = asyncio.Event()

    async def drive() -> None:
        op = [0] * others
        due = time.monotonic()
        while not stop.is_set():
            due += interval
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            now = time.monotonic()
            lag.append((now, now - due))
            due = max(due, now)
            i = rng.randrange(others)
            s = sessions[i]
            if s.ops:
                table.complete(s, op[i])
            else:
                op[i] += 1
                table.post(s, op[i], OpKind.WRITE, 1 << 20)

    driver = asyncio.get_running_loop().create_task(drive())
    await asyncio.sleep(0.5)  # warm: decisions for the others alone
    before = len(scheduler.stats.latencies)
    warm = list(scheduler.stats.latencies)
    started = time.monotonic()
    for app in apps:
        meta = JobMeta(
            app.name.replace(" ", "_") + f"-{len(table.jobs)}",
            "u",
            "g",
            max(1, round(app.beta)),
            1.0,
            w=app.w,
            vol_io=app.vol_io * 1e9,
        )
        table.open_session(meta, "c", "h", outbox=NullOutbox())
    deadline = started + 120
    while policy.installed is None and time.monotonic() < deadline:
        await asyncio.sleep(0.001)
    installed_at = time.monotonic()
    # a loop blocked by the decision shows its lag at the driver's next wake-up: wait for it
    await asyncio.sleep(0.05)
    until = time.monotonic()
    stop.set()
    await driver
    loop_task.cancel()
    during = list(scheduler.stats.latencies)[before:]
    lags = [late for when, late in lag if started <= when <= until]
    assert policy.installed is not None, "no pattern within 120 s"
    result = policy.installed.computed.result
    return {
        "offloaded": offload,
        "set": set_number,
        "periodic_jobs": len(apps),
        "other_jobs": others,
        "event_interval_s": interval,
        "recomputation_s": installed_at - started,
        "period_s": None if result is None else result.period,
        "decisions_during": len(during),
        "max_decision_during_ms": 1e3 * max(during, default=0.0),
        "max_decision_warm_ms": 1e3 * max(warm, default=0.0),
        "max_loop_lag_during_ms": 1e3 * max(lags, default=0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", type=int, default=2, help="Jupiter set 1..10 (default 2)")
    parser.add_argument("--others", type=int, default=100)
    parser.add_argument("--interval", type=float, default=0.002, help="s between events")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = [
        asyncio.run(run(args.set, args.others, args.interval, offload, args.seed))
        for offload in (True, False)
    ]
    text = json.dumps({"python": sys.version.split()[0], "runs": rows}, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
