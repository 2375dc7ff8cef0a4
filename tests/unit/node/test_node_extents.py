"""Files drained while open (`stageout_extents`, `stageout_open`), on real files (no FUSE): the
mark, a pass (copy, fsync, record, punch), writes during a pass, reads and SEEK_DATA/HOLE per
chunk, rewrites and truncates of drained chunks, the final copy, and a restart after a crash
at each step."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import wait_until

from burstctl.client.job import JobInfo
from burstctl.node import stageout_extents
from burstctl.node.stageout import StageOut
from burstctl.node.stageout_extents import (
    OPEN_MARK,
    XATTR_DRAINED,
    Drained,
    OpenExtents,
    drain_pass,
    read_drained,
)
from burstctl.node.stageout_marks import XATTR_EVICTED
from burstctl.node.stageout_open import OpenDrain

C = 4096  # a small chunk, so that files stay small
JOB = JobInfo("j1", "alice", "users")


def block(n: int) -> bytes:
    return bytes([n % 251 + 1]) * C


def test_the_mark_keeps_disjoint_sorted_ranges_and_round_trips() -> None:
    mark = Drained("d/.f.burstctl-open-ab", 4096)
    mark.add([3, 1, 2, 7])
    assert mark.ranges == [(1, 4), (7, 8)]
    assert [mark.contains(i) for i in range(9)] == [False, True, True, True] + [False] * 3 + [
        True,
        False,
    ]
    mark.remove(2, 3)
    assert mark.ranges == [(1, 2), (3, 4), (7, 8)]
    assert mark.within(0, 8) == [1, 3, 7] and mark.count() == 3
    assert Drained.decode(mark.encode()) == mark
    for bad in (b'{"part": 1, "chunk": 1, "ranges": []}', b'{"part": "p", "chunk": 1}', b"[]"):
        with pytest.raises((ValueError, KeyError, TypeError)):
            Drained.decode(bad)
    with pytest.raises(ValueError):
        Drained.decode(b'{"part": "p", "chunk": 8, "ranges": [[3, 2]]}')


@pytest.fixture
def open_file(tmp_path: Path) -> tuple[int, int, OpenExtents, bytes]:
    """A backing file of 5.5 chunks written through `begin_write`, its part, its extents."""
    path, part = tmp_path / "f", tmp_path / "part"
    data = b"".join(block(n) for n in range(5)) + b"z" * (C // 2)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    pfd = os.open(part, os.O_RDWR | os.O_CREAT, 0o600)
    extents = OpenExtents(Drained("part", C), pfd)
    os.setxattr(fd, XATTR_DRAINED, extents.drained.encode())  # type: ignore[union-attr]
    extents.begin_write(0, len(data), now=0.0)
    os.pwrite(fd, data, 0)
    extents.end_write(0, len(data))
    yield fd, pfd, extents, data
    os.close(fd)
    os.close(pfd)


def read_all(extents: OpenExtents, fd: int, size: int) -> bytes:
    buf = bytearray(size + 100)
    got = extents.read(fd, memoryview(buf), 0)
    return bytes(buf[:got])


def test_a_pass_drains_complete_quiet_chunks_and_reads_follow_them(open_file) -> None:
    fd, pfd, extents, data = open_file
    blocks_before = os.fstat(fd).st_blocks
    freed = drain_pass(extents, fd, f"/proc/self/fd/{fd}", lambda n: None, threading.Event(),
                       clock=lambda: 10.0)  # fmt: skip
    assert freed == 5 * C  # the half chunk at the end stays: it may still grow
    assert os.fstat(fd).st_blocks < blocks_before
    assert os.pread(fd, C, 0) == bytes(C)  # punched on the buffer...
    assert os.pread(pfd, C, 0) == block(0)  # ...and in the part
    assert read_drained(f"/proc/self/fd/{fd}").ranges == [(0, 5)]  # type: ignore[union-attr]
    assert read_all(extents, fd, len(data)) == data
    odd = bytearray(C)
    assert extents.read(fd, memoryview(odd), 4 * C + 100) == C  # across the last boundary
    assert bytes(odd) == data[4 * C + 100 : 5 * C + 100]
    assert extents.seek(fd, 0, os.SEEK_DATA) == 0
    assert extents.seek(fd, 0, os.SEEK_HOLE) == len(data)  # drained chunks count as data
    assert extents.drained_bytes() == 5 * C and not extents.waiting()


def test_a_chunk_not_quiet_or_written_during_its_copy_stays_on_the_buffer(open_file) -> None:
    fd, _, extents, data = open_file
    extents.begin_write(2 * C, 10, now=9.95)  # chunk 2: in flight, and not quiet
    seen: list[int] = []

    def pace(n: int) -> None:  # chunk 1 rewritten while the pass copies
        seen.append(n)
        if len(seen) == 1:
            extents.begin_write(C + 5, 1, now=0.0)
            extents.end_write(C + 5, 1)

    drain_pass(extents, fd, f"/proc/self/fd/{fd}", pace, threading.Event(), clock=lambda: 10.0)
    assert extents.drained.ranges == [(0, 1), (3, 5)]  # type: ignore[union-attr]
    assert os.pread(fd, C, C) == block(1) and os.pread(fd, C, 2 * C) == block(2)
    extents.end_write(2 * C, 10)
    assert extents.waiting()
    drain_pass(extents, fd, f"/proc/self/fd/{fd}", lambda n: None, threading.Event(),
               clock=lambda: 20.0)  # fmt: skip
    assert extents.drained.ranges == [(0, 5)]  # type: ignore[union-attr]
    assert read_all(extents, fd, len(data)) == data


def test_a_rewrite_brings_its_chunk_back_first_and_a_truncate_cuts_the_part(open_file) -> None:
    fd, pfd, extents, data = open_file
    drain_pass(extents, fd, f"/proc/self/fd/{fd}", lambda n: None, threading.Event(),
               clock=lambda: 10.0)  # fmt: skip
    need = extents.begin_write(C + 10, 5, now=11.0)
    assert need == [1]
    assert extents.restore(need, fd, f"/proc/self/fd/{fd}") == C
    os.pwrite(fd, b"HELLO", C + 10)
    extents.end_write(C + 10, 5)
    want = data[: C + 10] + b"HELLO" + data[C + 15 :]
    assert os.pread(fd, C, C) == want[C : 2 * C]  # whole on the buffer again
    assert read_all(extents, fd, len(want)) == want
    assert read_drained(f"/proc/self/fd/{fd}").ranges == [(0, 1), (2, 5)]  # type: ignore[union-attr]
    # a truncate into chunk 3 (brought back by the caller first), the rest past it cut
    extents.restore([3], fd, f"/proc/self/fd/{fd}")
    extents.cut(3 * C + 7, f"/proc/self/fd/{fd}")
    os.ftruncate(fd, 3 * C + 7)
    assert extents.drained.ranges == [(0, 1), (2, 3)]  # type: ignore[union-attr]
    assert os.fstat(pfd).st_size <= 3 * C + 7
    os.ftruncate(fd, 6 * C)  # grown again: zeros past the cut, not the old bytes
    assert read_all(extents, fd, 6 * C) == want[: 3 * C + 7] + bytes(6 * C - 3 * C - 7)


def test_scattered_drained_chunks_stop_draining_rather_than_overflow_the_mark(
    open_file, monkeypatch: pytest.MonkeyPatch
) -> None:
    fd, _, extents, data = open_file
    monkeypatch.setattr(stageout_extents, "MAX_MARK_BYTES", 40)
    freed = drain_pass(extents, fd, f"/proc/self/fd/{fd}", lambda n: None, threading.Event(),
                       clock=lambda: 10.0)  # fmt: skip
    assert freed == 0 and extents.full and not extents.has_drained()
    assert os.pread(fd, C, 0) == block(0)  # nothing punched
    assert read_all(extents, fd, len(data)) == data


def test_the_final_fill_makes_the_part_the_whole_file_even_over_stale_bytes(open_file) -> None:
    """A pass copied chunk 3 but a write kept it out of the mark, then the application
    punched it: the part's stale copy must not survive the final copy."""
    fd, pfd, extents, data = open_file
    drain_pass(extents, fd, f"/proc/self/fd/{fd}", lambda n: None, threading.Event(),
               clock=lambda: 10.0)  # fmt: skip
    extents.restore([3], fd, f"/proc/self/fd/{fd}")  # back on the buffer; the part keeps it
    stageout_extents.fallocate(fd, 0x03, 3 * C, C)  # the application punches it
    extents.fill(fd, lambda n: None, None)
    want = data[: 3 * C] + bytes(C) + data[4 * C :]
    assert os.pread(pfd, len(data) + 10, 0) == want


