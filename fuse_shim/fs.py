"""The passthrough file system: libfuse's low-level requests mapped onto the backing directory.

`PassthroughFS` answers requests that name inodes (`_fuse.Operations`). It keeps an ``O_PATH``
handle per inode the kernel knows (`Inode`), keyed by the backing (device, inode number), so

- every operation is relative to a handle, never a rebuilt path: depth is not limited by
  PATH_MAX, and the backing directory may be the mount point itself (a mount "in place");
- a file unlinked or replaced while open is still reached through its handle (``fstat``,
  ``fchmod``, ``fchown``, ``futimens`` work, as on a local file system);
- hard links are one kernel inode, so the kernel may cache attributes and names
  (``attr_timeout``, ``entry_timeout``, ``negative_timeout``: docs/fuse.md says why the
  defaults are safe for a mount that is the only writer of its BACKING).

The kernel counts its references to each inode (``nlookup``) and gives them back in
``forget``; the handle is closed when the count reaches 0. Reads and writes use the backing
file descriptor opened by ``open``/``create`` (``os.preadv``/``os.pwrite``).

Ownership: the kernel checks permissions (``default_permissions``); when the daemon runs as
root, what a caller creates is given to the caller (`ownership`), and a write by a caller
without CAP_FSETID clears set-user-ID / set-group-ID as the kernel does for a local file
system (`setid`): for files opened ``direct_io`` the kernel leaves that to the daemon.

Pacing: when a `Pacer` is given, reads and writes acquire their bytes for the caller's job
first, and metadata operations go through `Pacer.metadata`. A write the kernel makes on its
own (writeback of a shared mapping: pid 0) is booked to the job that opened the file.

Page cache (``direct_io``), chosen per open by `PassthroughFS.direct_io_for` from the mount's
``direct_io`` mode: ``writes`` (the default) sends every byte of a file opened for writing
straight to the daemon, ``all`` every file, ``none`` none. A file that can be mapped (opened
for reading, or reading and writing) goes direct only where the kernel was asked to allow shared
``mmap`` of such files (``direct_io_mmap``, set at init): elsewhere that mapping would fail with
ENODEV. A write-only file cannot be mapped at all.

Stage-out (`stageout.StageOut`, when given): every change through the mount is reported to
it, the last close of a file queues it for its copy to the PFS, and a file it evicted is shown
with its PFS copy's size, read from that copy, and restored before it is opened for writing
(docs/fuse.md, "Stage-out to the parallel file system"). Its ``user.burstctl.*`` xattrs are
hidden.

``security.capability``: answered from `capabilities.AbsentCapabilities` when known absent;
every call that could give a node a capability forgets what it knows.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import resource
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from burstctl.fuse_shim import syscalls
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
    DirEntry,
    Entry,
    Listing,
    Opened,
    SetAttr,
    kernel_release,
    request_context,
)
from burstctl.fuse_shim.capabilities import CAPABILITY, AbsentCapabilities
from burstctl.fuse_shim.config import DIRECT_IO_MODES
from burstctl.fuse_shim.ownership import give_to_caller, may_access
from burstctl.fuse_shim.setid import mode_after_write, writer_of
from burstctl.fuse_shim.stageout import Evicted, StageOut
from burstctl.node.attribution import Caller
from burstctl.node.pacer import Pacer
from burstctl.node.sessions import JobSession

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
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_SETID = stat.S_ISUID | stat.S_ISGID
_VALVE_INTERVAL = 0.05  # seconds between two passes of the handle valve, at least
_CAPABILITY = CAPABILITY.encode()
# The stage-out's marks on backing files (`stageout`): hidden from applications.
_OWN_XATTRS_TEXT = "user.burstctl."
_OWN_XATTRS = _OWN_XATTRS_TEXT.encode()


def _default_caller(req: int) -> Caller:
    ctx = request_context(req)
    return Caller(pid=ctx.pid, uid=ctx.uid, gid=ctx.gid)


def _proc(fd: int) -> str:
    # The magic link reaches the node of an O_PATH handle for calls that take a path.
    return f"/proc/self/fd/{fd}"


def _as_evicted(st: os.stat_result, evicted: Evicted) -> os.stat_result:
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


class Inode:
    """A backing node the kernel knows: its O_PATH handle, the kernel's reference count, and
    the (parent node, name) it was last looked up by (to ask the kernel to drop it)."""

    __slots__ = ("fd", "key", "name", "nlookup", "node", "parent")

    def __init__(
        self, node: int, fd: int, key: tuple[int, int], nlookup: int, parent: int, name: bytes
    ) -> None:
        self.node = node
        self.fd = fd
        self.key = key
        self.nlookup = nlookup
        self.parent = parent
        self.name = name


def handle_budget(soft_limit: int) -> int:
    """How many inode handles the mount keeps before it asks the kernel to drop names: the
    open-file limit less room for open files, directories, sockets and libraries."""
    reserve = min(4096, soft_limit // 2)
    return max(64, soft_limit - reserve)


@dataclass
class _Directory:
    fd: int
    listing: Listing | None = None


class PassthroughFS:
    """A passthrough of the directory open as ``root_fd``, paced by an optional `Pacer`.

    ``root_fd`` is owned by the caller (it must outlive the mount). ``caller(req)`` returns the
    credentials of a request (libfuse's request context by default; tests inject their own).
    """

    def __init__(
        self,
        root_fd: int,
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
        handles: int | None = None,
        stage_out: StageOut | None = None,
    ) -> None:
        if direct_io not in DIRECT_IO_MODES:
            raise ValueError(f"direct_io must be one of {', '.join(DIRECT_IO_MODES)}")
        self._root = root_fd
        self._direct_io = direct_io
        # Whether the kernel allows shared mmap of direct_io files: set during init.
        self.direct_io_mmap = False
        self._pacer = pacer
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
        self._pace_metadata = pacer is not None and pacer.paces_metadata
        self._no_capability = AbsentCapabilities()
        self._lock = threading.Lock()
        root_st = os.fstat(root_fd)
        root = Inode(ROOT_ID, root_fd, (root_st.st_dev, root_st.st_ino), 1, ROOT_ID, b"")
        # In least recently looked-up order (the root never leaves).
        self._nodes: OrderedDict[int, Inode] = OrderedDict({ROOT_ID: root})
        self._by_key: dict[tuple[int, int], Inode] = {root.key: root}
        self._next_node = ROOT_ID + 1
        self._openers: dict[int, Caller] = {}  # fh -> who opened it
        self._dirs: dict[int, _Directory] = {}
        self._mmap_hook: DirectIoMmap | None = None
        # Handles kept open: one per inode the kernel knows, up to a budget under the
        # open-file limit; past it the valve asks the kernel to drop the oldest names.
        self.invalidate_entry: Callable[[int, bytes], int] | None = None
        if handles is None:
            handles = handle_budget(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self.handle_budget = handles
        self.invalidated = 0  # names the valve asked the kernel to drop (tests, logs)
        self._valve_wanted = threading.Event()
        self._valve_closed = threading.Event()  # never set: the valve's pacing clock
        self._valve: threading.Thread | None = None
        # The burst buffer's index and drain (docs/fuse.md, "Stage-out"): the node of each
        # open file, and the PFS copy an evicted file's reads are served from.
        self._stage = stage_out
        self._fh_keys: dict[int, tuple[tuple[int, int], bool]] = {}  # fh -> (node, writing)
        self._pfs_fds: dict[int, int] = {}
        if stage_out is not None:
            stage_out.path_of = self._path_of

    # ------------------------------------------------------------------ inodes

    def _inode(self, node: int) -> Inode:
        inode = self._nodes.get(node)
        if inode is None:  # the kernel never names a node it forgot; be loud if it does
            raise OSError(errno.ESTALE, "unknown node")
        return inode

    def _remember(self, fd: int, st: os.stat_result, parent: int, name: bytes) -> Entry:
        """The kernel learns of the node open as ``fd`` (taken over), as ``name`` in
        ``parent``: one more reference."""
        key = (st.st_dev, st.st_ino)
        with self._lock:
            inode = self._by_key.get(key)
            if inode is not None:
                inode.nlookup += 1
                inode.parent, inode.name = parent, name
                self._nodes.move_to_end(inode.node)
            else:
                inode = Inode(self._next_node, fd, key, 1, parent, name)
                self._next_node += 1
                self._nodes[inode.node] = inode
                self._by_key[key] = inode
                fd = -1
            over = len(self._nodes) > self.handle_budget
        if fd >= 0:
            os.close(fd)
        if over:
            self._open_valve()
        return Entry(inode.node, self._shown(st))

    def _lookup(self, parent: int, name: bytes) -> Entry:
        fd = os.open(name, _PATH_FLAGS, dir_fd=self._inode(parent).fd)
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        return self._remember(fd, st, parent, name)

    def _open_valve(self) -> None:
        self._valve_wanted.set()
        if self._valve is not None or self.invalidate_entry is None:
            return
        with self._lock:
            if self._valve is not None:
                return
            self._valve = threading.Thread(
                target=self._drain_handles, name="burstctl-handles", daemon=True
            )
        self._valve.start()

    def _drain_handles(self) -> None:
        """Keeps the handles under budget: asks the kernel to drop the least recently
        looked-up names (it then forgets their inodes, unless they are in use: open, a
        working directory, or an ancestor of one). A thread of its own: the kernel takes the
        parent directory's lock to drop a name, which a request being served may hold."""
        while True:
            self._valve_wanted.wait()
            # At most one pass per _VALVE_INTERVAL: when the kernel cannot forget (every name
            # in use), each lookup past the budget would otherwise start another full pass.
            self._valve_closed.wait(_VALVE_INTERVAL)
            self._valve_wanted.clear()
            invalidate = self.invalidate_entry
            if invalidate is None:
                return
            with self._lock:
                excess = max(0, len(self._nodes) - self.handle_budget * 9 // 10)
                oldest = list(itertools.islice(self._nodes.values(), 1, 1 + excess))
                for inode in oldest:
                    self._nodes.move_to_end(inode.node)  # one in use comes round again later
                names = [(inode.parent, inode.name) for inode in oldest]
            for parent, name in names:
                if invalidate(parent, name) in (0, -errno.ENOENT):
                    self.invalidated += 1
            if names:
                logger.debug("asked the kernel to drop %d names (handle budget)", len(names))

    def forget(self, node: int, nlookup: int) -> None:
        with self._lock:
            inode = self._nodes.get(node)
            if inode is None or node == ROOT_ID:
                return
            inode.nlookup -= nlookup
            if inode.nlookup > 0:
                return
            del self._nodes[node]
            if self._by_key.get(inode.key) is inode:
                del self._by_key[inode.key]
        os.close(inode.fd)

    @property
    def known_nodes(self) -> int:
        """How many inodes the kernel holds references to (the root included)."""
        return len(self._nodes)

    # ------------------------------------------------------------------ helpers

    def _metadata(self, req: int) -> Caller | None:
        """Paces a metadata operation when that is on; returns the caller it looked up."""
        if not self._pace_metadata:
            return None
        caller = self._caller(req)
        self._pace(caller, "metadata", 0)
        return caller

    def _pace(self, caller: Caller, kind: str, nbytes: int) -> JobSession | None:
        # Pacing must never fail the application's I/O: a pacing bug is logged, the I/O goes.
        # A write waits for the job's space on the burst buffer too (after its bandwidth);
        # the session that granted it is returned, to be told when the bytes landed.
        assert self._pacer is not None
        try:
            if kind == "metadata":
                self._pacer.metadata(caller)
            else:
                return self._pacer.data(caller, kind, nbytes, space=kind == "write")
        except Exception:
            logger.exception("pacing a %s request failed; serving it unpaced", kind)
        return None

    def _landed(self, granted: JobSession | None, nbytes: int) -> None:
        """The bytes of a write are on the buffer and reported (`Pacer.landed`)."""
        if granted is not None and self._pacer is not None:
            self._pacer.landed(granted, nbytes)

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

    def _forget_capabilities(self) -> None:
        self._no_capability.forget_all()

    # ------------------------------------------------------------------ lifecycle

    def init(self, conn: Any, is_v3: bool, session: int) -> None:
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
            self._ask_direct_io_mmap(session)
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

    def _ask_direct_io_mmap(self, session: int) -> None:
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
            self._mmap_hook.install(session)
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
        return self._shown(os.fstat(fh if fh is not None else self._inode(node).fd))

    def _shown(self, st: os.stat_result) -> os.stat_result:
        """What the mount shows of a backing file: an evicted one as its PFS copy."""
        if self._stage is None:
            return st
        evicted = self._stage.evicted((st.st_dev, st.st_ino))
        return st if evicted is None else _as_evicted(st, evicted)

    def _path_of(self, key: tuple[int, int]) -> str | None:
        """Where the node ``key`` is now, if the kernel knows it (its O_PATH handle's link)."""
        with self._lock:
            inode = self._by_key.get(key)
            fd = None if inode is None else inode.fd
        if fd is None:
            return None
        try:
            return os.readlink(_proc(fd))
        except OSError:
            return None

    def _modified(self, req: int, inode: Inode, caller: Caller | None = None) -> None:
        """Tells the stage-out of a change to a file through the mount (never fails)."""
        if self._stage is None:
            return
        try:
            job = None
            if self._pacer is not None:
                job = self._pacer.job_of(caller or self._caller(req))
            self._stage.modified(inode.key, inode.fd, job)
        except Exception:
            logger.exception("recording a change for the stage-out failed")

    def _restore(self, req: int, inode: Inode, caller: Caller | None) -> None:
        """Brings an evicted file back onto the buffer before it is changed (under
        `StageOut.holding`); its bytes are the caller's job's writes to the buffer."""
        assert self._stage is not None
        pacer = self._pacer
        who = caller or self._caller(req)

        granted: list[tuple[JobSession, int]] = []

        def pace(nbytes: int) -> None:
            if pacer is not None:
                session = self._pace(who, "write", nbytes)
                if session is not None:
                    granted.append((session, nbytes))

        try:
            self._stage.restore(inode.key, inode.fd, pace)
            self._modified(req, inode, caller)  # the restored bytes in the job's resident
        except OSError as err:
            logger.error("cannot bring an evicted file back from the PFS: %s", err)
            raise OSError(errno.EIO, "the file's copy on the PFS cannot be read") from None
        finally:
            for session, nbytes in granted:
                self._landed(session, nbytes)

    def setattr(self, req: int, node: int, change: SetAttr, fh: int | None) -> os.stat_result:
        self._metadata(req)
        inode = self._inode(node)
        if change.mode is not None:
            if fh is not None:
                os.fchmod(fh, stat.S_IMODE(change.mode))
            else:
                os.chmod(_proc(inode.fd), stat.S_IMODE(change.mode))
        if change.uid is not None or change.gid is not None:
            uid = -1 if change.uid is None else change.uid
            gid = -1 if change.gid is None else change.gid
            syscalls.chown_node(inode.fd, uid, gid)
        if change.size is not None:
            if self._stage is not None and self._stage.tracks(inode.key):
                with self._stage.holding(inode.key):
                    if self._stage.evicted(inode.key) is None:
                        pass
                    elif change.size == 0:
                        self._stage.discard_evicted(inode.key, inode.fd)
                    else:
                        self._restore(req, inode, None)
                    self._truncate(fh, inode, change.size)
            else:
                self._truncate(fh, inode, change.size)
            self._modified(req, inode)
            self._clear_setid(req, fh if fh is not None else inode.fd, handle=fh is not None)
        if change.atime is not None or change.mtime is not None:
            syscalls.set_times(
                fh if fh is not None else inode.fd,
                change.atime,
                change.mtime,
                now=NOW,
                handle=fh is not None,
            )
            if change.mtime is not None and self._stage is not None:
                # An evicted file shows the mtime of its mark: the new one goes there.
                self._stage.retimed(inode.key, inode.fd)
        return self._shown(os.fstat(fh if fh is not None else inode.fd))

    @staticmethod
    def _truncate(fh: int | None, inode: Inode, size: int) -> None:
        if fh is not None:
            os.ftruncate(fh, size)
        else:
            os.truncate(_proc(inode.fd), size)

    def access(self, req: int, node: int, mask: int) -> None:
        # Only reached without default_permissions; checks the caller's uid, not the daemon's.
        caller = self._metadata(req) or self._caller(req)
        if not may_access(caller, os.fstat(self._inode(node).fd), mask):
            raise OSError(errno.EACCES, "permission denied")

    def statfs(self, req: int, node: int) -> os.statvfs_result:
        self._metadata(req)
        return os.statvfs(self._root)

    # ------------------------------------------------------------------ directories and names

    def opendir(self, req: int, node: int) -> Opened:
        self._metadata(req)
        fd = os.open(_proc(self._inode(node).fd), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        with self._lock:
            self._dirs[fd] = _Directory(fd)
        return Opened(fd)

    def readdir(self, req: int, node: int, offset: int, fh: int) -> Listing:
        """The directory's listing, taken at its first read and again at each rewind
        (offset 0); later reads continue in it by offset."""
        directory = self._dirs.get(fh)
        if directory is None:
            raise OSError(errno.EBADF, "unknown directory handle")
        if offset == 0 or directory.listing is None:
            self._metadata(req)
            directory.listing = Listing(self._list(directory.fd, node == ROOT_ID))
        return directory.listing

    @staticmethod
    def _list(fd: int, is_root: bool) -> list[DirEntry]:
        # Each entry carries its inode number: readdir(3) skips entries whose d_ino is 0.
        here = os.fstat(fd)
        up = here if is_root else os.stat("..", dir_fd=fd)
        entries = [
            DirEntry(b".", here.st_ino, stat.S_IFDIR, 1),
            DirEntry(b"..", up.st_ino, stat.S_IFDIR, 2),
        ]
        os.lseek(fd, 0, os.SEEK_SET)
        with os.scandir(fd) as it:
            for entry in it:
                entries.append(
                    DirEntry(
                        os.fsencode(entry.name),
                        entry.inode(),
                        _dirent_type(entry),
                        len(entries) + 1,
                    )
                )
        return entries

    def releasedir(self, req: int, node: int, fh: int) -> None:
        with self._lock:
            directory = self._dirs.pop(fh, None)
        if directory is not None:
            os.close(directory.fd)

    def fsyncdir(self, req: int, node: int, datasync: bool, fh: int) -> None:
        self._metadata(req)
        (os.fdatasync if datasync else os.fsync)(fh)

    def mkdir(self, req: int, parent: int, name: bytes, mode: int) -> Entry:
        caller = self._metadata(req)
        parent_fd = self._inode(parent).fd
        os.mkdir(name, mode, dir_fd=parent_fd)
        self._give(req, caller, parent_fd, name, None)
        return self._lookup(parent, name)

    def mknod(self, req: int, parent: int, name: bytes, mode: int, rdev: int) -> Entry:
        caller = self._metadata(req)
        parent_fd = self._inode(parent).fd
        os.mknod(name, mode, rdev, dir_fd=parent_fd)
        self._give(req, caller, parent_fd, name, None, mode)
        return self._lookup(parent, name)

    def symlink(self, req: int, target: bytes, parent: int, name: bytes) -> Entry:
        # ``target`` is the link's content, kept verbatim.
        caller = self._metadata(req)
        parent_fd = self._inode(parent).fd
        os.symlink(target, name, dir_fd=parent_fd)
        self._give(req, caller, parent_fd, name, None)
        return self._lookup(parent, name)

    def readlink(self, req: int, node: int) -> bytes:
        self._metadata(req)
        return os.readlink(b"", dir_fd=self._inode(node).fd)

    def link(self, req: int, node: int, new_parent: int, new_name: bytes) -> Entry:
        self._metadata(req)
        inode = self._inode(node)
        parent_fd = self._inode(new_parent).fd
        try:
            os.link(_proc(inode.fd), new_name, dst_dir_fd=parent_fd, follow_symlinks=True)
        finally:
            self._forget_capabilities()
        return self._lookup(new_parent, new_name)

    def unlink(self, req: int, parent: int, name: bytes) -> None:
        self._metadata(req)
        parent_fd = self._inode(parent).fd
        gone = self._last_name(parent_fd, name)
        try:
            os.unlink(name, dir_fd=parent_fd)
        finally:
            self._forget_capabilities()
        if gone is not None and self._stage is not None:
            self._stage.forget(gone)

    def _last_name(self, parent_fd: int, name: bytes) -> tuple[int, int] | None:
        """The node of a file the stage-out tracks whose only name this is (None otherwise)."""
        if self._stage is None:
            return None
        try:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        except OSError:
            return None
        key = (st.st_dev, st.st_ino)
        return key if st.st_nlink == 1 and self._stage.tracks(key) else None

    def rmdir(self, req: int, parent: int, name: bytes) -> None:
        self._metadata(req)
        try:
            os.rmdir(name, dir_fd=self._inode(parent).fd)
        finally:
            self._forget_capabilities()

    def rename(
        self, req: int, parent: int, name: bytes, new_parent: int, new_name: bytes, flags: int
    ) -> None:
        self._metadata(req)
        old_fd = self._inode(parent).fd
        new_fd = self._inode(new_parent).fd
        replaced = self._last_name(new_fd, new_name)
        try:
            if flags:
                syscalls.renameat2(old_fd, name, new_fd, new_name, flags)
            else:
                os.rename(name, new_name, src_dir_fd=old_fd, dst_dir_fd=new_fd)
        finally:
            self._forget_capabilities()
        if self._stage is not None:
            self._renamed(new_fd, new_name, replaced)

    def _renamed(self, new_fd: int, new_name: bytes, replaced: tuple[int, int] | None) -> None:
        assert self._stage is not None
        try:
            st = os.stat(new_name, dir_fd=new_fd, follow_symlinks=False)
        except OSError:
            return
        key = (st.st_dev, st.st_ino)
        if replaced is not None and replaced != key:
            self._stage.forget(replaced)
        if self._stage.tracks(key):
            with contextlib.suppress(OSError):
                dir_path = os.readlink(_proc(new_fd))
                self._stage.renamed(key, os.path.join(dir_path, os.fsdecode(new_name)))

    # ------------------------------------------------------------------ files

    def open(self, req: int, node: int, flags: int) -> Opened:
        caller = self._metadata(req)
        flags = (flags & ~_DROPPED_OPEN_FLAGS) | os.O_CLOEXEC
        inode = self._inode(node)
        if self._stage is not None:
            with self._stage.holding(inode.key):
                fd = self._open_tracked(req, inode, flags, caller)
        else:
            fd = os.open(_proc(inode.fd), flags)
        if flags & os.O_TRUNC:
            try:
                self._clear_setid(req, fd)
                self._modified(req, inode, caller)
            except BaseException:
                self._forget_handle(fd)
                os.close(fd)
                raise
        self._opened(req, fd, caller)
        return Opened(fd, direct_io=self.direct_io_for(flags), noflush=True)

    def _open_tracked(self, req: int, inode: Inode, flags: int, caller: Caller | None) -> int:
        """Opens a file with the stage-out on (under `StageOut.holding`): an evicted one is
        restored first when opened to change it (merely unmarked when truncated by the open),
        else its reads are served from the PFS."""
        assert self._stage is not None
        evicted = self._stage.evicted(inode.key)
        if evicted is not None and flags & os.O_TRUNC:
            self._stage.discard_evicted(inode.key, inode.fd)
            evicted = None
        elif evicted is not None and flags & os.O_ACCMODE != os.O_RDONLY:
            self._restore(req, inode, caller)
            evicted = None
        pfs_fd = None
        if evicted is not None:
            try:
                pfs_fd = self._stage.open_pfs(evicted)
            except OSError as err:
                logger.error("the PFS copy of an evicted file cannot be opened: %s", err)
                raise OSError(errno.EIO, "the file's copy on the PFS cannot be read") from None
        try:
            fd = os.open(_proc(inode.fd), flags)
        except BaseException:
            if pfs_fd is not None:
                os.close(pfs_fd)
            raise
        writing = flags & os.O_ACCMODE != os.O_RDONLY
        with self._lock:
            self._fh_keys[fd] = (inode.key, writing)
            if pfs_fd is not None:
                self._pfs_fds[fd] = pfs_fd
        self._stage.opened(inode.key, writing)
        return fd

    def _forget_handle(self, fh: int) -> tuple[tuple[int, int], bool] | None:
        """Drops what the stage-out kept of an open file; returns its node's key and whether
        it was open for writing."""
        with self._lock:
            key = self._fh_keys.pop(fh, None)
            pfs_fd = self._pfs_fds.pop(fh, None)
        if pfs_fd is not None:
            os.close(pfs_fd)
        return key

    def create(
        self, req: int, parent: int, name: bytes, mode: int, flags: int
    ) -> tuple[Entry, Opened]:
        caller = self._metadata(req)
        parent_fd = self._inode(parent).fd
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
            fd = self._open_existing(caller, parent_fd, name, flags & ~os.O_CREAT)
            created = False
        try:
            if created:
                self._give(req, caller, parent_fd, name, fd, mode)
            path_fd = os.open(_proc(fd), _PATH_FLAGS & ~os.O_NOFOLLOW)
            try:
                st = os.fstat(fd)
            except BaseException:
                os.close(path_fd)
                raise
            entry = self._remember(path_fd, st, parent, name)
        except BaseException:
            os.close(fd)
            raise
        if self._stage is not None:
            try:
                self._created(req, entry.node, fd, flags, caller)
            except BaseException:
                self._forget_handle(fd)
                os.close(fd)
                raise
        self._opened(req, fd, caller)
        return entry, Opened(fd, direct_io=self.direct_io_for(flags), noflush=True)

    def _created(self, req: int, node: int, fd: int, flags: int, caller: Caller | None) -> None:
        """A file created (or an existing one opened by create) through the mount: the
        stage-out tracks it; an evicted one is brought back (or unmarked, when truncated)."""
        assert self._stage is not None
        inode = self._inode(node)
        with self._stage.holding(inode.key):
            if self._stage.evicted(inode.key) is not None:
                if flags & os.O_TRUNC:
                    self._stage.discard_evicted(inode.key, inode.fd)
                else:
                    self._restore(req, inode, caller)
            with self._lock:
                self._fh_keys[fd] = (inode.key, True)
            self._stage.opened(inode.key, True)
        self._modified(req, inode, caller)

    @staticmethod
    def _open_existing(caller: Caller, parent_fd: int, name: bytes, flags: int) -> int:
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
                os.truncate(_proc(fd), 0)  # O_RDONLY | O_TRUNC truncates too, on Linux
        except BaseException:
            os.close(fd)
            raise
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

    def _opened(self, req: int, fd: int, caller: Caller | None) -> None:
        if self._pacer is None:
            return
        caller = caller or self._caller(req)
        with self._lock:
            self._openers[fd] = caller
        try:
            self._pacer.opened(caller, fd)
        except Exception:
            logger.exception("recording an open file failed; its job's phase ends by time")

    def _data_caller(self, req: int, fh: int, writepage: bool = False) -> Caller:
        """Who a read or write is booked to: its caller, or for a request the kernel makes
        on its own (writeback of a shared mapping: pid 0), whoever opened the file."""
        caller = self._caller(req)
        if caller.pid == 0 or writepage:
            return self._openers.get(fh, caller)
        return caller

    def read(self, req: int, node: int, buf: memoryview, offset: int, fh: int) -> int:
        if self._pacer is not None:
            self._pace(self._data_caller(req, fh), "read", len(buf))
        return os.preadv(self._pfs_fds.get(fh, fh), [buf], offset)

    def write(
        self, req: int, node: int, data: memoryview, offset: int, fh: int, writepage: bool = False
    ) -> int:
        caller = None
        granted = None
        if self._pacer is not None:
            caller = self._data_caller(req, fh, writepage)
            granted = self._pace(caller, "write", len(data))
        try:
            done = os.pwrite(fh, data, offset)
            if not writepage:
                self._clear_setid(req, fh)
            if self._stage is not None:
                self._modified(req, self._inode(node), caller)  # reports the job's resident
        finally:
            self._landed(granted, len(data))  # only now counted as added in the reports
        return done

    def _clear_setid(self, req: int, fd: int, *, handle: bool = True) -> None:
        """Clears set-user-ID / set-group-ID after a write or truncate, as the kernel does on
        a local file system when the caller lacks CAP_FSETID. The kernel leaves it to the file
        system (HANDLE_KILLPRIV, and always for direct_io writes), and the daemon writes as
        root, so BACKING keeps the bits. ``fd``: an open file (``handle``) or an O_PATH one."""
        st = os.fstat(fd)
        if not st.st_mode & _SETID or not stat.S_ISREG(st.st_mode):
            return
        ctx = self._caller(req)
        mode = mode_after_write(st.st_mode, st.st_gid, writer_of(ctx.pid, ctx.gid))
        if mode is None:
            return
        if handle:
            os.fchmod(fd, stat.S_IMODE(mode))
        else:
            os.chmod(_proc(fd), stat.S_IMODE(mode))

    def flush(self, req: int, node: int, fh: int) -> None:
        # close(2) of a duplicate reports what the backing filesystem reports at close,
        # without closing the handle other duplicates of the application's file still use.
        os.close(os.dup(fh))

    def fsync(self, req: int, node: int, datasync: bool, fh: int) -> None:
        self._metadata(req)
        (os.fdatasync if datasync else os.fsync)(fh)

    def release(self, req: int, node: int, fh: int) -> None:
        # Forgotten before it is closed: once closed, its number may be reused by an open.
        if self._stage is not None:
            known = self._forget_handle(fh)
            if known is not None:
                key, writing = known
                try:
                    self._stage.released(key, self._path_of(key), writing)
                except Exception:
                    logger.exception("queueing a closed file for the stage-out failed")
        if self._pacer is not None:
            with self._lock:
                self._openers.pop(fh, None)
            try:
                self._pacer.released(fh)
            except Exception:
                logger.exception("recording a closed file failed")
        os.close(fh)

    def fallocate(self, req: int, node: int, mode: int, offset: int, length: int, fh: int) -> None:
        self._metadata(req)
        syscalls.fallocate(fh, mode, offset, length)
        self._modified(req, self._inode(node))

    def lseek(self, req: int, node: int, offset: int, whence: int, fh: int) -> int:
        # SEEK_DATA / SEEK_HOLE (the kernel answers SEEK_SET/CUR/END itself). The handle's
        # own position is never used (reads and writes are positional).
        return os.lseek(self._pfs_fds.get(fh, fh), offset, whence)

    # ------------------------------------------------------------------ extended attributes

    def getxattr(self, req: int, node: int, name: bytes) -> bytes:
        self._metadata(req)
        if name.startswith(_OWN_XATTRS):
            raise OSError(errno.ENODATA, "no such attribute")
        path = _proc(self._inode(node).fd)
        if name != _CAPABILITY:
            return os.getxattr(path, name)
        if self._no_capability.known_absent(node):
            raise OSError(errno.ENODATA, "no such attribute")
        generation = self._no_capability.generation
        try:
            return os.getxattr(path, name)
        except OSError as err:
            if err.errno == errno.ENODATA:
                self._no_capability.remember(node, generation)
            raise

    def listxattr(self, req: int, node: int) -> bytes:
        self._metadata(req)
        names = os.listxattr(_proc(self._inode(node).fd))
        return b"".join(os.fsencode(n) + b"\0" for n in names if not n.startswith(_OWN_XATTRS_TEXT))

    def setxattr(self, req: int, node: int, name: bytes, value: bytes, flags: int) -> None:
        self._metadata(req)
        _refuse_own(name)
        try:
            os.setxattr(_proc(self._inode(node).fd), name, value, flags)
        finally:
            self._forget_capabilities()

    def removexattr(self, req: int, node: int, name: bytes) -> None:
        self._metadata(req)
        _refuse_own(name)
        try:
            os.removexattr(_proc(self._inode(node).fd), name)
        finally:
            self._forget_capabilities()


def _refuse_own(name: bytes) -> None:
    if name.startswith(_OWN_XATTRS):
        raise OSError(errno.EPERM, "the mount's own attribute")


def _dirent_type(entry: os.DirEntry[str]) -> int:
    # The kernel takes only the file type from a directory entry; d_type spares a stat.
    if entry.is_dir(follow_symlinks=False):
        return stat.S_IFDIR
    if entry.is_symlink():
        return stat.S_IFLNK
    if entry.is_file(follow_symlinks=False):
        return stat.S_IFREG
    return stat.S_IFMT(entry.stat(follow_symlinks=False).st_mode)


__all__ = ["Inode", "PassthroughFS"]
