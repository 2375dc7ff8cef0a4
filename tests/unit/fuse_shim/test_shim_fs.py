"""The passthrough's low-level operations called directly on a temporary directory (no kernel).

Requests are fake ``req`` ints: only the injected ``caller`` sees them. Nodes are the ids
`PassthroughFS` hands out (`ROOT_ID` is the backing directory).
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from burstctl.client.job import JobInfo
from burstctl.common import syscalls
from burstctl.fuse_shim import capabilities
from burstctl.fuse_shim._fuse import (
    CAP_ATOMIC_O_TRUNC,
    CAP_AUTO_INVAL_DATA,
    CAP_BIG_WRITES,
    CAP_CACHE_SYMLINKS,
    CAP_HANDLE_KILLPRIV,
    NOW,
    ROOT_ID,
    DirectIoMmap,
    DirEntry,
    Entry,
    KernelNotifier,
    SetAttr,
)
from burstctl.fuse_shim.fs import PassthroughFS
from burstctl.fuse_shim.inodes import InodeTable, handle_budget
from burstctl.fuse_shim.ownership import give_to_caller
from burstctl.fuse_shim.setid import writer_of
from burstctl.node.attribution import Caller
from burstctl.node.stageout import StageOut
from burstctl.node.stageout_marks import XATTR_JOB

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="giving files away needs root")
NOBODY = Caller(pid=0, uid=65534, gid=65534)
REQ = 7  # a request: only the injected caller looks at it


class RecordingPacer:
    """Stands in for `Pacer`: records calls; ``fail`` makes data() raise like a bug would."""

    def __init__(self, fail: bool = False, metadata: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail = fail
        self.metadata_too = metadata  # record metadata operations in ``calls`` too
        self.space: list[int] = []  # bytes of the writes that waited for the buffer's space

    def data(self, caller: Caller, kind: str, nbytes: int, *, space: bool = False) -> None:
        self.calls.append(("data", caller, kind, nbytes))
        if space:
            self.space.append(nbytes)
        if self.fail:
            raise ZeroDivisionError("a pacing bug")

    def metadata(self, caller: Caller) -> None:
        if self.metadata_too:
            self.calls.append(("metadata", caller))

    def opened(self, caller: Caller, fh: int) -> None:
        self.calls.append(("opened", caller))

    def released(self, fh: int) -> None:
        self.calls.append(("released",))

    def job_of(self, caller: Caller) -> JobInfo:
        return JobInfo(f"user:{caller.uid}", str(caller.uid), str(caller.gid))


Backing = tuple[Path, int]


@pytest.fixture
def backing(tmp_path: Path) -> Iterator[Backing]:
    root = tmp_path / "backing"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    yield root, fd
    os.close(fd)


@pytest.fixture
def made() -> Iterator[list[PassthroughFS]]:
    """File systems a test made: the handles they still hold are closed afterwards."""
    systems: list[PassthroughFS] = []
    yield systems
    for fs in systems:
        for node, inode in list(fs.inodes._nodes.items()):
            if node != ROOT_ID:
                os.close(inode.fd)
        for fh in list(fs._dirs._open):
            os.close(fh)


@pytest.fixture
def make_fs(made: list[PassthroughFS]) -> Callable[..., PassthroughFS]:
    def make(
        fd: int,
        pacer: Any = None,
        caller: Caller | Callable[[int], Caller] = NOBODY,
        handles: int | None = None,
        inodes: InodeTable | None = None,
        **options: Any,
    ) -> PassthroughFS:
        who = caller if callable(caller) else (lambda req: caller)
        fs = PassthroughFS(inodes or InodeTable(fd, handles), pacer, caller=who, **options)
        made.append(fs)
        return fs

    return make


def open_fds(root: Path) -> int:
    """How many descriptors of this process reach into ``root`` (other tests' leftovers and
    the garbage collector do not move this count)."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
        count += target == str(root) or target.startswith(f"{root}/")
    return count


def raises_errno(code: int, fn: Callable[..., Any], *args: Any) -> None:
    with pytest.raises(OSError) as info:
        fn(*args)
    assert info.value.errno == code, info.value


def read_all(
    fs: PassthroughFS, node: int, fh: int, size: int = 1 << 16, offset: int = 0, req: int = REQ
) -> bytes:
    buf = bytearray(size)
    done = fs.read(req, node, memoryview(buf), offset, fh)
    return bytes(buf[:done])


# ---------------------------------------------------------------- the inode table


def test_lookup_and_forget_count_the_kernels_references(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"abc")
    fs = make_fs(fd)
    before = open_fds(root)
    first = fs.lookup(REQ, ROOT_ID, b"f")
    assert first.node != ROOT_ID
    assert (first.attr.st_ino, first.attr.st_size) == (os.stat(root / "f").st_ino, 3)
    second = fs.lookup(REQ, ROOT_ID, b"f")
    assert second.node == first.node
    assert open_fds(root) == before + 1  # one handle per inode, however often it is looked up
    assert fs.inodes.known == 2
    fs.forget(first.node, 1)
    assert fs.inodes.known == 2 and open_fds(root) == before + 1  # one reference left
    assert fs.getattr(REQ, first.node, None).st_ino == first.attr.st_ino
    fs.forget(first.node, 1)
    assert fs.inodes.known == 1 and open_fds(root) == before  # the handle is closed
    raises_errno(errno.ESTALE, fs.getattr, REQ, first.node, None)
    third = fs.lookup(REQ, ROOT_ID, b"f")  # looked up again: a node of its own
    assert third.node not in (first.node, ROOT_ID)
    fs.forget(third.node, 5)  # more than it had (a batch of forgets): gone, not negative
    assert fs.inodes.known == 1 and open_fds(root) == before
    fs.forget(third.node, 1)  # unknown nodes are ignored
    fs.forget(ROOT_ID, 1)  # the root is never forgotten
    assert fs.getattr(REQ, ROOT_ID, None).st_ino == os.stat(root).st_ino


def test_hard_links_are_one_node(backing: Backing, make_fs: Callable[..., PassthroughFS]) -> None:
    root, fd = backing
    (root / "a").write_bytes(b"x")
    os.link(root / "a", root / "b")  # behind the mount
    fs = make_fs(fd)
    a = fs.lookup(REQ, ROOT_ID, b"a")
    b = fs.lookup(REQ, ROOT_ID, b"b")
    assert a.node == b.node
    c = fs.link(REQ, a.node, ROOT_ID, b"c")  # through the mount
    assert c.node == a.node and c.attr.st_nlink == 3
    assert fs.inodes.known == 2
    fs.forget(a.node, 3)  # the kernel's three references
    assert fs.inodes.known == 1
    # link(2) of a symbolic link links the link itself, not its target.
    link = fs.symlink(REQ, b"a", ROOT_ID, b"l")
    hard = fs.link(REQ, link.node, ROOT_ID, b"hl")
    assert hard.node == link.node and stat.S_ISLNK(hard.attr.st_mode)
    assert os.readlink(root / "hl") == "a" and os.lstat(root / "a").st_nlink == 3


def test_a_missing_name_is_enoent_and_leaks_nothing(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"")
    fs = make_fs(fd)
    before = open_fds(root)
    raises_errno(errno.ENOENT, fs.lookup, REQ, ROOT_ID, b"missing")
    f = fs.lookup(REQ, ROOT_ID, b"f")
    raises_errno(errno.ENOTDIR, fs.lookup, REQ, f.node, b"x")
    fs.forget(f.node, 1)
    assert open_fds(root) == before and fs.inodes.known == 1


def test_os_errors_are_raised_with_their_errno(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    fs = make_fs(fd)
    d = fs.mkdir(REQ, ROOT_ID, b"d", 0o755)
    raises_errno(errno.EEXIST, fs.mkdir, REQ, ROOT_ID, b"d", 0o755)
    fs.mkdir(REQ, d.node, b"e", 0o755)
    raises_errno(errno.ENOTEMPTY, fs.rmdir, REQ, ROOT_ID, b"d")
    raises_errno(errno.EISDIR, fs.unlink, REQ, ROOT_ID, b"d")
    raises_errno(errno.ENOENT, fs.unlink, REQ, ROOT_ID, b"missing")
    raises_errno(errno.ESTALE, fs.lookup, REQ, 12345, b"x")  # a node the kernel never got
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_WRONLY)
    fs.release(REQ, entry.node, opened.fh)
    before = open_fds(root)
    raises_errno(errno.EEXIST, fs.create, REQ, ROOT_ID, b"f", 0o644, os.O_WRONLY | os.O_EXCL)
    assert open_fds(root) == before


