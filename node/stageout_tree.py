"""The stage-out's tree on the PFS: metadata, directories, symlinks and hard links.

The drain (`stageout`) copies the data of regular files (`stageout_copy`); this module makes
everything around that data look as it does on BACKING:

- **Metadata** (`set_metadata`): owner (when the daemon is root: ``lchown``), extended
  attributes (every name the daemon may read and set: ``user.*``, and ``trusted.*`` /
  ``security.*`` as root; never the stage-out's own ``user.burstctl.*`` marks), mode (after the
  owner and the xattrs: a chown clears set-id bits and ``security.capability``, and a mode
  without write permission would refuse the xattrs of a daemon that is not root), then times.
  A name the PFS refuses (no xattr support, a namespace the daemon may not set) is skipped and
  logged once: the data counts more than the attribute.
- **Directories** (`make_parents`, `stamp_parents`): a file's missing parents are made with
  their namesakes' mode, owner and xattrs; once the file has its final name, its directory (and
  those made for it) takes its namesake's times (a directory's mtime is moved by a change of its
  content, so it is set after it).
- **Directories and symlinks made or changed through the mount** (`PfsTree`): queued by the
  request and reproduced by a thread of their own, so that no request waits on the PFS for them
  (a symlink through a temporary and a rename: a reader never sees it half made). They carry no
  tag (Linux refuses ``user.*`` xattrs on symlinks): one whose reproduction failed is kept in
  memory and tried again after the next one that succeeds, and any directory is made again as
  a parent of the next file copied beneath it.
- **Metadata of a tracked file** (`restamp`): a change of mode, owner, times, xattrs or names
  through the mount goes to its PFS copy without its data, when that copy holds the file's
  current data (copied since its last write, no writer open); an evicted file's mark takes a
  new mtime.
- **Hard links** (`add_name`, `link_names`): a file's names are listed in the xattr
  ``user.burstctl.names`` (`XATTR_NAMES`) on its backing file, as each name is made through the
  mount; after the copy's rename, every other listed name that is still the same file on BACKING
  is made a hard link of the copy on the PFS (through a temporary and a rename), so the PFS
  holds one file under several names. A listed name that no longer leads to the file is
  dropped from the list.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import secrets
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from burstctl.node.stageout_marks import (
    MARK_PREFIX,
    TEMP_MARK,
    Evicted,
    Tracked,
    mark_copied,
    mark_evicted,
    relative_path,
    signature,
)

logger = logging.getLogger(__name__)

XATTR_NAMES = MARK_PREFIX + "names"
# Names a copy loses when its original has none: the namespaces a file's owner or root set.
# security.* may be set on the PFS by its own policy (an LSM label): never removed.
_REMOVABLE = ("user.", "trusted.")
MAX_FAILED = 10_000  # directories and symlinks kept for a second try
# What the PFS refused, logged once per process: by namespace and cause (a bounded set).
_refusals: set[tuple[str, str]] = set()
_refusals_lock = threading.Lock()

Path_ = str | int  # a path, or an open descriptor (xattr and metadata calls take either)


def _refused(name: str, err: OSError) -> None:
    """The PFS refused an extended attribute: logged once per namespace and cause."""
    namespace = name.split(".", 1)[0] + ".*" if name else "any"
    cause = (namespace, err.strerror or str(err))
    with _refusals_lock:
        if cause in _refusals:
            return
        _refusals.add(cause)
    logger.warning("stage-out: the PFS keeps no %s extended attributes: %s (skipped)", *cause)


def copy_xattrs(src: Path_, dst: Path_, *, follow_symlinks: bool = True) -> None:
    """Gives ``dst`` the extended attributes of ``src``, less the stage-out's marks; removes
    from ``dst`` the ``user.*`` / ``trusted.*`` names ``src`` lacks. OSError when ``src``
    cannot be read; a name the PFS refuses, whatever its reason (no xattr support, a namespace
    the daemon may not set, a value it does not take: a security label), is skipped (logged
    once): the copy goes on without it. A PFS that fails outright fails the calls around."""
    follow = {"follow_symlinks": follow_symlinks}
    wanted: dict[str, bytes] = {}
    for name in os.listxattr(src, **follow):
        if not name.startswith(MARK_PREFIX):
            with contextlib.suppress(OSError):  # gone since it was listed
                wanted[name] = os.getxattr(src, name, **follow)
    try:
        present = set(os.listxattr(dst, **follow))
    except OSError as err:
        _refused("", err)
        return
    for name in present - wanted.keys():
        if name.startswith(_REMOVABLE) and not name.startswith(MARK_PREFIX):
            with contextlib.suppress(OSError):
                os.removexattr(dst, name, **follow)
    for name, value in wanted.items():
        try:
            if name in present and os.getxattr(dst, name, **follow) == value:
                continue
            os.setxattr(dst, name, value, **follow)
        except OSError as err:
            _refused(name, err)


def set_metadata(
    dst: Path_,
    st: os.stat_result,
    xattrs_of: Path_,
    *,
    times: tuple[int, int] | None = None,
    symlink: bool = False,
) -> None:
    """Gives ``dst`` the owner (as root), xattrs (those of ``xattrs_of``), mode and times
    (``times``: (atime_ns, mtime_ns), by default ``st``'s) of ``st``. ``symlink``: ``dst`` is
    a path to a symlink, changed itself (no mode: a symlink has none)."""
    # A descriptor takes no follow_symlinks (the call is on the file it is open on).
    follow = isinstance(dst, int) or not symlink
    if os.geteuid() == 0:
        os.chown(dst, st.st_uid, st.st_gid, follow_symlinks=follow)
    copy_xattrs(xattrs_of, dst, follow_symlinks=follow)
    if not symlink:
        os.chmod(dst, stat.S_IMODE(st.st_mode))  # exact, whatever the umask
    os.utime(dst, ns=times or (st.st_atime_ns, st.st_mtime_ns), follow_symlinks=follow)


def backing_path(backing_fd: int, rel: str) -> str:
    """A path to ``rel`` under BACKING (open as ``backing_fd``) through the handle: with the
    mount in place, BACKING's own path leads into the mount."""
    return f"/proc/self/fd/{backing_fd}/{rel}"


def make_parents(pfs: Path, backing_fd: int, rel_dir: str) -> int:
    """Creates the missing directories of ``rel_dir`` under ``pfs`` with the mode, owner and
    xattrs of their namesakes on BACKING (open as ``backing_fd``); how many it made (the
    deepest of ``rel_dir``); OSError on failure."""
    made = 0
    here, rel = pfs, ""
    for part in Path(rel_dir).parts:
        here, rel = here / part, os.path.join(rel, part)
        if here.is_dir():
            continue
        try:
            st: os.stat_result | None = os.stat(rel, dir_fd=backing_fd, follow_symlinks=False)
        except OSError:
            st = None
        try:
            os.mkdir(here, 0o700)  # opened up by set_metadata, once it is the owner's
        except FileExistsError:
            continue
        made += 1
        if st is not None and stat.S_ISDIR(st.st_mode):
            set_metadata(str(here), st, backing_path(backing_fd, rel))
        else:
            os.chmod(here, 0o755)
    return made


def stamp_parents(pfs: Path, backing_fd: int, rel_dir: str, made: int) -> None:
    """Gives ``rel_dir`` on the PFS, and the ``made`` directories above it that were just made
    (whose parents' times a mkdir moved), the times of their namesakes on BACKING: a change
    beneath (a rename into it, a mkdir) has just moved them. Deepest first."""
    rel = rel_dir
    for _ in range(made + 1):
        if rel in ("", "."):
            break
        with contextlib.suppress(OSError):
            st = os.stat(rel, dir_fd=backing_fd, follow_symlinks=False)
            os.utime(pfs / rel, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
        rel = os.path.dirname(rel)


def reproduce(pfs: Path, backing_fd: int, rel: str) -> None:
    """Makes the PFS's ``rel`` what BACKING's is, for a directory or a symlink (its parents
    made as needed, its parent's times set after); anything else is left alone. OSError when it
    cannot."""
    st = os.stat(rel, dir_fd=backing_fd, follow_symlinks=False)
    target = pfs / rel
    made = make_parents(pfs, backing_fd, os.path.dirname(rel))
    if stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileExistsError):
            os.mkdir(target, 0o700)
        if not stat.S_ISDIR(os.lstat(target).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(target))
        set_metadata(str(target), st, backing_path(backing_fd, rel))
    elif stat.S_ISLNK(st.st_mode):
        link = os.readlink(rel, dir_fd=backing_fd)
        if not (target.is_symlink() and os.readlink(target) == link):
            _put(target, functools.partial(os.symlink, link))
        set_metadata(str(target), st, backing_path(backing_fd, rel), symlink=True)
    else:
        return
    stamp_parents(pfs, backing_fd, os.path.dirname(rel), made)


def temporary(target: Path) -> Path:
    """A temporary name beside ``target`` (`TEMP_MARK`: removed at start if left behind)."""
    return target.parent / f".{target.name}{TEMP_MARK}{secrets.token_hex(4)}"


def _put(target: Path, make: Callable[[Path], None]) -> None:
    """Makes a node at a temporary name (``make(temp)``), then renames it over ``target``: a
    reader of the PFS sees the old node or the new one, never none."""
    temp = temporary(target)
    make(temp)
    try:
        os.rename(temp, target)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


# ---------------------------------------------------------------------- hard links


def read_names(path: Path_) -> list[str]:
    """The names of the file at ``path`` (or open as it) listed in `XATTR_NAMES`."""
    try:
        names = json.loads(os.getxattr(path, XATTR_NAMES))
    except (OSError, ValueError):
        return []
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def add_name(path_fd: int, *rels: str) -> None:
    """Lists ``rels`` among the names of the file open as ``path_fd`` (any handle)."""
    proc = f"/proc/self/fd/{path_fd}"
    names = read_names(proc)
    more = [r for r in rels if r and r not in names]
    if more:
        os.setxattr(proc, XATTR_NAMES, json.dumps(names + more).encode())


def link_names(pfs: Path, backing_fd: int, src: int, rel: str) -> None:
    """Makes each other listed name of the file open as ``src`` (copied to ``pfs / rel``) a
    hard link of that copy; a listed name that is no longer the same file on BACKING is
    dropped from the list. A link that cannot be made is logged and left (the copy itself is
    good: failing it would copy the file again and again, never evicting it)."""
    proc = f"/proc/self/fd/{src}"
    names = read_names(proc)
    if not names:
        return
    st = os.fstat(src)
    kept: list[str] = []
    for name in names:
        try:
            other = os.stat(name, dir_fd=backing_fd, follow_symlinks=False)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) != (st.st_dev, st.st_ino):
            continue
        kept.append(name)
        if name == rel:
            continue
        target, copy = pfs / name, pfs / rel
        with contextlib.suppress(OSError):
            if os.path.samefile(target, copy):
                continue
        try:
            made = make_parents(pfs, backing_fd, os.path.dirname(name))
            _put(target, functools.partial(os.link, copy))
        except OSError as err:
            logger.warning("stage-out: cannot link %s to %s on PFS_DIR: %s", name, rel, err)
            continue
        stamp_parents(pfs, backing_fd, os.path.dirname(name), made)
    if kept != names:
        with contextlib.suppress(OSError):
            os.setxattr(proc, XATTR_NAMES, json.dumps(kept).encode())


