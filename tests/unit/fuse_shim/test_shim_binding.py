"""The binding seam's read and write callbacks, called as libfuse calls them (no kernel)."""

from __future__ import annotations

import ctypes
import gc
import os
import weakref
from pathlib import Path
from typing import Any

import mfusepy
import pytest

from burstctl.fuse_shim import _fuse
from burstctl.fuse_shim.fs import PassthroughFS


def unmounted(operations: Any) -> _fuse.FUSE:
    # FUSE.__init__ mounts; the callbacks only need what it sets before that.
    fuse = _fuse.FUSE.__new__(_fuse.FUSE)
    fuse.operations = operations
    fuse.raw_fi = False
    fuse.encoding = "utf-8"
    fuse.errors = "surrogateescape"
    return fuse


def request(size: int, data: bytes = b"") -> tuple[Any, Any]:
    """libfuse's side of a request: a ``char *`` buffer (as the prototype passes it)."""
    raw = ctypes.create_string_buffer(data, size) if size else ctypes.create_string_buffer(1)
    return raw, ctypes.cast(raw, ctypes.POINTER(ctypes.c_byte))


def file_info(fh: int) -> Any:
    info = mfusepy.fuse_file_info()
    info.fh = fh
    return ctypes.pointer(info)


def test_read_fills_libfuses_buffer_in_place(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"0123456789")
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fs = PassthroughFS(root)
        fh = fs.open("/f", os.O_RDONLY)
        fuse = unmounted(fs)
        raw, buf = request(6)
        assert fuse.read(b"/f", buf, 6, 2, file_info(fh)) == 6
        assert raw.raw == b"234567"
        raw, buf = request(8, b"\xff" * 8)
        assert fuse.read(None, buf, 8, 7, file_info(fh)) == 3  # unlinked while open: no path
        assert raw.raw == b"789" + b"\xff" * 5  # nothing past what was read is touched
        raw, buf = request(0)
        assert fuse.read(b"/f", buf, 0, 0, file_info(fh)) == 0
        fs.release("/f", fh)
    finally:
        os.close(root)


def test_write_takes_libfuses_buffer_in_place(tmp_path: Path) -> None:
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fs = PassthroughFS(root)
        fh = fs.create("/f", 0o644, os.O_CREAT | os.O_WRONLY)
        fuse = unmounted(fs)
        _, buf = request(5, b"hello")
        assert fuse.write(b"/f", buf, 5, 0, file_info(fh)) == 5
        _, buf = request(3, b"abc")
        assert fuse.write(None, buf, 2, 5, file_info(fh)) == 2  # only the ``size`` bytes
        fs.release("/f", fh)
    finally:
        os.close(root)
    assert (tmp_path / "f").read_bytes() == b"helloab"


def test_without_in_place_operations_mfusepys_callbacks_are_used(tmp_path: Path) -> None:
    class Plain(mfusepy.Operations):  # type: ignore[misc]
        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            return b"xy"[:size]

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            self.got = data
            return len(data)

    plain = Plain()
    fuse = unmounted(plain)
    raw, buf = request(4)
    assert fuse.read(b"/f", buf, 4, 0, file_info(3)) == 2
    assert raw.raw[:2] == b"xy"
    _, buf = request(3, b"abc")
    assert fuse.write(b"/f", buf, 3, 0, file_info(3)) == 3
    assert plain.got == b"abc"


def test_truncate_on_libfuse_3_uses_the_handle(tmp_path: Path) -> None:
    # libfuse 3 passes the handle to truncate (there is no ftruncate), with no path once the
    # file was unlinked while open.
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fs = PassthroughFS(root)
        fh = fs.create("/f", 0o644, os.O_CREAT | os.O_RDWR)
        os.write(fh, b"0123456789")
        os.unlink(tmp_path / "f")
        fuse = unmounted(fs)
        assert fuse.truncate_fuse_3(None, 4, file_info(fh)) == 0
        assert os.fstat(fh).st_size == 4
        (tmp_path / "g").write_bytes(b"abc")
        assert fuse.truncate_fuse_3(b"/g", 1, None) == 0  # truncate(2) by path: no handle
        assert (tmp_path / "g").read_bytes() == b"a"
        fs.release(None, fh)
    finally:
        os.close(root)


def file_info_with_flags(flags: int) -> Any:
    info = mfusepy.fuse_file_info()
    info.flags = flags
    return ctypes.pointer(info)


@pytest.mark.parametrize("granted", [False, True], ids=["no-mmap-grant", "mmap-granted"])
def test_open_and_create_set_direct_io_as_the_operations_choose(
    tmp_path: Path, granted: bool
) -> None:
    (tmp_path / "f").write_bytes(b"x")
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fs = PassthroughFS(root, direct_io="writes")
        fs.direct_io_mmap = granted
        fuse = unmounted(fs)
        seen = {}
        for name, flags in (("ro", os.O_RDONLY), ("wo", os.O_WRONLY), ("rw", os.O_RDWR)):
            fip = file_info_with_flags(flags)
            assert fuse.open(b"/f", fip) == 0
            seen[name] = fip.contents.direct_io
            fs.release("/f", fip.contents.fh)
        fip = file_info_with_flags(os.O_CREAT | os.O_RDWR)
        assert fuse.create(b"/g", 0o644, fip) == 0
        seen["create-rw"] = fip.contents.direct_io
        fs.release("/g", fip.contents.fh)
    finally:
        os.close(root)
    assert seen == {"ro": 0, "wo": 1, "rw": int(granted), "create-rw": int(granted)}


