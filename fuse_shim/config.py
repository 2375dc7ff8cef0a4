"""The mount's configuration: `MountConfig`, the one owner of every ``burstctl mount`` option.

Each field carries its default and, in its metadata, how the command line spells it: its
flags, its help text and how ``--help`` shows its default (`Cli`). ``burstctl mount`` generates
its arguments and options from these fields, so a default or a help text is written once, here.
`MountConfig` checks its values when it is built (`MountError`, worded for the command line);
what needs the system (the directories, libfuse) is checked by `burstctl.fuse_shim.mount`.

The constants the mount's modules share live here too, so imports go one way: `config` is
imported by `attribution`, `pacing`, `fs` and `mount`, and imports none of them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from burstctl.client.fallback import Fallback
from burstctl.client.options import (
    DEFAULT_ATTACH_TIMEOUT,
    DEFAULT_FALLBACK,
    DEFAULT_FALLBACK_GRACE,
)
from burstctl.common.channels import ChannelSecurity

# Which opens bypass the kernel's page cache (`fs.PassthroughFS.direct_io_for`).
DIRECT_IO_MODES = ("writes", "all", "none")
LIBFUSE_CHOICES = ("auto", "2", "3")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# What becomes of a file's copy on the burst buffer once it is safely on the PFS (--evict).
EVICT_MODES = ("after-copy", "keep")
FUSE2_MAX_WRITE = 128 * 1024  # the most a FUSE 2 write request carries (its default there)
MAX_READ_AHEAD = 64 << 20
# How long a pid's job is cached by the `attribution.Attributor`.
DEFAULT_ATTRIBUTION_TTL = 5.0
# How long the kernel caches attributes and names by default (docs/fuse.md, "Caching").
DEFAULT_CACHE_TIMEOUT = 1.0
# Options a user may not pass with -o: each would break attribution or our assumptions.
REFUSED_FUSE_OPTIONS = {
    "writeback_cache": "buffered writes would reach the mount from kernel flusher threads and "
    "could not be attributed to the writer",
    "nothreads": "a paced request would hold up every other job's requests",
}
# Options of libfuse's path-based API, which the mount does not use: what to use instead.
PATH_API_OPTIONS = {
    "attr_timeout": "--attr-timeout",
    "entry_timeout": "--entry-timeout",
    "negative_timeout": "--negative-timeout",
    "ac_attr_timeout": "--attr-timeout",
    "direct_io": "--direct-io all",
    "kernel_cache": "--direct-io none",
    "auto_cache": "--direct-io none",
    "use_ino": "nothing (inode numbers are always the backing files')",
    "readdir_ino": "nothing (inode numbers are always the backing files')",
    "hard_remove": "nothing (an unlinked open file is never renamed)",
    "nopath": "nothing",
    "umask": "chmod on BACKING",
    "uid": "chown on BACKING",
    "gid": "chown on BACKING",
    "intr": "nothing",
    "intr_signal": "nothing",
    "modules": "nothing",
}

CliKind = Literal[
    "argument", "text", "file", "choice", "flag", "switch", "seconds", "size", "multiple", "count"
]


class MountError(Exception):
    """A mount that cannot start, with a message for the user."""


@dataclass(frozen=True, slots=True)
class Cli:
    """How one `MountConfig` field is given on the command line.

    ``kind``: ``argument`` (a directory, positional), ``text``, ``file`` (a path), ``choice``
    (one of ``choices``), ``flag`` (on when given), ``switch`` (``--x/--no-x``), ``seconds``
    (a float >= 0), ``size`` (bytes, with units such as ``128KiB``) or ``multiple``
    (repeatable). ``show_default``: True shows the field's default, a string says it in words,
    False shows nothing.
    """

    flags: tuple[str, ...] = ()
    help: str = ""
    kind: CliKind = "text"
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    envvar: str | None = None
    show_default: bool | str = True


def _cli(flags: tuple[str, ...] = (), help: str = "", **spelling: Any) -> dict[str, Cli]:
    """The metadata of a `MountConfig` field: its command-line spelling."""
    return {"cli": Cli(flags, help, **spelling)}


def cli_of(f: dataclasses.Field[Any]) -> Cli:
    """The command-line spelling of a `MountConfig` field."""
    spec = f.metadata.get("cli")
    if not isinstance(spec, Cli):
        raise TypeError(f"MountConfig.{f.name} has no command-line spelling")
    return spec


def format_size(nbytes: int) -> str:
    """A size in the largest binary unit that divides it exactly (``1MiB``, ``0``)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return str(nbytes)


