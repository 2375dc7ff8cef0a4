"""The node agent's configuration: `AgentConfig`, the one owner of every ``burstctl agent``
option (docs/preload.md, "The node agent").

Options the agent shares with the mount (the controller, its credentials, the fallback, the
session timings) take the mount's spelling, default and help text from `MountConfig`'s fields,
so each is written once; ``burstctl agent`` generates its options from these fields as
``burstctl mount`` does (`burstctl.cli.shims.config_params`). `AgentConfig` checks its values when
it is built (`AgentError`, worded for the command line, naming the flag).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from burstctl.client.fallback import Fallback
from burstctl.common.channels import ChannelSecurity
from burstctl.fuse_shim.config import LOG_LEVELS, Cli, MountConfig, cli_of

# Where the agent listens, and where `burstctl exec` and the library look, by default.
DEFAULT_SOCKET = "/run/burstctl/agent.sock"
SOCKET_VAR = "BURSTCTL_AGENT_SOCKET"
PATHS_VAR = "BURSTCTL_PRELOAD_PATHS"
DEAD_AFTER_VAR = "BURSTCTL_PRELOAD_DEAD_AFTER"
# Seconds between two ticks: heartbeat, counters to the controller, waiters (--tick).
DEFAULT_TICK = 0.05

_MOUNT = {f.name: f for f in dataclasses.fields(MountConfig)}


class AgentError(Exception):
    """An agent that cannot start, with a message for the user naming the flag."""


def _like_mount(name: str, **changes: Any) -> dict[str, Cli]:
    """The metadata of the mount's field ``name``: its spelling and help (with the `Cli`
    ``changes`` where the agent differs)."""
    return {"cli": dataclasses.replace(cli_of(_MOUNT[name]), **changes)}


def _mount_default(name: str) -> Any:
    """The default of the mount's field ``name``."""
    return _MOUNT[name].default


def _cli(flags: tuple[str, ...], help: str, **spelling: Any) -> dict[str, Cli]:
    return {"cli": Cli(flags, help, **spelling)}


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything ``burstctl agent`` is given; docs/preload.md says what each does."""

    controller: str | None = field(
        default=None,
        metadata=_like_mount(
            "controller",
            help="Controller replica that allots the jobs' rates [env BURSTCTL_CONTROLLER];"
            " required.",
        ),
    )
    paths: tuple[str, ...] = field(
        default=(),
        metadata=_cli(
            ("--paths",),
            "The burst-buffer directories whose files the library paces, comma-separated"
            " absolute paths (e.g. /bb,/bb2); everything else passes straight through.",
            metavar="DIR[,DIR...]",
            show_default=False,
        ),
    )
    socket: Path = field(
        default=Path(DEFAULT_SOCKET),
        metadata=_cli(
            ("--socket",),
            "The agent's Unix socket (mode 0666 in a 0755 directory, created if missing);"
            f" the library finds it in {SOCKET_VAR}.",
            kind="file",
            metavar="PATH",
        ),
    )
    fallback: str = field(default=_mount_default("fallback"), metadata=_like_mount("fallback"))
    tls_ca: Path | None = field(default=_mount_default("tls_ca"), metadata=_like_mount("tls_ca"))
    tls_cert: Path | None = field(
        default=_mount_default("tls_cert"), metadata=_like_mount("tls_cert")
    )
    tls_key: Path | None = field(default=_mount_default("tls_key"), metadata=_like_mount("tls_key"))
    secret_file: Path | None = field(
        default=_mount_default("secret_file"), metadata=_like_mount("secret_file")
    )
    quiet_gap: float = field(default=_mount_default("quiet_gap"), metadata=_like_mount("quiet_gap"))
    session_idle: float = field(
        default=_mount_default("session_idle"), metadata=_like_mount("session_idle")
    )
    attach_timeout: float = field(
        default=_mount_default("attach_timeout"), metadata=_like_mount("attach_timeout")
    )
    fallback_grace: float = field(
        default=_mount_default("fallback_grace"), metadata=_like_mount("fallback_grace")
    )
    attribution_ttl: float = field(
        default=_mount_default("attribution_ttl"), metadata=_like_mount("attribution_ttl")
    )
    tick: float = field(
        default=DEFAULT_TICK,
        metadata=_cli(
            ("--tick",),
            "Seconds between two ticks: each beats every page's heartbeat and books the bytes"
            " its processes asked for on the job's session.",
            kind="seconds",
            metavar="SECONDS",
        ),
    )
    log_level: str = field(
        default="INFO",
        metadata=_cli(("--log-level",), "Logging level.", kind="choice", choices=LOG_LEVELS),
    )

    def __post_init__(self) -> None:
        if isinstance(self.paths, str):  # as given on the command line
            object.__setattr__(self, "paths", tuple(p for p in self.paths.split(",") if p))
        if not isinstance(self.socket, Path):
            object.__setattr__(self, "socket", Path(self.socket))
        if not self.controller:
            raise AgentError(
                "--controller HOST:PORT is required (or BURSTCTL_CONTROLLER): the agent paces"
                " through a controller"
            )
        if not self.paths:
            raise AgentError("--paths needs at least one absolute directory (e.g. --paths /bb)")
        for path in self.paths:
            if ":" in path:
                raise AgentError(f"--paths: {path!r} contains ':', which separates the paths")
            if not os.path.isabs(path):
                raise AgentError(f"--paths: {path!r} is not an absolute path")
            if not os.path.isdir(path):
                raise AgentError(f"--paths: {path!r} is not an existing directory")
        if not self.socket.is_absolute():
            raise AgentError(f"--socket: {str(self.socket)!r} is not an absolute path")
        for f in dataclasses.fields(self):
            spec = cli_of(f)
            value = getattr(self, f.name)
            if spec.kind == "seconds" and not (
                isinstance(value, int | float) and math.isfinite(value) and value >= 0
            ):
                raise AgentError(
                    f"{spec.flags[-1]} must be a finite number of seconds >= 0, got {value!r}"
                )
            if spec.kind == "choice" and value not in spec.choices:
                raise AgentError(
                    f"{spec.flags[-1]} must be one of {', '.join(spec.choices)}, got {value!r}"
                )
        if self.tick <= 0:
            raise AgentError(f"--tick must be > 0 seconds, got {self.tick!r}")
        try:
            Fallback.parse(self.fallback)
        except ValueError as err:
            raise AgentError(f"--fallback: {err}") from None
        try:
            self.channel_security()
        except ValueError as err:
            raise AgentError(str(err)) from None

    # What the pacer also reads (`burstctl.fuse_shim.pacing.PacingConfig`): the agent paces
    # no metadata and stages nothing out.
    @property
    def metadata_cost(self) -> int:
        return 0

    @property
    def stage_out(self) -> Path | None:
        return None

    def channel_security(self) -> ChannelSecurity:
        """The credentials of the agent's channel to the controller (ValueError if unusable)."""
        return ChannelSecurity.load(
            tls_ca=self.tls_ca,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
            secret_file=self.secret_file,
        )
