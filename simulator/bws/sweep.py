"""Sweeps: policies × pressures × seeds on synthetic instances, as a campaign.

Owns the cases of ``burstctl sim sweep``: one task per (pressure, seed) generates its
instance in memory (``generate.py``), prepares the window once and runs every requested
policy on it; the tasks run through ``campaign.py`` (Dask, or this process). Rows come
in a fixed order (pressure, seed, policy) whatever the completion order, so a sweep's
CSV is reproducible apart from ``wall_seconds``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from burstctl.simulator.bws.fluid import SimulationError
from burstctl.simulator.bws.generate import GeneratorParams, generate
from burstctl.simulator.bws.instance import prepare_window
from burstctl.simulator.bws.runs import SimResult, Windows, create_policy, simulate
from burstctl.simulator.campaign import Cluster, Format, Row, RowFile, run_campaign


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


#: The columns of a sweep's rows, in order (a failed run fills only some of them).
FIELDS: tuple[str, ...] = (
    "pressure_goal",
    "seed",
    *(f.name for f in fields(SimResult)),
    "error",
)


def tasks(
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
    known_omega: bool = False,
) -> list[SweepTask]:
    """The cases of a sweep, in the order of its rows: pressure, then seed."""
    return [
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


def task_key(task: SweepTask) -> Hashable:
    return (float(task.params.pressure), int(task.seed))


def row_key(row: Row) -> Hashable:
    """A row's case, from a row as written or as read back from CSV (strings)."""
    return (float(row["pressure_goal"]), int(row["seed"]))


def task_label(task: SweepTask) -> str:
    return f"pressure {task.params.pressure} seed {task.seed}"


def row_file(
    path: Path, fmt: Format, params: Mapping[str, Any] | None = None
) -> RowFile[SweepTask]:
    """The output file of a sweep (``--out``/``--resume``); ``params``: as `RowFile`'s."""
    return RowFile(path, fmt, FIELDS, task_key, row_key, lambda t: len(t.policies), params)


def run_sweep(
    cases: Sequence[SweepTask],
    cluster: Cluster,
    *,
    out: RowFile[SweepTask] | None = None,
    resume: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[Row] | None:
    """Runs the cases on ``cluster``; the rows in order, or None when they went to ``out``."""
    chunks = run_campaign(
        run_task, cases, cluster, out=out, resume=resume, progress=progress, label=task_label
    )
    return None if chunks is None else [row for rows in chunks for row in rows]


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
    scheduler: str | None = None,
    known_omega: bool = False,
) -> Iterator[dict[str, Any]]:
    """Yields one row per (pressure, seed, policy), in that order. ``known_omega``: as
    `create_policy`'s; ``workers``, ``scheduler``: as `Cluster`'s."""
    cases = tasks(
        policies,
        pressures,
        seeds,
        n_small=n_small,
        sigma=sigma,
        nu=nu,
        horizon=horizon,
        window=window,
        windows=windows,
        known_omega=known_omega,
    )
    yield from run_sweep(cases, Cluster(workers, scheduler)) or []
