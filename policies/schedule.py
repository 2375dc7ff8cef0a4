"""A time-dependent allocation: a periodic pattern of I/O windows for one job.

A policy that schedules I/O in time (PerSched, [PERSCHED]) gives a job a
``Schedule`` besides its rate: a period, the origin of its periods on the
view's clock (``SystemView.now``), and the windows of one period, each with
its rate. The controller sends it in the job's ``Allocation`` (the origin
converted to the session's clock, docs/protocol.md, "Windows") and the client
paces to it locally. Pure data: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from burstctl.common.limits import windows_problem


@dataclass(frozen=True, slots=True)
class Window:
    """``[start, end)`` seconds from the start of a period, at ``rate`` bytes/s; an ``end``
    past the period wraps into the next one."""

    start: float
    end: float
    rate: float


@dataclass(frozen=True, slots=True)
class Schedule:
    """Period k is ``[origin + k·period, origin + (k+1)·period)`` on the view's clock, for
    every integer k; ``windows`` repeat in every period. Between windows the job moves
    nothing. A policy keeps ``origin`` while the pattern does not change: a new origin is a
    new allocation for the job's sessions."""

    period: float
    windows: tuple[Window, ...]
    origin: float = 0.0

    def problem(self) -> str | None:
        """Why the schedule is malformed (``"<field>: <reason>"``), or None
        (``burstctl.common.limits.windows_problem``; the origin must be finite)."""
        if not math.isfinite(self.origin):
            return f"origin: must be finite, got {self.origin!r}"
        found = windows_problem(self.period, [(w.start, w.end, w.rate) for w in self.windows])
        return None if found is None else f"{found[0]}: {found[1]}"

    def mean_rate(self) -> float:
        """The rate the pattern moves on average: Σ (end − start)·rate / period."""
        return sum((w.end - w.start) * w.rate for w in self.windows) / self.period

    def peak_rate(self) -> float:
        return max((w.rate for w in self.windows), default=0.0)

    def scaled(self, factor: float) -> Schedule:
        """The same windows with every rate times ``factor``."""
        windows = tuple(Window(w.start, w.end, w.rate * factor) for w in self.windows)
        return Schedule(self.period, windows, self.origin)

    def capped(self, cap: float) -> Schedule:
        """The same windows with no rate above ``cap``."""
        windows = tuple(Window(w.start, w.end, min(w.rate, cap)) for w in self.windows)
        return Schedule(self.period, windows, self.origin)


NO_SCHEDULES: Mapping[str, Schedule] = MappingProxyType({})  # by job id: none
