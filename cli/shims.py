"""The shims' commands: ``burstctl mount|umount`` (docs/fuse.md) and ``burstctl
agent|exec|preload-path`` (docs/preload.md)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import click


class _ConfigCommand(click.Command):
    """A command whose parameters are a configuration dataclass's fields (``config``,
    ``module:Class``; `burstctl.node.options.config_params`), read when first needed (so that
    other commands and ``burstctl --help`` do not import the mount or the agent)."""

    def __init__(self, *args: Any, config: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._config = config

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if not self.params:
            module, _, name = self._config.partition(":")
            from burstctl.node.options import config_params

            self.params = config_params(getattr(importlib.import_module(module), name))
        return super().get_params(ctx)


@click.command(cls=_ConfigCommand, config="burstctl.fuse_shim.config:MountConfig")
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


@click.command(cls=_ConfigCommand, config="burstctl.preload_shim.config:AgentConfig")
def agent(**values: Any) -> None:
    """Run the node agent of the LD_PRELOAD shim: one controller session per job, and each
    job's shared pacing page for its processes (`burstctl exec`).

    Processes attach over the agent's Unix socket; the agent identifies each by its
    credentials (SO_PEERCRED) and its environment, as the mount does. Their writes wait for
    space on the burst buffer (the controller's --bb-capacity), and with --stage-out the files
    they write are copied to the PFS and evicted, as the mount's. SIGTERM or SIGINT stop it.
    See docs/preload.md.
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


@click.command(
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


@click.command("preload-path")
def preload_path() -> None:
    """Print the path of the LD_PRELOAD library (for LD_PRELOAD=...). See docs/preload.md."""
    from burstctl.preload_shim.library import LibraryMissing, library_path

    try:
        click.echo(str(library_path()))
    except LibraryMissing as exc:
        raise click.ClickException(str(exc)) from None


@click.command()
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
