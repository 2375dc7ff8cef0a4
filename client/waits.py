"""How the client runtime waits: the one blocking wait, its cancellation, and the waiters'
bookkeeping that `Throttle` and the space gate share.

Every blocking wait of the client runtime (a token bucket's, the space gate's, the attach
wait, a striped acquire's wait on its loop) goes through `wait` (or `wait_for`, `result`
built on it). A thread may install a `Cancellation` for what it does next (``with cancellation:``):
the FUSE mount installs one per request, fired when the kernel interrupts the request
(docs/fuse.md, "Interrupted requests"). Firing it wakes the wait at once, and every wait of
that thread from then on raises `Interrupted` (an `InterruptedError`, errno EINTR) instead
of sleeping. A thread without one waits as before; nothing else ever raises `Interrupted`.

Lock order: a waiter holds its condition's lock when it registers with the cancellation, and
the cancellation's lock only briefly; `Cancellation.fire` takes the condition's lock only
after it let go of its own, so it never waits on a waiter that waits on it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Longest single wait, in seconds: a longer (or endless) wait is taken in slices of at most this,
# re-computed after each, so no timeout handed to `Condition.wait` or `asyncio.timeout` can be
# out of range for the platform (``nbytes / rate`` at a tiny rate overflowed time_t).
MAX_WAIT_SLICE = 10.0


def wait_slice(delay: float) -> float:
    """A finite timeout in ``[0, MAX_WAIT_SLICE]`` for a computed ``delay`` (inf, NaN too)."""
    if not delay > 0:  # also NaN
        return 0.0
    return min(delay, MAX_WAIT_SLICE)


class Interrupted(InterruptedError):
    """A wait ended because the thread's `Cancellation` fired (errno EINTR)."""

    def __init__(self) -> None:
        super().__init__(errno.EINTR, "the wait was interrupted")


# Guards every cancellation's state (a wait registering, a fire): short, and rarely contended,
# since only waits that block and interrupts take it.
_lock = threading.Lock()


class Cancellation:
    """One piece of work's cancellation: fired once, from any thread, for good.

    `arm` is called once, on the waiting thread, the first time one of its waits would block
    (without the wait's lock held); a subclass overrides it: the FUSE mount registers the
    request's interrupt notification with libfuse there, so that a request that never waits
    costs no call. It may fire the cancellation at once (the kernel interrupted the request
    already).
    """

    __slots__ = ("_armed", "_fired", "_outer", "_wake")

    def __init__(self) -> None:
        self._armed = False
        self._fired = False
        self._wake: Callable[[], None] | None = None  # wakes the wait in progress, if any
        self._outer: Cancellation | None = None

    def __enter__(self) -> Cancellation:
        """Installs the cancellation for the calling thread's waits within the block."""
        self._outer = getattr(_local, "cancellation", None)
        _local.cancellation = self
        return self

    def __exit__(self, *exc: object) -> None:
        _local.cancellation, self._outer = self._outer, None

    @property
    def fired(self) -> bool:
        return self._fired

    def arm(self) -> None:
        """Called once, when a wait of the thread would first block (see the class doc)."""

    def fire(self) -> None:
        """Ends the wait in progress and every later one (idempotent; any thread, no lock of
        the waits held)."""
        with _lock:
            self._fired = True
            wake, self._wake = self._wake, None
        if wake is not None:
            wake()

    def _watch(self, wake: Callable[[], None] | None) -> None:
        """Registers (None: unregisters) what wakes the caller's wait; raises `Interrupted`
        once fired."""
        with _lock:
            if self._fired:
                self._wake = None
                raise Interrupted
            self._wake = wake


_local = threading.local()


def current() -> Cancellation | None:
    """The cancellation installed for the calling thread, if any."""
    return getattr(_local, "cancellation", None)


def _notify(cond: threading.Condition) -> None:
    with cond:
        cond.notify_all()


def wait(cond: threading.Condition, timeout: float) -> None:
    """``cond.wait(timeout)`` (``cond`` held, as for `threading.Condition.wait`), cut short when
    the thread's cancellation fires, which raises `Interrupted`. Like any condition wait it may
    return early: callers re-check their state after it, in a loop."""
    cancellation = current()
    if cancellation is None:
        cond.wait(timeout)
        return
    if not cancellation._armed:
        # Armed without the wait's lock: arming may fire at once, and firing takes that lock.
        cancellation._armed = True
        cond.release()
        try:
            cancellation.arm()
        finally:
            cond.acquire()
    cancellation._watch(lambda: _notify(cond))
    try:
        cond.wait(timeout)
    finally:
        cancellation._watch(None)


