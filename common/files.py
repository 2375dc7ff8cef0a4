"""Files replaced whole: the controller's state and ledger, the simulator's campaign files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: str) -> None:
    """Replaces ``path`` with ``data`` so that a crash leaves the old file or the new one,
    never half of one: a temporary file in the same directory, fsync, rename, fsync of the
    directory. On an error nothing changed (the temporary file is removed)."""
    directory = path.parent
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", dir=directory)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