def test_under_a_freeze_only_chunks_still_as_copied_are_punched(open_file) -> None:
    """A shim that does not tell its writes: chunks are chosen without their history, and
    a chunk the writer changed after its copy is kept, byte for byte."""
    fd, _, extents, data = open_file
    fresh = OpenExtents(extents.drained, extents.part_fd)  # no write told
    frozen: list[bool] = []

    @contextlib.contextmanager
    def freeze() -> Iterator[bool]:
        os.pwrite(fd, b"late", 2 * C)  # a write that landed after the copy, before the hold
        frozen.append(True)
        yield True

    freed = drain_pass(fresh, fd, f"/proc/self/fd/{fd}", lambda n: None, threading.Event(),
                       freeze=freeze)  # fmt: skip
    assert frozen and freed == 3 * C  # chunks 0, 1, 3; not 2 (changed), not 4 (the last)
    assert fresh.drained.ranges == [(0, 2), (3, 4)]  # type: ignore[union-attr]
    want = data[: 2 * C] + b"late" + data[2 * C + 4 :]
    assert read_all(fresh, fd, len(want)) == want

    @contextlib.contextmanager
    def refused() -> Iterator[bool]:
        yield False

    assert drain_pass(fresh, fd, f"/proc/self/fd/{fd}", lambda n: None, threading.Event(),
                      freeze=refused) == 0  # fmt: skip
    assert fresh.drained.ranges == [(0, 2), (3, 4)]  # type: ignore[union-attr]


