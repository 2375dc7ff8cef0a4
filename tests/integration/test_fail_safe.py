"""Issue 15, findings 7 and 8 end to end: a real controller, real client sessions on loopback.

- During a storm of policy switches the rates in force at the clients never sum to more than
  the capacity (within the push tolerance): decreases are delivered before increases.
- A controller that hangs (SIGSTOP) after allotting some sessions 0 does not make them fail
  open: keep-last keeps the allotted rates, so the clients stay within the capacity.
- The controller never pushes a residue below the rate floor.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from support import ControllerProcess, Pump, async_wait_until, measure, wait_until
from support.grpc import RawNode, RawSession, hello, post, tagged

from burstctl.client import JobInfo, Session
from burstctl.common.limits import MIN_RATE
from burstctl.controller.app import Replica
from burstctl.controller.ghosts import IN_FORCE_FILE
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

pytestmark = pytest.mark.integration

MiB = 1 << 20
CAPACITY = 60 * MiB


def job(job_id: str) -> JobInfo:
    return JobInfo(job_id, "tester", "testers", nodes=1)


class RateLog:
    """Every rate change of every session, stamped with one shared monotonic clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[tuple[float, int, float]] = []

    def observer(self, index: int) -> Callable[[float], None]:
        def record(rate: float) -> None:
            with self._lock:  # stamp and append together: the order is the order in force
                self.events.append((time.monotonic(), index, rate))

        return record

    def peak(self, until: float) -> tuple[float, float]:
        """The highest sum of the rates in force up to ``until``, and when it was reached."""
        with self._lock:
            events = sorted(e for e in self.events if e[0] <= until)
        rates: dict[int, float] = {}
        peak, peak_at = 0.0, 0.0
        for at, index, rate in events:
            rates[index] = rate
            total = sum(rates.values())
            if total > peak:
                peak, peak_at = total, at
        return peak, peak_at


async def test_policy_switch_storm_never_exceeds_capacity_at_the_clients(
    replica_factory: Callable[..., Awaitable[Replica]],
) -> None:
    """Greedy-yield (60/0/0/0) and fair-share (15 each) alternating every 4 ms on a real
    replica: every rate change at each real client session is logged with one clock, and the
    sum in force never exceeds B (1 + push_tolerance)."""
    replica = await replica_factory(
        capacity="60MiB/s", node_bandwidth="1GiB/s", policy="greedy-yield", lease=2.0
    )
    tolerance = replica.config.push_tolerance
    log = RateLog()
    stack = ExitStack()
    sessions = [
        stack.enter_context(
            Session(replica.grpc_address, job(f"storm-{i}"), rate_observer=log.observer(i))
        )
        for i in range(4)
    ]
    for s in sessions:
        stack.enter_context(s.operation("write"))  # demand: every job is in S(t)
    pumps = [Pump(s, chunk=MiB).start() for s in sessions]
    try:

        def attached() -> bool:
            return all(s.attached for s in sessions) and sum(s.rate for s in sessions) > 0

        await async_wait_until(attached, 10, message="every session attached")
        start = time.monotonic()
        names = ["fair-share", "greedy-yield"]
        switches = 0
        while time.monotonic() - start < 3.0:
            replica.slot.switch(names[switches % 2])
            switches += 1
            await asyncio.sleep(0.004)  # the storm's own pace: a switch every few ms
        errors = [e for p in pumps for e in p.errors]
        end = time.monotonic()  # closing sessions leaves their last rate in the log: not counted
    finally:
        # Closed off the loop (the replica runs on it); a closed session wakes its pump.
        await asyncio.to_thread(stack.close)
        await asyncio.to_thread(lambda: [p.stop() for p in pumps])
    changes = len(log.events)
    peak, peak_at = log.peak(until=end)
    print(
        f"storm: {switches} switches, {changes} rate changes at the clients, "
        f"peak sum {peak / MiB:.2f} MiB/s on {CAPACITY / MiB:.0f}"
    )
    assert changes > 100, "the storm did not move the rates"
    assert peak <= CAPACITY * (1 + tolerance), (
        f"rates in force summed to {peak / MiB:.2f} MiB/s at {peak_at - start:+.3f}s"
    )
    assert not errors
    print(f"storm: {replica.scheduler.stats.held} increases held for acknowledgements")


