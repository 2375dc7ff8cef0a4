"""``burstctl sim generate|run|sweep|plot``: the bandwidth-sharing strategies of [BWS] on
synthetic instances (docs/simulator.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from burstctl.cli.sim.common import (
    campaign_cluster,
    campaign_error,
    campaign_options,
    campaign_record,
    emit,
    fraction,
    known_policies,
    positive,
    progress,
)


@click.command("generate")
@click.option(
    "--pressure", type=float, required=True, callback=positive, help="W_GOAL, the I/O pressure."
)
@click.option("--n-small", type=click.IntRange(0, 40), default=20, show_default=True)
@click.option("--sigma", type=click.FloatRange(min=0.0), default=0.5, show_default=True)
@click.option("--nu", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True)
@click.option("--horizon", type=float, default=2_000_000.0, show_default=True, callback=positive)
@click.option("--seed", type=int, required=True, help="Seed of the instance's random.Random.")
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Instance file."
)
def sim_generate(
    pressure: float, n_small: int, sigma: float, nu: float, horizon: float, seed: int, out: Path
) -> None:
    """Write a synthetic 60-application instance ([BWS] §6.2)."""
    from burstctl.simulator.bws.generate import GeneratorParams, generate
    from burstctl.simulator.bws.instance import write_instance

    try:
        params = GeneratorParams(
            pressure=pressure, n_small=n_small, sigma=sigma, nu=nu, horizon=horizon
        )
        write_instance(out, generate(params, seed))
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


# `sim run` and `sim sweep`: one flag, one meaning.
_KNOWN_OMEGA = click.option(
    "--known-omega",
    is_flag=True,
    help="set-10 takes each application's wIter (> 0) from the instance as its known ω"
    " (the reference's Set10) instead of learning it (its Set10Learn).",
)


@click.command("run")
@click.option("--policy", "policy_name", required=True, metavar="NAME", help="A registered policy.")
@click.option(
    "--instance",
    "instance_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
)
@click.option(
    "--window",
    type=float,
    default=1.0,
    show_default=True,
    callback=fraction,
    help="T = window × the shortest solo completion time.",
)
@click.option(
    "--bandwidth",
    type=float,
    default=1.0,
    show_default=True,
    callback=positive,
    help="B, to normalise the instance's volumes and caps.",
)
@click.option(
    "--windows",
    type=click.Choice(["v1", "v2"]),
    default="v1",
    show_default=True,
    help="v2: FairShare on [0, T/2), then the policy.",
)
@_KNOWN_OMEGA
@click.option("--format", "fmt", type=click.Choice(["json", "csv"]), default="json")
def sim_run(
    policy_name: str,
    instance_file: Path,
    window: float,
    bandwidth: float,
    windows: str,
    known_omega: bool,
    fmt: str,
) -> None:
    """Simulate one policy on one instance; print its metrics."""
    from burstctl.simulator.bws.fluid import SimulationError
    from burstctl.simulator.bws.instance import prepare_window, read_instance
    from burstctl.simulator.bws.runs import create_policy, simulate

    registry = known_policies([policy_name])
    try:
        win = prepare_window(read_instance(instance_file), window, bandwidth)
        policy = create_policy(policy_name, win, registry, known_omega=known_omega)
        result = simulate(
            win,
            policy,
            windows="v2" if windows == "v2" else "v1",
            registry=registry,
            instance=str(instance_file),
        )
    except ValueError as exc:
        raise click.ClickException(f"{instance_file}: {exc}") from None
    except SimulationError as exc:
        raise click.ClickException(f"simulation failed: {exc}") from None
    emit([result.as_dict()], fmt)


@click.command("sweep")
@click.option("--policy", "policies", multiple=True, required=True, metavar="NAME")
@click.option("--pressure", "pressures", type=float, multiple=True, required=True, metavar="W")
@click.option("--seeds", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--first-seed", type=int, default=0, show_default=True)
@click.option("--n-small", type=click.IntRange(0, 40), default=20, show_default=True)
@click.option("--sigma", type=click.FloatRange(min=0.0), default=0.5, show_default=True)
@click.option("--nu", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True)
@click.option("--horizon", type=float, default=2_000_000.0, show_default=True, callback=positive)
@click.option("--window", type=float, default=1.0, show_default=True, callback=fraction)
@click.option("--windows", type=click.Choice(["v1", "v2"]), default="v1", show_default=True)
@campaign_options
@_KNOWN_OMEGA
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the rows to this file as the cases finish (instead of stdout at the end),"
    " and the flags to FILE.meta.json.",
)
@click.option(
    "--resume",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Like --out FILE, keeping the cases an interrupted sweep already wrote there."
    " Refused (exit 2) if FILE was written with other flags (FILE.meta.json).",
)
def sim_sweep(
    policies: tuple[str, ...],
    pressures: tuple[float, ...],
    seeds: int,
    first_seed: int,
    n_small: int,
    sigma: float,
    nu: float,
    horizon: float,
    window: float,
    windows: str,
    workers: int | None,
    scheduler: str | None,
    known_omega: bool,
    fmt: str,
    out: Path | None,
    resume: Path | None,
) -> None:
    """Run policies × pressures × seeds on synthetic instances; one row per run."""
    from burstctl.simulator.bws.fluid import SimulationError
    from burstctl.simulator.bws.sweep import FIELDS, row_file, run_sweep, tasks
    from burstctl.simulator.campaign import CampaignError

    known_policies(policies)
    for w in pressures:
        if not w > 0.0:
            raise click.BadParameter(f"must be > 0, got {w}", param_hint="--pressure")
    if out is not None and resume is not None:
        raise click.UsageError("give --out or --resume, not both")
    cluster = campaign_cluster(workers, scheduler)
    path = resume or out
    record = campaign_record(case_keys=("pressures", "seeds", "first_seed"))
    target = row_file(path, "json" if fmt == "json" else "csv", record) if path else None
    try:
        cases = tasks(
            policies,
            pressures,
            range(first_seed, first_seed + seeds),
            n_small=n_small,
            sigma=sigma,
            nu=nu,
            horizon=horizon,
            window=window,
            windows="v2" if windows == "v2" else "v1",
            known_omega=known_omega,
        )
        rows = run_sweep(cases, cluster, out=target, resume=resume is not None, progress=progress)
    except CampaignError as exc:
        raise campaign_error(exc) from None
    except (ValueError, SimulationError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"{path}: {exc}") from None
    if rows is None:
        assert path is not None
        rows = _read_rows(path, fmt)
    else:
        emit(rows, fmt, FIELDS)
    failed = [r for r in rows if r.get("error")]
    if failed:
        for r in failed:
            click.echo(f"failed: {r['policy']} on {r['instance']}: {r['error']}", err=True)
        raise click.ClickException(f"{len(failed)} of {len(rows)} runs failed (rows kept)")


def _read_rows(path: Path, fmt: str) -> list[dict[str, Any]]:
    import csv
    import json

    with path.open(newline="") as f:
        if fmt == "json":
            return [json.loads(line) for line in f]
        return list(csv.DictReader(f))


@click.command("plot")
@click.option(
    "--csv",
    "csv_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="Rows written by `burstctl sim sweep --format csv`.",
)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option(
    "--metric",
    type=click.Choice(["min_yield", "efficiency", "utilization"]),
    default="min_yield",
    show_default=True,
)
@click.option("--policy", "policies", multiple=True, metavar="NAME", help="Order of the boxes.")
def sim_plot(csv_file: Path, out: Path, metric: str, policies: tuple[str, ...]) -> None:
    """Boxplots per policy and pressure, as in [BWS] Figure 2 (needs extra [plot])."""
    import csv

    try:
        from burstctl.simulator.bws.plots import boxplots
    except ImportError:
        raise click.ClickException(
            "plotting needs matplotlib: pip install 'burstctl[plot]'"
        ) from None
    with csv_file.open(newline="") as f:
        rows = list(csv.DictReader(f))
    try:
        boxplots(rows, out, metric, policies or None)
    except (ValueError, KeyError) as exc:
        raise click.ClickException(f"{csv_file}: {exc}") from None
