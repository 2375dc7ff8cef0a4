"""The public session API: `Session` (blocking, for threads) and `AsyncSession` (asyncio).

Both are thin shells around one `Engine`. `Session` runs the engine on a private event loop in a
daemon thread and calls into it without hopping threads on the hot path; `AsyncSession` runs it
on the caller's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType

from burstctl.client.engine import Engine
from burstctl.client.fallback import Fallback
from burstctl.client.job import JobInfo
from burstctl.client.kinds import check_volume, op_kind
from burstctl.client.options import SessionOptions

# close() gives the engine this long to say Goodbye and stop before it abandons the thread.
_CLOSE_TIMEOUT = 10.0


class _OperationBase:
    """An explicit operation: posted on entry, completed on exit (also on an exception)."""

    def __init__(self, engine: Engine, kind: str, volume: int) -> None:
        # Validated here so that a bad kind raises where operation() is called.
        self._engine = engine
        self._kind = op_kind(kind)
        self._volume = check_volume(volume)
        self.op_id: int | None = None

    def _open(self) -> None:
        if self.op_id is not None:
            raise RuntimeError("an operation object can be entered only once")
        self.op_id = self._engine.open_operation(self._kind, self._volume)

    def _close(self) -> None:
        if self.op_id is not None:
            self._engine.close_operation(self.op_id)


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


class _SessionBase:
    """What both session flavours share: options, the engine and its read-only state."""

    def __init__(
        self,
        target: str,
        job: JobInfo | None = None,
        fallback: str | Fallback = "keep-last",
        *,
        report_interval: float = 0.25,
        quiet_gap: float = 0.1,
        attach_timeout: float = 2.0,
        client_id: str | None = None,
    ) -> None:
        options = SessionOptions.build(
            target,
            job,
            fallback,
            report_interval=report_interval,
            quiet_gap=quiet_gap,
            attach_timeout=attach_timeout,
            client_id=client_id,
        )
        self._engine = Engine(options)
        self._started()

    def _started(self) -> None:
        """Hook run at the end of construction (the sync session starts its thread)."""

    @property
    def job(self) -> JobInfo:
        return self._engine.options.job

    @property
    def client_id(self) -> str:
        return self._engine.options.client_id

    @property
    def rate(self) -> float:
        """The rate in force, in bytes/s (``math.inf`` when unthrottled)."""
        return self._engine.rate

    @property
    def attached(self) -> bool:
        """True while an allocation from a live controller is in force."""
        return self._engine.attached

    @property
    def closed(self) -> bool:
        return self._engine.closed

    @property
    def total_wait_seconds(self) -> float:
        """Seconds acquire calls have spent waiting for tokens, in total."""
        return self._engine.total_wait_seconds


class Session(_SessionBase):
    """A blocking client session of one job with one controller replica.

    ``job=None`` takes the job from this process's environment (`JobInfo.from_env`). The
    session connects in the background; until the first allocation arrives (or
    ``attach_timeout`` passes and the fallback applies) ``acquire`` waits. Controller problems
    are logged, never raised into ``acquire`` or ``operation``.
    """

    def _started(self) -> None:
        # The engine runs on a private loop in a daemon thread; start both now.
        options = self._engine.options
        self._close_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._run_loop, name=f"burstctl-session-{options.client_id}", daemon=True
        )
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._engine.start(), self._loop).result()
        except BaseException:
            self._stop_thread()
            raise

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            try:
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
                self._loop.run_until_complete(self._loop.shutdown_default_executor())
            finally:
                self._loop.close()

    def _stop_thread(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    def wait_attached(self, timeout: float | None = None) -> bool:
        """Waits until the session is attached; returns whether it is."""
        return self._engine.wait_attached(timeout)

    def acquire(self, nbytes: int, kind: str = "write") -> None:
        """Blocks until the job's token bucket allows ``nbytes`` of I/O of ``kind``."""
        self._engine.acquire(nbytes, kind)

    def operation(self, kind: str, volume: int = 0) -> Operation:
        """An explicit I/O operation of ``volume`` bytes (0 = unknown) for a ``with`` block."""
        return Operation(self._engine, kind, volume)

    def close(self) -> None:
        """Says Goodbye, ends the stream and joins the background thread; idempotent."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("Session.close() cannot be called from the session's own thread")
        with self._close_lock:
            if not self._thread.is_alive():
                return
            try:
                future = asyncio.run_coroutine_threadsafe(self._engine.close(), self._loop)
                future.result(_CLOSE_TIMEOUT)
            finally:
                self._stop_thread()

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
        await self._engine.start()

    async def wait_attached(self, timeout: float | None = None) -> bool:
        """Waits until the session is attached; returns whether it is."""
        return await self._engine.wait_attached_async(timeout)

    async def acquire(self, nbytes: int, kind: str = "write") -> None:
        """Waits until the job's token bucket allows ``nbytes`` of I/O of ``kind``."""
        await self._engine.acquire_async(nbytes, kind)

    def operation(self, kind: str, volume: int = 0) -> AsyncOperation:
        """An explicit I/O operation of ``volume`` bytes for an ``async with`` block."""
        return AsyncOperation(self._engine, kind, volume)

    async def close(self) -> None:
        """Says Goodbye, ends the stream and awaits every background task; idempotent."""
        await self._engine.close()

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
