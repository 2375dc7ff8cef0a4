"""What a file system served by the binding implements (`Operations`) and the values its
methods take and return: who made a request (`Context`), a looked-up name (`Entry`), an open
file (`Opened`), the changes of a setattr (`SetAttr`), a directory's entries packed as the
kernel reads them (`Listing`).
"""

from __future__ import annotations

import bisect
import ctypes
import os
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from burstctl.fuse_shim._fuse.lowlevel import req_ctx


@dataclass(frozen=True, slots=True)
class Context:
    """Who made a request: uid, gid (the caller's fsuid/fsgid) and pid (a thread id; 0 for
    requests the kernel makes on its own, e.g. writeback of a shared mapping)."""

    uid: int
    gid: int
    pid: int


def request_context(req: int) -> Context:
    """The caller of the request ``req``."""
    ctx = req_ctx(req).contents
    return Context(ctx.uid, ctx.gid, ctx.pid)


@dataclass(frozen=True, slots=True)
class Entry:
    """A looked-up name: the kernel's node id for it and its attributes."""

    node: int
    attr: os.stat_result


@dataclass(frozen=True, slots=True)
class Opened:
    """An open file or directory: the handle the kernel passes back, and how it is cached."""

    fh: int
    direct_io: bool = False
    keep_cache: bool = False
    # No FLUSH request at close(2) (libfuse 3; libfuse 2 always sends it).
    noflush: bool = False


@dataclass(frozen=True, slots=True)
class SetAttr:
    """The changes of one setattr: a field is None when it is not changed.

    Times are nanoseconds since the epoch, or `NOW`.
    """

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    size: int | None = None
    atime: int | None = None
    mtime: int | None = None


NOW = -1  # SetAttr.atime / mtime: the current time


class Operations(Protocol):
    """What `serve` needs of a file system. Every method may raise `OSError` (its errno is
    the reply); ``req`` is the request, for `request_context`. Node ids are the file
    system's own (`ROOT_ID` is the root); ``fh`` is what ``open``/``create``/``opendir``
    returned, None when the kernel sent none."""

    attr_timeout: float
    entry_timeout: float
    negative_timeout: float

    def init(self, conn: Any, is_v3: bool, fuse_session: int) -> None: ...
    def destroy(self) -> None: ...
    def lookup(self, req: int, parent: int, name: bytes) -> Entry: ...
    def forget(self, node: int, nlookup: int) -> None: ...
    def getattr(self, req: int, node: int, fh: int | None) -> os.stat_result: ...
    def setattr(self, req: int, node: int, change: SetAttr, fh: int | None) -> os.stat_result: ...
    def readlink(self, req: int, node: int) -> bytes: ...
    def mknod(self, req: int, parent: int, name: bytes, mode: int, rdev: int) -> Entry: ...
    def mkdir(self, req: int, parent: int, name: bytes, mode: int) -> Entry: ...
    def unlink(self, req: int, parent: int, name: bytes) -> None: ...
    def rmdir(self, req: int, parent: int, name: bytes) -> None: ...
    def symlink(self, req: int, target: bytes, parent: int, name: bytes) -> Entry: ...
    def rename(
        self, req: int, parent: int, name: bytes, new_parent: int, new_name: bytes, flags: int
    ) -> None: ...
    def link(self, req: int, node: int, new_parent: int, new_name: bytes) -> Entry: ...
    def open(self, req: int, node: int, flags: int) -> Opened: ...
    def create(
        self, req: int, parent: int, name: bytes, mode: int, flags: int
    ) -> tuple[Entry, Opened]: ...
    def read(self, req: int, node: int, buf: memoryview, offset: int, fh: int) -> int: ...
    def write(
        self, req: int, node: int, data: memoryview, offset: int, fh: int, writepage: bool
    ) -> int: ...
    def flush(self, req: int, node: int, fh: int) -> None: ...
    def release(self, req: int, node: int, fh: int) -> None: ...
    def fsync(self, req: int, node: int, datasync: bool, fh: int) -> None: ...
    def opendir(self, req: int, node: int) -> Opened: ...
    def readdir(self, req: int, node: int, offset: int, fh: int) -> Listing: ...
    def readdir_entry(self, parent: int, name: bytes) -> Entry: ...
    def releasedir(self, req: int, node: int, fh: int) -> None: ...
    def fsyncdir(self, req: int, node: int, datasync: bool, fh: int) -> None: ...
    def statfs(self, req: int, node: int) -> os.statvfs_result: ...
    def setxattr(self, req: int, node: int, name: bytes, value: bytes, flags: int) -> None: ...
    def getxattr(self, req: int, node: int, name: bytes) -> bytes: ...
    def listxattr(self, req: int, node: int) -> bytes: ...
    def removexattr(self, req: int, node: int, name: bytes) -> None: ...
    def access(self, req: int, node: int, mask: int) -> None: ...
    def fallocate(
        self, req: int, node: int, mode: int, offset: int, length: int, fh: int
    ) -> None: ...
    def lseek(self, req: int, node: int, offset: int, whence: int, fh: int) -> int: ...


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One directory entry for readdir: its name, inode number, file type (S_IFMT bits),
    and the offset at which the next readdir continues after it."""

    name: bytes
    ino: int
    mode: int
    next_offset: int


_DIRENT = struct.Struct("<QQII")  # fuse_kernel.h struct fuse_dirent, before the name


class Listing:
    """A directory's entries, packed once in the form the kernel reads them (``struct
    fuse_dirent``, 8-byte aligned): each readdir request is then one slice of whole records,
    with no Python work per entry."""

    def __init__(self, entries: Sequence[DirEntry]) -> None:
        self.entries = list(entries)
        parts: list[bytes] = []
        ends: list[int] = []
        end = 0
        for entry in self.entries:
            size = (_DIRENT.size + len(entry.name) + 7) & ~7
            head = _DIRENT.pack(entry.ino, entry.next_offset, len(entry.name), entry.mode >> 12)
            parts.append(head + entry.name + bytes(size - _DIRENT.size - len(entry.name)))
            end += size
            ends.append(end)
        self._ends = ends
        self._buffer = ctypes.create_string_buffer(b"".join(parts), max(end, 1))
        self._address = ctypes.addressof(self._buffer)

    def chunk(self, offset: int, size: int) -> tuple[int, int]:
        """(address, length) of the records from entry ``offset`` on that fit in ``size``."""
        if offset >= len(self._ends):
            return self._address, 0
        start = self._ends[offset - 1] if offset > 0 else 0
        fit = bisect.bisect_right(self._ends, start + size)  # entries ending within the size
        end = self._ends[fit - 1] if fit > offset else start
        return self._address + start, end - start


def file_type(mode: int) -> int:
    """The S_IFMT bits of ``mode`` (what a directory entry carries)."""
    return stat.S_IFMT(mode)
