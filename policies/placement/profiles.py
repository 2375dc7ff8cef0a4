"""The four bandwidth-profile shapes of [DIST-IO] §VI-B (Fig. 1: no impact, increase,
decrease, increase-then-decrease) as parametric curves over n = 1..n_max, and the single
class curve per shape that the inaccurate-input experiment gives every application of a
shape ([DIST-IO] §VI-B, Fig. 11).

The paper's curves are measured (MareNostrum I/O nodes; PlaFRIM OSTs 1..8) and not
reproduced in its text, so the shapes are parametrised here (docs/placement.md,
"Profile shapes"), in normalised bandwidth (b(1) = ``b1``, drawn log-uniformly in
[0.5, 2]; the caller scales):

- ``ascent``: b(n) = b1·min(n, n_sat)^α, α ~ U[0.4, 1], n_sat ~ U{2..n_max};
- ``descent``: b(n) = b1·n^(−β), β ~ U[0.1, 0.6];
- ``peak``: b(n) = b1·n^α up to n_pk ~ U{2..n_max − 1}, then b(n_pk)·(n/n_pk)^(−β),
  α ~ U[0.4, 1], β ~ U[0.2, 0.8];
- ``neutral``: b(n) = b1·(1 + ε_n), ε_n ~ U[−0.03, 0.03] (no impact, measurement noise).

Pure: every draw from the ``random.Random`` passed in.
"""

from __future__ import annotations

import random

import numpy as np

from .model import Profile

SHAPES = ("ascent", "descent", "peak", "neutral")
"""The profile shapes of [DIST-IO] §VI-B."""

DEFAULT_N_MAX = 8
"""Counts a curve is defined on by default: the OST case's 1..8 ([DIST-IO] §V-A)."""


def _check(shape: str, n_max: int) -> None:
    if shape not in SHAPES:
        raise ValueError(f"unknown profile shape {shape!r}; known: {', '.join(SHAPES)}")
    if n_max < 3:
        raise ValueError(f"n_max must be ≥ 3 for the four shapes, got {n_max}")


def draw_b1(rng: random.Random) -> float:
    """b(1) of a generated curve, log-uniform in [0.5, 2] (normalised bandwidth)."""
    return 0.5 * 4.0 ** rng.random()


def shape_curve(shape: str, rng: random.Random, n_max: int = DEFAULT_N_MAX) -> Profile:
    """One random curve of ``shape`` on 1..n_max, parameters drawn from ``rng`` (module
    docstring)."""
    _check(shape, n_max)
    b1 = draw_b1(rng)
    ns = range(1, n_max + 1)
    if shape == "ascent":
        alpha, n_sat = rng.uniform(0.4, 1.0), rng.randint(2, n_max)
        values = [b1 * min(n, n_sat) ** alpha for n in ns]
    elif shape == "descent":
        beta = rng.uniform(0.1, 0.6)
        values = [b1 * n**-beta for n in ns]
    elif shape == "peak":
        alpha, beta, n_pk = rng.uniform(0.4, 1.0), rng.uniform(0.2, 0.8), rng.randint(2, n_max - 1)
        top = b1 * n_pk**alpha
        values = [b1 * n**alpha if n <= n_pk else top * (n / n_pk) ** -beta for n in ns]
    else:
        values = [b1 * (1.0 + rng.uniform(-0.03, 0.03)) for _ in ns]
    return Profile(tuple(values))


def random_profile(rng: random.Random, n_max: int = DEFAULT_N_MAX) -> tuple[str, Profile]:
    """A shape drawn uniformly among ``SHAPES`` and a random curve of it."""
    shape = rng.choice(SHAPES)
    return shape, shape_curve(shape, rng, n_max)


def class_curve(
    shape: str,
    n_max: int = DEFAULT_N_MAX,
    curves: list[Profile] | None = None,
    degree: int = 3,
) -> Profile:
    """The single curve of a class: a least-squares polynomial of ``degree`` over all the
    class's curves, each normalised to b(1) = 1 ([DIST-IO] §VI-B: "polynomial regression
    that interpolates all curves in the profile"). ``curves`` defaults to 200 curves drawn
    with a fixed seed. The result has b(1) ≈ 1: scale it by an application's b_j(1)
    (``Profile.scaled``); values are floored at 1 % of the largest to stay positive."""
    _check(shape, n_max)
    if curves is None:
        rng = random.Random(f"class-curve:{shape}:{n_max}")
        curves = [shape_curve(shape, rng, n_max) for _ in range(200)]
    if not curves:
        raise ValueError("class_curve needs at least one curve")
    xs: list[float] = []
    ys: list[float] = []
    for c in curves:
        for n in range(1, n_max + 1):
            xs.append(float(n))
            ys.append(c(n) / c(1))
    coef = np.polyfit(np.array(xs), np.array(ys), min(degree, n_max - 1))
    fit = np.polyval(coef, np.arange(1, n_max + 1, dtype=np.float64))
    floor = 0.01 * float(fit.max()) if float(fit.max()) > 0 else 1e-6
    return Profile(tuple(float(max(v, floor)) for v in fit))
