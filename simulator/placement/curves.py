"""Where the generated applications' bandwidth curves b_j(n) come from (docs/simulator.md,
"[DIST-IO] placement", and docs/placement.md, "Measured curves"):

- ``synthetic``: the four parametrised profile shapes of ``policies.placement.profiles``;
- ``measured``: the 189 write access patterns [FORGE] measured on MareNostrum 4 with 1, 2,
  4 and 8 I/O forwarding nodes (``data/forge_mn4.json``, regenerated from the authors'
  repository by ``bench/forge_curves.py``).

A measured curve is the mean bandwidth over the repetitions at each measured count, made a
``Profile`` by ``Profile.from_points`` (linear between measured counts, capped beyond 8: the
domain docs/placement.md settles). The generator draws one pattern uniformly, normalises
its curve to b(1) = 1 and scales it by a b(1) drawn as the synthetic shapes draw theirs
(``profiles.draw_b1``), so the two sources differ only in the curves' shapes.

Each measured curve is given one of the paper's four shapes (``classify``), which names its
profile class for the inaccurate-input runs; the class curve of a shape is
``profiles.class_curve`` over the measured curves of that shape.
"""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from burstctl.common.limits import CURVE_SOURCES
from burstctl.policies.placement.model import Profile
from burstctl.policies.placement.profiles import class_curve, draw_b1, random_profile

DATA = "forge_mn4.json"
Z95 = 1.96  # two-sided 95 % normal quantile: "significantly below the best"

Draw = Callable[[random.Random], tuple[str, Profile]]


def classify(
    counts: Sequence[int], mean: Sequence[float], sd: Sequence[float], reps: Sequence[int]
) -> str:
    """The shape of a measured curve from its means, standard deviations and repetitions
    per count. The best count is the one of largest mean (the smallest on a tie); a count
    is *below* it when the difference of the two means exceeds 1.96 standard errors of that
    difference (sd/√reps each). No count below: ``neutral`` (the runs cannot tell the counts
    apart). Otherwise by where the best count lies: the smallest measured count
    ``descent``, the largest ``ascent``, one in between ``peak``."""
    if not counts or not len(counts) == len(mean) == len(sd) == len(reps):
        raise ValueError("a curve needs as many means, deviations and repetitions as counts")
    best = max(range(len(counts)), key=lambda i: (mean[i], -counts[i]))

    def se(i: int) -> float:
        return sd[i] / math.sqrt(reps[i])

    below = [
        i for i in range(len(counts)) if mean[best] - mean[i] > Z95 * math.hypot(se(best), se(i))
    ]
    if not below:
        return "neutral"
    if counts[best] == min(counts):
        return "descent"
    if counts[best] == max(counts):
        return "ascent"
    return "peak"


@dataclass(frozen=True, slots=True)
class MeasuredCurve:
    """One access pattern of the data: its name, the measured counts and, per count, the
    bandwidth's mean, standard deviation and repetitions (MB/s)."""

    name: str
    counts: tuple[int, ...]
    mean: tuple[float, ...]
    sd: tuple[float, ...]
    reps: tuple[int, ...]
    shape: str

    @property
    def profile(self) -> Profile:
        """b(n) of the means, in MB/s, on 1..max(counts) (``Profile.from_points``)."""
        return Profile.from_points(dict(zip(self.counts, self.mean, strict=True)))


def _curve(entry: dict[str, Any]) -> MeasuredCurve:
    counts = tuple(int(n) for n in entry["n"])
    mean = tuple(float(v) for v in entry["mean"])
    sd = tuple(float(v) for v in entry["sd"])
    reps = tuple(int(v) for v in entry["reps"])
    return MeasuredCurve(entry["name"], counts, mean, sd, reps, classify(counts, mean, sd, reps))


@functools.cache
def measured() -> tuple[MeasuredCurve, ...]:
    """The patterns of ``data/forge_mn4.json``, in the file's order."""
    text = resources.files(__package__).joinpath("data", DATA).read_text()
    return tuple(_curve(entry) for entry in json.loads(text)["patterns"])


@functools.cache
def _normalised() -> tuple[tuple[str, Profile], ...]:
    return tuple((c.shape, c.profile.scaled(1.0 / c.profile(1))) for c in measured())


def draw_measured(rng: random.Random) -> tuple[str, Profile]:
    """A pattern drawn uniformly, its curve normalised to b(1) = 1 and scaled by
    ``draw_b1``: (its shape, b_j on 1..8)."""
    shape, curve = rng.choice(_normalised())
    return shape, curve.scaled(draw_b1(rng))


def _check(source: str) -> None:
    if source not in CURVE_SOURCES:
        raise ValueError(f"unknown curve source {source!r}; known: {', '.join(CURVE_SOURCES)}")


def drawer(source: str) -> Draw:
    """The curve draw of a source (``CURVE_SOURCES``): (shape, b_j) from a generator."""
    _check(source)
    return random_profile if source == "synthetic" else draw_measured


@functools.cache
def class_profile(source: str, shape: str) -> Profile:
    """The class curve of ``shape`` for a source ([DIST-IO] §VI-B), b(1) ≈ 1: the
    synthetic shape's (``profiles.class_curve``), or the fit over the measured curves of
    that shape."""
    _check(source)
    if source == "synthetic":
        return class_curve(shape)
    curves = [c.profile for c in measured() if c.shape == shape]
    if not curves:
        raise ValueError(f"no measured curve has the shape {shape!r}")
    return class_curve(shape, max(p.n_max for p in curves), curves)
