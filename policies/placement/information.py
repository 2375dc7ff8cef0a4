"""Information levels ([DIST-IO] Table II, §IV-C) and the advice that
uses what is known.

An application's level (``App.level``): 0 knows Q_j only; 1 knows n_perf (a hint, or a
profile without V_io or T_cpu); 2 knows V_io, T_cpu and b_j (measured or a profile class).

``advise`` picks an allocator and a placement and reports what it actually used:

- **Default allocator**, by the highest level present: level 2 → ``tcpu-allocator`` (when
  I/O-load(π_perf) ≤ 1 it returns π_perf, i.e. BestBdw, so it is the right default under any
  load); level 1 → ``best-bdw`` on the n_perf hints; level 0 → ``static``.
- **Fallback rule, per application**: an allocator needs a level (``REQUIRED_LEVEL``); an
  application below it gets the count of the best allocator its own level allows — level 1:
  ``best-bdw`` (n_perf), level 0: ``static`` — and is named in ``fallbacks`` with the reason.
  The allocator runs on the applications that have its data only; for TCPU-Allocator the
  I/O-load ≤ 1 constraint then covers those applications (the others' stress is unknown).
  MCKP keeps its capacity bound N·⌈K/N⌉ over all K, less the counts given by fallbacks
  (never below one resource for each of its applications).
- **Placement**: ``greedy-clairvoyant`` needs level 2 for every application; by default it is
  used only then, else ``greedy-non-clairvoyant``. A requested ``greedy-clairvoyant`` with an
  application below level 2 falls back to ``greedy-non-clairvoyant`` for all (a placement is
  one pass over all the applications); ``placement_note`` says so.
- ``io_load`` is Σ I/O-Stress/N over the applications of level 2 (``io_load_apps`` of them);
  the others' stress is unknown and not counted.
- ``level`` is the level every application has (the minimum).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from .allocators import ALLOCATORS, REQUIRED_LEVEL, mckp_with_capacity
from .model import App, io_stress
from .placements import PLACEMENT_LEVEL, PLACEMENTS

DEFAULT_BY_LEVEL = {2: "tcpu-allocator", 1: "best-bdw", 0: "static"}
"""The allocator ``advise`` uses by default for the highest information level present, and
the fallback for an application of that level."""


@dataclass(frozen=True, slots=True)
class Advice:
    """What ``advise`` decided: ``allocation`` (a count per application) and ``placement``
    (resource indices per application), in the order of the applications;
    ``allocator_used`` the allocator that decided the applications that had its data (or, if
    none had, the fallback that decided the most); ``per_app_allocator`` the allocator behind
    each count; ``fallbacks`` app_id → reason for each application that fell back;
    ``placement_used``, ``placement_note``; ``level`` the minimum information level;
    ``io_load`` of the allocation over the ``io_load_apps`` applications of level 2."""

    allocation: tuple[int, ...]
    placement: tuple[tuple[int, ...], ...]
    allocator_used: str
    per_app_allocator: tuple[str, ...]
    fallbacks: dict[str, str]
    placement_used: str
    placement_note: str
    level: int
    io_load: float
    io_load_apps: int


_NEEDS = {
    1: "n_perf (or b_j)",
    2: "V_io, T_cpu and b_j",
}


def advise(
    apps: Sequence[App],
    N: int,
    q_cpu: int,
    allocator: str | None = None,
    placement: str | None = None,
    rng: random.Random | None = None,
) -> Advice:
    """The allocation and placement of ``apps`` over ``N`` identical resources, with the
    allocator and placement the known data allow (module docstring for the rules).
    Unknown names raise ``ValueError`` naming them; ``rng`` (for ``random``) defaults to
    ``random.Random(0)``."""
    if N < 1:
        raise ValueError(f"N (I/O resources) must be ≥ 1, got {N}")
    if q_cpu < 1:
        raise ValueError(f"q_cpu (compute resources) must be ≥ 1, got {q_cpu}")
    if allocator is not None and allocator not in ALLOCATORS:
        raise ValueError(f"unknown allocator {allocator!r}; known: {', '.join(sorted(ALLOCATORS))}")
    if placement is not None and placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; known: {', '.join(sorted(PLACEMENTS))}")
    rng = rng if rng is not None else random.Random(0)
    levels = [a.level for a in apps]
    top = max(levels, default=0)
    name = allocator if allocator is not None else DEFAULT_BY_LEVEL[top]
    need = REQUIRED_LEVEL[name]

    counts = [0] * len(apps)
    used = [name] * len(apps)
    fallbacks: dict[str, str] = {}
    able = [j for j, lv in enumerate(levels) if lv >= need]
    for j, lv in enumerate(levels):
        if lv < need:
            fb = DEFAULT_BY_LEVEL[min(lv, 1)]
            used[j] = fb
            counts[j] = ALLOCATORS[fb]([apps[j]], N, q_cpu, rng)[0]
            fallbacks[apps[j].app_id] = f"{name} needs {_NEEDS[need]}; level {lv}: {fb}"
    sub = [apps[j] for j in able]
    if sub:
        if name == "mckp":
            # the capacity bound of MCKP over every application, less what fallbacks took
            cap = N * math.ceil(len(apps) / N) - sum(counts)
            got = mckp_with_capacity(sub, N, max(cap, len(sub)))
        else:
            got = ALLOCATORS[name](sub, N, q_cpu, rng)
        for j, n in zip(able, got, strict=True):
            counts[j] = n
    if sub:
        allocator_used = name
    elif apps:
        allocator_used = max(set(used), key=used.count)
    else:
        allocator_used = name

    level = min(levels, default=top)
    if placement is None:
        pname = "greedy-clairvoyant" if apps and level >= 2 else "greedy-non-clairvoyant"
        note = ""
    elif level < PLACEMENT_LEVEL[placement]:
        pname = "greedy-non-clairvoyant"
        note = f"{placement} needs V_io, T_cpu and b_j for every application; level {level}"
    else:
        pname, note = placement, ""
    resources = PLACEMENTS[pname](apps, counts, N, rng)

    known = [(a, n) for a, n in zip(apps, counts, strict=True) if a.level >= 2]
    load = sum(io_stress(a, n) for a, n in known) / N
    return Advice(
        allocation=tuple(counts),
        placement=tuple(tuple(r) for r in resources),
        allocator_used=allocator_used,
        per_app_allocator=tuple(used),
        fallbacks=fallbacks,
        placement_used=pname,
        placement_note=note,
        level=level,
        io_load=load,
        io_load_apps=len(known),
    )
