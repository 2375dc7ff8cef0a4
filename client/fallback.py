"""The fallback: the rate a session paces itself to when no controller renews its allocation.

Spec strings: ``"keep-last"`` or ``"keep-last:<rate>"`` (e.g. ``"keep-last:4MiB/s"``),
``"fixed:<rate>"`` (e.g. ``"fixed:10MiB/s"``), ``"unthrottled"``.

``keep-last`` (the default) never takes the buffer past its capacity, at any number of sessions:
every rate it paces at is one a controller handed out, and the rates a replica hands out sum to
at most its capacity (docs/client.md, "When the controller is away"):

1. A session that never got an allocation paces at 0 (a shed or refused one too): it waits
   for its first allocation through ``fallback_grace``. Past it, it paces at the
   conservative rate (the ``<rate>`` of ``keep-last:<rate>``, 1 MiB/s by default): the one
   per-session constant left, so that a writer waiting in the FUSE mount, which cannot be
   killed while the mount holds its request, is never held for ever.
2. When the lease runs out unrenewed, the session keeps the rate it was last allotted, 0
   included: the sessions of a vanished controller together keep what it last allotted.
3. ``fallback_grace`` seconds later it paces at the lower of that rate and its *budget share*
   (``Allocation.fallback_rate``: the replica's capacity over the most sessions it holds), for
   one more lease, so that every session of the controller has left step 2 before any
   leaves step 3 (their leases end at most one lease apart).
4. Then at its budget share (at most the conservative rate): a kept 0 is lifted to it, a
   higher rate falls to it. The shares of all the sessions a replica can hold sum to at most
   its capacity.

``fixed:<rate>`` and ``unthrottled`` are the operator's choice of a rate per session, outside
that rule: n sessions in fallback pace at n times the rate.

``Fallback`` is the parsed spec; ``FallbackPacer`` applies it to one session's throttle.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Literal

from burstctl.client.bucket import Pattern, Throttle
from burstctl.common.units import format_rate, parse_rate

logger = logging.getLogger(__name__)

# bytes/s: keep-last's conservative rate (module docstring, steps 1 and 4). Small on purpose.
DEFAULT_CONSERVATIVE_RATE = float(1 << 20)

# Bucket depth used by a fallback rate when no controller ever said how deep: 100 ms of I/O.
DEFAULT_BURST_SECONDS = 0.1

FallbackMode = Literal["keep-last", "fixed", "unthrottled"]


@dataclass(frozen=True, slots=True)
class Fallback:
    """A parsed fallback spec; `parse` is the way in.

    ``fixed_rate``: the rate of ``fixed``; ``share_cap``: ``keep-last``'s conservative rate
    (the ``<rate>`` of ``keep-last:<rate>``): the most it paces at from its budget share, and
    its rate past the grace for a session no controller admitted.
    """

    mode: FallbackMode
    fixed_rate: float = 0.0
    share_cap: float = DEFAULT_CONSERVATIVE_RATE

    def __post_init__(self) -> None:
        if self.mode not in ("keep-last", "fixed", "unthrottled"):
            raise ValueError(f"unknown fallback mode {self.mode!r}")
        if self.mode == "fixed" and not (math.isfinite(self.fixed_rate) and self.fixed_rate > 0):
            raise ValueError(f"a fixed fallback rate must be finite and > 0, got {self.fixed_rate}")
        if not (math.isfinite(self.share_cap) and self.share_cap > 0):
            raise ValueError(f"a keep-last rate must be finite and > 0, got {self.share_cap}")

    @classmethod
    def parse(cls, spec: str | Fallback) -> Fallback:
        """Parses ``"keep-last[:<rate>]" | "fixed:<rate>" | "unthrottled"``, else ValueError."""
        if isinstance(spec, Fallback):
            return spec
        if not isinstance(spec, str):
            raise ValueError(f"fallback must be a string, got {spec!r}")
        text = spec.strip()
        if text == "keep-last":
            return cls(mode="keep-last")
        if text == "unthrottled":
            return cls(mode="unthrottled")
        for prefix, mode in (("fixed:", "fixed"), ("keep-last:", "keep-last")):
            if text.startswith(prefix):
                try:
                    rate = parse_rate(text.removeprefix(prefix).strip())
                except ValueError as err:
                    raise ValueError(f"invalid fallback {spec!r}: {err}") from None
                if not (math.isfinite(rate) and rate > 0):
                    # A rate of 0 would block the application until a controller answers.
                    raise ValueError(f"invalid fallback {spec!r}: the rate must be finite and > 0")
                if mode == "fixed":
                    return cls(mode="fixed", fixed_rate=rate)
                return cls(mode="keep-last", share_cap=rate)
        raise ValueError(
            f"invalid fallback {spec!r}: use 'keep-last', 'keep-last:<rate>', 'fixed:<rate>' "
            "(e.g. 'fixed:10MiB/s') or 'unthrottled'"
        )

    def rate(self, last_rate: float | None) -> float:
        """The rate once the lease (or the first attach) ran out (``math.inf`` = unthrottled).

        ``last_rate``: the rate the session was last allotted by a live controller, None if it
        never was. ``keep-last`` keeps it, 0 included; without one, 0 (step 1 and 2 above).
        """
        if self.mode == "fixed":
            return self.fixed_rate
        if self.mode == "unthrottled":
            return math.inf
        return 0.0 if last_rate is None else last_rate

    def steps_after_grace(
        self, last_rate: float | None, share: float
    ) -> tuple[float, float] | None:
        """``keep-last``'s rates once ``fallback_grace`` more seconds passed without a
        controller: (the rate for one lease, the rate after it), steps 3 and 4 above, or the
        conservative rate for a session no controller admitted (``last_rate`` None, step 1);
        None to keep `rate` for good (the other modes)."""
        if self.mode != "keep-last":
            return None
        if last_rate is None:
            return self.share_cap, self.share_cap
        target = min(share, self.share_cap)
        return min(last_rate, target), target

    def __str__(self) -> str:
        if self.mode == "fixed":
            return f"fixed:{format_rate(self.fixed_rate)}"
        if self.mode == "keep-last" and self.share_cap != DEFAULT_CONSERVATIVE_RATE:
            return f"keep-last:{format_rate(self.share_cap)}"
        return self.mode


class FallbackPacer:
    """What one session paces at when no controller renews its allocation: it remembers what
    the controller last allotted (rate, burst, pattern of windows, budget share, lease) and
    sets the session's throttle to the fallback, then to ``keep-last``'s steps after
    ``grace`` (timers on the session's loop). ``SessionStream`` owns one.

    ``active``: the fallback is in force (no allocation of a live controller is).
    """

    def __init__(self, fallback: Fallback, grace: float, throttle: Throttle) -> None:
        self.fallback = fallback
        self.grace = grace
        self._throttle = throttle
        self.active = False
        self.last_rate: float | None = None  # last allotted by a live controller, 0 included
        self.last_burst: float | None = None
        # the pattern of windows of the last allocation (None: a plain rate); keep-last keeps it
        self.last_pattern: Pattern | None = None
        self._share = 0.0  # the last allocation's budget share (Allocation.fallback_rate)
        self._lease = 0.0  # and lease: the length of keep-last's step 3
        self._timer: asyncio.TimerHandle | None = None

    def allotted(
        self, rate: float, burst: float, pattern: Pattern | None, share: float, lease: float
    ) -> None:
        """A live controller's allocation is in force (``rate`` after the throttle's floor):
        remembered, and the fallback ends."""
        self.last_rate, self.last_burst, self.last_pattern = rate, burst, pattern
        self._share, self._lease = share, lease
        self.cancel()
        self.active = False

    def apply(self, turned_away: bool) -> float:
        """The lease (or the first attach) ran out, or a live controller turned the session
        away: the fallback's rate, in force from now (keep-last: 0 when turned away), and
        keep-last's steps after the grace scheduled (the conservative rate for a session turned
        away or never admitted). The rate applied."""
        keep_last = self.fallback.mode == "keep-last"
        rate = self.fallback.rate(0.0 if turned_away and keep_last else self.last_rate)
        self._set(rate)
        self.active = True
        self.cancel()
        # turned away by a live controller: nothing it was allotted is counted any more
        last = None if turned_away else self.last_rate
        steps = self.fallback.steps_after_grace(last, self._share)
        if steps is not None and math.isfinite(self.grace):
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.grace, self._grace_expired, steps)
        return rate

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _set(self, rate: float) -> None:
        burst = self.last_burst
        if not burst:  # never told how deep, or told 0 along with a rate of 0
            burst = rate * DEFAULT_BURST_SECONDS if math.isfinite(rate) else 0.0
        # keep-last keeps the last pattern of windows along with its rate (its phase goes on
        # on this client's clock); any other fallback rate is a plain rate.
        pattern = None
        if self.fallback.mode == "keep-last" and rate == self.last_rate:
            pattern = self.last_pattern
        self._throttle.set_rate(rate, burst, pattern)

    def _grace_expired(self, steps: tuple[float, float]) -> None:
        """A kept rate outlived the grace without a controller: the lower of it and the
        budget share for one lease, then the share (steps 3 and 4 above)."""
        self._timer = None
        if not self.active:
            return
        for_a_lease, then = steps
        self._set(for_a_lease)
        self._timer = asyncio.get_running_loop().call_later(self._lease, self._share_applies, then)
        logger.warning(
            "no controller for %gs after the lease ran out (or no admission); keep-last paces at"
            " %s, then at %s",
            self.grace,
            format_rate(for_a_lease),
            format_rate(then),
        )

    def _share_applies(self, rate: float) -> None:
        self._timer = None
        if self.active:
            self._set(rate)
