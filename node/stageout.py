"""Stage-out: the mount copies the files written through it to the parallel file system.

`StageOut` keeps, per job, an index of the files the job wrote through the mount (tagged on the
backing file, `stageout_marks`, and recorded in a journal, `stageout_journal`, from which a
restart rebuilds the index without scanning BACKING), and drains them to ``PFS_DIR``:

- `PassthroughFS` tells it (through `staged.StagedFiles`) of every modification (`modified`:
  write, truncate, fallocate, create), which bumps the file's *write generation*, and of every
  open and close; the last close of a file it tracks queues the file (`stageout_schedule`).
- Worker threads (`DRAIN_WORKERS`, never two on one file) copy a queued file to the same
  relative path under ``PFS_DIR``, paced by the job's drain stream (`DrainHooks.drain`;
  `stageout_copy` says how a copy is made durable). The generation is read before and after: a
  file written during its copy is queued again (the copy, complete, stays) and is not evicted.
  A good copy is marked on the backing file; a file open for writing is copied after its
  writer's last close.
- ``evict``: a copied file that nobody has open is marked evicted and truncated to 0; the mount
  then serves it from the PFS copy (`evicted`, `open_pfs`) until it is opened for writing,
  which `restore`s it first.
- A failed copy is retried with a backoff, logged once per cause, and reported as the job's
  ``drain_error`` until a copy of the job succeeds (`stageout_schedule.DrainErrors`).
- Each job's ``resident`` (allocated bytes of its files on the buffer, kept as a running sum as
  files are written, evicted, restored, unlinked) and ``pending`` (those not copied yet) go to
  `DrainHooks.report_buffer` after every write through the mount (the controller compares
  ``resident`` with the bytes the client ``added``: a resident that lagged behind the writes
  would let it grant more than S), every `report_interval`, and soon after an eviction.

Crash safety (`start`, `stageout_journal.recover`): temporaries left in PFS_DIR are removed,
evictions a crash interrupted are finished (`stageout_marks`), and every tracked file whose
copied mark does not match its current mtime and size is queued again.

Nothing here raises into the application's I/O: the file system calls that cannot fail.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from burstctl.client.job import JobInfo
from burstctl.node.stageout_copy import CopyError, copy_back, copy_to_pfs
from burstctl.node.stageout_journal import Journal, recover
from burstctl.node.stageout_marks import (
    XATTR_EVICTED,
    Evicted,
    Key,
    Tracked,
    encode_job,
    mark_copied,
    mark_evicted,
    relative_path,
    scan,
    signature,
    write_tag,
)
from burstctl.node.stageout_schedule import CopyQueue, DrainErrors, ReportTimer, retry_delay

logger = logging.getLogger(__name__)

RETRY_MIN = 1.0
RETRY_MAX = 30.0
REPORT_INTERVAL = 0.5
RESCAN_INTERVAL = 5.0  # at most one rescan of BACKING this often (a tracked file lost its path)
DRAIN_WORKERS = 2


class DrainHooks(Protocol):
    """What the drain needs of the controller's side (the `Pacer`; tests pass fakes)."""

    def drain(self, job: JobInfo, nbytes: int) -> None:
        """Paces ``nbytes`` of the job's copy to the PFS (its drain stream)."""

    def report_buffer(self, job: JobInfo, resident: int, pending: int, error: str) -> None:
        """The job's gauges on the buffer."""


def _decrement(counts: dict[Key, int], key: Key) -> int:
    left = counts.get(key, 1) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
    return max(0, left)


