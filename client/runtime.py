"""`ClientRuntime`: one event loop thread and one gRPC channel per controller, for many sessions.

A blocking `Session` needs an asyncio loop to run its stream on. A runtime owns one such loop in
one daemon thread and, on it, one ``grpc.aio`` channel per controller target and, on that
channel, one ``Node`` stream (`client/link.py`: `NodeLink`) that carries every session built on
the runtime to that controller. A process that speaks for many jobs at once (the FUSE mount,
the preload agent) builds all their sessions on one runtime, so its threads, connections and
streams do not grow with the number of jobs, and the controller reads and writes one batch for
all of them.

Ownership: a session closed on its own says Goodbye and leaves the runtime and its channels
open for the others. `ClientRuntime.close` closes every session still open on it (they say
Goodbye in parallel), then the node streams and the channels, then stops the loop and joins
the thread. A `Session`
built without a runtime gets one of its own, closed with it.

Channels are made and looked up only on the runtime's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Coroutine, Mapping
from types import MappingProxyType, TracebackType
from typing import Any, TypeVar

import grpc

from burstctl.client import waits
from burstctl.client.channel import open_channel
from burstctl.client.core import SessionCore
from burstctl.client.link import NodeLink
from burstctl.common.channels import ChannelSecurity

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How long `close` waits for the sessions, the channels and the loop thread to stop.
CLOSE_TIMEOUT = 10.0


class ClientRuntime:
    """An event loop in a daemon thread, and the channels and sessions that run on it.

    Thread-safe: sessions may be started and closed from any thread but the runtime's own.
    """

    def __init__(self, name: str = "burstctl-client") -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._closing: concurrent.futures.Future[None] | None = None
        # One channel and node stream per target and credentials (loop only).
        self._links: dict[tuple[str, ChannelSecurity], NodeLink] = {}
        self._cores: set[SessionCore] = set()  # loop only
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ state

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The runtime's loop (to schedule callbacks with ``call_soon_threadsafe``)."""
        return self._loop

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def channels(self) -> Mapping[str, grpc.aio.Channel]:
        """The open channels by target (read-only snapshot; made only on the loop). Sessions
        to one target with different credentials have a channel each; the last one shows."""
        return MappingProxyType({target: ln.channel for (target, _), ln in self._links.items()})

    @property
    def session_count(self) -> int:
        """How many sessions are open on the runtime."""
        return len(self._cores)

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    # ------------------------------------------------------------------ running coroutines

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedules ``coro`` on the runtime's loop; RuntimeError once the runtime is closed."""
        with self._lock:
            if self._closed:
                coro.close()
                raise RuntimeError("client runtime is closed")
            return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(
        self,
        coro: Coroutine[Any, Any, T],
        timeout: float | None = None,
        *,
        cancellable: bool = False,
    ) -> T:
        """Runs ``coro`` on the runtime's loop and waits for its result (not from the loop).
        ``cancellable``: the calling thread's cancellation cancels it, for a coroutine whose
        cancellation undoes what it did (`burstctl.client.waits.result`)."""
        if self.in_loop_thread():
            coro.close()
            raise RuntimeError("ClientRuntime.run() would wait on its own loop")
        future = self.submit(coro)
        return waits.result(future, timeout) if cancellable else future.result(timeout)

    # ------------------------------------------------------------------ sessions

    def start_core(self, core: SessionCore) -> None:
        """Starts ``core`` on the loop, on the runtime's node stream to its target."""
        self.run(self._start_core(core))

    def close_core(self, core: SessionCore) -> concurrent.futures.Future[None]:
        """Closes ``core`` on the loop; the future is done once it has said Goodbye.

        Does not wait, so any thread may call it, the runtime's own included. Once the
        runtime is closed, the core is closed too and the future is already done.
        """
        try:
            return self.submit(self._close_core(core))
        except RuntimeError:
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            done.set_result(None)
            return done

    async def _start_core(self, core: SessionCore) -> None:
        key = (core.options.target, core.options.security)
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = NodeLink(open_channel(*key))
        await core.start(link)
        self._cores.add(core)

    async def _close_core(self, core: SessionCore) -> None:
        try:
            await core.close()
        finally:
            self._cores.discard(core)

    # ------------------------------------------------------------------ lifecycle

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Closes every session still open, then every channel, then the loop; idempotent."""
        if self.in_loop_thread():
            raise RuntimeError("ClientRuntime.close() cannot be called from its own thread")
        try:
            self.close_soon().result(timeout)
        except concurrent.futures.TimeoutError:
            logger.warning("the client runtime did not close within %gs", timeout)
            self._stop_loop()
        self._thread.join(timeout)

    def close_soon(self) -> concurrent.futures.Future[None]:
        """`close` without waiting: the future is done once sessions and channels are closed,
        and the loop thread ends right after. Callable from any thread, the loop's included."""
        with self._lock:
            if self._closing is None:
                self._closed = True
                self._closing = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
                self._closing.add_done_callback(lambda _: self._stop_loop())
            return self._closing

    def _stop_loop(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            self._loop.call_soon_threadsafe(self._loop.stop)

    async def _shutdown(self) -> None:
        cores = list(self._cores)
        results = await asyncio.gather(*(e.close() for e in cores), return_exceptions=True)
        for core, result in zip(cores, results, strict=True):
            if isinstance(result, BaseException):
                logger.error(
                    "closing the session of job %s failed",
                    core.options.job.job_id,
                    exc_info=result,
                )
        self._cores.clear()
        links = list(self._links.values())
        self._links.clear()
        await asyncio.gather(*(link.close() for link in links), return_exceptions=True)
        await asyncio.gather(*(link.channel.close() for link in links), return_exceptions=True)

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

    def __enter__(self) -> ClientRuntime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
