"""Credentials on the passthrough: who a new node belongs to, and what ``access`` allows.

The kernel checks permissions itself (the mount uses ``default_permissions``). What is left to
the daemon: when it runs as root, a node a caller creates is given to the caller's uid and gid
(the parent directory's gid when that is set-group-id), as a local file system would
(`give_to_caller`); and ``access``, reached only without ``default_permissions``, checks the
caller's mode bits, not the daemon's (`may_access`).
"""

from __future__ import annotations

import os
import stat

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
