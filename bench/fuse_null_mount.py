"""``burstctl`` with a mount whose reads and writes move no data: the FUSE transport alone.

Run in place of ``python -m burstctl`` (same arguments) by bench/fuse_throughput.py's
``fuse-null`` target. Every request still crosses /dev/fuse both ways and runs the same
Python path up to the data; ``read`` answers with libfuse's buffer as it is (unfilled) and
``write`` drops the bytes. What such a mount moves is an upper bound for any mount that does
move the data, with the same options, on this machine. Never use it for real data.
"""

from __future__ import annotations

import sys
from typing import Any

from burstctl.fuse_shim import mount

_serve = mount._serve


def _serve_without_data(*args: Any, **kwargs: Any) -> int:
    from burstctl.fuse_shim import fs  # only now: the library was chosen by then

    fs.PassthroughFS.read_into = lambda self, path, buf, offset, fh: len(buf)
    fs.PassthroughFS.write_from = lambda self, path, data, offset, fh: len(data)
    return _serve(*args, **kwargs)


mount._serve = _serve_without_data

if __name__ == "__main__":
    from burstctl.cli import main

    sys.argv[0] = "burstctl"
    main()
