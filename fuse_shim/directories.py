"""The directories the kernel has open through the mount, and their listings.

A directory open through the mount (``opendir``) is a backing descriptor of its own, kept until
``releasedir``. Its listing (`_fuse.Listing`, the entries packed as the kernel reads them) is
taken at its first read and again at each rewind (offset 0); later reads continue in it by
offset, so entries added or removed meanwhile neither repeat nor go missing within one pass.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from dataclasses import dataclass

from burstctl.common.syscalls import proc_path
from burstctl.fuse_shim._fuse import DirEntry, Listing


@dataclass
class Directory:
    """An open directory: its backing descriptor, and its listing once taken."""

    fd: int
    listing: Listing | None = None

    def list(self, is_root: bool) -> Listing:
        """Takes the listing (again): ``.`` and ``..`` first, then the backing entries."""
        self.listing = Listing(list_entries(self.fd, is_root))
        return self.listing


class OpenDirectories:
    """The directories open through the mount, by the handle the kernel passes back;
    thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, Directory] = {}

    def open(self, path_fd: int) -> int:
        """Opens the directory whose ``O_PATH`` handle is ``path_fd``; its handle."""
        fd = os.open(proc_path(path_fd), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        with self._lock:
            self._open[fd] = Directory(fd)
        return fd

    def get(self, fh: int) -> Directory:
        directory = self._open.get(fh)
        if directory is None:
            raise OSError(errno.EBADF, "unknown directory handle")
        return directory

    def close(self, fh: int) -> None:
        with self._lock:
            directory = self._open.pop(fh, None)
        if directory is not None:
            os.close(directory.fd)


def list_entries(fd: int, is_root: bool) -> list[DirEntry]:
    """The entries of the directory open as ``fd``."""
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
                    os.fsencode(entry.name), entry.inode(), _dirent_type(entry), len(entries) + 1
                )
            )
    return entries


def _dirent_type(entry: os.DirEntry[str]) -> int:
    # The kernel takes only the file type from a directory entry; d_type spares a stat.
    if entry.is_dir(follow_symlinks=False):
        return stat.S_IFDIR
    if entry.is_symlink():
        return stat.S_IFLNK
    if entry.is_file(follow_symlinks=False):
        return stat.S_IFREG
    return stat.S_IFMT(entry.stat(follow_symlinks=False).st_mode)
