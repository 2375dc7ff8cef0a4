"""Decreases before increases (docs/protocol.md): an increase waits for the acknowledgements of
the decreases offered before it, never for those offered after it, which only make room."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support import async_wait_until

from burstctl.controller.config import load_config
from burstctl.controller.jobs import JobTable
from burstctl.controller.outbox import StreamOutbox
from burstctl.controller.records import JobMeta, SessionRecord
from burstctl.controller.scheduler import Scheduler
from burstctl.controller.state import PolicySlot, StateStore
from burstctl.policies.registry import default_registry
from burstctl.policies.schedule import Schedule, Window

MiB = float(1 << 20)


class Acknowledged:
    """An outbox whose client acknowledges a decrease only when the test says so."""

    def __init__(self) -> None:
        self.rates: list[float] = []
        self.pending: dict[int, asyncio.Future[None]] = {}

    def offer(self, rate: float, burst: float, epoch: int, lease: float, policy: str) -> None:
        self.rates.append(rate)

    def applied(self, epoch: int) -> asyncio.Future[None]:
        return self.pending.setdefault(epoch, asyncio.get_running_loop().create_future())

    def acknowledge_all(self) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_result(None)


def fair_share(tmp_path: Path) -> tuple[JobTable, Scheduler]:
    """A job table and its scheduler under fair-share, B = 40 MiB/s, on the running loop."""
    config = load_config(capacity="40MiB/s", node_bandwidth="1GiB/s", state_dir=tmp_path)
    table = JobTable(
        asyncio.get_running_loop().time,
        heartbeat_timeout=1e9,
        job_retention=1e9,
        demand_headroom=1.1,
    )
    slot = PolicySlot(default_registry(), StateStore(tmp_path), ("fair-share", {}), replica_id="r")
    scheduler = Scheduler(table, slot, config)
    return table, scheduler


async def test_an_increase_is_not_held_by_a_decrease_offered_after_it(tmp_path: Path) -> None:
    table, scheduler = fair_share(tmp_path)
    outboxes = [Acknowledged() for _ in range(3)]
    a, b, c = (
        table.open_session(JobMeta(job, "u", "g", 1, 1.0), f"client-{job}", "h", outbox=out)
        for job, out in zip("abc", outboxes, strict=True)
    )
    for session in (a, c):  # pacing at 20 MiB/s each, as kept from an earlier stream
        session.offered = session.rate = 20 * MiB

    def push(session: SessionRecord, rate: float) -> None:
        scheduler._push(session, rate, table.clock())

    # One decision: a down to 10, b up to 10 (held until a acknowledges).
    scheduler._deciding = True
    push(a, 10 * MiB)
    push(b, 10 * MiB)
    scheduler._deciding = False
    scheduler._release_held()
    assert outboxes[1].rates == []
    # A later decrease, of c, that its client never acknowledges.
    push(c, 5 * MiB)
    assert outboxes[2].rates == [5 * MiB]
    # a acknowledges: b's increase goes out at once, c's silence does not hold it.
    outboxes[0].acknowledge_all()
    await async_wait_until(lambda: outboxes[1].rates == [10 * MiB], 5, message="released")
    assert scheduler.stats.hold_expired == 0


async def test_a_decrease_superseded_before_it_is_written_needs_no_acknowledgement() -> None:
    outbox = StreamOutbox(pacing=0.0)
    outbox.offer(20 * MiB, 0.0, 1, 5.0, "p")  # an increase, not written yet
    outbox.offer(10 * MiB, 0.0, 2, 5.0, "p")  # lower than the offered 20: the scheduler waits
    applied = outbox.applied(2)
    assert not applied.done()
    # The client gets 10 after its 0: an increase to it, so it acknowledges nothing, and it
    # never paced at 20. Written, the decrease counts as applied.
    message = outbox.take()
    assert message is not None and message.allocation.rate == 10 * MiB
    assert applied.done()
    # A real decrease after that waits for the client.
    outbox.offer(4 * MiB, 0.0, 3, 5.0, "p")
    lowered = outbox.applied(3)
    assert outbox.take() is not None
    assert not lowered.done()
    outbox.acknowledge(3)
    assert lowered.done()


async def test_a_decrease_written_waits_for_the_client_whatever_is_written_after_it() -> None:
    """A decrease the client may not have read yet is acknowledged by the client only: an
    allocation written after it that is no decrease (the same 0 again, in a storm of switches)
    covers none of it. Covering it let another session's increase through while this client
    still paced at its old rate (90 MiB/s in force on 60, test_fail_safe.py's storm)."""
    outbox = StreamOutbox(pacing=0.0)
    outbox.offer(15 * MiB, 0.0, 1, 5.0, "p")
    assert outbox.take() is not None  # the client paces at 15 once it reads this
    outbox.offer(0.0, 0.0, 2, 5.0, "p")
    lowered = outbox.applied(2)
    assert outbox.take() is not None  # written, not read yet
    outbox.offer(15 * MiB, 0.0, 3, 5.0, "p")  # held by the scheduler: superseded below
    outbox.offer(0.0, 0.0, 4, 5.0, "p")  # no decrease for what was last written (0)
    again = outbox.applied(4)
    message = outbox.take()
    assert message is not None and message.allocation.epoch == 4
    assert again.done()  # epoch 4 itself is no decrease for the client: nothing to wait for
    assert not lowered.done()  # epoch 2 is, until the client says it applied it
    outbox.acknowledge(2)
    assert lowered.done()


class WithWindows(Acknowledged):
    """An acknowledging outbox that also carries windows; it records each pattern's peak."""

    def offer_windows(
        self, rate: float, burst: float, epoch: int, lease: float, policy: str, windows: Schedule
    ) -> None:
        self.rates.append(windows.peak_rate())


async def test_a_pattern_above_the_rate_in_force_at_some_instant_is_an_increase(
    tmp_path: Path,
) -> None:
    # A loan (policies/persched/lending.py): the lender gives its window up (a decrease), the
    # borrower gets a pattern whose mean is below its rate but whose first window is above it.
    table, scheduler = fair_share(tmp_path)
    outboxes = [WithWindows() for _ in range(2)]
    lender, borrower = (
        table.open_session(JobMeta(job, "u", "g", 1, 1.0), f"client-{job}", "h", outbox=out)
        for job, out in zip("lb", outboxes, strict=True)
    )
    lender.offered = lender.rate = 20 * MiB
    borrower.offered = borrower.rate = 10 * MiB
    loan = Schedule(86400.0, (Window(0.0, 1.0, 30 * MiB), Window(1.0, 86400.0, 8 * MiB)))
    assert loan.mean_rate() < 10 * MiB
    now = table.clock()
    scheduler._deciding = True
    scheduler._push(lender, 5 * MiB, now)
    scheduler._push(borrower, loan.mean_rate(), now, loan)
    scheduler._deciding = False
    scheduler._release_held()
    assert outboxes[0].rates == [5 * MiB] and outboxes[1].rates == []  # held
    outboxes[0].acknowledge_all()
    await async_wait_until(lambda: outboxes[1].rates == [30 * MiB], 5, message="released")
    assert borrower.offered_peak == 30 * MiB
