"""The one wait of the client runtime and its cancellation (client/waits.py): a fired
cancellation ends a thread's wait at once with `Interrupted`, and leaves no waiter, no
reservation and no grant behind."""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import Callable

import pytest
from support import async_wait_until, wait_until

from burstctl.client.bucket import Throttle
from burstctl.client.space import SpaceGate
from burstctl.client.waits import Cancellation, Interrupted, result, wait_for


class Armed(Cancellation):
    """A cancellation that counts its arming, and may fire then (as libfuse may)."""

    __slots__ = ("armed", "fire_when_armed")

    def __init__(self, fire_when_armed: bool = False) -> None:
        super().__init__()
        self.armed = 0
        self.fire_when_armed = fire_when_armed

    def arm(self) -> None:
        self.armed += 1
        if self.fire_when_armed:
            self.fire()


def interrupt_in_thread(
    work: Callable[[], object],
) -> tuple[Armed, list[BaseException | None], threading.Thread]:
    """Runs ``work`` in a thread under a cancellation; returns (cancellation, outcome list,
    thread). The outcome is the exception raised, or None."""
    cancellation = Armed()
    outcome: list[BaseException | None] = []

    def run() -> None:
        with cancellation:
            try:
                work()
            except BaseException as err:  # the outcome is checked by the test
                outcome.append(err)
                return
        outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return cancellation, outcome, thread


def test_a_fired_cancellation_ends_a_token_wait_and_refunds_its_tokens() -> None:
    throttle = Throttle()
    throttle.set_rate(100.0, 0.0)
    cancellation, outcome, thread = interrupt_in_thread(lambda: throttle.acquire(1000))
    wait_until(lambda: throttle.waiting, message="the acquire to wait")
    cancellation.fire()
    thread.join(5)
    assert isinstance(outcome[0], Interrupted) and outcome[0].errno == errno.EINTR
    assert cancellation.armed == 1  # armed once, when the wait blocked
    assert not throttle.waiting
    # Refunded: the next caller waits for its own bytes only (100 bytes at 100 B/s).
    done = threading.Event()
    threading.Thread(target=lambda: (throttle.acquire(50), done.set()), daemon=True).start()
    assert done.wait(3)


def test_a_cancellation_fired_before_the_wait_raises_at_once() -> None:
    throttle = Throttle()  # rate 0: waits for ever
    cancellation = Cancellation()
    cancellation.fire()
    with cancellation, pytest.raises(Interrupted):
        throttle.acquire(10)
    assert not throttle.waiting


def test_arming_may_fire_at_once() -> None:
    # libfuse calls the interrupt function while registering when the interrupt came first.
    throttle = Throttle()
    with Armed(fire_when_armed=True), pytest.raises(Interrupted):
        throttle.acquire(10)
    assert not throttle.waiting


def test_a_request_that_does_not_wait_is_never_armed() -> None:
    throttle = Throttle()
    throttle.set_rate(float("inf"), 0.0)
    with Armed() as cancellation:
        throttle.acquire(10)
    assert isinstance(cancellation, Armed) and cancellation.armed == 0


def test_a_fired_cancellation_ends_a_space_wait_without_adding() -> None:
    gate = SpaceGate()  # attaching: waits for the first allocation
    cancellation, outcome, thread = interrupt_in_thread(lambda: gate.acquire(10, landed=False))
    wait_until(lambda: gate.waiting, message="the space wait")
    cancellation.fire()
    thread.join(5)
    assert isinstance(outcome[0], Interrupted)
    assert not gate.waiting and gate.added == 0
    assert not gate.snapshot().waiting


def test_wait_for_ends_on_the_cancellation_or_the_condition_or_the_timeout() -> None:
    cond = threading.Condition(threading.Lock())
    flag: list[bool] = []

    def waiting() -> None:
        with cond:
            wait_for(cond, lambda: bool(flag), None)

    cancellation, outcome, thread = interrupt_in_thread(waiting)
    wait_until(lambda: thread.is_alive(), message="the waiter")
    cancellation.fire()
    thread.join(5)
    assert isinstance(outcome[0], Interrupted)
    with cond:
        assert wait_for(cond, lambda: bool(flag), 0.01) is False
        flag.append(True)
        assert wait_for(cond, lambda: bool(flag), None) is True


def test_result_cancels_the_coroutine_on_its_loop() -> None:
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        future = asyncio.run_coroutine_threadsafe(forever(), loop)
        cancellation, outcome, thread = interrupt_in_thread(lambda: result(future))
        wait_until(lambda: thread.is_alive(), message="the waiter")
        cancellation.fire()
        thread.join(5)
        assert isinstance(outcome[0], Interrupted)
        assert cancelled.wait(5)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(5)
        loop.close()


def test_without_a_cancellation_a_wait_is_as_before() -> None:
    throttle = Throttle()
    throttle.set_rate(1e6, 0.0)
    throttle.acquire(1000)  # 1 ms
    assert not throttle.waiting


async def test_a_cancelled_async_acquire_refunds_its_tokens() -> None:
    throttle = Throttle()
    throttle.set_rate(100.0, 0.0)
    task = asyncio.create_task(throttle.acquire_async(1000))
    await async_wait_until(lambda: throttle.waiting, message="the acquire to wait")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not throttle.waiting
    await asyncio.wait_for(throttle.acquire_async(50), 3)  # not behind the 1000 cancelled
