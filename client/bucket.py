"""The token bucket that paces a session's I/O, and the thin sync/async waiting around it.

`TokenBucket` is pure math over cumulative counters and an explicit clock value, so it is
unit-tested without threads or sleeps. `Throttle` wraps one bucket for concurrent use: the
waiting side of `burstctl.client.waits` (a condition for blocking callers, which their
cancellation interrupts, futures for coroutines), the byte/ops/wait counters the usage reports
are built from, and a hook for the moment an acquire starts waiting.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from burstctl.client.waits import Interrupted, Waiters, wait_slice
from burstctl.common.limits import MIN_RATE
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

logger = logging.getLogger(__name__)

# Relative slack when comparing cumulative float counters, so rounding never leaves a waiter
# spinning on a deficit of a fraction of a byte. 1e-12 of 2**53 bytes is still below 10 kB.
_RELATIVE_SLACK = 1e-12
_ABSOLUTE_SLACK = 1e-9


def _check_rate(rate: float) -> float:
    """The rate to pace at: ``rate``, or 0 below `MIN_RATE` (a residue means "wait")."""
    rate = float(rate)
    if math.isnan(rate) or rate < 0:
        raise ValueError(f"rate must be >= 0 (inf = unthrottled), got {rate!r}")
    return rate if rate >= MIN_RATE else 0.0


def _check_burst(burst: float) -> float:
    burst = float(burst)
    if not math.isfinite(burst) or burst < 0:
        raise ValueError(f"burst must be finite and >= 0, got {burst!r}")
    return burst


class Pattern:
    """A periodic pattern of I/O windows on the client's clock (docs/client.md, "Windows").

    Period k is ``[origin + k·period, origin + (k+1)·period)`` for every integer k; each window
    ``(start, end, rate)`` repeats in every period, ``start`` and ``end`` in seconds from the
    period's start, an ``end`` past the period wrapping into the next one. The pattern is the
    rate of the bucket as a function of time: ``volume(a, b)`` is its integral over ``[a, b]``,
    ``time_to(a, amount)`` the first instant at which that integral reaches ``amount``.
    Windows must be well formed (``burstctl.common.limits.windows_problem``); a rate below
    `MIN_RATE` is paced as 0.
    """

    __slots__ = ("_cum", "_cum_end", "_ends", "_rates", "_starts", "origin", "period", "total")

    def __init__(
        self, period: float, origin: float, windows: Sequence[tuple[float, float, float]]
    ) -> None:
        if not (0.0 < period < math.inf and math.isfinite(origin)):
            raise ValueError(f"a pattern needs a finite period > 0 and origin, got {period!r}")
        self.period = float(period)
        self.origin = float(origin)
        # Wrapping windows split in two, so every segment lies inside [0, period].
        segments: list[tuple[float, float, float]] = []
        for start, end, rate in windows:
            rate = _check_rate(rate)
            if not math.isfinite(rate):
                raise ValueError(f"a window's rate must be finite, got {rate!r}")
            if end > period:
                segments.append((start, period, rate))
                segments.append((0.0, end - period, rate))
            else:
                segments.append((start, end, rate))
        segments.sort()
        self._starts = [s for s, _, _ in segments]
        self._ends = [e for _, e, _ in segments]
        self._rates = [r for _, _, r in segments]
        self._cum: list[float] = []  # volume of a period before each segment
        self._cum_end: list[float] = []  # ... up to each segment's end
        total = 0.0
        for start, end, rate in segments:
            self._cum.append(total)
            total += (end - start) * rate
            self._cum_end.append(total)
        self.total = total  # volume of one period

    def mean_rate(self) -> float:
        return self.total / self.period

    def same_windows(self, other: Pattern) -> bool:
        """The same period and windows, whatever the origins."""
        return (
            self.period == other.period
            and self._starts == other._starts
            and self._ends == other._ends
            and self._rates == other._rates
        )

    def rate_at(self, t: float) -> float:
        """The rate in force at ``t`` (0 between windows)."""
        _, phase = self._split(t)
        j = bisect.bisect_right(self._starts, phase) - 1
        return self._rates[j] if j >= 0 and phase < self._ends[j] else 0.0

    def next_edge(self, t: float) -> float:
        """The first instant after ``t`` at which a window starts or ends (or a period does):
        where the rate may change. The node agent republishes a pattern's rate there."""
        k, _ = self._split(t)
        base = self.origin + k * self.period
        edges = sorted({e for e in (*self._starts, *self._ends, self.period) if e > 0})
        for cycle in range(3):  # the next period's edges too (rounding at a period's end)
            for edge in edges:
                at = base + cycle * self.period + edge
                if at > t:
                    return at
        return t + self.period

    def _split(self, t: float) -> tuple[int, float]:
        """``t`` as (period number, seconds into it)."""
        x = t - self.origin
        k = math.floor(x / self.period)
        phase = x - k * self.period
        return k, min(max(phase, 0.0), self.period)

    def run_start(self, t: float) -> float | None:
        """The start of the run of windows in force at ``t`` (windows that touch, across the
        period's end too, are one run), on the pattern's clock; None between windows, and
        ``-inf`` when the windows cover the whole period (a run without a start)."""
        k, phase = self._split(t)
        j = bisect.bisect_right(self._starts, phase) - 1
        if j < 0 or phase >= self._ends[j] or self._rates[j] <= 0.0:
            return None
        base = self.origin + k * self.period
        for _ in range(len(self._starts)):
            if j > 0 and self._starts[j] - self._ends[j - 1] <= _ABSOLUTE_SLACK:
                j -= 1
            elif j == 0 and self._starts[0] <= _ABSOLUTE_SLACK:
                last = len(self._starts) - 1
                if self.period - self._ends[last] > _ABSOLUTE_SLACK:
                    break
                j, base = last, base - self.period  # the run began in the period before
            else:
                break
            if self._rates[j] <= 0.0:
                return base + self._ends[j]
        else:
            return -math.inf
        return base + self._starts[j]

    def _cumulative(self, phase: float) -> float:
        """Volume moved from the period's start up to ``phase`` seconds into it."""
        j = bisect.bisect_right(self._starts, phase) - 1
        if j < 0:
            return 0.0
        return self._cum[j] + self._rates[j] * min(
            phase - self._starts[j], self._ends[j] - self._starts[j]
        )

    def volume(self, a: float, b: float) -> float:
        """The pattern's volume over ``[a, b]`` (0 when ``b <= a``)."""
        if b <= a:
            return 0.0
        ka, pa = self._split(a)
        kb, pb_ = self._split(b)
        return max(0.0, (kb - ka) * self.total + self._cumulative(pb_) - self._cumulative(pa))

    def time_to(self, a: float, amount: float) -> float:
        """The first ``t >= a`` with ``volume(a, t) >= amount``; inf if the pattern moves
        nothing."""
        if amount <= 0:
            return a
        if self.total <= 0:
            return math.inf
        k, phase = self._split(a)
        reach = self._cumulative(phase) + amount  # from the start of period k
        periods = math.floor(reach / self.total)
        rest = reach - periods * self.total
        if rest <= 0.0:  # reached exactly at the end of the last segment of a period
            periods -= 1
            rest = self.total
        # Rounding must not push the answer past a gap: a segment that ends within the slack
        # of ``rest`` is the one that reaches it, not the next window.
        slack = _ABSOLUTE_SLACK + _RELATIVE_SLACK * reach
        j = min(bisect.bisect_left(self._cum_end, rest - slack), len(self._cum_end) - 1)
        inside = (
            self._starts[j] + (rest - self._cum[j]) / self._rates[j]
            if self._rates[j]
            else self._ends[j]
        )
        t = self.origin + (k + periods) * self.period + min(inside, self._ends[j])
        return max(t, a)


