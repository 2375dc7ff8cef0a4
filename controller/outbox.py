"""The outgoing side of one session: ``StreamOutbox``.

The scheduler offers a session its allocations through the outbox it was opened with
(``records.Outbox``). On a ``Session`` stream the servicer's writer loop awaits the next
message (`StreamOutbox.next`); on a ``Node`` stream the outbox tells the stream it has
something (its ``notify``) and the stream's one writer takes what every such outbox holds
(`StreamOutbox.take`) into one batch (``controller/node.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

import grpc

from burstctl.common.limits import DEFAULT_MAX_NOTICES
from burstctl.policies.schedule import Schedule
from burstctl.proto.burstctl.v1 import controller_pb2 as pb


class StreamOutbox:
    """The outgoing side of one session's stream: the newest allocation wins, errors queue.

    The scheduler offers plain values; the protobuf message is built here, when
    the writer gets to run, so an allocation superseded before it is sent costs
    nothing but a tuple.

    At most ``max_notices`` error notices wait to be sent; the ones beyond are only
    counted, and go out as one summary notice (``RESOURCE_EXHAUSTED``, "N more error
    notices dropped") once the queue has drained: a client that provokes errors faster
    than it reads them costs the controller a bounded queue, never more.
    """

    __slots__ = (
        "_acked",
        "_advice",
        "_allocation",
        "_clock",
        "_dropped",
        "_end",
        "_errors",
        "_event",
        "_fallback_rate",
        "_heartbeat",
        "_last",
        "_metadata",
        "_notify",
        "_replica",
        "_space",
        "_waiting",
        "_written",
        "_written_epoch",
        "max_notices",
    )

    def __init__(
        self,
        replica_id: str = "",
        max_notices: int = DEFAULT_MAX_NOTICES,
        clock: Callable[[], float] = time.monotonic,
        fallback_rate: float = 0.0,
        notify: Callable[[], None] | None = None,
        heartbeat: float = 0.0,
        pacing: float = 0.0,
    ) -> None:
        self._event = asyncio.Event()
        # Called whenever there is something to take (a Node stream's writer), else the
        # event `next` waits on is set.
        self._notify = notify or self._event.set
        # the session's share of the replica's fallback budget, in every Allocation
        self._fallback_rate = fallback_rate
        self._heartbeat = heartbeat  # the longest the client may stay silent, in every Allocation
        self._allocation: tuple[float, float, int, float, str, Schedule | None] | None = None
        self._clock = clock  # the clock of the schedules' origins (the job table's)
        self._errors: deque[tuple[str, str, str]] = deque()  # (code, field, message)
        self._dropped = 0  # notices beyond max_notices since the last summary
        self._end: tuple[grpc.StatusCode, str] | None = None
        self._replica = replica_id
        self.max_notices = max_notices
        self._acked = 0  # the newest epoch the client reported in force (Usage.applied_epoch)
        # The rate the client paces at once it has read what was written: at first what it
        # declared in its Hello, then the rate of the last allocation written.
        self._written = pacing
        self._written_epoch = 0  # the epoch of the last allocation written (0: none yet)
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []  # see `applied`
        # The burst buffer's space limit every Allocation carries (None: no capacity), and the
        # last allocation written, re-sent as it was when only the limit rises (`offer_space`).
        self._space: int | None = None
        self._last: tuple[float, float, int, float, str, Schedule | None] | None = None
        self._advice: tuple[str, ...] = ()  # the advised replicas every Allocation carries
        self._metadata = 0.0  # the metadata ops/s every Allocation carries (0: unpaced)

    def applied(self, epoch: int) -> asyncio.Future[None]:
        """Done once the client reports an allocation of ``epoch`` or newer in force (or the
        stream ended).

        The scheduler holds increases back until the decreases offered before them are
        applied: see "Decreases before increases" in docs/protocol.md.
        """
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if epoch <= self._acked or self._end is not None:
            future.set_result(None)
        else:
            self._waiting.append((epoch, future))
        return future

    def acknowledge(self, epoch: int) -> None:
        """The client reports the allocation of ``epoch`` in force (a newer one covers older)."""
        if epoch > self._acked:
            self._acked = epoch
            self._release(lambda e: e <= epoch)

    def _release(self, due: Callable[[int], bool]) -> None:
        if not self._waiting:
            return
        keep = []
        for epoch, future in self._waiting:
            if due(epoch):
                if not future.done():
                    future.set_result(None)
            else:
                keep.append((epoch, future))
        self._waiting = keep

    def offer(self, rate: float, burst: float, epoch: int, lease: float, policy: str) -> None:
        self._allocation = (rate, burst, epoch, lease, policy, None)  # an unsent one is moot
        self._notify()

    def offer_windows(
        self, rate: float, burst: float, epoch: int, lease: float, policy: str, windows: Schedule
    ) -> None:
        """An allocation with a periodic pattern of windows (``rate``: the pattern's mean)."""
        self._allocation = (rate, burst, epoch, lease, policy, windows)
        self._notify()

    def offer_space(self, limit: int | None) -> None:
        """Sets the space limit every allocation carries from now on. A rise reaches the
        client at once, in a copy of the last allocation written (its epoch unchanged: the
        client takes the limit from it and leaves its rate as it is, docs/capacity.md);
        rises in quick succession coalesce into one message. Not held behind decreases:
        space is not a rate."""
        if limit == self._space:
            return
        self._space = limit
        self._resend()

    def offer_advice(self, addresses: tuple[str, ...]) -> None:
        """Sets the advised replicas every allocation carries from now on; a change reaches
        the client at once, in a copy of the last allocation written (as ``offer_space``)."""
        if addresses == self._advice:
            return
        self._advice = addresses
        self._resend()

    def offer_metadata(self, rate: float) -> None:
        """Sets the metadata rate every allocation carries from now on (ops/s, 0: unpaced;
        controller/metadata_qos.py); a change reaches the client at once, in a copy of the
        last allocation written (as ``offer_advice``). Not held behind decreases: it is no
        share of the bandwidth."""
        if rate == self._metadata:
            return
        self._metadata = rate
        self._resend()

    def _resend(self) -> None:
        """Something every allocation carries changed: the allocation in force goes again
        (its epoch unchanged), unless a newer one waits to be written and carries it."""
        if self._allocation is None and self._last is not None:
            self._allocation = self._last
        self._notify()

    def _windows(self, schedule: Schedule) -> pb.Windows:
        """The pattern on the wire: its origin as seconds from now (the client's receipt,
        but for the message's one-way delay) to the next start of a period."""
        period = schedule.period
        origin = (schedule.origin - self._clock()) % period
        if not 0.0 <= origin < period:  # rounding of a tiny negative remainder
            origin = 0.0
        return pb.Windows(
            period_seconds=period,
            origin_seconds=origin,
            window=[
                pb.Window(start_seconds=w.start, end_seconds=w.end, rate=w.rate)
                for w in schedule.windows
            ],
        )

    def error(self, code: grpc.StatusCode, field_name: str, message: str) -> None:
        """Queues a non-fatal notice (or counts it, beyond ``max_notices``); the session goes on."""
        if len(self._errors) >= self.max_notices:
            self._dropped += 1
            return
        self._errors.append((code.name, field_name, message))
        self._notify()

    @property
    def queued_notices(self) -> int:
        return len(self._errors)

    def end(self, code: grpc.StatusCode = grpc.StatusCode.OK, details: str = "") -> None:
        if self._end is None:
            self._end = (code, details)
        self._notify()
        self._release(lambda e: True)  # nothing more will be applied: nobody waits on it

    @property
    def ended(self) -> tuple[grpc.StatusCode, str] | None:
        return self._end

    @property
    def finished(self) -> bool:
        """Nothing more will be taken: the stream ended (a graceful end once every queued
        notice is out; a client that half-closes after its last message still learns of every
        error, at most max_notices + 1 messages)."""
        end = self._end
        return end is not None and (
            end[0] is not grpc.StatusCode.OK or not (self._errors or self._dropped)
        )

    def take(self) -> pb.ServerMessage | None:
        """The next message to write, or None when there is none now (or ever: `finished`)."""
        if self.finished:
            return None
        if self._errors:
            code, field_name, message = self._errors.popleft()
            return pb.ServerMessage(error=pb.Error(code=code, field=field_name, message=message))
        if self._dropped:
            dropped, self._dropped = self._dropped, 0
            return pb.ServerMessage(
                error=pb.Error(
                    code=grpc.StatusCode.RESOURCE_EXHAUSTED.name,
                    message=f"{dropped} more error notices dropped "
                    f"(max_notices = {self.max_notices} queued per session)",
                )
            )
        if self._allocation is None or self._end is not None:
            return None
        rate, burst, epoch, lease, policy, schedule = self._last = self._allocation
        self._allocation = None
        allocation = pb.Allocation(
            rate=rate,
            burst=burst,
            epoch=epoch,
            lease_seconds=lease,
            policy=policy,
            replica_id=self._replica,
            fallback_rate=self._fallback_rate,
            heartbeat_seconds=self._heartbeat,
            metadata_rate=self._metadata,
        )
        if self._space is not None:
            allocation.space.limit = self._space
        if self._advice:
            allocation.advice.replicas.extend(self._advice)
        if schedule is not None:
            # Computed last, just before the write: the origin's error is the delay.
            allocation.windows.CopyFrom(self._windows(schedule))
        if rate >= self._written and epoch > self._written_epoch:
            # Not a decrease for the client: the decreases offered since its last allocation
            # was written were superseded before they were written. It will not acknowledge
            # them and never paces above this rate, so whoever waits for one waits no more.
            # A decrease written before (up to `_written_epoch`) is not covered: the client
            # may not have read it yet, and acknowledges it when it applies it.
            after = self._written_epoch
            self._release(lambda e: after < e <= epoch)
        self._written = rate
        self._written_epoch = max(self._written_epoch, epoch)
        return pb.ServerMessage(allocation=allocation)

    async def next(self) -> pb.ServerMessage | None:
        """The next message to write, or None once the stream should end."""
        while not self.finished:
            message = self.take()
            if message is not None:
                return message
            self._event.clear()
            await self._event.wait()
        return None
