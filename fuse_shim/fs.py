"""The passthrough file system: libfuse's low-level requests mapped onto the backing directory.

`PassthroughFS` answers requests that name inodes (`_fuse.Operations`). Every operation is
relative to the ``O_PATH`` handle of the inode it names, kept by the mount's `InodeTable`
(`inodes`), never a rebuilt path: depth is not limited by PATH_MAX, the backing directory may be
the mount point itself (a mount "in place"), a file unlinked or replaced while open is still
reached through its handle (``fstat``, ``fchmod``, ``fchown``, ``futimens`` work, as on a local
file system), and hard links are one kernel inode, so the kernel may cache attributes and names
(``attr_timeout``, ``entry_timeout``, ``negative_timeout``: docs/fuse.md says why the defaults
are safe for a mount that is the only writer of its BACKING). Reads and writes use the backing
file descriptor opened by ``open``/``create`` (``os.preadv``/``os.pwrite``).

Each request's work beyond its backing call belongs to a part of its own: `inodes` (the
handles of the inodes the kernel knows), `directories` (open directories, their listings),
`paced` (with a `Pacer`: reads and writes acquire their bytes for the caller's job first, a
write the kernel makes on its own is booked to the job that opened the file), `staged` (with
a stage-out: evicted files shown and served from the PFS, restored before a change),
`ownership` (who a new node belongs to, the set-id bits a write clears) and `xattrs` (the
stage-out's marks hidden, ``security.capability`` answered from what is known absent).

Page cache (``direct_io``), chosen per open by `PassthroughFS.direct_io_for` from the mount's
``direct_io`` mode: ``writes`` (the default) sends every byte of a file opened for writing
straight to the daemon, ``all`` every file, ``none`` none. A file that can be mapped (opened
for reading, or reading and writing) goes direct only where the kernel was asked to allow shared
``mmap`` of such files (``direct_io_mmap``, set at init): elsewhere that mapping would fail with
ENODEV. A write-only file cannot be mapped at all.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import stat
from collections.abc import Callable
from typing import Any

from burstctl.common import syscalls
from burstctl.common.syscalls import chown_node, proc_path, renameat2, set_times
from burstctl.fuse_shim._fuse import (
    CAP_ATOMIC_O_TRUNC,
    CAP_AUTO_INVAL_DATA,
    CAP_BIG_WRITES,
    CAP_CACHE_SYMLINKS,
    CAP_HANDLE_KILLPRIV,
    LIBFUSE_VERSION,
    NOW,
    ROOT_ID,
    DirectIoMmap,
    Entry,
    Listing,
    Opened,
    SetAttr,
    kernel_release,
    request_context,
)
from burstctl.fuse_shim.config import DIRECT_IO_MODES
from burstctl.fuse_shim.directories import OpenDirectories
from burstctl.fuse_shim.inodes import PATH_FLAGS, Inode, InodeTable
from burstctl.fuse_shim.ownership import clear_setid, give_to_caller, may_access, open_existing
from burstctl.fuse_shim.paced import PacedRequests
from burstctl.fuse_shim.staged import StagedFiles
from burstctl.fuse_shim.xattrs import ExtendedAttributes
from burstctl.node.attribution import Caller
from burstctl.node.pacer import Pacer
from burstctl.node.stageout import StageOut

logger = logging.getLogger(__name__)

# O_DIRECT asks for aligned buffers, which os.pread/os.pwrite do not give: the kernel already
# sent the request past its page cache, the backing file need not be direct too. O_NOFOLLOW
# was checked by the kernel; on the handle's /proc link it would fail with ELOOP. O_CREAT,
# O_EXCL and O_NOCTTY mean nothing on an existing inode.
# O_APPEND: the kernel places every write itself (at the end for an O_APPEND file); on the
# backing handle it would make pwrite(2) append whatever its offset, and the kernel's
# writeback of a shared mapping may use that handle at any offset.
_DROPPED_OPEN_FLAGS = (
    getattr(os, "O_DIRECT", 0) | os.O_NOFOLLOW | os.O_CREAT | os.O_EXCL | os.O_NOCTTY | os.O_APPEND
)
_CREATE_DROPPED_FLAGS = getattr(os, "O_DIRECT", 0) | os.O_APPEND
_SETID = stat.S_ISUID | stat.S_ISGID


def _default_caller(req: int) -> Caller:
    ctx = request_context(req)
    return Caller(pid=ctx.pid, uid=ctx.uid, gid=ctx.gid)


class PassthroughFS:
    """A passthrough of the directory at the root of ``inodes``, paced by an optional `Pacer`.

    The root's handle is owned by the caller (it must outlive the mount). ``caller(req)``
    returns the credentials of a request (libfuse's request context by default; tests inject
    their own).
    """

    def __init__(
        self,
        inodes: InodeTable,
        pacer: Pacer | None = None,
        *,
        caller: Callable[[int], Caller] = _default_caller,
        on_init: Callable[[], None] | None = None,
        on_destroy: Callable[[], None] | None = None,
        max_write: int | None = None,
        read_ahead: int = 0,
        direct_io: str = "writes",
        big_writes: bool = True,
        attr_timeout: float = 1.0,
        entry_timeout: float = 1.0,
        negative_timeout: float = 1.0,
        stage_out: StageOut | None = None,
    ) -> None:
        if direct_io not in DIRECT_IO_MODES:
            raise ValueError(f"direct_io must be one of {', '.join(DIRECT_IO_MODES)}")
        self.inodes = inodes
        self._direct_io = direct_io
        # Whether the kernel allows shared mmap of direct_io files: set during init.
        self.direct_io_mmap = False
        self._paced = None if pacer is None else PacedRequests(pacer, caller)
        self._caller = caller
        self._on_init = on_init
        self._on_destroy = on_destroy
        self._max_write = max_write
        self._read_ahead = read_ahead
        self._big_writes = big_writes
        self.attr_timeout = attr_timeout
        self.entry_timeout = entry_timeout
        self.negative_timeout = negative_timeout
        self._is_root = os.geteuid() == 0
        self._xattrs = ExtendedAttributes(self._changed)
        self._dirs = OpenDirectories()
        self._mmap_hook: DirectIoMmap | None = None
        # The burst buffer's index and drain (docs/fuse.md, "Stage-out").
        self._staged = (
            None if stage_out is None else StagedFiles(stage_out, inodes, self._paced, caller)
        )

    # ------------------------------------------------------------------ inodes

    def _lookup(self, parent: int, name: bytes) -> Entry:
        node, st = self.inodes.look_up(parent, name)
        return Entry(node, self._shown(st))

    def forget(self, node: int, nlookup: int) -> None:
        self.inodes.forget(node, nlookup)

    # ------------------------------------------------------------------ helpers

    def _metadata(self, req: int) -> Caller | None:
        """Paces a metadata operation (a paced mount); returns the caller it looked up."""
        if self._paced is None:
            return None
        caller = self._caller(req)
        self._paced.pace(caller, "metadata", 0)
        return caller

    def _give(
        self,
        req: int,
        caller: Caller | None,
        parent_fd: int,
        name: bytes,
        fd: int | None,
        mode: int = 0,
    ) -> None:
        """Makes a new node belong to its creator, when the daemon is root (`give_to_caller`)."""
        if self._is_root:
            give_to_caller(parent_fd, name, caller or self._caller(req), fd, mode)

    # ------------------------------------------------------------------ lifecycle

    def init(self, conn: Any, is_v3: bool, fuse_session: int) -> None:
        if is_v3:
            if self._max_write is not None:
                conn.max_write = min(conn.max_write, self._max_write)
            # As on libfuse 2 (where it is off): with it the kernel asks GETATTR before every
            # read(2) to check its page cache, a request more per small read.
            # HANDLE_KILLPRIV off (libfuse 3.14 never passes it on to the kernel anyway): the
            # kernel clears set-id bits and capabilities itself on writes through its cache,
            # truncates and chowns. It leaves direct_io writes to the daemon (`write`).
            conn.want &= ~(CAP_AUTO_INVAL_DATA | CAP_HANDLE_KILLPRIV)
            if conn.capable & CAP_CACHE_SYMLINKS:
                conn.want |= CAP_CACHE_SYMLINKS
            self._ask_direct_io_mmap(fuse_session)
        else:
            want = CAP_ATOMIC_O_TRUNC | (CAP_BIG_WRITES if self._big_writes else 0)
            conn.want |= want & conn.capable
            if self._max_write is not None:
                conn.max_write = min(conn.max_write, self._max_write)
        if self._read_ahead and self._read_ahead > conn.max_readahead:
            # The kernel keeps min(its window, this) once init returns; the window itself
            # is raised by on_init (mount.set_read_ahead), so both must say it.
            conn.max_readahead = self._read_ahead
        if self._on_init is not None:
            self._on_init()

    def _ask_direct_io_mmap(self, fuse_session: int) -> None:
        why_not = DirectIoMmap.unavailable(LIBFUSE_VERSION, kernel_release())
        if why_not is not None:
            logger.info("shared mmap of direct_io files cannot be asked for: %s", why_not)
            return

        def on_reply(granted: bool) -> None:
            self.direct_io_mmap = granted
            if granted:
                logger.info("asked the kernel to allow shared mmap of direct_io files")
            else:
                logger.warning("the INIT reply had no room to allow mmap of direct_io files")

        # Kept for the life of the mount: libfuse calls into the hook's ctypes thunk.
        self._mmap_hook = DirectIoMmap(on_reply)
        try:
            self._mmap_hook.install(fuse_session)
        except (OSError, AttributeError) as err:
            logger.warning("could not ask the kernel to allow mmap of direct_io files: %s", err)

    def destroy(self) -> None:
        if self._on_destroy is not None:
            self._on_destroy()

    # ------------------------------------------------------------------ attributes

    def lookup(self, req: int, parent: int, name: bytes) -> Entry:
        self._metadata(req)
        return self._lookup(parent, name)

    def readdir_entry(self, parent: int, name: bytes) -> Entry:
        """``lookup`` for an entry readdirplus returns (not paced: the readdir was)."""
        return self._lookup(parent, name)

    def getattr(self, req: int, node: int, fh: int | None) -> os.stat_result:
        self._metadata(req)
        return self._shown(os.fstat(fh if fh is not None else self.inodes.get(node).fd))

    def _shown(self, st: os.stat_result) -> os.stat_result:
        """What the mount shows of a backing file: an evicted one as its PFS copy."""
        return st if self._staged is None else self._staged.shown(st)

    def _modified(self, req: int, inode: Inode, caller: Caller | None = None) -> None:
        """Tells the stage-out of a change to a file through the mount (never fails)."""
        if self._staged is not None:
            self._staged.modified_by(req, inode, caller)

    def _changing(
        self, req: int, caller: Caller | None, inode: Inode, offset: int, length: int
    ) -> contextlib.AbstractContextManager[object]:
        """Around a change of [offset, offset+length) of a file (`StagedFiles.changing`)."""
        if self._staged is None:
            return contextlib.nullcontext()
        return self._staged.changing(req, caller, inode, offset, length)

    def setattr(self, req: int, node: int, change: SetAttr, fh: int | None) -> os.stat_result:
        self._metadata(req)
        inode = self.inodes.get(node)
        if change.mode is not None:
            if fh is not None:
                os.fchmod(fh, stat.S_IMODE(change.mode))
            else:
                os.chmod(proc_path(inode.fd), stat.S_IMODE(change.mode))
        if change.uid is not None or change.gid is not None:
            uid = -1 if change.uid is None else change.uid
            gid = -1 if change.gid is None else change.gid
            chown_node(inode.fd, uid, gid)
        if change.size is not None:
            if self._staged is not None:
                restore = functools.partial(self._staged.restore_for, req, inode, None)
                with self._staged.truncating(req, inode, change.size, restore):
                    self._truncate(fh, inode, change.size)
            else:
                self._truncate(fh, inode, change.size)
            self._modified(req, inode)
            self._clear_setid(req, node, fh if fh is not None else inode.fd, handle=fh is not None)
        if change.atime is not None or change.mtime is not None:
            set_times(
                fh if fh is not None else inode.fd,
                change.atime,
                change.mtime,
                now=NOW,
                handle=fh is not None,
            )
        self._changed(inode.fd)
        return self._shown(os.fstat(fh if fh is not None else inode.fd))

    def _changed(self, fd: int, name: bytes = b"") -> None:
        """Tells the stage-out of a node made (``name`` in ``fd``) or whose metadata changed."""
        if self._staged is not None:
            self._staged.changed(fd, name)

    @staticmethod
    def _truncate(fh: int | None, inode: Inode, size: int) -> None:
        if fh is not None:
            os.ftruncate(fh, size)
        else:
            os.truncate(proc_path(inode.fd), size)

    def access(self, req: int, node: int, mask: int) -> None:
        # Only reached without default_permissions; checks the caller's uid, not the daemon's.
        caller = self._metadata(req) or self._caller(req)
        if not may_access(caller, os.fstat(self.inodes.get(node).fd), mask):
            raise OSError(errno.EACCES, "permission denied")

    def statfs(self, req: int, node: int) -> os.statvfs_result:
        self._metadata(req)
        return os.statvfs(self.inodes.get(ROOT_ID).fd)

    # ------------------------------------------------------------------ directories and names

    def opendir(self, req: int, node: int) -> Opened:
        self._metadata(req)
        return Opened(self._dirs.open(self.inodes.get(node).fd))

    def readdir(self, req: int, node: int, offset: int, fh: int) -> Listing:
        """The directory's listing, taken at its first read and again at each rewind
        (offset 0); later reads continue in it by offset."""
        directory = self._dirs.get(fh)
        if offset == 0 or directory.listing is None:
            self._metadata(req)
            return directory.list(node == ROOT_ID)
        return directory.listing

    def releasedir(self, req: int, node: int, fh: int) -> None:
        self._dirs.close(fh)

    def fsyncdir(self, req: int, node: int, datasync: bool, fh: int) -> None:
        self._metadata(req)
        (os.fdatasync if datasync else os.fsync)(fh)

    def mkdir(self, req: int, parent: int, name: bytes, mode: int) -> Entry:
        caller = self._metadata(req)
        parent_fd = self.inodes.get(parent).fd
        os.mkdir(name, mode, dir_fd=parent_fd)
        self._give(req, caller, parent_fd, name, None)
        self._changed(parent_fd, name)
        return self._lookup(parent, name)

    def mknod(self, req: int, parent: int, name: bytes, mode: int, rdev: int) -> Entry:
        caller = self._metadata(req)
        parent_fd = self.inodes.get(parent).fd
        os.mknod(name, mode, rdev, dir_fd=parent_fd)
        self._give(req, caller, parent_fd, name, None, mode)
        return self._lookup(parent, name)

    def symlink(self, req: int, target: bytes, parent: int, name: bytes) -> Entry:
        # ``target`` is the link's content, kept verbatim.
        caller = self._metadata(req)
        parent_fd = self.inodes.get(parent).fd
        os.symlink(target, name, dir_fd=parent_fd)
        self._give(req, caller, parent_fd, name, None)
        self._changed(parent_fd, name)
        return self._lookup(parent, name)

    def readlink(self, req: int, node: int) -> bytes:
        self._metadata(req)
        return os.readlink(b"", dir_fd=self.inodes.get(node).fd)

    def link(self, req: int, node: int, new_parent: int, new_name: bytes) -> Entry:
        self._metadata(req)
        inode = self.inodes.get(node)
        parent_fd = self.inodes.get(new_parent).fd
        try:
            os.link(proc_path(inode.fd), new_name, dst_dir_fd=parent_fd, follow_symlinks=True)
        finally:
            self._xattrs.forget_capabilities()
        self._changed(parent_fd, new_name)
        return self._lookup(new_parent, new_name)

    def unlink(self, req: int, parent: int, name: bytes) -> None:
        self._metadata(req)
        parent_fd = self.inodes.get(parent).fd
        gone = self._last_name(parent_fd, name)
        try:
            os.unlink(name, dir_fd=parent_fd)
        finally:
            self._xattrs.forget_capabilities()
        if self._staged is not None:
            self._staged.unlinked(gone)

    def _last_name(self, parent_fd: int, name: bytes) -> tuple[int, int] | None:
        """The node of a file the stage-out tracks whose only name this is (None otherwise)."""
        return None if self._staged is None else self._staged.last_name(parent_fd, name)

    def rmdir(self, req: int, parent: int, name: bytes) -> None:
        self._metadata(req)
        try:
            os.rmdir(name, dir_fd=self.inodes.get(parent).fd)
        finally:
            self._xattrs.forget_capabilities()

    def rename(
        self, req: int, parent: int, name: bytes, new_parent: int, new_name: bytes, flags: int
    ) -> None:
        self._metadata(req)
        old_fd = self.inodes.get(parent).fd
        new_fd = self.inodes.get(new_parent).fd
        replaced = self._last_name(new_fd, new_name)
        try:
            if flags:
                renameat2(old_fd, name, new_fd, new_name, flags)
            else:
                os.rename(name, new_name, src_dir_fd=old_fd, dst_dir_fd=new_fd)
        finally:
            self._xattrs.forget_capabilities()
        if self._staged is not None:
            self._staged.renamed(new_fd, new_name, replaced)

    # ------------------------------------------------------------------ files

    def open(self, req: int, node: int, flags: int) -> Opened:
        caller = self._metadata(req)
        flags = (flags & ~_DROPPED_OPEN_FLAGS) | os.O_CLOEXEC
        inode = self.inodes.get(node)
        if self._staged is not None:
            restore = functools.partial(self._staged.restore_for, req, inode, caller)
            fd = self._staged.open(inode, flags, restore)
        else:
            fd = os.open(proc_path(inode.fd), flags)
        if flags & os.O_TRUNC:
            try:
                self._clear_setid(req, node, fd)
                self._modified(req, inode, caller)
            except BaseException:
                self._forget_handle(fd)
                os.close(fd)
                raise
        self._opened(req, fd, caller)
        return Opened(fd, direct_io=self.direct_io_for(flags), noflush=True)

    def _forget_handle(self, fh: int) -> None:
        """Drops what the stage-out kept of an open file that is not opened after all."""
        if self._staged is not None:
            self._staged.forget_handle(fh)

    def create(
        self, req: int, parent: int, name: bytes, mode: int, flags: int
    ) -> tuple[Entry, Opened]:
        caller = self._metadata(req)
        parent_fd = self.inodes.get(parent).fd
        flags = (flags & ~_CREATE_DROPPED_FLAGS) | os.O_CREAT | os.O_CLOEXEC
        try:
            fd = os.open(name, flags | os.O_EXCL, mode, dir_fd=parent_fd)
            created = True
        except FileExistsError:
            if flags & os.O_EXCL:
                raise
            # The name appeared since the kernel found it absent (created behind the mount,
            # or by another request in between): open it as an existing file, as a local file
            # system would, with the caller's permission and without taking it over.
            caller = caller or self._caller(req)
            fd = open_existing(caller, parent_fd, name, flags & ~os.O_CREAT)
            created = False
        try:
            if created:
                self._give(req, caller, parent_fd, name, fd, mode)
            path_fd = os.open(proc_path(fd), PATH_FLAGS & ~os.O_NOFOLLOW)
            try:
                st = os.fstat(fd)
            except BaseException:
                os.close(path_fd)
                raise
            entry = Entry(self.inodes.remember(path_fd, st, parent, name), self._shown(st))
        except BaseException:
            os.close(fd)
            raise
        if self._staged is not None:
            try:
                inode = self.inodes.get(entry.node)
                restore = functools.partial(self._staged.restore_for, req, inode, caller)
                self._staged.created(inode, fd, flags, restore)
                self._modified(req, inode, caller)
            except BaseException:
                self._forget_handle(fd)
                os.close(fd)
                raise
        self._opened(req, fd, caller)
        return entry, Opened(fd, direct_io=self.direct_io_for(flags), noflush=True)

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

    def _opened(self, req: int, fd: int, caller: Caller | None) -> None:
        if self._paced is not None:
            self._paced.opened(caller or self._caller(req), fd)

    def read(self, req: int, node: int, buf: memoryview, offset: int, fh: int) -> int:
        if self._paced is not None:
            self._paced.pace(self._paced.data_caller(req, fh), "read", len(buf))
        if self._staged is None:
            return os.preadv(fh, [buf], offset)
        return self._staged.read(fh, buf, offset)

    def write(
        self, req: int, node: int, data: memoryview, offset: int, fh: int, writepage: bool = False
    ) -> int:
        caller = None
        granted = None
        if self._paced is not None:
            caller = self._paced.data_caller(req, fh, writepage)
            granted = self._paced.pace(caller, "write", len(data))
        try:
            inode = self.inodes.get(node)
            with self._changing(req, caller, inode, offset, len(data)):
                done = os.pwrite(fh, data, offset)
                if not writepage:
                    self._clear_setid(req, node, fh)
                self._modified(req, inode, caller)  # reports the job's resident
        finally:
            if self._paced is not None:
                self._paced.landed(granted, len(data))  # only now counted as added
        return done

    def _clear_setid(self, req: int, node: int, fd: int, *, handle: bool = True) -> None:
        """Clears set-user-ID / set-group-ID after a write or truncate, as the kernel does on
        a local file system when the caller lacks CAP_FSETID (`ownership.clear_setid`).
        ``fd``: an open file (``handle``) or an O_PATH one. The kernel is told before the
        reply: after a write it marks only the size and times it cached as stale, so a
        ``stat`` asking for the mode alone (``stat -c %a``) would show the bits still set."""
        st = os.fstat(fd)
        setid = st.st_mode & _SETID and stat.S_ISREG(st.st_mode)
        if setid and clear_setid(fd, st, self._caller(req), handle=handle):
            self.inodes.refresh(node)

    def flush(self, req: int, node: int, fh: int) -> None:
        # close(2) of a duplicate reports what the backing filesystem reports at close,
        # without closing the handle other duplicates of the application's file still use.
        os.close(os.dup(fh))

    def fsync(self, req: int, node: int, datasync: bool, fh: int) -> None:
        self._metadata(req)
        (os.fdatasync if datasync else os.fsync)(fh)

    def release(self, req: int, node: int, fh: int) -> None:
        # Forgotten before it is closed: once closed, its number may be reused by an open.
        if self._staged is not None:
            self._staged.released(fh)
        if self._paced is not None:
            self._paced.released(fh)
        os.close(fh)

    def fallocate(self, req: int, node: int, mode: int, offset: int, length: int, fh: int) -> None:
        self._metadata(req)
        inode = self.inodes.get(node)
        with self._changing(req, None, inode, offset, length):
            syscalls.fallocate(fh, mode, offset, length)
            self._modified(req, inode)

    def lseek(self, req: int, node: int, offset: int, whence: int, fh: int) -> int:
        # SEEK_DATA / SEEK_HOLE (the kernel answers SEEK_SET/CUR/END itself). The handle's
        # own position is never used (reads and writes are positional).
        if self._staged is None:
            return os.lseek(fh, offset, whence)
        return self._staged.seek(fh, offset, whence)

    # ------------------------------------------------------------------ extended attributes

    def getxattr(self, req: int, node: int, name: bytes) -> bytes:
        self._metadata(req)
        return self._xattrs.get(node, self.inodes.get(node).fd, name)

    def listxattr(self, req: int, node: int) -> bytes:
        self._metadata(req)
        return self._xattrs.list(self.inodes.get(node).fd)

    def setxattr(self, req: int, node: int, name: bytes, value: bytes, flags: int) -> None:
        self._metadata(req)
        self._xattrs.set(self.inodes.get(node).fd, name, value, flags)

    def removexattr(self, req: int, node: int, name: bytes) -> None:
        self._metadata(req)
        self._xattrs.remove(self.inodes.get(node).fd, name)


__all__ = ["PassthroughFS"]
