"""The public session API: `Session` (blocking, for threads) and `AsyncSession` (asyncio).

Both are thin shells around one `SessionCore`. `Session` runs the core on the event loop of a
`ClientRuntime` — its own, or one shared with other sessions — and calls into it without
hopping threads on the hot path; `AsyncSession` runs it on the caller's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from burstctl.client.bucket import Pattern
from burstctl.client.core import SessionCore
from burstctl.client.fallback import Fallback
from burstctl.client.job import JobInfo
from burstctl.client.kinds import check_volume, op_kind
from burstctl.client.options import (
    DEFAULT_ATTACH_TIMEOUT,
    DEFAULT_FALLBACK,
    DEFAULT_FALLBACK_GRACE,
    DEFAULT_QUIET_GAP,
    DEFAULT_REPORT_INTERVAL,
    BucketObserver,
    Purpose,
    RateObserver,
    SessionOptions,
    follows_advice,
    resolve_targets,
)
from burstctl.client.runtime import CLOSE_TIMEOUT, ClientRuntime
from burstctl.common.channels import ChannelSecurity


class _OperationBase:
    """An explicit operation: posted on entry, completed on exit (also on an exception)."""

    def __init__(self, core: SessionCore, kind: str, volume: int) -> None:
        # Validated here so that a bad kind raises where operation() is called.
        self._core = core
        self._kind = op_kind(kind)
        self._volume = check_volume(volume)
        self.op_id: int | None = None

    def _open(self) -> None:
        if self.op_id is not None:
            raise RuntimeError("an operation object can be entered only once")
        self.op_id = self._core.open_operation(self._kind, self._volume)

    def _close(self) -> None:
        if self.op_id is not None:
            self._core.close_operation(self.op_id)


class Operation(_OperationBase):
    """``with session.operation("write", volume=n):`` — see `Session.operation`."""

    def __enter__(self) -> Operation:
        self._open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close()


class AsyncOperation(_OperationBase):
    """``async with session.operation("write", volume=n):`` — see `AsyncSession.operation`."""

    async def __aenter__(self) -> AsyncOperation:
        self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close()


def _shares(nbytes: int, k: int) -> list[int]:
    """``nbytes`` split evenly over ``k`` streams (the remainder one byte each to the first)."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        return [nbytes] + [0] * (k - 1)  # the first core's check raises for it
    base, extra = divmod(nbytes, k)
    return [base + (1 if i < extra else 0) for i in range(k)]


class _Striped:
    """Several explicit operations, one per stream, entered and left together."""

    def __init__(self, parts: list[Operation]) -> None:
        self._parts = parts

    def __enter__(self) -> _Striped:
        for part in self._parts:
            part.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for part in self._parts:
            part.__exit__(exc_type, exc, tb)