# ---------------------------------------------------------------------- changes through the mount


def restamp(
    pfs: Path,
    backing_fd: int,
    path_fd: int,
    tracked: Tracked,
    gen: int | None,
    new_name: str | None,
    lock: threading.Lock,
) -> None:
    """The metadata of a tracked file (open as ``path_fd``) changed through the mount
    (``new_name``: a name it was given, relative to BACKING): its PFS copy takes it, when that
    copy holds the file's data as it is (``gen``: its write generation now, None while a writer
    has it open); an evicted file's mark takes its new mtime. Under `StageOut.holding`, with
    ``lock`` (the stage-out's) held to change ``tracked``; never fails (a failure is logged:
    the next copy of the file takes its metadata)."""
    try:
        if new_name is not None:
            add_name(path_fd, tracked.rel, new_name)
        _restamp(pfs, backing_fd, path_fd, tracked, gen, lock)
    except OSError as err:
        logger.warning("stage-out: cannot update the PFS copy of %s: %s", tracked.rel, err)


def _restamp(
    pfs: Path,
    backing_fd: int,
    path_fd: int,
    tracked: Tracked,
    gen: int | None,
    lock: threading.Lock,
) -> None:
    proc = f"/proc/self/fd/{path_fd}"
    st = os.stat(proc)
    evicted = tracked.evicted
    if evicted is not None:
        if st.st_mtime_ns != evicted.mtime_ns:
            moved = Evicted(evicted.size, st.st_mtime_ns, evicted.pfs)
            mark_evicted(proc, moved)
            with lock:
                tracked.evicted = moved
        rel = evicted.pfs
    elif (
        gen is not None
        and tracked.copied is not None
        and tracked.copied[1] == st.st_size
        and (
            tracked.copied_gen == gen
            # Since a restart: unwritten since, and copied as it was then.
            or (tracked.copied_gen is None and gen == 0 and tracked.signature == tracked.copied)
        )
    ):
        rel = tracked.rel
    else:
        return  # not copied as it is now: its next copy takes the metadata with the data
    target = pfs / rel
    if not target.is_file():
        return
    set_metadata(str(target), st, proc)
    link_names(pfs, backing_fd, path_fd, rel)
    if evicted is None and signature(st) != tracked.copied:
        mark_copied(proc, st)
        with lock:
            tracked.copied = tracked.signature = signature(st)


