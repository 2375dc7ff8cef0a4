"""The ``burstctl`` command line: one group, a subcommand per tool.

Subcommands import their modules lazily so that ``burstctl --help`` is fast
and a missing optional dependency of one tool does not break the others.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
from pathlib import Path

import click

from burstctl import __version__


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
@click.option("--policy", metavar="NAME", help="Policy name, e.g. fair-share, fcfs.")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for durable state (active policy).",
)
@click.option("--replica-id", metavar="ID", help="Name of this replica [default: host name].")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Logging level [default: INFO].",
)
def controller(config_file: Path | None, **flags: str | Path | None) -> None:
    """Run a controller replica (gRPC; REST comes with the admin API).

    Precedence: flags > BURSTCTL_* environment > --config file > embedded defaults.
    """
    from burstctl.controller.app import build_service
    from burstctl.controller.config import ConfigError, load_config

    try:
        config = load_config(config_file, **flags)
        service = build_service(config)
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
        await service.serve(should_exit)

    try:
        asyncio.run(run())
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


@main.command("policies")
def list_policies() -> None:
    """List the policies this installation knows."""
    from burstctl.policies.registry import default_registry

    for name in default_registry().names():
        click.echo(name)


if __name__ == "__main__":
    sys.exit(main())