class _SessionBase:
    """What both session flavours share: options, the core and its read-only state."""

    def __init__(
        self,
        target: str,
        job: JobInfo | None = None,
        fallback: str | Fallback = DEFAULT_FALLBACK,
        *,
        report_interval: float = DEFAULT_REPORT_INTERVAL,
        quiet_gap: float = DEFAULT_QUIET_GAP,
        attach_timeout: float = DEFAULT_ATTACH_TIMEOUT,
        client_id: str | None = None,
        security: ChannelSecurity | None = None,
        fallback_grace: float = DEFAULT_FALLBACK_GRACE,
        rate_observer: RateObserver | None = None,
        purpose: Purpose = "app",
        buffer: bool = False,
        extra_targets: Sequence[str] = (),
        bucket_observer: BucketObserver | None = None,
        metadata_observer: RateObserver | None = None,
    ) -> None:
        options = SessionOptions.build(
            target,
            job,
            fallback,
            report_interval=report_interval,
            quiet_gap=quiet_gap,
            attach_timeout=attach_timeout,
            client_id=client_id,
            security=security,
            fallback_grace=fallback_grace,
            rate_observer=rate_observer,
            purpose=purpose,
            buffer=buffer,
            bucket_observer=bucket_observer,
            metadata_observer=metadata_observer,
        )
        self._core = SessionCore(options)
        # What a stream on another advised replica is built with: the same job and client id;
        # the first core holds the buffer and the rate observer.
        self._extra_settings: dict[str, Any] = {
            "report_interval": report_interval,
            "quiet_gap": quiet_gap,
            "attach_timeout": attach_timeout,
            "client_id": options.client_id,
            "security": security,
            "fallback_grace": fallback_grace,
            "purpose": purpose,
        }
        # Striping over advised replicas (`Session`): one more stream per extra target.
        self._cores = [self._core] + [self._extra_core(extra) for extra in extra_targets]

    def _extra_core(self, target: str) -> SessionCore:
        options = self._core.options
        return SessionCore(
            SessionOptions.build(target, options.job, options.fallback, **self._extra_settings)
        )

    @property
    def targets(self) -> list[str]:
        """The replica addresses the session has a stream on (several: striped)."""
        return [e.options.target for e in self._cores]

    @property
    def advice(self) -> tuple[str, ...]:
        """The replica addresses the first replica advises the job now (Allocation.advice;
        empty: none given). A session that follows the advice stripes over them from its
        next phase start (docs/placement-live.md, "Following the advice")."""
        return self._core.advice

    @property
    def job(self) -> JobInfo:
        return self._core.options.job

    @property
    def client_id(self) -> str:
        return self._core.options.client_id

    @property
    def rate(self) -> float:
        """The rate in force, in bytes/s (``math.inf`` when unthrottled); striped: the sum
        over the streams."""
        return sum(e.rate for e in self._cores)

    @property
    def pattern(self) -> Pattern | None:
        """The periodic pattern of windows in force (docs/client.md, "Windows"), None when
        the session paces at a plain rate."""
        return self._core.pattern

    @property
    def attached(self) -> bool:
        """True while an allocation from a live controller is in force (on every stream)."""
        return all(e.attached for e in self._cores)

    @property
    def refused(self) -> str | None:
        """``"<code>: <message>"`` when the controller refused this session, else None: code
        ``PERMISSION_DENIED`` (its user may not join the job) or ``UNAUTHENTICATED`` (missing
        or wrong credentials). A refused session runs on its fallback at once and keeps asking
        with backoff."""
        return self._core.refused

    @property
    def closed(self) -> bool:
        return all(e.closed for e in self._cores)

    @property
    def total_wait_seconds(self) -> float:
        """Seconds acquire and acquire_space calls have spent waiting, in total."""
        return sum(e.total_wait_seconds for e in self._cores)

    @property
    def purpose(self) -> Purpose:
        """``"app"`` (the job's own I/O) or ``"drain"`` (its copy to the PFS)."""
        return self._core.options.purpose

    @property
    def space_limit(self) -> int | None:
        """The burst buffer's space limit in force: the most `buffer_added` may reach. None
        when the session tracks no buffer or the controller sent no space (no capacity)."""
        return self._core.space_limit

    @property
    def buffer_added(self) -> int:
        """Bytes `acquire_space` let through since the session started (never decreases)."""
        return self._core.buffer_added

    def report_buffer(self, resident: int, pending: int, drain_error: str = "") -> None:
        """Sets the session's burst-buffer gauges (``buffer=True`` sessions): ``resident`` bytes
        of the job this client holds on the buffer, ``pending`` of them not on the parallel
        file system yet (<= resident), ``drain_error`` why they do not drain ("" = they do).
        Sent with the next Usage, at once when ``drain_error`` changes. Thread-safe."""
        self._core.report_buffer(resident, pending, drain_error)

    async def acquire_space_async(self, nbytes: int, landed: bool = True) -> None:
        """`Session.acquire_space` for a coroutine (on any loop): suspends instead of blocking."""
        await self._core.acquire_space_async(nbytes, landed)

    def space_landed(self, nbytes: int) -> None:
        """Bytes acquired with ``acquire_space(n, landed=False)`` are now on the buffer and in
        the last `report_buffer` (or were never written): only then do the reports count them
        as added. Thread-safe."""
        self._core.space_landed(nbytes)

    def record(self, nbytes: int, kind: str = "write", calls: int = 1) -> None:
        """Books ``nbytes`` of ``kind`` that were paced elsewhere (the preload library's shared
        page, docs/preload.md) in ``calls`` calls, without waiting: the usage reports count
        them as they count acquires, and they begin (or keep open) the implicit operation as
        an ``acquire`` does (metadata calls of 0 bytes: counted only). Striped: split evenly
        over the streams, the calls booked on the first. Thread-safe."""
        shares = _shares(nbytes, len(self._cores))
        for core, share in zip(self._cores, shares, strict=True):
            if core is self._core:
                core.record(share, kind, calls)
            elif share:
                core.record(share, kind)

    def acquire_metadata(self) -> None:
        """Blocks until one more metadata operation is allowed (``Allocation.metadata_rate``;
        at once without one) and counts it, outside any I/O phase: no bytes, no implicit
        operation (the shims' metadata requests). Thread-safe."""
        self._core.acquire_metadata()

    def hold_waiting(self, waiting: bool) -> None:
        """The job's I/O is (True) or is no longer (False) waiting for tokens elsewhere: it
        counts as one waiter of the session (the controller is told the job waits, once per
        transition, and the wait time is reported). Idempotent. Thread-safe."""
        for core in self._cores:
            core.hold_waiting(waiting)

    def end_phase(self) -> None:
        """Completes the implicit operation now, instead of after ``quiet_gap`` without I/O.

        For a caller that knows its burst of I/O is over; the next ``acquire`` posts a new
        implicit operation. A no-op when none is open (explicit operations are not touched).
        """
        for core in self._cores:
            core.end_phase()


