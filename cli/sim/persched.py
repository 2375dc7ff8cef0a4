"""``burstctl sim persched|persched-compare``: [PERSCHED]'s periodic patterns and their
comparison with the online strategies (docs/persched.md)."""

from __future__ import annotations

from pathlib import Path

import click

from burstctl.cli.sim.common import (
    campaign_cluster,
    campaign_error,
    campaign_options,
    campaign_record,
    emit,
    known_policies,
    positive,
    progress,
    runs_file_options,
    runs_target,
)


class _BadSetFile(click.ClickException):
    """A malformed set file: one line on stderr ("Error: FILE: field: reason"), exit 2."""

    exit_code = 2


@click.command("persched")
@click.option(
    "--set",
    "set_number",
    type=click.IntRange(1, 10),
    default=None,
    help="A Jupiter set of [PERSCHED] Table 2 shipped with burstctl (1-10).",
)
@click.option(
    "--set-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help='A set file: {"B": GB/s, "b": GB/s per core, "apps": [{"name", "w", "vol_io",'
    ' "beta"}, ...]} (docs/persched.md).',
)
@click.option(
    "--kprime",
    type=click.FloatRange(min=1.0),
    default=10.0,
    show_default=True,
    help="K' = T_max/T_min.",
)
@click.option(
    "--epsilon",
    type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
    default=0.01,
    show_default=True,
    help="The period grows by a factor 1+epsilon per step.",
)
@click.option(
    "--tmin",
    type=float,
    default=None,
    callback=positive,
    help="T_min in seconds. Default: for --set, the value the paper's authors used;"
    " otherwise max over the applications of w + time_io.",
)
@click.option(
    "--objective",
    type=click.Choice(["syseff", "dilation"]),
    default="syseff",
    show_default=True,
    help="Keep the period of the best SysEff (PerSched) or of the least dilation (Min DILATION).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
def sim_persched(
    set_number: int | None,
    set_file: Path | None,
    kprime: float,
    epsilon: float,
    tmin: float | None,
    objective: str,
    fmt: str,
) -> None:
    """Compute a PerSched periodic I/O pattern ([PERSCHED], docs/persched.md)."""
    import json

    from burstctl.policies.persched import (
        JUPITER_TMIN,
        SetFileError,
        jupiter_set,
        load_set_file,
        persched,
    )

    if (set_number is None) == (set_file is None):
        raise click.UsageError("give exactly one of --set and --set-file")
    try:
        if set_file is not None:
            app_set = load_set_file(set_file)
        else:
            assert set_number is not None
            app_set = jupiter_set(set_number)
            if tmin is None:
                tmin = JUPITER_TMIN[set_number]
    except SetFileError as exc:
        raise _BadSetFile(f"{set_file}: {exc}") from None
    try:
        result = persched(
            app_set.apps,
            app_set.platform,
            kprime=kprime,
            epsilon=epsilon,
            tmin=tmin,
            objective="dilation" if objective == "dilation" else "syseff",
        )
    except ValueError as exc:  # an application too small for a pattern's resolution
        raise _BadSetFile(f"{set_file or f'set {set_number}'}: {exc}") from None
    if fmt == "json":
        click.echo(json.dumps(result.to_json()))
        return
    click.echo(
        f"period {result.period:.6g} s (best of the first loop {result.t_opt:.6g} s;"
        f" T_min {result.t_min:.6g} s, T_max {result.t_max:.6g} s)"
    )
    click.echo(
        f"SysEff {result.sys_eff:.6g}   Dilation {result.dilation:.6g}"
        f"   upper bound (eq. 5) {result.upper_bound:.6g}"
    )
    click.echo(f"{'app':<12} {'w (s)':>10} {'vol_io (GB)':>12} {'beta':>7} {'n_per':>6}")
    for entry in result.pattern.apps:
        app = entry.app
        click.echo(
            f"{app.name:<12} {app.w:>10.6g} {app.vol_io:>12.6g} {app.beta:>7.6g} {entry.n_per:>6}"
        )


@click.command("persched-compare")
@click.option(
    "--set",
    "set_numbers",
    type=click.IntRange(1, 10),
    multiple=True,
    help="A Jupiter set of [PERSCHED] Table 2 (1-10); repeat for several.",
)
@click.option(
    "--set-file",
    "set_files",
    type=click.Path(dir_okay=False, path_type=Path),
    multiple=True,
    help="A set file (docs/persched.md); repeat for several.",
)
@click.option(
    "--synthetic",
    type=click.Choice(["mira", "intrepid"]),
    default=None,
    help="Synthetic sets of [PERSCHED] §4.4 (with --count and --seed).",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="With --synthetic: how many sets.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="With --synthetic: the first set's seed (then seed+1, ...).",
)
@click.option(
    "--periods",
    type=float,
    default=10.0,
    show_default=True,
    callback=positive,
    help="Simulated horizon, in PerSched periods (or in the longest iteration, if longer).",
)
@click.option(
    "--strategy",
    "strategies",
    multiple=True,
    metavar="NAME",
    help="An online strategy to run (repeat); default: the eight of [BWS].",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "csv"]),
    default="table",
    show_default=True,
    help="json: one object with a 'sets' list; csv: one row per set and method.",
)
@click.option(
    "--plot",
    "plot_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also draw SysEff and Dilation per set into this PNG (needs extra [plot]).",
)
@campaign_options
@runs_file_options
def sim_persched_compare(
    set_numbers: tuple[int, ...],
    set_files: tuple[Path, ...],
    synthetic: str | None,
    count: int,
    seed: int,
    periods: float,
    strategies: tuple[str, ...],
    fmt: str,
    plot_file: Path | None,
    workers: int | None,
    scheduler: str | None,
    runs_file: Path | None,
    resume: Path | None,
) -> None:
    """PerSched against the online strategies in the simulator (docs/persched.md)."""
    import json

    from burstctl.policies.persched import SetFileError, load_set_file
    from burstctl.simulator.campaign import CampaignError
    from burstctl.simulator.persched.compare import (
        ONLINE_STRATEGIES,
        CompareError,
        NamedSet,
        compare_json,
        csv_rows,
        jupiter,
        plot_json,
        synthetic_sets,
        table_json,
    )
    from burstctl.simulator.persched.compare import runs_file as compare_file

    given = sum(bool(x) for x in (set_numbers, set_files, synthetic))
    if given != 1:
        raise click.UsageError("give exactly one of --set, --set-file and --synthetic")
    if synthetic is None:
        ctx = click.get_current_context()
        for name in ("count", "seed"):
            if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
                raise click.UsageError(f"--{name} goes with --synthetic only")
    known_policies(strategies, "--strategy")
    named: list[NamedSet] = [jupiter(n) for n in set_numbers]
    for path in set_files:
        try:
            named.append(NamedSet(path.name, load_set_file(path)))
        except SetFileError as exc:
            raise _BadSetFile(f"{path}: {exc}") from None
    if synthetic is not None:
        named = synthetic_sets(synthetic, count, seed)
    where = campaign_cluster(workers, scheduler)
    path = runs_target(runs_file, resume)
    record = campaign_record(
        case_keys=("set_numbers", "set_files", "synthetic", "count", "seed"),
        output_only=("fmt", "plot_file"),
    )
    record["--strategy"] = list(strategies or ONLINE_STRATEGIES)
    try:
        comparisons = compare_json(
            named,
            periods=periods,
            strategies=strategies or ONLINE_STRATEGIES,
            where=where,
            progress=progress,
            out=compare_file(path, record) if path is not None else None,
            resume=resume is not None,
        )
    except CompareError as exc:
        if exc.kind == "input":
            raise _BadSetFile(str(exc)) from None
        raise click.ClickException(f"{exc.label}: simulation failed: {exc.message}") from None
    except CampaignError as exc:
        raise campaign_error(exc) from None
    except OSError as exc:
        raise click.ClickException(f"{path}: {exc}") from None
    if plot_file is not None:
        try:
            plot_json(comparisons, plot_file)
        except ImportError:
            raise click.ClickException(
                "plotting needs matplotlib: pip install 'burstctl[plot]'"
            ) from None
        except OSError as exc:
            raise click.ClickException(f"{plot_file}: {exc}") from None
    if fmt == "json":
        click.echo(json.dumps({"periods": periods, "sets": comparisons}))
    elif fmt == "csv":
        emit([row for c in comparisons for row in csv_rows(c)], "csv")
    else:
        for line in table_json(comparisons):
            click.echo(line)
