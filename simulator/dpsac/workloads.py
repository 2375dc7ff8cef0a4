"""The workloads of the DPSAC experiments ([DPSAC] §5.1–§5.3, docs/simulator.md "DPSAC").

Table 1 (the APEX applications), the scaled variants of §5.2, Table 2 (the ten
congestion sets), Table 3 (the initial batch of the join experiment) and Table 4
(the periodic joiners), and the platform of §5.1: B = 100 GB/s, S = 300 GB, a
node's peak rate 1 GB/s, so β_i = B_i / (1 GB/s) nodes.

Units: GB, GB/s and seconds throughout.

Reading of Table 1. ``P`` is the table's P_i and decides the compute work
W_i = (1 − P_i)·T_i and the Bernoulli probability of the scheduler's model; the
I/O volume of one instance is IO_i = l_i·B_i with l_i the "Checkpoint time"
column (the paper writes IO_i = P_i·T_i·B_i; the two agree except for VPIC,
where l/T = 5.22e-3 and the table says 5.11e-3).

Scaled variants (EAP×10, LAP×5, …). The paper sorts them by I/O-phase length
("size") and says nothing else, so the scale multiplies the checkpoint time l_i
and, with it, P_i (the I/O fraction of an unchanged period T_i); B_i, T_i and
the instance count N_i are those of the base application. So W_i shrinks by the
extra I/O time: W_i = (1 − f·P_i)·T_i.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

B_PFS = 100.0  # GB/s, the PFS bandwidth B
S_BUFFER = 300.0  # GB, the burst-buffer capacity S
NODE_RATE = 1.0  # GB/s, a compute node's peak I/O rate


@dataclass(frozen=True, slots=True)
class AppKind:
    """One row of Table 1, possibly scaled."""

    name: str
    instances: int  # N_i
    bandwidth: float  # B_i, GB/s
    period: float  # T_i, s
    checkpoint: float  # l_i, s: the I/O-phase length used for clustering
    p: float  # P_i, the I/O fraction of the period

    @property
    def work(self) -> float:
        """W_i = (1 − P_i)·T_i, seconds of compute per instance."""
        return (1.0 - self.p) * self.period

    @property
    def io_volume(self) -> float:
        """IO_i = l_i·B_i, GB written per instance."""
        return self.checkpoint * self.bandwidth

    @property
    def nodes(self) -> float:
        """β_i = B_i / (1 GB/s)."""
        return self.bandwidth / NODE_RATE

    @property
    def rho(self) -> float:
        """ρ_i = W_i / T_i, the dedicated-mode efficiency."""
        return self.work / self.period

    def scaled(self, factor: float, name: str) -> AppKind:
        """The variant with ``factor`` × the checkpoint time and the I/O fraction."""
        return AppKind(
            name,
            self.instances,
            self.bandwidth,
            self.period,
            self.checkpoint * factor,
            self.p * factor,
        )


# Table 1 (APEX, via [DPSAC] Table 1).
EAP = AppKind("EAP", 13, 160.0, 5671.0, 20.0, 3.51e-3)
LAP = AppKind("LAP", 4, 80.0, 12682.0, 25.0, 1.97e-3)
SILVERTON = AppKind("Silverton", 2, 160.0, 15005.0, 280.0, 18.7e-3)
VPIC = AppKind("VPIC", 1, 160.0, 4483.0, 23.4, 5.11e-3)

KINDS: Mapping[str, AppKind] = {
    k.name: k
    for k in (
        EAP,
        LAP,
        VPIC,
        EAP.scaled(5, "EAP5"),
        LAP.scaled(5, "LAP5"),
        SILVERTON.scaled(0.5, "Silverton0.5"),
        EAP.scaled(10, "EAP10"),
        VPIC.scaled(10, "VPIC10"),
        SILVERTON,
    )
}

# Table 2 as reconstructed in the notes: application counts per set #1–#10.
_T2_ROWS: Mapping[str, tuple[int, ...]] = {
    "EAP": (0, 0, 0, 0, 1, 0, 0, 0, 1, 0),
    "LAP": (10, 8, 6, 4, 2, 3, 2, 2, 0, 1),
    "VPIC": (0, 0, 0, 0, 0, 0, 1, 0, 1, 0),
    "EAP5": (0, 0, 0, 0, 1, 0, 1, 0, 0, 1),
    "LAP5": (2, 1, 1, 1, 1, 0, 0, 0, 0, 0),
    "Silverton0.5": (0, 0, 0, 0, 1, 1, 1, 0, 2, 1),
    "EAP10": (0, 0, 0, 1, 1, 0, 0, 1, 0, 0),
    "VPIC10": (0, 0, 1, 0, 1, 1, 0, 0, 1, 0),
    "Silverton": (1, 0, 0, 1, 1, 1, 0, 0, 1, 0),
}
SETS: Mapping[int, Mapping[str, int]] = {
    n: {name: row[n - 1] for name, row in _T2_ROWS.items() if row[n - 1]} for n in range(1, 11)
}

# Table 3: the initial batch of the join experiment (name → (# apps, # instances)).
TABLE3: Mapping[str, tuple[int, int]] = {
    "EAP": (1, 13),
    "LAP": (2, 4),
    "LAP5": (1, 2),
    "Silverton0.5": (1, 2),
    "VPIC10": (1, 1),
    "Silverton": (1, 1),
}


@dataclass(frozen=True, slots=True)
class Joiner:
    """One row of Table 4: a kind that joins every ``period`` seconds."""

    key: str  # the CLI name
    kind: str  # a KINDS name
    period: float
    instances: int


# Table 4.
JOINERS: Mapping[str, Joiner] = {
    "eap": Joiner("eap", "EAP", 6 * 5671.0, 5),
    "lap5": Joiner("lap5", "LAP5", 3 * 12682.0, 2),
    "silverton": Joiner("silverton", "Silverton", 2 * 15005.0, 1),
}


def with_instances(kind: AppKind, instances: int) -> AppKind:
    """``kind`` running ``instances`` instances (Tables 3 and 4 override N_i)."""
    return AppKind(kind.name, instances, kind.bandwidth, kind.period, kind.checkpoint, kind.p)


def set_apps(number: int) -> list[AppKind]:
    """The applications of Table 2's set ``number`` (1–10), one entry per application."""
    if number not in SETS:
        raise ValueError(f"set: must be 1-10, got {number}")
    return [KINDS[name] for name, count in SETS[number].items() for _ in range(count)]


def table3_apps() -> list[AppKind]:
    """The join experiment's initial batch (Table 3)."""
    return [
        with_instances(KINDS[name], inst)
        for name, (count, inst) in TABLE3.items()
        for _ in range(count)
    ]


def teio(apps: list[AppKind]) -> float:
    """TEIO = Σ P_i·B_i, GB/s: the expected I/O load of [DPSAC] §4.3."""
    return sum(a.p * a.bandwidth for a in apps)
