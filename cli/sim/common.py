"""What the ``burstctl sim`` commands share: option checks, where a campaign runs, its
runs file and the record of its flags, and the rows on stdout."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from burstctl.policies.registry import PolicyRegistry


def known_policies(names: Sequence[str], option: str = "--policy") -> PolicyRegistry:
    """The default registry, once it knows every one of ``names``; else a usage error on
    ``option`` that lists the known names."""
    from burstctl.policies.registry import UnknownPolicyError, default_registry

    registry = default_registry()
    for name in names:
        try:
            registry.get(name)
        except UnknownPolicyError as exc:
            raise click.BadParameter(str(exc), param_hint=option) from None
    return registry


def positive(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not value > 0.0:
        raise click.BadParameter(f"must be > 0, got {value}")
    return value


def fraction(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise click.BadParameter(f"must be in (0, 1], got {value}")
    return value


# Every campaign command (`sim sweep`, `sim placement-sweep`): where the cases run.
def campaign_options(f: Any) -> Any:
    options = [
        click.option(
            "--workers",
            type=click.IntRange(min=1),
            help="Worker processes of the local Dask cluster [default: CPUs]; 1: run the"
            " cases in this process.",
        ),
        click.option(
            "--scheduler",
            metavar="ADDRESS",
            help="Run the cases on an existing Dask cluster (e.g. tcp://127.0.0.1:8786)"
            " instead of a local one.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def campaign_cluster(workers: int | None, scheduler: str | None) -> Any:
    from burstctl.simulator.campaign import Cluster

    if scheduler is not None and workers is not None:
        raise click.UsageError("--workers sizes the local cluster; not with --scheduler")
    return Cluster(workers, scheduler)


def progress(line: str) -> None:
    click.echo(line, err=True)


class BadInput(click.ClickException):
    """An input the command refuses, as one line on stderr (no usage text), exit 2."""

    exit_code = 2


class OtherFlags(BadInput):
    """``--resume`` with other flags than the file's record."""


def campaign_error(exc: Exception) -> click.ClickException:
    """A campaign that cannot start, as a message: exit 2 for a resume with other flags
    (`campaign.ParamsMismatch`), 1 otherwise."""
    from burstctl.simulator.campaign import ParamsMismatch

    if isinstance(exc, ParamsMismatch):
        return OtherFlags(str(exc))
    return click.ClickException(str(exc))


def campaign_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a campaign that cannot start being a message, not a
    traceback."""
    from burstctl.simulator.campaign import CampaignError

    try:
        return fn(*args, **kwargs)
    except CampaignError as exc:
        raise campaign_error(exc) from None
    except OSError as exc:  # the runs file
        raise click.ClickException(str(exc)) from None


# What the record of a campaign's output file (FILE.meta.json) leaves out besides the
# case keys: where the cases run and where the output goes.
NOT_RECORDED = frozenset({"workers", "scheduler", "out", "resume", "runs_file"})


def campaign_record(
    case_keys: Sequence[str] = (), output_only: Sequence[str] = ()
) -> dict[str, Any]:
    """The running command's parameters that determine a case's rows other than its keys,
    by flag name (``--horizon``), for `campaign.RowFile`'s ``params``: every option of
    the command except ``case_keys`` (they find a row's case), ``output_only`` (they
    shape stdout only) and `NOT_RECORDED`."""
    ctx = click.get_current_context()
    record: dict[str, Any] = {"command": f"sim {ctx.info_name}"}
    skip = NOT_RECORDED | set(case_keys) | set(output_only)
    for param in ctx.command.params:
        if param.name is None or param.name in skip:
            continue
        record[param.opts[0] if param.opts else param.name] = ctx.params[param.name]
    return record


def runs_file_options(f: Any) -> Any:
    """``--runs-file FILE | --resume FILE`` of the campaigns that print summaries."""
    options = [
        click.option(
            "--runs-file",
            type=click.Path(dir_okay=False, path_type=Path),
            metavar="FILE",
            help="Also append each run to FILE (JSON lines) as it finishes, its flags to"
            " FILE.meta.json; the summaries are computed from FILE's rows.",
        ),
        click.option(
            "--resume",
            type=click.Path(dir_okay=False, path_type=Path),
            metavar="FILE",
            help="Like --runs-file FILE, keeping the runs an interrupted campaign already"
            " wrote there: only the missing ones run. Refused (exit 2) if FILE was written"
            " with other flags.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def runs_target(runs_file: Path | None, resume: Path | None) -> Path | None:
    if runs_file is not None and resume is not None:
        raise click.UsageError("give --runs-file or --resume, not both")
    return resume or runs_file


def emit(rows: list[dict[str, Any]], fmt: str, columns: Sequence[str] | None = None) -> None:
    """Rows on stdout; CSV columns: ``columns``, or the union of the rows' keys in
    first-seen order."""
    import csv
    import json

    if fmt == "json":
        for row in rows:
            click.echo(json.dumps(row))
        return
    fields = list(columns or dict.fromkeys(key for row in rows for key in row))
    writer = csv.DictWriter(sys.stdout, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
