"""Never past capacity at any scale: hundreds of sessions over several nodes (client runtimes)
wanting 3× B, against a controller process stopped on purpose (SIGSTOP) before they arrive,
resumed, stopped again past their leases, grace and budget step, and resumed. The sum of the
rates in force at the clients, sampled every 100 ms, stays within B(1 + push tolerance) while
they wait for admission, while they are served, while the controller is stopped and while they
come back after it resumes (docs/client.md, "When the controller is away"). Each node carries its
sessions on one Node stream; a session whose lease ran out leaves it saying what it goes on
pacing at, and the resumed controller counts that until the session is back.

Under a per-session constant (the former conservative rate of a session that never attached, or
of a kept 0 past the grace) the sum would reach sessions × that constant: 600 MiB/s here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import pytest
from support import ControllerProcess, wait_until

from burstctl.client.core import SessionCore
from burstctl.client.job import JobInfo
from burstctl.client.options import SessionOptions
from burstctl.client.runtime import ClientRuntime
from burstctl.controller.config import ControllerConfig

pytestmark = pytest.mark.integration

MiB = 1 << 20
KiB = 1 << 10
NODES, PER_NODE = 4, 150  # 600 sessions, each its own job
CAPACITY = 40 * MiB
CHUNK, PERIOD = 64 * KiB, 0.25  # 256 KiB/s a session
DEMAND = NODES * PER_NODE * CHUNK / PERIOD  # bytes/s the sessions want in all: 150 MiB/s
PUSH_TOLERANCE: float = ControllerConfig.model_fields["push_tolerance"].default
MAX_SESSIONS = 1024  # each session's budget share: B / 1024
# The grace outlasts admission here: a session no controller admitted within it paces at the
# conservative rate (docs/client.md, "Not yet within the invariant").
LEASE, GRACE = 1.5, 8.0
SAMPLE = 0.1


@contextmanager
def sampler(cores: list[SessionCore]) -> Iterator[list[tuple[float, float]]]:
    """(time, Σ rates in force) every 100 ms, in a thread, while the block runs."""
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(SAMPLE):
            samples.append((time.monotonic(), sum(core.rate for core in cores)))

    thread = threading.Thread(target=run, name="rates-sampler", daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(5)


async def _drive(cores: list[SessionCore]) -> None:
    """Each session wants CHUNK every PERIOD (its application's pace), on the node's loop,
    until cancelled."""

    async def one(core: SessionCore) -> None:
        while True:
            await core.acquire_async(CHUNK)
            await asyncio.sleep(PERIOD)

    await asyncio.gather(*(one(c) for c in cores))


def test_the_rates_in_force_never_sum_past_capacity_while_the_controller_stops_and_resumes(
    controller_factory: Callable[..., ControllerProcess],
) -> None:
    assert DEMAND >= 3 * CAPACITY
    controller = controller_factory(
        "--capacity",
        "40MiB/s",
        "--node-bandwidth",
        "1GiB/s",
        "--policy",
        "fair-share",
        env={
            "BURSTCTL_LEASE": str(LEASE),
            "BURSTCTL_FALLBACK_GRACE": str(GRACE),
            "BURSTCTL_MAX_SESSIONS": str(MAX_SESSIONS),
            "BURSTCTL_MAX_SESSIONS_PER_CLIENT": str(MAX_SESSIONS),
            "BURSTCTL_HEARTBEAT_TIMEOUT": "30",
        },
    )
    assert controller.address is not None and controller.proc is not None
    pid = controller.proc.pid
    bound = CAPACITY * (1 + PUSH_TOLERANCE) + 1
    cores: list[SessionCore] = []
    with ExitStack() as stack:
        os.kill(pid, signal.SIGSTOP)  # stopped before the sessions arrive
        stack.callback(os.kill, pid, signal.SIGCONT)  # (the fixture stops it by pid)
        samples = stack.enter_context(sampler(cores))
        drives: list[concurrent.futures.Future[None]] = []
        for node in range(NODES):
            runtime = stack.enter_context(ClientRuntime(name=f"node-{node}"))
            mine = []
            for k in range(PER_NODE):
                i = node * PER_NODE + k
                options = SessionOptions.build(
                    controller.address,
                    JobInfo(f"job-{i}", f"user{i % 50}", "g"),
                    "keep-last",
                    report_interval=0.5,
                    attach_timeout=0.5,
                    fallback_grace=GRACE,
                    quiet_gap=10 * PERIOD,  # one operation open: the demand stays
                    client_id=f"node{node}-{k}",
                )
                core = SessionCore(options)
                runtime.start_core(core)
                mine.append(core)
            cores.extend(mine)
            drives.append(runtime.submit(_drive(mine)))
        for drive in drives:  # (cancels the drive's task on its node's loop)
            stack.callback(drive.cancel)
        stack.callback(os.kill, pid, signal.SIGCONT)  # first of all: the sessions say Goodbye
        phases: dict[str, float] = {"waiting": time.monotonic()}

        # 1. Waiting for admission, past attach_timeout (not past the grace): nothing flows.
        wait_until(lambda: len(samples) >= 10, 10, message="1 s of samples while stopped")
        assert max(total for _, total in samples) == 0.0

        # 2. Resumed: sessions attach and share B.
        os.kill(pid, signal.SIGCONT)
        phases["resumed"] = time.monotonic()
        wait_until(lambda: all(c.attached for c in cores), GRACE, message="every session attached")

        # 3. Stopped again: leases run out, kept rates, the grace, one lease, budget shares.
        os.kill(pid, signal.SIGSTOP)
        phases["stopped"] = time.monotonic()
        shares = 0.0
        budget = len(cores) * CAPACITY / MAX_SESSIONS * 1.0001

        def at_shares() -> bool:
            # every session that was attached paces at its budget share, B / max_sessions,
            # once its own timers took it there (a loaded node's come late): then it stays
            nonlocal shares
            shares = sum(c.rate for c in cores)
            past = time.monotonic() - phases["stopped"] > 2 * LEASE + GRACE + 1.0
            return past and 0 < shares <= budget

        wait_until(at_shares, 40, message="every attached session at its budget share")

        t0 = phases["waiting"]
        over = [(round(t - t0, 1), total / MiB) for t, total in samples if total > bound]
        assert not over, f"Σ rates above B(1 + tolerance) = {bound / MiB:.1f} MiB/s: {over[:10]}"
        assert max(total for _, total in samples) > 0.5 * CAPACITY, "B was never shared"

        # 4. Resumed again: the sessions re-attach, the bound holding while they come back
        # (each left its stream saying what it paces at, so the replica counts it until then).
        os.kill(pid, signal.SIGCONT)
        phases["resumed again"] = time.monotonic()
        wait_until(lambda: all(c.attached for c in cores), 90, message="every session back")
        settled = time.monotonic()
        wait_until(lambda: samples[-1][0] > settled + 2.0, 10, message="2 s more of samples")
        over = [(round(t - t0, 1), total / MiB) for t, total in samples if total > bound]
        assert not over, f"Σ rates above B(1 + tolerance) = {bound / MiB:.1f} MiB/s: {over[:10]}"
        assert max(t for t, total in samples if total > 0.5 * CAPACITY) > settled, "B not shared"
