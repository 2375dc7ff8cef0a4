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
  A good copy is marked on the backing file. A file open for writing is copied whole after its
  writer's last close; with ``evict``, its complete chunks are drained and punched meanwhile
  (`stageout_open`, `stageout_extents`), and its final copy completes that part.
- Around the data, `stageout_tree`: the copies' metadata and directories, directories and
  symlinks made through the mount (`tree`), hard links, a change of metadata alone (`restamped`).
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
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from burstctl.client.job import JobInfo
from burstctl.node.stageout_copy import CopyError, copy_to_pfs
from burstctl.node.stageout_evict import Evictions
from burstctl.node.stageout_extents import QUIET
from burstctl.node.stageout_hooks import Changed, DrainHooks
from burstctl.node.stageout_journal import Journal, recover
from burstctl.node.stageout_marks import (
    Key,
    Tracked,
    encode_job,
    mark_copied,
    relative_path,
    scan,
    signature,
    write_tag,
)
from burstctl.node.stageout_open import Freeze, OpenDrain
from burstctl.node.stageout_schedule import CopyQueue, DrainErrors, ReportTimer, retry_delay
from burstctl.node.stageout_tree import PfsTree

logger = logging.getLogger(__name__)

RETRY_MIN = 1.0
RETRY_MAX = 30.0
REPORT_INTERVAL = 0.5
RESCAN_INTERVAL = 5.0  # at most one rescan of BACKING this often (a tracked file lost its path)
DRAIN_WORKERS = 4


def _decrement(counts: dict[Key, int], key: Key) -> int:
    left = counts.get(key, 1) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
    return max(0, left)


class StageOut(Evictions):
    """The drain of one mount's BACKING (open as ``backing_fd``, at ``backing``) to ``pfs``.

    Without ``pfs`` (a mount with a controller but no ``--stage-out``) it keeps the index and
    reports the jobs' resident bytes; nothing is copied, nothing evicted. ``path_of(key)``:
    where a node is now, asked of the mount's inode table (`inodes.InodeTable.path_of`) when a
    tracked file is no longer where it was. ``changed``: the shim's hook, see `changed`.
    ``freeze``: given by a shim that does not tell each write (`stageout_open.Freeze`).
    ``journal``: where the tracked files are recorded (None: every start scans BACKING).
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
        changed: Changed | None = None,
        freeze: Freeze | None = None,
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
        self._changed = changed
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
        self.tree = None if pfs is None else PfsTree(backing_fd, str(backing), pfs, self._stopping)
        # The chunks of open files (None: nothing is evicted, so nothing drains before close).
        self._freeze = freeze
        held = None if freeze is None else self._held_out
        self.open = OpenDrain(pfs, self._stopping, clock, held) if pfs and evict else None
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
        self._adopt_open()
        targets = [(self._reports.run, "burstctl-bb")]
        if self.tree is not None:  # with a PFS_DIR
            # Several: one copies while another fsyncs, renames or evicts, so a job's drain
            # stream is not left idle between files, and several jobs drain at once.
            targets += [(self._work, f"burstctl-drain-{i}") for i in range(self._workers)]
            targets.append((self.tree.run, "burstctl-tree"))
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
        if self.tree is not None:
            self.tree.wake()
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

    @contextlib.contextmanager
    def _held_out(self, key: Key, job: JobInfo | None) -> Iterator[bool]:
        """The shim's hold on the job's writes (``freeze``), with no new open of the file
        meanwhile (an open takes `holding`): every writer of the file is held out."""
        assert self._freeze is not None
        with self.holding(key), self._freeze(job) as held:
            yield held

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
        if self.open is not None and self._writers.get(key) and self.open.pending(key):
            self._enqueue(key, QUIET)
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
        if writing and self.open is not None and self.open.freeze is not None:
            self._enqueue(key, QUIET)  # its writes are not told: passes poll it

    def released(self, key: Key, path: str | None, writing: bool = True) -> None:
        """A close. The last close, or the last writer's, queues a tracked file: it is copied
        once no one writes it, evicted once no one has it open (``path``: where it is now)."""
        with self._lock:
            left = _decrement(self._opens, key)
            writers = _decrement(self._writers, key) if writing else self._writers.get(key, 0)
            tracked = self._files.get(key)
            if tracked is None:
                if left == 0 and self.open is not None:
                    self.open.forget(key)  # unlinked while open: its part goes now
                return
            if path is not None:
                rel = relative_path(self._backing, path)
                if rel is not None:
                    self._moved(key, tracked, rel)
        if writing and writers == 0 and self.open is not None:
            self.open.closed(key)
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
            still_open = bool(self._opens.get(key))
        if self.open is not None and not still_open:
            self.open.forget(key)

    def changed(self, key: Key) -> None:
        """Tells the shim of a change made to the file by the stage-out on its own, once made:
        evicted, restored, holes punched (`stageout_hooks.Changed`: its bytes read the same)."""
        if self._changed is not None:
            self._changed(key)

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
            writing = bool(self._writers.get(key))
        rel = self._where(key, tracked)
        if rel is None:
            return
        if writing:  # its writer's last close queues it; meanwhile its complete chunks
            self._drain_open(key, tracked, rel)
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
            part = None if self.open is None else self.open.part_of(key)
            if part is not None:
                self._final_open(key, tracked, src, rel, part)
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
                # The copy took the metadata of its start. Metadata set since (a chmod, an
                # xattr) found no copy to go to until now: the copy takes them as they are.
                self.restamped(key, src)
                self.copies += 1
                self._succeeded(tracked)
            if self._evict:
                self._evict_one(key, tracked, src, rel, gen0)
        finally:
            os.close(src)

    def _drain_open(self, key: Key, tracked: Tracked, rel: str) -> None:
        """One pass over a file still open for writing (`OpenDrain.drain_open`)."""
        if self.open is None:
            return
        pace = functools.partial(self._drain_paced, tracked.job)
        try:
            freed = self.open.drain_open(key, rel, self._root, pace, tracked.job)
        except OSError as err:
            self._failed(key, tracked, f"cannot drain the open file {rel}: {err.strerror}")
            return
        if freed:
            self._succeeded(tracked)
            self.changed(key)  # fewer blocks on the buffer (the mount shows them all the same)
            self._look(key, tracked, -1)
            self._reports.soon()
        with self._lock:
            writing = bool(self._writers.get(key))
        if writing and (self.open.pending(key) or self.open.freeze is not None):
            self._enqueue(key, 0.0 if freed else QUIET)  # more may be due at once

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
