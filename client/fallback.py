"""The fallback: the rate a session paces itself to when no controller renews its allocation.

Spec strings: ``"keep-last"`` or ``"keep-last:<rate>"`` (e.g. ``"keep-last:4MiB/s"``),
``"fixed:<rate>"`` (e.g. ``"fixed:10MiB/s"``), ``"unthrottled"``.

``keep-last`` (the default) never takes the buffer past its capacity, at any number of sessions:
every rate it paces at is one a controller handed out, and the rates a replica hands out sum to
at most its capacity (docs/client.md, "When the controller is away"):

1. A session that never got an allocation paces at 0 (a shed or refused one too): it waits
   for its first allocation, however long, and can always be interrupted.
2. When the lease runs out unrenewed, the session keeps the rate it was last allotted, 0
   included: the sessions of a vanished controller together keep what it last allotted.
3. ``fallback_grace`` seconds later it paces at the lower of that rate and its *budget share*
   (``Allocation.fallback_rate``: the replica's capacity over the most sessions it holds), for
   one more lease, so that every session of the controller has left step 2 before any
   leaves step 3 (their leases end at most one lease apart).
4. Then at its budget share (at most the ``<rate>`` of ``keep-last:<rate>``): a kept 0 is
   lifted to it, a higher rate falls to it. The shares of all the sessions a replica can
   hold sum to at most its capacity.

``fixed:<rate>`` and ``unthrottled`` are the operator's choice of a rate per session, outside
that rule: n sessions in fallback pace at n times the rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from burstctl.common.units import format_rate, parse_rate

FallbackMode = Literal["keep-last", "fixed", "unthrottled"]


@dataclass(frozen=True, slots=True)
class Fallback:
    """A parsed fallback spec; `parse` is the way in.

    ``fixed_rate``: the rate of ``fixed``; ``share_cap``: the most ``keep-last`` paces at
    from its budget share (the ``<rate>`` of ``keep-last:<rate>``; inf: the share itself).
    """

    mode: FallbackMode
    fixed_rate: float = 0.0
    share_cap: float = math.inf

    def __post_init__(self) -> None:
        if self.mode not in ("keep-last", "fixed", "unthrottled"):
            raise ValueError(f"unknown fallback mode {self.mode!r}")
        if self.mode == "fixed" and not (math.isfinite(self.fixed_rate) and self.fixed_rate > 0):
            raise ValueError(f"a fixed fallback rate must be finite and > 0, got {self.fixed_rate}")
        if not self.share_cap > 0:  # also rejects NaN
            raise ValueError(f"a keep-last rate must be > 0, got {self.share_cap}")

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
        controller: (the rate for one lease, the rate after it), steps 3 and 4 above; None
        to keep `rate` for good (other modes; a session never allotted anything)."""
        if self.mode != "keep-last" or last_rate is None:
            return None
        target = min(share, self.share_cap)
        return min(last_rate, target), target

    def __str__(self) -> str:
        if self.mode == "fixed":
            return f"fixed:{format_rate(self.fixed_rate)}"
        if self.mode == "keep-last" and math.isfinite(self.share_cap):
            return f"keep-last:{format_rate(self.share_cap)}"
        return self.mode
