"""The mount's requests, paced through the node's `Pacer` (`burstctl.node.pacer`).

`PacedRequests` is what `fs.PassthroughFS` asks of pacing. It books a read or write to its
caller's job, or, for a request the kernel makes on its own (writeback of a shared mapping:
pid 0, or a ``writepage``), to whoever opened the file; it counts the open files of each job
(the last close ends its phase); and it never lets pacing fail the application's I/O: a pacing
error is logged and the request is served unpaced. Only the kernel's interrupt ends a request
that waits (`burstctl.client.waits.Interrupted`, answered EINTR), before it did anything.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

from burstctl.client.job import JobInfo
from burstctl.node.attribution import Caller
from burstctl.node.pacer import Pacer
from burstctl.node.sessions import JobSession

logger = logging.getLogger(__name__)


class PacedRequests:
    """The mount's side of pacing; thread-safe. ``caller(req)``: a request's credentials."""

    def __init__(self, pacer: Pacer, caller: Callable[[int], Caller]) -> None:
        self._pacer = pacer
        self._caller = caller
        self._lock = threading.Lock()
        self._openers: dict[int, Caller] = {}  # fh -> who opened it

    def pace(self, caller: Caller, kind: str, nbytes: int) -> JobSession | None:
        """Paces a request of ``kind`` (read, write or metadata) before it is served. A write
        waits for the job's space on the burst buffer too (after its bandwidth): the session
        that granted it is returned, to be told (`landed`) when the bytes are written.
        `InterruptedError` when the kernel interrupted the request while it waited."""
        try:
            if kind == "metadata":
                self._pacer.metadata(caller)
            else:
                return self._pacer.data(caller, kind, nbytes, space=kind == "write")
        except InterruptedError:
            raise  # the kernel interrupted the request: EINTR, nothing was done
        except Exception:
            logger.exception("pacing a %s request failed; serving it unpaced", kind)
        return None

    def landed(self, granted: JobSession | None, nbytes: int) -> None:
        """The bytes of a write are on the buffer and reported (`Pacer.landed`)."""
        if granted is not None:
            self._pacer.landed(granted, nbytes)

    @contextlib.contextmanager
    def bringing_back(self, caller: Callable[[], Caller]) -> Iterator[Callable[[int], None]]:
        """A ``pace(n)`` for bytes the mount itself brings back onto the buffer for a caller
        (an evicted file, a drained chunk): the caller's job's writes, whose space lands at
        the exit, once the block's report counted them. ``caller`` is asked at the first."""
        granted: list[tuple[JobSession, int]] = []

        def pace(nbytes: int) -> None:
            session = self.pace(caller(), "write", nbytes)
            if session is not None:
                granted.append((session, nbytes))

        try:
            yield pace
        finally:
            for session, nbytes in granted:
                self.landed(session, nbytes)

    def job_of(self, caller: Caller) -> JobInfo:
        """The job ``caller``'s requests are booked to."""
        return self._pacer.job_of(caller)

    def data_caller(self, req: int, fh: int, writepage: bool = False) -> Caller:
        """Who a read or write is booked to: its caller, or for a request the kernel makes
        on its own (writeback of a shared mapping: pid 0), whoever opened the file."""
        caller = self._caller(req)
        if caller.pid == 0 or writepage:
            return self._openers.get(fh, caller)
        return caller

    def opened(self, caller: Caller, fh: int) -> None:
        """``caller`` opened ``fh``: its job has one more open file."""
        with self._lock:
            self._openers[fh] = caller
        try:
            self._pacer.opened(caller, fh)
        except Exception:
            logger.exception("recording an open file failed; its job's phase ends by time")

    def released(self, fh: int) -> None:
        """The close of ``fh`` (before the handle is closed: its number may be reused then)."""
        with self._lock:
            self._openers.pop(fh, None)
        try:
            self._pacer.released(fh)
        except Exception:
            logger.exception("recording a closed file failed")
