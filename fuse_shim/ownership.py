"""Credentials on the passthrough: who a new node belongs to, what a caller may do, and the
set-id bits a write clears.

The kernel checks permissions itself (the mount uses ``default_permissions``). What is left to
the daemon, which runs as root:

- a node a caller creates is given to the caller's uid and gid (the parent directory's gid when
  that is set-group-id), as a local file system would (`give_to_caller`);
- ``access``, reached only without ``default_permissions``, checks the caller's mode bits, not
  the daemon's (`may_access`); so does a create that finds the name already there
  (`open_existing`);
- a write or truncate by a caller without CAP_FSETID clears set-user-ID / set-group-ID, as the
  kernel does on a local file system (`clear_setid`, with the rule of `setid`): the kernel
  leaves that to the file system (HANDLE_KILLPRIV, and always for direct_io writes), and the
  daemon's own writes, as root, would keep the bits.
"""

from __future__ import annotations

import errno
import os
import stat

from burstctl.common.syscalls import proc_path
from burstctl.fuse_shim.setid import mode_after_write, writer_of
from burstctl.node.attribution import Caller


def give_to_caller(
    parent_fd: int, name: bytes, caller: Caller, fd: int | None = None, mode: int = 0
) -> None:
    """Makes the new node ``name`` in the directory ``parent_fd`` (open as ``fd`` if given)
    the caller's.

    ``mode``: what the node was created with; set-user/group-id bits that the change of owner
    cleared are put back, as if the caller had created it. Root's own nodes are left alone.
    """
    if caller.uid == 0 and caller.gid == 0:
        return
    gid = caller.gid
    parent_st = os.fstat(parent_fd)
    if parent_st.st_mode & stat.S_ISGID:
        gid = parent_st.st_gid
    if fd is not None:
        os.fchown(fd, caller.uid, gid)
    else:
        os.chown(name, caller.uid, gid, dir_fd=parent_fd, follow_symlinks=False)
    if mode & (stat.S_ISUID | stat.S_ISGID) and not stat.S_ISLNK(mode):
        if fd is not None:
            os.fchmod(fd, stat.S_IMODE(mode))
        else:
            os.chmod(name, stat.S_IMODE(mode), dir_fd=parent_fd)


def open_existing(caller: Caller, parent_fd: int, name: bytes, flags: int) -> int:
    """Opens the existing ``name`` in ``parent_fd`` as ``caller`` may (a create that found the
    name there: made behind the mount, or by another request in between); PermissionError if
    the caller may not."""
    # Truncated only once the caller is known to be allowed to write it.
    fd = os.open(name, flags & ~os.O_TRUNC | os.O_NOFOLLOW, dir_fd=parent_fd)
    try:
        access = flags & os.O_ACCMODE
        wanted = (os.R_OK if access != os.O_WRONLY else 0) | (
            os.W_OK if access != os.O_RDONLY or flags & os.O_TRUNC else 0
        )
        if not may_access(caller, os.fstat(fd), wanted):
            raise PermissionError(errno.EACCES, "permission denied", os.fsdecode(name))
        if flags & os.O_TRUNC:
            os.truncate(proc_path(fd), 0)  # O_RDONLY | O_TRUNC truncates too, on Linux
    except BaseException:
        os.close(fd)
        raise
    return fd


def clear_setid(fd: int, st: os.stat_result, caller: Caller, *, handle: bool = True) -> bool:
    """Clears the set-id bits of the regular file ``fd`` (status ``st``, set-id bits set) that
    a write by ``caller`` clears; whether it changed the mode. ``fd``: an open file
    (``handle``) or an O_PATH one."""
    mode = mode_after_write(st.st_mode, st.st_gid, writer_of(caller.pid, caller.gid))
    if mode is None:
        return False
    if handle:
        os.fchmod(fd, stat.S_IMODE(mode))
    else:
        os.chmod(proc_path(fd), stat.S_IMODE(mode))
    return True


def may_access(caller: Caller, st: os.stat_result, amode: int) -> bool:
    """Whether ``caller`` may access a node with status ``st`` as ``amode`` asks (access(2))."""
    if amode == os.F_OK:
        return True
    if caller.uid == 0:
        # root may do anything, but execute only what someone may execute (or a directory)
        return not (amode & os.X_OK and not st.st_mode & 0o111 and not stat.S_ISDIR(st.st_mode))
    if caller.uid == st.st_uid:
        bits = (st.st_mode >> 6) & 7
    elif caller.gid == st.st_gid or st.st_gid in groups_of(caller):
        bits = (st.st_mode >> 3) & 7
    else:
        bits = st.st_mode & 7
    return not amode & ~bits & 7


def groups_of(caller: Caller) -> set[int]:
    """The supplementary groups of the calling process (empty when it cannot be read)."""
    try:
        with open(f"/proc/{caller.pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except (OSError, ValueError):
        pass
    return set()
