"""A scripted controller stand-in for client-side tests (the client runtime, the FUSE shim).

`FakeController` is a real ``grpc.aio`` server on a loopback port, run on its own event loop in
its own thread so that blocking tests and asyncio tests can both drive it. It records every
ClientMessage it receives (per stream) and lets the test push Allocations or end streams.

It speaks the protocol as it was before Node streams: it serves ``Session`` only, so a ``Node``
call gets ``UNIMPLEMENTED`` as from an older controller, and the client runtime goes on with one
``Session`` stream per session (docs/protocol.md, "Node streams": the compatibility rule). Every
test on it thus also runs that rule; the Node streams run against the real controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from burstctl.proto.burstctl.v1 import controller_pb2 as pb
from burstctl.proto.burstctl.v1 import controller_pb2_grpc as pb_grpc


@dataclass
class Received:
    """One ClientMessage as the fake controller saw it."""

    stream: int
    at: float  # time.monotonic() on receipt
    message: pb.ClientMessage

    @property
    def kind(self) -> str:
        return self.message.WhichOneof("body") or ""


# In a stream's outbox: the Hello was taken, send the initial metadata (as the controller does).
ADMITTED = "admitted"


@dataclass
class _Stream:
    index: int
    outbox: asyncio.Queue[pb.Allocation | grpc.StatusCode | str | None] = field(
        default_factory=asyncio.Queue
    )
    epoch: int = 0
    last: pb.Allocation | None = None


class FakeController(pb_grpc.ControllerServicer):
    """A controller stand-in.

    ``initial_rate`` (if set) is allocated right after each Hello; ``renew_interval`` (if set)
    re-sends the last allocation of each stream with a new epoch that often; ``reject_with``
    (if set) ends every stream with that status right after its Hello; ``fallback_rate``: the
    budget share every allocation carries.
    """

    def __init__(
        self,
        port: int = 0,
        *,
        initial_rate: float | None = None,
        burst: float = 64 * 1024,
        lease_seconds: float = 30.0,
        renew_interval: float | None = None,
        reject_with: grpc.StatusCode | None = None,
        fallback_rate: float = 0.0,
    ) -> None:
        self.initial_rate = initial_rate
        self.fallback_rate = fallback_rate  # every allocation's budget share
        self.burst = burst
        self.lease_seconds = lease_seconds
        self.renew_interval = renew_interval
        self.reject_with = reject_with
        self._requested_port = port
        self.port = 0
        self._received: list[Received] = []
        self.wire_messages = 0  # gRPC messages received, a Batch counting once
        self.violations: list[str] = []  # protocol rules the client broke
        self._streams: list[_Stream] = []
        self._cond = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None

    # -------------------------------------------------------------- lifecycle (test thread)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakeController:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._start_server())
            except BaseException as err:
                failure.append(err)
                started.set()
                loop.close()
                return
            started.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=run, name="fake-controller", daemon=True)
        self._thread.start()
        started.wait(10)
        if failure:
            raise failure[0]
        return self

    async def _start_server(self) -> None:
        self._server = grpc.aio.server()
        session = grpc.stream_stream_rpc_method_handler(
            self.Session,
            request_deserializer=pb.ClientMessage.FromString,
            response_serializer=pb.ServerMessage.SerializeToString,
        )
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("burstctl.v1.Controller", {"Session": session}),)
        )
        self.port = self._server.add_insecure_port(f"127.0.0.1:{self._requested_port}")
        await self._server.start()

    def stop(self) -> None:
        """Stops the server at once (open streams end with an error) and joins its thread."""
        if self._thread is None or self._loop is None:
            return
        server, loop = self._server, self._loop

        async def shutdown() -> None:
            assert server is not None
            await server.stop(None)
            # Let the cancelled handlers finish on this loop before it closes.
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if tasks:
                await asyncio.wait(tasks, timeout=2)

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        self._thread = None

    # -------------------------------------------------------------- scripting (test thread)

    def push(
        self,
        rate: float,
        *,
        burst: float | None = None,
        lease: float | None = None,
        stream: int = -1,
        epoch: int | None = None,
        windows: pb.Windows | None = None,
        space: int | None = None,
    ) -> None:
        """Sends an Allocation on a stream (the latest by default), with the next epoch (and
        ``windows``, a periodic pattern, and ``space``, a space limit, when given)."""
        with self._cond:
            target = self._streams[stream]
        allocation = self._allocation(target, rate, burst, lease, epoch, space)
        if windows is not None:
            allocation.windows.CopyFrom(windows)
        self._put(target, allocation)

    def end_stream(self, code: grpc.StatusCode, stream: int = -1) -> None:
        """Ends a stream with ``code`` (OK ends it normally)."""
        with self._cond:
            target = self._streams[stream]
        self._put(target, code)

    def _allocation(
        self,
        stream: _Stream,
        rate: float,
        burst: float | None = None,
        lease: float | None = None,
        epoch: int | None = None,
        space: int | None = None,
    ) -> pb.Allocation:
        with self._cond:
            if epoch is None:
                stream.epoch += 1
                epoch = stream.epoch
            allocation = pb.Allocation(
                rate=rate,
                burst=self.burst if burst is None else burst,
                epoch=epoch,
                lease_seconds=self.lease_seconds if lease is None else lease,
                policy="scripted",
                replica_id="fake",
                fallback_rate=self.fallback_rate,
            )
            if space is not None:
                allocation.space.limit = space
            stream.last = allocation
            return allocation

    def _put(self, stream: _Stream, item: pb.Allocation | grpc.StatusCode | None) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(stream.outbox.put_nowait, item)

    # -------------------------------------------------------------- inspection (any thread)

    def received(self, kind: str | None = None, stream: int | None = None) -> list[Received]:
        with self._cond:
            return [
                r
                for r in self._received
                if (kind is None or r.kind == kind) and (stream is None or r.stream == stream)
            ]

    def bodies(self, kind: str, stream: int | None = None) -> list[Any]:
        return [getattr(r.message, kind) for r in self.received(kind, stream)]

    @property
    def stream_count(self) -> int:
        with self._cond:
            return len(self._streams)

    def wait_for(self, predicate: Callable[[], object], timeout: float = 5.0) -> None:
        """Blocks until ``predicate`` holds, re-checking whenever a message arrives."""
        with self._cond:
            if not self._cond.wait_for(predicate, timeout):
                raise AssertionError(f"controller condition not met within {timeout}s")

    # -------------------------------------------------------------- the servicer (server loop)

    async def Session(self, request_iterator: Any, context: Any) -> Any:
        with self._cond:
            stream = _Stream(index=len(self._streams))
            self._streams.append(stream)
            self._cond.notify_all()
        loop = asyncio.get_running_loop()
        helpers = [loop.create_task(self._read(stream, request_iterator))]
        if self.renew_interval is not None:
            helpers.append(loop.create_task(self._renew(stream, self.renew_interval)))
        try:
            while True:
                item = await stream.outbox.get()
                if item is None:
                    return
                if item == ADMITTED:
                    await context.send_initial_metadata(())
                    continue
                if isinstance(item, grpc.StatusCode):
                    if item != grpc.StatusCode.OK:
                        await context.abort(item, f"scripted {item.name}")
                    return
                yield pb.ServerMessage(allocation=item)
        finally:
            for helper in helpers:
                helper.cancel()

    async def _read(self, stream: _Stream, request_iterator: Any) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for wire_message in request_iterator:
                self.wire_messages += 1
                # A Batch is recorded as the messages it carries, in order.
                if wire_message.WhichOneof("body") == "batch":
                    messages = list(wire_message.batch.messages)
                    # The real controller's rules: Hello stands alone, batches do not nest.
                    for inner in messages:
                        if inner.WhichOneof("body") in ("hello", "batch"):
                            self.violations.append(f"{inner.WhichOneof('body')} inside a Batch")
                else:
                    messages = [wire_message]
                for message in messages:
                    self._handle(stream, message)

    def _handle(self, stream: _Stream, message: pb.ClientMessage) -> None:
        kind = message.WhichOneof("body")
        with self._cond:
            self._received.append(Received(stream.index, time.monotonic(), message))
            self._cond.notify_all()
        if kind == "hello" and self.reject_with is not None:
            stream.outbox.put_nowait(self.reject_with)
        elif kind == "hello":
            stream.outbox.put_nowait(ADMITTED)
            if self.initial_rate is not None:
                stream.outbox.put_nowait(self._allocation(stream, self.initial_rate))
        elif kind == "goodbye":
            stream.outbox.put_nowait(grpc.StatusCode.OK)

    async def _renew(self, stream: _Stream, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            with self._cond:
                last = stream.last
            if last is not None:
                space = last.space.limit if last.HasField("space") else None
                stream.outbox.put_nowait(
                    self._allocation(stream, last.rate, last.burst, last.lease_seconds, None, space)
                )


def fake_controllers(who: str) -> Iterator[Callable[..., FakeController]]:
    """The body of a fixture that starts fake controllers: yields
    ``make(port=0, **kwargs) -> FakeController``, stops every one afterwards, and
    fails the test if ``who`` (the client, the mount) broke the protocol."""
    started: list[FakeController] = []

    def make(port: int = 0, **kwargs: Any) -> FakeController:
        fake = FakeController(port, **kwargs).start()
        started.append(fake)
        return fake

    yield make
    for fake in started:
        fake.stop()
    broken = [v for fake in started for v in fake.violations]
    assert not broken, f"{who} broke the protocol: {broken}"
