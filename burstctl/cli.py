"""The ``burstctl`` command line: one group, a subcommand per tool.

Subcommands import their modules lazily so that ``burstctl --help`` is fast
and a missing optional dependency of one tool does not break the others.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from burstctl import __version__, admin_cli
from burstctl.limits import ALLOCATOR_NAMES, PLACEMENT_NAMES


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="burstctl")
def main() -> None:
    """Policy-driven I/O bandwidth sharing for HPC burst buffers."""


@main.command()
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML configuration file (keys as in docs/configuration.md).",
)
@click.option(
    "--grpc-listen",
    metavar="HOST:PORT",
    help="gRPC address for clients and peers [default: 127.0.0.1:50051].",
)
@click.option(
    "--http-listen",
    metavar="HOST:PORT",
    help="REST admin and metrics address [default: 127.0.0.1:8080].",
)
@click.option("--capacity", metavar="RATE", help="B, this replica's bandwidth, e.g. 400MiB/s.")
@click.option("--node-bandwidth", metavar="RATE", help="b, per-node bandwidth, e.g. 8MiB/s.")
@click.option(
    "--bb-capacity",
    metavar="SIZE",
    help=(
        "S, the burst buffer's capacity on this replica, e.g. 200MiB: mounts' writers wait for"
        " space instead of filling it (docs/capacity.md) [default: no limit]."
    ),
)
@click.option(
    "--pfs-bandwidth",
    metavar="RATE",
    help=(
        "B, the drain bandwidth to the parallel file system, shared equally by the jobs that"
        " drain, e.g. 40MiB/s [default: drains share --capacity instead]."
    ),
)
@click.option(
    "--policy",
    metavar="NAME",
    help=(
        "Policy name (see `burstctl policies`), e.g. fair-share, size-fair, or a"
        " sharing spec such as group>user>size."
    ),
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for durable state (active policy).",
)
@click.option("--replica-id", metavar="ID", help="Name of this replica [default: host name].")
@click.option(
    "--peers",
    metavar="HOST:PORT,HOST:PORT",
    help="The other replicas' --grpc-listen addresses; digests are exchanged with them.",
)
@click.option(
    "--sync-interval",
    type=float,
    metavar="SECONDS",
    help="λ, seconds between digest exchanges with the peers [default: 0.5].",
)
@click.option(
    "--missed-exchanges",
    type=int,
    metavar="K",
    help="A peer silent for K·λ leaves the global view [default: 3].",
)
@click.option(
    "--admin-token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="File with the REST bearer token [default: <state-dir>/admin-token, created 0600].",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Logging level [default: INFO].",
)
def controller(config_file: Path | None, **flags: str | Path | float | None) -> None:
    """Run a controller replica: gRPC for clients and peers, REST for admins.

    Precedence: flags > BURSTCTL_* environment > --config file > embedded defaults.
    """
    from burstctl.controller.app import build_replica
    from burstctl.controller.config import ConfigError, load_config

    try:
        config = load_config(config_file, **flags)
        replica = build_replica(config)
    except (ConfigError, KeyError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )

    # A daemon that allocates per event: move start-up objects out of the collector's
    # sight and collect the young generation less often, so that decisions are not
    # stretched by collections (p99 decision latency, bench/decision_latency.py).
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)

    async def run() -> None:
        should_exit = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, should_exit.set)
        await replica.serve(should_exit)

    try:
        asyncio.run(run())
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from burstctl.units import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def config_params(config_class: type) -> list[click.Parameter]:
    """The arguments and options of a command, generated from the fields of a config dataclass
    whose metadata spells them (`burstctl.fuse_shim.config.Cli`): names, defaults, help."""
    import dataclasses

    from burstctl.fuse_shim.config import cli_of, format_size

    params: list[click.Parameter] = []
    for field in dataclasses.fields(config_class):
        spec = cli_of(field)
        if spec.kind == "argument":
            path = click.Path(file_okay=False, path_type=Path)
            params.append(click.Argument([field.name], type=path))
            continue
        default = None if field.default is dataclasses.MISSING else field.default
        options: dict[str, Any] = {}
        if spec.kind == "seconds":
            options["type"] = float
        elif spec.kind == "size":
            options["callback"] = _size  # given as text, such as the default "1MiB"
            default = None if default is None else format_size(default)
        elif spec.kind == "count":
            options["type"] = click.IntRange(min=0)
        elif spec.kind == "choice":
            options["type"] = click.Choice(spec.choices, case_sensitive=False)
        elif spec.kind == "file":
            options["type"] = click.Path(dir_okay=False, path_type=Path)
        elif spec.kind == "flag":
            options["is_flag"] = True
        elif spec.kind == "multiple":
            options["multiple"] = True
        help_text, show_default = spec.help, spec.show_default
        if isinstance(show_default, str):  # a default in words, not a value
            help_text, show_default = f"{help_text}  [default: {show_default}]", False
        params.append(
            click.Option(
                [*spec.flags, field.name],
                default=default,
                show_default=show_default,
                help=help_text,
                metavar=spec.metavar,
                envvar=spec.envvar,
                **options,
            )
        )
    return params


class _ConfigCommand(click.Command):
    """A command whose parameters are a configuration dataclass's fields (``config``,
    ``module:Class``), read when first needed (so that other commands and ``burstctl --help``
    do not import the mount or the agent)."""

    def __init__(self, *args: Any, config: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._config = config

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if not self.params:
            module, _, name = self._config.partition(":")
            self.params = config_params(getattr(importlib.import_module(module), name))
        return super().get_params(ctx)


@main.command(cls=_ConfigCommand, config="burstctl.fuse_shim.config:MountConfig")
def mount(**values: Any) -> None:
    """Mount BACKING on MOUNTPOINT, pacing each job's I/O through the controller.

    Every read and write through MOUNTPOINT is attributed to the caller's job (from its
    BURSTCTL_JOB_ID / SLURM_JOB_ID environment, else the parent's, else the user's default
    job) and paced at the rate the controller allots that job. MOUNTPOINT may be BACKING
    itself. SIGTERM, SIGINT or `burstctl umount MOUNTPOINT` unmount. See docs/fuse.md.
    """
    from burstctl.fuse_shim.config import MountConfig, MountError
    from burstctl.fuse_shim.mount import run_mount

    try:
        config = MountConfig(**values)
    except MountError as exc:
        raise click.ClickException(str(exc)) from None
    handler: logging.Handler = (
        logging.FileHandler(config.log_file)
        if config.log_file is not None
        else logging.StreamHandler()
    )
    logging.basicConfig(
        level=config.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[handler],
    )
    if config.log_level != "DEBUG":
        # mfusepy logs every error answer (ENOENT included) with a traceback at DEBUG.
        logging.getLogger("fuse").setLevel(logging.INFO)
    try:
        code = run_mount(config)
    except (MountError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    # The mount is over: unmounted, every file closed, every session has said Goodbye. Skip
    # the interpreter's finalization, which twice in about 100 runs of the SIGTERM-with-open-
    # files test on libfuse 3 (under load) never finished after "unmounted" was logged — a
    # daemon that cannot exit holds up systemd's stop. Where it hung was not caught; only
    # C-extension teardown (gRPC, libfuse's thread states) runs at that point.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


@main.command(cls=_ConfigCommand, config="burstctl.preload_shim.config:AgentConfig")
def agent(**values: Any) -> None:
    """Run the node agent of the LD_PRELOAD shim: one controller session per job, and each
    job's shared pacing page for its processes (`burstctl exec`).

    Processes attach over the agent's Unix socket; the agent identifies each by its
    credentials (SO_PEERCRED) and its environment, as the mount does. SIGTERM or SIGINT stop
    it. See docs/preload.md.
    """
    from burstctl.preload_shim.agent import run_agent
    from burstctl.preload_shim.config import AgentConfig, AgentError

    try:
        config = AgentConfig(**values)
    except AgentError as exc:
        raise click.UsageError(str(exc)) from None
    logging.basicConfig(
        level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        code = run_agent(config)
    except AgentError as exc:
        raise click.UsageError(str(exc)) from None
    logging.shutdown()
    sys.exit(code)


@main.command(
    "exec",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--agent",
    "agent_socket",
    metavar="SOCKET",
    help="The node agent's socket [default: $BURSTCTL_AGENT_SOCKET, else"
    " /run/burstctl/agent.sock].",
)
@click.option(
    "--job",
    metavar="ID",
    help="The job the command's I/O is booked to (BURSTCTL_JOB_ID); inside a Slurm job,"
    " SLURM_JOB_ID names it already.",
)
@click.option(
    "--export",
    "export",
    is_flag=True,
    help="Print the environment as `export NAME=value` lines instead of running a command"
    " (a Slurm task prolog).",
)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def exec_(
    agent_socket: str | None, job: str | None, export: bool, command: tuple[str, ...]
) -> None:
    """Run COMMAND under the LD_PRELOAD shim: its reads and writes under the agent's
    burst-buffer paths are paced as its job's. An agent that does not answer is one warning
    and the command runs unpaced; the command's exit code is burstctl's. See docs/preload.md.
    """
    from burstctl.preload_shim.launch import export_lines, preload_env

    if not export and not command:
        raise click.UsageError("a COMMAND to run is required (burstctl exec -- CMD ARGS...)")
    if export and command:
        raise click.UsageError("--export runs no COMMAND")

    def warn(message: str) -> None:
        click.echo(message, err=True)

    env, paced = preload_env(os.environ, agent_socket, job, warn)
    if export:
        for line in export_lines(env, paced, job):
            click.echo(line)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], list(command), env)
    except OSError as exc:
        click.echo(f"burstctl exec: {command[0]}: {exc.strerror}", err=True)
        sys.exit(127 if isinstance(exc, FileNotFoundError) else 126)


@main.command("preload-path")
def preload_path() -> None:
    """Print the path of the LD_PRELOAD library (for LD_PRELOAD=...). See docs/preload.md."""
    from burstctl.preload_shim.library import LibraryMissing, library_path

    try:
        click.echo(str(library_path()))
    except LibraryMissing as exc:
        raise click.ClickException(str(exc)) from None


@main.command()
@click.argument("mountpoint", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "-z", "--lazy", is_flag=True, help="Detach now; the mount goes once its files are closed."
)
def umount(mountpoint: Path, lazy: bool) -> None:
    """Unmount a `burstctl mount` (its daemon then closes its sessions and exits)."""
    from burstctl.fuse_shim.config import MountError
    from burstctl.fuse_shim.mount import run_unmount

    try:
        run_unmount(mountpoint, lazy=lazy, echo=click.echo)
    except MountError as exc:
        raise click.ClickException(str(exc)) from None


@main.command("policies")
def list_policies() -> None:
    """List the policies this installation knows."""
    from burstctl.policies.registry import default_registry

    for name in default_registry().names():
        click.echo(name)


@main.group()
def sim() -> None:
    """Discrete-event simulator of the bandwidth-sharing policies (docs/simulator.md)."""


def _positive(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not value > 0.0:
        raise click.BadParameter(f"must be > 0, got {value}")
    return value


def _fraction(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise click.BadParameter(f"must be in (0, 1], got {value}")
    return value


@sim.command("generate")
@click.option(
    "--pressure", type=float, required=True, callback=_positive, help="W_GOAL, the I/O pressure."
)
@click.option("--n-small", type=click.IntRange(0, 40), default=20, show_default=True)
@click.option("--sigma", type=click.FloatRange(min=0.0), default=0.5, show_default=True)
@click.option("--nu", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True)
@click.option("--horizon", type=float, default=2_000_000.0, show_default=True, callback=_positive)
@click.option("--seed", type=int, required=True, help="Seed of the instance's random.Random.")
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Instance file."
)
def sim_generate(
    pressure: float, n_small: int, sigma: float, nu: float, horizon: float, seed: int, out: Path
) -> None:
    """Write a synthetic 60-application instance ([BWS] §6.2)."""
    from burstctl.simulator.generate import GeneratorParams, generate
    from burstctl.simulator.instance import write_instance

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


@sim.command("run")
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
    callback=_fraction,
    help="T = window × the shortest solo completion time.",
)
@click.option(
    "--bandwidth",
    type=float,
    default=1.0,
    show_default=True,
    callback=_positive,
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
    from burstctl.policies.registry import UnknownPolicyError, default_registry
    from burstctl.simulator.engine import SimulationError, create_policy, simulate
    from burstctl.simulator.instance import prepare_window, read_instance

    registry = default_registry()
    try:
        registry.get(policy_name)
    except UnknownPolicyError as exc:
        raise click.BadParameter(str(exc), param_hint="--policy") from None
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
    _emit([result.as_dict()], fmt)


# Every campaign command (`sim sweep`, `sim placement-sweep`): where the cases run.
def _campaign_options(f: Any) -> Any:
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


def _campaign_cluster(workers: int | None, scheduler: str | None) -> Any:
    from burstctl.simulator.campaign import Cluster

    if scheduler is not None and workers is not None:
        raise click.UsageError("--workers sizes the local cluster; not with --scheduler")
    return Cluster(workers, scheduler)


def _progress(line: str) -> None:
    click.echo(line, err=True)


class _OtherFlags(click.ClickException):
    """``--resume`` with other flags than the file's record: one line on stderr, exit 2."""

    exit_code = 2


