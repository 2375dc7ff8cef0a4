"""``persched`` across three replicas: one pattern for the whole system, each replica its part.

Three in-process replicas of 20 MiB/s (λ = 0.2 s, b = 8 MiB/s, reserve 0.1), each the others'
peer on loopback gRPC. Three periodic jobs are each on two replicas (a session on each, each
moving half the job's bytes per iteration) and a non-periodic job pumps on one. Every replica
computes the pattern from the merged digests, r1 (the lowest id) announces its origin, and
every replica paces its sessions to its part of each window (docs/replicas.md, "PerSched
across replicas"). Per session: ≤ 1 % of the bytes outside its windows, the iteration time
within 5 % of the pattern's; the non-periodic job gets the reserve, and what the windows
leave on its replica.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
from support import async_wait_until, free_port
from support.periodic import CHUNK, Trace, paced, periodic_loop, pump

from burstctl.client import JobInfo, Session
from burstctl.controller.app import Replica
from burstctl.policies.persched.live import Installed, PerSchedLive

pytestmark = pytest.mark.integration

MiB = 1 << 20
LAMBDA = 0.2
RESERVE = 0.1
CAPACITY = 20 * MiB
# (name, nodes, w s, vol_io bytes of the whole job per iteration, its two replicas)
PERIODIC = [
    ("p1", 2, 0.2, 3 * MiB, (0, 1)),
    ("p2", 2, 0.3, 4 * MiB, (1, 2)),
    ("p3", 1, 0.25, 1 * MiB, (2, 0)),
]


async def three_replicas(make: Callable[..., Awaitable[Replica]]) -> list[Replica]:
    ports = [free_port() for _ in range(3)]
    return [
        await make(
            policy="persched",
            policy_params={"reserve": RESERVE, "kprime": 2},
            capacity="20MiB/s",
            node_bandwidth="8MiB/s",
            grpc_listen=f"127.0.0.1:{ports[i]}",
            replica_id=f"r{i + 1}",
            peers=[f"127.0.0.1:{p}" for j, p in enumerate(ports) if j != i],
            sync_interval=LAMBDA,
        )
        for i in range(3)
    ]


def global_pattern(replica: Replica) -> Installed | None:
    policy = replica.slot.merged
    assert isinstance(policy, PerSchedLive)
    return policy.installed


# Iteration lengths within 5 %: alone, not beside other tests (as test_persched_live.py).
@pytest.mark.serial
async def test_three_replicas_pace_each_job_to_one_pattern_and_the_other_gets_the_reserve(
    replica_factory: Callable[..., Awaitable[Replica]],
) -> None:
    replicas = await three_replicas(replica_factory)
    stop = threading.Event()
    runs: list[tuple[str, Session, Trace]] = []
    for name, nodes, w, vol, placed in PERIODIC:
        for r in placed:
            job = JobInfo(name, "ann", "phys", nodes, w=w, vol_io=vol)
            runs.append((name, Session(replicas[r].grpc_address, job), Trace()))
    other = Session(replicas[0].grpc_address, JobInfo("np", "bob", "chem", 1))
    other_grants: list[float] = []
    # Threads of their own: the loop's default executor is the controllers' (their
    # pattern computations), and seven clients blocked in it would starve them.
    workers: list[threading.Thread] = []
    names = {name for name, *_ in PERIODIC}
    try:
        by_name = {name: (w, vol) for name, _, w, vol, _ in PERIODIC}
        for name, session, trace in runs:
            w, vol = by_name[name]
            args = (session, w, vol // 2, stop, trace)
            workers.append(threading.Thread(target=periodic_loop, args=args, daemon=True))
            workers[-1].start()

        def agreed() -> bool:
            """Every replica holds the pattern of the three jobs, under one key, and every
            session paces to windows of it."""
            installed = [global_pattern(r) for r in replicas]
            keys = {i.computed.key if i is not None else None for i in installed}
            if len(keys) != 1 or None in keys:
                return False
            key = keys.pop()
            assert key is not None
            if {j for j, *_ in key[0]} != names:
                return False
            return all(s.pattern is not None for _, s, _ in runs)

        await async_wait_until(agreed, 20, message="one pattern of the three jobs everywhere")
        installed = global_pattern(replicas[0])
        assert installed is not None and installed.computed.result is not None
        period = installed.computed.result.period
        # Each job's two sessions pace to windows that open at the same instant.
        for name in names:
            origins = [s.pattern.origin % period for n, s, _ in runs if n == name and s.pattern]
            gap = abs(origins[0] - origins[1])
            assert min(gap, period - gap) < 0.01, (name, origins)
        steady = time.monotonic() + 2 * period
        workers.append(threading.Thread(target=pump, args=(other, stop, other_grants)))
        workers[-1].start()
        await async_wait_until(
            lambda: all(sum(1 for s, _ in t.iterations if s >= steady) >= 6 for *_, t in runs),
            30,
            message="6 steady iterations of every periodic session",
        )
        for r in replicas:
            assert global_pattern(r) is not None
            assert global_pattern(r).computed.key == installed.computed.key  # type: ignore[union-attr]
        window_end = time.monotonic()
        share = replicas[0].peer_sync.local_targets if replicas[0].peer_sync else None
        stop.set()
        for t in workers:
            await asyncio.to_thread(t.join, 10)
    finally:
        stop.set()
        for s in (*(s for _, s, _ in runs), other):
            await asyncio.to_thread(s.close)
    report = []
    for name, _, trace in runs:
        got = paced(installed, name, trace, steady, window_end)
        report.append((name, round(got.measured, 5), round(got.predicted, 5), got.outside))
        assert got.outside <= 0.01 * got.grants, report
        assert got.measured == pytest.approx(got.predicted, rel=0.05), report
    got = [t for t in other_grants if steady <= t <= window_end]
    rate = len(got) * CHUNK / (window_end - steady)
    # The whole system's reserve is np's (its only taker), and what the windows' peak leaves
    # on r1 is lent to it: its share there, at least the reserve, at most its cap.
    reserve = RESERVE * 3 * CAPACITY
    assert share is not None
    allotted = share["np"]
    print(f"period {period:.4f} s; (job, measured, predicted, chunks outside): {report}")
    print(f"non-periodic: {rate / MiB:.3f} MiB/s, allotted {allotted / MiB:.3f}, reserve 6")
    assert reserve <= allotted <= 8 * MiB * 1.001
    assert rate == pytest.approx(allotted, rel=0.15)
