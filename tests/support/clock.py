"""A clock a test sets by hand: what every part that takes a ``clock`` callable reads."""

from __future__ import annotations


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
