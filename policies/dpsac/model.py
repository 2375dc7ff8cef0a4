"""One application as DPSAC models it ([DPSAC] §3.2): rate B_i, I/O probability P_i and
I/O-phase length l_i. Units are the caller's (docs/dpsac.md, "Units"): the algorithms only
need rates and capacities as volumes per time unit Δ."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class App:
    """``app_id``; ``rate`` B_i (volume per time unit); ``p`` = P_i = 1 − W_i/T_i, the
    probability that the application does I/O in a time unit; ``length`` l_i = P_i·T_i, the
    I/O-phase length that DPSAC clusters on."""

    app_id: str
    rate: float
    p: float
    length: float

    @property
    def expected_load(self) -> float:
        """P_i·B_i: the application's share of EIO_k ([DPSAC] §4.3)."""
        return self.p * self.rate
