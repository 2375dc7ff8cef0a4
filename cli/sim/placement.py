"""``burstctl sim placement|placement-sweep``: [DIST-IO]'s allocation and placement
(docs/simulator.md, "[DIST-IO] placement")."""

from __future__ import annotations

from pathlib import Path

import click

from burstctl.cli.sim.common import (
    campaign_cluster,
    campaign_error,
    campaign_options,
    campaign_record,
    progress,
)
from burstctl.common.limits import ALLOCATOR_NAMES, CURVE_SOURCES, PLACEMENT_NAMES


def _dist_io_load(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A target I/O-load Θ in (0, 2] (the generator's range, docs/simulator.md)."""
    if value is not None and not 0.0 < value <= 2.0:
        raise click.BadParameter(f"must be in (0, 2], got {value}")
    return value


# Both commands: where the applications' b_j(n) come from.
curves_option = click.option(
    "--curves",
    type=click.Choice(CURVE_SOURCES),
    default="synthetic",
    show_default=True,
    help="Bandwidth curves b_j(n) of the generated applications: the four parametrised "
    "shapes, or the measured MareNostrum 4 curves of [FORGE] (189 patterns, 1-8 I/O nodes; "
    "docs/simulator.md).",
)


def _dist_io_loads(
    ctx: click.Context, param: click.Parameter, value: tuple[float, ...]
) -> tuple[float, ...]:
    for v in value:
        _dist_io_load(ctx, param, v)
    return value


@click.command("placement")
@click.option(
    "--load",
    type=float,
    default=0.5,
    show_default=True,
    callback=_dist_io_load,
    help="Target I/O-load Θ of the generated sets, in (0, 2] (mean I/O-load(π_1)).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sets.")
@click.option(
    "--sets", type=click.IntRange(min=1), default=1, show_default=True, help="Sets to run."
)
@click.option(
    "--allocator",
    "allocators",
    type=click.Choice(ALLOCATOR_NAMES),
    multiple=True,
    help="An allocator (repeat); default: all six.",
)
@click.option(
    "--placement",
    "placements",
    type=click.Choice(PLACEMENT_NAMES),
    multiple=True,
    help="A placement (repeat); default: all three.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="json: one object per line per (set, allocator, placement).",
)
@click.option(
    "--inaccurate",
    is_flag=True,
    help="Allocators and placements see each application's profile-class curve instead "
    "of its own b_j ([DIST-IO] §VI-B); the simulation uses the true b_j.",
)
@curves_option
def sim_placement(
    load: float,
    seed: int,
    sets: int,
    allocators: tuple[str, ...],
    placements: tuple[str, ...],
    fmt: str,
    inaccurate: bool,
    curves: str,
) -> None:
    """Allocation and placement of generated applications over 20 I/O resources
    ([DIST-IO]; docs/simulator.md, "[DIST-IO] placement"): Mean/Max-I/O-SlowDown,
    I/O-spread, ρ_io, ρ_con and Machine-IdleTime per (set, allocator, placement)."""
    import json

    from burstctl.simulator.placement.runs import make_set, run_set, table

    rows = []
    for index in range(sets):
        pset = make_set(load, seed, index, curves)
        rows += run_set(
            pset,
            allocators or ALLOCATOR_NAMES,
            placements or PLACEMENT_NAMES,
            seed,
            inaccurate,
        )
    if fmt == "json":
        for row in rows:
            click.echo(json.dumps(row))
    else:
        for line in table(rows):
            click.echo(line)


@click.command("placement-sweep")
@click.option(
    "--loads",
    type=float,
    multiple=True,
    required=True,
    callback=_dist_io_loads,
    help="A target I/O-load Θ in (0, 2] (repeat for each load point).",
)
@click.option(
    "--sets", type=click.IntRange(min=1), default=100, show_default=True, help="Sets per load."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sets.")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for placement.csv, readings.md and the PNGs.",
)
@curves_option
@campaign_options
@click.option(
    "--resume",
    is_flag=True,
    help="Keep the sets an interrupted sweep already wrote to OUT/placement.csv; run the"
    " rest. Refused (exit 2) if it was written with another --seed or --curves.",
)
def sim_placement_sweep(
    loads: tuple[float, ...],
    sets: int,
    seed: int,
    out: Path,
    curves: str,
    workers: int | None,
    scheduler: str | None,
    resume: bool,
) -> None:
    """Every allocator × placement on --sets sets per load point, plus the robustness run
    with profile-class inputs; writes the CSV (as the sets finish), the readings of the
    paper's orderings and the figures (needs extra [plot]; docs/simulator.md, "[DIST-IO]
    placement")."""
    from burstctl.simulator.campaign import CampaignError
    from burstctl.simulator.placement.report import plots, readings
    from burstctl.simulator.placement.runs import sweep

    cluster = campaign_cluster(workers, scheduler)
    try:
        out.mkdir(parents=True, exist_ok=True)
        rows = sweep(
            loads,
            sets,
            seed,
            cluster.workers,
            cluster.scheduler,
            out=out / "placement.csv",
            resume=resume,
            progress=progress,
            params=campaign_record(case_keys=("loads", "sets")),
            curves=curves,
        )
    except CampaignError as exc:
        raise campaign_error(exc) from None
    except OSError as exc:
        raise click.ClickException(f"{out}: {exc}") from None
    try:
        (out / "readings.md").write_text("\n".join(readings(rows)) + "\n")
        pngs = plots(rows, out)
    except ImportError:
        raise click.ClickException(
            "plotting needs matplotlib: pip install 'burstctl[plot]'"
        ) from None
    except OSError as exc:
        raise click.ClickException(f"{out}: {exc}") from None
    click.echo(f"wrote {out / 'placement.csv'}, {out / 'readings.md'} and {len(pngs)} PNGs")
