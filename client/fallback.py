"""The fallback: the rate a session paces itself to when no controller renews its allocation.

Spec strings: ``"keep-last"``, ``"fixed:<rate>"`` (e.g. ``"fixed:10MiB/s"``), ``"unthrottled"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from burstctl.units import format_rate, parse_rate

FallbackMode = Literal["keep-last", "fixed", "unthrottled"]


@dataclass(frozen=True, slots=True)
class Fallback:
    """A parsed fallback spec; `parse` is the way in."""

    mode: FallbackMode
    fixed_rate: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in ("keep-last", "fixed", "unthrottled"):
            raise ValueError(f"unknown fallback mode {self.mode!r}")
        if self.mode == "fixed" and not (math.isfinite(self.fixed_rate) and self.fixed_rate > 0):
            raise ValueError(f"a fixed fallback rate must be finite and > 0, got {self.fixed_rate}")

    @classmethod
    def parse(cls, spec: str | Fallback) -> Fallback:
        """Parses ``"keep-last" | "fixed:<rate>" | "unthrottled"``; ValueError otherwise."""
        if isinstance(spec, Fallback):
            return spec
        if not isinstance(spec, str):
            raise ValueError(f"fallback must be a string, got {spec!r}")
        text = spec.strip()
        if text == "keep-last":
            return cls(mode="keep-last")
        if text == "unthrottled":
            return cls(mode="unthrottled")
        if text.startswith("fixed:"):
            try:
                rate = parse_rate(text.removeprefix("fixed:").strip())
            except ValueError as err:
                raise ValueError(f"invalid fallback {spec!r}: {err}") from None
            if rate <= 0:
                # A fixed rate of 0 would block the application until a controller answers.
                raise ValueError(f"invalid fallback {spec!r}: a fixed rate must be > 0")
            return cls(mode="fixed", fixed_rate=rate)
        raise ValueError(
            f"invalid fallback {spec!r}: use 'keep-last', 'fixed:<rate>' "
            "(e.g. 'fixed:10MiB/s') or 'unthrottled'"
        )

    def rate(self, last_nonzero_rate: float | None) -> float:
        """The rate to apply once the lease is gone (``math.inf`` = unthrottled).

        ``keep-last`` keeps the last *non-zero* rate, and is unthrottled if there never was one:
        a controller that said "wait" (rate 0) and then vanished must not block the application
        forever.
        """
        if self.mode == "fixed":
            return self.fixed_rate
        if self.mode == "keep-last" and last_nonzero_rate is not None and last_nonzero_rate > 0:
            return last_nonzero_rate
        return math.inf

    def __str__(self) -> str:
        if self.mode == "fixed":
            return f"fixed:{format_rate(self.fixed_rate)}"
        return self.mode
