"""``burstctl sim dpsac|dpsac-join|dpsac-plot``: [DPSAC]'s experiments (docs/simulator.md,
"DPSAC")."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from burstctl.cli.sim.common import (
    campaign_call,
    campaign_cluster,
    campaign_options,
    campaign_record,
    positive,
    progress,
    runs_file_options,
    runs_target,
)


def _dpsac_params(values: dict[str, Any]) -> Any:
    """The model options (``_dpsac_model``) as ``simulator.dpsac.Params``; pops them."""
    from burstctl.simulator.dpsac.model import Params

    return Params(
        knee=values.pop("knee"),
        floor=values.pop("floor"),
        dt=values.pop("dt"),
        release_spread=values.pop("release_spread"),
        unit=values.pop("unit"),
    )


def _dpsac_common(f: Any) -> Any:
    """The options `sim dpsac` and `sim dpsac-join` share."""
    f = _dpsac_model(f)
    options = [
        click.option(
            "--runs",
            type=click.IntRange(min=1),
            default=5,
            show_default=True,
            help="Runs per method, averaged (seeds --seed, --seed+1, ...).",
        ),
        click.option(
            "--seed", type=int, default=0, show_default=True, help="Seed of the first run."
        ),
        click.option(
            "--format",
            "fmt",
            type=click.Choice(["table", "json"]),
            default="table",
            show_default=True,
            help="json: one object per line per method.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _dpsac_model(f: Any) -> Any:
    """The model's options (docs/simulator.md, "DPSAC")."""
    options = [
        click.option(
            "--knee",
            type=click.FloatRange(0.0, 1.0, min_open=True),
            default=0.8,
            show_default=True,
            help="Buffer fill fraction where the SSD slowdown starts (1: no slowdown).",
        ),
        click.option(
            "--floor",
            type=click.FloatRange(0.0, 1.0, min_open=True),
            default=0.2,
            show_default=True,
            help="The buffer's absorb factor when full (the SSD slowdown's floor).",
        ),
        click.option(
            "--dt",
            type=float,
            default=1.0,
            show_default=True,
            callback=positive,
            help="Physics step while I/O is under way, seconds.",
        ),
        click.option(
            "--release-spread",
            type=click.FloatRange(min=0.0),
            default=1.0,
            show_default=True,
            help="Release r_i drawn from U(0, spread x T_i).",
        ),
        click.option(
            "--unit",
            type=float,
            default=None,
            callback=positive,
            help="Time unit (s) of every partition [default: the paper's mean I/O-phase length].",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _dpsac_runs_file(runs_file: Path | None, resume: Path | None, keys: Sequence[str]) -> Any:
    """The runs file of a DPSAC command (`simulator.dpsac.runs_file`), or None; ``keys``:
    the options that find a run's case or shape stdout only, left out of its record."""
    from burstctl.simulator.dpsac.runs import runs_file as dpsac_runs_file

    path = runs_target(runs_file, resume)
    if path is None:
        return None
    return dpsac_runs_file(path, campaign_record(case_keys=keys))


def _dpsac_emit(summaries: list[Any], fmt: str, key: str, head: str) -> None:
    import json

    from burstctl.simulator.dpsac.runs import table

    if fmt == "json":
        for s in summaries:
            row = s.to_json()
            label = row.pop("label")
            row.pop("method")
            name = label.split(" ", 1)[1]
            value: object = int(name) if key == "set" else name
            click.echo(json.dumps({key: value, head: s.method, **row}))
    else:
        for line in table(summaries, head):
            click.echo(line)


@click.command("dpsac")
@click.option(
    "--set",
    "set_number",
    type=click.IntRange(1, 10),
    required=True,
    help="A set of [DPSAC] Table 2 (1-10).",
)
@click.option(
    "--method",
    "methods",
    type=click.Choice(["dpsac", "mcios", "bios"]),
    multiple=True,
    help="A method to run (repeat); default: all three.",
)
@_dpsac_common
@campaign_options
@runs_file_options
def sim_dpsac(
    set_number: int,
    methods: tuple[str, ...],
    runs: int,
    seed: int,
    fmt: str,
    workers: int | None,
    scheduler: str | None,
    runs_file: Path | None,
    resume: Path | None,
    **model: Any,
) -> None:
    """SysEff and Dilation of DPSAC, MCIOS and BIOS on a Table 2 set ([DPSAC] §5.2;
    docs/simulator.md, "DPSAC")."""
    from burstctl.simulator.dpsac.methods import METHODS
    from burstctl.simulator.dpsac.runs import run_set

    params = _dpsac_params(model)
    where = campaign_cluster(workers, scheduler)
    out = _dpsac_runs_file(runs_file, resume, ("set_number", "methods", "runs", "seed", "fmt"))
    summaries = campaign_call(
        run_set,
        set_number,
        methods or METHODS,
        runs,
        seed,
        params,
        where,
        progress,
        out,
        resume is not None,
    )
    _dpsac_emit(summaries, fmt, "set", "method")


@click.command("dpsac-join")
@click.option(
    "--joiner",
    type=click.Choice(["eap", "lap5", "silverton"]),
    required=True,
    help="The periodic joiner of [DPSAC] Table 4.",
)
@click.option(
    "--updater",
    "updaters",
    type=click.Choice(["st", "dt", "ok"]),
    multiple=True,
    help="An updating strategy (repeat); default: all three.",
)
@click.option(
    "--joins",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="How many joiners arrive, one every join period.",
)
@_dpsac_common
@campaign_options
@runs_file_options
def sim_dpsac_join(
    joiner: str,
    updaters: tuple[str, ...],
    joins: int,
    runs: int,
    seed: int,
    fmt: str,
    workers: int | None,
    scheduler: str | None,
    runs_file: Path | None,
    resume: Path | None,
    **model: Any,
) -> None:
    """DPSAC's updaters ST, DT and OK on Table 3's batch with periodic joiners of Table 4
    ([DPSAC] §5.3; docs/simulator.md, "DPSAC")."""
    from burstctl.simulator.dpsac.methods import UPDATERS
    from burstctl.simulator.dpsac.runs import run_join

    params = _dpsac_params(model)
    where = campaign_cluster(workers, scheduler)
    out = _dpsac_runs_file(runs_file, resume, ("joiner", "updaters", "runs", "seed", "fmt"))
    summaries = campaign_call(
        run_join,
        joiner,
        updaters or UPDATERS,
        runs,
        seed,
        params,
        joins,
        where,
        progress,
        out,
        resume is not None,
    )
    _dpsac_emit(summaries, fmt, "joiner", "updater")


@click.command("dpsac-plot")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for dpsac_sets.csv and dpsac_sets.png.",
)
@click.option(
    "--runs", type=click.IntRange(min=1), default=5, show_default=True, help="Runs per set."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the first run.")
@_dpsac_model
@campaign_options
@runs_file_options
def sim_dpsac_plot(
    out: Path,
    runs: int,
    seed: int,
    workers: int | None,
    scheduler: str | None,
    runs_file: Path | None,
    resume: Path | None,
    **model: Any,
) -> None:
    """Run the ten Table 2 sets with the three methods; write a CSV and a PNG of SysEff
    and Dilation per set (needs extra [plot])."""
    from burstctl.simulator.dpsac.methods import METHODS
    from burstctl.simulator.dpsac.runs import plot_sets, run_sets, write_csv

    params = _dpsac_params(model)
    where = campaign_cluster(workers, scheduler)
    target = _dpsac_runs_file(runs_file, resume, ("runs", "seed"))
    summaries = campaign_call(
        run_sets,
        range(1, 11),
        METHODS,
        runs,
        seed,
        params,
        where,
        progress,
        target,
        resume is not None,
    )
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_csv(summaries, out / "dpsac_sets.csv")
        plot_sets(summaries, out / "dpsac_sets.png")
    except ImportError:
        raise click.ClickException(
            "plotting needs matplotlib: pip install 'burstctl[plot]'"
        ) from None
    except OSError as exc:
        raise click.ClickException(f"{out}: {exc}") from None
    click.echo(f"wrote {out / 'dpsac_sets.csv'} and {out / 'dpsac_sets.png'}")
