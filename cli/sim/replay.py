"""``burstctl sim replay``: Darshan logs replayed in the simulator, every policy on them, and
optionally live against a controller (docs/simulator.md, "Darshan replay")."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from burstctl.cli.sim.common import BadInput, known_policies

if TYPE_CHECKING:
    from burstctl.simulator.replay.mapping import Replay
    from burstctl.simulator.replay.runs import PolicyReplay


def _rate(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    from burstctl.common.units import parse_rate

    if value is None:
        return None
    try:
        rate = parse_rate(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not rate > 0.0:
        raise click.BadParameter(f"must be > 0, got {value}")
    return rate


@click.command("replay")
@click.argument("logs", metavar="LOG...", nargs=-1, required=True)
@click.option(
    "--policy",
    "policies",
    multiple=True,
    metavar="NAME",
    help="A registered policy (repeatable) [default: every registered one; with --live:"
    " the one the controller runs].",
)
@click.option(
    "--bins",
    type=click.IntRange(min=1, max=100_000),
    default=100,
    show_default=True,
    help="Time bins per log: a job has at most one I/O phase per bin.",
)
@click.option(
    "--bandwidth",
    callback=_rate,
    metavar="RATE",
    help="B of the replayed system (e.g. 20GB/s) [default: the highest bin rate of any log].",
)
@click.option(
    "--node-bandwidth",
    callback=_rate,
    metavar="RATE",
    help="b per rank: a job's cap is min(ranks·b, B) [default: the highest bin rate per rank"
    " of any log].",
)
@click.option(
    "--stagger",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="Seconds between the jobs' starts: job k computes k × stagger seconds first.",
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.option(
    "--live",
    metavar="ADDRESS",
    help="Also drive the jobs as client sessions against the controller at ADDRESS (host:port),"
    " time-scaled, and print their yields beside the simulator's. The controller must run the"
    " one --policy as --controller-flags prints.",
)
@click.option(
    "--live-bandwidth",
    callback=_rate,
    default="64MiB/s",
    show_default=True,
    metavar="RATE",
    help="With --live: B of the live controller (its --capacity).",
)
@click.option(
    "--controller-flags",
    is_flag=True,
    help="Print the command line (environment and flags) of the controller a --live replay"
    " at --live-bandwidth needs, and exit.",
)
@click.option(
    "--time-scale",
    type=click.FloatRange(min=0.0, min_open=True),
    help="With --live: simulated seconds per live second [default: the replay lasts 30 s].",
)
def sim_replay(
    logs: tuple[str, ...],
    policies: tuple[str, ...],
    bins: int,
    bandwidth: float | None,
    node_bandwidth: float | None,
    stagger: float,
    fmt: str,
    live: str | None,
    live_bandwidth: float,
    controller_flags: bool,
    time_scale: float | None,
) -> None:
    """Replay Darshan logs (one job each, all starting together) under every policy: per-job
    yields at T and the papers' metrics. Reading logs needs PyDarshan (burstctl[sim])."""
    from burstctl.simulator.replay.darshan import LogError, read_log
    from burstctl.simulator.replay.mapping import replay_jobs
    from burstctl.simulator.replay.runs import run_policies

    registry = known_policies(policies)
    if live is not None and len(policies) != 1:
        raise click.UsageError("--live replays one policy: give exactly one --policy")
    try:
        read = [read_log(path) for path in logs]
    except LogError as exc:
        raise BadInput(str(exc)) from None
    try:
        replay = replay_jobs(
            read, bins=bins, bandwidth=bandwidth, node_bandwidth=node_bandwidth, stagger=stagger
        )
    except ValueError as exc:
        raise BadInput(f"{', '.join(logs)}: {exc}") from None
    if controller_flags:
        from burstctl.cli.sim.replay_live import controller_command

        click.echo(controller_command(replay, live_bandwidth, policies[0] if policies else None))
        return
    runs = run_policies(replay, policies, registry)
    if live is not None:
        from burstctl.cli.sim.replay_live import emit_live

        emit_live(replay, runs[0], live, live_bandwidth, time_scale, fmt)
        return
    if fmt == "json":
        click.echo(json.dumps(replay_document(replay, runs)))
    else:
        click.echo(replay_table(replay, runs))


def replay_document(replay: Replay, runs: list[PolicyReplay]) -> dict[str, Any]:
    """The replay as one JSON document: the system, the jobs, one entry per policy."""
    names = [job.name for job in replay.jobs]
    return {
        "bandwidth": replay.bandwidth,
        "node_bandwidth": replay.node_bandwidth,
        "horizon": replay.window.horizon,
        "jobs": [
            {
                "name": job.name,
                "log": job.path,
                "ranks": job.ranks,
                "span": job.span,
                "bytes": job.nbytes,
                "transfers": job.transfers,
                "dxt": job.dxt,
                "cap": app.bandwidth,
                "io_phases": replay.io_phases(i),
            }
            for i, (job, app) in enumerate(zip(replay.jobs, replay.apps, strict=True))
        ],
        "policies": [
            {
                "policy": run.policy,
                "yields": dict(zip(names, run.yields, strict=True)),
                **(run.result.as_dict() if run.result is not None else {}),
                "error": run.error,
            }
            for run in runs
        ],
    }


def replay_table(replay: Replay, runs: list[PolicyReplay]) -> str:
    """The jobs, then one row per policy: each job's yield and the papers' metrics."""
    from burstctl.common.units import format_rate

    lines = [
        f"B = {format_rate(replay.bandwidth)}, b = {format_rate(replay.node_bandwidth)} per rank,"
        f" T = {replay.window.horizon:.6g} s",
        _row(["job", "ranks", "span s", "bytes", "cap", "I/O phases"], [24, 7, 9, 12, 14, 10]),
    ]
    for i, (job, app) in enumerate(zip(replay.jobs, replay.apps, strict=True)):
        cells = [job.name, str(job.ranks), f"{job.span:.6g}", f"{job.nbytes:.4g}"]
        cells += [format_rate(app.bandwidth), str(replay.io_phases(i))]
        lines.append(_row(cells, [24, 7, 9, 12, 14, 10]))
    names = [job.name for job in replay.jobs]
    widths = [24] + [max(8, len(n)) for n in names] + [9, 10, 11]
    lines += ["", _row(["policy", *names, "min yield", "efficiency", "utilization"], widths)]
    for run in runs:
        if run.result is None:
            lines.append(f"{run.policy:<24}  failed: {run.error}")
            continue
        r = run.result
        metrics = (r.min_yield, r.efficiency, r.utilization)
        lines.append(_row([run.policy, *(f"{y:.4f}" for y in run.yields + metrics)], widths))
    return "\n".join(lines)


def _row(cells: list[str], widths: list[int]) -> str:
    first = f"{cells[0]:<{widths[0]}}"
    return "  ".join([first, *(f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:], strict=True))])
