"""Stage-out: the mount copies the files written through it to the parallel file system.

`StageOut` keeps, per job, an index of the files the job wrote through the mount (tagged on the
backing file with the xattr ``user.burstctl.job``, so that a restart rebuilds the index by
scanning BACKING), and drains them to ``PFS_DIR``:

- `PassthroughFS` tells it of every modification (`modified`: write, truncate, fallocate,
  create), which bumps the file's *write generation*, and of every open and close; the last
  close of a file it tracks queues the file.
- Worker threads (`DRAIN_WORKERS`, never two on one file) copy a queued file ``BACKING/rel`` to
  ``PFS_DIR/rel``: into a temporary ``.NAME.burstctl-part-XXXX`` in the same directory, in
  `CHUNK` pieces each paced by the job's drain stream (`DrainHooks.drain`), then fsync, rename
  over the final name and fsync of the directory; mode, owner and times are kept. The
  generation is read before and after: a file written during its copy is queued again (the
  copy, complete, stays) and is not evicted. A good copy marks the backing file
  ``user.burstctl.copied = "<mtime_ns>:<size>"``. A file open for writing is copied after its
  writer's last close.
- ``evict``: a copied file that nobody has open is marked ``user.burstctl.evicted`` (JSON
  ``{size, mtime_ns, pfs}``) and truncated to 0; the mount then serves it from the PFS copy
  (`evicted`, `open_pfs`) until it is opened for writing, which `restore`s it first.
- A failed copy is retried with a backoff (`RETRY_MIN` doubling to `RETRY_MAX`), logged once per
  cause, and reported as the job's ``drain_error`` until a copy of the job succeeds.
- Each job's ``resident`` (allocated bytes of its files on the buffer, kept as a running sum as
  files are written, evicted, restored, unlinked) and ``pending`` (those not copied yet) go to
  `DrainHooks.report_buffer` after every write through the mount (the controller compares
  ``resident`` with the bytes the client ``added``: a resident that lagged behind the writes
  would let it grant more than S), every `report_interval`, and soon after an eviction.

Crash safety (`start`): temporaries left in PFS_DIR are removed; a file marked evicted but not
yet truncated is truncated (its copy was complete before the mark); every tagged file whose
copied marker does not match its current mtime and size is queued again.

Nothing here raises into the application's I/O: the file system calls that cannot fail.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import itertools
import json
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from burstctl.client.job import JobInfo

logger = logging.getLogger(__name__)

XATTR_JOB = "user.burstctl.job"
XATTR_COPIED = "user.burstctl.copied"
XATTR_EVICTED = "user.burstctl.evicted"
TEMP_MARK = ".burstctl-part-"  # a temporary copy: ".<name>.burstctl-part-<random>"
CHUNK = 1 << 20
RETRY_MIN = 1.0
RETRY_MAX = 30.0
REPORT_INTERVAL = 0.5
RESCAN_INTERVAL = 5.0
DRAIN_WORKERS = 2  # at most one rescan of BACKING this often (a tracked file lost its path)

Key = tuple[int, int]  # (st_dev, st_ino) of the backing file


class DrainHooks(Protocol):
    """What the drain needs of the controller's side (the `Pacer`; tests pass fakes)."""

    def drain(self, job: JobInfo, nbytes: int) -> None:
        """Paces ``nbytes`` of the job's copy to the PFS (its drain stream)."""

    def report_buffer(self, job: JobInfo, resident: int, pending: int, error: str) -> None:
        """The job's gauges on the buffer."""


@dataclass(frozen=True, slots=True)
class Evicted:
    """A file whose data is only on the PFS: its size and mtime then, and where it went."""

    size: int
    mtime_ns: int
    pfs: str

    def encode(self) -> bytes:
        return json.dumps({"size": self.size, "mtime_ns": self.mtime_ns, "pfs": self.pfs}).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Evicted:
        value = json.loads(raw)
        size, mtime_ns, pfs = value["size"], value["mtime_ns"], value["pfs"]
        if not (isinstance(size, int) and isinstance(mtime_ns, int) and isinstance(pfs, str)):
            raise ValueError("bad evicted mark")
        return cls(size, mtime_ns, pfs)


