"""When the stage-out copies a file: the queue of files due, and the copies that fail.

`CopyQueue`: a file is queued with a delay (0, or a retry's backoff); the drain's workers
`take` the one due first, blocking until one is due or the stage-out stops. Never two copies of
one file at once: a file queued again while a worker copies it is queued once that copy is
`done`, with the shorter of the delays asked for.

`DrainErrors`: a failed copy is retried with a backoff (`retry_delay`: the minimum doubling up to
the maximum); its cause is logged once, and reported as its job's ``drain_error`` until a copy
of the job succeeds.

`ReportTimer`: the jobs' gauges are reported every interval, and soon after something changed
them at once (an eviction, a failure).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from burstctl.node.stageout_marks import Key, decode_job

logger = logging.getLogger(__name__)


@dataclass(order=True, slots=True)
class _Due:
    at: float
    seq: int
    key: Key = field(compare=False)


class CopyQueue:
    """Files due for their copy; thread-safe. ``stopping``: once set, `take` returns None."""

    def __init__(self, clock: Callable[[], float], stopping: threading.Event) -> None:
        self._clock = clock
        self._stopping = stopping
        self._wake = threading.Condition(threading.Lock())
        self._queue: list[_Due] = []
        self._queued: dict[Key, _Due] = {}
        self._seq = itertools.count()
        self._busy: set[Key] = set()  # being copied by a worker
        self._again: dict[Key, float] = {}  # queued while busy: (re)queued when done, delay

    def put(self, key: Key, delay: float = 0.0) -> None:
        """Queues ``key``, due in ``delay`` seconds (a file already queued keeps its time)."""
        with self._wake:
            if key in self._busy:  # never two copies of one file at once
                self._again[key] = min(delay, self._again.get(key, delay))
                return
            if key in self._queued:
                return
            due = _Due(self._clock() + delay, next(self._seq), key)
            self._queued[key] = due
            heapq.heappush(self._queue, due)
            self._wake.notify()

    def take(self) -> Key | None:
        """The next file due, once it is due (a worker copies it, then calls `done`); None
        once stopping."""
        with self._wake:
            while not self._stopping.is_set():
                if self._queue:
                    wait = self._queue[0].at - self._clock()
                    if wait <= 0:
                        due = heapq.heappop(self._queue)
                        del self._queued[due.key]
                        self._busy.add(due.key)
                        return due.key
                    self._wake.wait(wait)
                else:
                    self._wake.wait()
            return None

    def done(self, key: Key) -> None:
        """A worker is done with ``key``: queued again if it was asked for meanwhile."""
        with self._wake:
            self._busy.discard(key)
            again = self._again.pop(key, None)
        if again is not None:
            self.put(key, again)

    def pending(self) -> int:
        """Files queued or being copied."""
        with self._wake:
            return len(self._queued) + len(self._busy)

    def wake_all(self) -> None:
        """Wakes every waiting `take` (to see that the stage-out stops)."""
        with self._wake:
            self._wake.notify_all()


def retry_delay(attempts: int, minimum: float, maximum: float) -> float:
    """How long a file waits before its copy is tried again, after ``attempts`` failures."""
    return min(maximum, minimum * 2 ** (attempts - 1))


class DrainErrors:
    """Why each job's copies to ``pfs`` fail (by job tag), until one of them succeeds; each
    cause is logged once until a good copy. Thread-safe."""

    def __init__(self, pfs: Path | None) -> None:
        self._pfs = pfs
        self._lock = threading.Lock()
        self._errors: dict[bytes, str] = {}  # job tag -> why its copies fail
        self._logged: set[str] = set()  # causes logged since the last good copy

    def failed(self, tag: bytes, cause: str) -> None:
        with self._lock:
            new_cause = cause not in self._logged
            self._logged.add(cause)
            self._errors[tag] = cause
        if new_cause:
            logger.error(
                "stage-out to %s: %s (retrying, files stay on the buffer)", self._pfs, cause
            )

    def succeeded(self, tag: bytes) -> None:
        with self._lock:
            had = self._errors.pop(tag, None)
            if had is not None:
                self._logged.discard(had)
        if had is not None:
            logger.info("stage-out to %s works again (was: %s)", self._pfs, had)

    def of(self, tag: bytes) -> str:
        """Why the job's copies fail ("": they do not)."""
        return self._errors.get(tag, "")

    def by_job(self) -> dict[str, str]:
        """Why copies fail, per job id (tests, logs)."""
        with self._lock:
            tags = dict(self._errors)
        return {(job.job_id if (job := decode_job(tag)) else ""): c for tag, c in tags.items()}


class ReportTimer:
    """Runs ``report`` every ``interval`` seconds, and at once when asked (`soon`), on the
    thread that runs `run`, until ``stopping`` is set. A failing report is logged; the next one
    runs all the same."""

    def __init__(
        self, report: Callable[[], None], interval: float, stopping: threading.Event
    ) -> None:
        self._report = report
        self._interval = interval
        self._stopping = stopping
        self._now = threading.Event()

    def soon(self) -> None:
        """Reports now rather than at the next interval (and wakes the thread to stop)."""
        self._now.set()

    def run(self) -> None:
        while not self._stopping.is_set():
            self._now.wait(self._interval)
            self._now.clear()
            if self._stopping.is_set():
                return
            try:
                self._report()
            except Exception:
                logger.exception("stage-out: reporting the buffer failed")
