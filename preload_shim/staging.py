"""The node agent's stage-out: the files the jobs' processes open under ``--paths``, drained to
the PFS as the mount drains the files written through it.

`AgentStage` runs one `burstctl.node.stageout.StageOut` per ``--paths`` directory (BACKING =
that directory, PFS_DIR = ``--stage-out``, or its subdirectory named after the path when there
are several), with the agent's `Pacer` as its hooks: the copies are paced on each job's drain
session, and each job's resident and pending bytes, summed over the directories, go to its
session (`Pacer.report_buffer`). Without ``--stage-out`` it keeps the index and reports the
resident bytes all the same (the controller's books need them); nothing is copied.

The library tells it of every paced open of a regular file (preload_shim/stage.c: ``OPEN
<flags>`` with the descriptor) and of its close (``CLOSE`` with the descriptor):

- an open (`opened`): the file's node, its access mode, its path, the job of the caller. Under
  the stage-out's hold on the node (no eviction meanwhile), an evicted file opened for
  reading is answered with its PFS copy (the library puts it in place of the application's
  descriptor; nothing is tracked), one opened to change it is restored first (paced as the
  caller's writes, space included) or, truncated by the open, merely unmarked; then the open
  is counted (`StageOut.opened`, with its mode) and a write tags the file as the job's;
- the agent keeps the descriptor of each open it was told of, per process: through it the
  job's files open for writing are measured again (`refresh`, before the page's landed bytes
  are forwarded), and its close (`closed`), or the end of the process that opened it
  (`reap`: a process that exits without closing), releases it: the last close queues the
  file for its copy, as on the mount.

What is not seen: writes by processes not under the shim, writes through ``mmap`` after the
last close, and closes made where the library cannot see them (docs/preload.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from burstctl.client.job import JobInfo
from burstctl.node.attribution import Caller
from burstctl.node.pacer import Pacer
from burstctl.node.sessions import JobSession
from burstctl.node.stageout import StageOut
from burstctl.node.stageout_journal import Journal, default_journal
from burstctl.node.stageout_marks import XATTR_JOB, Key, decode_job
from burstctl.node.stageout_open import Freeze
from burstctl.preload_shim.config import AgentConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Answer:
    """The agent's answer to an open: ``OK``, ``SKIP``, ``PFS`` (with ``fd``) or ``EIO ...``."""

    text: str
    fd: int | None = None


@dataclass(slots=True)
class OpenFile:
    """One open the library told: the agent's copy of its descriptor."""

    stage: StageOut
    key: Key
    fd: int
    writing: bool
    job: JobInfo
    reading: bool = False  # counted as a reader by the stage-out's open-file drain


class _Books:
    """Each job's buffer gauges summed over the stage-outs of the agent's directories."""

    def __init__(self, pacer: Pacer) -> None:
        self._pacer = pacer
        self._lock = threading.Lock()
        # (job id, user) -> directory index -> (resident, pending, drain error)
        self._by: dict[tuple[str, str], dict[int, tuple[int, int, str]]] = {}

    def hooks(self, index: int) -> _StageHooks:
        return _StageHooks(self, index)

    def report(self, index: int, job: JobInfo, resident: int, pending: int, error: str) -> None:
        with self._lock:
            mine = self._by.setdefault((job.job_id, job.user), {})
            mine[index] = (resident, pending, error)
            parts = list(mine.values())
        errors = [e for _, _, e in parts if e]
        self._pacer.report_buffer(
            job,
            sum(r for r, _, _ in parts),
            sum(p for _, p, _ in parts),
            errors[0] if errors else "",
        )


class _StageHooks:
    """The `DrainHooks` of one directory's stage-out."""

    def __init__(self, books: _Books, index: int) -> None:
        self._books = books
        self._index = index

    def drain(self, job: JobInfo, nbytes: int) -> None:
        self._books._pacer.drain(job, nbytes)

    def report_buffer(self, job: JobInfo, resident: int, pending: int, error: str) -> None:
        self._books.report(self._index, job, resident, pending, error)


