"""One session's stream to its controller replica, and all the protocol on it.

Owns what the client says and when (Hello, OpPosted/OpCompleted, Usage, Goodbye), what it does
with what the controller says (Allocation, Error), reconnection, the lease and the fallback,
and whether the session is attached. It sets the rate of the session's `Throttle` and reads its
counters for the usage reports; the hot path (``acquire``) never touches it.

Everything here runs on the loop the session was started on, so it needs no lock; only the
attached flag is also read (and waited on) by other threads, through a condition.
The session's stream is a leg of its node's one stream to the replica (`client/link.py`:
`NodeLink`, given to `SessionStream.start` and never closed here: every session of a
`ClientRuntime` shares it; `channel` says how it reconnects, and how a stream that ends is
tried again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import threading
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import grpc

from burstctl.client.bucket import Throttle
from burstctl.client.channel import REFUSALS, Backoff, retry_hint
from burstctl.client.fallback import FallbackPacer
from burstctl.client.link import Call, Leg, NodeLink
from burstctl.client.metadata import MetadataPace
from burstctl.client.options import SessionOptions
from burstctl.client.space import SpaceGate
from burstctl.client.usage import UsageReports
from burstctl.client.waits import wait_for
from burstctl.client.windows import MalformedWindows, pattern_of
from burstctl.common.units import format_rate
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

logger = logging.getLogger(__name__)

# Stream ends by which a live controller turns a session away (a limit, load shedding, a
# message it rejected, the trust rules): no rate kept now is counted by anyone.
TURNED_AWAY = (
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.INVALID_ARGUMENT,
    *REFUSALS,
)
# Most messages sent as one Batch (the controller accepts up to 1024).
MAX_BATCH = 64
# How long close() waits for the Goodbye and the half-close to reach the wire.
GOODBYE_TIMEOUT = 2.0


class SessionStream:
    """The stream of one session: kept open, fed, and obeyed, for the life of the session."""

    def __init__(
        self,
        options: SessionOptions,
        throttle: Throttle,
        clock: Callable[[], float],
        space: SpaceGate | None = None,
        metadata: MetadataPace | None = None,
    ):
        self._options = options
        self._throttle = throttle
        self._clock = clock
        # The burst buffer's space contract (client/space.py), on a session with buffer=True.
        self._space = space
        self._space_timer: asyncio.TimerHandle | None = None
        self._metadata = metadata  # the session's metadata operations (client/metadata.py)

        # Attachment is read by any thread and waited on by threads or coroutines.
        self._attached = False
        self._attached_cond = threading.Condition()
        self._attached_event = asyncio.Event()

        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._link: NodeLink | None = None
        self._call: Call | None = None
        self._outbox: asyncio.Queue[pb.ClientMessage | None] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._stream_task: asyncio.Task[None] | None = None
        self._open_ops: dict[int, pb.OpPosted] = {}
        self._stream_epoch: int | None = None
        self._stream_epoch_before: int | None = None  # before the allocation being handled
        self._stream_had_allocation = False
        # The longest the stream's controller lets the session go without a Usage (its
        # Allocation.heartbeat_seconds); None: it said none, so every report interval.
        self._heartbeat: float | None = None
        self._urgent = False  # a message queued for the stream must not linger
        self._lease_deadline = math.inf
        self.advice: tuple[str, ...] = ()  # Allocation.advice: the job's advised replicas
        self._lease_changed = asyncio.Event()
        # What the session paces at without a live controller (client/fallback.py).
        self._fallback = FallbackPacer(options.fallback, options.fallback_grace, throttle)
        # A live controller turned the session away (refused or ended it): nobody counts a
        # rate kept now, so keep-last waits at 0 (through the grace) until an allocation comes.
        self._turned_away = False
        self._usage = UsageReports(throttle, space, clock)
        self._detached_logged = False
        self._refused: str | None = None
        # How this session's streams ended, by status name ("restarted": cancelled here, the
        # lease having run out on a silent stream); docs/protocol.md, "Errors".
        self.ends: Counter[str] = Counter()

    # ------------------------------------------------------------------ attachment (any thread)

    @property
    def refused(self) -> str | None:
        """``"<status code name>: <controller's message>"`` when the controller refused the
        session's last stream, else None."""
        return self._refused

    @property
    def attached(self) -> bool:
        return self._attached

    def wait_attached(self, timeout: float | None) -> bool:
        """Blocks a thread until an allocation from a live controller is in force, or the
        controller refused the session (then False at once); `Interrupted` when the thread's
        cancellation fires first (`burstctl.client.waits`)."""
        with self._attached_cond:
            wait_for(self._attached_cond, lambda: self._attached or bool(self._refused), timeout)
            return self._attached

    async def wait_attached_async(self, timeout: float | None) -> bool:
        """Suspends a coroutine on the session's loop until the session is attached."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._attached_event.wait()
        return self._attached

    def _set_attached(self, attached: bool) -> None:
        with self._attached_cond:
            self._attached = attached
            self._attached_cond.notify_all()
        if attached:
            self._attached_event.set()
        else:
            self._attached_event.clear()

    # ------------------------------------------------------------------ lifecycle

    def start(self, link: NodeLink) -> None:
        """Starts the stream (a leg of ``link``'s), the usage reports and the lease watch on the
        running loop."""
        self._loop = asyncio.get_running_loop()
        now = self._clock()
        self._lease_deadline = now + self._options.attach_timeout
        self._usage.start()
        self._link = link
        self._stream_task = self._spawn(self._run_streams(link.channel), "stream")
        self._spawn(self._report_usage(), "usage")
        self._spawn(self._watch_lease(), "lease")

    async def close(self) -> None:
        """Says Goodbye, ends the stream and stops every task (the channel stays open)."""
        self._stopping = True
        self._fallback.cancel()
        self._cancel_space_timer()
        try:
            await self._say_goodbye()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._set_attached(False)

    async def _say_goodbye(self) -> None:
        outbox, writer = self._outbox, self._writer
        if outbox is None or writer is None:
            return
        # The last report first: what was moved since the previous one is booked too.
        last = self._usage.take(False, self._stream_epoch or 0)
        if last is not None:
            outbox.put_nowait(last)
        outbox.put_nowait(pb.ClientMessage(goodbye=pb.Goodbye()))
        outbox.put_nowait(None)  # half-close once everything queued before is written
        # asyncio.wait neither raises nor cancels: a dead controller only costs the timeout.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GOODBYE_TIMEOUT
        await asyncio.wait({writer}, timeout=GOODBYE_TIMEOUT)
        # Then let the controller end the stream itself once it has read everything:
        # cancelling right after the half-close could cut what is still in flight.
        if self._stream_task is not None:
            await asyncio.wait({self._stream_task}, timeout=max(0.0, deadline - loop.time()))

    def _spawn(self, coro: Coroutine[Any, Any, Any], role: str) -> asyncio.Task[Any]:
        assert self._loop is not None
        task = self._loop.create_task(coro, name=f"burstctl-{role}-{self._options.client_id}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("task %s failed", task.get_name(), exc_info=task.exception())

    # ------------------------------------------------------------------ operations and usage

    def post(self, op_id: int, kind: pb.OpKind, volume: int) -> bool:
        """Posts an operation (kept, and re-posted on every new stream, until completed)."""
        if self._stopping:
            return False
        posted = pb.OpPosted(op_id=op_id, kind=kind, volume=volume)
        self._open_ops[op_id] = posted
        self._send(pb.ClientMessage(op_posted=posted))
        return True

    def complete(self, op_id: int, quiet: float = 0.0) -> None:
        """Completes an operation; ``quiet``: seconds it stayed open after its last byte."""
        if self._stopping:
            return
        if self._open_ops.pop(op_id, None) is not None:
            # Usage first: the controller attributes bytes to the operations open when
            # they arrive, so the operation's own bytes must reach it before it closes.
            self.send_usage(False)
            done = pb.OpCompleted(op_id=op_id, quiet_seconds=quiet)
            self._send(pb.ClientMessage(op_completed=done))

    async def _report_usage(self) -> None:
        """The periodic reports: every ``report_interval`` a Usage if it says something new,
        and one at least every heartbeat the controller asked for, idle or not."""
        interval = self._options.report_interval
        next_at = self._clock() + interval
        while True:
            await asyncio.sleep(max(0.0, next_at - self._clock()))
            self.send_usage(False, periodic=True)
            next_at += interval
            # After a stall, skip the missed ticks instead of sending a burst of reports.
            next_at = max(next_at, self._clock() + interval / 2)

    def send_usage(self, force_waiting: bool, periodic: bool = False) -> None:
        """Reports the throttle's counters since the last report (if a stream is open); a
        ``periodic`` one only if it says something new or the heartbeat is due."""
        if self._outbox is None or self._stopping:
            return
        heartbeat = self._heartbeat if periodic else None
        report = self._usage.take(force_waiting, self._stream_epoch or 0, heartbeat)
        if report is not None:
            self._send(report, urgent=force_waiting)  # a wait starts: its application waits

    # ------------------------------------------------------------------ the stream

    async def _run_streams(self, channel: grpc.aio.Channel) -> None:
        """Keeps one stream open for the life of the session, reconnecting with backoff."""
        backoff = Backoff()
        while not self._stopping:
            code: grpc.StatusCode | None = None
            hint: float | None = None
            try:
                # Waits through the channel's own reconnect backoff while the controller is away.
                await channel.channel_ready()
                code = await self._run_stream()
                if code is None:
                    continue  # again at once, as a Session stream
            except grpc.aio.AioRpcError as err:
                code = err.code()
                hint = retry_hint(err)
                self._log_stream_end(code, err.details())
                if code in REFUSALS:
                    self._refuse(f"{code.name}: {err.details() or ''}")
                if code in TURNED_AWAY:
                    self._turn_away()
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if self._stopping or (current is not None and current.cancelling()):
                    raise
                # gRPC raises CancelledError in read() after we cancelled the call ourselves
                # (lease expired on a silent stream); that is a restart, not our task ending.
                self.ends["restarted"] += 1
                logger.info("restarting the session stream to %s", self._options.target)
            except Exception:
                logger.exception("session stream to %s failed", self._options.target)
            if self._stopping:
                return
            if self._stream_had_allocation and code not in (
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
            ):
                backoff.reset()
            delay = backoff.next_delay()
            if hint is not None:
                # Shed by an overloaded controller: come back no sooner than it asked, spread
                # over [hint, 1.5·hint] so that the refused clients do not return together.
                delay = max(delay, hint * random.uniform(1.0, 1.5))
            await asyncio.sleep(delay)

    async def _run_stream(self) -> grpc.StatusCode | None:
        """Runs one stream until it ends; returns its status (non-OK ones raise), or None when
        the controller predates Node streams (the link opens a Session stream next)."""
        assert self._link is not None
        call = self._link.open()
        outbox: asyncio.Queue[pb.ClientMessage | None] = asyncio.Queue()
        buffer = self._space.snapshot().buffer if self._space is not None else None
        allotted = self._fallback.last_rate or 0.0
        outbox.put_nowait(self._options.hello(buffer, self._throttle.rate, allotted))
        # A new stream knows nothing: re-post every operation still open, with its old id.
        for posted in self._open_ops.values():
            outbox.put_nowait(pb.ClientMessage(op_posted=posted))
        self._call, self._outbox = call, outbox
        self._stream_epoch = None
        self._heartbeat = None
        self._stream_had_allocation = False
        if self._space is not None:
            self._space.new_stream()
        writer = self._writer = self._spawn(self._write(call, outbox), "writer")
        try:
            while True:
                try:
                    message = await call.read()
                except grpc.aio.AioRpcError as err:
                    if err.code() is grpc.StatusCode.UNIMPLEMENTED and isinstance(call, Leg):
                        return None
                    raise
                if message is grpc.aio.EOF:
                    break
                self._on_server_message(message)
            code = await call.code()
            self._log_stream_end(code, await call.details())
            return code
        finally:
            self._call = self._outbox = self._writer = None
            self._stream_epoch = None
            self._set_attached(False)
            call.cancel()
            writer.cancel()
            # Let the call finish on this loop before anything closes it (gRPC delivers its
            # completion through the loop that started it).
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await call.code()
            with contextlib.suppress(asyncio.CancelledError):
                await writer

    async def _write(self, call: Call, outbox: asyncio.Queue[pb.ClientMessage | None]) -> None:
        try:
            # Hello opens the stream on its own (the controller reads it alone), and nothing
            # follows it until the controller admitted the stream (its initial metadata): a
            # write in flight when a refusal arrives turns the refusal into INTERNAL here, its
            # code and retry hint lost (gRPC Python; docs/protocol.md, "Errors").
            hello = await outbox.get()
            assert hello is not None
            await call.write([hello])
            await call.initial_metadata()
            if call.done():
                return  # refused: the reader learns how
            while True:
                # What queued up while the previous write was in flight goes as one write.
                pending = [await outbox.get()]
                while pending[-1] is not None and len(pending) < MAX_BATCH and not outbox.empty():
                    pending.append(outbox.get_nowait())
                done = pending[-1] is None
                messages = [m for m in pending if m is not None]
                urgent, self._urgent = self._urgent, False
                if messages:
                    await call.write(messages, urgent)
                if done:
                    await call.done_writing()
                    return
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as err:
            # The call is over; the reader learns why and reconnects.
            logger.debug("stopped writing to the session stream: %r", err)

    def _send(self, message: pb.ClientMessage, urgent: bool = False) -> None:
        """Queues ``message`` for the stream; ``urgent``: someone waits on it, so the node's
        stream writes it without its linger (client/link.py)."""
        # While no stream is open the message is dropped: a new stream starts from the state
        # (Hello + open operations), not from a replay.
        if self._outbox is not None:
            self._outbox.put_nowait(message)
            self._urgent = self._urgent or urgent

    def _refuse(self, details: str) -> None:
        """The controller refused the session: no allocation will come, so the fallback applies
        now rather than after ``attach_timeout``; waiters of `wait_attached` are woken."""
        with self._attached_cond:
            self._refused = details
            self._attached_cond.notify_all()

    def _log_stream_end(self, code: grpc.StatusCode, details: str | None) -> None:
        self.ends[code.name] += 1
        target = self._options.target
        if self._stopping:
            logger.debug("session stream to %s closed: %s", target, code.name)
            return
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            # The controller rejected what we sent: a bug on one side; retried with backoff.
            logger.error("controller %s rejected the session: %s", target, details)
        elif code in REFUSALS and self._refused != f"{code.name}: {details or ''}":
            logger.error("controller %s refused the session: %s %s", target, code.name, details)
        elif code == grpc.StatusCode.RESOURCE_EXHAUSTED and not self._detached_logged:
            # A limit of the controller (e.g. its session limit): retried after its hint.
            logger.warning("controller %s refused the session: %s", target, details)
        elif code == grpc.StatusCode.CANCELLED:
            # gRPC cancelled a stream the overloaded controller did not take up in time:
            # expected under load, tried again after the backoff.
            logger.info("controller %s did not take the session stream up in time", target)
        elif not self._detached_logged:
            logger.warning("session stream to %s ended: %s %s", target, code.name, details or "")
        else:
            logger.debug("session stream to %s ended: %s %s", target, code.name, details or "")
        self._detached_logged = True

    # ------------------------------------------------------------------ controller messages

    def _on_server_message(self, message: pb.ServerMessage) -> None:
        body = message.WhichOneof("body")
        if body == "allocation":
            self._on_allocation(message.allocation)
        elif body == "renew":
            self._on_renew(message.renew.lease_seconds)
        elif body == "error":
            error = message.error
            logger.warning(
                "controller %s reports %s (field %r): %s",
                self._options.target,
                error.code,
                error.field,
                error.message,
            )
        else:
            logger.debug("ignoring a server message without a known body: %r", body)

    def _on_allocation(self, allocation: pb.Allocation) -> None:
        if allocation.HasField("advice"):  # also in a copy of the allocation in force
            self.advice = tuple(allocation.advice.replicas)
        if self._metadata is not None:  # in every allocation, copies too; kept while away
            self._metadata.set_rate(allocation.metadata_rate)
        stale = self._stream_epoch is not None and allocation.epoch <= self._stream_epoch
        if stale and self._space is not None and allocation.HasField("space"):
            # A rise of the space limit comes in a copy of the allocation in force (same
            # epoch): the limit is cumulative and only rises on a stream, so the larger wins.
            self._space.raise_limit(allocation.space.limit)
        if stale:
            logger.debug("ignoring stale allocation epoch %d", allocation.epoch)
            return
        rate, burst, lease = allocation.rate, allocation.burst, allocation.lease_seconds
        if not (rate >= 0 and 0 <= burst < math.inf and lease > 0):  # also rejects NaN
            logger.error(
                "ignoring invalid allocation from %s: rate=%r burst=%r lease_seconds=%r",
                self._options.target,
                rate,
                burst,
                lease,
            )
            return
        pattern = None
        if allocation.HasField("windows"):
            try:
                pattern = pattern_of(allocation.windows, self._clock(), self._fallback.last_pattern)
            except MalformedWindows as err:
                logger.error(
                    "ignoring an allocation with malformed windows from %s: %s",
                    self._options.target,
                    err,
                )
                return
        share = allocation.fallback_rate
        if not 0.0 <= share < math.inf:  # also rejects NaN
            logger.error(
                "ignoring an invalid fallback_rate %r from %s", share, self._options.target
            )
            share = 0.0
        self._stream_epoch_before, self._stream_epoch = self._stream_epoch, allocation.epoch
        heartbeat = allocation.heartbeat_seconds
        self._heartbeat = heartbeat if 0 < heartbeat < math.inf else None
        self._lease_deadline = self._clock() + lease
        self._lease_changed.set()
        before = self._throttle.rate
        self._throttle.set_rate(rate, burst, pattern)
        was_in_fallback = self._fallback.active
        # the rate after the throttle's floor: a residue is a 0
        self._fallback.allotted(self._throttle.rate, burst, pattern, share, lease)
        if self._throttle.rate < before:
            # Acknowledge a decrease at once: the controller holds the increases it made room
            # for until then (docs/protocol.md, "Decreases before increases"). Counters and
            # interval 0: an acknowledgement only, not a (short, noisy) usage sample.
            self._send(pb.ClientMessage(usage=pb.Usage(applied_epoch=allocation.epoch)))
        if self._space is not None:
            self._cancel_space_timer()
            if not allocation.HasField("space"):
                self._space.set_limit(None)  # the controller has no capacity
            elif self._stream_epoch_before is None:
                self._space.set_limit(allocation.space.limit)  # the stream's first word
            else:
                self._space.raise_limit(allocation.space.limit)
        self._stream_had_allocation = True
        if was_in_fallback or self._detached_logged:
            logger.info(
                "attached to %s (%s): rate %s",
                self._options.target,
                allocation.replica_id or "?",
                format_rate(rate),
            )
        self._turned_away = False
        self._detached_logged = False
        self._refused = None
        self._set_attached(True)

    def _on_renew(self, lease: float) -> None:
        """The node stream's controller renews every allocation in force on it."""
        if self._stream_epoch is None or self._fallback.active:
            return  # nothing in force to renew
        if not 0 < lease < math.inf:
            logger.error("ignoring a renewal with lease_seconds=%r", lease)
            return
        self._lease_deadline = self._clock() + lease
        self._lease_changed.set()

    # ------------------------------------------------------------------ lease and fallback

    async def _watch_lease(self) -> None:
        """Applies the fallback when the lease (or the first attach) runs out unrenewed."""
        while True:
            remaining = None if self._fallback.active else self._lease_deadline - self._clock()
            if remaining is not None and math.isinf(remaining):
                remaining = None
            self._lease_changed.clear()
            try:
                async with asyncio.timeout(None if remaining is None else max(0.0, remaining)):
                    await self._lease_changed.wait()
            except TimeoutError:
                # An allocation may have been handled between the timer and this task resuming.
                if self._clock() >= self._lease_deadline:
                    self._lease_expired()

    def _turn_away(self) -> None:
        """A live controller refused or ended the session (``TURNED_AWAY``): ``keep-last``
        waits at 0 until it is admitted again (through the grace, then at its conservative
        rate); the other fallbacks apply as they are."""
        if self._turned_away and self._fallback.active:
            return  # turned away again while it retries: nothing changes
        self._turned_away = True
        self._lease_deadline = self._clock()
        self._lease_expired()

    def _lease_expired(self) -> None:
        fallback = self._options.fallback
        rate = self._fallback.apply(self._turned_away)
        self._set_attached(False)
        if self._turned_away:
            reason = "turned away by the controller"
        elif self._fallback.last_burst is not None:
            reason = "allocation lease expired without renewal"
        else:
            reason = f"no allocation within {self._options.attach_timeout:g}s"
        logger.warning(
            "%s from %s; fallback %s: rate %s",
            reason,
            self._options.target,
            fallback,
            format_rate(rate) if math.isfinite(rate) else "unthrottled",
        )
        grace = self._options.fallback_grace
        if self._space is not None:
            self._space.attach_timed_out()
            if math.isfinite(grace) and self._space_timer is None:
                assert self._loop is not None
                self._space_timer = self._loop.call_later(grace, self._space_grace_expired)
        if self._stream_had_allocation and self._call is not None:
            # The controller on this stream stopped renewing: treat the stream as dead, and
            # say what the session goes on pacing at (counted until it is back).
            self._call.leave(rate if math.isfinite(rate) else 0.0)

    def _space_grace_expired(self) -> None:
        """No controller for ``fallback_grace`` after the lease ran out: the space limit is no
        longer enforced (a dead controller must not stop the application's writes for ever;
        docs/capacity.md). The next allocation enforces it again."""
        self._space_timer = None
        if self._space is None or not self._fallback.active or self._stopping:
            return
        self._space.release()
        logger.warning(
            "no controller at %s for %gs after the lease ran out; the burst buffer's space"
            " limit is no longer enforced",
            self._options.target,
            self._options.fallback_grace,
        )

    def _cancel_space_timer(self) -> None:
        if self._space_timer is not None:
            self._space_timer.cancel()
            self._space_timer = None
