"""`JobPage` through the library's atomic helpers and through plain ctypes stores: the same
bytes in the shared page, so the library reads the same layout whichever way the agent wrote."""

from __future__ import annotations

import os

import pytest

from burstctl.preload_shim import page as page_module
from burstctl.preload_shim.page import PAGE_SIZE, JobPage


def _drive(page: JobPage) -> bytes:
    page.publish(3.5 * 2**20, 2**20, now_ns=10**12)
    page.publish(float("inf"), 2**21, now_ns=2 * 10**12)
    page.publish(123.0, 4096, now_ns=3 * 10**12)
    page.drop_unreserved(now_ns=4 * 10**12)
    page.publish_metadata(200.0, now_ns=4 * 10**12)  # the metadata supply, the same way
    page.publish_metadata(0.0, now_ns=45 * 10**11)
    page.beat(now_ns=5 * 10**12)
    page.mark_closed()
    return os.pread(page.fd, PAGE_SIZE, 0)


def test_the_helpers_and_ctypes_write_the_same_page(monkeypatch: pytest.MonkeyPatch) -> None:
    assert page_module._library() is not None, "the preload library is not built"
    with_library = JobPage("with-library")
    monkeypatch.setattr(page_module, "_library", lambda: None)
    without = JobPage("without-library")
    try:
        assert with_library._lib is not None and without._lib is None
        a, b = _drive(with_library), _drive(without)
        assert a == b
        assert with_library.counters() == without.counters()
        assert (with_library.rate, with_library.burst) == (123.0, 4096)
    finally:
        with_library.close()
        without.close()
