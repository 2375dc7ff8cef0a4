"""The session's side of the burst buffer's space contract (docs/capacity.md).

A session opened with ``buffer=True`` tracks one client's part of a job on the burst buffer:
``added`` (every byte the client wrote to the buffer since it started; never decreases), and
the gauges the client reports (``resident``, ``pending``, ``drain_error``). The controller
answers with a cumulative space limit (``Allocation.space``); `SpaceGate.acquire` lets a write
of ``n`` bytes proceed while ``added + n <= limit`` and makes it wait otherwise.

States of the gate:

* attaching: no allocation yet on the session — a write waits (like ``acquire``) until the
  first allocation or until the attach timeout gives up (`release`);
* free: the controller has no capacity (its allocations carry no space), the session fell
  back past ``fallback_grace`` without a controller, or the session is closed — no wait;
* limited: ``added + n <= limit`` or wait.

Thread-safe: writers call `acquire` from any thread (or `acquire_async` on a loop); the
session's stream sets the limit from its loop. Like `Throttle`, waits are taken in slices of
at most `MAX_WAIT_SLICE`, re-checked on every change, and a thread's wait ends at once with
`Interrupted` when its cancellation fires (`burstctl.client.waits`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from burstctl.client.waits import MAX_WAIT_SLICE, Waiters
from burstctl.common.limits import MAX_DRAIN_ERROR
from burstctl.proto.burstctl.v1 import controller_pb2 as pb


@dataclass(frozen=True, slots=True)
class SpaceStats:
    """What a usage report takes from the gate."""

    buffer: pb.Buffer
    waiting: bool
    wait_seconds: float


class SpaceGate(Waiters):
    """``added``, the space limit, the buffer gauges, and the writers waiting for space.

    ``on_wait_start`` is called with the lock held when a writer starts waiting while the last
    report said nobody waited (the stream then reports at once); ``on_error_change`` when
    `report` changes ``drain_error``. Neither may block nor call back into the gate.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        on_wait_start: Callable[[], None] | None = None,
        on_error_change: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(clock, on_wait_start)
        self._on_error_change = on_error_change
        self._added = 0
        # Of ``added``, bytes the caller said are on the buffer and in its ``resident`` report
        # (`land`); the reports carry this, so bytes in flight stay counted as unused space.
        self._landed = 0
        self._limit: int | None = None  # the controller's last space limit, None = none
        self._attaching = True  # no allocation yet and the attach timeout has not passed
        self._enforced = True  # False once the session fell back past its grace
        self._closed = False
        self._resident = 0
        self._pending = 0
        self._drain_error = ""

    # ------------------------------------------------------------------ state

    @property
    def limit(self) -> int | None:
        """The space limit in force (None: the controller sent none, so nothing is limited)."""
        with self._cond:
            return self._limit

    @property
    def added(self) -> int:
        with self._cond:
            return self._added

    # ------------------------------------------------------------------ the writers' side

    def _blocked(self, nbytes: int) -> bool:
        if self._closed:
            return False
        if self._attaching:
            return True
        if self._limit is None or not self._enforced:
            return False
        return self._added + nbytes > self._limit

    def acquire(self, nbytes: int, landed: bool = True) -> None:
        """Blocks until ``nbytes`` more fit under the limit, then adds them to ``added``.

        ``landed=False``: the bytes are not written yet; the caller calls `land` once they
        are on the buffer and in its ``resident`` report. Until then the reports count them
        as granted and unused, so a report taken while a write is in flight never tells the
        controller about less than what the buffer will hold (docs/capacity.md).

        `Interrupted` when the thread's cancellation fires first (`burstctl.client.waits`):
        nothing is added then."""
        with self._cond:
            if self._blocked(nbytes):
                start = self._begin_wait()
                try:
                    self._block(lambda: MAX_WAIT_SLICE if self._blocked(nbytes) else None)
                finally:
                    self._finish_wait(start)
            self._take(nbytes, landed)

    async def acquire_async(self, nbytes: int, landed: bool = True) -> None:
        """`acquire` for a coroutine: suspends instead of blocking its loop."""
        with self._cond:
            if not self._blocked(nbytes):
                self._take(nbytes, landed)
                return
            start = self._begin_wait()

        def pending() -> float | None:
            if self._blocked(nbytes):
                return MAX_WAIT_SLICE
            self._take(nbytes, landed)
            return None

        try:
            await self._wait_for(pending)
        finally:
            with self._cond:
                self._finish_wait(start)

    def land(self, nbytes: int) -> None:
        """``nbytes`` acquired with ``landed=False`` are now on the buffer and in the last
        ``resident`` given to `report` (or were never written)."""
        with self._cond:
            self._landed = min(self._added, self._landed + max(0, nbytes))

    def report(self, resident: int, pending: int, drain_error: str) -> None:
        """Sets the gauges sent with the next Usage (``drain_error`` changes are sent at once)."""
        if len(drain_error.encode()) > MAX_DRAIN_ERROR:
            drain_error = drain_error.encode()[:MAX_DRAIN_ERROR].decode(errors="ignore")
        with self._cond:
            changed = drain_error != self._drain_error
            self._resident, self._pending, self._drain_error = resident, pending, drain_error
            if changed and self._on_error_change is not None:
                self._on_error_change()

    # ------------------------------------------------------------------ the stream's side

    def set_limit(self, limit: int | None) -> None:
        """An allocation arrived: its space limit, or None when it carries none (no capacity)."""
        with self._cond:
            self._limit = limit
            self._attaching = False
            self._enforced = True
            self._wake_all()

    def raise_limit(self, limit: int) -> None:
        """A later allocation of the same stream: the limit only rises on a stream."""
        with self._cond:
            self._attaching = False
            self._enforced = True
            if self._limit is None or limit > self._limit:
                self._limit = limit
            self._wake_all()

    def new_stream(self) -> None:
        """A new stream starts with no unused reservation: the limit drops to ``added`` until
        the new stream's first allocation says otherwise."""
        with self._cond:
            if self._limit is not None:
                self._limit = min(self._limit, self._added)

    def release(self) -> None:
        """No controller: stop enforcing (the attach timeout passed, or ``fallback_grace`` did
        after the lease ran out). The next allocation enforces again."""
        with self._cond:
            self._attaching = False
            self._enforced = False
            self._wake_all()

    def attach_timed_out(self) -> None:
        """The first allocation did not come in time: writes stop waiting for it (the session
        runs on its fallback). A limit granted before, if any, stays in force."""
        with self._cond:
            if self._attaching:
                self._attaching = False
                self._wake_all()

    def close(self) -> None:
        """The session closes: every waiter proceeds, and so does every later write."""
        with self._cond:
            self._closed = True
            self._wake_all()

    def snapshot(self, *, reported: bool = False) -> SpaceStats:
        with self._cond:
            now = self._clock()
            stats = SpaceStats(
                buffer=pb.Buffer(
                    resident=self._resident,
                    pending=self._pending,
                    added=self._landed,
                    drain_error=self._drain_error,
                ),
                waiting=self._waiters > 0,
                wait_seconds=self._waited(now),
            )
            if reported:
                self._reported_waiting = stats.waiting
            return stats

    # ------------------------------------------------------------------ internals (lock held)

    def _take(self, nbytes: int, landed: bool) -> None:
        self._added += nbytes
        if landed:
            self._landed += nbytes

    def _begin_wait(self) -> float:
        now = self._clock()
        self._start_wait(now)
        return now