class PfsTree:
    """Reproduces on ``pfs`` the directories and symlinks made or changed through the mount
    (BACKING open as ``backing_fd``, at ``backing``), in a thread of its own (`run`, until
    ``stopping`` is set and `wake` called): the mount's requests never wait on the PFS for
    them. Thread-safe."""

    def __init__(self, backing_fd: int, backing: str, pfs: Path, stopping: threading.Event):
        self._root = backing_fd
        self._backing = backing
        self._pfs = pfs
        self._stopping = stopping
        self._wake = threading.Condition(threading.Lock())
        self._todo: dict[str, None] = {}  # in the order asked (each taken as BACKING has it)
        self._busy = False
        self._failed: set[str] = set()  # tried again after the next success
        self._causes: set[str] = set()  # logged since the last success

    def reproduce(self, path: str) -> None:
        """The node at ``path`` (under BACKING) was made or changed through the mount: a
        directory or symlink is queued for its reproduction on the PFS."""
        rel = relative_path(self._backing, path)
        if rel is not None:
            with self._wake:
                self._todo[rel] = None
                self._wake.notify()

    def run(self) -> None:
        """The worker: reproduces what is queued. A failure is logged once per cause and kept
        (at most `MAX_FAILED`), to be tried again once a reproduction succeeds (with PFS_DIR
        unwritable, each change costs one try)."""
        while True:
            with self._wake:
                self._busy = False
                self._wake.notify_all()
                while not self._todo and not self._stopping.is_set():
                    self._wake.wait()
                if self._stopping.is_set():
                    return
                todo, self._busy = list(self._todo), True
                self._todo.clear()
            if any([self._try(rel) for rel in todo]) and self._failed:
                again = sorted(self._failed)  # parents before their content
                self._failed.clear()
                for rel in again:
                    self._try(rel)

    def _try(self, rel: str) -> bool:
        try:
            reproduce(self._pfs, self._root, rel)
        except FileNotFoundError:
            return True  # gone from BACKING since
        except OSError as err:
            if len(self._failed) < MAX_FAILED:
                self._failed.add(rel)
            cause = err.strerror or str(err)
            if cause not in self._causes:
                self._causes.add(cause)
                logger.warning("stage-out: cannot reproduce %s on PFS_DIR: %s", rel, cause)
            return False
        self._causes.clear()
        return True

    def wake(self) -> None:
        """Wakes the worker (to see that the stage-out stops)."""
        with self._wake:
            self._wake.notify_all()

    def settled(self) -> bool:
        """Nothing queued or being reproduced (tests)."""
        with self._wake:
            return not self._todo and not self._busy

    def pending(self) -> list[str]:
        """What failed and waits for a second try (tests, logs)."""
        with self._wake:
            return sorted(self._failed)


__all__ = [
    "MAX_FAILED",
    "XATTR_NAMES",
    "PfsTree",
    "add_name",
    "copy_xattrs",
    "link_names",
    "make_parents",
    "reproduce",
    "restamp",
    "set_metadata",
    "stamp_parents",
    "temporary",
]
