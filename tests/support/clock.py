"""Clocks a test sets by hand: what every part that takes a ``clock`` callable reads, and a
timer on such a clock (what the scheduler takes as its ``timer``)."""

from __future__ import annotations

import heapq
from collections.abc import Callable


class FakeClock:
    """Returns ``now`` when called; a test moves it (``clock.now += 2.0``, ``advance``)."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Moves the clock ``seconds`` on; the new time."""
        self.now += seconds
        return self.now


class VirtualTimer(FakeClock):
    """A clock with a timer (``call_later``, as the scheduler's ``Timer``): callbacks run,
    in the order they fall due, when the test moves the clock past their time."""

    def __init__(self, now: float = 0.0) -> None:
        super().__init__(now)
        self._due: list[tuple[float, int, _Handle]] = []
        self._count = 0

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Handle:
        handle = _Handle(callback)
        self._count += 1
        heapq.heappush(self._due, (self.now + delay, self._count, handle))
        return handle

    def next_due(self) -> float | None:
        """When the next callback that is not cancelled falls due; None: none."""
        while self._due and self._due[0][2].cancelled:
            heapq.heappop(self._due)
        return self._due[0][0] if self._due else None

    def run_to(self, to: float) -> None:
        """Moves the clock to ``to`` and runs what falls due by then, in order."""
        self.now = to
        while (due := self.next_due()) is not None and due <= to:
            _, _, handle = heapq.heappop(self._due)
            handle.callback()


class _Handle:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