async def test_controller_never_pushes_a_residue(
    replica_factory: Callable[..., Awaitable[Replica]],
) -> None:
    """A decision that leaves a job an ulp-level rate pushes 0, not the residue."""
    replica = await replica_factory(capacity="60MiB/s", node_bandwidth="1GiB/s")
    scheduler = replica.scheduler
    with Session(replica.grpc_address, job("tiny")) as s, s.operation("write"):
        await async_wait_until(lambda: s.attached and s.rate > 0, 10)
        (state,) = replica.table.sessions.values()
        pushes = scheduler.stats.pushes
        scheduler._offer(state, 6.2e-9, time.monotonic())  # the residue of capacity − Σ column
        assert state.rate == 0.0
        assert scheduler.stats.pushes == pushes + 1  # pushed as a stop
        await async_wait_until(lambda: s.rate == 0, 5, message="the client told 0")
        scheduler._offer(state, MIN_RATE / 2, time.monotonic())
        assert scheduler.stats.pushes == pushes + 1  # still 0: nothing to push


@pytest.fixture
def stopped_controllers(controller_factory) -> Iterator[list[ControllerProcess]]:
    """Controllers a test may SIGSTOP: resumed (SIGCONT by pid) at teardown, then stopped."""
    hung: list[ControllerProcess] = []
    yield hung
    for ctl in hung:
        if ctl.proc is not None:
            ctl.proc.send_signal(signal.SIGCONT)


def test_keep_last_stays_within_capacity_when_the_controller_hangs(
    controller_factory, stopped_controllers: list[ControllerProcess]
) -> None:
    """Three FCFS sessions on 60 MiB/s: the first in FCFS order runs, two are told 0, and that holds
    (FCFS keeps it while the first operation is open; a policy that rotates, as greedy-yield
    does, may be stopped between a decrease and the increase it holds back). SIGSTOP the
    controller: after the leases, keep-last keeps 60 / 0 / 0, never 180."""
    ctl = controller_factory(
        "--policy",
        "fcfs",
        "--capacity",
        "60MiB/s",
        "--node-bandwidth",
        "1GiB/s",
        env={"BURSTCTL_LEASE": "0.5", "BURSTCTL_HEARTBEAT_TIMEOUT": "30"},
    )
    assert ctl.address is not None
    with ExitStack() as stack:
        sessions = [
            stack.enter_context(Session(ctl.address, job(f"fcfs-{i}"), "keep-last"))
            for i in range(3)
        ]
        for s in sessions:
            stack.enter_context(s.operation("write"))
        pumps = [Pump(s, chunk=256 * 1024).start() for s in sessions]
        stack.callback(lambda: [p.stop() for p in pumps])
        wait_until(
            lambda: (
                all(s.attached for s in sessions)
                and sorted(s.rate for s in sessions) == [0.0, 0.0, CAPACITY]
            ),
            10,
            message="one session flowing at B, two told 0",
        )
        live = [s.rate for s in sessions]  # FCFS holds it while the operations stay open
        assert ctl.proc is not None
        stopped_controllers.append(ctl)
        ctl.proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: not any(s.attached for s in sessions), 5, message="leases ran out")
        assert [s.rate for s in sessions] == live  # the last live shares, 0 included
        rates = measure(pumps, 1.5)
        print(
            "controller hung: " + ", ".join(f"{r / MiB:.1f}" for r in rates) + " MiB/s "
            f"(sum {sum(rates) / MiB:.1f} on 60)"
        )
        assert sum(rates) <= CAPACITY * 1.1
        assert sorted(r == 0 for r in rates) == [False, True, True]
        ctl.proc.send_signal(signal.SIGCONT)
        stopped_controllers.remove(ctl)
        wait_until(lambda: all(s.attached for s in sessions), 15, message="re-attached")
        assert not [e for p in pumps for e in p.errors]


def queued_rates(session: RawSession) -> list[float]:
    """The rates of the allocations a raw session received and nobody read yet (kept)."""
    messages = []
    while not session.inbox.empty():
        messages.append(session.inbox.get_nowait())
    for m in messages:
        session.inbox.put_nowait(m)
    return [m.allocation.rate for m in messages]


