"""What a session's Usage reports say: its counters since the previous report.

Each report carries the bytes, operations and wait time since the previous one (the controller
derives the job's demand from them), whether the session waits now, and its cumulative totals
(so that a report lost with a stream or a restart is booked by the next one). A session that
tracks the burst buffer adds its space gate's gauges; a writer waiting for space waits like one
waiting for tokens, so the controller sees it in the flag and the wait seconds
(docs/capacity.md).

A periodic report that would say nothing new is not sent (`UsageReports.take` with a
``heartbeat``): the session waits as it did, moves at the rate it reported (within
`RATE_TOLERANCE`), and its buffer did not change. The next one covers the whole span. At
least one goes out every ``heartbeat`` seconds, which the controller sets well inside its
heartbeat timeout (``Allocation.heartbeat_seconds``; docs/protocol.md, "Usage when it
changes"). A session that moves steadily or idles thus costs the controller a message per
heartbeat, not per report interval.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from burstctl.client.bucket import Throttle, ThrottleStats
from burstctl.client.space import SpaceGate
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

# A periodic report goes out when the session's rate over it differs from the rate it last
# reported by more than this fraction (or its share of time waiting by more than this much).
RATE_TOLERANCE = 0.1


class UsageReports:
    """The reports of one session, each since the previous one taken (`take`)."""

    def __init__(
        self, throttle: Throttle, space: SpaceGate | None, clock: Callable[[], float]
    ) -> None:
        self._throttle = throttle
        self._space = space
        self._clock = clock
        self._last = ThrottleStats(bytes=0, acquires=0, wait_seconds=0.0, waiting=False)
        self._last_at = 0.0
        # What the last report sent said: its rate, share of time waiting and buffer.
        self._said: tuple[float, float, pb.Buffer | None] | None = None

    def start(self) -> None:
        """The session starts now: the first report's interval begins."""
        self._last_at = self._clock()

    def take(
        self, force_waiting: bool, applied_epoch: int, heartbeat: float | None = None
    ) -> pb.ClientMessage | None:
        """The next report (``force_waiting``: an immediate report, sent as an acquire starts
        waiting, says so even if that acquire has been served since). With ``heartbeat`` (a
        periodic report): None if it would say nothing new and the last one is younger than
        ``heartbeat`` seconds."""
        now = self._clock()
        if heartbeat is not None and not force_waiting and self._quiet(now, heartbeat):
            return None
        stats, buffer = self._snapshot(True, force_waiting)
        previous = self._last
        usage = pb.Usage(
            bytes=stats.bytes - previous.bytes,
            ops=stats.acquires - previous.acquires,
            wait_seconds=max(0.0, stats.wait_seconds - previous.wait_seconds),
            interval_seconds=max(0.0, now - self._last_at),
            waiting=stats.waiting,
            totals=pb.Counters(
                bytes=stats.bytes,
                bytes_read=stats.bytes_read,
                bytes_written=stats.bytes_written,
                ops=stats.acquires,
                metadata_ops=stats.metadata_acquires,
                wait_seconds=stats.wait_seconds,
            ),
            applied_epoch=applied_epoch,
            buffer=buffer,
        )
        self._said = self._saying(stats, now, buffer)
        self._last, self._last_at = stats, now
        return pb.ClientMessage(usage=usage)

    def _snapshot(
        self, reported: bool, force_waiting: bool = False
    ) -> tuple[ThrottleStats, pb.Buffer | None]:
        """The throttle's counters with the space gate's waits, and the buffer's gauges."""
        stats = self._throttle.snapshot(reported=reported, assume_waiting=force_waiting)
        if self._space is None:
            return stats, None
        space = self._space.snapshot(reported=reported)
        merged = dataclasses.replace(
            stats,
            waiting=stats.waiting or space.waiting,
            wait_seconds=stats.wait_seconds + space.wait_seconds,
        )
        return merged, space.buffer

    def _saying(
        self, stats: ThrottleStats, now: float, buffer: pb.Buffer | None
    ) -> tuple[float, float, pb.Buffer | None]:
        """What a report of ``stats`` now says: rate and share of time waiting since the last
        report, and the buffer."""
        interval = max(1e-9, now - self._last_at)
        return (
            (stats.bytes - self._last.bytes) / interval,
            max(0.0, stats.wait_seconds - self._last.wait_seconds) / interval,
            buffer,
        )

    def _quiet(self, now: float, heartbeat: float) -> bool:
        """Whether a report now would say what the last one said (and that one is recent)."""
        said = self._said
        if said is None or now - self._last_at >= heartbeat:
            return False
        stats, buffer = self._snapshot(False)
        if stats.waiting != self._last.waiting:
            return False
        rate, waited, _ = self._saying(stats, now, buffer)
        return (
            abs(rate - said[0]) <= RATE_TOLERANCE * said[0]
            and abs(waited - said[1]) <= RATE_TOLERANCE
            and buffer == said[2]
        )
