"""The inodes the kernel knows: an ``O_PATH`` handle each, and how many handles are kept.

`InodeTable` keeps one `Inode` per backing node the kernel holds references to, keyed by its
node id (the mount's own numbering, `ROOT_ID` the root) and by its backing (device, inode
number), so hard links are one kernel inode. The kernel counts its references (``nlookup``)
and gives them back in ``forget``; the handle is closed when the count reaches 0. Every
operation of the file system is relative to such a handle, never a rebuilt path: depth is not
limited by PATH_MAX, the backing directory may be the mount point itself, and a file unlinked
or replaced while open is still reached.

Handles are kept up to a budget under the open-file limit (`handle_budget`); past it a valve
thread asks the kernel to drop the least recently looked-up names, after which it forgets their
inodes unless they are in use.

The table is also how the daemon tells the kernel it changed a node on its own (`refresh`, and
`changed` for the stage-out, which knows files by key): set-id bits cleared after a write, a
file evicted from the buffer or brought back. The kernel then drops the attributes it cached,
and its next ``stat`` asks the daemon (docs/fuse.md, "Cache coherence"). Both go through
``kernel``, given when the table is built: the binding's `KernelNotifier`, which answers
-ENOTCONN while no FUSE session is up.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import resource
import threading
from collections import OrderedDict
from typing import Protocol

from burstctl.common.syscalls import proc_path
from burstctl.fuse_shim._fuse import ROOT_ID

logger = logging.getLogger(__name__)

PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_VALVE_INTERVAL = 0.05  # seconds between two passes of the handle valve, at least

Key = tuple[int, int]  # (st_dev, st_ino) of a backing node


class KernelCache(Protocol):
    """What the table asks of the kernel's caches (the binding's `KernelNotifier`): each
    answers 0 or a negative errno, -ENOTCONN while no FUSE session is up."""

    def invalidate_entry(self, parent: int, name: bytes) -> int:
        """Drops the (parent, name) entry; the kernel then forgets the inode unless in use."""

    def invalidate_inode(self, node: int, offset: int = -1, length: int = 0) -> int:
        """Drops the node's cached attributes (and pages from ``offset``, when >= 0)."""


