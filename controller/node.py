"""The ``Node`` stream: one stream per client node and replica, carrying many sessions.

A node (a mount, a preload agent, a ``ClientRuntime``) multiplexes all its sessions on one
stream per replica (docs/protocol.md, "Node streams"). Each message names its session with a
tag the client chose in the session's ``Hello``. A session here is what a ``Session`` stream
is: the servicer opens, handles and closes it with the same code (``ControllerServicer.open``,
``handle``, ``close``); only its ending differs. What ends a ``Session`` stream ends one session
of a Node stream with a ``SessionEnd`` carrying the same code and message, and the stream goes
on: a refused or rejected session costs the others nothing. Only what cannot be pinned on one
session (an undecodable message, a missing or reused tag, an oversized batch) ends the stream,
with ``INVALID_ARGUMENT``.

One writer per stream: a session's outbox tells the stream it has something (``notify``), and
the writer takes what every such outbox holds into one ``ServerBatch`` per write, so a decision
that moves thousands of sessions of a node costs one message, not thousands. Leases are renewed
per stream: every quarter lease one ``Renew`` renews every allocation in force on it, and marks
its sessions as pushed to (so the scheduler's per-session renewal passes them by).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc

from burstctl.common.limits import MAX_BATCH
from burstctl.controller.jobs import LimitError, ProtocolError
from burstctl.controller.messages import Malformed, decoded
from burstctl.controller.outbox import StreamOutbox
from burstctl.controller.records import SessionRecord
from burstctl.controller.trust import Refused
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

if TYPE_CHECKING:
    from burstctl.controller.servicer import ControllerServicer

log = logging.getLogger(__name__)

# Most server messages in one ServerBatch (one gRPC message of at most a few hundred KB).
MAX_SERVER_BATCH = 1024


def session_end(
    tag: int, code: grpc.StatusCode, details: str, retry_ms: int = 0
) -> pb.ServerMessage:
    return pb.ServerMessage(
        session=tag, end=pb.SessionEnd(code=code.name, message=details, retry_after_ms=retry_ms)
    )


class StreamError(Exception):
    """What ends the whole Node stream (``INVALID_ARGUMENT``): it names no one session."""


class NodeStream:
    """One Node stream on the controller: its sessions by tag, its reader and its writer."""

    def __init__(
        self, servicer: ControllerServicer, context: grpc.aio.ServicerContext, client: str
    ) -> None:
        self._servicer = servicer
        self._context = context
        self._client = client  # the host its sessions count against max_sessions_per_client
        self._sessions: dict[int, tuple[SessionRecord, StreamOutbox]] = {}
        self._highest = 0  # the greatest tag a Hello opened: tags only grow
        self._dirty: dict[int, None] = {}  # tags whose outbox has something (in order)
        self._ends: list[pb.ServerMessage] = []  # SessionEnds of Hellos refused
        self._leaving: dict[int, float] = {}  # tags that sent Leave: the rate they pace at
        self._wake = asyncio.Event()
        self._reading = True
        self._renew = False  # a Renew goes out with the next write
        self._fatal: str | None = None  # the stream's INVALID_ARGUMENT

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    async def run(self, requests: AsyncIterator[pb.ClientMessage | Malformed]) -> None:
        """Serves the stream until the client ends it, it breaks, or a message ends it."""
        # The stream itself is admitted at once: sessions are admitted one by one, in-band.
        await self._context.send_initial_metadata(())
        reader = asyncio.create_task(self._read(requests), name="node-reader")
        renewer = asyncio.create_task(self._renew_leases(), name="node-renewer")
        try:
            await self._write()
        finally:
            renewer.cancel()
            if not reader.done():
                reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            for tag in list(self._sessions):
                self._close(tag)
        if self._fatal is not None:
            await self._context.abort(grpc.StatusCode.INVALID_ARGUMENT, self._fatal)

    # ------------------------------------------------------------------ reading

    async def _read(self, requests: AsyncIterator[pb.ClientMessage | Malformed]) -> None:
        try:
            async for raw in requests:
                try:
                    msg = decoded(raw)
                except ProtocolError as exc:
                    raise StreamError(str(exc)) from None
                if msg.WhichOneof("body") == "batch":
                    batch = msg.batch.messages
                    if len(batch) > MAX_BATCH:
                        raise StreamError(f"batch.messages: more than {MAX_BATCH} messages")
                    for i, inner in enumerate(batch):
                        self._dispatch(inner, f"batch.messages[{i}].")
                else:
                    self._dispatch(msg, "")
        except StreamError as exc:
            self._servicer.rejected += 1
            log.warning("node stream rejected (%s): %s", self._context.peer(), exc)
            self._fatal = str(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the transport broke; run() cleans up
            log.debug("node stream reader ended: %r", exc)
        finally:
            self._reading = False
            self._wake.set()

    def _dispatch(self, msg: pb.ClientMessage, where: str) -> None:
        tag = msg.session
        if tag == 0:
            raise StreamError(f"{where}session: must be > 0 on a Node stream")
        kind = msg.WhichOneof("body")
        if kind == "hello":
            if tag <= self._highest:
                raise StreamError(
                    f"{where}session: {tag} is not greater than every earlier session's "
                    f"({self._highest})"
                )
            self._highest = tag
            self._open(tag, msg, where)
            return
        entry = self._sessions.get(tag)
        if entry is None:
            if tag > self._highest:
                raise StreamError(f"{where}session: no Hello opened session {tag}")
            return  # a session that ended: what was in flight for it is moot
        session, outbox = entry
        servicer = self._servicer
        try:
            if kind == "leave":
                rate = msg.leave.pacing_rate
                if not (math.isfinite(rate) and rate >= 0):
                    raise ProtocolError(f"{where}leave.pacing_rate", "must be finite and >= 0")
                servicer.messages += 1
                self._leaving[tag] = rate
                outbox.end()
            elif not servicer.handle(session, msg, where):
                outbox.end()  # its Goodbye
        except ProtocolError as exc:
            servicer.rejected += 1
            log.warning("session %d rejected: %s", session.sid, exc)
            outbox.end(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except LimitError as exc:
            servicer.refused += 1
            log.warning("session %d ended: %s", session.sid, exc)
            outbox.end(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))

    def _open(self, tag: int, hello: pb.ClientMessage, where: str) -> None:
        servicer = self._servicer
        try:
            self._sessions[tag] = servicer.open(
                hello, self._context, self._client, notify=functools.partial(self._mark, tag)
            )
        except ProtocolError as exc:
            servicer.rejected += 1
            log.warning("session rejected (%s): %s%s", self._context.peer(), where, exc)
            self._end(tag, grpc.StatusCode.INVALID_ARGUMENT, f"{where}{exc}")
        except (LimitError, Refused) as exc:
            self._end(tag, *servicer.refusal(exc))

    # ------------------------------------------------------------------ writing

    async def _renew_leases(self) -> None:
        """Every quarter lease, one Renew for every allocation in force on the stream (the
        scheduler renews a session once its last push is half a lease old)."""
        servicer = self._servicer
        while True:
            await asyncio.sleep(servicer.lease / 4)
            now = servicer.table.clock()
            for session, _ in self._sessions.values():
                if session.rate is not None:
                    session.pushed_at = now
                    self._renew = True
            if self._renew:
                self._wake.set()

    def _mark(self, tag: int) -> None:
        self._dirty[tag] = None
        self._wake.set()

    def _end(self, tag: int, code: grpc.StatusCode, details: str, retry_ms: int = 0) -> None:
        """A session refused at its Hello: its SessionEnd goes out with the next write."""
        self._ends.append(session_end(tag, code, details, retry_ms))
        self._wake.set()

    def _close(self, tag: int) -> None:
        session, _ = self._sessions.pop(tag)
        self._servicer.close(session, self._client, leaving=self._leaving.pop(tag, None))

    def _collect(self) -> list[pb.ServerMessage]:
        """Everything the sessions have for the client now; a session that finished gets its
        SessionEnd after its last messages, and is closed."""
        messages, self._ends = self._ends, []
        dirty, self._dirty = self._dirty, {}
        for tag in dirty:
            entry = self._sessions.get(tag)
            if entry is None:
                continue
            _, outbox = entry
            while (message := outbox.take()) is not None:
                message.session = tag
                messages.append(message)
            if outbox.finished:
                code, details = outbox.ended or (grpc.StatusCode.OK, "")
                messages.append(session_end(tag, code, details))
                self._close(tag)
        if self._renew:
            self._renew = False
            messages.append(pb.ServerMessage(renew=pb.Renew(lease_seconds=self._servicer.lease)))
        return messages

    async def _write(self) -> None:
        context = self._context
        while True:
            await self._wake.wait()
            self._wake.clear()
            messages = self._collect()
            for start in range(0, len(messages), MAX_SERVER_BATCH):
                chunk = messages[start : start + MAX_SERVER_BATCH]
                if len(chunk) == 1:
                    await context.write(chunk[0])
                else:
                    await context.write(pb.ServerMessage(batch=pb.ServerBatch(messages=chunk)))
            if not self._reading:
                return
