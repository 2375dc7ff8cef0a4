"""Sessions gone without a Goodbye, whose clients may still pace: ``Ghosts``.

A client whose lease runs out unrenewed (the controller stalled or lagged) gives up its
stream and goes on pacing under its fallback: at the rate it was last allotted, then at its
share of the fallback budget (client/fallback.py). The servicer takes a stream that ends
without a Goodbye for one such when it had not renewed the session's allocation in time
(``ControllerServicer._gave_up``); a client that exited ends its stream while renewals are on
time, and its rate is free at once.
Until it opens a new session, which declares that rate (``Hello.pacing_rate``) and is
counted from then on, the rate is in force at a client the job table no longer holds. A
ghost keeps it counted: the scheduler decides over the capacity less the ghosts' rates, so
that the sessions that come back, and those that are still away, never add to what it hands
out (docs/client.md, "When the controller is away").

A ghost ends when a session of the same client and job opens (it now declares its rate), or
after ``retention`` seconds (the heartbeat timeout: as long as a silent session is given): a
client that is alive comes back within that once the controller answers again (its channel
retries every 2 s at most), so one that has not is taken as gone: it exited, or it is cut off
from the controller, when its rate is no longer counted (docs/client.md, "The invariant").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# (client_id, job_id, drain): the client's session of a job, one per purpose
GhostKey = tuple[str, str, bool]


@dataclass(slots=True)
class _Ghost:
    rate: float
    until: float


class Ghosts:
    """The rates of sessions gone without a Goodbye, by pool: application streams share the
    capacity B, drain streams the PFS bandwidth."""

    def __init__(self, retention: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.retention = retention
        self._clock = clock
        self._ghosts: dict[GhostKey, _Ghost] = {}

    def __len__(self) -> int:
        return len(self._ghosts)

    def add(self, key: GhostKey, rate: float) -> None:
        """A session gone without a Goodbye, whose client may pace at up to ``rate``."""
        if rate > 0.0:
            self._ghosts[key] = _Ghost(rate, self._clock() + self.retention)

    def claim(self, key: GhostKey) -> bool:
        """A session of that client and job opened (it declares its rate): the ghost ends.
        True if there was one."""
        return self._ghosts.pop(key, None) is not None

    def expire(self) -> bool:
        """Drops the ghosts past their retention; True if any."""
        now = self._clock()
        gone = [key for key, ghost in self._ghosts.items() if ghost.until <= now]
        for key in gone:
            del self._ghosts[key]
        return bool(gone)

    def reserved(self) -> tuple[float, float]:
        """The rates the ghosts may pace at: (application streams, drain streams)."""
        pools = [0.0, 0.0]
        for (_, _, drain), ghost in self._ghosts.items():
            pools[drain] += ghost.rate
        return pools[0], pools[1]