# ---------------------------------------------------------------------- through a StageOut


@pytest.fixture
def stage_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, int]:
    monkeypatch.setattr(stageout_extents, "CHUNK_BYTES", C)
    monkeypatch.setattr(stageout_extents, "QUIET", 0.0)
    backing, pfs = tmp_path / "backing", tmp_path / "pfs"
    backing.mkdir()
    pfs.mkdir()
    root = os.open(backing, os.O_RDONLY | os.O_DIRECTORY)
    yield backing, pfs, root
    os.close(root)


def start(backing: Path, pfs: Path, root: int) -> StageOut:
    stage = StageOut(root, backing, pfs, evict=True, report_interval=0.05)
    stage.start()
    return stage


def parts(pfs: Path) -> list[str]:
    return [n for _, _, names in os.walk(pfs) for n in names if OPEN_MARK in n]


def write_open(stage: StageOut, fd: int, key: tuple[int, int], data: bytes, at: int) -> None:
    assert stage.open is not None
    with stage.open.writing(key, fd, at, len(data), lambda n: None):
        os.pwrite(fd, data, at)
    stage.modified(key, fd, JOB)


def test_an_open_file_drains_as_it_is_written_and_its_final_copy_completes_the_part(
    stage_dirs,
) -> None:
    backing, pfs, root = stage_dirs
    stage = start(backing, pfs, root)
    try:
        path = backing / "d" / "ckpt"
        path.parent.mkdir()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
        key = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
        stage.opened(key)
        data = b"".join(block(n) for n in range(40)) + b"tail"
        for n in range(0, len(data), C):
            write_open(stage, fd, key, data[n : n + C], n)
        wait_until(lambda: stage.open.drained_bytes(key) >= 30 * C, 10, message="a drain pass")
        assert os.fstat(fd).st_blocks * 512 < len(data) // 2  # punched while open
        assert parts(pfs) and not (pfs / "d" / "ckpt").exists()  # no final name yet
        os.close(fd)
        stage.released(key, str(path))
        wait_until(lambda: (pfs / "d" / "ckpt").exists(), 10, message="the final copy")
        wait_until(lambda: stage.evicted(key) is not None, 10, message="the eviction")
        assert (pfs / "d" / "ckpt").read_bytes() == data
        assert not parts(pfs)
        assert os.stat(path).st_size == 0 and XATTR_DRAINED not in os.listxattr(path)
        assert os.getxattr(path, XATTR_EVICTED)
    finally:
        stage.stop()