def wait_for(cond: threading.Condition, done: Callable[[], bool], timeout: float | None) -> bool:
    """``cond.wait_for(done, timeout)`` through `wait` (``cond`` held): `Interrupted` when the
    thread's cancellation fires; else whether ``done()`` came true in time."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not done():
        left = MAX_WAIT_SLICE if deadline is None else deadline - time.monotonic()
        if left <= 0:
            return False
        wait(cond, wait_slice(left))
    return True


def result(future: concurrent.futures.Future[T], timeout: float | None = None) -> T:
    """``future.result(timeout)`` through `wait_for`, for a future of a coroutine on a loop
    (``run_coroutine_threadsafe``) whose cancellation undoes what it did: when the thread's
    cancellation fires, the coroutine is cancelled on its loop and this raises `Interrupted`."""
    cond = threading.Condition(threading.Lock())
    future.add_done_callback(lambda _: _notify(cond))
    try:
        with cond:
            wait_for(cond, future.done, timeout)
    except Interrupted:
        future.cancel()  # not under ``cond``: its done callback takes it
        raise
    return future.result(0)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Waiters:
    """The waiting side shared by `Throttle` and the space gate (`client/space.py`): a lock
    and condition for threads, futures for coroutines, and the wait bookkeeping a usage report
    takes (how many wait, for how long so far, and whether the controller was told).

    ``on_wait_start`` is called, with the lock held, when a wait starts while the last
    reported snapshot said nobody waited (one notice per transition); it may not block nor
    call back. Subclasses call `_start_wait` / `_finish_wait` around a wait and `_wake_all`
    on every change that may end one, all with ``_cond`` held. A thread's wait (`_block`)
    raises `Interrupted` when its cancellation fires, a coroutine's `asyncio.CancelledError`
    when it is cancelled; `_finish_wait` in a ``finally`` keeps the books right either way.
    """

    def __init__(
        self, clock: Callable[[], float], on_wait_start: Callable[[], None] | None
    ) -> None:
        self._clock = clock
        self._on_wait_start = on_wait_start
        self._cond = threading.Condition(threading.Lock())
        self._wakeups: set[asyncio.Future[None]] = set()
        # Wait time of finished waits, plus (waiters * now - sum of their start times) for the
        # ongoing ones, so a report mid-wait accounts the wait so far.
        self._wait_done = 0.0
        self._waiters = 0
        self._wait_starts = 0.0
        self._reported_waiting = False

    @property
    def waiting(self) -> bool:
        with self._cond:
            return self._waiters > 0

    def _waited(self, now: float) -> float:
        """Seconds spent waiting so far, finished and ongoing waits (lock held)."""
        return self._wait_done + self._waiters * now - self._wait_starts

    def _start_wait(self, now: float) -> None:
        self._waiters += 1
        self._wait_starts += now
        if not self._reported_waiting and self._on_wait_start is not None:
            # One notice per transition: the next one needs a report that said "not waiting".
            self._reported_waiting = True
            self._on_wait_start()

    def _finish_wait(self, start: float) -> None:
        self._waiters -= 1
        # Reset when idle so the running sum of start times cannot drift by rounding.
        self._wait_starts = self._wait_starts - start if self._waiters else 0.0
        self._wait_done += self._clock() - start

    def _block(self, pending: Callable[[], float | None]) -> None:
        """Blocks the calling thread (``_cond`` held) until ``pending`` returns None; otherwise
        it returns the longest the next sleep may last, cut short by `_wake_all` (and by the
        thread's cancellation, which raises `Interrupted`)."""
        while (timeout := pending()) is not None:
            wait(self._cond, timeout)

    async def _wait_for(self, pending: Callable[[], float | None]) -> None:
        """Suspends until ``pending`` (called with ``_cond`` held) returns None; otherwise it
        returns the longest the next sleep may last, cut short by `_wake_all`."""
        loop = asyncio.get_running_loop()
        while True:
            wakeup: asyncio.Future[None] = loop.create_future()
            with self._cond:
                timeout = pending()
                if timeout is None:
                    return
                self._wakeups.add(wakeup)
            try:
                async with asyncio.timeout(timeout):
                    await wakeup
            except TimeoutError:
                pass
            finally:
                with self._cond:
                    self._wakeups.discard(wakeup)

    def _wake_all(self) -> None:
        self._cond.notify_all()
        for future in self._wakeups:
            # RuntimeError: its loop is closed, and the coroutine waiting on it is gone with it.
            with contextlib.suppress(RuntimeError):
                future.get_loop().call_soon_threadsafe(_wake, future)