def _campaign_error(exc: Exception) -> click.ClickException:
    """A campaign that cannot start, as a message: exit 2 for a resume with other flags
    (`campaign.ParamsMismatch`), 1 otherwise."""
    from burstctl.simulator.campaign import ParamsMismatch

    if isinstance(exc, ParamsMismatch):
        return _OtherFlags(str(exc))
    return click.ClickException(str(exc))


def _campaign_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, a campaign that cannot start being a message, not a
    traceback."""
    from burstctl.simulator.campaign import CampaignError

    try:
        return fn(*args, **kwargs)
    except CampaignError as exc:
        raise _campaign_error(exc) from None
    except OSError as exc:  # the runs file
        raise click.ClickException(str(exc)) from None


# What the record of a campaign's output file (FILE.meta.json) leaves out besides the
# case keys: where the cases run and where the output goes.
_NOT_RECORDED = frozenset({"workers", "scheduler", "out", "resume", "runs_file"})


def _campaign_record(
    case_keys: Sequence[str] = (), output_only: Sequence[str] = ()
) -> dict[str, Any]:
    """The running command's parameters that determine a case's rows other than its keys,
    by flag name (``--horizon``), for `campaign.RowFile`'s ``params``: every option of
    the command except ``case_keys`` (they find a row's case), ``output_only`` (they
    shape stdout only) and `_NOT_RECORDED`."""
    ctx = click.get_current_context()
    record: dict[str, Any] = {"command": f"sim {ctx.info_name}"}
    skip = _NOT_RECORDED | set(case_keys) | set(output_only)
    for param in ctx.command.params:
        if param.name is None or param.name in skip:
            continue
        record[param.opts[0] if param.opts else param.name] = ctx.params[param.name]
    return record


def _runs_file_options(f: Any) -> Any:
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


def _runs_target(runs_file: Path | None, resume: Path | None) -> Path | None:
    if runs_file is not None and resume is not None:
        raise click.UsageError("give --runs-file or --resume, not both")
    return resume or runs_file


@sim.command("sweep")
@click.option("--policy", "policies", multiple=True, required=True, metavar="NAME")
@click.option("--pressure", "pressures", type=float, multiple=True, required=True, metavar="W")
@click.option("--seeds", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--first-seed", type=int, default=0, show_default=True)
@click.option("--n-small", type=click.IntRange(0, 40), default=20, show_default=True)
@click.option("--sigma", type=click.FloatRange(min=0.0), default=0.5, show_default=True)
@click.option("--nu", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True)
@click.option("--horizon", type=float, default=2_000_000.0, show_default=True, callback=_positive)
@click.option("--window", type=float, default=1.0, show_default=True, callback=_fraction)
@click.option("--windows", type=click.Choice(["v1", "v2"]), default="v1", show_default=True)
@_campaign_options
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
    from burstctl.policies.registry import UnknownPolicyError, default_registry
    from burstctl.simulator.campaign import CampaignError
    from burstctl.simulator.engine import SimulationError
    from burstctl.simulator.sweep import FIELDS, row_file, run_sweep, tasks

    registry = default_registry()
    for name in policies:
        try:
            registry.get(name)
        except UnknownPolicyError as exc:
            raise click.BadParameter(str(exc), param_hint="--policy") from None
    for w in pressures:
        if not w > 0.0:
            raise click.BadParameter(f"must be > 0, got {w}", param_hint="--pressure")
    if out is not None and resume is not None:
        raise click.UsageError("give --out or --resume, not both")
    cluster = _campaign_cluster(workers, scheduler)
    path = resume or out
    record = _campaign_record(case_keys=("pressures", "seeds", "first_seed"))
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
        rows = run_sweep(cases, cluster, out=target, resume=resume is not None, progress=_progress)
    except CampaignError as exc:
        raise _campaign_error(exc) from None
    except (ValueError, SimulationError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"{path}: {exc}") from None
    if rows is None:
        assert path is not None
        rows = _read_rows(path, fmt)
    else:
        _emit(rows, fmt, FIELDS)
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


@sim.command("plot")
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
        from burstctl.simulator.plots import boxplots
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


class _BadSetFile(click.ClickException):
    """A malformed set file: one line on stderr ("Error: FILE: field: reason"), exit 2."""

    exit_code = 2


@sim.command("persched")
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
    callback=_positive,
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


@sim.command("persched-compare")
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
    callback=_positive,
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
@_campaign_options
@_runs_file_options
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
    from burstctl.policies.registry import UnknownPolicyError, default_registry
    from burstctl.simulator.campaign import CampaignError
    from burstctl.simulator.persched_compare import (
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
    from burstctl.simulator.persched_compare import runs_file as compare_file

    given = sum(bool(x) for x in (set_numbers, set_files, synthetic))
    if given != 1:
        raise click.UsageError("give exactly one of --set, --set-file and --synthetic")
    if synthetic is None:
        ctx = click.get_current_context()
        for name in ("count", "seed"):
            if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
                raise click.UsageError(f"--{name} goes with --synthetic only")
    registry = default_registry()
    for name in strategies:
        try:
            registry.get(name)
        except UnknownPolicyError as exc:
            raise click.BadParameter(str(exc), param_hint="--strategy") from None
    named: list[NamedSet] = [jupiter(n) for n in set_numbers]
    for path in set_files:
        try:
            named.append(NamedSet(path.name, load_set_file(path)))
        except SetFileError as exc:
            raise _BadSetFile(f"{path}: {exc}") from None
    if synthetic is not None:
        named = synthetic_sets(synthetic, count, seed)
    where = _campaign_cluster(workers, scheduler)
    path = _runs_target(runs_file, resume)
    record = _campaign_record(
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
            progress=_progress,
            out=compare_file(path, record) if path is not None else None,
            resume=resume is not None,
        )
    except CompareError as exc:
        if exc.kind == "input":
            raise _BadSetFile(str(exc)) from None
        raise click.ClickException(f"{exc.label}: simulation failed: {exc.message}") from None
    except CampaignError as exc:
        raise _campaign_error(exc) from None
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
        _emit([row for c in comparisons for row in csv_rows(c)], "csv")
    else:
        for line in table_json(comparisons):
            click.echo(line)


def _dpsac_params(values: dict[str, Any]) -> Any:
    """The model options (``_dpsac_model``) as ``simulator.dpsac.Params``; pops them."""
    from burstctl.simulator.dpsac import Params

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
            callback=_positive,
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
            callback=_positive,
            help="Time unit (s) of every partition [default: the paper's mean I/O-phase length].",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _dpsac_runs_file(runs_file: Path | None, resume: Path | None, keys: Sequence[str]) -> Any:
    """The runs file of a DPSAC command (`simulator.dpsac.runs_file`), or None; ``keys``:
    the options that find a run's case or shape stdout only, left out of its record."""
    from burstctl.simulator.dpsac import runs_file as dpsac_runs_file

    path = _runs_target(runs_file, resume)
    if path is None:
        return None
    return dpsac_runs_file(path, _campaign_record(case_keys=keys))


