"""Allocation and placement of applications over distributed I/O resources ([DIST-IO]).

In burstctl an I/O resource is one replica with its storage and an application is a job.
Pure building blocks (no I/O, no clock, no threads; every draw from a ``random.Random``
passed in), shared by the simulator and the controller's placement advice:

- ``model``: ``Profile`` (b_j(n) and its domain), ``App``, T_cf_io, I/O-Stress, n_perf,
  n_sys, I/O-load, CPUload ([DIST-IO] §III);
- ``allocators``: Random, Static, BestBdw, Nsys-Allocator, TCPU-Allocator (Algorithm 1) and
  the MCKP baseline, registry ``ALLOCATORS`` ([DIST-IO] §IV-A, §V-B);
- ``placements``: Random, Greedy-Non-Clairvoyant, Greedy-Clairvoyant, registry
  ``PLACEMENTS`` ([DIST-IO] §IV-B);
- ``metrics``: ρ_j, ρ_j^io, ρ_j^con, Mean/Max-I/O-SlowDown, I/O-spread, Machine-IdleTime
  ([DIST-IO] §III-C);
- ``information``: the information levels 0/1/2 of [DIST-IO] Table II and ``advise``, which
  picks what the known data allow and says which fallbacks it took;
- ``profiles``: the four profile shapes of [DIST-IO] §VI-B and their class curves.

docs/placement.md gives every reading of a gap in the paper.
"""

from .allocators import ALLOCATORS, REQUIRED_LEVEL, allocate
from .information import Advice, advise
from .model import App, Profile, cpu_load, io_load, io_stress, n_perf, n_sys, t_cf_io
from .placements import PLACEMENT_LEVEL, PLACEMENTS, place
from .profiles import SHAPES, class_curve, shape_curve

__all__ = [
    "ALLOCATORS",
    "PLACEMENTS",
    "PLACEMENT_LEVEL",
    "REQUIRED_LEVEL",
    "SHAPES",
    "Advice",
    "App",
    "Profile",
    "advise",
    "allocate",
    "class_curve",
    "cpu_load",
    "io_load",
    "io_stress",
    "n_perf",
    "n_sys",
    "place",
    "shape_curve",
    "t_cf_io",
]
