"""``burstctl controller``: one controller replica (docs/controller.md)."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from pathlib import Path

import click


@click.command()
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
        "S, the size of the burst buffer on this replica, e.g. 200MiB: mounts' writers wait"
        " for space instead of filling it (docs/capacity.md) [default: no limit]."
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
    help=(
        "Directory for durable state: the active policy and registered jobs, the jobs'"
        " counters, the application profiles (an unreadable file is kept aside)."
    ),
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
    except (ConfigError, KeyError, OSError, ValueError) as exc:  # OSError: a credential file
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
