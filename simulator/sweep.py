"""Campaigns: policies × pressures × seeds on synthetic instances, in worker processes.

Owns the fan-out of ``burstctl sim sweep``: one task per (pressure, seed)
generates its instance in memory (``generate.py``), prepares the window once and
runs every requested policy on it; tasks run in a
``concurrent.futures.ProcessPoolExecutor``. Rows come back in a fixed order
(pressure, seed, policy) whatever the completion order, so a sweep's CSV is
reproducible apart from ``wall_seconds``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from burstctl.simulator.engine import SimulationError, Windows, create_policy, simulate
from burstctl.simulator.generate import GeneratorParams, generate
from burstctl.simulator.instance import prepare_window


@dataclass(frozen=True, slots=True)
class SweepTask:
    params: GeneratorParams
    seed: int
    policies: tuple[str, ...]
    window: float = 1.0
    windows: Windows = "v1"
    known_omega: bool = False


def run_task(task: SweepTask) -> list[dict[str, Any]]:
    """Generates one instance and runs every policy of ``task`` on it."""
    win = prepare_window(generate(task.params, task.seed), task.window)
    label = f"w{task.params.pressure}-nH{task.params.n_small}-seed{task.seed}"
    rows: list[dict[str, Any]] = []
    for name in task.policies:
        head = {"pressure_goal": task.params.pressure, "seed": task.seed}
        try:
            policy = create_policy(name, win, known_omega=task.known_omega)
            result = simulate(win, policy, windows=task.windows, instance=label)
        except SimulationError as exc:
            # One failed run must not lose the campaign: it becomes a row of its own.
            rows.append({**head, "policy": name, "instance": label, "error": str(exc)})
            continue
        rows.append({**head, **result.as_dict(), "error": ""})
    return rows


def sweep(
    policies: Sequence[str],
    pressures: Sequence[float],
    seeds: Sequence[int],
    *,
    n_small: int = 20,
    sigma: float = 0.5,
    nu: float = 0.5,
    horizon: float = 2_000_000.0,
    window: float = 1.0,
    windows: Windows = "v1",
    workers: int | None = None,
    known_omega: bool = False,
) -> Iterator[dict[str, Any]]:
    """Yields one row per (pressure, seed, policy), in that order. ``known_omega``: as
    `create_policy`'s."""
    tasks = [
        SweepTask(
            GeneratorParams(pressure=w, n_small=n_small, sigma=sigma, nu=nu, horizon=horizon),
            seed,
            tuple(policies),
            window,
            windows,
            known_omega,
        )
        for w in pressures
        for seed in seeds
    ]
    if workers == 1:
        for task in tasks:
            yield from run_task(task)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for rows in pool.map(run_task, tasks):
            yield from rows