@dataclass(frozen=True, slots=True)
class MountConfig:
    """Everything ``burstctl mount`` is given; docs/fuse.md says why the defaults are these."""

    backing: Path = field(metadata=_cli(kind="argument"))
    mountpoint: Path = field(metadata=_cli(kind="argument"))
    controller: str | None = field(
        default=None,
        metadata=_cli(
            ("--controller",),
            "Controller replica that allots the jobs' rates [env BURSTCTL_CONTROLLER]."
            " Without one the mount is a plain passthrough (unthrottled).",
            metavar="HOST:PORT",
            envvar="BURSTCTL_CONTROLLER",
            show_default=False,
        ),
    )
    fallback: str = field(
        default=DEFAULT_FALLBACK,
        metadata=_cli(
            ("--fallback",),
            "Rate when no controller renews a job's allocation: keep-last[:<rate>] keeps the"
            " last allotted rate, 0 included (the <rate>, 1MiB/s by default, for a job that never"
            " got one, or after --fallback-grace at 0); fixed:<rate> (e.g. fixed:100MiB/s);"
            " unthrottled.",
            metavar="MODE",
        ),
    )
    tls_ca: Path | None = field(
        default=None,
        metadata=_cli(
            ("--tls-ca",),
            "PEM CA bundle that signed the controller's certificate: talk TLS to it.",
            kind="file",
            metavar="FILE",
            show_default=False,
        ),
    )
    tls_cert: Path | None = field(
        default=None,
        metadata=_cli(
            ("--tls-cert",),
            "PEM client certificate shown to the controller (mutual TLS; with --tls-key).",
            kind="file",
            metavar="FILE",
            show_default=False,
        ),
    )
    tls_key: Path | None = field(
        default=None,
        metadata=_cli(
            ("--tls-key",),
            "PEM private key of --tls-cert.",
            kind="file",
            metavar="FILE",
            show_default=False,
        ),
    )
    secret_file: Path | None = field(
        default=None,
        metadata=_cli(
            ("--secret-file",),
            "File holding the controller's shared secret, sent on every call: the mount (or"
            " the agent) is then a trusted component that vouches for its callers' uids"
            " (docs/security.md).",
            kind="file",
            metavar="FILE",
            show_default=False,
        ),
    )
    allow_other: bool = field(
        default=False,
        metadata=_cli(
            ("--allow-other",),
            "Let users other than the one who mounts use the mount (kernel permission checks"
            " apply; a non-root user needs user_allow_other in /etc/fuse.conf).",
            kind="flag",
            show_default=False,
        ),
    )
    max_write: int | None = field(
        default=None,
        metadata=_cli(
            ("--max-write",),
            "Largest write request the kernel sends.",
            kind="size",
            metavar="SIZE",
            show_default=f"{format_size(FUSE2_MAX_WRITE)} on libfuse 2, its ceiling;"
            " 1MiB on libfuse 3",
        ),
    )
    read_ahead: int = field(
        default=1 << 20,  # libfuse 3's largest request
        metadata=_cli(
            ("--read-ahead",),
            "The kernel's read-ahead window for the mount (its read_ahead_kb; needs root, else"
            " a warning and the kernel's 128KiB). 0: leave the kernel's default.",
            kind="size",
            metavar="SIZE",
        ),
    )
    direct_io: str = field(
        default="writes",
        metadata=_cli(
            ("--direct-io",),
            "Which files bypass the kernel's page cache, so every byte goes to the daemon"
            " once: writes: files opened for writing; all: every file; none: no file."
            " Write-only files go direct everywhere; a file opened for reading could be mapped"
            " shared, so it goes direct only where the kernel allows that (libfuse 3.14 on"
            " Linux >= 6.6). -o direct_io forces every file.",
            kind="choice",
            choices=DIRECT_IO_MODES,
        ),
    )
    libfuse: str = field(
        default="auto",
        metadata=_cli(
            ("--libfuse",),
            "Which libfuse to use; auto: 3 where it can mount (root, or fusermount3 installed),"
            " else 2. libfuse 3 sends reads and writes of up to 1MiB per request (2: 128KiB)."
            " FUSE_LIBRARY_PATH, when set, wins.",
            kind="choice",
            choices=LIBFUSE_CHOICES,
            envvar="BURSTCTL_LIBFUSE",
        ),
    )
    big_writes: bool = field(
        default=True,
        metadata=_cli(
            ("--big-writes/--no-big-writes",),
            "FUSE 2: writes of up to --max-write per request instead of 4KiB.",
            kind="switch",
        ),
    )
    foreground: bool = field(
        default=False,
        metadata=_cli(
            ("-f", "--foreground"),
            "Stay in the foreground (default: daemonize).",
            kind="flag",
            show_default=False,
        ),
    )
    attr_timeout: float = field(
        default=DEFAULT_CACHE_TIMEOUT,
        metadata=_cli(
            ("--attr-timeout",),
            "How long the kernel may cache a file's attributes without asking the mount "
            "(a stat of a cached file never reaches the daemon). Changes made through the "
            "mount are always seen at once; changes made to BACKING behind it may be seen "
            "this late.",
            kind="seconds",
            metavar="SECONDS",
        ),
    )
    entry_timeout: float = field(
        default=DEFAULT_CACHE_TIMEOUT,
        metadata=_cli(
            ("--entry-timeout",),
            "How long the kernel may cache a name it looked up (as --attr-timeout).",
            kind="seconds",
            metavar="SECONDS",
        ),
    )
    negative_timeout: float = field(
        default=DEFAULT_CACHE_TIMEOUT,
        metadata=_cli(
            ("--negative-timeout",),
            "How long the kernel may remember that a name does not exist (a file created in "
            "BACKING behind the mount may stay invisible this long; 0: never remembered).",
            kind="seconds",
            metavar="SECONDS",
        ),
    )
    max_handles: int | None = field(
        default=None,
        metadata=_cli(
            ("--max-handles",),
            "How many backing inodes the mount keeps open (one O_PATH handle per inode the "
            "kernel remembers); past it the kernel is asked to drop its least recently used "
            "names. Default: the open-file limit (raised to its hard limit at start) less "
            "4096 for open files.",
            kind="count",
            metavar="N",
            show_default="the open-file limit less 4096",
        ),
    )
    quiet_gap: float = field(
        default=0.05,
        metadata=_cli(
            ("--quiet-gap",),
            "A job's I/O phase ends after this long without a request (or at its last close).",
            kind="seconds",
            metavar="SECONDS",
        ),
    )
    session_idle: float = field(
        default=10.0,
        metadata=_cli(
            ("--session-idle",),
            "A job's controller session is closed after this long without a request.",
            kind="seconds",
            metavar="SECONDS",
        ),
    )
    metadata_cost: int = field(
        default=0,
        metadata=_cli(
            ("--metadata-cost",),
            "Bytes each metadata operation (stat, open, mkdir, ...) acquires; 0 = not paced.",
            kind="size",
            metavar="SIZE",
        ),
    )
    attach_timeout: float = field(
        default=DEFAULT_ATTACH_TIMEOUT,
        metadata=_cli(
            ("--attach-timeout",),
            "How long a new job session waits for its first allocation before the fallback.",
            kind="seconds",
            metavar="SECONDS",
        ),
    )
    fallback_grace: float = field(
        default=DEFAULT_FALLBACK_GRACE,
        metadata=_cli(
            ("--fallback-grace",),
            "keep-last: how long a job allotted 0 stays at 0 once its lease ran out with no"
            " controller, before the fallback's conservative rate applies.",
            kind="seconds",
            metavar="SECONDS",
        ),
    )
    attribution_ttl: float = field(
        default=DEFAULT_ATTRIBUTION_TTL,
        metadata=_cli(
            ("--attribution-ttl",),
            "How long a pid's job is cached.",
            kind="seconds",
            metavar="SECONDS",
        ),
    )
    fuse_options: tuple[str, ...] = field(
        default=(),
        metadata=_cli(
            ("-o",),
            "Extra libfuse mount options, e.g. -o nonempty (writeback_cache is refused).",
            kind="multiple",
            metavar="OPT[,OPT...]",
            show_default=False,
        ),
    )
    stage_out: Path | None = field(
        default=None,
        metadata=_cli(
            ("--stage-out",),
            "Copy every file written through the mount, once closed, to the same relative path"
            " under PFS_DIR (the parallel file system), paced by the job's drain stream"
            ' (docs/fuse.md, "Stage-out to the parallel file system").',
            metavar="PFS_DIR",
            show_default=False,
        ),
    )
    evict: str | None = field(
        default=None,
        metadata=_cli(
            ("--evict",),
            "With --stage-out: after-copy frees a file's blocks on the buffer once its PFS copy"
            " is complete and fsynced (the file stays readable through the mount, served from"
            " the PFS); keep keeps both copies.",
            kind="choice",
            choices=EVICT_MODES,
            metavar="after-copy|keep",
            show_default="after-copy with --stage-out",
        ),
    )
    log_file: Path | None = field(
        default=None,
        metadata=_cli(
            ("--log-file",),
            "Append logs to this file (a daemonized mount has no terminal).",
            kind="file",
            metavar="FILE",
            show_default=False,
        ),
    )
    log_level: str = field(
        default="INFO",
        metadata=_cli(("--log-level",), "Logging level.", kind="choice", choices=LOG_LEVELS),
    )

    def __post_init__(self) -> None:
        if self.stage_out is not None and not isinstance(self.stage_out, Path):
            # A directory: given as text on the command line (the "file" kind takes files).
            object.__setattr__(self, "stage_out", Path(self.stage_out))
        for f in dataclasses.fields(self):
            spec = cli_of(f)
            value = getattr(self, f.name)
            flag = spec.flags[-1] if spec.flags else f.name.upper()
            if spec.kind == "seconds" and not (
                isinstance(value, int | float) and math.isfinite(value) and value >= 0
            ):
                raise MountError(f"{flag} must be a finite number of seconds >= 0, got {value!r}")
            if spec.kind == "choice" and value not in spec.choices and value is not None:
                raise MountError(f"{flag} must be one of {', '.join(spec.choices)}, got {value!r}")
        if self.max_write is not None and self.max_write <= 0:
            raise MountError(f"--max-write must be > 0 bytes, got {self.max_write}")
        if not 0 <= self.read_ahead <= MAX_READ_AHEAD or self.read_ahead % 4096:
            raise MountError(
                f"--read-ahead must be a multiple of 4KiB in [0, {format_size(MAX_READ_AHEAD)}], "
                f"got {self.read_ahead} bytes"
            )
        if self.max_handles is not None and self.max_handles < 16:
            raise MountError(f"--max-handles must be >= 16, got {self.max_handles}")
        if self.evict is not None and self.stage_out is None:
            raise MountError("--evict needs --stage-out PFS_DIR (there is nothing to evict to)")
        if self.metadata_cost < 0:
            raise MountError(f"--metadata-cost must be >= 0 bytes, got {self.metadata_cost}")
        try:
            Fallback.parse(self.fallback)
            self.channel_security()
        except ValueError as err:
            raise MountError(str(err)) from None
        for key, _ in self.fuse_option_items():
            if key in REFUSED_FUSE_OPTIONS:
                raise MountError(f"-o {key} is not allowed: {REFUSED_FUSE_OPTIONS[key]}")
            if key in PATH_API_OPTIONS:
                raise MountError(
                    f"-o {key} is an option of libfuse's path-based API, which the mount does "
                    f"not use; use {PATH_API_OPTIONS[key]}"
                )

    @property
    def evict_mode(self) -> str | None:
        """What ``--evict`` means here: None without --stage-out, else after-copy or keep."""
        if self.stage_out is None:
            return None
        return self.evict or "after-copy"

    def channel_security(self) -> ChannelSecurity:
        """The credentials of the mount's channel to the controller (ValueError if unusable)."""
        return ChannelSecurity.load(
            tls_ca=self.tls_ca,
            tls_cert=self.tls_cert,
            tls_key=self.tls_key,
            secret_file=self.secret_file,
        )

    def fuse_option_items(self) -> list[tuple[str, str | bool]]:
        """The ``-o`` options as (key, value) pairs; a bare key has the value True."""
        items: list[tuple[str, str | bool]] = []
        for raw in self.fuse_options:
            for item in filter(None, (part.strip() for part in raw.split(","))):
                key, sep, value = item.partition("=")
                items.append((key, value if sep else True))
        return items
