"""The stage-out's start-up: a scan of all of BACKING against a replay of its journal.

Builds a BACKING of ``--files`` one-byte files in directories of 1,000, of which ``--tracked``
carry a job tag (as files written through the mount do), then times
`stageout_journal.recover` twice on it, caches warm (each after one untimed scan): without a
journal (the scan of every directory and file) and with the journal a previous start wrote
(one stat and the xattrs of each tracked file, and the fresh journal written). Prints JSON.

    python bench/stageout_start.py [--files 100000] [--tracked 1000 100000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from burstctl.client.job import JobInfo
from burstctl.node.stageout_journal import Journal, recover
from burstctl.node.stageout_marks import XATTR_JOB, encode_job


def backing_of(root: Path, files: int, tracked: int) -> None:
    tag = encode_job(JobInfo("bench", "alice", "users"))
    every = max(1, files // tracked)
    for i in range(files):
        directory = root / f"d{i // 1000}"
        directory.mkdir(exist_ok=True)
        path = directory / f"f{i}"
        path.write_bytes(b"x")
        if i % every == 0:
            os.setxattr(path, XATTR_JOB, tag)


def one(parent: Path, files: int, tracked: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(dir=parent))
    try:
        backing_of(root, files, tracked)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            found, _ = recover(fd, str(root), None, None)  # caches warm, as for the replay
            started = time.perf_counter()
            found, _ = recover(fd, str(root), None, None)
            scan = time.perf_counter() - started
            journal = Journal(root.parent / f"{root.name}.journal", fd)
            journal.rewrite((key, t.rel, t.tag) for key, t in found.items())
            journal.close()
            started = time.perf_counter()
            replayed, _ = recover(fd, str(root), None, Journal(journal.path, fd))
            replay = time.perf_counter() - started
        finally:
            os.close(fd)
        assert set(replayed) == set(found)
        return {"files": files, "tracked": len(found), "scan_s": scan, "journal_s": replay}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--tracked", type=int, nargs="+", default=[1_000, 100_000])
    parser.add_argument("--dir", type=Path, default=None, help="where BACKING is built")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as parent:
        runs = [one(Path(parent), args.files, t) for t in args.tracked]
    print(json.dumps({"python": platform.python_version(), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
