"""The options both shims are configured with, and their command lines generated from them.

A shim's configuration is a frozen dataclass (`burstctl.fuse_shim.config.MountConfig`,
`burstctl.preload_shim.config.AgentConfig`) whose fields each carry, in their metadata, how the
command line spells them (`Cli`): flags, help text, how ``--help`` shows the default.
`config_params` generates a command's arguments and options from such a class, so a default or
a help text is written once, on its field.

The fields both shims have (the controller, its credentials, the fallback, the session timings,
attribution, the stage-out, logging) are spelled here once (`shared_field`); each shim declares
them in its own order and may change the help text. The stage-out's rules are here too: what
``--evict`` means (`evict_mode`, `check_evict`) and which ``--stage-out`` directory is refused
(`stage_out_dir`). `check_values` applies the checks every spelled field
gets (seconds are finite and >= 0, a choice is one of its choices), raising the shim's own
error type.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import click

from burstctl.client.options import (
    DEFAULT_ATTACH_TIMEOUT,
    DEFAULT_FALLBACK,
    DEFAULT_FALLBACK_GRACE,
)
from burstctl.common.channels import ChannelSecurity
from burstctl.common.units import parse_size
from burstctl.node.attribution import DEFAULT_ATTRIBUTION_TTL

logger = logging.getLogger(__name__)

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# What becomes of a file's copy on the burst buffer once it is safely on the PFS (--evict).
EVICT_MODES = ("after-copy", "keep")

CliKind = Literal[
    "argument", "text", "file", "choice", "flag", "switch", "seconds", "size", "multiple", "count"
]


@dataclass(frozen=True, slots=True)
class Cli:
    """How one configuration field is given on the command line.

    ``kind``: ``argument`` (a directory, positional), ``text``, ``file`` (a path), ``choice``
    (one of ``choices``), ``flag`` (on when given), ``switch`` (``--x/--no-x``), ``seconds``
    (a float >= 0), ``size`` (bytes, with units such as ``128KiB``), ``count`` (an integer
    >= 0) or ``multiple`` (repeatable). ``show_default``: True shows the field's default, a
    string says it in words, False shows nothing.
    """

    flags: tuple[str, ...] = ()
    help: str = ""
    kind: CliKind = "text"
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    envvar: str | None = None
    show_default: bool | str = True


def spelled(flags: tuple[str, ...] = (), help: str = "", **spelling: Any) -> dict[str, Cli]:
    """The metadata of a configuration field: its command-line spelling."""
    return {"cli": Cli(flags, help, **spelling)}


def cli_of(f: dataclasses.Field[Any]) -> Cli:
    """The command-line spelling of a configuration field."""
    spec = f.metadata.get("cli")
    if not isinstance(spec, Cli):
        raise TypeError(f"field {f.name} has no command-line spelling")
    return spec


def format_size(nbytes: int) -> str:
    """A size in the largest binary unit that divides it exactly (``1MiB``, ``0``)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


# ---------------------------------------------------------------------- the shared fields

_CONTROLLER_HELP = "Controller replica that allots the jobs' rates [env BURSTCTL_CONTROLLER]"

