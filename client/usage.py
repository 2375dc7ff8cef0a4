"""What a session's Usage reports say: its counters since the previous report.

Each report carries the bytes, operations and wait time since the previous one (the controller
derives the job's demand from them), whether the session waits now, and its cumulative totals
(so that a report lost with a stream or a restart is booked by the next one). A session that
tracks the burst buffer adds its space gate's gauges; a writer waiting for space waits like one
waiting for tokens, so the controller sees it in the flag and the wait seconds
(docs/capacity.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from burstctl.client.bucket import Throttle, ThrottleStats
from burstctl.client.space import SpaceGate
from burstctl.proto.burstctl.v1 import controller_pb2 as pb


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

    def start(self) -> None:
        """The session starts now: the first report's interval begins."""
        self._last_at = self._clock()

    def take(self, force_waiting: bool, applied_epoch: int) -> pb.ClientMessage:
        """The next report (``force_waiting``: an immediate report, sent as an acquire starts
        waiting, says so even if that acquire has been served since)."""
        now = self._clock()
        stats = self._throttle.snapshot(reported=True, assume_waiting=force_waiting)
        buffer: pb.Buffer | None = None
        if self._space is not None:
            space = self._space.snapshot(reported=True)
            buffer = space.buffer
            stats = dataclasses.replace(
                stats,
                waiting=stats.waiting or space.waiting,
                wait_seconds=stats.wait_seconds + space.wait_seconds,
            )
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
        self._last, self._last_at = stats, now
        return pb.ClientMessage(usage=usage)
