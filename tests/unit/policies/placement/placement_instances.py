"""Seeded random instances for the placement tests: every load regime, every profile shape,
profiles shorter and longer than N."""

from __future__ import annotations

import random

from support.sweep import seeds

from burstctl.policies.placement.model import App, Profile
from burstctl.policies.placement.profiles import random_profile

Q_CPU = 480


def instance(seed: int) -> tuple[list[App], int]:
    """A random set of applications with level-2 data and the resource count N."""
    rng = random.Random(seed)
    N = rng.randint(1, 25)
    K = rng.randint(1, 30)
    n_max = rng.randint(3, 12)
    # spread X = T_cpu/T_cf_io(1) over decades so that instances range from idle to saturated
    x_max = 10 ** rng.uniform(-0.5, 3.0)
    apps = []
    for j in range(K):
        if rng.random() < 0.1:
            # an arbitrary (non-monotone) curve, beyond the four shapes
            profile = Profile(tuple(rng.uniform(0.1, 3.0) for _ in range(n_max)))
        else:
            _, profile = random_profile(rng, n_max)
        x = rng.uniform(0, x_max)
        apps.append(
            App(
                app_id=f"a{j}",
                q=rng.randint(1, 60),
                t_cpu=5000 * (1 - 1 / (1 + x)),
                v_io=5000 * profile(1) / (1 + x),
                phases=rng.randint(2, 20),
                profile=profile,
            )
        )
    return apps, N


# Each invariant holds on ≥ 500 seeded instances: the first 40 in ``make test``, all 600
# behind the ``sweep`` marker.
SEEDS = seeds(40, 600)