def encode_job(job: JobInfo | None) -> bytes:
    if job is None:
        return b"{}"
    return json.dumps(
        {
            "job_id": job.job_id,
            "user": job.user,
            "group": job.group,
            "nodes": job.nodes,
            "priority": job.priority,
        },
        sort_keys=True,
    ).encode()


def decode_job(raw: bytes) -> JobInfo | None:
    value = json.loads(raw)
    if not value:
        return None
    return JobInfo(
        value["job_id"],
        value["user"],
        value["group"],
        nodes=value.get("nodes", 1),
        priority=value.get("priority", 1.0),
    )


def _decrement(counts: dict[Key, int], key: Key) -> int:
    left = counts.get(key, 1) - 1
    if left > 0:
        counts[key] = left
    else:
        counts.pop(key, None)
    return max(0, left)


def _give(fd: int, st: os.stat_result) -> None:
    """Gives a copy the owner of its original, when the daemon may (root)."""
    if os.geteuid() == 0:
        os.fchown(fd, st.st_uid, st.st_gid)


def _signature(st: os.stat_result) -> tuple[int, int]:
    return st.st_mtime_ns, st.st_size


def _parse_copied(raw: bytes) -> tuple[int, int] | None:
    try:
        mtime, size = raw.decode().split(":")
        return int(mtime), int(size)
    except ValueError:
        return None


@dataclass(slots=True)
class Tracked:
    """A file some job wrote through the mount."""

    job: JobInfo | None
    tag: bytes  # the encoded job, as in the xattr
    rel: str  # its path relative to BACKING, when last known
    copied: tuple[int, int] | None = None  # (mtime_ns, size) of its last good copy
    copied_gen: int | None = None  # the write generation that copy saw (None: unknown)
    evicted: Evicted | None = None
    attempts: int = 0  # failed copies in a row
    allocated: int = 0  # st_blocks * 512, at the last look
    signature: tuple[int, int] | None = None  # (mtime_ns, size) at the last look
    seen_gen: int = -1  # the write generation at the last look (a look again once it moves)
    lost: bool = False


@dataclass(order=True, slots=True)
class _Due:
    at: float
    seq: int
    key: Key = field(compare=False)