class TokenBucket:
    """A token bucket with reservations, kept as two cumulative counters.

    ``filled`` counts the tokens that ever flowed in, ``taken`` the tokens ever reserved. A
    reservation of n tokens gets the target ``taken + n`` and may proceed once ``filled`` reaches
    it, so concurrent callers are served in arrival order and a request larger than the burst
    waits ``n / rate`` instead of forever (the bucket is never required to hold n tokens at once).
    The burst caps only unreserved tokens: ``filled <= taken + burst``.

    A rate of 0 means "wait until the rate changes"; so does any rate below `MIN_RATE`, which
    the bucket stores as 0. ``math.inf`` means unthrottled. Not thread-safe: `Throttle`
    serialises access.
    """

    __slots__ = ("_burst", "_filled", "_pattern", "_rate", "_stamp", "_taken")

    def __init__(self, rate: float = 0.0, burst: float = 0.0, now: float = 0.0) -> None:
        self._rate = _check_rate(rate)
        self._burst = _check_burst(burst)
        self._pattern: Pattern | None = None  # when set, it is the refill rate, not _rate
        # Starts empty: nothing may flow before the first allocation says how fast.
        self._filled = 0.0
        self._taken = 0.0
        self._stamp = now

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def burst(self) -> float:
        return self._burst

    @property
    def pattern(self) -> Pattern | None:
        return self._pattern

    @property
    def filled(self) -> float:
        return self._filled

    @property
    def taken(self) -> float:
        return self._taken

    def level(self, now: float) -> float:
        """Unreserved tokens; negative while reservations are outstanding."""
        self._refill(now)
        return self._filled - self._taken

    def _refill(self, now: float) -> None:
        # filled = min(filled + rate * dt, taken + burst): the cap binds unreserved tokens only.
        dt = now - self._stamp
        if self._pattern is not None:
            if dt > 0:
                # Tokens a window earned are spent in that window: unreserved ones are dropped
                # between windows (a job computing through its window does not move its
                # window's bytes afterwards); reserved ones wait for their caller.
                pattern = self._pattern
                start = pattern.run_start(now)
                if start is None:
                    gained = pattern.volume(self._stamp, now)
                    self._filled = min(self._filled + gained, self._taken)
                elif start > self._stamp:
                    before = pattern.volume(self._stamp, start)
                    self._filled = min(self._filled + before, self._taken)
                    gained = pattern.volume(start, now)
                    self._filled = min(self._filled + gained, self._taken + self._burst)
                else:
                    gained = pattern.volume(self._stamp, now)
                    self._filled = min(self._filled + gained, self._taken + self._burst)
        elif self._rate == math.inf:
            self._filled = self._taken + self._burst
        elif dt > 0:
            self._filled = min(self._filled + self._rate * dt, self._taken + self._burst)
        # A clock that steps back must neither drain nor fill: wait for it to catch up.
        if dt > 0:
            self._stamp = now

    def set_rate(
        self, rate: float, burst: float, now: float, pattern: Pattern | None = None
    ) -> None:
        """Changes rate and depth; tokens earned so far were earned at the old rate. With a
        ``pattern`` the bucket refills by the pattern's windows (``rate`` is then only the
        nominal rate it reports); without one, at ``rate``."""
        rate = _check_rate(rate)
        burst = _check_burst(burst)
        self._refill(now)
        self._rate = rate
        self._burst = burst
        self._pattern = pattern
        # A shallower bucket loses its surplus now; an unthrottled one is full.
        self._filled = min(self._filled, self._taken + burst)
        self._refill(now)

    def reserve(self, nbytes: float, now: float) -> float:
        """Reserves ``nbytes`` tokens and returns the target ``filled`` must reach."""
        if nbytes < 0:
            raise ValueError(f"cannot reserve a negative amount: {nbytes!r}")
        self._refill(now)
        self._taken += nbytes
        if self._rate == math.inf and self._pattern is None:
            # Unthrottled: covered at once, but still counted.
            self._filled = self._taken + self._burst
        return self._taken

    def refund(self, nbytes: float, now: float) -> None:
        """Gives back the ``nbytes`` tokens of a reservation whose caller stopped waiting for
        them: the reservations after it are covered that much sooner, or, with none, the bucket
        is as if it had never been made (never above its burst)."""
        self._refill(now)
        self._filled = min(self._filled + nbytes, self._taken + self._burst)

    def delay(self, target: float, now: float) -> float:
        """Seconds until ``target`` is covered at the current rate: 0 = now, inf = rate is 0."""
        self._refill(now)
        deficit = target - self._filled
        if deficit <= _ABSOLUTE_SLACK + _RELATIVE_SLACK * abs(target):
            return 0.0
        if self._pattern is not None:
            # The burst cap cannot bind before the target: filled < target <= taken.
            return self._pattern.time_to(now, deficit) - now
        if self._rate == 0:
            return math.inf
        return deficit / self._rate


