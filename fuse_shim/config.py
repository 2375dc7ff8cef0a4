"""The mount's configuration: `MountConfig`, the one owner of every ``burstctl mount`` option.

Each field carries its default and, in its metadata, how the command line spells it: its
flags, its help text and how ``--help`` shows its default (`burstctl.node.options.Cli`).
``burstctl mount`` generates its arguments and options from these fields, so a default or a
help text is written once: here, or for the options both shims have, in
`burstctl.node.options`. `MountConfig` checks its values when it is built (`MountError`, worded
for the command line); what needs the system (the directories, libfuse) is checked by
`burstctl.fuse_shim.mount`.

The constants the mount's modules share live here too, so imports go one way: `config` is
imported by `fs`, `mount` and the stage-out, and imports none of them.
"""

from __future__ import annotations

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
    format_size,
    shared_field,
    spelled,
)

# Which opens bypass the kernel's page cache (`fs.PassthroughFS.direct_io_for`).
DIRECT_IO_MODES = ("writes", "all", "none")
LIBFUSE_CHOICES = ("auto", "2", "3")
FUSE2_MAX_WRITE = 128 * 1024  # the most a FUSE 2 write request carries (its default there)
MAX_READ_AHEAD = 64 << 20
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


class MountError(Exception):
    """A mount that cannot start, with a message for the user."""


@dataclass(frozen=True, slots=True)
class MountConfig:
    """Everything ``burstctl mount`` is given; docs/fuse.md says why the defaults are these."""

    backing: Path = field(metadata=spelled(kind="argument"))
    mountpoint: Path = field(metadata=spelled(kind="argument"))
    controller: str | None = shared_field(
        "controller",
        help=controller_help(". Without one the mount is a plain passthrough (unthrottled)."),
    )
    fallback: str = shared_field("fallback")
    tls_ca: Path | None = shared_field("tls_ca")
    tls_cert: Path | None = shared_field("tls_cert")
    tls_key: Path | None = shared_field("tls_key")
    secret_file: Path | None = shared_field("secret_file")
    allow_other: bool = field(
        default=False,
        metadata=spelled(
            ("--allow-other",),
            "Let users other than the one who mounts use the mount (kernel permission checks"
            " apply; a non-root user needs user_allow_other in /etc/fuse.conf).",
            kind="flag",
            show_default=False,
        ),
    )
    max_write: int | None = field(
        default=None,
        metadata=spelled(
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
        metadata=spelled(
            ("--read-ahead",),
            "The kernel's read-ahead window for the mount (its read_ahead_kb; needs root, else"
            " a warning and the kernel's 128KiB). 0: leave the kernel's default.",
            kind="size",
            metavar="SIZE",
        ),
    )
    direct_io: str = field(
        default="writes",
        metadata=spelled(
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
        metadata=spelled(
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
        metadata=spelled(
            ("--big-writes/--no-big-writes",),
            "FUSE 2: writes of up to --max-write per request instead of 4KiB.",
            kind="switch",
        ),
    )
    foreground: bool = field(
        default=False,
        metadata=spelled(
            ("-f", "--foreground"),
            "Stay in the foreground (default: daemonize).",
            kind="flag",
            show_default=False,
        ),
    )
    attr_timeout: float = field(
        default=DEFAULT_CACHE_TIMEOUT,
        metadata=spelled(
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
        metadata=spelled(
            ("--entry-timeout",),
            "How long the kernel may cache a name it looked up (as --attr-timeout).",
            kind="seconds",
            metavar="SECONDS",
        ),
    )
    negative_timeout: float = field(
        default=DEFAULT_CACHE_TIMEOUT,
        metadata=spelled(
            ("--negative-timeout",),
            "How long the kernel may remember that a name does not exist (a file created in "
            "BACKING behind the mount may stay invisible this long; 0: never remembered).",
            kind="seconds",
            metavar="SECONDS",
        ),
    )
    max_handles: int | None = field(
        default=None,
        metadata=spelled(
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
    quiet_gap: float = shared_field("quiet_gap")
    session_idle: float = shared_field("session_idle")
    metadata_cost: int = field(
        default=0,
        metadata=spelled(
            ("--metadata-cost",),
            "Bytes each metadata operation (stat, open, mkdir, ...) acquires besides its one"
            " operation of its job's metadata limit; 0 = no bytes.",
            kind="size",
            metavar="SIZE",
        ),
    )
    attach_timeout: float = shared_field("attach_timeout")
    fallback_grace: float = shared_field("fallback_grace")
    attribution_ttl: float = shared_field("attribution_ttl")
    fuse_options: tuple[str, ...] = field(
        default=(),
        metadata=spelled(
            ("-o",),
            "Extra libfuse mount options, e.g. -o nonempty (writeback_cache is refused).",
            kind="multiple",
            metavar="OPT[,OPT...]",
            show_default=False,
        ),
    )
    stage_out: Path | None = shared_field(
        "stage_out",
        help="Copy every file written through the mount, once closed, to the same relative path"
        " under PFS_DIR (the parallel file system), paced by the job's drain stream,"
        " with its metadata, holes and hard links; directories and symlinks made through"
        ' the mount too (docs/fuse.md, "Stage-out to the parallel file system").',
    )
    evict: str | None = shared_field("evict")
    journal: str | None = field(
        default=None,
        metadata=spelled(
            ("--journal",),
            "Where the mount records the files it tracks for the controller and the stage-out,"
            " so that a restart resumes without scanning all of BACKING; none: no journal,"
            ' every start scans (docs/fuse.md, "Crash safety").',
            metavar="FILE|none",
            show_default="$XDG_STATE_HOME/burstctl/stageout/<BACKING's name>-<hash>.journal",
        ),
    )
    log_file: Path | None = field(
        default=None,
        metadata=spelled(
            ("--log-file",),
            "Append logs to this file (a daemonized mount has no terminal).",
            kind="file",
            metavar="FILE",
            show_default=False,
        ),
    )
    log_level: str = shared_field("log_level")

    def __post_init__(self) -> None:
        if self.stage_out is not None and not isinstance(self.stage_out, Path):
            # A directory: given as text on the command line (the "file" kind takes files).
            object.__setattr__(self, "stage_out", Path(self.stage_out))
        check_values(self, MountError)
        if self.max_write is not None and self.max_write <= 0:
            raise MountError(f"--max-write must be > 0 bytes, got {self.max_write}")
        if not 0 <= self.read_ahead <= MAX_READ_AHEAD or self.read_ahead % 4096:
            raise MountError(
                f"--read-ahead must be a multiple of 4KiB in [0, {format_size(MAX_READ_AHEAD)}], "
                f"got {self.read_ahead} bytes"
            )
        if self.max_handles is not None and self.max_handles < 16:
            raise MountError(f"--max-handles must be >= 16, got {self.max_handles}")
        check_evict(self.stage_out, self.evict, MountError)
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
        return evict_mode(self.stage_out, self.evict)

    def channel_security(self) -> ChannelSecurity:
        """The credentials of the mount's channel to the controller (ValueError if unusable)."""
        return channel_security(self)

    def fuse_option_items(self) -> list[tuple[str, str | bool]]:
        """The ``-o`` options as (key, value) pairs; a bare key has the value True."""
        items: list[tuple[str, str | bool]] = []
        for raw in self.fuse_options:
            for item in filter(None, (part.strip() for part in raw.split(","))):
                key, sep, value = item.partition("=")
                items.append((key, value if sep else True))
        return items
