"""The stage-out's side of files drained while open (`stageout_extents` says how and why).

`OpenDrain` keeps the `OpenExtents` of each file written through a shim while the stage-out
evicts after copy, and does the file-level steps around them:

- `writing`: around each write (and each truncate or fallocate): its chunks in flight, drained
  chunks it touches brought back first (``pace(n)``: the writer's space and bandwidth);
- `read`, `seek`, `drained_bytes`: what a reader sees of a file with drained chunks;
- `drain_open`: one pass over a file still open for writing: its part made (mark first), due
  chunks copied, fsynced, recorded and punched;
- `part_of`, `finished`, `forget`: the part a final copy completes and renames, and the end of
  a file's state;
- `adopt`: a file found with a drained mark at start.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from burstctl.client.job import JobInfo
from burstctl.common.syscalls import proc_path
from burstctl.node.stageout_extents import (
    XATTR_DRAINED,
    Drained,
    OpenExtents,
    drain_pass,
    part_name,
    read_drained,
)
from burstctl.node.stageout_marks import Key
from burstctl.node.stageout_tree import make_parents

logger = logging.getLogger(__name__)

# Holds a job's writers out for a moment: yields True once none has a write in flight, False
# when it could not (a shim that does not tell each write, e.g. the preload library's page).
Freeze = Callable[[JobInfo | None], contextlib.AbstractContextManager[bool]]
# The same for one file of a job (`StageOut` adds its hold on the file: no new open meanwhile).
FileFreeze = Callable[[Key, JobInfo | None], contextlib.AbstractContextManager[bool]]


class OpenDrain:
    """The open files' chunks on one stage-out (``pfs``: PFS_DIR); thread-safe."""

    def __init__(
        self,
        pfs: Path,
        stopping: threading.Event,
        clock: Callable[[], float] = time.monotonic,
        freeze: FileFreeze | None = None,
    ) -> None:
        self._pfs = pfs
        self._stopping = stopping
        self._clock = clock
        self._lock = threading.Lock()
        self._files: dict[Key, OpenExtents] = {}
        # A shim that does not tell its writes (`writing`) holds them out instead: see
        # `stageout_extents.drain_pass`. Its readers are counted: a file some process
        # reads is not drained (that process would read holes where chunks left).
        self.freeze = freeze
        self._readers: dict[Key, int] = {}

    def get(self, key: Key) -> OpenExtents | None:
        return self._files.get(key)

    def _for(self, key: Key) -> OpenExtents:
        with self._lock:
            extents = self._files.get(key)
            if extents is None:
                extents = self._files[key] = OpenExtents()
            return extents

    # ------------------------------------------------------------------ writers

    @contextlib.contextmanager
    def writing(
        self, key: Key, path_fd: int, offset: int, length: int, pace: Callable[[int], None]
    ) -> Iterator[int]:
        """Around a change of [offset, offset+length) of the file (``path_fd``: any handle on
        it): yields the bytes brought back onto the buffer first (0 mostly)."""
        extents = self._for(key)
        need = extents.begin_write(offset, length, self._clock())
        try:
            moved = 0
            if need:
                pace(len(need) * extents.chunk)
                moved = self._restore(extents, path_fd, need)
            yield moved
        finally:
            extents.end_write(offset, length)

    def _restore(self, extents: OpenExtents, path_fd: int, chunks: list[int]) -> int:
        fd = os.open(proc_path(path_fd), os.O_WRONLY | os.O_CLOEXEC)
        try:
            return extents.restore(chunks, fd, proc_path(fd))
        finally:
            os.close(fd)

    def cut(self, key: Key, path_fd: int, size: int, pace: Callable[[int], None]) -> None:
        """Before a truncate to ``size``: the chunk across it brought back, those past it
        dropped (and the part cut)."""
        extents = self._files.get(key)
        if extents is None:
            return
        if not extents.has_drained() or size % extents.chunk == 0:
            extents.cut(size, proc_path(path_fd))
            return
        with self.writing(key, path_fd, size, 1, pace):
            extents.cut(size, proc_path(path_fd))

    def closed(self, key: Key) -> None:
        """The file's last writer closed it: what was kept of its writes goes, unless chunks of
        it left for a part (its final copy needs that)."""
        with self._lock:
            extents = self._files.get(key)
            if (
                extents is not None
                and extents.drained is None  # no part, nor one being made
                and not extents.passing
                and not extents.busy()
            ):
                del self._files[key]

    def pending(self, key: Key) -> bool:
        """Whether the file has chunks a pass may drain later."""
        extents = self._files.get(key)
        return extents is not None and extents.waiting()

    # ------------------------------------------------------------------ readers

    def read(self, key: Key | None, fd: int, buf: memoryview, offset: int) -> int:
        extents = None if key is None else self._files.get(key)
        if extents is None:
            return os.preadv(fd, [buf], offset)
        return extents.read(fd, buf, offset)

    def seek(self, key: Key | None, fd: int, offset: int, whence: int) -> int:
        extents = None if key is None else self._files.get(key)
        if extents is None:
            return os.lseek(fd, offset, whence)
        return extents.seek(fd, offset, whence)

    def drained_bytes(self, key: Key) -> int:
        extents = self._files.get(key)
        return 0 if extents is None else extents.drained_bytes()

    # ------------------------------------------------------------------ the drain

    def drain_open(
        self, key: Key, rel: str, root: int, pace: Callable[[int], None], job: JobInfo | None
    ) -> int:
        """One pass over the open file at ``rel`` under BACKING (open as ``root``), of
        ``job``. Returns the bytes punched; OSError when the file or the PFS fails (the
        caller retries)."""
        freeze = None
        if self.freeze is not None:
            if self._readers.get(key):
                return 0
            freeze = functools.partial(self.freeze, key, job)
            self._for(key)
        with self._lock:  # `closed` keeps what a pass works on (it may make the part)
            extents = self._files.get(key)
            if extents is None:
                return 0
            extents.passing = True
        try:
            return self._pass(extents, key, rel, root, pace, freeze)
        finally:
            with self._lock:
                extents.passing = False

    def _pass(
        self,
        extents: OpenExtents,
        key: Key,
        rel: str,
        root: int,
        pace: Callable[[int], None],
        freeze: Callable[[], contextlib.AbstractContextManager[bool]] | None,
    ) -> int:
        src = os.open(rel, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
        try:
            st = os.fstat(src)
            if (st.st_dev, st.st_ino) != key:
                return 0
            if extents.part_fd is None:
                self._make_part(extents, src, rel, root)
            return drain_pass(
                extents, src, proc_path(src), pace, self._stopping, self._clock, freeze
            )
        finally:
            os.close(src)

    def _make_part(self, extents: OpenExtents, src: int, rel: str, root: int) -> None:
        """Names the part in the file's mark, then makes it: a part never exists that no
        mark names."""
        part = part_name(rel, secrets.token_hex(4))
        drained = Drained(part, extents.chunk)
        os.setxattr(proc_path(src), XATTR_DRAINED, drained.encode())
        make_parents(self._pfs, root, os.path.dirname(rel))
        extents.part_fd = os.open(
            self._pfs / part, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
        )
        extents.drained = drained

    # ------------------------------------------------------------------ a shim's readers

    def read_opened(self, key: Key, path_fd: int, pace: Callable[[int], None]) -> None:
        """A process of a shim that does not read through `read` opened the file to read
        (under `StageOut.holding`): its drained chunks come back onto the buffer first
        (``pace(n)``: the opener's space), and none leaves until it closes."""
        with self._lock:
            self._readers[key] = self._readers.get(key, 0) + 1
        extents = self._files.get(key)
        if extents is not None and extents.drained is not None:
            chunks = extents.drained.within(0, 1 << 62)
            if chunks:
                pace(len(chunks) * extents.chunk)
                self._restore(extents, path_fd, chunks)

    def read_closed(self, key: Key) -> None:
        with self._lock:
            left = self._readers.get(key, 0) - 1
            if left > 0:
                self._readers[key] = left
            else:
                self._readers.pop(key, None)

    def part_of(self, key: Key) -> Path | None:
        """The part of a file that has one (its final copy completes it: `fill`)."""
        extents = self._files.get(key)
        if extents is None or extents.drained is None or extents.part_fd is None:
            return None
        return self._pfs / extents.drained.part

    def fill(
        self, key: Key, src: int, pace: Callable[[int], None], stopping: threading.Event
    ) -> None:
        """Completes the part of a closed file with what is still on the buffer."""
        extents = self._files.get(key)
        if extents is not None and extents.part_fd is not None:
            extents.fill(src, pace, stopping)

    def finished(self, key: Key, path_fd: int | None) -> None:
        """The file's final copy is renamed (or it is gone): its state and mark go."""
        with self._lock:
            extents = self._files.pop(key, None)
        if extents is None:
            return
        if extents.part_fd is not None:
            os.close(extents.part_fd)
            extents.part_fd = None
        if path_fd is not None:
            with contextlib.suppress(OSError):
                os.removexattr(proc_path(path_fd), XATTR_DRAINED)

    def forget(self, key: Key) -> None:
        """The file's last name is gone: its part too."""
        with self._lock:
            extents = self._files.pop(key, None)
        if extents is None or extents.drained is None:
            return
        if extents.part_fd is not None:
            os.close(extents.part_fd)
        with contextlib.suppress(OSError):
            os.unlink(self._pfs / extents.drained.part)

    def adopt(self, key: Key, path_fd: int, rel: str) -> bool:
        """A file found at start with a drained mark: its part opened again. False when its
        part is gone because the final copy was renamed before the crash (the caller marks
        it copied); a part gone otherwise is logged (its drained bytes are lost)."""
        drained = read_drained(proc_path(path_fd))
        if drained is None:
            return True
        try:
            part_fd = os.open(self._pfs / drained.part, os.O_RDWR | os.O_CLOEXEC)
        except OSError as err:
            if err.errno != errno.ENOENT:
                raise
            if (self._pfs / rel).exists():
                return False
            logger.error(
                "stage-out: the part %s of %s is missing: its drained bytes are lost",
                drained.part,
                rel,
            )
            with contextlib.suppress(OSError):
                os.removexattr(proc_path(path_fd), XATTR_DRAINED)
            return True
        with self._lock:
            self._files[key] = OpenExtents(drained, part_fd)
        return True