async def test_an_increase_waits_for_the_decrease_acknowledgement_or_fits_beside_it(
    replica_factory: Callable[..., Awaitable[Replica]],
) -> None:
    """Raw streams: a's decrease not acknowledged holds b's increase past the bound too, as
    it does not fit beside the 40 MiB/s a may still pace at, until a acknowledges; a's and b's
    decreases acknowledged at once release c's increase before the bound."""
    replica = await replica_factory(node_bandwidth="1GiB/s", heartbeat_timeout=10.0, lease=2.0)
    stats = replica.scheduler.stats
    async with grpc.aio.insecure_channel(replica.grpc_address) as channel:
        a, b = RawSession(channel), RawSession(channel)
        await a.send(hello("a"))
        await b.send(hello("b"))
        assert (await a.allocation()).rate == 0 and (await b.allocation()).rate == 0
        await a.send(post(1))
        await a.rate_becomes(lambda r: r == 40 * MiB)
        await b.send(post(1))
        lowered = await a.rate_becomes(lambda r: 0 < r < 40 * MiB)
        # a says nothing: past the bound only what fits beside a's 40 MiB/s goes out, nothing
        await async_wait_until(lambda: stats.hold_expired >= 1, 5, message="the bound")
        (b_session,) = replica.table.jobs["b"].sessions.values()
        assert b_session.offered == 0 and not [r for r in queued_rates(b) if r > 0]
        await a.send(pb.ClientMessage(usage=pb.Usage(applied_epoch=lowered.epoch)))
        await b.rate_becomes(lambda r: r > 0)
        assert stats.hold_expired == 1
        # c posts: a and b go down to a third, c up; both acknowledge at once.
        c = RawSession(channel)
        await c.send(hello("c"))
        assert (await c.allocation()).rate == 0
        await c.send(post(1))
        for s in (a, b):
            third = await s.rate_becomes(lambda r: r < 20 * MiB)
            assert not [r for r in queued_rates(c) if r > 0]  # c's increase is still held
            await s.send(pb.ClientMessage(usage=pb.Usage(applied_epoch=third.epoch)))
        await c.rate_becomes(lambda r: r > 0)
        assert stats.hold_expired == 1  # released by the acknowledgements, not the bound
        for s in (a, b, c):
            s.call.cancel()


async def test_a_restarted_replica_counts_its_predecessors_rates_until_their_clients_are_back(
    replica_factory: Callable[..., Awaitable[Replica]], tmp_path: Path
) -> None:
    """The clients of a replica that restarts keep what it allotted them and come back one node
    at a time. The new process counts the sum its predecessor saved (controller/ghosts.py:
    InForce) less what each returning client declares, so node a, back first, gets no more
    than node b, not back yet, leaves free."""
    state = tmp_path / "restarting"
    first = await replica_factory(state_dir=state, ledger_interval=0.1)
    capacity = first.config.capacity  # 40 MiB/s; b = 8 MiB/s: each of 8 sessions gets 5
    tags = (1, 2, 3, 4)
    async with grpc.aio.insecure_channel(first.grpc_address) as channel:
        nodes = {name: RawNode(channel, acknowledge=True) for name in "ab"}
        for name, node in nodes.items():
            await node.send(*(tagged(t, hello(f"{name}{t}", client_id=f"{name}{t}")) for t in tags))
            await node.send(*(tagged(t, post(1)) for t in tags))
        await async_wait_until(
            lambda: all(node.rate(t) == capacity / 8 for node in nodes.values() for t in tags),
            message="B shared by the 8 sessions",
        )
        saved = state / IN_FORCE_FILE
        await async_wait_until(
            lambda: saved.exists() and json.loads(saved.read_text())["app"] >= 0.99 * capacity,
            message="the rates in force saved",
        )
        kept = {name: [node.rate(t) or 0.0 for t in tags] for name, node in nodes.items()}
    await first.stop(grace=0)

    second = await replica_factory(state_dir=state)
    assert second.ghosts.reserved()[0] == pytest.approx(capacity, rel=0.01)
    async with grpc.aio.insecure_channel(second.grpc_address) as channel:
        # node a comes back, declaring what it kept and was allotted; b is still away
        a = RawNode(channel, acknowledge=True)
        await a.send(
            *(
                tagged(t, hello(f"a{t}", client_id=f"a{t}", pacing_rate=rate, allotted=rate))
                for t, rate in zip(tags, kept["a"], strict=True)
            )
        )
        await a.send(*(tagged(t, post(1)) for t in tags))
        await async_wait_until(lambda: all(a.rate(t) is not None for t in tags), message="back")
        await async_wait_until(lambda: second.scheduler.stats.decisions >= 2, message="decided")
        away = sum(kept["b"])
        assert second.ghosts.reserved()[0] == pytest.approx(away, rel=0.01)
        # b's 20 MiB/s are counted: a gets the other 20, not its 32 of b_i alone
        assert sum(a.rate(t) or 0.0 for t in tags) <= (capacity - away) * (1 + 0.02)
        a.call.cancel()