@pytest.mark.parametrize("step", ["drained", "renamed"])
def test_a_restart_resumes_an_interrupted_drain_without_losing_a_byte(stage_dirs, step) -> None:
    """A crash with chunks drained (the part named by the mark), or after the final copy was
    renamed but before the marks changed: the next start finishes the file."""
    backing, pfs, root = stage_dirs
    stage = start(backing, pfs, root)
    path = backing / "ckpt"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
    key = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
    stage.opened(key)
    data = b"".join(block(n) for n in range(20)) + b"end"
    for n in range(0, len(data), C):
        write_open(stage, fd, key, data[n : n + C], n)
    wait_until(lambda: stage.open.drained_bytes(key) >= 10 * C, 10, message="a drain pass")
    stage.stop()  # the crash: nothing more happens, the mark stays as it is
    os.close(fd)
    mark = read_drained(str(path))
    assert mark is not None and (pfs / mark.part).exists()
    if step == "renamed":  # the final copy was complete and renamed, then the crash
        whole = bytearray((pfs / mark.part).read_bytes().ljust(len(data), b"\0"))
        for n in range(len(data)):
            if not mark.contains(n // C):
                whole[n] = data[n]
        (pfs / mark.part).write_bytes(bytes(whole))
        os.rename(pfs / mark.part, pfs / "ckpt")
    stage = start(backing, pfs, root)
    try:
        wait_until(lambda: stage.evicted(key) is not None, 10, message="the file finished")
        assert (pfs / "ckpt").read_bytes() == data
        assert not parts(pfs)
    finally:
        stage.stop()


def test_a_shim_that_holds_its_writers_out_drains_its_open_files_and_readers_stop_it(
    stage_dirs,
) -> None:
    """The preload agent's way: writes not told, a freeze instead; a reader's open brings
    the drained chunks back and keeps the file whole while it reads."""
    backing, pfs, root = stage_dirs
    holds: list[object] = []

    @contextlib.contextmanager
    def freeze(job: JobInfo | None) -> Iterator[bool]:
        holds.append(job)
        yield True

    stage = StageOut(root, backing, pfs, evict=True, report_interval=0.05, freeze=freeze)
    stage.start()
    try:
        path = backing / "ckpt"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
        key = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
        stage.opened(key)
        data = b"".join(block(n) for n in range(30))
        os.pwrite(fd, data, 0)  # written by the application itself: nothing told
        stage.modified(key, fd, JOB)
        wait_until(lambda: stage.open.drained_bytes(key) >= 20 * C, 10, message="a pass")
        assert holds and holds[0] == JOB
        assert os.fstat(fd).st_blocks * 512 < len(data)
        with stage.holding(key):
            stage.open.read_opened(key, fd, lambda n: None)  # a reader opens it
        assert os.pread(fd, len(data), 0) == data  # whole on the buffer for the reader
        assert stage.open.drained_bytes(key) == 0
        drained_before = len(holds)
        os.pwrite(fd, block(99), len(data))  # more written while the reader reads
        wait_until(lambda: stage.pending_copies() == 1, 10, message="the file polled")
        assert stage.open.drained_bytes(key) == 0 and len(holds) == drained_before
        stage.open.read_closed(key)
        os.close(fd)
        stage.released(key, str(path))
        wait_until(lambda: stage.evicted(key) is not None, 10, message="the final copy")
        assert (pfs / "ckpt").read_bytes() == data + block(99)
        assert not parts(pfs)
    finally:
        stage.stop()


def test_what_is_kept_of_a_files_writes_goes_at_its_last_writers_close(stage_dirs) -> None:
    """One OpenExtents per file written would grow without end: a file closed with no part
    keeps none; one with a part keeps it until its final copy."""
    backing, pfs, root = stage_dirs
    stage = start(backing, pfs, root)
    try:
        path = backing / "small"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o640)
        key = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
        stage.opened(key)
        write_open(stage, fd, key, b"x" * 100, 0)
        assert stage.open.get(key) is not None
        os.close(fd)
        stage.released(key, str(path))
        assert stage.open.get(key) is None
        wait_until(lambda: stage.evicted(key) is not None, 10, message="the copy")
    finally:
        stage.stop()


def test_a_file_closed_during_its_first_pass_keeps_what_the_pass_works_on(stage_dirs) -> None:
    """The last close may come while a pass makes the file's part: dropping its chunks' state
    then would leave the part and the mark unknown to the final copy (zeros on the PFS)."""
    _, pfs, _ = stage_dirs
    drain = OpenDrain(pfs, threading.Event())
    key = (1, 2)
    extents = drain._for(key)
    extents.passing = True
    drain.closed(key)
    assert drain.get(key) is extents
    extents.passing = False
    drain.closed(key)
    assert drain.get(key) is None