def _dpsac_emit(summaries: list[Any], fmt: str, key: str, head: str) -> None:
    import json

    from burstctl.simulator.dpsac import table

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


@sim.command("dpsac")
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
@_campaign_options
@_runs_file_options
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
    from burstctl.simulator.dpsac import METHODS, run_set

    params = _dpsac_params(model)
    where = _campaign_cluster(workers, scheduler)
    out = _dpsac_runs_file(runs_file, resume, ("set_number", "methods", "runs", "seed", "fmt"))
    summaries = _campaign_call(
        run_set,
        set_number,
        methods or METHODS,
        runs,
        seed,
        params,
        where,
        _progress,
        out,
        resume is not None,
    )
    _dpsac_emit(summaries, fmt, "set", "method")


@sim.command("dpsac-join")
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
@_campaign_options
@_runs_file_options
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
    from burstctl.simulator.dpsac import UPDATERS, run_join

    params = _dpsac_params(model)
    where = _campaign_cluster(workers, scheduler)
    out = _dpsac_runs_file(runs_file, resume, ("joiner", "updaters", "runs", "seed", "fmt"))
    summaries = _campaign_call(
        run_join,
        joiner,
        updaters or UPDATERS,
        runs,
        seed,
        params,
        joins,
        where,
        _progress,
        out,
        resume is not None,
    )
    _dpsac_emit(summaries, fmt, "joiner", "updater")