@dataclass(frozen=True, slots=True)
class ThrottleStats:
    """Cumulative counters of a `Throttle` since it was created."""

    bytes: int
    acquires: int
    wait_seconds: float
    waiting: bool
    bytes_read: int = 0  # of ``bytes``, acquired for reads
    bytes_written: int = 0  # of ``bytes``, acquired for writes
    metadata_acquires: int = 0  # of ``acquires``, for metadata


class Throttle(Waiters):
    """A `TokenBucket` shared by threads and coroutines.

    Blocking callers wait on a `threading.Condition`, coroutines on a future, both with the
    computed delay as timeout, taken in slices of at most `MAX_WAIT_SLICE`; a rate change wakes
    everyone to recompute. Nothing but `close`, a caller's own bad argument and, for a thread,
    its cancellation (`Interrupted`, `burstctl.client.waits`) makes an acquire raise.
    ``on_wait_start`` is called, with the throttle's lock held, when an acquire starts waiting
    while the last reported snapshot said nobody waited; ``on_rate_change`` with the new rate
    (after the floor) whenever the rate in force changes, also under the lock. Neither may
    block nor call back into the throttle. ``on_bucket`` is called with (rate, burst, pattern)
    after every `set_rate`, changed or not, once the lock is released.

    Bytes paced elsewhere (the preload library's shared page, docs/preload.md) are booked with
    `count`, and waits made elsewhere with `hold_wait`: the usage reports then carry them as
    if they had been acquired and waited for here.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        on_wait_start: Callable[[], None] | None = None,
        on_rate_change: Callable[[float], None] | None = None,
        on_bucket: Callable[[float, float, Pattern | None], None] | None = None,
    ) -> None:
        super().__init__(clock, on_wait_start)
        self._on_rate_change = on_rate_change
        self._on_bucket = on_bucket
        self._held_since: float | None = None  # hold_wait(True) in force since
        self._bucket = TokenBucket(now=clock())
        self._closed = False
        self._bytes = 0
        self._acquires = 0
        # bytes and acquire calls per kind, so the controller books each byte under the kind
        # of the acquire that moved it (not of whatever operation happens to be open)
        self._by_kind = [0, 0, 0, 0]  # indexed by the wire OpKind: -, read, write, metadata
        self._kind_acquires = [0, 0, 0, 0]

    @property
    def rate(self) -> float:
        return self._bucket.rate

    @property
    def burst(self) -> float:
        return self._bucket.burst

    @property
    def total_wait_seconds(self) -> float:
        return self.snapshot().wait_seconds

    @property
    def pattern(self) -> Pattern | None:
        return self._bucket.pattern

    def set_rate(self, rate: float, burst: float, pattern: Pattern | None = None) -> None:
        """Applies a new rate (and pattern of windows, or none) and wakes every waiter to
        re-evaluate its wait."""
        with self._cond:
            old = self._bucket.rate
            self._bucket.set_rate(rate, burst, self._clock(), pattern)
            self._wake_all()
            if self._on_rate_change is not None and self._bucket.rate != old:
                try:
                    self._on_rate_change(self._bucket.rate)
                except Exception:  # an observer's bug must not stop the session's pacing
                    logger.exception("rate observer failed")
            applied = (self._bucket.rate, self._bucket.burst, self._bucket.pattern)
        if self._on_bucket is not None:
            try:
                self._on_bucket(*applied)
            except Exception:  # an observer's bug must not stop the session's pacing
                logger.exception("bucket observer failed")

    def count(self, nbytes: int, kind: int = 0, calls: int = 1) -> None:
        """Books ``nbytes`` of ``kind`` (the wire OpKind) paced elsewhere, as ``calls``
        acquires that did not wait: the counters move, the bucket does not."""
        with self._cond:
            self._check_open()
            self._book(nbytes, kind, calls)

    def hold_wait(self, waiting: bool) -> None:
        """I/O paced elsewhere waits (True) or no longer waits (False) for tokens: one waiter
        while held, with its wait time and the one wait notice per transition. Idempotent."""
        with self._cond:
            if waiting and self._held_since is None and not self._closed:
                self._held_since = self._clock()
                self._start_wait(self._held_since)
            elif not waiting and self._held_since is not None:
                self._finish_wait(self._held_since)
                self._held_since = None

    def close(self) -> None:
        """Refuses further acquires and makes the blocked ones raise (a held wait ends)."""
        with self._cond:
            self._closed = True
            if self._held_since is not None:
                self._finish_wait(self._held_since)
                self._held_since = None
            self._wake_all()

    def snapshot(self, *, reported: bool = False, assume_waiting: bool = False) -> ThrottleStats:
        """Returns the counters.

        ``reported``: the snapshot goes to the controller, so its waiting flag becomes the one
        the next wait is compared with. ``assume_waiting`` reports waiting even if the acquire
        that announced it has been served since.
        """
        with self._cond:
            now = self._clock()
            stats = ThrottleStats(
                bytes=self._bytes,
                acquires=self._acquires,
                wait_seconds=self._waited(now),
                waiting=self._waiters > 0 or assume_waiting,
                bytes_read=self._by_kind[pb.OP_KIND_READ],
                bytes_written=self._by_kind[pb.OP_KIND_WRITE],
                metadata_acquires=self._kind_acquires[pb.OP_KIND_METADATA],
            )
            if reported:
                self._reported_waiting = stats.waiting
            return stats

    def acquire(self, nbytes: int, kind: int = 0) -> None:
        """Blocks the calling thread until ``nbytes`` tokens are covered; ``kind`` (the wire
        OpKind, 0 = unspecified) only sorts the counters. `Interrupted` when the thread's
        cancellation fires first (`burstctl.client.waits`): the tokens are refunded."""
        with self._cond:
            target, delay, start = self._reserve(nbytes, kind)
            if delay == 0:
                return
            self._start_wait(start)
            try:
                self._block(lambda: self._pending(target))
            except Interrupted:
                self._refund(nbytes)
                raise
            finally:
                self._finish_wait(start)

    async def acquire_async(self, nbytes: int, kind: int = 0) -> None:
        """Suspends the calling coroutine until ``nbytes`` tokens are covered.

        A cancelled acquire refunds its tokens (`TokenBucket.refund`): the acquires behind it
        do not wait for I/O that will not happen. Its bytes stay counted (the counters are
        cumulative on the wire).
        """
        with self._cond:
            target, delay, start = self._reserve(nbytes, kind)
            if delay == 0:
                return
            self._start_wait(start)

        try:
            await self._wait_for(lambda: self._pending(target))
        except asyncio.CancelledError:
            with self._cond:
                self._refund(nbytes)
            raise
        finally:
            with self._cond:
                self._finish_wait(start)

    def _pending(self, target: float) -> float | None:
        """None once ``target`` is covered, else the longest the next sleep may last."""
        self._check_open()
        delay = self._bucket.delay(target, self._clock())
        return None if delay == 0 else wait_slice(delay)

    def _refund(self, nbytes: int) -> None:
        self._bucket.refund(nbytes, self._clock())
        self._wake_all()  # the waiters behind it may be covered now

    def _reserve(self, nbytes: int, kind: int) -> tuple[float, float, float]:
        self._check_open()
        now = self._clock()
        self._book(nbytes, kind)
        target = self._bucket.reserve(nbytes, now)
        return target, self._bucket.delay(target, now), now

    def _book(self, nbytes: int, kind: int, calls: int = 1) -> None:
        self._bytes += nbytes
        self._acquires += calls
        if 0 < kind < len(self._by_kind):
            self._by_kind[kind] += nbytes
            self._kind_acquires[kind] += calls

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("session is closed")
