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

A controller that restarts knows none of its predecessor's sessions, whose clients go on
pacing at what it allotted them. ``InForce`` saves the sum of the rates in force (every
``ledger_interval``, in ``in_force.json``), and a restart counts it as a reserve
(``Ghosts.reserve``): each client that comes back declares the rate it was last allotted
(``Hello.allotted``) and takes it out of the reserve, which ends after the lease and the
fallback grace (what is left then is the rate of clients that did not come back: they paced
at it that long at most, then at their budget shares).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from burstctl.common.files import DurableFile

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
        # A restart's reserve: the predecessor's rates in force whose clients are not back
        # yet, by pool, and until when it counts.
        self._reserve = [0.0, 0.0]
        self._reserve_until = 0.0

    def __len__(self) -> int:
        return len(self._ghosts)

    def reserve(self, app: float, drain: float, retention: float) -> None:
        """A restart: the rates the predecessor's clients were allotted, counted until they
        are back (`claim`) or ``retention`` seconds pass: as long as a client that cannot
        reach us keeps such a rate (the lease, then its fallback's grace)."""
        self._reserve = [max(0.0, app), max(0.0, drain)]
        self._reserve_until = self._clock() + retention

    def add(self, key: GhostKey, rate: float) -> None:
        """A session gone without a Goodbye, whose client may pace at up to ``rate``."""
        if rate > 0.0:
            self._ghosts[key] = _Ghost(rate, self._clock() + self.retention)

    def claim(self, key: GhostKey, declared: float = 0.0) -> bool:
        """A session of that client and job opened, declaring the rate it paces at and the one
        it was last allotted (``declared``: the higher): its ghost ends (True if there was
        one), or else, a client of the predecessor coming back, that rate leaves the restart's
        reserve (its session's rate is counted from now on)."""
        if self._ghosts.pop(key, None) is not None:
            return True
        pool = 1 if key[2] else 0
        self._reserve[pool] = max(0.0, self._reserve[pool] - declared)
        return False

    def expire(self) -> bool:
        """Drops the ghosts past their retention; True if any."""
        now = self._clock()
        gone = [key for key, ghost in self._ghosts.items() if ghost.until <= now]
        for key in gone:
            del self._ghosts[key]
        if any(self._reserve) and self._reserve_until <= now:
            self._reserve = [0.0, 0.0]
            return True
        return bool(gone)

    def reserved(self) -> tuple[float, float]:
        """The rates the ghosts may pace at: (application streams, drain streams)."""
        pools = list(self._reserve)
        for (_, _, drain), ghost in self._ghosts.items():
            pools[drain] += ghost.rate
        return pools[0], pools[1]


IN_FORCE_FILE = "in_force.json"


class InForce:
    """The sum of the rates in force at a replica's clients, saved for its successor
    (`common/files.py: keep_saving`): the rates offered to its sessions (``rates()``: the
    application and drain pools) and its ghosts'."""

    def __init__(
        self, state_dir: Path, rates: Callable[[], tuple[float, float]], ghosts: Ghosts
    ) -> None:
        self.file = DurableFile(state_dir / IN_FORCE_FILE, "the rates in force at the clients")
        self._rates = rates
        self._ghosts = ghosts
        self.saved_version = 0
        self._saved: tuple[float, float] | None = None
        self.final = False  # saved for the last time (the replica stops: its streams end next)

    def _now(self) -> tuple[float, float]:
        (app, drain), (away, drains_away) = self._rates(), self._ghosts.reserved()
        return app + away, drain + drains_away

    @property
    def version(self) -> int:
        """Moves when the sum does (a save only then), until the last save."""
        return self.saved_version + (not self.final and self._now() != self._saved)

    def snapshot(self) -> tuple[float, float]:
        self._saved = self._now()
        return self._saved

    def write(self, snapshot: Any) -> None:
        app, drain = snapshot
        self.file.save(json.dumps({"format": 1, "app": app, "drain": drain}))

    def load(self) -> tuple[float, float]:
        """What the predecessor saved ((0, 0): nothing, or unreadable, kept aside)."""
        loaded = self.file.load(_parse_in_force)
        return loaded if loaded is not None else (0.0, 0.0)


def _parse_in_force(text: str) -> tuple[float, float]:
    data = json.loads(text)
    if data.get("format") != 1:
        raise ValueError(f"unknown format {data.get('format')!r}")
    app, drain = float(data["app"]), float(data["drain"])
    if not (0.0 <= app < float("inf") and 0.0 <= drain < float("inf")):
        raise ValueError(f"rates must be finite and >= 0, got {app!r}, {drain!r}")
    return app, drain