def test_names_a_path_could_not_reach(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    # Each request is relative to a handle: depth is not limited by PATH_MAX.
    root, fd = backing
    name = b"d" * 250
    fs = make_fs(fd)
    node, depth = ROOT_ID, 0
    while depth * (len(name) + 1) <= os.pathconf(root, "PC_PATH_MAX"):
        node = fs.mkdir(REQ, node, name, 0o755).node
        depth += 1
    entry, opened = fs.create(REQ, node, b"deep", 0o644, os.O_WRONLY)
    assert fs.write(REQ, entry.node, memoryview(b"bottom"), 0, opened.fh) == 6
    fs.release(REQ, entry.node, opened.fh)
    assert fs.getattr(REQ, entry.node, None).st_size == 6


@pytest.mark.parametrize(
    ("soft_limit", "budget"),
    [(1 << 20, (1 << 20) - 4096), (20000, 20000 - 4096), (1024, 512), (100, 64)],
)
def test_the_handle_budget_leaves_room_for_open_files(soft_limit: int, budget: int) -> None:
    assert handle_budget(soft_limit) == budget


def test_past_the_budget_the_kernel_is_asked_to_drop_the_oldest_names(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    names = [b"f%02d" % i for i in range(33)]
    for name in names:
        (root / os.fsdecode(name)).write_bytes(b"")
    asked: list[tuple[int, bytes]] = []
    in_use = {b"f00"}  # open, say: the kernel keeps it whatever it is asked
    answers = {b"f15": -errno.EIO, b"f16": -errno.ENOENT}
    nodes: dict[bytes, int] = {}
    fs: PassthroughFS

    def notify(session: int, parent: int, name: bytes, length: int) -> int:
        # As the kernel does: drops its entry, then forgets the inode unless it is in use.
        assert session == 7 and length == len(name)
        asked.append((parent, name))
        if name not in in_use:
            fs.forget(nodes[name], 1)
        return answers.get(name, 0)

    notifier = KernelNotifier(notify)
    fs = make_fs(fd, inodes=InodeTable(fd, 20, notifier))
    assert fs.inodes.budget == 20
    nodes.update({name: fs.lookup(REQ, ROOT_ID, name).node for name in names[:31]})
    try:
        # No FUSE session yet: the valve asks, the notifier says -ENOTCONN, nothing is dropped.
        wait_until(lambda: fs.inodes._valve is not None, message="the valve started")
        assert fs.inodes.known == 32 and asked == []
        notifier.open(7)
        fs.lookup(REQ, ROOT_ID, names[30])  # again: still over the budget
        wait_until(lambda: len(asked) >= 14, message="the oldest names dropped")
        # Down to 90% of the budget (18 nodes, the root included), oldest first.
        assert asked == [(ROOT_ID, name) for name in names[:14]]
        wait_until(lambda: fs.inodes.invalidated == 14, message="every drop counted")
        assert fs.inodes.known == 32 - 13  # f00 is still in use
        assert fs.lookup(REQ, ROOT_ID, b"f00").node == nodes[b"f00"]  # same node
        nodes[b"f31"] = fs.lookup(REQ, ROOT_ID, b"f31").node
        nodes[b"f32"] = fs.lookup(REQ, ROOT_ID, b"f32").node  # 21 nodes: over again
        wait_until(lambda: len(asked) >= 17, message="the next oldest names dropped")
        # The name in use went to the back: the next round starts after it.
        assert asked[14:] == [(ROOT_ID, name) for name in (b"f14", b"f15", b"f16")]
        wait_until(lambda: fs.inodes.invalidated == 16, message="every drop counted")
        assert fs.inodes.invalidated == 16  # -EIO: not dropped; -ENOENT: the kernel had none
    finally:
        notifier.close()
        fs.inodes.stop_valve(timeout=10)
        assert fs.inodes._valve is None or not fs.inodes._valve.is_alive()


def test_a_closed_notifier_waits_for_the_invalidation_in_flight_and_starts_none() -> None:
    # `serve` closes it before libfuse frees the session: an invalidation that were still
    # running then, or started after, would reach freed memory (the mount crashed with SIGSEGV
    # at unmount when its handle valve was mid-pass).
    entered, release = threading.Event(), threading.Event()
    calls: list[bytes] = []

    def notify(session: int, parent: int, name: bytes, length: int) -> int:
        calls.append(name)
        entered.set()
        release.wait(10)
        return 0

    notifier = KernelNotifier(notify)
    assert notifier.invalidate_entry(ROOT_ID, b"early") == -errno.ENOTCONN  # not open yet
    notifier.open(1)
    answers: list[int] = []
    worker = threading.Thread(target=lambda: answers.append(notifier.invalidate_entry(1, b"a")))
    worker.start()
    assert entered.wait(10)
    closer = threading.Thread(target=notifier.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "close returned while an invalidation was in flight"
    release.set()
    closer.join(10)
    worker.join(10)
    assert not closer.is_alive() and answers == [0]
    assert notifier.invalidate_entry(1, b"late") == -errno.ENOTCONN
    assert calls == [b"a"]


class KernelRecorder:
    """Stands in for `KernelNotifier` under an `InodeTable`: records the nodes whose
    attributes it is asked to drop; ``answer`` is what it says."""

    def __init__(self, answer: int = 0) -> None:
        self.answer = answer
        self.inodes: list[tuple[int, int, int]] = []
        self.on_inode: Callable[[int], None] = lambda node: None

    def invalidate_entry(self, parent: int, name: bytes) -> int:
        return -errno.ENOENT

    def invalidate_inode(self, node: int, offset: int = -1, length: int = 0) -> int:
        self.on_inode(node)
        self.inodes.append((node, offset, length))
        return self.answer


def test_the_notifier_drops_an_inodes_attributes_or_pages_while_a_session_is_open() -> None:
    calls: list[tuple[int, int, int, int]] = []

    def notify_inode(session: int, node: int, offset: int, length: int) -> int:
        calls.append((session, node, offset, length))
        return -errno.ENOENT if node == 99 else 0

    notifier = KernelNotifier(notify_inode=notify_inode)
    assert notifier.invalidate_inode(5) == -errno.ENOTCONN  # not open yet
    notifier.open(7)
    assert notifier.invalidate_inode(5) == 0  # attributes only
    assert notifier.invalidate_inode(5, 4096, 8192) == 0  # and the pages of a range
    assert notifier.invalidate_inode(99) == -errno.ENOENT  # a node the kernel forgot
    notifier.close()
    assert notifier.invalidate_inode(5) == -errno.ENOTCONN
    assert calls == [(7, 5, -1, 0), (7, 5, 4096, 8192), (7, 99, -1, 0)]


def test_a_notification_waiting_in_the_kernel_holds_up_no_other() -> None:
    # The kernel takes a directory's lock to drop a name; a write's handler telling it of
    # cleared set-id bits must not queue behind that.
    entered, release = threading.Event(), threading.Event()

    def notify_entry(session: int, parent: int, name: bytes, length: int) -> int:
        entered.set()
        release.wait(10)
        return 0

    notifier = KernelNotifier(notify_entry, lambda session, node, offset, length: 0)
    notifier.open(1)
    worker = threading.Thread(target=notifier.invalidate_entry, args=(ROOT_ID, b"a"))
    worker.start()
    try:
        assert entered.wait(10)
        assert notifier.invalidate_inode(5) == 0  # returns while the entry still waits
        closer = threading.Thread(target=notifier.close)
        closer.start()
        closer.join(0.2)
        assert closer.is_alive(), "close returned while an invalidation was in flight"
    finally:
        release.set()
        worker.join(10)
    closer.join(10)
    assert not closer.is_alive()


def test_a_change_the_daemon_makes_on_its_own_reaches_the_kernel_by_node(
    backing: Backing, make_fs: Callable[..., PassthroughFS], caplog: pytest.LogCaptureFixture
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"x")
    kernel = KernelRecorder()
    fs = make_fs(fd, inodes=InodeTable(fd, kernel=kernel))
    node = fs.lookup(REQ, ROOT_ID, b"f").node
    st = os.stat(root / "f")
    fs.inodes.changed((st.st_dev, st.st_ino))
    assert kernel.inodes == [(node, -1, 0)]  # attributes only
    fs.inodes.changed((st.st_dev, st.st_ino + 1))  # a node the kernel does not know
    assert kernel.inodes == [(node, -1, 0)]
    for answer in (-errno.ENOTCONN, -errno.ENOENT):  # not mounted; forgotten: quietly
        kernel.answer = answer
        fs.inodes.refresh(node)
    assert not caplog.records
    kernel.answer = -errno.EIO
    fs.inodes.refresh(node)  # never raises into the request or the drain
    assert "refused to drop the attributes" in caplog.text


# ---------------------------------------------------------------- files


def test_create_open_read_write_release(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    pacer = RecordingPacer()
    fs = make_fs(fd, pacer)
    before = open_fds(root)
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o640, os.O_RDWR | os.O_CREAT)
    assert stat.S_IMODE(entry.attr.st_mode) == 0o640 and entry.attr.st_size == 0
    assert entry.node == fs.lookup(REQ, ROOT_ID, b"f").node  # create is a lookup too
    os.rename(root / "f", root / "renamed")  # the handle, not the name, is used
    assert fs.write(REQ, entry.node, memoryview(b"hello world"), 0, opened.fh) == 11
    assert read_all(fs, entry.node, opened.fh) == b"hello world"
    buf = bytearray(b"\xff" * 8)
    assert fs.read(REQ, entry.node, memoryview(buf), 6, opened.fh) == 5  # the end of the file
    assert bytes(buf) == b"world\xff\xff\xff"  # nothing past what was read is touched
    assert fs.read(REQ, entry.node, memoryview(buf)[:0], 0, opened.fh) == 0
    fs.flush(REQ, entry.node, opened.fh)
    fs.fsync(REQ, entry.node, False, opened.fh)
    fs.fsync(REQ, entry.node, True, opened.fh)
    fs.release(REQ, entry.node, opened.fh)
    assert open_fds(root) == before + 1  # the node's handle, until the kernel forgets it
    reopened = fs.open(REQ, entry.node, os.O_RDONLY)
    assert read_all(fs, entry.node, reopened.fh, offset=6) == b"world"
    raises_errno(
        errno.EBADF, fs.write, REQ, entry.node, memoryview(b"x"), 0, reopened.fh
    )  # read-only
    fs.release(REQ, entry.node, reopened.fh)
    fs.forget(entry.node, 2)
    assert open_fds(root) == before
    assert (root / "renamed").read_bytes() == b"hello world"
    assert pacer.calls == [
        ("opened", NOBODY),
        ("data", NOBODY, "write", 11),
        ("data", NOBODY, "read", 1 << 16),
        ("data", NOBODY, "read", 8),
        ("data", NOBODY, "read", 0),
        ("released",),
        ("opened", NOBODY),
        ("data", NOBODY, "read", 1 << 16),
        ("data", NOBODY, "write", 1),
        ("released",),
    ]


def test_open_drops_flags_the_kernel_already_handled(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    # O_NOFOLLOW would fail on the handle's /proc link; O_CREAT|O_EXCL on an existing file.
    root, fd = backing
    (root / "f").write_bytes(b"data")
    fs = make_fs(fd)
    f = fs.lookup(REQ, ROOT_ID, b"f")
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CREAT | os.O_EXCL | os.O_DIRECT
    opened = fs.open(REQ, f.node, flags)
    assert os.get_inheritable(opened.fh) is False  # O_CLOEXEC: never leaks to children
    assert read_all(fs, f.node, opened.fh, size=3) == b"dat"  # unaligned: no O_DIRECT
    fs.release(REQ, f.node, opened.fh)
    opened = fs.open(REQ, f.node, os.O_WRONLY | os.O_TRUNC)
    fs.release(REQ, f.node, opened.fh)
    assert (root / "f").read_bytes() == b""


def test_writeback_of_a_mapping_of_an_append_only_open_lands_in_place(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    # The kernel computes the offset of every O_APPEND write itself (under the inode lock),
    # and writes of a shared mapping go to the mapped page's offset, whichever file's handle
    # the kernel sends them with. On a backing handle opened O_APPEND, pwrite(2) would append
    # the page at the end instead (seen on a real mount: 'hello worldJello world').
    root, fd = backing
    fs = make_fs(fd)
    entry, opened = fs.create(REQ, ROOT_ID, b"log", 0o644, os.O_RDWR | os.O_APPEND)
    fs.write(REQ, entry.node, memoryview(b"hello world"), 0, opened.fh)
    fs.write(REQ, entry.node, memoryview(b"J"), 0, opened.fh, True)  # writepage
    fs.release(REQ, entry.node, opened.fh)
    assert (root / "log").read_bytes() == b"Jello world"


def test_a_file_unlinked_while_open_keeps_working(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    fs = make_fs(fd)
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_RDWR)
    fs.unlink(REQ, ROOT_ID, b"f")
    assert not (root / "f").exists()
    assert fs.write(REQ, entry.node, memoryview(b"still here"), 0, opened.fh) == 10
    assert fs.getattr(REQ, entry.node, None).st_nlink == 0
    assert fs.getattr(REQ, entry.node, opened.fh).st_size == 10
    assert read_all(fs, entry.node, opened.fh) == b"still here"
    fs.release(REQ, entry.node, opened.fh)


def test_mknod_symlink_readlink(backing: Backing, make_fs: Callable[..., PassthroughFS]) -> None:
    root, fd = backing
    fs = make_fs(fd)
    pipe = fs.mknod(REQ, ROOT_ID, b"p", stat.S_IFIFO | 0o600, 0)
    assert stat.S_ISFIFO(pipe.attr.st_mode) and stat.S_ISFIFO(os.lstat(root / "p").st_mode)
    link = fs.symlink(REQ, b"../some/where\xff", ROOT_ID, b"l")  # any bytes, kept verbatim
    assert stat.S_ISLNK(link.attr.st_mode)
    assert fs.readlink(REQ, link.node) == b"../some/where\xff"
    assert os.readlink(os.fsencode(root / "l")) == b"../some/where\xff"
    fs.unlink(REQ, ROOT_ID, b"l")
    assert not os.path.lexists(root / "l")


def test_fallocate_statfs_and_holes(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    fs = make_fs(fd)
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_RDWR)
    fs.fallocate(REQ, entry.node, 0, 0, 1 << 20, opened.fh)
    assert os.stat(root / "f").st_size == 1 << 20
    keep_size, punch_hole = 0x01, 0x02  # FALLOC_FL_*: modes posix_fallocate cannot do
    fs.fallocate(REQ, entry.node, keep_size, 0, 2 << 20, opened.fh)
    assert os.stat(root / "f").st_size == 1 << 20
    fs.write(REQ, entry.node, memoryview(b"x" * 8192), 0, opened.fh)
    fs.fallocate(REQ, entry.node, keep_size | punch_hole, 0, 4096, opened.fh)
    assert read_all(fs, entry.node, opened.fh, size=8192) == b"\0" * 4096 + b"x" * 4096
    raises_errno(errno.EOPNOTSUPP, fs.fallocate, REQ, entry.node, punch_hole, 0, 10, opened.fh)
    fs.release(REQ, entry.node, opened.fh)
    assert fs.statfs(REQ, ROOT_ID).f_blocks == os.statvfs(root).f_blocks


def test_lseek_finds_data_and_holes(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    fs = make_fs(fd)
    entry, opened = fs.create(REQ, ROOT_ID, b"sparse", 0o644, os.O_RDWR)
    fs.write(REQ, entry.node, memoryview(b"a" * 4096), 0, opened.fh)
    fs.write(REQ, entry.node, memoryview(b"b" * 4096), 8 << 20, opened.fh)
    # What BACKING itself answers, through a descriptor of its own.
    own = os.open(root / "sparse", os.O_RDONLY)
    try:
        expected = {
            (offset, whence): os.lseek(own, offset, whence)
            for offset in (0, 4096, 1 << 20)
            for whence in (os.SEEK_DATA, os.SEEK_HOLE)
        }
        with pytest.raises(OSError) as beyond:
            os.lseek(own, (8 << 20) + 4096, os.SEEK_DATA)
    finally:
        os.close(own)
    if expected[0, os.SEEK_HOLE] == (8 << 20) + 4096:
        pytest.skip("BACKING does not report holes")
    got = {key: fs.lseek(REQ, entry.node, *key, opened.fh) for key in expected}
    assert got == expected
    assert got[0, os.SEEK_HOLE] < 8 << 20 and got[4096, os.SEEK_DATA] == 8 << 20
    end = (8 << 20) + 4096
    assert beyond.value.errno == errno.ENXIO  # what BACKING says past the last data
    raises_errno(errno.ENXIO, fs.lseek, REQ, entry.node, end, os.SEEK_DATA, opened.fh)
    # The handle's position is not used by reads or writes (they are positional).
    assert read_all(fs, entry.node, opened.fh, size=4) == b"aaaa"
    fs.release(REQ, entry.node, opened.fh)


# ---------------------------------------------------------------- setattr


@pytest.mark.parametrize("how", ["by-node", "by-handle", "unlinked-by-node", "unlinked-by-handle"])
def test_setattr_changes_each_field(
    backing: Backing, make_fs: Callable[..., PassthroughFS], how: str
) -> None:
    root, fd = backing
    fs = make_fs(fd)
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_RDWR)
    fs.write(REQ, entry.node, memoryview(b"0123456789"), 0, opened.fh)
    assert (root / "f").exists()
    if how.startswith("unlinked"):
        fs.unlink(REQ, ROOT_ID, b"f")
    fh = opened.fh if how.endswith("by-handle") else None
    node = entry.node

    st = fs.setattr(REQ, node, SetAttr(mode=stat.S_IFREG | 0o600), fh)
    assert stat.S_IMODE(st.st_mode) == 0o600 and stat.S_ISREG(st.st_mode)
    st = fs.setattr(REQ, node, SetAttr(size=4), fh)
    assert st.st_size == 4
    assert read_all(fs, node, opened.fh) == b"0123"
    st = fs.setattr(REQ, node, SetAttr(size=6), fh)
    assert read_all(fs, node, opened.fh) == b"0123\0\0"
    st = fs.setattr(REQ, node, SetAttr(atime=1_000, mtime=2_000_000_007), fh)
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000, 2_000_000_007)
    st = fs.setattr(REQ, node, SetAttr(mtime=5_000_000_000), fh)  # atime omitted: kept
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000, 5_000_000_000)
    before = time.time_ns()
    st = fs.setattr(REQ, node, SetAttr(atime=NOW), fh)
    assert st.st_atime_ns >= before - 10_000_000 and st.st_mtime_ns == 5_000_000_000
    st = fs.setattr(REQ, node, SetAttr(mtime=NOW), fh)
    assert st.st_mtime_ns >= before - 10_000_000
    if os.geteuid() == 0:
        assert (st.st_uid, st.st_gid) == (65534, 65534)  # the creator's
        st = fs.setattr(REQ, node, SetAttr(uid=0), fh)
        assert (st.st_uid, st.st_gid) == (0, 65534)
        st = fs.setattr(REQ, node, SetAttr(gid=65533), fh)
        assert (st.st_uid, st.st_gid) == (0, 65533)
        st = fs.setattr(REQ, node, SetAttr(uid=1, gid=2), fh)
        assert (st.st_uid, st.st_gid) == (1, 2)
    st = fs.setattr(REQ, node, SetAttr(), fh)  # nothing to change: the attributes
    assert st.st_size == 6 and stat.S_IMODE(st.st_mode) == 0o600
    assert os.fstat(opened.fh) == st
    fs.release(REQ, node, opened.fh)


def test_setattr_of_a_symbolic_links_own_times_and_owner(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    # Through its O_PATH handle: the link itself, never what it points to.
    root, fd = backing
    (root / "target").write_bytes(b"")
    os.utime(root / "target", ns=(1, 1))
    fs = make_fs(fd)
    link = fs.symlink(REQ, b"target", ROOT_ID, b"l")
    st = fs.setattr(REQ, link.node, SetAttr(atime=3_000_000_000, mtime=4_000_000_000), None)
    assert stat.S_ISLNK(st.st_mode) and st.st_mtime_ns == 4_000_000_000
    assert os.lstat(root / "l").st_mtime_ns == 4_000_000_000
    assert os.stat(root / "target").st_mtime_ns == 1
    if os.geteuid() == 0:
        fs.setattr(REQ, link.node, SetAttr(uid=65534, gid=65534), None)
        assert os.lstat(root / "l").st_uid == 65534 and os.stat(root / "target").st_uid == 0


# ---------------------------------------------------------------- rename


def test_rename_replaces(backing: Backing, make_fs: Callable[..., PassthroughFS]) -> None:
    root, fd = backing
    (root / "a").write_bytes(b"A")
    (root / "d").mkdir()
    (root / "d" / "b").write_bytes(b"B")
    fs = make_fs(fd)
    d = fs.lookup(REQ, ROOT_ID, b"d")
    a = fs.lookup(REQ, ROOT_ID, b"a")
    fs.rename(REQ, ROOT_ID, b"a", d.node, b"b", 0)
    assert not (root / "a").exists() and (root / "d" / "b").read_bytes() == b"A"
    assert fs.lookup(REQ, d.node, b"b").node == a.node  # the node moved with its name
    raises_errno(errno.ENOENT, fs.rename, REQ, ROOT_ID, b"a", d.node, b"c", 0)


def test_rename_noreplace(backing: Backing, make_fs: Callable[..., PassthroughFS]) -> None:
    root, fd = backing
    (root / "a").write_bytes(b"A")
    (root / "b").write_bytes(b"B")
    fs = make_fs(fd)
    raises_errno(
        errno.EEXIST, fs.rename, REQ, ROOT_ID, b"a", ROOT_ID, b"b", syscalls.RENAME_NOREPLACE
    )
    assert (root / "a").read_bytes() == b"A" and (root / "b").read_bytes() == b"B"
    fs.rename(REQ, ROOT_ID, b"a", ROOT_ID, b"c", syscalls.RENAME_NOREPLACE)
    assert (root / "c").read_bytes() == b"A" and not (root / "a").exists()


def test_rename_exchange(backing: Backing, make_fs: Callable[..., PassthroughFS]) -> None:
    root, fd = backing
    (root / "a").write_bytes(b"A")
    (root / "d").mkdir()
    (root / "d" / "x").write_bytes(b"X")
    fs = make_fs(fd)
    d = fs.lookup(REQ, ROOT_ID, b"d")
    fs.rename(REQ, ROOT_ID, b"a", d.node, b"x", syscalls.RENAME_EXCHANGE)
    assert (root / "a").read_bytes() == b"X" and (root / "d" / "x").read_bytes() == b"A"
    fs.rename(REQ, ROOT_ID, b"a", ROOT_ID, b"d", syscalls.RENAME_EXCHANGE)  # file <-> dir
    assert (root / "a").is_dir() and (root / "d").read_bytes() == b"X"
    raises_errno(
        errno.ENOENT, fs.rename, REQ, ROOT_ID, b"d", ROOT_ID, b"none", syscalls.RENAME_EXCHANGE
    )
    raises_errno(
        errno.EINVAL,
        fs.rename,
        REQ,
        ROOT_ID,
        b"a",
        ROOT_ID,
        b"d",
        syscalls.RENAME_EXCHANGE | syscalls.RENAME_NOREPLACE,
    )


# ---------------------------------------------------------------- directories


def listed(fs: PassthroughFS, offset: int, fh: int, node: int = ROOT_ID) -> list[DirEntry]:
    """The entries a readdir at ``offset`` goes on with."""
    return fs.readdir(REQ, node, offset, fh).entries[offset:]


def test_readdir_resumes_where_it_stopped(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"")
    (root / "d").mkdir()
    (root / "d" / "inner").write_bytes(b"")
    os.symlink("f", root / "l")
    os.mkfifo(root / "p")
    names = {f"n{i:03}".encode() for i in range(40)}
    for name in names:
        (root / os.fsdecode(name)).write_bytes(b"")
    fs = make_fs(fd)
    before = open_fds(root)
    opened = fs.opendir(REQ, ROOT_ID)
    everything = listed(fs, 0, opened.fh)
    by_name = {e.name: e for e in everything}
    assert set(by_name) == {b".", b"..", b"f", b"d", b"l", b"p"} | names
    assert len(everything) == len(by_name)  # no name twice
    assert [e.name for e in everything[:2]] == [b".", b".."]
    here = os.stat(root).st_ino
    assert (by_name[b"."].ino, by_name[b".."].ino) == (here, here)  # the root is its own parent
    assert by_name[b"f"].ino == os.stat(root / "f").st_ino and by_name[b"f"].ino != 0
    assert by_name[b"f"].mode == stat.S_IFREG
    assert by_name[b"d"].mode == stat.S_IFDIR
    assert by_name[b"l"].mode == stat.S_IFLNK
    assert by_name[b"p"].mode == stat.S_IFIFO
    # A reader that stopped after some entries goes on at the offset of the last it took,
    # even when the directory changed in between; offset 0 starts over (and reads again).
    (root / "late").write_bytes(b"")
    taken = everything[:7]
    rest = listed(fs, taken[-1].next_offset, opened.fh)
    assert taken + rest == everything
    again = [e.name for e in listed(fs, 0, opened.fh)]
    assert b"late" in again and len(again) == len(everything) + 1
    assert listed(fs, len(again), opened.fh) == []  # past the end
    fs.releasedir(REQ, ROOT_ID, opened.fh)
    assert open_fds(root) == before
    raises_errno(errno.EBADF, lambda: listed(fs, 0, opened.fh))


def test_readdir_of_a_subdirectory_names_its_parent(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    (root / "d" / "e").mkdir(parents=True)
    fs = make_fs(fd)
    d = fs.lookup(REQ, ROOT_ID, b"d")
    opened = fs.opendir(REQ, d.node)
    fresh = fs.opendir(REQ, d.node)  # a handle opened after this one's first read
    entries = {e.name: e for e in listed(fs, 0, opened.fh, d.node)}
    assert entries[b"."].ino == os.stat(root / "d").st_ino
    assert entries[b".."].ino == os.stat(root).st_ino
    assert set(entries) == {b".", b"..", b"e"}
    # A handle whose first readdir comes with an offset (a seekdir) still lists first.
    assert [e.name for e in listed(fs, 2, fresh.fh, d.node)] == [b"e"]
    fs.fsyncdir(REQ, d.node, False, opened.fh)
    fs.fsyncdir(REQ, d.node, True, opened.fh)
    fs.releasedir(REQ, d.node, opened.fh)
    fs.releasedir(REQ, d.node, fresh.fh)
    fs.releasedir(REQ, d.node, fresh.fh)  # released twice: nothing to close
    fs.rmdir(REQ, d.node, b"e")
    assert not (root / "d" / "e").exists()


# ---------------------------------------------------------------- pacing


def test_a_write_the_kernel_makes_is_paced_for_the_openers_job(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    opener = Caller(pid=4242, uid=1000, gid=1000)
    other = Caller(pid=4343, uid=2000, gid=2000)
    kernel = Caller(pid=0, uid=0, gid=0)  # writeback of a shared mapping
    callers = {1: opener, 2: kernel, 3: other}
    pacer = RecordingPacer()
    fs = make_fs(fd, pacer, caller=lambda req: callers[req])
    entry, opened = fs.create(1, ROOT_ID, b"f", 0o644, os.O_RDWR)
    fs.write(2, entry.node, memoryview(b"page"), 0, opened.fh)
    fs.write(3, entry.node, memoryview(b"page"), 0, opened.fh, True)  # writepage: the opener's
    fs.write(3, entry.node, memoryview(b"mine"), 0, opened.fh)
    read_all(fs, entry.node, opened.fh, size=4, req=2)  # read-ahead of a mapping
    read_all(fs, entry.node, opened.fh, size=3, req=3)
    fs.release(1, entry.node, opened.fh)
    assert fs._paced._openers == {}  # forgotten with the file
    # A kernel request on a handle nobody is known to have opened: its own caller.
    fs = make_fs(fd, pacer, caller=kernel)
    (root / "g").write_bytes(b"")
    g = fs.lookup(REQ, ROOT_ID, b"g")
    fs.write(REQ, g.node, memoryview(b"w"), 0, os.open(root / "g", os.O_WRONLY | os.O_CLOEXEC))
    assert pacer.calls == [
        ("opened", opener),
        ("data", opener, "write", 4),
        ("data", opener, "write", 4),
        ("data", other, "write", 4),
        ("data", opener, "read", 4),
        ("data", other, "read", 3),
        ("released",),
        ("data", kernel, "write", 1),
    ]


def test_a_pacing_failure_never_fails_the_io(
    backing: Backing, make_fs: Callable[..., PassthroughFS], caplog: pytest.LogCaptureFixture
) -> None:
    _, fd = backing
    fs = make_fs(fd, RecordingPacer(fail=True))
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_RDWR)
    with caplog.at_level(logging.ERROR, "burstctl.fuse_shim.paced"):
        assert fs.write(REQ, entry.node, memoryview(b"x"), 0, opened.fh) == 1
    fs.release(REQ, entry.node, opened.fh)
    assert "serving it unpaced" in caplog.text


def test_metadata_operations_are_paced(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"")
    pacer = RecordingPacer(metadata=True)
    fs = make_fs(fd, pacer)
    f = fs.lookup(REQ, ROOT_ID, b"f")
    fs.getattr(REQ, f.node, None)
    fs.mkdir(REQ, ROOT_ID, b"d", 0o755)
    opened = fs.open(REQ, f.node, os.O_RDONLY)
    read_all(fs, f.node, opened.fh, size=1)
    fs.release(REQ, f.node, opened.fh)
    assert pacer.calls == [
        ("metadata", NOBODY),  # lookup
        ("metadata", NOBODY),  # getattr
        ("metadata", NOBODY),  # mkdir
        ("metadata", NOBODY),  # open
        ("opened", NOBODY),
        ("data", NOBODY, "read", 1),
        ("released",),
    ]


# ---------------------------------------------------------------- set-id bits on writes

# Waits on stdin after saying it runs (so its credentials are final, after setpriv's exec).
_WAIT = "import sys; print('ready', flush=True); sys.stdin.read()"


@pytest.fixture
def unprivileged_pid() -> Iterator[int]:
    """The pid of a child running as nobody (no CAP_FSETID), stopped by pid afterwards."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv")
    proc = subprocess.Popen(
        [
            *("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"),
            *("--", sys.executable, "-I", "-c", _WAIT),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def setid_file(root: Path, fs: PassthroughFS, mode: int) -> tuple[Entry, int]:
    (root / "s").write_bytes(b"")
    os.chmod(root / "s", mode)
    entry = fs.lookup(REQ, ROOT_ID, b"s")
    return entry, fs.open(REQ, entry.node, os.O_WRONLY).fh


def test_a_write_without_cap_fsetid_clears_set_id_bits(
    backing: Backing, make_fs: Callable[..., PassthroughFS], unprivileged_pid: int
) -> None:
    root, fd = backing
    writer = Caller(pid=unprivileged_pid, uid=65534, gid=65534)
    assert not writer_of(writer.pid, writer.gid).has_fsetid
    fs = make_fs(fd, caller=writer)
    entry, fh = setid_file(root, fs, 0o4777)
    fs.write(REQ, entry.node, memoryview(b"x"), 0, fh, True)  # writeback: not the writer's
    assert stat.S_IMODE(os.stat(root / "s").st_mode) == 0o4777
    fs.write(REQ, entry.node, memoryview(b"x"), 0, fh)
    assert stat.S_IMODE(os.stat(root / "s").st_mode) == 0o777
    fs.release(REQ, entry.node, fh)


def test_a_write_with_cap_fsetid_keeps_set_id_bits(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    if not writer_of(os.getpid(), 0).has_fsetid:
        pytest.skip("this process has no CAP_FSETID")
    root, fd = backing
    fs = make_fs(fd, caller=Caller(pid=os.getpid(), uid=0, gid=0))
    entry, fh = setid_file(root, fs, 0o6777)
    fs.write(REQ, entry.node, memoryview(b"x"), 0, fh)
    assert stat.S_IMODE(os.stat(root / "s").st_mode) == 0o6777
    fs.release(REQ, entry.node, fh)


def test_the_set_id_rule_is_asked_with_the_writers_pid_and_gid(
    backing: Backing, make_fs: Callable[..., PassthroughFS], monkeypatch: pytest.MonkeyPatch
) -> None:
    from burstctl.fuse_shim import ownership
    from burstctl.fuse_shim.setid import Writer

    asked: list[tuple[int, int]] = []

    def fake_writer_of(pid: int, fsgid: int) -> Writer:
        asked.append((pid, fsgid))
        return Writer(has_fsetid=False, groups=frozenset({fsgid}))

    monkeypatch.setattr(ownership, "writer_of", fake_writer_of)
    root, fd = backing
    fs = make_fs(fd, caller=Caller(pid=31337, uid=1000, gid=4321))
    entry, fh = setid_file(root, fs, 0o2777)  # group-executable set-gid: dropped for all
    fs.write(REQ, entry.node, memoryview(b"x"), 0, fh)
    assert asked == [(31337, 4321)]
    assert stat.S_IMODE(os.stat(root / "s").st_mode) == 0o777
    fs.write(REQ, entry.node, memoryview(b"x"), 0, fh)  # no set-id bit left: not asked
    assert asked == [(31337, 4321)]
    fs.release(REQ, entry.node, fh)


def test_the_kernel_is_told_of_set_id_bits_a_write_or_truncate_cleared_before_the_reply(
    backing: Backing, make_fs: Callable[..., PassthroughFS], monkeypatch: pytest.MonkeyPatch
) -> None:
    # After a WRITE the kernel marks only the size and times it cached as stale: a stat of
    # the mode alone would show the bits for --attr-timeout unless it is told.
    from burstctl.fuse_shim import ownership
    from burstctl.fuse_shim.setid import Writer

    privileged = False
    monkeypatch.setattr(
        ownership,
        "writer_of",
        lambda pid, fsgid: Writer(has_fsetid=privileged, groups=frozenset({fsgid})),
    )
    root, fd = backing
    kernel = KernelRecorder()
    modes: list[int] = []  # BACKING's mode when the kernel is told
    kernel.on_inode = lambda node: modes.append(stat.S_IMODE(os.stat(root / "s").st_mode))
    fs = make_fs(fd, inodes=InodeTable(fd, kernel=kernel))
    entry, fh = setid_file(root, fs, 0o6777)
    fs.write(REQ, entry.node, memoryview(b"x"), 0, fh, True)  # writeback: not the writer's
    assert kernel.inodes == []
    fs.write(REQ, entry.node, memoryview(b"x"), 0, fh)
    assert kernel.inodes == [(entry.node, -1, 0)] and modes == [0o777]
    fs.write(REQ, entry.node, memoryview(b"x"), 0, fh)  # nothing left to clear: not told
    assert len(kernel.inodes) == 1
    os.chmod(root / "s", 0o4777)
    fs.setattr(REQ, entry.node, SetAttr(size=0), fh)  # ftruncate
    os.chmod(root / "s", 0o4777)
    fs.setattr(REQ, entry.node, SetAttr(size=0), None)  # truncate(2)
    fs.release(REQ, entry.node, fh)
    os.chmod(root / "s", 0o4777)
    fs.release(REQ, entry.node, fs.open(REQ, entry.node, os.O_WRONLY | os.O_TRUNC).fh)
    assert kernel.inodes == [(entry.node, -1, 0)] * 4 and modes == [0o777] * 4
    privileged = True  # CAP_FSETID: nothing cleared, nothing told
    os.chmod(root / "s", 0o4777)
    fh = fs.open(REQ, entry.node, os.O_WRONLY).fh
    fs.write(REQ, entry.node, memoryview(b"x"), 0, fh)
    fs.release(REQ, entry.node, fh)
    assert len(kernel.inodes) == 4 and stat.S_IMODE(os.stat(root / "s").st_mode) == 0o4777


# ---------------------------------------------------------------- ownership and access


@ROOT_ONLY
def test_what_a_caller_creates_is_the_callers(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    fs = make_fs(fd)
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o640, os.O_WRONLY)
    fs.release(REQ, entry.node, opened.fh)
    d = fs.mkdir(REQ, ROOT_ID, b"d", 0o755)
    fs.symlink(REQ, b"f", ROOT_ID, b"l")
    fs.mknod(REQ, ROOT_ID, b"p", stat.S_IFIFO | 0o600, 0)
    for name in ("f", "d", "l", "p"):
        st = os.lstat(root / name)
        assert (st.st_uid, st.st_gid) == (65534, 65534), name
    assert (entry.attr.st_uid, d.attr.st_uid) == (65534, 65534)  # the replies say so too
    os.chmod(root / "d", 0o2777)
    os.chown(root / "d", 0, 123)
    g, opened = fs.create(REQ, d.node, b"g", 0o600, os.O_WRONLY)
    fs.release(REQ, g.node, opened.fh)
    assert os.stat(root / "d" / "g").st_gid == 123  # a set-group-id directory's group
    s, opened = fs.create(REQ, ROOT_ID, b"s", 0o6755, os.O_WRONLY)
    fs.release(REQ, s.node, opened.fh)
    st = os.stat(root / "s")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (65534, 0o6755)  # not cleared by chown
    n = fs.mknod(REQ, ROOT_ID, b"n", stat.S_IFREG | 0o4755, 0)
    assert stat.S_IMODE(n.attr.st_mode) == 0o4755 and n.attr.st_uid == 65534
    root_fs = make_fs(fd, caller=Caller(0, 0, 0))
    root_fs.mkdir(REQ, ROOT_ID, b"mine", 0o700)
    assert os.stat(root / "mine").st_uid == 0


@ROOT_ONLY
@pytest.mark.parametrize("mode", [0o600, 0o666], ids=["not-the-callers-to-open", "open-to-all"])
def test_create_of_a_name_that_appeared_meanwhile_takes_nothing(
    backing: Backing, make_fs: Callable[..., PassthroughFS], mode: int
) -> None:
    # The name appeared since the kernel found it absent (created behind the mount while the
    # kernel held a negative entry, or between its LOOKUP and its CREATE). On a local file
    # system open(O_CREAT) of an existing file checks the caller's permission on that file and
    # never changes its owner; root opening it and giving it away handed the caller someone
    # else's file (seen on a real mount with --allow-other).
    root, fd = backing
    (root / "f").write_bytes(b"secret")
    os.chown(root / "f", 1000, 1000)
    os.chmod(root / "f", mode)
    fs = make_fs(fd, caller=Caller(pid=0, uid=65534, gid=65534))
    try:
        entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_RDWR)
    except PermissionError:
        refused = True
    else:
        fs.release(REQ, entry.node, opened.fh)
        refused = False
    st = os.stat(root / "f")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1000, 1000, mode)
    assert refused is (mode == 0o600)
    assert (root / "f").read_bytes() == b"secret"


@ROOT_ONLY
@pytest.mark.parametrize(
    ("mode", "flags", "allowed"),
    [
        (0o644, os.O_WRONLY | os.O_TRUNC, False),
        (0o644, os.O_RDONLY | os.O_TRUNC, False),  # O_TRUNC needs write permission
        (0o666, os.O_RDONLY | os.O_TRUNC, True),  # ... and then truncates, on Linux
    ],
    ids=["write-denied", "read-only-trunc-denied", "read-only-trunc-allowed"],
)
def test_create_of_a_name_that_appeared_meanwhile_truncates_only_with_permission(
    backing: Backing, make_fs: Callable[..., PassthroughFS], mode: int, flags: int, allowed: bool
) -> None:
    # Opening the file as root with the request's O_TRUNC and only then checking the caller's
    # permission truncated it for a caller that then got EACCES.
    root, fd = backing
    (root / "f").write_bytes(b"secret")
    os.chown(root / "f", 1000, 1000)
    os.chmod(root / "f", mode)
    fs = make_fs(fd, caller=Caller(pid=0, uid=65534, gid=65534))
    if allowed:
        entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, flags)
        fs.release(REQ, entry.node, opened.fh)
    else:
        raises_errno(errno.EACCES, fs.create, REQ, ROOT_ID, b"f", 0o644, flags)
    assert (root / "f").read_bytes() == (b"" if allowed else b"secret")


@ROOT_ONLY
def test_create_of_a_name_that_appeared_meanwhile_opens_it_with_the_callers_flags(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"old content")
    os.chown(root / "f", 1000, 1000)
    os.chmod(root / "f", 0o666)
    fs = make_fs(fd, caller=Caller(pid=0, uid=65534, gid=65534))
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o600, os.O_RDWR | os.O_TRUNC)
    assert fs.write(REQ, entry.node, memoryview(b"new"), 0, opened.fh) == 3
    fs.release(REQ, entry.node, opened.fh)
    st = os.stat(root / "f")
    assert (root / "f").read_bytes() == b"new"  # truncated: the caller may write it
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (1000, 0o666)  # create's mode not applied
    raises_errno(errno.EEXIST, fs.create, REQ, ROOT_ID, b"f", 0o644, os.O_WRONLY | os.O_EXCL)


@ROOT_ONLY
def test_give_to_caller(backing: Backing) -> None:
    root, fd = backing
    caller = Caller(pid=0, uid=1234, gid=5678)
    (root / "by-name").write_bytes(b"")
    os.chmod(root / "by-name", 0o4755)
    give_to_caller(fd, b"by-name", caller, None, stat.S_IFREG | 0o4755)
    st = os.stat(root / "by-name")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 5678, 0o4755)
    opened = os.open(root / "by-fd", os.O_CREAT | os.O_WRONLY, 0o2750)
    try:
        give_to_caller(fd, b"ignored: the fd is used", caller, opened, 0o2750)
    finally:
        os.close(opened)
    st = os.stat(root / "by-fd")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1234, 5678, 0o2750)
    os.symlink("by-name", root / "link")
    give_to_caller(fd, b"link", caller, None, stat.S_IFLNK | 0o777)
    assert os.lstat(root / "link").st_uid == 1234  # the link, not its target
    assert os.stat(root / "by-name").st_mode & 0o4000  # the target's bits untouched
    (root / "roots").write_bytes(b"")
    give_to_caller(fd, b"roots", Caller(0, 0, 0), None, 0o644)
    assert os.stat(root / "roots").st_uid == 0


def test_access_checks_the_callers_permissions(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"")
    os.chmod(root / "f", 0o604)
    fs = make_fs(fd, caller=Caller(0, 4242, 4242))
    f = fs.lookup(REQ, ROOT_ID, b"f")
    fs.access(REQ, f.node, os.R_OK)
    fs.access(REQ, f.node, os.F_OK)
    raises_errno(errno.EACCES, fs.access, REQ, f.node, os.W_OK)
    raises_errno(errno.ESTALE, fs.access, REQ, 999, os.F_OK)


# ---------------------------------------------------------------- init


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, int]]:
    """The DirectIoMmap hooks init installs, with their session (none is really installed:
    there is no session here)."""
    installed: list[tuple[Any, int]] = []
    monkeypatch.setattr(DirectIoMmap, "unavailable", classmethod(lambda cls, *a: None))
    monkeypatch.setattr(
        DirectIoMmap,
        "install",
        lambda self, session: installed.append((weakref.ref(self), session)),
    )
    return installed


class Conn:
    """libfuse's struct fuse_conn_info, as far as init reads and writes it."""

    def __init__(self, capable: int = 0xFFFFFFFF, want: int = 0) -> None:
        self.capable = capable
        self.want = want
        self.max_write = 1 << 20  # what libfuse computed from its buffer
        self.max_readahead = 128 << 10  # what the kernel proposed


def test_init_on_libfuse_3(backing: Backing, hooks: list[tuple[Any, int]]) -> None:
    _, fd = backing
    inits: list[bool] = []
    fs = PassthroughFS(InodeTable(fd), on_init=lambda: inits.append(True), max_write=256 << 10)
    conn = Conn(want=0xFFFF | CAP_HANDLE_KILLPRIV)
    fs.init(conn, True, 0)
    assert conn.max_write == 256 << 10 and inits == [True]
    # No GETATTR before every read (as on 2); the kernel clears set-id bits itself.
    assert not conn.want & (CAP_AUTO_INVAL_DATA | CAP_HANDLE_KILLPRIV)
    assert conn.want & CAP_CACHE_SYMLINKS  # offered: taken
    assert conn.want & 0xFFFF == 0xFFFF & ~CAP_AUTO_INVAL_DATA  # the rest left as it was
    conn = Conn(capable=0)
    PassthroughFS(InodeTable(fd)).init(conn, True, 0)
    assert not conn.want & CAP_CACHE_SYMLINKS  # not offered: not asked
    assert conn.max_write == 1 << 20  # no --max-write: libfuse's own
    conn = Conn()
    PassthroughFS(InodeTable(fd), max_write=4 << 20).init(conn, True, 0)
    assert conn.max_write == 1 << 20  # never above what libfuse can take


def test_init_on_libfuse_2(backing: Backing) -> None:
    _, fd = backing
    conn = Conn(capable=CAP_ATOMIC_O_TRUNC | CAP_BIG_WRITES)
    PassthroughFS(InodeTable(fd), max_write=4096).init(conn, False, 0)
    assert conn.want == CAP_ATOMIC_O_TRUNC | CAP_BIG_WRITES
    assert conn.max_write == 4096
    conn = Conn(capable=CAP_ATOMIC_O_TRUNC | CAP_BIG_WRITES)
    PassthroughFS(InodeTable(fd), big_writes=False).init(conn, False, 0)
    assert conn.want == CAP_ATOMIC_O_TRUNC and conn.max_write == 1 << 20
    conn = Conn(capable=CAP_BIG_WRITES)
    PassthroughFS(InodeTable(fd)).init(conn, False, 0)
    assert conn.want == CAP_BIG_WRITES  # only what the kernel offers


@pytest.mark.parametrize("is_v3", [True, False], ids=["libfuse3", "libfuse2"])
def test_init_asks_for_the_read_ahead_window(
    backing: Backing, hooks: list[tuple[Any, int]], is_v3: bool
) -> None:
    # The kernel keeps min(its window, max_readahead) after init: both must be raised.
    _, fd = backing
    conn = Conn()
    PassthroughFS(InodeTable(fd), read_ahead=1 << 20).init(conn, is_v3, 0)
    assert conn.max_readahead == 1 << 20
    conn = Conn()
    PassthroughFS(InodeTable(fd), read_ahead=64 << 10).init(conn, is_v3, 0)
    assert conn.max_readahead == 128 << 10  # never lowered
    conn = Conn()
    PassthroughFS(InodeTable(fd)).init(conn, is_v3, 0)
    assert conn.max_readahead == 128 << 10  # 0: the kernel's default


def test_init_on_libfuse_3_hooks_the_session_for_the_life_of_the_mount(
    backing: Backing, hooks: list[tuple[Any, int]]
) -> None:
    # libfuse calls the hook's ctypes thunk after init returns: were the hook collected, that
    # call would jump into freed memory (seen as a segfault at the INIT reply).
    _, fd = backing
    fs = PassthroughFS(InodeTable(fd))
    fs.init(Conn(), True, 0xC0FFEE)
    gc.collect()
    assert [(ref() is not None, session) for ref, session in hooks] == [(True, 0xC0FFEE)]
    hook = hooks[0][0]()
    assert hook is not None and not fs.direct_io_mmap
    hook._on_reply(True)  # the INIT reply had room: mapping direct_io files is allowed
    assert fs.direct_io_mmap
    del hook
    del fs
    gc.collect()
    assert hooks[0][0]() is None  # lives exactly as long as the file system
    PassthroughFS(InodeTable(fd)).init(Conn(), False, 0xC0FFEE)
    assert len(hooks) == 1  # libfuse 2: nothing to hook


def test_a_hook_that_cannot_be_installed_is_logged(
    backing: Backing, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(self: DirectIoMmap, session: int) -> None:
        raise OSError(errno.EINVAL, "fuse_session_custom_io refused the writer")

    monkeypatch.setattr(DirectIoMmap, "unavailable", classmethod(lambda cls, *a: None))
    monkeypatch.setattr(DirectIoMmap, "install", refuse)
    _, fd = backing
    inits: list[bool] = []
    fs = PassthroughFS(InodeTable(fd), on_init=lambda: inits.append(True))
    with caplog.at_level(logging.WARNING, "burstctl.fuse_shim.fs"):
        fs.init(Conn(), True, 1)
    assert inits == [True] and not fs.direct_io_mmap
    assert "could not ask the kernel to allow mmap" in caplog.text
    monkeypatch.setattr(
        DirectIoMmap, "unavailable", classmethod(lambda cls, *a: "libfuse 9.9 (a test)")
    )
    with caplog.at_level(logging.INFO, "burstctl.fuse_shim.fs"):
        PassthroughFS(InodeTable(fd)).init(Conn(), True, 1)
    assert "cannot be asked for: libfuse 9.9 (a test)" in caplog.text


def test_destroy_calls_back(backing: Backing) -> None:
    _, fd = backing
    destroyed: list[bool] = []
    PassthroughFS(InodeTable(fd), on_destroy=lambda: destroyed.append(True)).destroy()
    PassthroughFS(InodeTable(fd)).destroy()
    assert destroyed == [True]


# ---------------------------------------------------------------- page cache


@pytest.mark.parametrize("granted", [False, True], ids=["no-mmap-grant", "mmap-granted"])
def test_which_opens_bypass_the_page_cache(
    backing: Backing, make_fs: Callable[..., PassthroughFS], granted: bool
) -> None:
    # A file that could be mapped shared goes direct only where the kernel allows mapping it;
    # a write-only one cannot be mapped, so it always may.
    root, fd = backing
    (root / "f").write_bytes(b"x")
    extra = os.O_CREAT | os.O_APPEND | os.O_TRUNC | os.O_CLOEXEC
    chosen = {}
    opened_as = {}
    for mode in ("writes", "all", "none"):
        fs = make_fs(fd, direct_io=mode)
        fs.direct_io_mmap = granted
        f = fs.lookup(REQ, ROOT_ID, b"f")
        for name, access in (("ro", os.O_RDONLY), ("wo", os.O_WRONLY), ("rw", os.O_RDWR)):
            chosen[mode, name] = fs.direct_io_for(access), fs.direct_io_for(access | extra)
            opened = fs.open(REQ, f.node, access)
            fs.release(REQ, f.node, opened.fh)
            entry, created = fs.create(REQ, ROOT_ID, b"c", 0o644, access)
            fs.release(REQ, entry.node, created.fh)
            opened_as[mode, name] = opened.direct_io, created.direct_io
    assert all(plain == with_extra for plain, with_extra in chosen.values())
    expected = {
        ("writes", "ro"): False,
        ("writes", "wo"): True,
        ("writes", "rw"): granted,
        ("all", "ro"): granted,
        ("all", "wo"): True,
        ("all", "rw"): granted,
        ("none", "ro"): False,
        ("none", "wo"): False,
        ("none", "rw"): False,
    }
    assert {key: plain for key, (plain, _) in chosen.items()} == expected
    assert opened_as == {key: (value, value) for key, value in expected.items()}
    with pytest.raises(ValueError, match="direct_io"):
        PassthroughFS(InodeTable(fd), direct_io="sometimes")


# ---------------------------------------------------------------- extended attributes


def test_xattrs_set_get_list_remove(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"")
    fs = make_fs(fd)
    f = fs.lookup(REQ, ROOT_ID, b"f")
    fs.setxattr(REQ, f.node, b"user.one", b"1\x00binary", 0)
    fs.setxattr(REQ, f.node, b"user.two", b"", 0)
    assert fs.getxattr(REQ, f.node, b"user.one") == b"1\x00binary"
    assert os.getxattr(root / "f", "user.one") == b"1\x00binary"
    listed = fs.listxattr(REQ, f.node)
    assert listed.endswith(b"\0")
    assert set(listed.split(b"\0")[:-1]) == {b"user.one", b"user.two"}
    raises_errno(errno.EEXIST, fs.setxattr, REQ, f.node, b"user.one", b"x", os.XATTR_CREATE)
    raises_errno(errno.ENODATA, fs.setxattr, REQ, f.node, b"user.new", b"x", os.XATTR_REPLACE)
    fs.removexattr(REQ, f.node, b"user.one")
    raises_errno(errno.ENODATA, fs.getxattr, REQ, f.node, b"user.one")
    raises_errno(errno.ENODATA, fs.removexattr, REQ, f.node, b"user.one")
    assert fs.listxattr(REQ, f.node) == b"user.two\0"
    fs.removexattr(REQ, f.node, b"user.two")
    assert fs.listxattr(REQ, f.node) == b""


# A VFS_CAP_REVISION_2 capability (cap_net_bind_service, effective): setting it needs root.
_CAP_BLOB = bytes.fromhex("0100000200040000000000000000000000000000")
_CAP = b"security.capability"


def test_absent_capability_is_answered_from_the_cache(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"x")
    (root / "g").write_bytes(b"y")
    fs = make_fs(fd)
    f = fs.lookup(REQ, ROOT_ID, b"f")
    raises_errno(errno.ENODATA, fs.getxattr, REQ, f.node, _CAP)
    raises_errno(errno.ENODATA, fs.getxattr, REQ, f.node, _CAP)
    assert fs._xattrs.no_capability.hits == 1
    # Other names, and other nodes, always go to BACKING.
    raises_errno(errno.ENODATA, fs.getxattr, REQ, f.node, b"user.absent")
    raises_errno(errno.ENODATA, fs.getxattr, REQ, f.node, b"user.absent")
    g = fs.lookup(REQ, ROOT_ID, b"g")
    raises_errno(errno.ENODATA, fs.getxattr, REQ, g.node, _CAP)
    raises_errno(errno.ESTALE, fs.getxattr, REQ, 999, _CAP)
    assert fs._xattrs.no_capability.hits == 1


@ROOT_ONLY
def test_setxattr_through_the_mount_shows_the_capability_at_once(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"x")
    fs = make_fs(fd)
    f = fs.lookup(REQ, ROOT_ID, b"f")
    raises_errno(errno.ENODATA, fs.getxattr, REQ, f.node, _CAP)
    fs.setxattr(REQ, f.node, _CAP, _CAP_BLOB, 0)
    assert fs.getxattr(REQ, f.node, _CAP) == _CAP_BLOB
    fs.removexattr(REQ, f.node, _CAP)
    raises_errno(errno.ENODATA, fs.getxattr, REQ, f.node, _CAP)
    # A failed setxattr forgets too (it may have changed something).
    raises_errno(errno.ENODATA, fs.setxattr, REQ, f.node, b"user.none", b"v", os.XATTR_REPLACE)
    hits = fs._xattrs.no_capability.hits
    raises_errno(errno.ENODATA, fs.getxattr, REQ, f.node, _CAP)
    assert fs._xattrs.no_capability.hits == hits


@ROOT_ONLY
@pytest.mark.parametrize("how", ["rename", "unlink+link", "rmdir+rename"])
def test_a_change_of_names_forgets_absent_capabilities(
    backing: Backing, make_fs: Callable[..., PassthroughFS], how: str
) -> None:
    root, fd = backing
    (root / "d").mkdir()
    (root / "d" / "plain").write_bytes(b"x")
    (root / "capped").write_bytes(b"y")
    os.setxattr(root / "capped", _CAP, _CAP_BLOB)
    fs = make_fs(fd)
    d = fs.lookup(REQ, ROOT_ID, b"d")
    plain = fs.lookup(REQ, d.node, b"plain")
    raises_errno(errno.ENODATA, fs.getxattr, REQ, plain.node, _CAP)
    capped = fs.lookup(REQ, ROOT_ID, b"capped")
    if how == "rename":
        fs.rename(REQ, ROOT_ID, b"capped", d.node, b"plain", 0)
    elif how == "unlink+link":
        fs.unlink(REQ, d.node, b"plain")
        fs.link(REQ, capped.node, d.node, b"plain")
    else:
        os.unlink(root / "d" / "plain")  # behind the mount's back, then through it:
        fs.rmdir(REQ, ROOT_ID, b"d")
        os.mkdir(root / "d")
        d = fs.lookup(REQ, ROOT_ID, b"d")
        fs.rename(REQ, ROOT_ID, b"capped", d.node, b"plain", 0)
    assert not fs._xattrs.no_capability.known_absent(plain.node)  # forgotten
    now = fs.lookup(REQ, d.node, b"plain")
    assert now.node == capped.node
    assert fs.getxattr(REQ, now.node, _CAP) == _CAP_BLOB


@ROOT_ONLY
def test_a_capability_set_behind_the_mount_is_seen_after_the_ttl(
    backing: Backing, make_fs: Callable[..., PassthroughFS], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, fd = backing
    (root / "f").write_bytes(b"x")
    fs = make_fs(fd)
    fs._xattrs.no_capability = capabilities.AbsentCapabilities(ttl=0.2)
    f = fs.lookup(REQ, ROOT_ID, b"f")
    raises_errno(errno.ENODATA, fs.getxattr, REQ, f.node, _CAP)
    os.setxattr(root / "f", _CAP, _CAP_BLOB)  # behind the mount's back: the documented limit
    raises_errno(errno.ENODATA, fs.getxattr, REQ, f.node, _CAP)
    real = time.monotonic
    monkeypatch.setattr(capabilities.time, "monotonic", lambda: real() + 0.3)
    assert fs.getxattr(REQ, f.node, _CAP) == _CAP_BLOB


def test_a_lookup_that_raced_with_a_change_is_not_remembered() -> None:
    cache = capabilities.AbsentCapabilities()
    before = cache.generation
    cache.forget_all()  # e.g. a setxattr finished while the lookup was on BACKING
    cache.remember(2, before)
    assert not cache.known_absent(2)
    cache.remember(2, cache.generation)
    assert cache.known_absent(2)


@ROOT_ONLY
def test_backing_strips_the_capability_on_the_daemons_own_write(
    backing: Backing, make_fs: Callable[..., PassthroughFS]
) -> None:
    # What makes a stale "absent" harmless for writes: the kernel skips its REMOVEXATTR, but
    # BACKING strips the capability when the daemon writes or truncates.
    root, fd = backing
    (root / "f").write_bytes(b"abc")
    fs = make_fs(fd)
    f = fs.lookup(REQ, ROOT_ID, b"f")
    for change in ("write", "truncate-by-handle", "truncate-by-node"):
        os.setxattr(root / "f", _CAP, _CAP_BLOB)
        fh = fs.open(REQ, f.node, os.O_WRONLY).fh
        try:
            if change == "write":
                fs.write(REQ, f.node, memoryview(b"z"), 1, fh)
            elif change == "truncate-by-handle":
                fs.setattr(REQ, f.node, SetAttr(size=1), fh)
            else:
                fs.setattr(REQ, f.node, SetAttr(size=1), None)
        finally:
            fs.release(REQ, f.node, fh)
        with pytest.raises(OSError) as info:
            os.getxattr(root / "f", _CAP)
        assert info.value.errno == errno.ENODATA, change


# ---------------------------------------------------------------- the stage-out


@pytest.fixture
def staged(
    backing: Backing, tmp_path: Path, make_fs: Callable[..., PassthroughFS]
) -> Iterator[tuple[PassthroughFS, StageOut, RecordingPacer, Path, Path]]:
    """A file system with a stage-out to ``tmp_path/pfs`` that evicts after the copy."""
    root, fd = backing
    pfs = tmp_path / "pfs"
    pfs.mkdir()
    inodes = InodeTable(fd)
    stage = StageOut(fd, root, pfs, evict=True, report_interval=0.05, path_of=inodes.path_of)
    stage.start()
    pacer = RecordingPacer()
    fs = make_fs(fd, pacer, stage_out=stage, inodes=inodes)
    yield fs, stage, pacer, root, pfs
    stage.stop()


def test_writes_wait_for_space_and_closed_files_are_staged_out_and_served_from_the_pfs(
    staged: tuple[PassthroughFS, StageOut, RecordingPacer, Path, Path],
) -> None:
    fs, stage, pacer, root, pfs = staged
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_WRONLY)
    data = os.urandom(100_000)
    assert fs.write(REQ, entry.node, memoryview(data), 0, opened.fh) == len(data)
    assert pacer.space == [len(data)]  # the write waited for its space on the buffer
    fs.release(REQ, entry.node, opened.fh)
    wait_until(lambda: stage.evictions == 1, message="the eviction")
    assert (pfs / "f").read_bytes() == data
    assert os.stat(root / "f").st_size == 0
    st = fs.getattr(REQ, entry.node, None)
    assert st.st_size == len(data) and st.st_blocks * 512 >= len(data)
    assert st.st_mtime_ns == os.stat(pfs / "f").st_mtime_ns
    assert fs.lookup(REQ, ROOT_ID, b"f").attr.st_size == len(data)
    # Read through the mount: served from the PFS copy.
    reader = fs.open(REQ, entry.node, os.O_RDONLY)
    assert read_all(fs, entry.node, reader.fh, size=200_000) == data
    fs.release(REQ, entry.node, reader.fh)
    assert os.stat(root / "f").st_size == 0  # reading did not bring it back
    # Opening it for writing brings it back, then the write lands on it; copied again.
    writer = fs.open(REQ, entry.node, os.O_WRONLY)
    assert (root / "f").read_bytes() == data
    fs.write(REQ, entry.node, memoryview(b"tail"), len(data), writer.fh)
    assert pacer.space == [len(data), len(data), 4]  # the restore took space too
    fs.release(REQ, entry.node, writer.fh)
    wait_until(lambda: stage.evictions == 2, message="the second eviction")
    assert (pfs / "f").read_bytes() == data + b"tail"


def test_setting_the_mtime_of_an_evicted_file_shows(
    staged: tuple[PassthroughFS, StageOut, RecordingPacer, Path, Path],
) -> None:
    fs, stage, _, _, _ = staged
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_WRONLY)
    fs.write(REQ, entry.node, memoryview(b"x" * 5000), 0, opened.fh)
    fs.release(REQ, entry.node, opened.fh)
    wait_until(lambda: stage.evictions == 1, message="the eviction")
    st = fs.setattr(REQ, entry.node, SetAttr(mtime=1_000_000_000_123), None)
    assert st.st_mtime_ns == 1_000_000_000_123 and st.st_size == 5000
    assert fs.getattr(REQ, entry.node, None).st_mtime_ns == 1_000_000_000_123


def test_truncating_an_evicted_file_needs_no_restore(
    staged: tuple[PassthroughFS, StageOut, RecordingPacer, Path, Path],
) -> None:
    fs, stage, pacer, _, _ = staged
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_WRONLY)
    fs.write(REQ, entry.node, memoryview(b"x" * 5000), 0, opened.fh)
    fs.release(REQ, entry.node, opened.fh)
    wait_until(lambda: stage.evictions == 1, message="the eviction")
    writer = fs.open(REQ, entry.node, os.O_WRONLY | os.O_TRUNC)
    assert pacer.space == [5000]  # nothing copied back
    assert fs.getattr(REQ, entry.node, writer.fh).st_size == 0
    fs.release(REQ, entry.node, writer.fh)
    wait_until(lambda: stage.evictions == 2, message="the empty file's eviction")


def test_the_stage_outs_marks_are_hidden_from_applications(
    staged: tuple[PassthroughFS, StageOut, RecordingPacer, Path, Path],
) -> None:
    fs, _, _, root, _ = staged
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_WRONLY)
    fs.write(REQ, entry.node, memoryview(b"x"), 0, opened.fh)
    assert XATTR_JOB in os.listxattr(root / "f")
    assert b"user.burstctl" not in fs.listxattr(REQ, entry.node)
    with pytest.raises(OSError) as nodata:
        fs.getxattr(REQ, entry.node, XATTR_JOB.encode())
    assert nodata.value.errno == errno.ENODATA
    with pytest.raises(OSError) as refused:
        fs.setxattr(REQ, entry.node, XATTR_JOB.encode(), b"{}", 0)
    assert refused.value.errno == errno.EPERM
    fs.release(REQ, entry.node, opened.fh)


def test_an_unlinked_file_leaves_the_index(
    staged: tuple[PassthroughFS, StageOut, RecordingPacer, Path, Path],
) -> None:
    fs, stage, _, root, _ = staged
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_WRONLY)
    key = (os.stat(root / "f").st_dev, os.stat(root / "f").st_ino)
    assert stage.tracks(key)
    fs.unlink(REQ, ROOT_ID, b"f")
    assert not stage.tracks(key)
    fs.release(REQ, entry.node, opened.fh)


def test_an_evicted_file_whose_pfs_copy_is_gone_fails_with_eio(
    staged: tuple[PassthroughFS, StageOut, RecordingPacer, Path, Path],
) -> None:
    fs, stage, _, _, pfs = staged
    entry, opened = fs.create(REQ, ROOT_ID, b"f", 0o644, os.O_WRONLY)
    fs.write(REQ, entry.node, memoryview(b"x" * 5000), 0, opened.fh)
    fs.release(REQ, entry.node, opened.fh)
    wait_until(lambda: stage.evictions == 1, message="the eviction")
    (pfs / "f").unlink()
    for flags in (os.O_RDONLY, os.O_RDWR):
        with pytest.raises(OSError) as failed:
            fs.open(REQ, entry.node, flags)
        assert failed.value.errno == errno.EIO
