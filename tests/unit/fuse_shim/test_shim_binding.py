"""The binding seam's read and write callbacks, called as libfuse calls them (no kernel)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

import mfusepy

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
