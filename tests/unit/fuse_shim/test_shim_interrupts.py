"""The binding's side of interrupted requests (`_fuse.callbacks.Interrupts`): a request's
interrupt function is registered with libfuse only once one of its waits blocks, it ends
that wait, and an interrupt that comes after the request was answered is ignored."""

from __future__ import annotations

import threading

from support import wait_until

from burstctl.client.bucket import Throttle
from burstctl.client.waits import Interrupted
from burstctl.fuse_shim._fuse.callbacks import Interrupts


def test_an_interrupt_ends_the_wait_of_its_request_only() -> None:
    registered: list[tuple[int, int]] = []
    interrupts = Interrupts(lambda req, thunk, number: registered.append((req, number)))
    throttle = Throttle()  # rate 0: an acquire waits until it is interrupted
    answers: list[str] = []

    def request(req: int, nbytes: int) -> None:
        try:
            throttle.acquire(nbytes)
            answers.append(f"{req}: done")
        except Interrupted:
            answers.append(f"{req}: EINTR")

    call = interrupts.wrap(request)
    call(1, 0)  # no wait: nothing registered
    assert registered == [] and answers == ["1: done"]
    waiter = threading.Thread(target=call, args=(2, 10), daemon=True)
    waiter.start()
    wait_until(lambda: registered, message="the interrupt function registered")
    assert [req for req, _ in registered] == [2]
    interrupts.thunk(*registered[0])  # what libfuse calls on FUSE_INTERRUPT
    waiter.join(5)
    assert answers == ["1: done", "2: EINTR"]
    assert not throttle.waiting
    interrupts.thunk(*registered[0])  # late (after the answer): ignored
    interrupts.thunk(2, 0)  # no such request: ignored
