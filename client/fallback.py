"""The fallback: the rate a session paces itself to when no controller renews its allocation.

Spec strings: ``"keep-last"`` or ``"keep-last:<rate>"`` (e.g. ``"keep-last:4MiB/s"``),
``"fixed:<rate>"`` (e.g. ``"fixed:10MiB/s"``), ``"unthrottled"``.

Degrading stays within capacity: ``keep-last`` keeps the rate the session was last allotted by a
live controller, 0 included, so the sessions of a vanished controller together never exceed
what it last allotted. Two cases have no live share to keep, and get the *conservative rate*
(the ``<rate>`` of ``keep-last:<rate>``, `DEFAULT_CONSERVATIVE_RATE` without one):

- a session that never got an allocation, once ``attach_timeout`` has passed (it waits for the
  first allocation until then); it is never unthrottled;
- a session that was allotted 0 and whose controller stays unreachable ``fallback_grace``
  seconds after the lease ran out: 0 kept forever would block the application forever.

A kept non-zero rate is kept for ``fallback_grace`` seconds after the lease too, then falls to
the conservative rate if it was higher: the survivors of a dead replica count its sessions'
last rates for as long (docs/replicas.md, "A replica that dies"), and only then re-split them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from burstctl.common.units import format_rate, parse_rate

FallbackMode = Literal["keep-last", "fixed", "unthrottled"]

# bytes/s: keep-last's rate when there is no live share to keep (never attached, or a kept 0
# past the grace). Small on purpose: it is spent without any controller's knowledge.
DEFAULT_CONSERVATIVE_RATE = float(1 << 20)


@dataclass(frozen=True, slots=True)
class Fallback:
    """A parsed fallback spec; `parse` is the way in.

    ``fixed_rate``: the rate of ``fixed``; ``conservative_rate``: the rate of ``keep-last``
    when it has no live share to keep (see the module docstring).
    """

    mode: FallbackMode
    fixed_rate: float = 0.0
    conservative_rate: float = DEFAULT_CONSERVATIVE_RATE

    def __post_init__(self) -> None:
        if self.mode not in ("keep-last", "fixed", "unthrottled"):
            raise ValueError(f"unknown fallback mode {self.mode!r}")
        if self.mode == "fixed" and not (math.isfinite(self.fixed_rate) and self.fixed_rate > 0):
            raise ValueError(f"a fixed fallback rate must be finite and > 0, got {self.fixed_rate}")
        if not (math.isfinite(self.conservative_rate) and self.conservative_rate > 0):
            raise ValueError(
                f"a conservative fallback rate must be finite and > 0, got {self.conservative_rate}"
            )

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
                return cls(mode="keep-last", conservative_rate=rate)
        raise ValueError(
            f"invalid fallback {spec!r}: use 'keep-last', 'keep-last:<rate>', 'fixed:<rate>' "
            "(e.g. 'fixed:10MiB/s') or 'unthrottled'"
        )

    def rate(self, last_rate: float | None) -> float:
        """The rate once the lease (or the first attach) ran out (``math.inf`` = unthrottled).

        ``last_rate``: the rate the session was last allotted by a live controller, None if it
        never was. ``keep-last`` keeps it, 0 included; without one it is the conservative rate.
        """
        if self.mode == "fixed":
            return self.fixed_rate
        if self.mode == "unthrottled":
            return math.inf
        return self.conservative_rate if last_rate is None else last_rate

    def rate_after_grace(self, last_rate: float | None) -> float | None:
        """The rate once ``fallback_grace`` more seconds passed without a controller, or None
        to keep `rate`: ``keep-last`` moves a kept rate to the conservative rate (a kept 0 is
        lifted to it, a higher rate falls to it); a lower one, and other modes, stay."""
        if self.mode != "keep-last" or last_rate is None:
            return None
        if last_rate <= 0 or last_rate > self.conservative_rate:
            return self.conservative_rate
        return None

    def __str__(self) -> str:
        if self.mode == "fixed":
            return f"fixed:{format_rate(self.fixed_rate)}"
        if self.mode == "keep-last" and self.conservative_rate != DEFAULT_CONSERVATIVE_RATE:
            return f"keep-last:{format_rate(self.conservative_rate)}"
        return self.mode
