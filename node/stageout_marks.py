"""What the stage-out writes on the burst buffer's files, and reads back at start.

The state of the drain that must survive a restart lives on the backing files themselves, as
extended attributes (hidden from applications by the mount, `xattrs`):

- ``user.burstctl.job`` (`XATTR_JOB`): the job that wrote the file through the mount (JSON,
  `encode_job`); a file without it is not drained;
- ``user.burstctl.copied`` (`XATTR_COPIED`): ``"<mtime_ns>:<size>"`` of its last complete copy
  on the PFS (a copy is good while the file still has that signature);
- ``user.burstctl.evicted`` (`XATTR_EVICTED`): its data is only on the PFS (`Evicted`);
- ``user.burstctl.names`` (`stageout_tree.XATTR_NAMES`): its names made through the mount, when
  it has several (hard links).

A copy in progress is a temporary ``.NAME.burstctl-part-XXXX`` (`TEMP_MARK`) beside its final
name on the PFS. At start, `scan` rebuilds the index of tracked files (`Tracked`) from the
tags, finishing an eviction a crash interrupted (`finish_eviction`), and `remove_temporaries`
removes the temporaries left behind.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from burstctl.client.job import JobInfo

logger = logging.getLogger(__name__)

MARK_PREFIX = "user.burstctl."  # every mark's name starts so (hidden by the mount)
XATTR_JOB = MARK_PREFIX + "job"
XATTR_COPIED = MARK_PREFIX + "copied"
XATTR_EVICTED = MARK_PREFIX + "evicted"
TEMP_MARK = ".burstctl-part-"  # a temporary copy: ".<name>.burstctl-part-<random>"

Key = tuple[int, int]  # (st_dev, st_ino) of the backing file


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
    """The job tag ``XATTR_JOB`` of a file the job wrote (``{}``: no job)."""
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


@functools.lru_cache(maxsize=4096)  # a start reads one tag per file, and files share them
def decode_job(raw: bytes) -> JobInfo | None:
    """The job of a tag (ValueError, KeyError or TypeError when unreadable)."""
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


def write_tag(path_fd: int, job: JobInfo | None) -> bytes | None:
    """Tags the file (any handle on it) as ``job``'s; the tag, or None (logged) if it cannot."""
    tag = encode_job(job)
    try:
        os.setxattr(f"/proc/self/fd/{path_fd}", XATTR_JOB, tag)
    except OSError as err:
        logger.warning("stage-out: cannot tag a file for its job (not drained): %s", err)
        return None
    return tag


def mark_copied(path: str | int, st: os.stat_result) -> None:
    """Marks the file at ``path`` (or open as it) copied as it is (status ``st``); OSError if it
    cannot."""
    os.setxattr(path, XATTR_COPIED, f"{st.st_mtime_ns}:{st.st_size}".encode())


def mark_evicted(path: str, evicted: Evicted) -> None:
    """Marks the file at ``path`` evicted (or its mark moved); OSError if it cannot."""
    os.setxattr(path, XATTR_EVICTED, evicted.encode())


def relative_path(backing: str, path: str) -> str | None:
    """``path`` (a handle's link) relative to BACKING; None for one outside it, or deleted."""
    if not path or path.endswith(" (deleted)"):
        return None
    rel = os.path.relpath(path, backing)
    return None if rel.startswith("..") or rel == "." else rel


def signature_at(backing_fd: int, rel: str) -> tuple[int, int] | None:
    """The `signature` of the file at ``rel`` under BACKING now; None if it is not there."""
    try:
        return signature(os.stat(rel, dir_fd=backing_fd, follow_symlinks=False))
    except OSError:
        return None


def signature(st: os.stat_result) -> tuple[int, int]:
    """What a copy is checked against: (mtime_ns, size)."""
    return st.st_mtime_ns, st.st_size


def parse_copied(raw: bytes) -> tuple[int, int] | None:
    """The signature of ``XATTR_COPIED`` (``"<mtime_ns>:<size>"``), None if malformed."""
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


def scan(backing_fd: int, finish_in: Path | None) -> dict[Key, Tracked]:
    """Every tagged regular file under BACKING (open as ``backing_fd``), by node, as its marks
    say (`read_marks`; ``finish_in``: the PFS directory, to finish interrupted evictions)."""
    found: dict[Key, Tracked] = {}
    # Through the backing directory's own handle: with the mount in place, its path now
    # leads into the mount.
    for dirpath, _, names, dir_fd in os.fwalk(".", dir_fd=backing_fd):
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
                tracked = read_marks(fd, rel, st, finish_in)
            finally:
                os.close(fd)
            if tracked is not None:
                found[(st.st_dev, st.st_ino)] = tracked
    return found


def read_marks(fd: int, rel: str, st: os.stat_result, finish_in: Path | None) -> Tracked | None:
    """What the marks on one backing file (open as ``fd``, at ``rel``) say; None: not tagged.
    ``finish_in``: the PFS directory, to finish an eviction a restart interrupted
    (`finish_eviction`); None leaves the file as it is."""
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
        tracked.copied = parse_copied(os.getxattr(path, XATTR_COPIED))
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        tracked.evicted = Evicted.decode(os.getxattr(path, XATTR_EVICTED))
    if finish_in is not None and tracked.evicted is not None:
        finish_eviction(path, st, tracked, finish_in)
    tracked.allocated, tracked.signature, tracked.seen_gen = (
        0 if tracked.evicted is not None else st.st_blocks * 512,
        signature(st),
        0,
    )
    return tracked


def finish_eviction(path: str, st: os.stat_result, tracked: Tracked, pfs: Path) -> None:
    """A file marked evicted at start: truncated if the crash came before that, or kept
    (its mark cleared) if its PFS copy is not what the mark says."""
    assert tracked.evicted is not None
    if st.st_size == 0:
        return  # truncated already (or empty all along)
    try:
        pfs_size = os.stat(pfs / tracked.evicted.pfs).st_size
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


def remove_temporaries(pfs: Path) -> None:
    """Removes the temporaries of copies a crash or a stop left in ``pfs``."""
    removed = 0
    for dirpath, _, names in os.walk(pfs):
        for name in names:
            if name.startswith(".") and TEMP_MARK in name:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(dirpath, name))
                    removed += 1
    if removed:
        logger.info("stage-out: removed %d unfinished copies from %s", removed, pfs)
