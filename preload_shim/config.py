"""The node agent's configuration: `AgentConfig`, the one owner of every ``burstctl agent``
option (docs/preload.md, "The node agent").

Options the agent shares with the mount (the controller, its credentials, the fallback, the
session timings, attribution, logging) take their spelling, default and help text from
`burstctl.node.options`, where each is written once; ``burstctl agent`` generates its options
from these fields as ``burstctl mount`` does (`burstctl.node.options.config_params`).
`AgentConfig` checks its values when it is built (`AgentError`, worded for the command line,
naming the flag).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from burstctl.client.fallback import Fallback
from burstctl.common.channels import ChannelSecurity
from burstctl.node.options import (
    channel_security,
    check_evict,
    check_values,
    controller_help,
    evict_mode,
    shared_field,
    spelled,
    stage_out_dir,
)

# Where the agent listens, and where `burstctl exec` and the library look, by default.
DEFAULT_SOCKET = "/run/burstctl/agent.sock"
SOCKET_VAR = "BURSTCTL_AGENT_SOCKET"
PATHS_VAR = "BURSTCTL_PRELOAD_PATHS"
DEAD_AFTER_VAR = "BURSTCTL_PRELOAD_DEAD_AFTER"
# Seconds between two ticks: heartbeat, counters to the controller, waiters (--tick).
DEFAULT_TICK = 0.05


class AgentError(Exception):
    """An agent that cannot start, with a message for the user naming the flag."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything ``burstctl agent`` is given; docs/preload.md says what each does."""

    controller: str | None = shared_field("controller", help=controller_help("; required."))
    paths: tuple[str, ...] = field(
        default=(),
        metadata=spelled(
            ("--paths",),
            "The burst-buffer directories whose files the library paces, comma-separated"
            " absolute paths (e.g. /bb,/bb2); everything else passes straight through.",
            metavar="DIR[,DIR...]",
            show_default=False,
        ),
    )
    socket: Path = field(
        default=Path(DEFAULT_SOCKET),
        metadata=spelled(
            ("--socket",),
            "The agent's Unix socket (mode 0666 in a 0755 directory, created if missing);"
            f" the library finds it in {SOCKET_VAR}.",
            kind="file",
            metavar="PATH",
        ),
    )
    fallback: str = shared_field("fallback")
    tls_ca: Path | None = shared_field("tls_ca")
    tls_cert: Path | None = shared_field("tls_cert")
    tls_key: Path | None = shared_field("tls_key")
    secret_file: Path | None = shared_field("secret_file")
    quiet_gap: float = shared_field("quiet_gap")
    session_idle: float = shared_field("session_idle")
    attach_timeout: float = shared_field("attach_timeout")
    fallback_grace: float = shared_field("fallback_grace")
    attribution_ttl: float = shared_field("attribution_ttl")
    tick: float = field(
        default=DEFAULT_TICK,
        metadata=spelled(
            ("--tick",),
            "Seconds between two ticks: each beats every page's heartbeat and books the bytes"
            " its processes asked for on the job's session.",
            kind="seconds",
            metavar="SECONDS",
        ),
    )
    stage_out: Path | None = shared_field(
        "stage_out",
        help="Copy every file the jobs' processes write under --paths, once closed, to the same"
        " relative path under PFS_DIR (the parallel file system; with several --paths, under"
        " PFS_DIR/<the path's last name>), paced by the job's drain stream"
        ' (docs/preload.md, "Capacity and stage-out").',
    )
    evict: str | None = shared_field("evict")
    log_level: str = shared_field("log_level")

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
        self._check_stage_out()
        if not self.socket.is_absolute():
            raise AgentError(f"--socket: {str(self.socket)!r} is not an absolute path")
        check_values(self, AgentError)
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

    def _check_stage_out(self) -> None:
        """--stage-out: an existing directory that neither holds nor is inside a --paths
        directory, made absolute; with several paths, their last names differ (each drains
        to its own subdirectory of it). --evict needs it."""
        check_evict(self.stage_out, self.evict, AgentError)
        if self.stage_out is None:
            return
        buffers = [("--paths", Path(os.path.realpath(path))) for path in self.paths]
        object.__setattr__(
            self, "stage_out", stage_out_dir(Path(self.stage_out), buffers, AgentError)
        )
        names = [os.path.basename(os.path.normpath(path)) for path in self.paths]
        if len(self.paths) > 1 and len(set(names)) != len(names):
            raise AgentError(
                "--stage-out with several --paths drains each to PFS_DIR/<its last name>:"
                f" the last names of {', '.join(self.paths)} must differ"
            )

    @property
    def evict_mode(self) -> str | None:
        """What ``--evict`` means here: None without --stage-out, else after-copy or keep."""
        return evict_mode(self.stage_out, self.evict)

    def pfs_dir(self, path: str) -> Path | None:
        """Where the files under the --paths directory ``path`` are staged out to."""
        if self.stage_out is None:
            return None
        if len(self.paths) == 1:
            return self.stage_out
        return self.stage_out / os.path.basename(os.path.normpath(path))

    # What the pacer also reads (`burstctl.node.sessions.PacingConfig`): the library's
    # metadata calls draw no bytes (they are paced on the page's metadata supply).
    @property
    def metadata_cost(self) -> int:
        return 0

    def channel_security(self) -> ChannelSecurity:
        """The credentials of the agent's channel to the controller (ValueError if unusable)."""
        return channel_security(self)
