"""One file's copy from the burst buffer to the parallel file system, and back.

`copy_to_pfs` copies ``BACKING/rel`` to ``PFS_DIR/rel``: into a temporary
``.NAME.burstctl-part-XXXX`` (`stageout_marks.TEMP_MARK`) in the same directory, in `CHUNK`
pieces each paced by the job's drain stream, then mode, owner (as root) and times as the
original's, fsync, rename over the final name and fsync of the directory: the copy is complete
and durable once it has its final name, and never seen half-written under it. Missing
directories are made with their namesakes' modes and owners (`make_dirs`). `copy_back` brings
an evicted file's PFS copy back onto the buffer.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path

from burstctl.node.stageout_marks import TEMP_MARK, XATTR_EVICTED, mark_copied

CHUNK = 1 << 20


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
    temp = part or directory / f".{target.name}{TEMP_MARK}{secrets.token_hex(4)}"
    try:
        make_dirs(pfs, backing_fd, os.path.dirname(rel))
        create = 0 if part is not None else os.O_CREAT | os.O_EXCL
        out = os.open(temp, os.O_WRONLY | os.O_CLOEXEC | create, 0o600)
    except OSError as err:
        raise CopyError(f"PFS_DIR not writable: {err.strerror}") from None
    renamed = part is not None  # a part is never removed
    try:
        offset = 0
        while part is None and not stopping.is_set():
            try:
                chunk = os.pread(src, CHUNK, offset)
            except OSError as err:
                raise CopyError(f"cannot read {rel} on the buffer: {err.strerror}") from None
            if not chunk:
                break
            pace(len(chunk))
            try:
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view) :]
            except OSError as err:
                raise CopyError(f"cannot write to PFS_DIR: {err.strerror}") from None
            offset += len(chunk)
        if stopping.is_set():
            return
        try:
            _give(out, st)
            os.fchmod(out, stat.S_IMODE(st.st_mode))
            os.fsync(out)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.rename(temp, target)
            renamed = True
            if part is not None and os.path.dirname(part) != str(directory):
                _fsync_dir(part.parent)
            _fsync_dir(directory)
        except OSError as err:
            raise CopyError(f"cannot finish a copy on PFS_DIR: {err.strerror}") from None
    finally:
        os.close(out)
        if not renamed:
            with contextlib.suppress(OSError):
                os.unlink(temp)


def copy_back(src: int, path_fd: int, mtime_ns: int, pace: Callable[[int], None]) -> os.stat_result:
    """Copies an evicted file's PFS copy (open as ``src``) back into its backing file (the
    handle ``path_fd``), ``pace(n)`` before each chunk; gives it back its mtime ``mtime_ns``,
    marks it copied as it is now and no longer evicted. Its status; OSError on failure."""
    dst = os.open(f"/proc/self/fd/{path_fd}", os.O_WRONLY | os.O_CLOEXEC)
    try:
        offset = 0
        while True:
            chunk = os.pread(src, CHUNK, offset)
            if not chunk:
                break
            pace(len(chunk))
            os.pwrite(dst, chunk, offset)
            offset += len(chunk)
        os.ftruncate(dst, offset)
        os.utime(dst, ns=(time.time_ns(), mtime_ns))
        st = os.fstat(dst)
        mark_copied(dst, st)
        os.removexattr(dst, XATTR_EVICTED)
    finally:
        os.close(dst)
    return st


def make_dirs(pfs: Path, backing_fd: int, rel_dir: str) -> None:
    """Creates the missing directories of ``rel_dir`` under ``pfs`` with the modes (and, as
    root, the owners) of their namesakes on BACKING (open as ``backing_fd``)."""
    here = pfs
    for part in Path(rel_dir).parts:
        here = here / part
        if here.is_dir():
            continue
        try:
            st = os.stat(os.path.relpath(here, pfs), dir_fd=backing_fd)
            mode = stat.S_IMODE(st.st_mode)
        except OSError:
            st, mode = None, 0o755
        try:
            os.mkdir(here, mode)
        except FileExistsError:
            continue
        if st is not None:
            fd = os.open(here, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                _give(fd, st)
                os.fchmod(fd, mode)  # exact, whatever the umask
            finally:
                os.close(fd)


def _fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _give(fd: int, st: os.stat_result) -> None:
    """Gives a copy the owner of its original, when the daemon may (root)."""
    if os.geteuid() == 0:
        os.fchown(fd, st.st_uid, st.st_gid)
