"""What an eviction does and undoes: the `StageOut`'s evicted files and their restore.

`Evictions` is the part of `stageout.StageOut` that owns a file's residency once it is copied:
the eviction of a copied file nobody has open (`_evict_one`: marked evicted, then truncated),
the final copy and eviction of a file drained while it was open (`_final_open`,
`_evict_drained`, `_adopt_open` at start), and what the shims do with an evicted file: its PFS
copy to read (`open_pfs`), its mark dropped when it is truncated to 0 (`discard_evicted`) or
moved when its mtime is set (`restamped`, which gives any tracked file's PFS copy the metadata
set through the mount), and its data brought back before it is changed (`restore`). Every
step runs under the file's `holding` lock.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from burstctl.client.job import JobInfo
from burstctl.node.stageout_copy import CopyError, copy_back, copy_to_pfs
from burstctl.node.stageout_marks import (
    XATTR_EVICTED,
    Evicted,
    Key,
    Tracked,
    mark_copied,
    mark_evicted,
    relative_path,
    signature,
)
from burstctl.node.stageout_open import OpenDrain
from burstctl.node.stageout_schedule import ReportTimer
from burstctl.node.stageout_tree import restamp

logger = logging.getLogger(__name__)


class Evictions:
    """Mixed into `stageout.StageOut`, whose state it shares (declared here for the types)."""

    _lock: threading.Lock
    _files: dict[Key, Tracked]
    _gen: dict[Key, int]
    _opens: dict[Key, int]
    _writers: dict[Key, int]
    _pfs: Path | None
    _root: int
    _backing: str
    _stopping: threading.Event
    _reports: ReportTimer
    open: OpenDrain | None
    copies: int
    evictions: int

    if TYPE_CHECKING:  # StageOut's own

        def holding(self, key: Key) -> contextlib.AbstractContextManager[None]: ...
        def _set_allocated(self, tracked: Tracked, allocated: int) -> None: ...
        def _observe(self, tracked: Tracked, st: os.stat_result, gen: int) -> None: ...
        def _failed(self, key: Key, tracked: Tracked, cause: str) -> None: ...
        def _succeeded(self, tracked: Tracked) -> None: ...
        def _drain_paced(self, job: JobInfo | None, nbytes: int) -> None: ...
        def changed(self, key: Key) -> None: ...

    def evicted(self, key: Key) -> Evicted | None:
        tracked = self._files.get(key)
        return None if tracked is None else tracked.evicted

    def open_pfs(self, evicted: Evicted) -> int:
        """A read-only descriptor of the PFS copy of an evicted file."""
        if self._pfs is None:
            raise OSError(errno.EIO, "evicted, and no --stage-out to read it from")
        return os.open(self._pfs / evicted.pfs, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)

    def discard_evicted(self, key: Key, path_fd: int) -> None:
        """An evicted file about to be truncated to 0 (under `holding`): nothing to bring
        back; the mark goes."""
        tracked = self._files.get(key)
        if tracked is None or tracked.evicted is None:
            return
        with contextlib.suppress(OSError):
            os.removexattr(f"/proc/self/fd/{path_fd}", XATTR_EVICTED)
        with self._lock:
            tracked.evicted = None

    def restamped(self, key: Key, path_fd: int, new_name: str | None = None) -> None:
        """Mode, owner, times, xattrs or (``new_name``: a hard link's path) names set through
        the mount on a tracked file: its PFS copy takes them, an evicted file's mark a new
        mtime (`stageout_tree.restamp`)."""
        tracked = self._files.get(key)
        if tracked is not None and self._pfs is not None:
            with self.holding(key):
                with self._lock:
                    gen = None if self._writers.get(key) else self._gen.get(key, 0)
                name = None if new_name is None else relative_path(self._backing, new_name)
                restamp(self._pfs, self._root, path_fd, tracked, gen, name, self._lock)

    def restore(self, key: Key, path_fd: int, pace: Callable[[int], None]) -> None:
        """Brings an evicted file back onto the buffer (under `holding`): copies its PFS copy
        into the backing file, ``pace(n)`` before each chunk (space and the opener's I/O),
        restores its mtime and clears the mark. OSError if the PFS copy cannot be read."""
        tracked = self._files.get(key)
        if tracked is None or tracked.evicted is None:
            return
        src = self.open_pfs(tracked.evicted)
        try:
            st = copy_back(src, path_fd, tracked.evicted.mtime_ns, pace)
        finally:
            os.close(src)
        with self._lock:
            tracked.evicted = None
            tracked.copied = signature(st)
            tracked.copied_gen = self._gen.get(key, 0)
            self._observe(tracked, st, tracked.copied_gen)
        self.changed(key)
        logger.info("stage-out: restored %s from the PFS (%d bytes)", tracked.rel, st.st_size)

    def _final_open(self, key: Key, tracked: Tracked, src: int, rel: str, part: Path) -> None:
        """The final copy of a closed file whose chunks were drained while it was open: the
        rest completes its part, which takes the final name; the file is evicted at once
        (its drained bytes are only there). Opens wait meanwhile (`holding`)."""
        assert self.open is not None and self._pfs is not None
        with self.holding(key):
            with self._lock:
                if self._opens.get(key):
                    return  # opened again: its last close queues it
                gen0 = self._gen.get(key, 0)
            st = os.fstat(src)
            pace = functools.partial(self._drain_paced, tracked.job)
            try:
                self.open.fill(key, src, pace, self._stopping)
            except OSError as err:
                self._failed(key, tracked, f"cannot complete the copy of {rel}: {err.strerror}")
                return
            try:
                copy_to_pfs(src, st, rel, self._pfs, self._root, pace, self._stopping, part=part)
            except CopyError as err:
                self._failed(key, tracked, err.cause)
                return
            if self._stopping.is_set():
                return
            self._evict_drained(key, tracked, src, st, rel, gen0)
        self.changed(key)
        self.copies += 1
        self._succeeded(tracked)
        self._reports.soon()

    def _evict_drained(
        self, key: Key, tracked: Tracked, fd: int, st: os.stat_result, rel: str, gen: int
    ) -> None:
        """A file whose final copy took its part's place: marked copied and evicted, its
        drained mark dropped, truncated (under `holding`). Evicted in memory before its
        drain ends and before it is truncated: the mount shows it (``shown``) from the one
        or the other, never as the empty backing file (a size the kernel would cache)."""
        assert self.open is not None
        proc = f"/proc/self/fd/{fd}"
        evicted = Evicted(st.st_size, st.st_mtime_ns, rel)
        mark_copied(proc, st)
        mark_evicted(proc, evicted)
        with self._lock:
            tracked.copied, tracked.copied_gen, tracked.evicted = signature(st), gen, evicted
            self._set_allocated(tracked, 0)
        self.open.finished(key, fd)
        os.truncate(proc, 0)
        self.evictions += 1

    def _adopt_open(self) -> None:
        """Files found at start with drained chunks: their parts opened again; one whose
        final copy was renamed before a crash finishes its eviction."""
        if self.open is None:
            return
        for key, tracked in list(self._files.items()):
            if tracked.evicted is not None:
                continue
            try:
                fd = os.open(
                    tracked.rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._root
                )
            except OSError:
                continue
            try:
                if not self.open.adopt(key, fd, tracked.rel):
                    st = os.fstat(fd)
                    self._evict_drained(key, tracked, fd, st, tracked.rel, 0)
                    logger.info("stage-out: finished %s (its copy was complete)", tracked.rel)
            except OSError as err:
                logger.error("stage-out: cannot resume the drain of %s: %s", tracked.rel, err)
            finally:
                os.close(fd)

    def _evict_one(self, key: Key, tracked: Tracked, src: int, rel: str, gen: int) -> None:
        with self.holding(key):
            st = os.fstat(src)
            with self._lock:
                if (
                    self._opens.get(key)
                    or self._gen.get(key, 0) != gen
                    or tracked.copied != signature(st)
                    or tracked.evicted is not None
                ):
                    return
            evicted = Evicted(st.st_size, st.st_mtime_ns, rel)
            proc = f"/proc/self/fd/{src}"
            try:
                mark_evicted(proc, evicted)
            except OSError as err:
                logger.warning("stage-out: cannot mark %s evicted (kept): %s", rel, err)
                return
            with self._lock:
                tracked.evicted = evicted
                self._set_allocated(tracked, 0)
            try:
                os.truncate(proc, 0)
            except OSError as err:
                # Served from the PFS all the same; its blocks come back at the next start.
                logger.warning("stage-out: cannot truncate evicted %s: %s", rel, err)
        self.changed(key)
        self.evictions += 1
        logger.debug("stage-out: evicted %s (%d bytes)", rel, st.st_size)
        self._reports.soon()