# name -> (default, spelling)
_SHARED: dict[str, tuple[Any, Cli]] = {
    "controller": (
        None,
        Cli(
            ("--controller",),
            _CONTROLLER_HELP + ".",
            metavar="HOST:PORT",
            envvar="BURSTCTL_CONTROLLER",
            show_default=False,
        ),
    ),
    "fallback": (
        DEFAULT_FALLBACK,
        Cli(
            ("--fallback",),
            "Rate when no controller renews a job's allocation: keep-last[:<rate>] keeps the"
            " last allotted rate, 0 included, and after --fallback-grace moves to the job's share"
            " of the controller's fallback budget (at most <rate>, 1MiB/s by default); a job"
            " that never got one waits at 0, then after --fallback-grace paces at <rate>;"
            " fixed:<rate> (e.g. fixed:100MiB/s); unthrottled.",
            metavar="MODE",
        ),
    ),
    "tls_ca": (
        None,
        Cli(
            ("--tls-ca",),
            "PEM CA bundle that signed the controller's certificate: talk TLS to it.",
            kind="file",
            metavar="FILE",
            show_default=False,
        ),
    ),
    "tls_cert": (
        None,
        Cli(
            ("--tls-cert",),
            "PEM client certificate shown to the controller (mutual TLS; with --tls-key).",
            kind="file",
            metavar="FILE",
            show_default=False,
        ),
    ),
    "tls_key": (
        None,
        Cli(
            ("--tls-key",),
            "PEM private key of --tls-cert.",
            kind="file",
            metavar="FILE",
            show_default=False,
        ),
    ),
    "secret_file": (
        None,
        Cli(
            ("--secret-file",),
            "File holding the controller's shared secret, sent on every call: the mount (or"
            " the agent) is then a trusted component that vouches for its callers' uids"
            " (docs/security.md).",
            kind="file",
            metavar="FILE",
            show_default=False,
        ),
    ),
    "quiet_gap": (
        0.05,
        Cli(
            ("--quiet-gap",),
            "A job's I/O phase ends after this long without a request (or at its last close).",
            kind="seconds",
            metavar="SECONDS",
        ),
    ),
    "session_idle": (
        10.0,
        Cli(
            ("--session-idle",),
            "A job's controller session is closed after this long without a request.",
            kind="seconds",
            metavar="SECONDS",
        ),
    ),
    "attach_timeout": (
        DEFAULT_ATTACH_TIMEOUT,
        Cli(
            ("--attach-timeout",),
            "How long a new job session waits for its first allocation before the fallback.",
            kind="seconds",
            metavar="SECONDS",
        ),
    ),
    "fallback_grace": (
        DEFAULT_FALLBACK_GRACE,
        Cli(
            ("--fallback-grace",),
            "keep-last: how long a job keeps its last allotted rate once its lease ran out with"
            " no controller, before it moves to its share of the controller's fallback budget.",
            kind="seconds",
            metavar="SECONDS",
        ),
    ),
    "attribution_ttl": (
        DEFAULT_ATTRIBUTION_TTL,
        Cli(
            ("--attribution-ttl",),
            "How long a pid's job is cached.",
            kind="seconds",
            metavar="SECONDS",
        ),
    ),
    "stage_out": (
        None,
        Cli(
            ("--stage-out",),
            "Copy every file the jobs write, once closed, to the same relative path under"
            " PFS_DIR (the parallel file system), paced by the job's drain stream.",
            metavar="PFS_DIR",
            show_default=False,
        ),
    ),
    "evict": (
        None,
        Cli(
            ("--evict",),
            "With --stage-out: after-copy frees a file's blocks on the buffer once its PFS copy"
            " is complete and fsynced (the file stays readable at its path, served from the"
            " PFS); keep keeps both copies.",
            kind="choice",
            choices=EVICT_MODES,
            metavar="after-copy|keep",
            show_default="after-copy with --stage-out",
        ),
    ),
    "log_level": (
        "INFO",
        Cli(("--log-level",), "Logging level.", kind="choice", choices=LOG_LEVELS),
    ),
}


def shared_field(name: str, **changes: Any) -> Any:
    """The field ``name`` that both shims' configurations have, with its default and its
    spelling (``changes``: the `Cli` attributes a shim spells differently, e.g. ``help``)."""
    default, spec = _SHARED[name]
    if changes:
        spec = dataclasses.replace(spec, **changes)
    return dataclasses.field(default=default, metadata={"cli": spec})


def controller_help(more: str) -> str:
    """The help text of ``--controller``, with what it means for one shim."""
    return _CONTROLLER_HELP + more