class Session(_SessionBase):
    """A blocking client session of one job with one controller replica.

    ``job=None`` takes the job from this process's environment (`JobInfo.from_env`). The
    session connects in the background; until the first allocation arrives ``acquire`` waits
    (under ``keep-last``, through ``fallback_grace``, then at its conservative rate;
    ``fixed`` and ``unthrottled`` apply after ``attach_timeout``). Controller problems are
    logged, never raised into ``acquire`` or ``operation``.

    ``fallback_grace``: seconds a ``keep-last`` session keeps its last allotted rate once its
    lease ran out, before it moves to its share of the controller's fallback budget
    (client/fallback.py). ``rate_observer``: called
    with the new rate whenever the rate in force changes, on the session's loop thread with the
    throttle's lock held (it must return quickly and not call into the session).
    ``bucket_observer``: called with (rate, burst, pattern) every time the session applies an
    allocation or its fallback, changed or not, on the session's loop thread with no lock of
    the session held (it must return quickly). ``metadata_observer``: called with the new
    metadata rate (ops/s, 0 = unpaced) whenever it changes, on the same thread.

    ``acquire(n, "metadata")`` (`throttled_open`'s open) and `acquire_metadata` (a shim's
    metadata request, outside any I/O phase) are one metadata operation each: they wait for
    the session's metadata bucket when the controller gave it a rate
    (`Allocation.metadata_rate`; docs/client.md, "Metadata operations").

    ``runtime``: the `ClientRuntime` to run on, shared with other sessions (its loop thread
    and its channel to ``target``); closing the session leaves it open. Without one the session
    runs on a runtime of its own, closed with it.

    ``purpose="drain"``: the stream copies the job's closed files from the burst buffer to the
    parallel file system (paced from the controller's ``--pfs-bandwidth``, booked as the job's
    ``drained`` bytes). ``buffer=True``: the session tracks a burst buffer — `report_buffer`
    and `acquire_space` (docs/capacity.md); only with ``purpose="app"``.

    Placement advice (docs/client.md, "Placement advice"): ``target`` may be a list of
    controller addresses (None: ``BURSTCTL_CONTROLLERS``); without advice the first is used.
    With ``follow_advice=True`` (None: ``BURSTCTL_FOLLOW_ADVICE=1``) or ``replicas=[...]``, the
    session opens one stream on each advised replica (``replicas``, else ``BURSTCTL_REPLICAS``
    as the Slurm task prolog writes it) and splits every ``acquire`` and explicit operation
    evenly over them ([DIST-IO]: even striping); buffer space is kept on the first.
    """

    def __init__(
        self,
        target: str | Sequence[str] | None,
        job: JobInfo | None = None,
        fallback: str | Fallback = DEFAULT_FALLBACK,
        *,
        report_interval: float = DEFAULT_REPORT_INTERVAL,
        quiet_gap: float = DEFAULT_QUIET_GAP,
        attach_timeout: float = DEFAULT_ATTACH_TIMEOUT,
        client_id: str | None = None,
        runtime: ClientRuntime | None = None,
        security: ChannelSecurity | None = None,
        fallback_grace: float = DEFAULT_FALLBACK_GRACE,
        rate_observer: RateObserver | None = None,
        purpose: Purpose = "app",
        buffer: bool = False,
        replicas: Sequence[str] | None = None,
        follow_advice: bool | None = None,
        bucket_observer: BucketObserver | None = None,
        metadata_observer: RateObserver | None = None,
    ) -> None:
        targets = resolve_targets(target, replicas, follow_advice)
        super().__init__(
            targets[0],
            job,
            fallback,
            report_interval=report_interval,
            quiet_gap=quiet_gap,
            attach_timeout=attach_timeout,
            client_id=client_id,
            security=security,
            fallback_grace=fallback_grace,
            rate_observer=rate_observer,
            purpose=purpose,
            buffer=buffer,
            extra_targets=targets[1:],
            bucket_observer=bucket_observer,
            metadata_observer=metadata_observer,
        )
        self._follow = follows_advice(replicas, follow_advice)
        self.restriped = 0  # times the striping moved to changed advice
        self._restripe = threading.Lock()
        self._owns_runtime = runtime is None
        self._runtime = runtime or ClientRuntime(name=f"burstctl-session-{self.client_id}")
        try:
            for core in self._cores:
                self._runtime.start_core(core)
        except BaseException:
            if self._owns_runtime:
                self._runtime.close()
            raise

    @property
    def runtime(self) -> ClientRuntime:
        """The runtime the session runs on (its own, or the one it was given)."""
        return self._runtime

    def wait_attached(self, timeout: float | None = None) -> bool:
        """Waits until the session is attached (every stream); returns whether it is."""
        return all([e.wait_attached(timeout) for e in self._cores])

    def _follow_advice(self) -> list[SessionCore]:
        """The streams to stripe over; a session that follows the advice moves them first to
        the replicas its first replica advises now, when that changed and no stream is in an
        I/O phase (a phase start: never mid-phase). The first stream stays: the advice and
        the buffer's space come on it (docs/placement-live.md, "Following the advice")."""
        cores = self._cores
        advised = self._core.advice if self._follow else ()
        if not advised:
            return cores
        home = self._core.options.target
        wanted = [home, *(a for a in advised if a != home)]
        if wanted == [c.options.target for c in cores] or any(c.in_phase for c in cores):
            return cores
        with self._restripe:
            cores = self._cores
            held = {c.options.target: c for c in cores}
            moved = [held.get(target) or self._extra_core(target) for target in wanted]
            for core in moved:
                if core.options.target not in held:
                    self._runtime.start_core(core)
            for core in cores:
                if core not in moved:
                    self._runtime.close_core(core)  # says Goodbye; not waited for
            self._cores = moved
            self.restriped += 1
            return moved

    def acquire(self, nbytes: int, kind: str = "write") -> None:
        """Blocks until the job's token bucket allows ``nbytes`` of I/O of ``kind``; striped,
        each stream's bucket its even share."""
        cores = self._follow_advice()
        if len(cores) == 1 or not nbytes:  # nothing to split: the first stream's alone
            self._core.acquire(nbytes, kind)
            return
        parts = [
            (core, share)
            for core, share in zip(cores, _shares(nbytes, len(cores)), strict=True)
            if share or core is self._core
        ]

        async def every_share() -> None:
            # All at once, on the session's loop: in turn, each stream's wait would add up
            # (a bucket refills only to its depth while another stream is waited on), and
            # the job would get less than the sum of its streams' rates.
            await asyncio.gather(*(e.acquire_async(share, kind) for e, share in parts))

        # Interrupted (the thread's cancellation): every share refunds its tokens.
        self._runtime.run(every_share(), cancellable=True)

    def acquire_space(self, nbytes: int, landed: bool = True) -> None:
        """Blocks until ``nbytes`` more bytes fit on the burst buffer (``buffer=True`` sessions;
        docs/capacity.md, "The space contract"), then counts them in `buffer_added`.
        ``landed=False``: the caller writes them next and calls `space_landed` once they are
        in its `report_buffer`; until then reports count them as granted, not as added.

        No wait when the controller sent no space (no capacity). Before the first allocation
        it waits for it like `acquire` (at most ``attach_timeout``); beyond the granted space
        it waits for more, also while the controller is unreachable, until ``fallback_grace``
        after the lease ran out (then space is no longer enforced). Closing the session lets
        every waiter through. Never raises for a controller problem."""
        self._core.acquire_space(nbytes, landed)

    def operation(self, kind: str, volume: int = 0) -> Operation | _Striped:
        """An explicit I/O operation of ``volume`` bytes (0 = unknown) for a ``with`` block;
        striped, one on each stream with its share of the volume."""
        cores = self._follow_advice()
        if len(cores) == 1:
            return Operation(self._core, kind, volume)
        shares = _shares(volume, len(cores))
        return _Striped([Operation(e, kind, v) for e, v in zip(cores, shares, strict=True)])

    def close(self) -> None:
        """Says Goodbye and ends the stream (and its own runtime's thread); idempotent."""
        if self._runtime.in_loop_thread():
            raise RuntimeError("Session.close() cannot be called from the session's own thread")
        if self._owns_runtime:
            self._runtime.close(CLOSE_TIMEOUT)
        else:
            for core in self._cores:
                self._runtime.close_core(core).result(CLOSE_TIMEOUT)

    def close_soon(self) -> concurrent.futures.Future[None]:
        """Starts closing without waiting; the future is done once the session said Goodbye.

        Callable from any thread, the runtime's own included (where `close` would wait on
        itself).
        """
        if self._owns_runtime:
            return self._runtime.close_soon()
        for core in self._cores[1:]:
            self._runtime.close_core(core)
        return self._runtime.close_core(self._core)

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncSession(_SessionBase):
    """The asyncio twin of `Session`, running on the caller's event loop.

    Use ``async with AsyncSession(...) as session`` (or ``await session.start()`` and
    ``await session.close()``).
    """

    async def start(self) -> None:
        """Connects in the background on the running loop."""
        await self._core.start()

    async def wait_attached(self, timeout: float | None = None) -> bool:
        """Waits until the session is attached; returns whether it is."""
        return await self._core.wait_attached_async(timeout)

    async def acquire(self, nbytes: int, kind: str = "write") -> None:
        """Waits until the job's token bucket allows ``nbytes`` of I/O of ``kind``."""
        await self._core.acquire_async(nbytes, kind)

    async def acquire_space(self, nbytes: int, landed: bool = True) -> None:
        """Waits until ``nbytes`` more bytes fit on the burst buffer (`Session.acquire_space`)."""
        await self._core.acquire_space_async(nbytes, landed)

    def operation(self, kind: str, volume: int = 0) -> AsyncOperation:
        """An explicit I/O operation of ``volume`` bytes for an ``async with`` block."""
        return AsyncOperation(self._core, kind, volume)

    async def close(self) -> None:
        """Says Goodbye, ends the stream and awaits every background task; idempotent."""
        await self._core.close()

    async def __aenter__(self) -> AsyncSession:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
