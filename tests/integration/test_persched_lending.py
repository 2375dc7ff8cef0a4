"""PerSched's loans, live (docs/persched.md, "Loans"): a periodic job that leaves its window
unused (it moved a light iteration's bytes early) lends the rest of it to the job of the
reserve, and the rates in force at the clients never sum above B.

A real controller in this test's event loop, real client sessions on their own threads; a
sampler thread reads, every 2 ms, the rate each session paces at then (its pattern's
rate at that instant, or its plain rate) and sums them.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Awaitable, Callable

import pytest
from support import async_wait_until
from support.periodic import (
    CHUNK,
    WINDOWS,
    Plan,
    Steady,
    Trace,
    installed_for,
    late,
    periodic_loop,
    pump,
    steady_windows,
)

from burstctl.client import JobInfo, Session
from burstctl.client.bucket import Pattern
from burstctl.controller.app import Replica
from burstctl.policies.persched.lending import MIN_LOAN
from burstctl.policies.persched.live import PerSchedLive

pytestmark = pytest.mark.integration

MiB = 1 << 20
RESERVE = 0.1
GRACE = 0.05  # the default
# A sample this close to a window's edge in some session's pattern is not counted: the clients'
# phases differ by the difference of their messages' one-way delays (docs/protocol.md,
# "Windows"), so two jobs' touching windows may overlap by that much.
EDGE = 0.003
# (name, nodes, declared w, declared vol_io); p2 lends
PERIODIC = [("p1", 2, 0.2, 3 * MiB), ("p2", 2, 0.3, 4 * MiB), ("p3", 1, 0.25, 1 * MiB)]


def lender_plan(w: float, vol: int) -> Plan:
    """Compute between w/2 and w (seeded), and every other iteration a quarter of vol_io."""
    rng = random.Random(31)
    return lambda i: (w * rng.uniform(0.5, 1.0), vol if i % 2 == 0 else vol // 4)


def in_force(held: tuple[Pattern | None, float], t: float) -> float:
    pattern, rate = held
    return pattern.rate_at(t) if pattern is not None else rate


def near_an_edge(pattern: Pattern | None, t: float) -> bool:
    if pattern is None:
        return False
    return len({pattern.rate_at(t - EDGE), pattern.rate_at(t), pattern.rate_at(t + EDGE)}) > 1


def snapshot(sessions: list[Session]) -> tuple[float, list[tuple[Pattern | None, float]]]:
    """What every session held at one instant: read twice around that instant, again until
    no session's pattern or rate changed between its two reads (then each held the same
    from its first read to its second, so all of them at the instant between). One read
    alone may take one session's before a change and another's after the change it made
    room for (the sampler's thread can lose the interpreter between two sessions)."""
    while True:
        first = [(s.pattern, s.rate) for s in sessions]
        t = time.monotonic()
        second = [(s.pattern, s.rate) for s in sessions]
        if all(a[0] is b[0] and a[1] == b[1] for a, b in zip(first, second, strict=True)):
            return t, first


def sample(sessions: list[Session], stop: threading.Event, sums: list[float], skipped: list[int]):
    while not stop.is_set():
        t, held = snapshot(sessions)
        if any(near_an_edge(pattern, t) for pattern, _ in held):
            skipped.append(1)
        else:
            sums.append(sum(in_force(h, t) for h in held))
        time.sleep(0.002)  # (its own load: the clients and controller share two cores)


@pytest.mark.serial
async def test_a_window_left_unused_is_lent_to_the_reserve_and_the_sum_stays_within_b(
    replica_factory: Callable[..., Awaitable[Replica]],
) -> None:
    replica = await replica_factory(
        policy="persched",
        policy_params={"reserve": RESERVE, "kprime": 2, "lend_grace": GRACE},
    )
    policy = replica.slot.policy
    assert isinstance(policy, PerSchedLive)
    capacity = replica.config.capacity
    stop = threading.Event()
    sessions = [
        Session(replica.grpc_address, JobInfo(name, "ann", "phys", nodes, w=w, vol_io=vol))
        for name, nodes, w, vol in PERIODIC
    ]
    borrower = Session(replica.grpc_address, JobInfo("np", "bob", "chem", 4))
    plans = [None, lender_plan(0.3, 4 * MiB), None]
    traces = {name: Trace() for name, *_ in PERIODIC}
    borrowed: list[float] = []
    sums: list[float] = []
    skipped: list[int] = []
    sample_stop = threading.Event()
    threads = [
        threading.Thread(
            target=periodic_loop,
            args=(s, w, vol, stop, trace),
            kwargs={"plan": plan},
        )
        for s, (_, _, w, vol), plan, trace in zip(
            sessions, PERIODIC, plans, traces.values(), strict=True
        )
    ]
    threads.append(threading.Thread(target=pump, args=(borrower, stop, borrowed)))
    sampler = threading.Thread(
        target=sample, args=([*sessions, borrower], sample_stop, sums, skipped)
    )
    reserve = RESERVE * capacity

    def lent_and_got(window: Steady) -> tuple[float, float, float]:
        """Over the whole periods of ``window`` from the first after its steady point: the
        window time the lender left (each span of its windows without a chunk of its, after
        the window's head: a window opens to the lender first, at the window's rate), what
        the borrower got, and the span."""
        lender = traces["p2"].pattern
        assert lender is not None
        period = window.installed.computed.result.period
        first = lender.origin + ((window.steady - lender.origin) // period + 1) * period
        schedule = window.installed.schedules["p2"]
        chunk_time = CHUNK / schedule.peak_rate()
        lent = 0.0
        k = 0
        while first + (k + 1) * period <= window.end:
            for w in schedule.windows:
                a, b = first + k * period + w.start, first + k * period + w.end
                marks = [a, *(t for t in traces["p2"].grants if a <= t < b), b]
                for before, after in itertools.pairwise(marks):
                    idle = after - max(before, a + max(GRACE, MIN_LOAN)) - chunk_time
                    lent += max(0.0, idle) * w.rate
            k += 1
        span = k * period
        return lent, sum(CHUNK for t in borrowed if first <= t < first + span), span

    def misses(window: Steady) -> list[str]:
        # The lender keeps the pattern's iteration (p1 and p3 lend only when late; that they
        # keep their iterations is test_persched_live.py's, alone, not beside this sampler);
        # the borrower got the reserve and most of what was lent.
        lent, got, span = lent_and_got(window)
        short = got < reserve * span + 0.7 * lent
        return late(window, {"p2"}) + ([f"borrowed {got} of {lent} lent"] if short else [])

    try:
        for thread in threads:
            thread.start()
        installed = await installed_for(policy, set(traces), 10)
        assert installed.computed.result is not None
        period = installed.computed.result.period
        warm = time.monotonic() + 2 * period
        await async_wait_until(lambda: time.monotonic() >= warm, 10, message="warm-up")
        sampler.start()
        # Windows of 8 iterations of every job; in each, every job stays in its windows.
        windows = await steady_windows(policy, installed, traces, 8, 30, misses)
        sample_stop.set()
        stop.set()
        await async_wait_until(
            lambda: not any(t.is_alive() for t in [*threads, sampler]), 10, message="the end"
        )
    finally:
        stop.set()
        sample_stop.set()
        for s in (*sessions, borrower):
            await asyncio.to_thread(s.close)
    # 1. The rates in force at the clients never sum above B, over every window taken.
    tolerance = 1 + replica.config.push_tolerance
    assert len(sums) >= 2 * len(skipped), (len(sums), len(skipped))
    assert max(sums) <= capacity * tolerance, (max(sums) / capacity, len(sums))
    # 2. The borrower got the window time the lender left; the lender kept its iteration.
    window = windows[-1]
    lent, got, span = lent_and_got(window)
    print(f"period {period:.4f} s; per job: {window.report}")
    print(
        f"borrower: {got / span / MiB:.3f} MiB/s for a reserve of {reserve / MiB:.3f} MiB/s and"
        f" {lent / span / MiB:.3f} MiB/s lent; max Σ in force {max(sums) / capacity:.4f} B over"
        f" {len(sums)} samples ({len(skipped)} at an edge); window {len(windows)} of {WINDOWS}"
    )
    assert lent > 0.1 * reserve * span  # the scenario lends
    assert not window.missed, (window.missed, window.report)
