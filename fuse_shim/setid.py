"""The kernel's rule for clearing set-user-ID / set-group-ID bits when a file is written.

A local file system clears them itself when an unprivileged process writes or truncates a
file (Linux ``setattr_should_drop_suidgid`` in ``fs/attr.c``, called by ``file_remove_privs``
on write and by ``do_truncate``). Through the mount, with direct I/O (``--direct-io writes``,
the default), the kernel leaves that to the daemon, whose ``pwrite`` runs as root and so
clears nothing: a write by a non-owner would keep a file set-user-ID.
`mode_after_write` is that rule, for the daemon to apply with the writer's credentials;
`writer_of` reads those credentials from ``/proc``.

The rule, for a regular file only:

- S_ISUID is always dropped;
- S_ISGID is dropped when S_IXGRP is set too, or when the writer is not in the file's group;
- nothing is dropped when the writer has CAP_FSETID.

Pure and dependency-free: no other burstctl module, nothing from the binding.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass

CAP_FSETID = 4  # linux/capability.h


@dataclass(frozen=True)
class Writer:
    """What the rule needs to know about the process that writes.

    ``groups``: the groups the writer is in for permission checks, its fsgid included.
    """

    has_fsetid: bool
    groups: frozenset[int]


def mode_after_write(mode: int, file_gid: int, writer: Writer) -> int | None:
    """The permission bits a file of ``st_mode`` ``mode`` (file type bits included) and
    group ``file_gid`` has after ``writer`` wrote or truncated it, for ``chmod``; ``None``
    when nothing changes (no bit to drop, not a regular file, or the writer has CAP_FSETID).
    """
    if not stat.S_ISREG(mode) or writer.has_fsetid:
        return None
    kill = 0
    if mode & stat.S_ISUID:
        kill |= stat.S_ISUID
    if mode & stat.S_ISGID and (mode & stat.S_IXGRP or file_gid not in writer.groups):
        kill |= stat.S_ISGID
    if not kill:
        return None
    return stat.S_IMODE(mode) & ~kill


def writer_of(pid: int, fsgid: int) -> Writer:
    """The credentials of process (or thread) ``pid``, whose request carried ``fsgid``.

    Reads ``/proc/<pid>/status``: ``CapEff`` (bit `CAP_FSETID`) and ``Groups``. Conservative
    when that cannot be read (pid 0 — a request from the kernel or from a pid namespace the
    daemon cannot see —, a process already gone, a malformed line): no CAP_FSETID and only
    ``fsgid``, so bits are dropped rather than kept.
    """
    unprivileged = Writer(has_fsetid=False, groups=frozenset((fsgid,)))
    if pid <= 0:
        return unprivileged
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            status = f.read()
    except OSError:
        return unprivileged
    capabilities: int | None = None
    groups: set[int] | None = None
    try:
        for line in status.splitlines():
            key, _, value = line.partition(":")
            if key == "CapEff":
                capabilities = int(value.strip(), 16)
            elif key == "Groups":
                groups = {int(g) for g in value.split()}
    except ValueError:
        return unprivileged
    if capabilities is None or groups is None:
        return unprivileged
    return Writer(
        has_fsetid=bool(capabilities >> CAP_FSETID & 1),
        groups=frozenset(groups | {fsgid}),
    )
