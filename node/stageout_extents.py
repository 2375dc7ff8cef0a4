"""Files drained while they are still open: their written extents leave the buffer.

A checkpoint is written to completion before it is closed. Were only closed files drained, a
file larger than the buffer (or a job whose open files together are) would fill it and wait
for space for ever. So, with ``--evict after-copy``, the stage-out drains the *complete
chunks* (`CHUNK_BYTES`, aligned) of a file open for writing as it goes (docs/capacity.md,
"Files larger than the buffer"):

1. a drain pass copies chunks that no write has touched for `QUIET` seconds and no write is
   in flight on, to the file's *part* on the PFS (``.NAME.burstctl-open-XXXX`` beside its
   final name, at the chunks' own offsets, holes kept), and fsyncs the part;
2. it records the chunks in the file's ``user.burstctl.drained`` mark (`Drained`);
3. it punches them out of the backing file (``FALLOC_FL_PUNCH_HOLE``): their space is free.

A chunk written during its copy (its generation moved) is not recorded nor punched. A write
counts its chunks in flight before it starts (`begin_write`), and a chunk in flight is never
punched, so a punch never loses bytes written into it. Reads and SEEK_DATA/SEEK_HOLE are
served per chunk from the buffer or the part (`read`, `seek`). A write, truncate or fallocate
into a drained chunk first brings it back onto the buffer (`restore`), and only then drops it
from the mark. At the last close the file's final copy completes the part with what is left
on the buffer and renames it to the final name (`node.stageout_copy.copy_to_pfs`).

The mark is written before the part is made, and a chunk joins the mark only after the part is
fsynced and before it is punched, so after a crash at any step every byte is on the buffer, in
the part named by the mark, or both.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from burstctl.common.syscalls import fallocate

logger = logging.getLogger(__name__)

XATTR_DRAINED = "user.burstctl.drained"
OPEN_MARK = ".burstctl-open-"  # the part of an open file: ".<name>.burstctl-open-<random>"
CHUNK_BYTES = 4 << 20
QUIET = 0.2  # a chunk written within this many seconds is not drained yet
PASS_BYTES = 32 << 20  # at most this much of one file per drain pass
PIECE = 1 << 20  # the most one paced piece of a copy (`copy_data`) holds
MAX_MARK_BYTES = 3072  # an xattr value fits one 4 KiB block (ext4 without ea_inode)
_PUNCH = 0x01 | 0x02  # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE


@dataclass(slots=True)
class Drained:
    """The ``user.burstctl.drained`` mark: where the part is (relative to PFS_DIR), the chunk
    size, and the chunks in it as sorted disjoint half-open ranges of chunk indices."""

    part: str
    chunk: int = CHUNK_BYTES
    ranges: list[tuple[int, int]] = field(default_factory=list)

    def encode(self) -> bytes:
        value = {"part": self.part, "chunk": self.chunk, "ranges": self.ranges}
        return json.dumps(value, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Drained:
        value = json.loads(raw)
        part, chunk, ranges = value["part"], value["chunk"], value["ranges"]
        if not (isinstance(part, str) and isinstance(chunk, int) and chunk > 0):
            raise ValueError("bad drained mark")
        pairs = [(int(a), int(b)) for a, b in ranges]
        if any(a >= b or a < 0 for a, b in pairs) or pairs != sorted(pairs):
            raise ValueError("bad drained ranges")
        return cls(part, chunk, pairs)

    def contains(self, index: int) -> bool:
        at = bisect.bisect_right(self.ranges, (index, float("inf"))) - 1
        return at >= 0 and self.ranges[at][0] <= index < self.ranges[at][1]

    def count(self) -> int:
        return sum(b - a for a, b in self.ranges)

    def add(self, indices: Iterable[int]) -> None:
        for index in indices:
            self._merge(index, index + 1)

    def _merge(self, a: int, b: int) -> None:
        merged: list[tuple[int, int]] = []
        for x, y in self.ranges:
            if y < a or x > b:
                merged.append((x, y))
            else:
                a, b = min(a, x), max(b, y)
        merged.append((a, b))
        self.ranges = sorted(merged)

    def remove(self, a: int, b: int) -> None:
        """Drops chunks [a, b)."""
        kept: list[tuple[int, int]] = []
        for x, y in self.ranges:
            if x < a:
                kept.append((x, min(y, a)))
            if y > b:
                kept.append((max(x, b), y))
        self.ranges = [(x, y) for x, y in kept if x < y]

    def within(self, a: int, b: int) -> list[int]:
        """The drained chunks among [a, b)."""
        return [i for x, y in self.ranges for i in range(max(x, a), min(y, b))]


def read_drained(path: str) -> Drained | None:
    """The mark on the file at ``path`` (None: none, or unreadable: logged)."""
    try:
        raw = os.getxattr(path, XATTR_DRAINED)
    except OSError:
        return None
    try:
        return Drained.decode(raw)
    except (ValueError, KeyError, TypeError):
        logger.error("stage-out: %s has an unreadable drained mark", path)
        return None


def part_name(final_rel: str, token: str) -> str:
    """The part of the file staged at ``final_rel`` (relative to PFS_DIR)."""
    head, tail = os.path.split(final_rel)
    return os.path.join(head, f".{tail}{OPEN_MARK}{token}")


class OpenExtents:
    """One tracked file's chunks: generations, writes in flight, and the drained ones.

    ``path_fd``: a handle on the backing file (for its marks); ``part_fd``: the part, open
    read-write (None until the first pass makes it). Thread-safe; the lock is held for the
    short bookkeeping, for reads of a file with drained chunks and for a pass's punch, never
    while waiting for space or bandwidth."""

    def __init__(self, drained: Drained | None = None, part_fd: int | None = None) -> None:
        self.lock = threading.Lock()
        self.drained = drained
        self.part_fd = part_fd
        self._gen: dict[int, int] = {}
        self._inflight: dict[int, int] = {}
        self._last: dict[int, float] = {}
        self._end = 0  # the furthest a write reached
        self.full = False  # the mark has no room for more ranges: nothing more is drained
        self.passing = False  # a drain pass works on the file (`OpenDrain`'s lock)

    @property
    def chunk(self) -> int:
        return self.drained.chunk if self.drained is not None else CHUNK_BYTES

    def has_drained(self) -> bool:
        return self.drained is not None and bool(self.drained.ranges)

    def drained_bytes(self) -> int:
        return 0 if self.drained is None else self.drained.count() * self.drained.chunk

    def _span(self, offset: int, length: int) -> range:
        c = self.chunk
        return range(offset // c, (offset + max(length, 1) - 1) // c + 1)

    # ------------------------------------------------------------------ writes

    def begin_write(self, offset: int, length: int, now: float) -> list[int]:
        """A write of [offset, offset+length) starts: its chunks are in flight (never punched
        until `end_write`). Returns the drained chunks it touches, to `restore` first."""
        span = self._span(offset, length)
        with self.lock:
            self._end = max(self._end, offset + length)
            for index in span:
                self._inflight[index] = self._inflight.get(index, 0) + 1
                self._gen[index] = self._gen.get(index, 0) + 1
                self._last[index] = now
            if self.drained is None:
                return []
            return self.drained.within(span.start, span.stop)

    def end_write(self, offset: int, length: int) -> None:
        with self.lock:
            for index in self._span(offset, length):
                left = self._inflight.get(index, 0) - 1
                if left > 0:
                    self._inflight[index] = left
                else:
                    self._inflight.pop(index, None)

    def restore(self, indices: list[int], backing: int, path: str) -> int:
        """Brings drained chunks back onto the buffer (the part's bytes written into the
        backing file), then drops them from the mark. Returns the bytes brought back."""
        moved = 0
        with self.lock:
            drained = self.drained
            if drained is None or self.part_fd is None:
                return 0
            todo = [i for i in indices if drained.contains(i)]
            c = drained.chunk
            for index in todo:
                data = os.pread(self.part_fd, c, index * c)
                if data:
                    _write_all(backing, data, index * c)
                    moved += len(data)
            if todo:
                for index in todo:
                    drained.remove(index, index + 1)
                os.setxattr(path, XATTR_DRAINED, drained.encode())
                self.full = False
        return moved

    def cut(self, size: int, path: str) -> None:
        """The file is truncated to ``size`` (the chunk across it restored already): chunks
        past it leave the mark, and the part is cut too, so that bytes the truncate removed
        never come back through it."""
        with self.lock:
            first = -(-size // self.chunk)
            for index in [i for i in self._last if i >= first]:
                del self._last[index]
            drained = self.drained
            if drained is None:
                return
            drained.remove(first, 1 << 62)
            os.setxattr(path, XATTR_DRAINED, drained.encode())
            if self.part_fd is not None and os.fstat(self.part_fd).st_size > size:
                os.ftruncate(self.part_fd, size)

    # ------------------------------------------------------------------ the drain's pass

    def candidates(self, size: int, now: float, limit: int) -> dict[int, int]:
        """Complete chunks below ``size`` to drain now, with their generations: not drained,
        no write in flight, untouched for `QUIET` seconds; at most ``limit`` bytes."""
        if self.full:
            return {}
        with self.lock:
            c = self.chunk
            out: dict[int, int] = {}
            for index in sorted(self._last):
                if len(out) * c >= limit or index >= size // c:
                    break
                if self._inflight.get(index) or now - self._last[index] < QUIET:
                    continue
                out[index] = self._gen.get(index, 0)
            return out

    def candidates_untracked(self, size: int, limit: int) -> dict[int, int]:
        """`candidates` for a shim that does not tell its writes: the complete chunks not
        drained but the last one (the writer's place, for a sequential writer), at most
        ``limit`` bytes."""
        if self.full:
            return {}
        with self.lock:
            c = self.chunk
            top = size // c - 1
            out: dict[int, int] = {}
            index = 0
            ranges = [] if self.drained is None else self.drained.ranges
            for a, b in [*ranges, (top, top)]:
                while index < min(a, top) and len(out) * c < limit:
                    out[index] = 0
                    index += 1
                index = max(index, b)
            return out

    def busy(self) -> bool:
        """Whether a write or a change is in flight on the file."""
        with self.lock:
            return bool(self._inflight)

    def waiting(self) -> bool:
        """Whether complete chunks written since the last pass wait for one (a chunk is
        complete once a write reached past it)."""
        with self.lock:
            return not self.full and bool(self._last) and min(self._last) < self._end // self.chunk

    def commit(self, copied: dict[int, int], backing: int, path: str) -> int:
        """After the copied chunks are durable in the part: records those no write touched
        since (generation unchanged, none in flight) in the mark, then punches them out of
        the backing file. Returns the bytes punched (by chunk size)."""
        with self.lock:
            done = [
                i
                for i, gen in copied.items()
                if self._gen.get(i, 0) == gen and not self._inflight.get(i)
            ]
            return self._record(done, backing, path)

    def commit_verified(self, copied: dict[int, int], backing: int, path: str) -> int:
        """`commit` for a shim that does not tell its writes (the preload library), called
        while it holds every writer of the file out (no write in flight): records and punches
        the copied chunks whose bytes on the buffer are still those in the part."""
        with self.lock:
            assert self.part_fd is not None
            c = self.chunk
            done = [
                i for i in copied if os.pread(backing, c, i * c) == os.pread(self.part_fd, c, i * c)
            ]
            return self._record(done, backing, path)

    def _record(self, done: list[int], backing: int, path: str) -> int:
        """Records ``done`` in the mark, then punches them (lock held)."""
        assert self.drained is not None
        if not done:
            return 0
        before = list(self.drained.ranges)
        self.drained.add(done)
        encoded = self.drained.encode()
        if len(encoded) > MAX_MARK_BYTES:
            self.drained.ranges = before
            self.full = True
            logger.warning(
                "stage-out: %s: its drained extents are too scattered to record; the rest"
                " of it drains when it is closed",
                path,
            )
            return 0
        os.setxattr(path, XATTR_DRAINED, encoded)
        for index in done:
            self._last.pop(index, None)
        c = self.drained.chunk
        for start, stop in _runs(sorted(done)):
            _punch(backing, start * c, (stop - start) * c)
        return len(done) * c

    def fill(
        self, backing: int, pace: Callable[[int], None], stopping: threading.Event | None
    ) -> None:
        """Makes the part the whole file: every chunk not drained copied from the buffer, its
        holes punched in the part (a chunk copied by a pass a crash or a write left out of the
        mark may be there). For the final copy, with no write in flight."""
        with self.lock:
            assert self.drained is not None and self.part_fd is not None
            c, ranges = self.drained.chunk, list(self.drained.ranges)
        size = os.fstat(backing).st_size
        pos = 0
        for a, b in [*ranges, (size // c + 1, size // c + 1)]:
            if pos < min(a * c, size):
                copy_data(backing, self.part_fd, pos, min(a * c, size), pace, stopping, holes=True)
            pos = b * c
        os.ftruncate(self.part_fd, size)

    # ------------------------------------------------------------------ reads

    def read(self, backing: int, buf: memoryview, offset: int) -> int:
        """Reads [offset, offset+len(buf)) per chunk from the buffer or the part."""
        with self.lock:
            drained = self.drained
            if drained is None or not drained.ranges or self.part_fd is None:
                return os.preadv(backing, [buf], offset)
            size = os.fstat(backing).st_size
            end = min(offset + len(buf), size)
            c = drained.chunk
            pos = offset
            while pos < end:
                stop = min(end, (pos // c + 1) * c)
                view = buf[pos - offset : stop - offset]
                source = self.part_fd if drained.contains(pos // c) else backing
                got = os.preadv(source, [view], pos)
                if got < len(view):  # a short part (holes at its end): zeros
                    view[got:] = bytes(len(view) - got)
                pos = stop
            return max(0, end - offset)

    def seek(self, backing: int, offset: int, whence: int) -> int:
        """SEEK_DATA / SEEK_HOLE with drained chunks counted as data."""
        with self.lock:
            drained = self.drained
            if drained is None or not drained.ranges:
                return os.lseek(backing, offset, whence)
            size = os.fstat(backing).st_size
            if offset >= size:
                raise OSError(errno.ENXIO, os.strerror(errno.ENXIO))
            c = drained.chunk
            if whence == os.SEEK_DATA:
                if drained.contains(offset // c):
                    return offset
                try:
                    found = os.lseek(backing, offset, os.SEEK_DATA)
                except OSError as err:
                    if err.errno != errno.ENXIO:
                        raise
                    found = size
                starts = [a * c for a, _ in drained.ranges if offset <= a * c < found]
                target = min([found, *starts])
                if target >= size:
                    raise OSError(errno.ENXIO, os.strerror(errno.ENXIO))
                return target
            pos = offset
            while pos < size:
                if drained.contains(pos // c):
                    pos = next(b for a, b in drained.ranges if a <= pos // c < b) * c
                    continue
                hole = os.lseek(backing, pos, os.SEEK_HOLE)
                if hole < size and drained.contains(hole // c) and hole % c == 0:
                    pos = hole
                    continue
                return min(hole, size)
            return size


def drain_pass(
    extents: OpenExtents,
    backing: int,
    path: str,
    pace: Callable[[int], None],
    stopping: threading.Event,
    clock: Callable[[], float] = time.monotonic,
    freeze: Callable[[], contextlib.AbstractContextManager[bool]] | None = None,
) -> int:
    """One pass over an open file (its part made and its mark written already): copies its
    due chunks to the part (``pace(n)`` before each), fsyncs the part, then `commit`s them.
    ``freeze``: the shim does not tell its writes but can hold them out (yields True once no
    write is in flight, False when it could not): the chunks are then chosen without their
    history and checked byte for byte under the freeze (`commit_verified`). Returns the
    bytes punched."""
    assert extents.part_fd is not None
    size = os.fstat(backing).st_size
    if freeze is None:
        chosen = extents.candidates(size, clock(), PASS_BYTES)
    else:
        chosen = extents.candidates_untracked(size, PASS_BYTES)
    copied: dict[int, int] = {}
    c = extents.chunk
    for index, gen in chosen.items():
        if stopping.is_set():
            return 0
        copy_data(backing, extents.part_fd, index * c, (index + 1) * c, pace)
        copied[index] = gen
    if not copied:
        return 0
    os.fsync(extents.part_fd)
    if freeze is None:
        return extents.commit(copied, backing, path)
    with freeze() as frozen:
        return extents.commit_verified(copied, backing, path) if frozen else 0


def copy_data(
    src: int,
    dst: int,
    start: int,
    end: int,
    pace: Callable[[int], None],
    stopping: threading.Event | None = None,
    *,
    holes: bool = False,
) -> int:
    """Copies the data of [start, end) of ``src`` to the same offsets of ``dst``, holes left
    out (``pace(n)`` before each piece; given up once ``stopping`` is set); the bytes copied.
    ``holes``: ``dst`` may hold older bytes there, so the holes of ``src`` are punched in it."""
    copied = 0
    pos = start
    while pos < end and not (stopping is not None and stopping.is_set()):
        try:
            data_at = min(os.lseek(src, pos, os.SEEK_DATA), end)
        except OSError as err:
            if err.errno != errno.ENXIO:
                raise
            data_at = end
        if holes and data_at > pos:
            _clear(dst, pos, data_at - pos)
        if data_at >= end:
            break
        hole_at = min(os.lseek(src, data_at, os.SEEK_HOLE), end)
        while data_at < hole_at:
            if stopping is not None and stopping.is_set():
                return copied
            n = min(hole_at - data_at, PIECE)
            pace(n)
            data = os.pread(src, n, data_at)
            if not data:
                break
            _write_all(dst, data, data_at)
            data_at += len(data)
            copied += len(data)
        pos = hole_at
    return copied


def _clear(fd: int, offset: int, length: int) -> None:
    """Zeros [offset, offset+length) of ``fd``: a hole, or zeros written where the file system
    cannot punch one."""
    try:
        fallocate(fd, _PUNCH, offset, length)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        end = min(offset + length, os.fstat(fd).st_size)
        while offset < end:
            n = min(end - offset, PIECE)
            _write_all(fd, bytes(n), offset)
            offset += n


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for index in indices:
        if runs and runs[-1][1] == index:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return runs


def _punch(fd: int, offset: int, length: int) -> None:
    fallocate(fd, _PUNCH, offset, length)


__all__ = [
    "CHUNK_BYTES",
    "OPEN_MARK",
    "PIECE",
    "XATTR_DRAINED",
    "Drained",
    "OpenExtents",
    "copy_data",
    "drain_pass",
    "part_name",
    "read_drained",
]