def test_a_failed_open_sets_nothing(tmp_path: Path) -> None:
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fuse = unmounted(PassthroughFS(root, direct_io="all"))
        fip = file_info_with_flags(os.O_WRONLY)
        with pytest.raises(_fuse.FuseOSError):
            fuse.open(b"/missing", fip)
        assert fip.contents.direct_io == 0
    finally:
        os.close(root)


def init_reply(flags: int, *, major: int = 7, body_size: int = 64) -> tuple[Any, Any]:
    """An INIT reply as libfuse hands it to its writer: header, then fuse_init_out."""
    header = ctypes.create_string_buffer(16)
    body = ctypes.create_string_buffer(body_size)
    ctypes.c_uint32.from_buffer(body, 0).value = major
    ctypes.c_uint32.from_buffer(body, 4).value = 38
    if body_size >= 16:
        ctypes.c_uint32.from_buffer(body, 12).value = flags
    iov = (_fuse._IoVec * 2)()
    iov[0].iov_base, iov[0].iov_len = ctypes.addressof(header), 16
    iov[1].iov_base, iov[1].iov_len = ctypes.addressof(body), body_size
    return iov, body


FUSE_INIT_EXT = 1 << 30


def test_the_init_reply_gets_the_direct_io_mmap_flag() -> None:
    iov, body = init_reply(FUSE_INIT_EXT | 0x1234)
    before = body.raw
    assert _fuse.grant_direct_io_mmap(iov, 2)
    after = body.raw
    assert int.from_bytes(after[32:36], "little") == 1 << 4  # bit 36 of the 64-bit flags
    assert after[:32] == before[:32] and after[36:] == before[36:]  # nothing else touched


@pytest.mark.parametrize(
    "reply",
    [
        {"flags": 0x1234},  # the kernel offered no 64-bit flags: no flags2 to set
        {"flags": FUSE_INIT_EXT, "major": 8},  # not protocol 7
        {"flags": FUSE_INIT_EXT, "body_size": 24},  # an old, short reply
    ],
    ids=["no-init-ext", "other-major", "short-reply"],
)
def test_other_replies_are_left_alone(reply: dict[str, int]) -> None:
    iov, body = init_reply(**reply)
    before = body.raw
    assert not _fuse.grant_direct_io_mmap(iov, 2)
    assert body.raw == before
    assert not _fuse.grant_direct_io_mmap(init_reply(FUSE_INIT_EXT)[0], 1)  # one part only


def test_the_hook_writes_the_patched_reply_then_hands_writing_to_libc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replies: list[bool] = []
    hook = _fuse.DirectIoMmap(replies.append)
    installed: list[int] = []

    def custom_io(session: Any, io: Any, fd: int) -> int:
        installed.append(ctypes.cast(io, ctypes.POINTER(_fuse._CustomIo)).contents.writev)
        return 0

    monkeypatch.setattr(hook, "_custom_io", custom_io)
    read_end, write_end = os.pipe()
    try:
        hook._fd = write_end
        iov, _body = init_reply(FUSE_INIT_EXT)  # _body: keeps the buffer alive
        written = hook._hook(write_end, iov, 2, None)  # called through ctypes, as libfuse does
        assert written == 16 + 64
        sent = os.read(read_end, 1024)
        # Only the first message is the INIT reply: a later one passes untouched.
        again, _again = init_reply(FUSE_INIT_EXT)
        assert hook._hook(write_end, again, 2, None) == 16 + 64
        assert int.from_bytes(os.read(read_end, 1024)[16 + 32 : 16 + 36], "little") == 0
    finally:
        os.close(read_end)
        os.close(write_end)
    assert replies == [True]
    assert int.from_bytes(sent[16 + 32 : 16 + 36], "little") == 1 << 4
    assert installed == [ctypes.cast(_fuse._libc.writev, ctypes.c_void_p).value]


@pytest.mark.parametrize(
    ("release", "expected"),
    [
        ("6.18.44-fc-v595", (6, 18)),
        ("5.15.0-91-generic", (5, 15)),
        ("6.6", (6, 6)),
        ("6.10rc1", (6, 10)),
        ("weird", (0, 0)),
    ],
)
def test_kernel_release(release: str, expected: tuple[int, int]) -> None:
    assert _fuse._kernel_release(release) == expected


def test_the_hook_is_used_only_where_it_was_checked() -> None:
    assert _fuse.DirectIoMmap.unavailable((3, 14), (6, 18)) is None
    assert "needs 6.6" in str(_fuse.DirectIoMmap.unavailable((3, 14), (6, 5)))
    for other in ((2, 9), (3, 16), (3, 17)):
        assert "only on 3.14" in str(_fuse.DirectIoMmap.unavailable(other, (6, 18)))


def test_the_mount_keeps_the_hook_alive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # libfuse calls the hook's ctypes thunk after init returns: were the hook collected, that
    # call would jump into freed memory (seen as a segfault at the INIT reply).
    installed: list[weakref.ref[_fuse.DirectIoMmap]] = []
    monkeypatch.setattr(_fuse.DirectIoMmap, "unavailable", classmethod(lambda cls, *a: None))
    monkeypatch.setattr(
        _fuse.DirectIoMmap, "install", lambda self, handle: installed.append(weakref.ref(self))
    )

    class Context(ctypes.Structure):
        _fields_ = [("fuse", ctypes.c_void_p)]

    context = Context()
    monkeypatch.setattr(_fuse, "_get_context", lambda: ctypes.pointer(context))
    root = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fuse = unmounted(PassthroughFS(root))
        fuse._ask_direct_io_mmap()
        gc.collect()
        assert len(installed) == 1 and installed[0]() is not None
        del fuse
        gc.collect()
        assert installed[0]() is None  # lives exactly as long as the mount
    finally:
        os.close(root)
