"""The passthrough filesystem: every FUSE callback mapped onto the backing directory.

`PassthroughFS` works relative to a directory file descriptor opened before the mount, so the
backing directory may even be the mount point itself (a mount "in place"). Reads and writes use
the backing file descriptor opened by ``open``/``create`` (``os.pread``/``os.pwrite``), never
the path. Every callback runs behind `errno_barrier`: an `OSError` becomes its ``-errno``,
anything else is logged and becomes ``-EIO``, so a bug never takes the mount down.

Ownership: the kernel checks permissions (the mount uses ``default_permissions``); when the
daemon runs as root, what a caller creates is given to the caller (`ownership`).

Pacing: when a `Pacer` is given, reads and writes acquire their bytes for the caller's job
first, and metadata operations go through `Pacer.metadata`.

Page cache (``direct_io``), chosen per open by `PassthroughFS.direct_io_for` from the mount's
``direct_io`` mode: ``writes`` (the default) sends every byte of a file opened for writing
straight to the daemon, ``all`` every file, ``none`` none. A file that can be mapped (opened
for reading, or reading and writing) goes direct only where the kernel was asked to allow shared
``mmap`` of such files (``direct_io_mmap``, set by the binding at init): elsewhere that mapping
would fail with ENODEV. A write-only file cannot be mapped at all.

``security.capability``: answered from `capabilities.AbsentCapabilities` when known absent;
every call that could give a path a capability forgets what it knows.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import stat
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from burstctl.fuse_shim._fuse import FuseOSError, Operations, fuse_get_context
from burstctl.fuse_shim.attribution import Caller
from burstctl.fuse_shim.capabilities import CAPABILITY, AbsentCapabilities
from burstctl.fuse_shim.config import DIRECT_IO_MODES
from burstctl.fuse_shim.ownership import give_to_caller, may_access
from burstctl.fuse_shim.pacing import Pacer

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

# O_DIRECT asks for aligned buffers, which os.pread/os.pwrite do not give: the kernel already
# sent the request past its page cache, the backing file need not be direct too.
_DROPPED_OPEN_FLAGS = os.O_DIRECT if hasattr(os, "O_DIRECT") else 0
# With utime_omit_ok, libfuse passes UTIME_NOW / UTIME_OMIT as tv_nsec with tv_sec 0, which the
# binding hands over as that many nanoseconds (a real time 1.07 s after the epoch is lost).
_UTIME_NOW = (1 << 30) - 1
_UTIME_OMIT = (1 << 30) - 2
_FUSE_CAP_AUTO_INVAL_DATA = 1 << 12  # fuse_common.h (libfuse 3)


def errno_barrier(method: F) -> F:
    """Turns whatever a callback raises into a FUSE error; nothing else leaves it."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(*args: Any) -> Any:
        try:
            return method(*args)
        except OSError as err:
            if isinstance(err.errno, int) and err.errno > 0:
                if isinstance(err, FuseOSError):
                    raise
                raise FuseOSError(err.errno) from None
            logger.error("%s: OSError without an errno: %r", name, err)
            raise FuseOSError(errno.EIO) from None
        except BaseException as err:  # the barrier: not even SystemExit may reach libfuse
            logger.exception("%s failed on a bug; answering EIO: %r", name, err)
            raise FuseOSError(errno.EIO) from None

    return cast(F, wrapper)


def _stat_dict(st: os.stat_result) -> dict[str, int]:
    # Times in nanoseconds: the operations class sets use_ns.
    return {
        "st_mode": st.st_mode,
        "st_ino": st.st_ino,
        "st_nlink": st.st_nlink,
        "st_uid": st.st_uid,
        "st_gid": st.st_gid,
        "st_size": st.st_size,
        "st_blocks": st.st_blocks,
        "st_blksize": st.st_blksize,
        "st_rdev": st.st_rdev,
        "st_atime": st.st_atime_ns,
        "st_mtime": st.st_mtime_ns,
        "st_ctime": st.st_ctime_ns,
    }


