"""The core of a session with one replica: the hot path behind ``acquire``, the operations,
and the lifecycle.

`SessionCore` owns the thread-safe hot path (``acquire`` against the session's `Throttle`), the
operations of the session — explicit ones, and the implicit one that the first ``acquire``
after a quiet gap posts and that completes after ``quiet_gap`` seconds without I/O, or at once
on `SessionCore.end_phase` — and starting and closing the session on an asyncio loop. What goes
over the wire, and when, is the `SessionStream`'s. A public `Session` has one core, or one per
advised replica when it stripes.

A core runs on one asyncio loop: the caller's for `AsyncSession`; for the sync `Session`,
the loop of a `ClientRuntime`, which may be shared by many cores. On that loop it either
uses a channel it is given (and leaves it open) or opens one of its own (and closes it).

Threading model: ``acquire`` may be called from any thread (or the loop, for coroutines). It
touches only counters and the token bucket under locks; the rare transitions (an operation is
posted or completed, the session starts waiting) are handed to the loop with
``call_soon_threadsafe``. Everything else lives on the loop and needs no lock.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping

import grpc

from burstctl.client.bucket import Pattern, Throttle
from burstctl.client.channel import open_channel
from burstctl.client.kinds import check_nbytes, op_kind
from burstctl.client.link import NodeLink
from burstctl.client.metadata import MetadataPace
from burstctl.client.options import SessionOptions
from burstctl.client.space import SpaceGate
from burstctl.client.stream import SessionStream
from burstctl.common.limits import MAX_QUIET_SECONDS
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

# While an acquire is blocked, how often the quiet-gap timer looks again (at least).
_MIN_QUIET_RECHECK = 0.01


class SessionCore:
    """One session with one replica: the pacing and the operations behind the public API."""

    def __init__(self, options: SessionOptions, clock: Callable[[], float] = time.monotonic):
        self._options = options
        self._clock = clock
        self._throttle = Throttle(
            clock,
            on_wait_start=self._on_wait_start,
            on_rate_change=options.rate_observer,
            on_bucket=options.bucket_observer,
        )
        self._space = (
            SpaceGate(
                clock,
                on_wait_start=self._on_wait_start,
                on_error_change=self._on_drain_error_change,
            )
            if options.buffer
            else None
        )
        self._metadata = MetadataPace(clock, options.metadata_observer)
        self._stream = SessionStream(options, self._throttle, clock, self._space, self._metadata)

        # Hot-path state, shared with application threads: guarded by _lock.
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._last_op_id = 0
        self._explicit_ops = 0
        self._implicit_op: int | None = None
        self._acquiring = 0
        self._last_acquire_end = 0.0
        self._held = False  # hold_waiting(True) in force

        # Loop-only state.
        self._quiet_timer: asyncio.TimerHandle | None = None
        self._quiet_op: int | None = None  # the implicit operation the timer looks after
        self._link: NodeLink | None = None
        self._owns_link = False
        self._closed_event = asyncio.Event()

    # ------------------------------------------------------------------ public state

    @property
    def options(self) -> SessionOptions:
        return self._options

    @property
    def rate(self) -> float:
        return self._throttle.rate

    @property
    def pattern(self) -> Pattern | None:
        return self._throttle.pattern

    @property
    def metadata_rate(self) -> float:
        """The metadata operations per second in force (0: unpaced)."""
        return self._metadata.rate

    @property
    def attached(self) -> bool:
        return self._stream.attached

    @property
    def refused(self) -> str | None:
        return self._stream.refused

    @property
    def advice(self) -> tuple[str, ...]:
        """The replica addresses the controller advises the session's job now (empty: none
        given; docs/placement-live.md, "Following the advice")."""
        return self._stream.advice

    @property
    def in_phase(self) -> bool:
        """An operation is open, implicit or explicit, or an acquire is under way: the job is
        in an I/O phase on this stream."""
        with self._lock:
            return self._implicit_op is not None or self._explicit_ops > 0 or self._acquiring > 0

    @property
    def stream_ends(self) -> Mapping[str, int]:
        """How the session's streams ended so far, by status name (docs/protocol.md)."""
        return self._stream.ends

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def channel(self) -> grpc.aio.Channel | None:
        """The channel the session's stream runs on (None before `start`)."""
        return None if self._link is None else self._link.channel

    @property
    def total_wait_seconds(self) -> float:
        space = self._space.snapshot().wait_seconds if self._space is not None else 0.0
        return self._throttle.total_wait_seconds + space

    @property
    def space_limit(self) -> int | None:
        """The burst buffer's space limit in force (None: none received, nothing limited)."""
        return self._space.limit if self._space is not None else None

    @property
    def buffer_added(self) -> int:
        """Bytes `acquire_space` let through since the session started."""
        return self._space.added if self._space is not None else 0

    def wait_attached(self, timeout: float | None) -> bool:
        """Blocks a thread until an allocation from a live controller is in force."""
        return self._stream.wait_attached(timeout)

    async def wait_attached_async(self, timeout: float | None) -> bool:
        """Suspends a coroutine on the core's loop until the session is attached."""
        return await self._stream.wait_attached_async(timeout)

    # ------------------------------------------------------------------ hot path (any thread)

    def acquire(self, nbytes: int, kind: str = "write") -> None:
        kind_value, nbytes = op_kind(kind), check_nbytes(nbytes)
        if kind_value == pb.OP_KIND_METADATA:
            self._metadata.acquire()
        self._begin_acquire(kind_value)
        try:
            self._throttle.acquire(nbytes, kind_value)
        finally:
            self._end_acquire()

    async def acquire_async(self, nbytes: int, kind: str = "write") -> None:
        kind_value, nbytes = op_kind(kind), check_nbytes(nbytes)
        if kind_value == pb.OP_KIND_METADATA:
            await self._metadata.acquire_async()
        self._begin_acquire(kind_value)
        try:
            await self._throttle.acquire_async(nbytes, kind_value)
        finally:
            self._end_acquire()

    def record(self, nbytes: int, kind: str = "write", calls: int = 1) -> None:
        """Books ``nbytes`` paced elsewhere in ``calls`` calls, without waiting: the counters
        and the implicit operation move as for acquires that did not wait."""
        kind_value, nbytes = op_kind(kind), check_nbytes(nbytes)
        if self._counted_alone(nbytes, kind_value, calls):
            return
        self._begin_acquire(kind_value)
        try:
            self._throttle.count(nbytes, kind_value, calls)
        finally:
            self._end_acquire()

    def acquire_metadata(self) -> None:
        """One metadata operation outside any I/O phase (a shim's stat, create, unlink):
        waits for the metadata bucket, and is counted; it draws no bytes and opens no phase
        (a job that only stats is no job in I/O for the policies)."""
        self._metadata.acquire()
        self._counted_alone(0, pb.OP_KIND_METADATA)

    def _counted_alone(self, nbytes: int, kind: pb.OpKind, calls: int = 1) -> bool:
        """Metadata operations that move no bytes, booked outside any phase: counted (the
        usage's metadata_ops), and nothing more. True when they were."""
        if nbytes or kind != pb.OP_KIND_METADATA:
            return False
        self._throttle.count(0, kind, calls)
        return True

    def hold_waiting(self, waiting: bool) -> None:
        """I/O paced elsewhere is (not) waiting for tokens: one waiter on the throttle, and
        the implicit operation stays open while it waits, as for a blocked `acquire`."""
        with self._lock:
            if waiting != self._held:
                self._held = waiting
                self._acquiring += 1 if waiting else -1
                self._last_acquire_end = self._clock()
        self._throttle.hold_wait(bool(waiting))

    def _gate(self) -> SpaceGate:
        if self._space is None:
            raise RuntimeError("acquire_space and report_buffer need a session with buffer=True")
        return self._space

    def acquire_space(self, nbytes: int, landed: bool = True) -> None:
        """Blocks until ``nbytes`` more fit under the space limit (docs/capacity.md)."""
        gate, nbytes = self._gate(), check_nbytes(nbytes)
        gate.acquire(nbytes, landed)

    async def acquire_space_async(self, nbytes: int, landed: bool = True) -> None:
        gate, nbytes = self._gate(), check_nbytes(nbytes)
        await gate.acquire_async(nbytes, landed)

    def space_landed(self, nbytes: int) -> None:
        """Bytes acquired with ``landed=False`` are on the buffer, reported (`SpaceGate.land`)."""
        self._gate().land(check_nbytes(nbytes))

    def report_buffer(self, resident: int, pending: int, drain_error: str = "") -> None:
        """Sets the buffer gauges sent with the next Usage (at once if drain_error changed)."""
        gate = self._gate()
        resident = check_nbytes(resident, "resident")
        pending = check_nbytes(pending, "pending")
        if pending > resident:
            raise ValueError(f"pending ({pending}) must be <= resident ({resident})")
        if not isinstance(drain_error, str):
            raise ValueError(f"drain_error must be a string, got {drain_error!r}")
        gate.report(resident, pending, drain_error)

    def _on_drain_error_change(self) -> None:
        loop = self._loop
        if loop is not None and not self._closed:
            loop.call_soon_threadsafe(self._stream.send_usage, False)

    def open_operation(self, kind: pb.OpKind, volume: int) -> int:
        """Posts an explicit operation; it replaces the implicit one while it is open."""
        with self._lock:
            loop = self._running_loop()
            op_id = self._new_op_id()
            self._explicit_ops += 1
            replaced, self._implicit_op = self._implicit_op, None
            loop.call_soon_threadsafe(self._post_op, op_id, kind, volume, False)
            if replaced is not None:
                # Posted after the explicit one, so the job never looks idle in between.
                loop.call_soon_threadsafe(self._complete_op, replaced)
        return op_id

    def close_operation(self, op_id: int) -> None:
        with self._lock:
            self._explicit_ops -= 1
            if not self._closed and self._loop is not None:
                self._loop.call_soon_threadsafe(self._complete_op, op_id)

    def end_phase(self) -> None:
        """Completes the implicit operation now instead of after the quiet gap.

        For a caller that knows the burst is over (the FUSE mount, when a job's last open file
        is closed). A no-op when no implicit operation is open; the next ``acquire`` posts a new
        one.
        """
        with self._lock:
            op_id, self._implicit_op = self._implicit_op, None
            quiet = 0.0 if self._acquiring else self._quiet_since_last()
            if op_id is not None and not self._closed and self._loop is not None:
                self._loop.call_soon_threadsafe(self._complete_op, op_id, quiet)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise RuntimeError("session is closed")
        if self._loop is None:
            raise RuntimeError("session is not started")
        return self._loop

    def _new_op_id(self) -> int:
        self._last_op_id += 1
        return self._last_op_id

    def _begin_acquire(self, kind: pb.OpKind) -> None:
        with self._lock:
            loop = self._running_loop()
            self._acquiring += 1
            if self._explicit_ops == 0 and self._implicit_op is None:
                op_id = self._new_op_id()
                self._implicit_op = op_id
                loop.call_soon_threadsafe(self._post_op, op_id, kind, 0, True)

    def _end_acquire(self) -> None:
        with self._lock:
            self._acquiring -= 1
            self._last_acquire_end = self._clock()

    def _on_wait_start(self) -> None:
        # Called by the throttle under its lock: only hand the report over to the loop.
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._stream.send_usage, True)

    # ------------------------------------------------------------------ lifecycle (on the loop)

    async def start(self, link: NodeLink | None = None) -> None:
        """Starts the session on the running loop, on ``link`` (its node's stream to the
        replica, `client/link.py`) or on a channel and stream of its own.

        A link that is given stays open when the session closes (others share it).
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("session is closed")
            if self._loop is not None:
                raise RuntimeError("session is already started")
            self._loop = asyncio.get_running_loop()
        self._owns_link = link is None
        self._link = (
            NodeLink(open_channel(self._options.target, self._options.security))
            if link is None
            else link
        )
        self._stream.start(self._link)

    async def close(self) -> None:
        """Says Goodbye, ends the stream and stops every task; idempotent.

        Closes the link and its channel only if the session opened them itself.
        """
        with self._lock:
            already_closed, self._closed = self._closed, True
            started = self._loop is not None
        if already_closed:
            if started:
                await self._closed_event.wait()
            return
        self._throttle.close()
        self._metadata.close()
        if self._space is not None:
            self._space.close()
        if not started:
            return
        try:
            self._cancel_quiet_timer()
            await self._stream.close()
            if self._owns_link and self._link is not None:
                await self._link.close()
                await self._link.channel.close()
        finally:
            self._closed_event.set()

    # ------------------------------------------------------------------ operations (on the loop)

    def _post_op(self, op_id: int, kind: pb.OpKind, volume: int, implicit: bool) -> None:
        if self._stream.post(op_id, kind, volume) and implicit:
            self._arm_quiet_timer(op_id, self._options.quiet_gap)

    def _complete_op(self, op_id: int, quiet: float = 0.0) -> None:
        if op_id == self._quiet_op:
            self._cancel_quiet_timer()
        self._stream.complete(op_id, quiet)

    def _quiet_since_last(self) -> float:
        """Seconds since the last acquire ended (under the lock): how long an implicit
        operation completed now stayed open after its last byte, which the controller takes
        off its phase's end (docs/persched.md, "Learned periods")."""
        return min(max(0.0, self._clock() - self._last_acquire_end), MAX_QUIET_SECONDS)

    def _arm_quiet_timer(self, op_id: int, delay: float) -> None:
        assert self._loop is not None
        self._cancel_quiet_timer()
        self._quiet_op = op_id
        self._quiet_timer = self._loop.call_later(delay, self._on_quiet_timer, op_id)

    def _cancel_quiet_timer(self) -> None:
        if self._quiet_timer is not None:
            self._quiet_timer.cancel()
        self._quiet_timer = self._quiet_op = None

    def _on_quiet_timer(self, op_id: int) -> None:
        """Completes the implicit operation ``op_id`` once ``quiet_gap`` passed without I/O."""
        self._quiet_timer = self._quiet_op = None
        gap = self._options.quiet_gap
        with self._lock:
            if self._implicit_op != op_id:
                return  # completed already: replaced by an explicit operation, or ended
            if self._acquiring:
                delay = max(gap, _MIN_QUIET_RECHECK)  # a blocked acquire keeps it open
            else:
                delay = self._last_acquire_end + gap - self._clock()
                if delay <= 0:
                    self._implicit_op = None
                    quiet = self._quiet_since_last()
        if delay <= 0:
            self._complete_op(op_id, quiet)
        else:
            self._arm_quiet_timer(op_id, delay)
