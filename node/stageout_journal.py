"""The stage-out's journal of tracked files, and the start-up that reads it (or scans BACKING).

Without a journal, a start finds the tracked files by scanning all of BACKING for their tags
(`stageout_marks.scan`): minutes of I/O on a buffer with millions of files. The journal is
an append-only file of what `StageOut` tracks: ``put`` (this key is tracked at this path,
for this job tag: a file tagged, or its path moved) and ``drop`` (no longer tracked). It says
nothing of copies or evictions: the xattrs on each file are the truth for those, and a start
reads them from the one file each entry names.

Records are lines ``<crc32 hex> <json>``. The first is a header: the format, a token and the
boot id of the machine that wrote it (a start that resumes appending to the file appends its
own boot id); a clean stop ends the file with a ``closed`` record.
Appends are plain writes (a killed process loses none: they are in the page cache) and
are fsynced in batches (`sync`, from the stage-out's report timer); so a journal is trusted:

- after a clean stop (it ends with ``closed``, fsynced), or
- after a crash of the process on the same boot (every append is in the page cache);
- not after the machine restarted without a clean stop (unsynced appends may be lost: a file
  tagged in that window would never drain), nor when its token differs from the one on
  BACKING's root (``user.burstctl.journal``: another journal was written for BACKING since,
  e.g. a run with another ``--journal``).

A torn last record (a crash mid-append) is ignored; a bad record anywhere else makes the
journal unreadable (kept aside by `DurableFile`). An untrusted, unreadable or missing journal
falls back to the full scan, logged with the reason, and a fresh journal is written.

`recover` is the start-up: temporaries left on the PFS are removed, the journal (or the scan)
gives the tracked files, each checked with one stat and its own xattrs (`read_marks`: an
interrupted eviction is finished there). An entry whose file is not at its path, or is
another file now (renamed or deleted behind the mount while it was down), comes back
``lost``: the drain's rate-limited rescan of BACKING looks for it by its tag
(`StageOut._lose`); without a PFS to drain to, it is forgotten. Then the journal is
rewritten with what was found (`rewrite`), under a new token set on BACKING's root; or, when
that is what it holds already, appended to (`resume`: a record of this boot).

Compaction: once the file holds more than `COMPACT_FACTOR` records per live entry (at least
`COMPACT_MIN`), it is rewritten from the live entries, atomically (`DurableFile.save`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import stat
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from burstctl.common.files import DurableFile, default_state_dir
from burstctl.node.stageout_marks import (
    Key,
    Tracked,
    decode_job,
    read_marks,
    remove_temporaries,
    scan,
    signature_at,
)

logger = logging.getLogger(__name__)

XATTR_JOURNAL = "user.burstctl.journal"  # on BACKING's root: the token of its journal
FORMAT = 1
COMPACT_FACTOR = 4
COMPACT_MIN = 1024
BOOT_ID = "/proc/sys/kernel/random/boot_id"

Entry = tuple[str, bytes]  # (path relative to BACKING, job tag)


def default_journal(backing: Path) -> Path:
    """Where BACKING's journal lives unless told: the user's state directory (the
    controller's default ``state_dir``), one file per BACKING, named after its real path."""
    real = os.path.realpath(backing)
    digest = hashlib.sha256(real.encode()).hexdigest()[:16]
    name = os.path.basename(real.rstrip("/")) or "root"
    return default_state_dir() / "stageout" / f"{name}-{digest}.journal"


def _boot_id() -> str:
    try:
        with open(BOOT_ID) as f:
            return f.read().strip()
    except OSError:
        return ""


def _line(record: list[object]) -> str:
    body = json.dumps(record, separators=(",", ":"))
    return f"{zlib.crc32(body.encode()):08x} {body}\n"


def _checked(line: str) -> str | None:
    """The body of a record line whose checksum holds; None if it does not."""
    crc, _, body = line.partition(" ")
    try:
        return body if len(crc) == 8 and int(crc, 16) == zlib.crc32(body.encode()) else None
    except ValueError:
        return None


@dataclass(slots=True)
class _Read:
    """A journal as read: its token, the boot id it was last written on, whether it ends
    clean or torn, how many records it holds, its entries."""

    token: str
    boot: str
    closed: bool
    torn: bool
    records: int
    entries: dict[Key, Entry]
    tags: dict[bytes, int]  # the job tags it defines, by their numbers in it


def _parse(text: str) -> _Read:
    lines = text.split("\n")
    # The last piece follows the last newline: "" when the file ends with a whole record,
    # else a record torn by a crash mid-append (as is a last line that does not check).
    if lines[-1]:
        logger.warning("stage-out: the journal's last record is torn; ignored")
    torn = bool(lines[-1])
    bodies = [_checked(line) for line in lines[:-1]]
    if bodies and bodies[-1] is None:
        torn = True
        logger.warning("stage-out: the journal's last record is torn; ignored")
        bodies.pop()
    if None in bodies:
        raise ValueError("a record before the last does not check")
    # One parse of every body: much faster than one per record, for a journal of millions.
    records: list[list[object]] = json.loads("[" + ",".join(b for b in bodies if b) + "]")
    if not records or records[0][:2] != ["h", FORMAT] or len(records[0]) != 4:
        raise ValueError(f"not a stage-out journal of format {FORMAT}")
    _, _, token, boot = records[0]
    entries: dict[Key, Entry] = {}
    tags: dict[int, bytes] = {}
    closed = False
    for record in records[1:]:
        if not isinstance(record, list) or not record:
            raise ValueError("not a record")
        closed = record[0] == "c"
        if record[0] == "b":  # appended by a start that resumed from the journal
            boot = record[1]
        elif record[0] == "j":  # a job tag, defined once, then named by its number
            _, number, tag = record
            tags[int(number)] = str(tag).encode()  # type: ignore[call-overload]
        elif record[0] == "p":
            _, dev, ino, rel, number = record
            if not isinstance(rel, str):
                raise ValueError("bad put record")
            entries[(int(dev), int(ino))] = (rel, tags[int(number)])  # type: ignore[call-overload]
        elif record[0] == "d":
            _, dev, ino = record
            entries.pop((int(dev), int(ino)), None)  # type: ignore[call-overload]
    numbers = {tag: number for number, tag in tags.items()}
    return _Read(str(token), str(boot), closed, torn, len(records) - 1, entries, numbers)


class Journal:
    """The journal of one BACKING (open as ``backing_fd``) at ``path``. Thread-safe; an I/O
    error is logged and disables the journal (the next start scans)."""

    def __init__(self, path: Path, backing_fd: int) -> None:
        self.file = DurableFile(path, "the stage-out journal")
        self._root = backing_fd
        self._lock = threading.Lock()
        self._fd = -1  # open for appends once `rewrite` wrote a fresh journal
        self._token = ""
        self._live: dict[Key, Entry] = {}
        self._records = 0  # put and drop records since the last rewrite
        self._tags: dict[bytes, int] = {}  # the job tags the file defines, and their numbers
        self._dirty = False  # appended since the last fsync
        self._read: _Read | None = None  # what `replay` trusted, until `resume` or `rewrite`

    @property
    def path(self) -> Path:
        return self.file.path

    def replay(self) -> dict[Key, Entry] | None:
        """The entries of a journal that can be trusted (module docstring); None, logged with
        the reason, when there is none."""
        try:
            read = self.file.load(_parse)
        except OSError as err:
            read, why = None, str(err)
        else:
            why = "missing or unreadable"
        if read is None:
            logger.info("stage-out: no usable journal at %s (%s)", self.path, why)
            return None
        try:
            token = os.getxattr(f"/proc/self/fd/{self._root}", XATTR_JOURNAL).decode()
        except OSError:
            token = ""
        if token != read.token:
            logger.info("stage-out: the journal %s is not BACKING's latest", self.path)
            return None
        if not read.closed and read.boot != _boot_id():
            logger.info(
                "stage-out: the journal %s was not closed and the machine restarted since "
                "(its last appends may be lost)",
                self.path,
            )
            return None
        self._read = read
        return read.entries

    def resume(self, entries: dict[Key, Entry]) -> bool:
        """Appends to the journal `replay` trusted rather than rewriting it, when ``entries``
        (what a start found) are what it holds and it ends with a whole record: a record of
        this boot is appended (a crash from now on is a crash on this boot). False if not."""
        with self._lock:
            read, self._read = self._read, None
            if read is None or read.torn or read.entries != entries:
                return False
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            except OSError:
                return False
            self._token, self._live, self._records = read.token, entries, read.records
            self._tags = read.tags
            self._append(_line(["b", _boot_id()]))
            return self._fd >= 0

    def rewrite(self, entries: Iterable[tuple[Key, str, bytes]]) -> None:
        """A fresh journal holding ``entries`` (key, rel, tag), written atomically under a new
        token, which then goes on BACKING's root; appends go to it from now on."""
        live = {key: (rel, tag) for key, rel, tag in entries}
        with self._lock:
            self._read = None
            self._token = secrets.token_hex(8)
            self._live = live
            self._write()
            if self._fd < 0:
                return
            try:
                os.setxattr(f"/proc/self/fd/{self._root}", XATTR_JOURNAL, self._token.encode())
            except OSError as err:
                self._disable(f"cannot mark BACKING with the journal's token: {err}")

    def _write(self) -> None:
        """Writes the live entries as the journal (lock held) and opens it for appends."""
        self._tags = {}
        header = _line(["h", FORMAT, self._token, _boot_id()])
        text = header + "".join(self._put(key, rel, tag) for key, (rel, tag) in self._live.items())
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self.file.save(text)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError as err:
            self._disable(f"cannot write {self.path}: {err}")
            return
        self._records, self._dirty = 0, False

    def put(self, key: Key, rel: str, tag: bytes) -> None:
        """``key`` is tracked at ``rel`` for the job ``tag`` (new, or moved)."""
        with self._lock:
            if self._live.get(key) == (rel, tag):
                return
            self._live[key] = (rel, tag)
            self._append(self._put(key, rel, tag))

    def drop(self, key: Key) -> None:
        """``key`` is no longer tracked."""
        with self._lock:
            if self._live.pop(key, None) is not None:
                self._append(_line(["d", key[0], key[1]]))

    def _put(self, key: Key, rel: str, tag: bytes) -> str:
        """The record of a put (lock held), after the tag's definition if new to the file: a
        tag is written once, not with each of the many files of its job."""
        number = self._tags.get(tag)
        definition = ""
        if number is None:
            number = self._tags[tag] = len(self._tags)
            definition = _line(["j", number, tag.decode()])
        return definition + _line(["p", key[0], key[1], rel, number])

    def _append(self, text: str) -> None:
        if self._fd < 0:
            return
        try:
            os.write(self._fd, text.encode())
        except OSError as err:
            self._disable(f"cannot append to {self.path}: {err}")
            return
        self._records += 1
        self._dirty = True
        if self._records > COMPACT_FACTOR * max(len(self._live), COMPACT_MIN):
            self._write()

    def sync(self) -> None:
        """Makes the appends so far durable (called in batches: every report interval)."""
        with self._lock:
            if self._fd < 0 or not self._dirty:
                return
            self._dirty = False
            try:
                os.fsync(self._fd)
            except OSError as err:
                self._disable(f"cannot fsync {self.path}: {err}")

    def close(self) -> None:
        """A clean stop: ``closed`` appended and fsynced. Later appends (a lazy unmount's last
        files) still go after it, so the journal is then no longer closed: as it should be."""
        with self._lock:
            if self._fd < 0:
                return
            try:
                os.write(self._fd, _line(["c"]).encode())
                os.fsync(self._fd)
            except OSError as err:
                self._disable(f"cannot close {self.path}: {err}")

    def _disable(self, why: str) -> None:
        """No journal from now on (lock held): BACKING's token goes, so that the next start
        scans rather than trust a journal that misses what follows."""
        logger.error("stage-out: %s; journal off (the next start scans BACKING)", why)
        with contextlib.suppress(OSError):
            os.removexattr(f"/proc/self/fd/{self._root}", XATTR_JOURNAL)
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = -1


def recover(
    backing_fd: int, backing: str, pfs: Path | None, journal: Journal | None
) -> tuple[dict[Key, Tracked], list[Key]]:
    """The tracked files at start (module docstring), from the journal if it can be trusted,
    else from a scan of BACKING (the journal is written afresh either way), and those to copy
    (not evicted, no good copy; or lost). ``pfs``: where temporaries are removed and
    interrupted evictions finished."""
    if pfs is not None:
        remove_temporaries(pfs)
    found: dict[Key, Tracked] | None = None
    if journal is not None:
        entries = journal.replay()
        if entries is not None:
            found = _check(backing_fd, entries, pfs)
            lost = sum(t.lost for t in found.values())
            if pfs is None:  # no drain to look for them (`StageOut._lose`): forgotten
                found = {key: t for key, t in found.items() if not t.lost}
            logger.info(
                "stage-out: resumed from the journal: %d files (no scan of BACKING)%s",
                len(found),
                f"; {lost} not where recorded, "
                + ("forgotten" if pfs is None else "looked for by a rescan")
                if lost
                else "",
            )
    if found is None:
        if journal is not None:
            logger.info("stage-out: scanning all of %s for tracked files", backing)
        found = scan(backing_fd, pfs)
    if journal is not None:
        current = {key: (t.rel, t.tag) for key, t in found.items()}
        if not journal.resume(current):
            journal.rewrite((key, rel, tag) for key, (rel, tag) in current.items())
    due = [
        key
        for key, t in found.items()
        if t.lost or (t.evicted is None and t.copied != signature_at(backing_fd, t.rel))
    ]
    if found:
        logger.info("stage-out: %d files tracked on %s, %d to copy", len(found), backing, len(due))
    return found, due


def _check(backing_fd: int, entries: dict[Key, Entry], pfs: Path | None) -> dict[Key, Tracked]:
    """The journal's entries as they are now: one stat and the xattrs of each file."""
    found: dict[Key, Tracked] = {}
    for key, (rel, tag) in entries.items():
        ino = key[1]
        try:
            fd = os.open(rel, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=backing_fd)
        except OSError:
            fd = -1
        try:
            st = os.fstat(fd) if fd >= 0 else None
            # The inode number alone: the device number may change across a reboot.
            if st is not None and st.st_ino == ino and stat.S_ISREG(st.st_mode):
                tracked = read_marks(fd, rel, st, pfs)
                if tracked is not None:
                    found[(st.st_dev, st.st_ino)] = tracked
                continue  # untagged now: not tracked
        finally:
            if fd >= 0:
                os.close(fd)
        with contextlib.suppress(ValueError, KeyError, TypeError):
            lost = Tracked(decode_job(tag), tag, rel, lost=True)
            found[key] = lost
    return found


__all__ = ["Journal", "default_journal", "recover"]