@sim.command("dpsac-plot")
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
@_campaign_options
@_runs_file_options
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
    from burstctl.simulator.dpsac import METHODS, plot_sets, run_sets, write_csv

    params = _dpsac_params(model)
    where = _campaign_cluster(workers, scheduler)
    target = _dpsac_runs_file(runs_file, resume, ("runs", "seed"))
    summaries = _campaign_call(
        run_sets,
        range(1, 11),
        METHODS,
        runs,
        seed,
        params,
        where,
        _progress,
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


def _dist_io_load(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A target I/O-load Θ in (0, 2] (the generator's range, docs/simulator.md)."""
    if value is not None and not 0.0 < value <= 2.0:
        raise click.BadParameter(f"must be in (0, 2], got {value}")
    return value


def _dist_io_loads(
    ctx: click.Context, param: click.Parameter, value: tuple[float, ...]
) -> tuple[float, ...]:
    for v in value:
        _dist_io_load(ctx, param, v)
    return value


@sim.command("placement")
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
def sim_placement(
    load: float,
    seed: int,
    sets: int,
    allocators: tuple[str, ...],
    placements: tuple[str, ...],
    fmt: str,
    inaccurate: bool,
) -> None:
    """Allocation and placement of generated applications over 20 I/O resources
    ([DIST-IO]; docs/simulator.md, "[DIST-IO] placement"): Mean/Max-I/O-SlowDown,
    I/O-spread, ρ_io, ρ_con and Machine-IdleTime per (set, allocator, placement)."""
    import json

    from burstctl.simulator.placement import make_set, run_set, table

    rows = []
    for index in range(sets):
        pset = make_set(load, seed, index)
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


@sim.command("placement-sweep")
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
@_campaign_options
@click.option(
    "--resume",
    is_flag=True,
    help="Keep the sets an interrupted sweep already wrote to OUT/placement.csv; run the"
    " rest. Refused (exit 2) if it was written with another --seed.",
)
def sim_placement_sweep(
    loads: tuple[float, ...],
    sets: int,
    seed: int,
    out: Path,
    workers: int | None,
    scheduler: str | None,
    resume: bool,
) -> None:
    """Every allocator × placement on --sets sets per load point, plus the robustness run
    with profile-class inputs; writes the CSV (as the sets finish), the readings of the
    paper's orderings and the figures (needs extra [plot]; docs/simulator.md, "[DIST-IO]
    placement")."""
    from burstctl.simulator.campaign import CampaignError
    from burstctl.simulator.placement import sweep
    from burstctl.simulator.placement_report import plots, readings

    cluster = _campaign_cluster(workers, scheduler)
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
            progress=_progress,
            params=_campaign_record(case_keys=("loads", "sets")),
        )
    except CampaignError as exc:
        raise _campaign_error(exc) from None
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


def _emit(rows: list[dict[str, Any]], fmt: str, columns: Sequence[str] | None = None) -> None:
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


main.add_command(admin_cli.policy)
main.add_command(admin_cli.jobs)
main.add_command(admin_cli.job)
main.add_command(admin_cli.top)
main.add_command(admin_cli.placement)

if __name__ == "__main__":
    sys.exit(main())