def process_ended(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie (exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[-1].split()
    except OSError:
        return True
    return not fields or fields[0] == b"Z"


class AgentStage:
    """The stage-out of the agent's directories and the opens the library tells it of."""

    def __init__(self, config: AgentConfig, pacer: Pacer, hold_writes: Freeze) -> None:
        self._pacer = pacer
        self._books = _Books(pacer)
        self._stages: list[tuple[str, StageOut, int]] = []
        self._pfs_dirs = [config.pfs_dir(path) for path in config.paths]
        evict = config.evict_mode == "after-copy"
        try:
            for index, path in enumerate(config.paths):
                root = os.path.realpath(path)
                fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                self._stages.append(
                    (
                        root,
                        StageOut(
                            fd,
                            Path(root),
                            self._pfs_dirs[index],
                            evict=evict,
                            hooks=self._books.hooks(index),
                            journal=Journal(default_journal(Path(root)), fd),
                            freeze=hold_writes,
                        ),
                        fd,
                    )
                )
        except BaseException:
            self.close()
            raise
        self._lock = threading.Lock()
        self._open: dict[int, list[OpenFile]] = {}  # by the pid that opened

    def start(self) -> None:
        """Recovers each directory's stage-out from a crash and starts its drain (StageOut),
        knowing the files processes still have open (`_still_open`)."""
        self._still_open()
        for (root, stage, _), pfs in zip(self._stages, self._pfs_dirs, strict=True):
            if pfs is not None:
                pfs.mkdir(exist_ok=True)  # one of several paths' own subdirectory
            stage.start()
            if pfs is not None:
                logger.info("staging out %s to %s", root, pfs)

    def _still_open(self) -> None:
        """After a restart (a crash): the tagged files under the paths that processes still
        have open, found in /proc, counted as opened (and as read), so that none is finished
        or evicted under a writer this agent was never told of. Each is released when its
        process ends (`reap`); its closes were told to the agent that died."""
        found = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                for name in os.listdir(f"/proc/{entry.name}/fd"):
                    found += self._adopt(int(entry.name), name)
        if found:
            logger.info("stage-out: %d files under the paths are still open", found)

    def _adopt(self, pid: int, name: str) -> int:
        link = f"/proc/{pid}/fd/{name}"
        try:
            stage = self._stage_of(os.readlink(link))
            if stage is None:
                return 0
            with open(f"/proc/{pid}/fdinfo/{name}", encoding="ascii") as info:
                flags = int(info.read().split("flags:", 1)[1].split()[0], 8)
            fd = os.open(link, os.O_RDONLY | os.O_CLOEXEC)
        except (OSError, ValueError, IndexError):
            return 0
        try:
            st = os.fstat(fd)
            job = decode_job(os.getxattr(fd, XATTR_JOB)) if stat.S_ISREG(st.st_mode) else None
        except (OSError, ValueError, KeyError, TypeError):
            job = None
        if job is None:
            os.close(fd)
            return 0
        key = (st.st_dev, st.st_ino)
        writing = flags & os.O_ACCMODE != os.O_RDONLY
        reading = flags & os.O_ACCMODE != os.O_WRONLY and stage.open is not None
        stage.opened(key, writing)
        if reading:
            assert stage.open is not None
            stage.open.read_opened(key, fd, lambda nbytes: None)
        with self._lock:
            self._open.setdefault(pid, []).append(OpenFile(stage, key, fd, writing, job, reading))
        return 1

    def close(self) -> None:
        """Stops the drains; lets go of every descriptor kept."""
        for _, stage, fd in self._stages:
            stage.stop()
            os.close(fd)
        self._stages = []
        with self._lock:
            files = [f for opens in self._open.values() for f in opens]
            self._open.clear()
        for f in files:
            os.close(f.fd)

    def _stage_of(self, path: str) -> StageOut | None:
        best: tuple[int, StageOut] | None = None
        for root, stage, _ in self._stages:
            inside = path == root or path.startswith(root.rstrip("/") + "/")
            if inside and (best is None or len(root) > best[0]):
                best = (len(root), stage)
        return None if best is None else best[1]

    # ------------------------------------------------------------------ opens and closes

    def opened(self, caller: Caller, fd: int, flags: int) -> Answer:
        """An open the library tells (``fd``: the agent's copy of its descriptor, kept on OK,
        closed otherwise)."""
        keep = False
        try:
            answer, keep = self._opened(caller, fd, flags)
            return answer
        finally:
            if not keep:
                os.close(fd)

    def _opened(self, caller: Caller, fd: int, flags: int) -> tuple[Answer, bool]:
        st = os.fstat(fd)
        stage = self._stage_of(os.readlink(f"/proc/self/fd/{fd}"))
        if stage is None or not stat.S_ISREG(st.st_mode):
            return Answer("SKIP"), False
        key = (st.st_dev, st.st_ino)
        job = self._pacer.job_of(caller)
        writing = flags & os.O_ACCMODE != os.O_RDONLY
        with stage.holding(key):
            evicted = stage.evicted(key)
            if evicted is not None and not writing:
                try:
                    return Answer("PFS", stage.open_pfs(evicted)), False
                except OSError as err:
                    logger.error("the PFS copy of an evicted file cannot be opened: %s", err)
                    return Answer("EIO the file's copy on the PFS cannot be read"), False
            if evicted is not None and flags & os.O_TRUNC:
                stage.discard_evicted(key, fd)
            elif evicted is not None and not self._restore(stage, key, fd, caller, job):
                return Answer("EIO the file's copy on the PFS cannot be read"), False
            reading = flags & os.O_ACCMODE != os.O_WRONLY and stage.open is not None
            if reading and not self._bring_back(stage, key, fd, caller, job):
                return Answer("EIO the file's drained bytes cannot be read back"), False
            stage.opened(key, writing)
        with self._lock:
            opened = OpenFile(stage, key, fd, writing, job, reading)
            self._open.setdefault(caller.pid, []).append(opened)
        if writing:
            stage.modified(key, fd, job)
        return Answer("OK"), True

    def _restore(self, stage: StageOut, key: Key, fd: int, caller: Caller, job: JobInfo) -> bool:
        """Brings an evicted file back (under the hold), paced as the caller's writes."""
        return self._paced_back(stage.restore, stage, key, fd, caller, job)

    def _bring_back(self, stage: StageOut, key: Key, fd: int, caller: Caller, job: JobInfo) -> bool:
        """An open to read a file the library reads from the buffer only: its chunks drained
        while open come back first, and none leaves while it is open (`OpenDrain.read_opened`)."""
        assert stage.open is not None
        return self._paced_back(stage.open.read_opened, stage, key, fd, caller, job)

    def _paced_back(
        self,
        bring: Callable[[Key, int, Callable[[int], None]], None],
        stage: StageOut,
        key: Key,
        fd: int,
        caller: Caller,
        job: JobInfo,
    ) -> bool:
        """``bring(key, fd, pace)`` under the hold, paced as the caller's writes."""
        granted: list[tuple[JobSession, int]] = []

        def pace(nbytes: int) -> None:
            session = self._pacer.data(caller, "write", nbytes, space=True)
            if session is not None:
                granted.append((session, nbytes))

        try:
            bring(key, fd, pace)
            stage.modified(key, fd, job)  # the bytes brought back in the job's resident
        except OSError as err:
            logger.error("cannot bring a file's bytes back from the PFS: %s", err)
            return False
        finally:
            for session, nbytes in granted:
                self._pacer.landed(session, nbytes)
        return True

    def closed(self, caller: Caller, fd: int) -> None:
        """The close the library tells (``fd``: a copy of the closed descriptor, closed here)."""
        try:
            st = os.fstat(fd)
            # the same open file description as the opener's: the same access mode
            writing = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDONLY
        finally:
            os.close(fd)
        key = (st.st_dev, st.st_ino)
        with self._lock:
            found = self._take(caller.pid, key, writing)
            if found is None:  # closed by another process than the opener (a fork's child)
                for pid in list(self._open):
                    if (found := self._take(pid, key, writing)) is not None:
                        break
        if found is not None:
            self._release(found)

    def _take(self, pid: int, key: Key, writing: bool) -> OpenFile | None:
        opens = self._open.get(pid, [])
        for i, f in enumerate(opens):
            if f.key == key and f.writing == writing:
                del opens[i]
                if not opens:
                    del self._open[pid]
                return f
        return None

    def _release(self, f: OpenFile) -> None:
        if f.reading and f.stage.open is not None:
            f.stage.open.read_closed(f.key)
        try:
            if os.fstat(f.fd).st_nlink == 0:
                # Unlinked while open (the library does not see unlink): its last name is
                # gone, as the mount's forget is told.
                f.stage.released(f.key, None, f.writing)
                f.stage.forget(f.key)
                return
            if f.writing:
                f.stage.modified(f.key, f.fd, f.job)
            path = None
            with contextlib.suppress(OSError):
                path = os.readlink(f"/proc/self/fd/{f.fd}")
            f.stage.released(f.key, path, f.writing)
        finally:
            os.close(f.fd)

    def reap(self) -> None:
        """Releases the opens of processes that ended without closing."""
        with self._lock:
            gone = [pid for pid in self._open if process_ended(pid)]
            files = [f for pid in gone for f in self._open.pop(pid)]
        for f in files:
            try:
                self._release(f)
            except Exception:
                logger.exception("releasing a file of an ended process failed")

    def refresh(self, job: JobInfo) -> None:
        """Measures the job's files open for writing again (their resident bytes, reported)."""
        with self._lock:
            files = [
                f for opens in self._open.values() for f in opens if f.writing and f.job == job
            ]
        for f in files:
            f.stage.modified(f.key, f.fd, f.job)

    def open_files(self) -> int:
        """Opens told and not yet released (STATUS, tests)."""
        with self._lock:
            return sum(len(opens) for opens in self._open.values())

    def pending_copies(self) -> int:
        return sum(stage.pending_copies() for _, stage, _ in self._stages)
