"""One file's copy from the burst buffer to the parallel file system, and back.

`copy_to_pfs` copies ``BACKING/rel`` to ``PFS_DIR/rel``: into a temporary
``.NAME.burstctl-part-XXXX`` (`stageout_marks.TEMP_MARK`) in the same directory, its data
extents only (`stageout_extents.copy_data`: a sparse file stays sparse), in pieces each paced
by the job's drain stream, then the original's size, owner (as root), xattrs, mode and times
(`stageout_tree.set_metadata`), fsync, rename over the final name and fsync of the directory:
the copy is complete and durable once it has its final name, and never seen half-written under
it. Then the file's other names become hard links of the copy, and its directory takes its
namesake's times (`stageout_tree`). Missing directories are made with their namesakes'
metadata (`stageout_tree.make_parents`). `copy_back` brings an evicted file's PFS copy back
onto the buffer, holes kept.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from burstctl.node.stageout_extents import copy_data
from burstctl.node.stageout_marks import XATTR_EVICTED, mark_copied
from burstctl.node.stageout_tree import (
    link_names,
    make_parents,
    set_metadata,
    stamp_parents,
    temporary,
)


class CopyError(Exception):
    """A copy that failed for a reason worth reporting (``cause``: one line for the log)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


def copy_to_pfs(
    src: int,
    st: os.stat_result,
    rel: str,
    pfs: Path,
    backing_fd: int,
    pace: Callable[[int], None],
    stopping: threading.Event,
    part: Path | None = None,
) -> None:
    """Copies the backing file open as ``src`` (status ``st``, at ``rel`` under BACKING) to
    ``pfs / rel``, ``pace(n)`` before each chunk is written (the job's drain stream). Gives up
    without a trace once ``stopping`` is set; CopyError when the copy cannot be made.

    ``part``: the part of a file drained while it was open (`stageout_extents`), completed
    already (`OpenExtents.fill`), which takes the temporary's place: renamed, never removed."""
    target = pfs / rel
    directory = target.parent
    temp = part or temporary(target)
    try:
        made = make_parents(pfs, backing_fd, os.path.dirname(rel))
        if part is not None:  # its directories were made with the part: all take their times
            made = rel.count("/")
        create = 0 if part is not None else os.O_CREAT | os.O_EXCL
        out = os.open(temp, os.O_WRONLY | os.O_CLOEXEC | create, 0o600)
    except OSError as err:
        raise CopyError(f"PFS_DIR not writable: {err.strerror}") from None
    renamed = part is not None  # a part is never removed
    try:
        if part is None:
            try:
                copy_data(src, out, 0, st.st_size, pace, stopping)
                os.ftruncate(out, st.st_size)  # a hole at the end has no extent to copy
            except OSError as err:
                raise CopyError(f"cannot copy {rel} to PFS_DIR: {err.strerror}") from None
        if stopping.is_set():
            return
        proc = f"/proc/self/fd/{src}"
        times = (st.st_atime_ns, st.st_mtime_ns)  # as the data copied had them (the mark's)
        try:
            # Owner, mode and xattrs as they are now (one set during the copy included).
            meta = os.fstat(src)
            set_metadata(out, meta, proc, times=times)
            os.fsync(out)
            os.rename(temp, target)
            renamed = True
            if part is not None and os.path.dirname(part) != str(directory):
                _fsync_dir(part.parent)
            _fsync_dir(directory)
            if os.fstat(src).st_ctime_ns != meta.st_ctime_ns:
                # Changed while the copy was being finished: a change of metadata through the
                # mount may have gone to the name this copy has just replaced.
                set_metadata(str(target), os.fstat(src), proc, times=times)
            link_names(pfs, backing_fd, src, rel)
            stamp_parents(pfs, backing_fd, os.path.dirname(rel), made)
        except OSError as err:
            raise CopyError(f"cannot finish a copy on PFS_DIR: {err.strerror}") from None
    finally:
        os.close(out)
        if not renamed:
            with contextlib.suppress(OSError):
                os.unlink(temp)


def copy_back(src: int, path_fd: int, mtime_ns: int, pace: Callable[[int], None]) -> os.stat_result:
    """Copies an evicted file's PFS copy (open as ``src``) back into its backing file (the
    handle ``path_fd``), its data extents only, ``pace(n)`` before each chunk; gives it back
    its mtime ``mtime_ns``, marks it copied as it is now and no longer evicted. Its status;
    OSError on failure."""
    dst = os.open(f"/proc/self/fd/{path_fd}", os.O_WRONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(src).st_size
        copy_data(src, dst, 0, size, pace)
        os.ftruncate(dst, size)
        os.utime(dst, ns=(time.time_ns(), mtime_ns))
        st = os.fstat(dst)
        mark_copied(dst, st)
        os.removexattr(dst, XATTR_EVICTED)
    finally:
        os.close(dst)
    return st


def _fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