class Inode:
    """A backing node the kernel knows: its O_PATH handle, the kernel's reference count, and
    the (parent node, name) it was last looked up by (to ask the kernel to drop it)."""

    __slots__ = ("fd", "key", "name", "nlookup", "node", "parent")

    def __init__(
        self, node: int, fd: int, key: Key, nlookup: int, parent: int, name: bytes
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


class InodeTable:
    """The inodes the kernel knows, the root (open as ``root_fd``, owned by the caller) first;
    thread-safe. ``handles``: the budget (default: `handle_budget` of the open-file limit).
    ``kernel``: its caches, told of dropped names and changed nodes (None: no kernel to tell,
    and the handles are never given back)."""

    def __init__(
        self,
        root_fd: int,
        handles: int | None = None,
        kernel: KernelCache | None = None,
    ) -> None:
        self._lock = threading.Lock()
        root_st = os.fstat(root_fd)
        root = Inode(ROOT_ID, root_fd, (root_st.st_dev, root_st.st_ino), 1, ROOT_ID, b"")
        # In least recently looked-up order (the root never leaves).
        self._nodes: OrderedDict[int, Inode] = OrderedDict({ROOT_ID: root})
        self._by_key: dict[Key, Inode] = {root.key: root}
        self._next_node = ROOT_ID + 1
        if handles is None:
            handles = handle_budget(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        self.budget = handles
        self._kernel = kernel
        self.invalidated = 0  # names the valve asked the kernel to drop (tests, logs)
        self._valve_wanted = threading.Event()
        self._valve_stopped = False
        self._valve_closed = threading.Event()  # never set: the valve's pacing clock
        self._valve: threading.Thread | None = None

    def get(self, node: int) -> Inode:
        """The inode ``node``; ESTALE for one the kernel was never told of, or forgot."""
        inode = self._nodes.get(node)
        if inode is None:  # the kernel never names a node it forgot; be loud if it does
            raise OSError(errno.ESTALE, "unknown node")
        return inode

    @property
    def known(self) -> int:
        """How many inodes the kernel holds references to (the root included)."""
        return len(self._nodes)

    def remember(self, fd: int, st: os.stat_result, parent: int, name: bytes) -> int:
        """The kernel learns of the node open as ``fd`` (taken over), as ``name`` in
        ``parent``: one more reference. Returns its node id."""
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
            over = len(self._nodes) > self.budget
        if fd >= 0:
            os.close(fd)
        if over:
            self._open_valve()
        return inode.node

    def look_up(self, parent: int, name: bytes) -> tuple[int, os.stat_result]:
        """``name`` in the directory ``parent``, remembered (`remember`): its node id and
        attributes."""
        fd = os.open(name, PATH_FLAGS, dir_fd=self.get(parent).fd)
        try:
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        return self.remember(fd, st, parent, name), st

    def forget(self, node: int, nlookup: int) -> None:
        """The kernel gives back ``nlookup`` references; the handle closes with the last."""
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

    def path_of(self, key: Key) -> str | None:
        """Where the node ``key`` is now, if the kernel knows it (its O_PATH handle's link)."""
        with self._lock:
            inode = self._by_key.get(key)
            fd = None if inode is None else inode.fd
        if fd is None:
            return None
        try:
            return os.readlink(proc_path(fd))
        except OSError:
            return None

    def refresh(self, node: int) -> None:
        """The daemon changed ``node``'s attributes on its own: the kernel drops those it
        cached, so that its next ``stat`` asks. Attributes only, which is safe from within a
        request on the node (`KernelNotifier.invalidate_inode`). Never raises."""
        if self._kernel is None:
            return
        answer = self._kernel.invalidate_inode(node)
        if answer not in (0, -errno.ENOENT, -errno.ENOTCONN):
            # -ENOENT: the kernel had forgotten it; -ENOTCONN: not mounted (yet, or any more).
            logger.warning("the kernel refused to drop the attributes of node %d: %d", node, answer)

    def changed(self, key: Key) -> None:
        """`refresh` of the node ``key``, if the kernel knows it: the stage-out's hook after
        it evicted a file, brought one back or punched holes in it. Never raises."""
        with self._lock:
            inode = self._by_key.get(key)
        if inode is not None:
            self.refresh(inode.node)

    # ------------------------------------------------------------------ the valve

    def _open_valve(self) -> None:
        self._valve_wanted.set()
        if self._valve is not None or self._kernel is None:
            return
        with self._lock:
            if self._valve is not None:
                return
            self._valve = threading.Thread(
                target=self._drain_handles, name="burstctl-handles", daemon=True
            )
        self._valve.start()

    def stop_valve(self, timeout: float | None = None) -> None:
        """Ends the valve thread (after its pass in progress, if any) and waits for it."""
        self._valve_stopped = True
        self._valve_wanted.set()
        valve = self._valve
        if valve is not None:
            valve.join(timeout)

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
            kernel = self._kernel
            if kernel is None or self._valve_stopped:
                return
            with self._lock:
                excess = max(0, len(self._nodes) - self.budget * 9 // 10)
                oldest = list(itertools.islice(self._nodes.values(), 1, 1 + excess))
                for inode in oldest:
                    self._nodes.move_to_end(inode.node)  # one in use comes round again later
                names = [(inode.parent, inode.name) for inode in oldest]
            for parent, name in names:
                answer = kernel.invalidate_entry(parent, name)
                if answer == -errno.ENOTCONN:
                    break  # no FUSE session (not yet, or no more): nothing to drop now
                if answer in (0, -errno.ENOENT):
                    self.invalidated += 1
            if names:
                logger.debug("asked the kernel to drop %d names (handle budget)", len(names))