class CopyError(Exception):
    """A copy that failed for a reason worth reporting (``cause``: one line for the log)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class StageOut:
    """The drain of one mount's BACKING (open as ``backing_fd``, at ``backing``) to ``pfs``.

    Without ``pfs`` (a mount with a controller but no ``--stage-out``) it keeps the index and
    reports the jobs' resident bytes; nothing is copied, nothing evicted. ``path_of(key)``:
    where a node is now, asked of the mount's inode table (`inodes.InodeTable.path_of`) when a
    tracked file is no longer where it was.
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
        self._report_interval = report_interval
        self._retry_min = retry_min
        self._retry_max = retry_max
        self._workers = workers
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._files: dict[Key, Tracked] = {}
        self._gen: dict[Key, int] = {}
        self._opens: dict[Key, int] = {}  # open handles through the mount, per node
        self._writers: dict[Key, int] = {}  # of which open for writing
        # Per job tag: Σ allocated bytes of its files not evicted (kept as files change), and
        # the pending bytes as the last report computed them (raised by growth since).
        self._resident: dict[bytes, int] = {}
        self._pending: dict[bytes, int] = {}
        self._key_locks: dict[Key, threading.Lock] = {}
        self._queue: list[_Due] = []
        self._queued: dict[Key, _Due] = {}
        self._seq = itertools.count()
        self._errors: dict[bytes, str] = {}  # job tag -> why its copies fail
        self._logged: set[str] = set()  # causes logged since the last good copy
        self._stopping = threading.Event()
        self._report_now = threading.Event()
        self._threads: list[threading.Thread] = []
        self._busy: set[Key] = set()  # being drained by a worker
        self._again: dict[Key, float] = {}  # queued while busy: (re)queued when done, delay
        self._last_rescan = -RESCAN_INTERVAL
        self._path_of = path_of
        self.copies = 0  # good copies (tests, logs)
        self.evictions = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Recovers from a crash (module docstring), then starts the worker and the reports."""
        if self._pfs is not None:
            self._remove_temporaries()
        self._scan(initial=True)
        targets = [(self._report_loop, "burstctl-bb")]
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
        self._report_now.set()
        with self._wake:
            self._wake.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    def _remove_temporaries(self) -> None:
        assert self._pfs is not None
        removed = 0
        for dirpath, _, names in os.walk(self._pfs):
            for name in names:
                if name.startswith(".") and TEMP_MARK in name:
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(dirpath, name))
                        removed += 1
        if removed:
            logger.info("stage-out: removed %d unfinished copies from %s", removed, self._pfs)

    def _scan(self, *, initial: bool) -> None:
        """Rebuilds the index from the tags on BACKING; queues what is not copied."""
        found: dict[Key, Tracked] = {}
        # Through the backing directory's own handle: with the mount in place, its path now
        # leads into the mount.
        for dirpath, _, names, dir_fd in os.fwalk(".", dir_fd=self._root):
            for name in names:
                rel = os.path.normpath(os.path.join(dirpath, name))
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    tracked = self._scanned(fd, rel, st, initial)
                finally:
                    os.close(fd)
                if tracked is not None:
                    found[(st.st_dev, st.st_ino)] = tracked
        with self._lock:
            if initial:
                self._files = found
                self._resident = {}
                for tracked in found.values():
                    self._resident[tracked.tag] = (
                        self._resident.get(tracked.tag, 0) + tracked.allocated
                    )
            else:
                for key, tracked in found.items():
                    mine = self._files.get(key)
                    if mine is not None:
                        mine.rel, mine.lost = tracked.rel, False
                for key in [k for k, t in self._files.items() if t.lost and k not in found]:
                    self._set_allocated(self._files.pop(key), 0)
            queue = [
                key
                for key, t in self._files.items()
                if t.evicted is None
                and not self._writers.get(key)
                and t.copied != self._stat_signature(t)
            ]
        if initial:
            for key in queue:
                self._enqueue(key)
            if found:
                logger.info(
                    "stage-out: %d files tagged on %s, %d to copy",
                    len(found),
                    self._backing,
                    len(queue),
                )

    def _scanned(self, fd: int, rel: str, st: os.stat_result, initial: bool) -> Tracked | None:
        """What the marks on one backing file (open as ``fd``) say; None: not tagged."""
        path = f"/proc/self/fd/{fd}"
        try:
            tag = os.getxattr(path, XATTR_JOB)
        except OSError:
            return None
        try:
            job = decode_job(tag)
        except (ValueError, KeyError, TypeError):
            logger.warning("stage-out: %s has an unreadable job tag; not drained", rel)
            return None
        tracked = Tracked(job, tag, rel)
        with contextlib.suppress(OSError):
            tracked.copied = _parse_copied(os.getxattr(path, XATTR_COPIED))
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            tracked.evicted = Evicted.decode(os.getxattr(path, XATTR_EVICTED))
        if initial and tracked.evicted is not None and self._pfs is not None:
            self._finish_eviction(path, st, tracked)
        tracked.allocated, tracked.signature, tracked.seen_gen = (
            0 if tracked.evicted is not None else st.st_blocks * 512,
            _signature(st),
            0,
        )
        return tracked

    def _stat_signature(self, tracked: Tracked) -> tuple[int, int] | None:
        try:
            return _signature(os.stat(tracked.rel, dir_fd=self._root, follow_symlinks=False))
        except OSError:
            return None

    def _finish_eviction(self, path: str, st: os.stat_result, tracked: Tracked) -> None:
        """A file marked evicted at start: truncated if the crash came before that, or kept
        (its mark cleared) if its PFS copy is not what the mark says."""
        assert tracked.evicted is not None and self._pfs is not None
        if st.st_size == 0:
            return  # truncated already (or empty all along)
        try:
            pfs_size = os.stat(self._pfs / tracked.evicted.pfs).st_size
        except OSError:
            pfs_size = -1
        if pfs_size != tracked.evicted.size:
            logger.warning(
                "stage-out: %s is marked evicted but its PFS copy is missing or differs; kept",
                tracked.rel,
            )
            with contextlib.suppress(OSError):
                os.removexattr(path, XATTR_EVICTED)
                os.removexattr(path, XATTR_COPIED)
            tracked.evicted = None
            tracked.copied = None
            return
        os.truncate(path, 0)
        logger.info("stage-out: finished evicting %s (interrupted by a restart)", tracked.rel)

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
                error = self._errors.get(tracked.tag, "")
            self._hook_call("report_buffer", tracked.job, resident, pending, error)

    def _tag(
        self, key: Key, path_fd: int, job: JobInfo | None, st: os.stat_result | None, gen: int
    ) -> Tracked | None:
        """Tags a file as ``job``'s (it was untracked, or another job's)."""
        tag = encode_job(job)
        try:
            os.setxattr(f"/proc/self/fd/{path_fd}", XATTR_JOB, tag)
        except OSError as err:
            logger.warning("stage-out: cannot tag a file for its job (not drained): %s", err)
            return None
        try:
            rel = self._relative(os.readlink(f"/proc/self/fd/{path_fd}")) or ""
            st = os.fstat(path_fd)  # again: the tag may have taken a block
        except OSError:
            rel = ""
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
        tracked.signature, tracked.seen_gen = _signature(st), gen
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
                rel = self._relative(path)
                if rel is not None:
                    tracked.rel, tracked.lost = rel, False
        if left == 0 or (writing and writers == 0):
            self._enqueue(key)

    def renamed(self, key: Key, path: str) -> None:
        with self._lock:
            tracked = self._files.get(key)
            rel = self._relative(path)
            if tracked is not None and rel is not None:
                tracked.rel, tracked.lost = rel, False

    def _relative(self, path: str) -> str | None:
        if not path or path.endswith(" (deleted)"):
            return None
        rel = os.path.relpath(path, self._backing)
        return None if rel.startswith("..") or rel == "." else rel

    def forget(self, key: Key) -> None:
        """The file's last name is gone (unlinked, or replaced by a rename)."""
        with self._lock:
            tracked = self._files.pop(key, None)
            if tracked is not None:
                self._set_allocated(tracked, 0)
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
                os.setxattr(proc, XATTR_EVICTED, moved.encode())
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
        evicted = tracked.evicted
        src = self.open_pfs(evicted)
        try:
            dst = os.open(f"/proc/self/fd/{path_fd}", os.O_WRONLY | os.O_CLOEXEC)
            try:
                offset = 0
                while True:
                    chunk = os.pread(src, CHUNK, offset)
                    if not chunk:
                        break
                    pace(len(chunk))
                    os.pwrite(dst, chunk, offset)
                    offset += len(chunk)
                os.ftruncate(dst, offset)
                os.utime(dst, ns=(time.time_ns(), evicted.mtime_ns))
                st = os.fstat(dst)
                os.setxattr(dst, XATTR_COPIED, f"{st.st_mtime_ns}:{st.st_size}".encode())
                os.removexattr(dst, XATTR_EVICTED)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        with self._lock:
            tracked.evicted = None
            tracked.copied = _signature(st)
            tracked.copied_gen = self._gen.get(key, 0)
            self._observe(tracked, st, tracked.copied_gen)
        logger.info("stage-out: restored %s from the PFS (%d bytes)", tracked.rel, offset)

    # ------------------------------------------------------------------ the queue

    def _enqueue(self, key: Key, delay: float = 0.0) -> None:
        if self._pfs is None:
            return
        with self._wake:
            if key in self._busy:  # never two copies of one file at once
                self._again[key] = min(delay, self._again.get(key, delay))
                return
            if key in self._queued:
                return
            due = _Due(self._clock() + delay, next(self._seq), key)
            self._queued[key] = due
            heapq.heappush(self._queue, due)
            self._wake.notify()

    def pending_copies(self) -> int:
        """Files queued or being copied (tests)."""
        with self._lock:
            return len(self._queued) + len(self._busy)

    def _next(self) -> Key | None:
        with self._wake:
            while not self._stopping.is_set():
                if self._queue:
                    wait = self._queue[0].at - self._clock()
                    if wait <= 0:
                        due = heapq.heappop(self._queue)
                        del self._queued[due.key]
                        self._busy.add(due.key)
                        return due.key
                    self._wake.wait(wait)
                else:
                    self._wake.wait()
            return None

    def _work(self) -> None:
        while (key := self._next()) is not None:
            tracked = self._files.get(key)
            try:
                if tracked is not None:
                    self._drain_one(key, tracked)
            except Exception:
                logger.exception("stage-out: draining a file failed unexpectedly")
                self._enqueue(key, self._retry_max)
            finally:
                with self._lock:
                    self._busy.discard(key)
                    again = self._again.pop(key, None)
                if again is not None:
                    self._enqueue(key, again)

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
                done = tracked.copied == _signature(st0) and tracked.copied_gen in (None, gen0)
                if tracked.copied_gen is None and gen0 != 0:
                    done = False  # written since the start: the marker alone cannot tell
            if not done:
                try:
                    self._copy(src, st0, rel, tracked.job)
                except CopyError as err:
                    self._failed(key, tracked, err.cause)
                    return
                if self._stopping.is_set():
                    return
                st1 = os.fstat(src)
                with self._lock:
                    changed = self._gen.get(key, 0) != gen0 or _signature(st1) != _signature(st0)
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
                    os.setxattr(
                        f"/proc/self/fd/{src}",
                        XATTR_COPIED,
                        f"{st0.st_mtime_ns}:{st0.st_size}".encode(),
                    )
                except OSError as err:
                    self._failed(key, tracked, f"cannot mark {rel} copied: {err.strerror}")
                    return
                with self._lock:
                    tracked.copied, tracked.copied_gen = _signature(st0), gen0
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
                rel = None if path is None else self._relative(path)
            if not rel:
                continue
            try:
                st = os.stat(rel, dir_fd=self._root, follow_symlinks=False)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == key:
                tracked.rel = rel
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
            self._scan(initial=False)
            if not tracked.lost and not self._opens.get(key):
                self._enqueue(key)

    def _copy(self, src: int, st: os.stat_result, rel: str, job: JobInfo | None) -> None:
        assert self._pfs is not None
        target = self._pfs / rel
        directory = target.parent
        temp = directory / f".{target.name}{TEMP_MARK}{secrets.token_hex(4)}"
        try:
            self._make_dirs(os.path.dirname(rel))
            out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as err:
            raise CopyError(f"PFS_DIR not writable: {err.strerror}") from None
        renamed = False
        try:
            offset = 0
            while not self._stopping.is_set():
                try:
                    chunk = os.pread(src, CHUNK, offset)
                except OSError as err:
                    raise CopyError(f"cannot read {rel} on the buffer: {err.strerror}") from None
                if not chunk:
                    break
                if job is not None and self._hooks is not None:
                    self._hook_call("drain", job, len(chunk))
                try:
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view) :]
                except OSError as err:
                    raise CopyError(f"cannot write to PFS_DIR: {err.strerror}") from None
                offset += len(chunk)
            if self._stopping.is_set():
                return
            try:
                _give(out, st)
                os.fchmod(out, stat.S_IMODE(st.st_mode))
                os.fsync(out)
                os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
                os.rename(temp, target)
                renamed = True
                dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            except OSError as err:
                raise CopyError(f"cannot finish a copy on PFS_DIR: {err.strerror}") from None
        finally:
            os.close(out)
            if not renamed:
                with contextlib.suppress(OSError):
                    os.unlink(temp)

    def _make_dirs(self, rel_dir: str) -> None:
        """Creates the missing directories of ``rel_dir`` under PFS_DIR with the modes (and, as
        root, the owners) of their namesakes on BACKING."""
        assert self._pfs is not None
        here = self._pfs
        for part in Path(rel_dir).parts:
            here = here / part
            if here.is_dir():
                continue
            try:
                st = os.stat(os.path.relpath(here, self._pfs), dir_fd=self._root)
                mode = stat.S_IMODE(st.st_mode)
            except OSError:
                st, mode = None, 0o755
            try:
                os.mkdir(here, mode)
            except FileExistsError:
                continue
            if st is not None:
                fd = os.open(here, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    _give(fd, st)
                    os.fchmod(fd, mode)  # exact, whatever the umask
                finally:
                    os.close(fd)

    def _evict_one(self, key: Key, tracked: Tracked, src: int, rel: str, gen: int) -> None:
        with self.holding(key):
            st = os.fstat(src)
            with self._lock:
                if (
                    self._opens.get(key)
                    or self._gen.get(key, 0) != gen
                    or tracked.copied != _signature(st)
                    or tracked.evicted is not None
                ):
                    return
            evicted = Evicted(st.st_size, st.st_mtime_ns, rel)
            proc = f"/proc/self/fd/{src}"
            try:
                os.setxattr(proc, XATTR_EVICTED, evicted.encode())
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
        self._report_now.set()

    def _failed(self, key: Key, tracked: Tracked, cause: str) -> None:
        tracked.attempts += 1
        delay = min(self._retry_max, self._retry_min * 2 ** (tracked.attempts - 1))
        with self._lock:
            new_cause = cause not in self._logged
            self._logged.add(cause)
            self._errors[tracked.tag] = cause
        if new_cause:
            logger.error(
                "stage-out to %s: %s (retrying, files stay on the buffer)", self._pfs, cause
            )
        self._enqueue(key, delay)
        self._report_now.set()

    def _succeeded(self, tracked: Tracked) -> None:
        tracked.attempts = 0
        with self._lock:
            had = self._errors.pop(tracked.tag, None)
            if had is not None:
                self._logged.discard(had)
        if had is not None:
            logger.info("stage-out to %s works again (was: %s)", self._pfs, had)

    # ------------------------------------------------------------------ reports

    def _report_loop(self) -> None:
        while not self._stopping.is_set():
            self._report_now.wait(self._report_interval)
            self._report_now.clear()
            if self._stopping.is_set():
                return
            try:
                self.report()
            except Exception:
                logger.exception("stage-out: reporting the buffer failed")

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
                out[tag] = (job, resident, self._pending[tag], self._errors.get(tag, ""))
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
        for job, resident, pending, error in self.gauges().values():
            if job is not None:
                self._hook_call("report_buffer", job, resident, pending, error)

    def errors(self) -> dict[str, str]:
        """Why copies fail, per job id (tests, logs)."""
        with self._lock:
            tags = dict(self._errors)
        return {(job.job_id if (job := decode_job(tag)) else ""): c for tag, c in tags.items()}


__all__ = [
    "CHUNK",
    "TEMP_MARK",
    "XATTR_COPIED",
    "XATTR_EVICTED",
    "XATTR_JOB",
    "DrainHooks",
    "Evicted",
    "StageOut",
]