def _dirent_mode(entry: os.DirEntry[str]) -> int:
    # The kernel takes only the file type from a directory entry; d_type spares a stat.
    if entry.is_dir(follow_symlinks=False):
        return stat.S_IFDIR
    if entry.is_symlink():
        return stat.S_IFLNK
    if entry.is_file(follow_symlinks=False):
        return stat.S_IFREG
    return stat.S_IFMT(entry.stat(follow_symlinks=False).st_mode)


def _current_caller() -> Caller:
    uid, gid, pid = fuse_get_context()
    return Caller(pid=pid, uid=uid, gid=gid)


class PassthroughFS(Operations):  # type: ignore[misc]
    """A passthrough of the directory open as ``root_fd``, paced by an optional `Pacer`.

    ``root_fd`` is owned by the caller (it must outlive the mount). ``caller`` returns the
    credentials of the current request (the FUSE context by default; tests inject their own).
    """

    use_ns = True  # timestamps cross as integer nanoseconds, without float rounding
    # Callbacks on a file that was unlinked while open get a NULL path (and its handle):
    # with hard_remove nothing is renamed to .fuse_hidden* in the backing directory.
    flag_nullpath_ok = True
    flag_nopath = False
    # UTIME_NOW / UTIME_OMIT reach utimens as they are (see `utimens`).
    flag_utime_omit_ok = True

    def __init__(
        self,
        root_fd: int,
        pacer: Pacer | None = None,
        *,
        caller: Callable[[], Caller] = _current_caller,
        on_init: Callable[[], None] | None = None,
        on_destroy: Callable[[], None] | None = None,
        max_write: int | None = None,
        read_ahead: int = 0,
        direct_io: str = "writes",
    ) -> None:
        if direct_io not in DIRECT_IO_MODES:
            raise ValueError(f"direct_io must be one of {', '.join(DIRECT_IO_MODES)}")
        self._root = root_fd
        self._direct_io = direct_io
        # Whether the kernel allows shared mmap of direct_io files: set by the binding
        # (burstctl.fuse_shim._fuse.FUSE) during init, before any open.
        self.direct_io_mmap = False
        self._pacer = pacer
        self._caller = caller
        self._on_init = on_init
        self._on_destroy = on_destroy
        self._max_write = max_write
        self._read_ahead = read_ahead
        self._proc_root = f"/proc/self/fd/{root_fd}"
        self._is_root = os.geteuid() == 0
        self._pace_metadata = pacer is not None and pacer.paces_metadata
        self._no_capability = AbsentCapabilities()

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _rel(path: str | None) -> str:
        if path is None:
            raise FuseOSError(errno.ENOENT)  # unlinked while open, and no handle to use
        rel = path.lstrip("/")
        return rel or "."

    def _proc_path(self, path: str | None) -> str:
        # For calls without a dir_fd form (xattrs): the magic link reaches the backing
        # directory even when the mount sits on top of it.
        rel = self._rel(path)
        return self._proc_root if rel == "." else f"{self._proc_root}/{rel}"

    def _metadata(self) -> Caller | None:
        """Paces a metadata operation when that is on; returns the caller it looked up."""
        if not self._pace_metadata:
            return None
        caller = self._caller()
        self._pace(caller, "metadata", 0)
        return caller

    def _pace(self, caller: Caller, kind: str, nbytes: int) -> None:
        # Pacing must never fail the application's I/O: a pacing bug is logged, the I/O goes.
        assert self._pacer is not None
        try:
            if kind == "metadata":
                self._pacer.metadata(caller)
            else:
                self._pacer.data(caller, kind, nbytes)
        except Exception:
            logger.exception("pacing a %s request failed; serving it unpaced", kind)

    def _give_to_caller(
        self, rel: str, caller: Caller | None, fd: int | None = None, mode: int = 0
    ) -> None:
        """Makes a new node belong to its creator, when the daemon is root (`give_to_caller`)."""
        if self._is_root:
            give_to_caller(self._root, rel, caller or self._caller(), fd, mode)

    # ------------------------------------------------------------------ lifecycle

    @errno_barrier
    def init_with_config(self, conn: Any, config: Any) -> None:
        # ``config`` is libfuse 3's struct fuse_config (None on libfuse 2, where the same
        # settings are mount options).
        if config is not None and conn is not None:
            if self._max_write is not None:
                conn.max_write = min(conn.max_write, self._max_write)
            # As on libfuse 2 (where it is an option, off): libfuse 3 turns it on, and the
            # kernel then asks GETATTR before every read(2) to check whether the page cache
            # is still valid: a request more per small read (docs/benchmarks.md has figures).
            conn.want &= ~_FUSE_CAP_AUTO_INVAL_DATA
        if self._read_ahead and conn is not None and self._read_ahead > conn.max_readahead:
            # The kernel keeps min(its window, this) once init returns; the window itself
            # is raised by on_init (mount.set_read_ahead), so both must say it.
            conn.max_readahead = self._read_ahead
        if self._on_init is not None:
            self._on_init()

    @errno_barrier
    def destroy(self, path: str) -> None:
        if self._on_destroy is not None:
            self._on_destroy()

    # ------------------------------------------------------------------ attributes

    @errno_barrier
    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, int]:
        self._metadata()
        if fh is not None:
            return _stat_dict(os.fstat(fh))
        return _stat_dict(os.stat(self._rel(path), dir_fd=self._root, follow_symlinks=False))

    @errno_barrier
    def access(self, path: str, amode: int) -> int:
        # Only reached without default_permissions; checks the caller's uid, not the daemon's.
        caller = self._metadata() or self._caller()
        st = os.stat(self._rel(path), dir_fd=self._root, follow_symlinks=False)
        if not may_access(caller, st, amode):
            raise FuseOSError(errno.EACCES)
        return 0

    @errno_barrier
    def chmod(self, path: str | None, mode: int) -> int:
        self._metadata()
        os.chmod(self._rel(path), stat.S_IMODE(mode), dir_fd=self._root)
        return 0

    @errno_barrier
    def chown(self, path: str | None, uid: int, gid: int) -> int:
        self._metadata()
        os.chown(self._rel(path), uid, gid, dir_fd=self._root, follow_symlinks=False)
        return 0

    @errno_barrier
    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        self._metadata()
        if fh is not None:
            os.ftruncate(fh, length)
            return 0
        fd = os.open(self._rel(path), os.O_WRONLY | os.O_CLOEXEC, dir_fd=self._root)
        try:
            os.ftruncate(fd, length)
        finally:
            os.close(fd)
        return 0

    @errno_barrier
    def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
        self._metadata()
        rel = self._rel(path)
        if times is None:
            os.utime(rel, dir_fd=self._root, follow_symlinks=False)
            return 0
        atime, mtime = (self._utime_value(t, i, rel) for i, t in enumerate(times))
        os.utime(rel, ns=(atime, mtime), dir_fd=self._root, follow_symlinks=False)
        return 0

    def _utime_value(self, value: int, index: int, rel: str) -> int:
        if value == _UTIME_NOW:
            return time.time_ns()
        if value == _UTIME_OMIT:
            st = os.stat(rel, dir_fd=self._root, follow_symlinks=False)
            return st.st_atime_ns if index == 0 else st.st_mtime_ns
        return value

    @errno_barrier
    def statfs(self, path: str) -> dict[str, int]:
        self._metadata()
        st = os.statvfs(self._root)
        return {
            key: getattr(st, key)
            for key in (
                "f_bsize",
                "f_frsize",
                "f_blocks",
                "f_bfree",
                "f_bavail",
                "f_files",
                "f_ffree",
                "f_favail",
                "f_namemax",
            )
        }

    # ------------------------------------------------------------------ directories and names

    @errno_barrier
    def readdir(self, path: str, fh: int) -> list[str | tuple[str, dict[str, int], int]]:
        self._metadata()
        fd = os.open(
            self._rel(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self._root
        )
        try:
            # Each entry carries its inode number: readdir(3) skips entries whose d_ino is 0.
            here = os.fstat(fd)
            up = os.stat("..", dir_fd=fd) if path not in ("/", "") else here
            entries: list[str | tuple[str, dict[str, int], int]] = [
                (".", {"st_ino": here.st_ino, "st_mode": stat.S_IFDIR}, 0),
                ("..", {"st_ino": up.st_ino, "st_mode": stat.S_IFDIR}, 0),
            ]
            with os.scandir(fd) as it:
                for entry in it:
                    attrs = {"st_ino": entry.inode(), "st_mode": _dirent_mode(entry)}
                    entries.append((entry.name, attrs, 0))
            return entries
        finally:
            os.close(fd)

    @errno_barrier
    def mkdir(self, path: str, mode: int) -> int:
        caller = self._metadata()
        rel = self._rel(path)
        os.mkdir(rel, mode, dir_fd=self._root)
        self._give_to_caller(rel, caller)
        return 0

    @errno_barrier
    def rmdir(self, path: str) -> int:
        self._metadata()
        try:
            os.rmdir(self._rel(path), dir_fd=self._root)
        finally:
            self._no_capability.forget_all()
        return 0

    @errno_barrier
    def mknod(self, path: str, mode: int, dev: int) -> int:
        caller = self._metadata()
        rel = self._rel(path)
        os.mknod(rel, mode, dev, dir_fd=self._root)
        self._give_to_caller(rel, caller, mode=mode)
        return 0

    @errno_barrier
    def unlink(self, path: str) -> int:
        self._metadata()
        try:
            os.unlink(self._rel(path), dir_fd=self._root)
        finally:
            self._no_capability.forget_all()
        return 0

    @errno_barrier
    def rename(self, old: str, new: str) -> int:
        self._metadata()
        try:
            os.rename(self._rel(old), self._rel(new), src_dir_fd=self._root, dst_dir_fd=self._root)
        finally:
            self._no_capability.forget_all()
        return 0

    @errno_barrier
    def link(self, target: str, source: str) -> int:
        # mfusepy's order: ``target`` is the new name, ``source`` the existing file.
        self._metadata()
        try:
            os.link(
                self._rel(source),
                self._rel(target),
                src_dir_fd=self._root,
                dst_dir_fd=self._root,
                follow_symlinks=False,
            )
        finally:
            self._no_capability.forget_all()
        return 0

    @errno_barrier
    def symlink(self, target: str, source: str) -> int:
        # ``target`` is the new link's path, ``source`` its content, kept verbatim.
        caller = self._metadata()
        rel = self._rel(target)
        os.symlink(source, rel, dir_fd=self._root)
        self._give_to_caller(rel, caller)
        return 0

    @errno_barrier
    def readlink(self, path: str) -> str:
        self._metadata()
        return os.readlink(self._rel(path), dir_fd=self._root)

    # ------------------------------------------------------------------ files

    @errno_barrier
    def open(self, path: str, flags: int) -> int:
        caller = self._metadata()
        flags = (flags & ~_DROPPED_OPEN_FLAGS) | os.O_CLOEXEC
        fd = os.open(self._rel(path), flags, dir_fd=self._root)
        self._opened(fd, caller)
        return fd

    @errno_barrier
    def create(self, path: str, mode: int, flags: int = os.O_WRONLY | os.O_CREAT) -> int:
        caller = self._metadata()
        rel = self._rel(path)
        flags = (flags & ~_DROPPED_OPEN_FLAGS) | os.O_CREAT | os.O_CLOEXEC
        fd = os.open(rel, flags, mode, dir_fd=self._root)
        try:
            self._give_to_caller(rel, caller, fd, mode)
        except BaseException:
            os.close(fd)
            raise
        self._opened(fd, caller)
        return fd

    def direct_io_for(self, flags: int) -> bool:
        """Whether the file opened with ``flags`` bypasses the kernel's page cache."""
        if self._direct_io == "none":
            return False
        access = flags & os.O_ACCMODE
        if access == os.O_WRONLY:
            return True  # cannot be mapped: direct whatever the kernel allows
        if self._direct_io == "writes" and access != os.O_RDWR:
            return False
        return self.direct_io_mmap

    def _opened(self, fd: int, caller: Caller | None) -> None:
        if self._pacer is None:
            return
        try:
            self._pacer.opened(caller or self._caller(), fd)
        except Exception:
            logger.exception("recording an open file failed; its job's phase ends by time")

    @errno_barrier
    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        if self._pacer is not None:
            self._pace(self._caller(), "read", size)
        return os.pread(fh, size, offset)

    @errno_barrier
    def read_into(self, path: str | None, buf: memoryview, offset: int, fh: int) -> int:
        """``read`` into the caller's buffer (the binding passes libfuse's own): no copy."""
        if self._pacer is not None:
            self._pace(self._caller(), "read", len(buf))
        return os.preadv(fh, [buf], offset)

    @errno_barrier
    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        if self._pacer is not None:
            self._pace(self._caller(), "write", len(data))
        return os.pwrite(fh, data, offset)

    # The same as `write` for a buffer that is not copied first (the binding passes
    # libfuse's own); `read_into` likewise. Both are what the mount uses.
    write_from = write

    @errno_barrier
    def flush(self, path: str | None, fh: int) -> int:
        # close(2) of a duplicate reports what the backing filesystem reports at close,
        # without closing the handle other duplicates of the application's file still use.
        os.close(os.dup(fh))
        return 0

    @errno_barrier
    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        self._metadata()
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)
        return 0

    @errno_barrier
    def release(self, path: str | None, fh: int) -> int:
        # Forgotten before it is closed: once closed, its number may be reused by an open.
        if self._pacer is not None:
            try:
                self._pacer.released(fh)
            except Exception:
                logger.exception("recording a closed file failed")
        os.close(fh)
        return 0

    @errno_barrier
    def fallocate(self, path: str | None, mode: int, offset: int, size: int, fh: int) -> int:
        self._metadata()
        if mode != 0:  # punch hole, keep size, ...: not offered by os, say so
            raise FuseOSError(errno.EOPNOTSUPP)
        os.posix_fallocate(fh, offset, size)
        return 0

    # ------------------------------------------------------------------ extended attributes

    @errno_barrier
    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        self._metadata()
        if name != CAPABILITY or path is None:
            return os.getxattr(self._proc_path(path), name, follow_symlinks=False)
        if self._no_capability.known_absent(path):
            raise FuseOSError(errno.ENODATA)
        generation = self._no_capability.generation
        try:
            return os.getxattr(self._proc_path(path), name, follow_symlinks=False)
        except OSError as err:
            if err.errno == errno.ENODATA:
                self._no_capability.remember(path, generation)
            raise

    @errno_barrier
    def listxattr(self, path: str) -> list[str]:
        self._metadata()
        return os.listxattr(self._proc_path(path), follow_symlinks=False)

    @errno_barrier
    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        self._metadata()
        try:
            os.setxattr(self._proc_path(path), name, value, options, follow_symlinks=False)
        finally:
            self._no_capability.forget_all()
        return 0

    @errno_barrier
    def removexattr(self, path: str, name: str) -> int:
        self._metadata()
        try:
            os.removexattr(self._proc_path(path), name, follow_symlinks=False)
        finally:
            self._no_capability.forget_all()
        return 0
