"""``burstctl`` with a mount whose reads and writes move no data: the FUSE transport alone.

Run in place of ``python -m burstctl`` (same arguments) by bench/fuse_throughput.py's
``fuse-null`` target. Every request still crosses /dev/fuse both ways and runs the same
Python path up to the data; ``read`` answers with libfuse's buffer as it is (unfilled) and
``write`` drops the bytes. What such a mount moves is an upper bound for any mount that does
move the data, with the same options, on this machine. Never use it for real data.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from burstctl.fuse_shim import mount

_serve = mount._serve


class _NoData:
    """`os` as the file system sees it, except that its reads and writes move no data."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def preadv(fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        return sum(len(b) for b in buffers)

    @staticmethod
    def pwrite(fd: int, data: memoryview, offset: int) -> int:
        return len(data)


def _serve_without_data(*args: Any, **kwargs: Any) -> int:
    from burstctl.fuse_shim import fs  # only now: the library was chosen by then

    fs.os = _NoData()  # type: ignore[assignment]
    return _serve(*args, **kwargs)


mount._serve = _serve_without_data

if __name__ == "__main__":
    from burstctl.cli import main

    sys.argv[0] = "burstctl"
    main()