class StageOut:
    """The drain of one mount's BACKING (open as ``backing_fd``, at ``backing``) to ``pfs``.

    Without ``pfs`` (a mount with a controller but no ``--stage-out``) it keeps the index and
    reports the jobs' resident bytes; nothing is copied, nothing evicted. ``path_of(key)``:
    where a node is now, asked of the mount's inode table (`inodes.InodeTable.path_of`) when a
    tracked file is no longer where it was. ``journal``: where the tracked files are recorded
    (None: every start scans BACKING).
    """

    def __init__(
        self,
        backing_fd: int,
        backing: Path,
        pfs: Path | None,
        *,
        evict: bool,
        hooks: DrainHooks | None = None,
        path_of: Callable[[Key], str | None] | None = None,
        journal: Journal | None = None,
        report_interval: float = REPORT_INTERVAL,
        retry_min: float = RETRY_MIN,
        retry_max: float = RETRY_MAX,
        workers: int = DRAIN_WORKERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._root = backing_fd
        self._backing = str(backing)
        self._pfs = pfs
        self._evict = evict
        self._hooks = hooks
        self._retry_min = retry_min
        self._retry_max = retry_max
        self._workers = workers
        self._clock = clock
        self._lock = threading.Lock()
        self._files: dict[Key, Tracked] = {}
        self._gen: dict[Key, int] = {}
        self._opens: dict[Key, int] = {}  # open handles through the mount, per node
        self._writers: dict[Key, int] = {}  # of which open for writing
        # Per job tag: Σ allocated bytes of its files not evicted (kept as files change), and
        # the pending bytes as the last report computed them (raised by growth since).
        self._resident: dict[bytes, int] = {}
        self._pending: dict[bytes, int] = {}
        self._key_locks: dict[Key, threading.Lock] = {}
        self._errors = DrainErrors(pfs)
        self._stopping = threading.Event()
        self._reports = ReportTimer(self.report, report_interval, self._stopping)
        self._threads: list[threading.Thread] = []
        self._queue = CopyQueue(clock, self._stopping)
        self._last_rescan = -RESCAN_INTERVAL
        self._path_of = path_of
        self._journal = journal
        self.copies = 0  # good copies (tests, logs)
        self.evictions = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Recovers from a crash (module docstring), then starts the worker and the reports."""
        found, due = recover(self._root, self._backing, self._pfs, self._journal)
        with self._lock:
            self._files = found
            for tracked in found.values():
                self._resident[tracked.tag] = self._resident.get(tracked.tag, 0) + tracked.allocated
        for key in due:
            self._enqueue(key)
        targets = [(self._reports.run, "burstctl-bb")]
        if self._pfs is not None:
            # Two: one copies while the other fsyncs, renames or evicts, so the job's drain
            # stream is not left idle between files.
            targets += [(self._work, f"burstctl-drain-{i}") for i in range(self._workers)]
        for target, name in targets:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Stops the worker (a copy in progress is abandoned: its temporary is removed at the
        next start) and the reports. Idempotent."""
        self._stopping.set()
        self._reports.soon()
        self._queue.wake_all()
        for thread in self._threads:
            thread.join(timeout)
        if self._journal is not None:
            self._journal.close()

    def _rescan(self) -> None:
        """Finds the lost files again by their tags on BACKING; forgets those not found."""
        found = scan(self._root, None)
        with self._lock:
            for key, tracked in found.items():
                mine = self._files.get(key)
                if mine is not None:
                    self._moved(key, mine, tracked.rel)
            for key in [k for k, t in self._files.items() if t.lost and k not in found]:
                self._set_allocated(self._files.pop(key), 0)
                if self._journal is not None:
                    self._journal.drop(key)

    def _moved(self, key: Key, tracked: Tracked, rel: str) -> None:
        """The file is at ``rel`` (lock held): recorded in the journal if that is new."""
        if tracked.rel != rel and self._journal is not None:
            self._journal.put(key, rel, tracked.tag)
        tracked.rel, tracked.lost = rel, False

    # ------------------------------------------------------------------ the file system's calls

    @contextlib.contextmanager
    def holding(self, key: Key) -> Iterator[None]:
        """Holds the file's residency still (no eviction, no restore by anyone else)."""
        with self._lock:
            lock = self._key_locks.get(key)
            if lock is None:
                lock = self._key_locks[key] = threading.Lock()
        with lock:
            yield

    def tracks(self, key: Key) -> bool:
        return key in self._files

    def modified(self, key: Key, path_fd: int, job: JobInfo | None) -> None:
        """A write, truncate, fallocate or create through the mount, by ``job``: bumps the
        write generation, tags the file as the job's (``path_fd``: any handle on it), and
        reports the job's resident bytes at once: the controller compares them with the
        bytes the client added, so they must not lag behind the writes."""
        try:
            st: os.stat_result | None = os.fstat(path_fd)
        except OSError:
            st = None
        with self._lock:
            gen = self._gen[key] = self._gen.get(key, 0) + 1
            tracked = self._files.get(key)
            known = tracked is not None and tracked.job == job
            if tracked is not None and known and st is not None:
                self._observe(tracked, st, gen)
        if not known:
            tracked = self._tag(key, path_fd, job, st, gen)
        if tracked is not None and tracked.job is not None and self._hooks is not None:
            with self._lock:
                resident = self._resident.get(tracked.tag, 0)
                pending = min(resident, self._pending.get(tracked.tag, 0))
                error = self._errors.of(tracked.tag)
            self._hook_call("report_buffer", tracked.job, resident, pending, error)

    def _tag(
        self, key: Key, path_fd: int, job: JobInfo | None, st: os.stat_result | None, gen: int
    ) -> Tracked | None:
        """Tags a file as ``job``'s (it was untracked, or another job's). Journaled first: a
        crash between leaves an entry of an untagged file, never a tagged file unjournaled."""
        try:
            rel = relative_path(self._backing, os.readlink(f"/proc/self/fd/{path_fd}")) or ""
        except OSError:
            rel = ""
        if self._journal is not None:
            self._journal.put(key, rel, encode_job(job))
        tag = write_tag(path_fd, job)
        if tag is None:
            return None
        with contextlib.suppress(OSError):
            st = os.fstat(path_fd)  # again: the tag may have taken a block
        with self._lock:
            tracked = self._files.get(key)
            if tracked is None:
                tracked = self._files[key] = Tracked(job, tag, rel)
            else:
                self._set_allocated(tracked, 0)  # moves to the new job's books below
                tracked.job, tracked.tag = job, tag
            if st is not None:
                self._observe(tracked, st, gen)
            return tracked

    def _observe(self, tracked: Tracked, st: os.stat_result, gen: int) -> None:
        """A fresh stat of a tracked file (lock held)."""
        tracked.signature, tracked.seen_gen = signature(st), gen
        if tracked.evicted is None:
            self._set_allocated(tracked, st.st_blocks * 512)

    def _set_allocated(self, tracked: Tracked, allocated: int) -> None:
        """A file's allocated bytes, kept in its job's resident sum (lock held)."""
        delta = allocated - tracked.allocated
        tracked.allocated = allocated
        if delta:
            self._resident[tracked.tag] = self._resident.get(tracked.tag, 0) + delta
            if delta > 0:  # grown: pending until its next copy
                self._pending[tracked.tag] = self._pending.get(tracked.tag, 0) + delta

    def opened(self, key: Key, writing: bool = True) -> None:
        """An open of a file through the mount (under `holding`)."""
        with self._lock:
            self._opens[key] = self._opens.get(key, 0) + 1
            if writing:
                self._writers[key] = self._writers.get(key, 0) + 1

    def released(self, key: Key, path: str | None, writing: bool = True) -> None:
        """A close. The last close, or the last writer's, queues a tracked file: it is copied
        once no one writes it, evicted once no one has it open (``path``: where it is now)."""
        with self._lock:
            left = _decrement(self._opens, key)
            writers = _decrement(self._writers, key) if writing else self._writers.get(key, 0)
            tracked = self._files.get(key)
            if tracked is None:
                return
            if path is not None:
                rel = relative_path(self._backing, path)
                if rel is not None:
                    self._moved(key, tracked, rel)
        if left == 0 or (writing and writers == 0):
            self._enqueue(key)

    def renamed(self, key: Key, path: str) -> None:
        with self._lock:
            tracked = self._files.get(key)
            rel = relative_path(self._backing, path)
            if tracked is not None and rel is not None:
                self._moved(key, tracked, rel)

    def forget(self, key: Key) -> None:
        """The file's last name is gone (unlinked, or replaced by a rename)."""
        with self._lock:
            tracked = self._files.pop(key, None)
            if tracked is not None:
                self._set_allocated(tracked, 0)
                if self._journal is not None:
                    self._journal.drop(key)
            self._gen.pop(key, None)

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

    def retimed(self, key: Key, path_fd: int) -> None:
        """The file's mtime was set through the mount: an evicted file's mark takes it."""
        tracked = self._files.get(key)
        if tracked is None or tracked.evicted is None:
            return
        with self.holding(key):
            evicted = tracked.evicted
            if evicted is None:
                return
            proc = f"/proc/self/fd/{path_fd}"
            moved = Evicted(evicted.size, os.stat(proc).st_mtime_ns, evicted.pfs)
            try:
                mark_evicted(proc, moved)
            except OSError as err:
                logger.warning("stage-out: cannot keep the new mtime of %s: %s", evicted.pfs, err)
                return
            tracked.evicted = moved

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
        logger.info("stage-out: restored %s from the PFS (%d bytes)", tracked.rel, st.st_size)

    # ------------------------------------------------------------------ the queue

    def _enqueue(self, key: Key, delay: float = 0.0) -> None:
        if self._pfs is not None:
            self._queue.put(key, delay)

    def pending_copies(self) -> int:
        """Files queued or being copied (tests)."""
        return self._queue.pending()

    def _work(self) -> None:
        while (key := self._queue.take()) is not None:
            tracked = self._files.get(key)
            try:
                if tracked is not None:
                    self._drain_one(key, tracked)
            except Exception:
                logger.exception("stage-out: draining a file failed unexpectedly")
                self._enqueue(key, self._retry_max)
            finally:
                self._queue.done(key)

    def _drain_paced(self, job: JobInfo | None, nbytes: int) -> None:
        """Paces ``nbytes`` of a copy on the job's drain stream."""
        if job is not None:
            self._hook_call("drain", job, nbytes)

    def _hook_call(self, name: str, *args: object) -> None:
        if self._hooks is None:
            return
        try:
            getattr(self._hooks, name)(*args)
        except Exception:
            logger.exception("stage-out: %s failed", name)

    # ------------------------------------------------------------------ one file

    def _drain_one(self, key: Key, tracked: Tracked) -> None:
        if tracked.evicted is not None or self._stopping.is_set():
            return
        with self._lock:
            if self._writers.get(key):
                return  # open for writing again: its writer's last close queues it
        rel = self._where(key, tracked)
        if rel is None:
            return
        try:
            src = os.open(rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._root)
        except OSError:
            self._lose(key, tracked)
            return
        try:
            st0 = os.fstat(src)
            if (st0.st_dev, st0.st_ino) != key:
                self._lose(key, tracked)
                return
            with self._lock:
                gen0 = self._gen.get(key, 0)
                done = tracked.copied == signature(st0) and tracked.copied_gen in (None, gen0)
                if tracked.copied_gen is None and gen0 != 0:
                    done = False  # written since the start: the marker alone cannot tell
            if not done:
                try:
                    assert self._pfs is not None
                    pace = functools.partial(self._drain_paced, tracked.job)
                    copy_to_pfs(src, st0, rel, self._pfs, self._root, pace, self._stopping)
                except CopyError as err:
                    self._failed(key, tracked, err.cause)
                    return
                if self._stopping.is_set():
                    return
                st1 = os.fstat(src)
                with self._lock:
                    changed = self._gen.get(key, 0) != gen0 or signature(st1) != signature(st0)
                if changed:
                    # Again, now unless a writer still has it open (its close queues it).
                    logger.debug("stage-out: %s changed during its copy; again", rel)
                    self._succeeded(tracked)
                    with self._lock:
                        written = bool(self._writers.get(key))
                    if not written:
                        self._enqueue(key)
                    return
                try:
                    mark_copied(f"/proc/self/fd/{src}", st0)
                except OSError as err:
                    self._failed(key, tracked, f"cannot mark {rel} copied: {err.strerror}")
                    return
                with self._lock:
                    tracked.copied, tracked.copied_gen = signature(st0), gen0
                self.copies += 1
                self._succeeded(tracked)
            if self._evict:
                self._evict_one(key, tracked, src, rel, gen0)
        finally:
            os.close(src)

    def _where(self, key: Key, tracked: Tracked) -> str | None:
        """The file's path relative to BACKING, checked against its key."""
        for candidate in range(2):
            if candidate == 0:
                rel: str | None = tracked.rel
            else:
                path = None if self._path_of is None else self._path_of(key)
                rel = None if path is None else relative_path(self._backing, path)
            if not rel:
                continue
            try:
                st = os.stat(rel, dir_fd=self._root, follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == key:
                with self._lock:
                    self._moved(key, tracked, rel)
                return rel
        self._lose(key, tracked)
        return None

    def _lose(self, key: Key, tracked: Tracked) -> None:
        """The file is not where it was: deleted (forgotten) or renamed behind us (a rescan
        finds it by its tag)."""
        tracked.lost = True
        now = self._clock()
        if now - self._last_rescan >= RESCAN_INTERVAL:
            self._last_rescan = now
            self._rescan()
            if not tracked.lost and not self._opens.get(key):
                self._enqueue(key)

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
        self.evictions += 1
        logger.debug("stage-out: evicted %s (%d bytes)", rel, st.st_size)
        self._reports.soon()

    def _failed(self, key: Key, tracked: Tracked, cause: str) -> None:
        tracked.attempts += 1
        self._errors.failed(tracked.tag, cause)
        self._enqueue(key, retry_delay(tracked.attempts, self._retry_min, self._retry_max))
        self._reports.soon()

    def _succeeded(self, tracked: Tracked) -> None:
        tracked.attempts = 0
        self._errors.succeeded(tracked.tag)

    # ------------------------------------------------------------------ reports

    def gauges(self) -> dict[bytes, tuple[JobInfo | None, int, int, str]]:
        """Per job tag: (job, resident, pending, drain_error). A file is looked at (stat) again
        only if it changed since the last look (written through the mount: its write
        generation moved)."""
        with self._lock:
            files = [(key, t, self._gen.get(key, 0)) for key, t in self._files.items()]
        for key, tracked, gen in files:
            if tracked.evicted is None and tracked.rel and tracked.seen_gen != gen:
                self._look(key, tracked, gen)
        out: dict[bytes, tuple[JobInfo | None, int, int, str]] = {}
        with self._lock:
            pending: dict[bytes, int] = {}
            jobs: dict[bytes, JobInfo | None] = {}
            for key, tracked in self._files.items():
                jobs[tracked.tag] = tracked.job
                if tracked.evicted is None and (
                    tracked.copied != tracked.signature
                    or tracked.copied_gen not in (None, self._gen.get(key, 0))
                ):
                    pending[tracked.tag] = pending.get(tracked.tag, 0) + tracked.allocated
            for tag, job in jobs.items():
                resident = self._resident.get(tag, 0)
                self._pending[tag] = min(resident, pending.get(tag, 0))
                out[tag] = (job, resident, self._pending[tag], self._errors.of(tag))
        return out

    def _look(self, key: Key, tracked: Tracked, gen: int) -> None:
        try:
            st = os.stat(tracked.rel, dir_fd=self._root, follow_symlinks=False)
        except OSError:
            return
        if (st.st_dev, st.st_ino) == key:
            with self._lock:
                if tracked.evicted is None:
                    self._observe(tracked, st, gen)

    def report(self) -> None:
        """Reports the jobs' gauges, and fsyncs the journal's appends since (a batch)."""
        if self._journal is not None:
            self._journal.sync()
        for job, resident, pending, error in self.gauges().values():
            if job is not None:
                self._hook_call("report_buffer", job, resident, pending, error)

    def errors(self) -> dict[str, str]:
        """Why copies fail, per job id (tests, logs)."""
        return self._errors.by_job()


__all__ = ["DrainHooks", "StageOut"]
