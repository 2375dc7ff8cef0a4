"""The priority orders of Algorithm 3 ([DPSAC] §4.4.3, taken from the heuristics its §3.3
cites), over each application's efficiency ρ̃_i(t) (work done over time since release), its
dedicated-mode efficiency ρ_i = W_i/T_i and its node count β_i.

Readings (docs/dpsac.md): the dilation of an application is ρ̃_i/ρ_i (1: not slowed down;
ρ_i = 0, an application with no compute, counts as 1).

- ``min_dilation``: the lowest ρ̃_i/ρ_i first (the most slowed-down applications);
- ``max_sys_eff``: the highest β_i·ρ̃_i/ρ_i first;
- ``minmax(gamma)``: the applications with ρ̃_i/ρ_i < γ first, in MinDilation order, then
  the others in MaxSysEff order (MinMax-γ; the paper's experiments use γ = 0.5).

Ties keep the input order (the caller passes a stable order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Efficiency:
    """``app_id``, ρ̃_i(t) (``rho_tilde``), ρ_i = W_i/T_i (``rho``) and β_i (``beta``)."""

    app_id: str
    rho_tilde: float
    rho: float
    beta: float

    @property
    def ratio(self) -> float:
        """ρ̃_i/ρ_i, 1 when ρ_i = 0."""
        return self.rho_tilde / self.rho if self.rho > 0.0 else 1.0


Order = Callable[[Sequence[Efficiency]], list[Efficiency]]


def min_dilation(apps: Sequence[Efficiency]) -> list[Efficiency]:
    """MinDilation: ascending ρ̃/ρ; ties in input order."""
    return sorted(apps, key=lambda a: a.ratio)


def max_sys_eff(apps: Sequence[Efficiency]) -> list[Efficiency]:
    """MaxSysEff: descending β·ρ̃/ρ; ties in input order."""
    return sorted(apps, key=lambda a: -a.beta * a.ratio)


def minmax(apps: Sequence[Efficiency], gamma: float = 0.5) -> list[Efficiency]:
    """MinMax-γ: ρ̃/ρ < γ first in MinDilation order, then the rest in MaxSysEff order."""
    low = [a for a in apps if a.ratio < gamma]
    high = [a for a in apps if not a.ratio < gamma]
    return min_dilation(low) + max_sys_eff(high)


def by_name(name: str, gamma: float = 0.5) -> Order:
    """The order called ``name``: ``"minmax"``, ``"min-dilation"`` or ``"max-sys-eff"``."""
    if name == "minmax":
        return lambda apps: minmax(apps, gamma)
    if name == "min-dilation":
        return min_dilation
    if name == "max-sys-eff":
        return max_sys_eff
    raise ValueError(f"unknown priority {name!r}; known: minmax, min-dilation, max-sys-eff")