def check_values(config: Any, error: type[Exception]) -> None:
    """The checks every spelled field of ``config`` gets, as ``error`` naming the flag: a
    ``seconds`` field is a finite number >= 0, a ``choice`` one of its choices (or None, where
    None is the field's default: not given)."""
    for f in dataclasses.fields(config):
        spec = cli_of(f)
        value = getattr(config, f.name)
        flag = spec.flags[-1] if spec.flags else f.name.upper()
        if spec.kind == "seconds" and not (
            isinstance(value, int | float) and math.isfinite(value) and value >= 0
        ):
            raise error(f"{flag} must be a finite number of seconds >= 0, got {value!r}")
        unset = value is None and f.default is None
        if spec.kind == "choice" and value not in spec.choices and not unset:
            raise error(f"{flag} must be one of {', '.join(spec.choices)}, got {value!r}")


def evict_mode(stage_out: Path | None, evict: str | None) -> str | None:
    """What ``--evict`` means: None without --stage-out, else after-copy (the default) or
    keep."""
    if stage_out is None:
        return None
    return evict or "after-copy"


def check_evict(stage_out: Path | None, evict: str | None, error: type[Exception]) -> None:
    """``--evict`` is refused without ``--stage-out`` (there is nothing to evict to)."""
    if evict is not None and stage_out is None:
        raise error("--evict needs --stage-out PFS_DIR (there is nothing to evict to)")


def stage_out_dir(pfs: Path, buffers: list[tuple[str, Path]], error: type[Exception]) -> Path:
    """The ``--stage-out`` directory, absolute, once it is known not to loop (``error``).

    ``buffers``: (name, real path) of the directories the drain reads (a mount's BACKING and
    MOUNTPOINT, an agent's --paths). A PFS directory inside one of them would have the drain
    copy files into the buffer it drains; one of them inside the PFS directory would have the
    PFS copies land on the buffer. An unwritable directory is not refused: the drain reports
    why it cannot copy and retries (docs/fuse.md).
    """
    real = Path(os.path.realpath(pfs))
    if not real.exists():
        raise error(f"--stage-out {pfs}: no such directory")
    if not real.is_dir():
        raise error(f"--stage-out {pfs} is not a directory")
    for name, other in buffers:
        if real == other or real.is_relative_to(other):
            raise error(
                f"--stage-out {real} is {'' if real == other else 'inside '}{name} {other}: "
                "the drain would copy the buffer into itself"
            )
    for name, other in buffers:
        if other.is_relative_to(real):
            raise error(
                f"--stage-out {real} contains {name} {other}: the PFS copies would land on "
                "the buffer they drain"
            )
    if not os.access(real, os.W_OK | os.X_OK):
        logger.warning(
            "--stage-out %s is not writable now: files are kept on the buffer until it is",
            real,
        )
    return real


def channel_security(config: Any) -> ChannelSecurity:
    """The credentials of a shim's channel to the controller, from its shared TLS and secret
    fields (ValueError if unusable)."""
    return ChannelSecurity.load(
        tls_ca=config.tls_ca,
        tls_cert=config.tls_cert,
        tls_key=config.tls_key,
        secret_file=config.secret_file,
    )


# ---------------------------------------------------------------------- the command line


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def config_params(config_class: type) -> list[click.Parameter]:
    """The arguments and options of a command, generated from the fields of a configuration
    dataclass whose metadata spells them (`Cli`): names, defaults, help."""
    params: list[click.Parameter] = []
    for f in dataclasses.fields(config_class):
        spec = cli_of(f)
        if spec.kind == "argument":
            path = click.Path(file_okay=False, path_type=Path)
            params.append(click.Argument([f.name], type=path))
            continue
        default = None if f.default is dataclasses.MISSING else f.default
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
                [*spec.flags, f.name],
                default=default,
                show_default=show_default,
                help=help_text,
                metavar=spec.metavar,
                envvar=spec.envvar,
                **options,
            )
        )
    return params
