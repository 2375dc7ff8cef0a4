"""The file system's side of the stage-out: the tracked files as the mount serves them.

`StagedFiles` stands between `fs.PassthroughFS` and the drain (`stageout.StageOut`,
docs/fuse.md, "Stage-out to the parallel file system"). It owns, per open file, the node it
opened and whether for writing (the last close, or the last writer's, queues the file for its
copy), and for an evicted file opened to read, the PFS copy its reads and seeks are served from.
It shows an evicted file with its PFS copy's size and mtime (`shown`), brings one back onto the
buffer before it is changed (`restore`, under `StageOut.holding`, paced as the caller's
writes), drops the mark of one truncated to 0, and tells the drain of renames, of a file's
last name going, and of nodes made or whose metadata changed (`changed`: a tracked file's PFS
copy takes its metadata and names, a directory or symlink is reproduced on the PFS).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterator

from burstctl.common.syscalls import proc_path
from burstctl.fuse_shim.inodes import PATH_FLAGS, Inode, InodeTable, Key
from burstctl.fuse_shim.paced import PacedRequests
from burstctl.node.attribution import Caller
from burstctl.node.stageout import StageOut
from burstctl.node.stageout_marks import Evicted

logger = logging.getLogger(__name__)


def as_evicted(st: os.stat_result, evicted: Evicted) -> os.stat_result:
    """The attributes of an evicted file: its size and mtime when it was evicted, and blocks
    as if its data were there (tools take a file with no blocks for a hole)."""
    values = [
        *st,
        st.st_atime,
        evicted.mtime_ns / 1e9,
        st.st_ctime,
        st.st_atime_ns,
        evicted.mtime_ns,
        st.st_ctime_ns,
        st.st_blksize,
        -(-evicted.size // 512),
        st.st_rdev,
    ]
    values[6] = evicted.size
    values[8] = evicted.mtime_ns // 1_000_000_000
    return os.stat_result(values)


def _no_pace(nbytes: int) -> None:
    """Nothing to wait for (no pacer, or nothing brought back)."""


class StagedFiles:
    """The stage-out's files on one mount; thread-safe. ``inodes``: the mount's inode table
    (where a node is now)."""

    def __init__(
        self,
        stage: StageOut,
        inodes: InodeTable,
        paced: PacedRequests | None,
        caller: Callable[[int], Caller],
    ) -> None:
        self._stage = stage
        self._inodes = inodes
        self._paced = paced
        self._caller = caller
        self._lock = threading.Lock()
        self._handles: dict[int, tuple[Key, bool]] = {}  # fh -> (node, writing)
        self._pfs_fds: dict[int, int] = {}  # fh of an evicted file -> its PFS copy

    # ------------------------------------------------------------------ what the mount shows

    def shown(self, st: os.stat_result) -> os.stat_result:
        """What the mount shows of a backing file: an evicted one as its PFS copy, one with
        drained chunks with their blocks (tools take a file with few blocks for sparse)."""
        key = (st.st_dev, st.st_ino)
        evicted = self._stage.evicted(key)
        if evicted is not None:
            return as_evicted(st, evicted)
        drained = 0 if self._stage.open is None else self._stage.open.drained_bytes(key)
        if not drained:
            return st
        values = [*st, st.st_atime, st.st_mtime, st.st_ctime]
        values += [st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns, st.st_blksize]
        values += [st.st_blocks + drained // 512, st.st_rdev]
        return os.stat_result(values)

    def read(self, fh: int, buf: memoryview, offset: int) -> int:
        """A read of the open file ``fh``: from its PFS copy when evicted, per chunk from the
        buffer or its part when some of it is drained."""
        pfs_fd = self._pfs_fds.get(fh)
        if pfs_fd is not None or self._stage.open is None:
            return os.preadv(fh if pfs_fd is None else pfs_fd, [buf], offset)
        return self._stage.open.read(self._key_of(fh), fh, buf, offset)

    def seek(self, fh: int, offset: int, whence: int) -> int:
        """SEEK_DATA / SEEK_HOLE on the open file ``fh``, as `read` reads it."""
        pfs_fd = self._pfs_fds.get(fh)
        if pfs_fd is not None or self._stage.open is None:
            return os.lseek(fh if pfs_fd is None else pfs_fd, offset, whence)
        return self._stage.open.seek(self._key_of(fh), fh, offset, whence)

    def _key_of(self, fh: int) -> Key | None:
        known = self._handles.get(fh)
        return None if known is None else known[0]

    @contextlib.contextmanager
    def changing(
        self, req: int, caller: Caller | None, inode: Inode, offset: int, length: int
    ) -> Iterator[None]:
        """Around a change of [offset, offset+length) of a file (a write, a fallocate): drained
        chunks it touches are brought back first (as the caller's writes), and none of its
        chunks is drained meanwhile."""
        if self._stage.open is None:
            yield
            return
        with (
            self.paced_back(req, caller) as pace,
            self._stage.open.writing(inode.key, inode.fd, offset, length, pace),
        ):
            yield

    def paced_back(
        self, req: int, caller: Caller | None
    ) -> contextlib.AbstractContextManager[Callable[[int], None]]:
        """A ``pace(n)`` for bytes the mount brings back onto the buffer for the caller
        (`PacedRequests.bringing_back`)."""
        if self._paced is None:
            return contextlib.nullcontext(_no_pace)
        return self._paced.bringing_back(lambda: caller or self._caller(req))

    # ------------------------------------------------------------------ changes

    def modified_by(self, req: int, inode: Inode, caller: Caller | None) -> None:
        """A change to a file through the mount, by the caller's job (never fails)."""
        try:
            job = None
            if self._paced is not None:
                job = self._paced.job_of(caller or self._caller(req))
            self._stage.modified(inode.key, inode.fd, job)
        except Exception:
            logger.exception("recording a change for the stage-out failed")

    def restore_for(self, req: int, inode: Inode, caller: Caller | None) -> None:
        """Brings an evicted file back onto the buffer before it is changed (under
        `StageOut.holding`): the caller's job's writes to the buffer."""
        with self.paced_back(req, caller) as pace:
            self.restore(inode, pace)
            self.modified_by(req, inode, caller)  # the restored bytes in the job's resident

    def restore(self, inode: Inode, pace: Callable[[int], None]) -> None:
        """Brings an evicted file back onto the buffer (under `StageOut.holding`), ``pace(n)``
        before each chunk; EIO when its PFS copy cannot be read."""
        try:
            self._stage.restore(inode.key, inode.fd, pace)
        except InterruptedError:
            raise  # the request was interrupted while paced: the file stays evicted
        except OSError as err:
            logger.error("cannot bring an evicted file back from the PFS: %s", err)
            raise OSError(errno.EIO, "the file's copy on the PFS cannot be read") from None

    @contextlib.contextmanager
    def truncating(
        self, req: int, inode: Inode, size: int, restore: Callable[[], None]
    ) -> Iterator[None]:
        """Around a truncate of a tracked file to ``size``: its residency held still, an
        evicted one restored first (``restore``), or merely unmarked when truncated to 0; a
        drained chunk across ``size`` brought back (``pace``), those past it dropped."""
        if not self._stage.tracks(inode.key):
            yield
            return
        with self._stage.holding(inode.key):
            if self._stage.evicted(inode.key) is None:
                if self._stage.open is not None:
                    with self.paced_back(req, None) as pace:
                        self._stage.open.cut(inode.key, inode.fd, size, pace)
                        self.modified_by(req, inode, None)
            elif size == 0:
                self._stage.discard_evicted(inode.key, inode.fd)
            else:
                restore()
            yield

    def changed(self, fd: int, name: bytes = b"") -> None:
        """A node made through the mount (``name`` in the directory ``fd``: mkdir, symlink,
        link) or whose metadata was set (the node ``fd``: chmod, chown, utimes, xattrs): a
        tracked file's PFS copy takes its metadata and names (an evicted one shows the mtime of
        its mark), a directory or symlink is reproduced on the PFS. Never fails."""
        try:
            path_fd = os.open(name, PATH_FLAGS, dir_fd=fd) if name else fd
            try:
                st = os.fstat(path_fd)
                path = os.readlink(proc_path(path_fd))
                if stat.S_ISREG(st.st_mode):
                    new_name = path if name else None
                    self._stage.restamped((st.st_dev, st.st_ino), path_fd, new_name)
                elif self._stage.tree is not None:
                    self._stage.tree.reproduce(path)
            finally:
                if name:
                    os.close(path_fd)
        except Exception:
            logger.exception("telling the stage-out of a change failed")

    # ------------------------------------------------------------------ opening and closing

    def open(self, inode: Inode, flags: int, restore: Callable[[], None]) -> int:
        """Opens a file (under `StageOut.holding`): an evicted one is restored first
        (``restore``) when opened to change it (merely unmarked when truncated by the open),
        else its reads are served from the PFS."""
        with self._stage.holding(inode.key):
            evicted = self._stage.evicted(inode.key)
            if flags & os.O_TRUNC and self._stage.open is not None:
                self._stage.open.cut(inode.key, inode.fd, 0, _no_pace)
            if evicted is not None and flags & os.O_TRUNC:
                self._stage.discard_evicted(inode.key, inode.fd)
                evicted = None
            elif evicted is not None and flags & os.O_ACCMODE != os.O_RDONLY:
                restore()
                evicted = None
            pfs_fd = None
            if evicted is not None:
                try:
                    pfs_fd = self._stage.open_pfs(evicted)
                except OSError as err:
                    logger.error("the PFS copy of an evicted file cannot be opened: %s", err)
                    raise OSError(errno.EIO, "the file's copy on the PFS cannot be read") from None
            try:
                fd = os.open(proc_path(inode.fd), flags)
            except BaseException:
                if pfs_fd is not None:
                    os.close(pfs_fd)
                raise
            writing = flags & os.O_ACCMODE != os.O_RDONLY
            with self._lock:
                self._handles[fd] = (inode.key, writing)
                if pfs_fd is not None:
                    self._pfs_fds[fd] = pfs_fd
            self._stage.opened(inode.key, writing)
            return fd

    def created(self, inode: Inode, fd: int, flags: int, restore: Callable[[], None]) -> None:
        """A file created (or an existing one opened by create) through the mount, open as
        ``fd``: the stage-out tracks it; an evicted one is brought back (or unmarked, when
        truncated)."""
        with self._stage.holding(inode.key):
            if flags & os.O_TRUNC and self._stage.open is not None:
                self._stage.open.cut(inode.key, inode.fd, 0, _no_pace)
            if self._stage.evicted(inode.key) is not None:
                if flags & os.O_TRUNC:
                    self._stage.discard_evicted(inode.key, inode.fd)
                else:
                    restore()
            with self._lock:
                self._handles[fd] = (inode.key, True)
            self._stage.opened(inode.key, True)

    def forget_handle(self, fh: int) -> tuple[Key, bool] | None:
        """Drops what is kept of an open file; returns its node's key and whether it was open
        for writing."""
        with self._lock:
            key = self._handles.pop(fh, None)
            pfs_fd = self._pfs_fds.pop(fh, None)
        if pfs_fd is not None:
            os.close(pfs_fd)
        return key

    def released(self, fh: int) -> None:
        """The close of ``fh`` (before the handle is closed: its number may be reused then);
        the last close queues the file for the drain. Never fails."""
        known = self.forget_handle(fh)
        if known is not None:
            key, writing = known
            try:
                self._stage.released(key, self._inodes.path_of(key), writing)
            except Exception:
                logger.exception("queueing a closed file for the stage-out failed")

    # ------------------------------------------------------------------ names

    def last_name(self, parent_fd: int, name: bytes) -> Key | None:
        """The node of a tracked file whose only name this is (None otherwise)."""
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except OSError:
            return None
        key = (st.st_dev, st.st_ino)
        return key if st.st_nlink == 1 and self._stage.tracks(key) else None

    def unlinked(self, gone: Key | None) -> None:
        """``gone`` (from `last_name`) lost its last name."""
        if gone is not None:
            self._stage.forget(gone)

    def renamed(self, new_fd: int, new_name: bytes, replaced: Key | None) -> None:
        """A rename to ``new_name`` in the directory ``new_fd``, which replaced ``replaced``
        (from `last_name`) if anything."""
        try:
            st = os.stat(new_name, dir_fd=new_fd, follow_symlinks=False)
        except OSError:
            return
        key = (st.st_dev, st.st_ino)
        if replaced is not None and replaced != key:
            self._stage.forget(replaced)
        if self._stage.tracks(key):
            with contextlib.suppress(OSError):
                dir_path = os.readlink(proc_path(new_fd))
                self._stage.renamed(key, os.path.join(dir_path, os.fsdecode(new_name)))
            if st.st_nlink > 1:  # one of several names: the PFS gets the new one too
                self.changed(new_fd, new_name)
        elif not stat.S_ISREG(st.st_mode):
            self.changed(new_fd, new_name)  # a directory or symlink, under its new name
