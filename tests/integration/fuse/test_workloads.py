"""Real programs through a real mount (issue 16), at sizes small enough for CI: git, tar,
SQLite with a concurrent reader, concurrent ``O_APPEND`` writers and shared ``mmap`` against
``read(2)``/``write(2)`` across processes. Each test checks what the program produced (data,
digests, modes, link targets, counts), never how long it took: ``bench/metadata.py`` times
the same workloads at full size.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import sqlite3
import stat
import subprocess
import sys
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import MountProcess, wait_until

pytestmark = pytest.mark.integration

Mount = Callable[..., MountProcess]


def snapshot(root: Path, skip: str | None = None) -> dict[str, tuple[Any, ...]]:
    """Type, mode, size and SHA-256 (files) or target (links) of everything under ``root``."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if skip is not None and skip in dirnames:
            dirnames.remove(skip)
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = os.lstat(path)
            entry: tuple[Any, ...] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode))
            if stat.S_ISREG(st.st_mode):
                entry += (st.st_size, hashlib.sha256(path.read_bytes()).hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                entry += (os.readlink(path),)
            out[str(path.relative_to(root))] = entry
    return out


def hard_link_groups(root: Path) -> set[frozenset[str]]:
    """Sets of paths under ``root`` that are the same regular file (more than one name)."""
    by_inode: dict[int, set[str]] = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                by_inode.setdefault(st.st_ino, set()).add(str(path.relative_to(root)))
    return {frozenset(paths) for paths in by_inode.values()}


# --------------------------------------------------------------------------- git

GIT = ["git", "-c", "init.defaultBranch=main", "-c", "gc.auto=0"]


def git_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        HOME=str(home),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_AUTHOR_NAME="test",
        GIT_AUTHOR_EMAIL="test@example.invalid",
        GIT_COMMITTER_NAME="test",
        GIT_COMMITTER_EMAIL="test@example.invalid",
    )
    return env


def git(env: dict[str, str], cwd: Path, *args: str) -> str:
    done = subprocess.run(
        [*GIT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"git {' '.join(args)} in {cwd}:\n{done.stdout}{done.stderr}"
    return done.stdout


def write_source_tree(root: Path, files: int, rng: random.Random) -> None:
    """Small text and binary files in nested directories, some executable."""
    for i in range(files):
        path = root / f"d{i % 7}" / f"e{i % 3}" / f"f{i:04}.{'txt' if i % 4 else 'bin'}"
        path.parent.mkdir(parents=True, exist_ok=True)
        if i % 4:
            lines = rng.randrange(1, 80)
            path.write_text("".join(f"{i}:{j}:{rng.random():.10f}\n" for j in range(lines)))
        else:
            path.write_bytes(rng.randbytes(rng.randrange(0, 40_000)))
        if i % 9 == 0:
            path.chmod(0o755)  # git keeps the executable bit


def test_git_init_commit_gc_clone_fsck(fuse_mount: Mount, tmp_path: Path) -> None:
    mount = fuse_mount(tmp_path / "backing", tmp_path / "mnt")
    env = git_env(tmp_path / "home")
    (tmp_path / "home").mkdir()
    expected_dir = tmp_path / "expected"
    write_source_tree(expected_dir, 200, random.Random(16))
    repo = mount.mountpoint / "repo"
    write_source_tree(repo, 200, random.Random(16))

    git(env, repo, "init", "-q")
    git(env, repo, "add", "-A")
    git(env, repo, "commit", "-q", "-m", "200 files")
    assert git(env, repo, "status", "--porcelain") == ""
    # a second commit that changes, removes and adds files, so gc has history to pack
    (repo / "d0" / "e0" / "f0000.bin").write_bytes(b"changed\n")
    (expected_dir / "d0" / "e0" / "f0000.bin").write_bytes(b"changed\n")
    for where in (repo, expected_dir):
        (where / "d1" / "e1" / "f0001.txt").unlink()
        (where / "new.txt").write_text("added in the second commit\n")
    git(env, repo, "add", "-A")
    git(env, repo, "commit", "-q", "-m", "second")
    git(env, repo, "gc", "-q", "--prune=now")
    assert list((repo / ".git" / "objects" / "pack").glob("*.pack")), "gc wrote no pack"

    clone = mount.mountpoint / "clone"
    git(env, mount.mountpoint, "clone", "-q", str(repo), str(clone))
    for where in (repo, clone):
        git(env, where, "fsck", "--full", "--strict")  # exits non-zero on any problem
        assert git(env, where, "status", "--porcelain") == ""
    assert git(env, clone, "rev-parse", "HEAD") == git(env, repo, "rev-parse", "HEAD")
    assert git(env, clone, "rev-list", "--count", "HEAD").strip() == "2"

    expected = snapshot(expected_dir)
    assert len(expected) > 200
    assert snapshot(repo, skip=".git") == expected
    assert snapshot(clone, skip=".git") == expected
    assert snapshot(mount.backing / "clone", skip=".git") == expected


# --------------------------------------------------------------------------- tar


def make_tar_tree(root: Path, rng: random.Random) -> int:
    """About 2,000 entries: directories, files of 0–16 KiB with various modes, relative and
    dangling symbolic links, hard links. Returns the number of entries."""
    dirs = [root]
    for i in range(150):
        d = rng.choice(dirs) / f"dir{i}"
        d.mkdir()
        dirs.append(d)
    files = []
    for i in range(1_600):
        path = rng.choice(dirs) / f"file{i}"
        path.write_bytes(rng.randbytes(rng.randrange(0, 16 * 1024 + 1)))
        path.chmod(rng.choice([0o644, 0o600, 0o755, 0o640, 0o444, 0o700]))
        files.append(path)
    for i in range(200):
        target = rng.choice(files)
        link = rng.choice(dirs) / f"sym{i}"
        link.symlink_to(os.path.relpath(target, link.parent))
    (root / "dangling").symlink_to("no/such/file")
    (root / "absolute").symlink_to("/etc/hostname")
    for i in range(60):
        os.link(rng.choice(files), rng.choice(dirs) / f"hard{i}")
    for d in dirs[1:]:
        d.chmod(rng.choice([0o755, 0o750, 0o700, 0o775]))
    return len(dirs) - 1 + 1_600 + 200 + 2 + 60


def test_tar_x_of_a_tree_is_identical(fuse_mount: Mount, tmp_path: Path) -> None:
    mount = fuse_mount(tmp_path / "backing", tmp_path / "mnt")
    src = tmp_path / "src"
    src.mkdir()
    entries = make_tar_tree(src, random.Random(2000))
    tarball = tmp_path / "tree.tar"  # outside the mount
    subprocess.run(["tar", "--format=posix", "-C", str(src), "-cf", str(tarball), "."], check=True)
    out = mount.mountpoint / "x"
    out.mkdir()

    subprocess.run(["tar", "-C", str(out), "-xpf", str(tarball)], check=True, timeout=120)

    expected = snapshot(src)
    assert len(expected) == entries
    assert snapshot(out) == expected
    assert snapshot(mount.backing / "x") == expected
    groups = hard_link_groups(src)
    assert len(groups) >= 30
    assert hard_link_groups(out) == groups
    assert hard_link_groups(mount.backing / "x") == groups


def test_more_files_than_the_daemons_soft_open_file_limit(
    fuse_mount: Mount, tmp_path: Path
) -> None:
    # A daemon started with a low soft RLIMIT_NOFILE (systemd's default is 1024) must still
    # serve a tree of more files than that: a binding that keeps a descriptor per inode the
    # kernel remembers fails here with EMFILE (tar x of 20k entries did on this machine's
    # limit of 20,000). Rlimits are inherited: the mount is started under the low one (it
    # raises its soft limit to the hard one; test_inode_handles_stay_under_max_handles
    # checks the budget below that).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 256
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        mount = fuse_mount(tmp_path / "backing", tmp_path / "mnt")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    files = 4 * low
    root = mount.mountpoint / "many"
    for d in range(8):
        (root / f"d{d}").mkdir(parents=True)
    for i in range(files):
        (root / f"d{i % 8}" / f"f{i}").write_bytes(b"%d\n" % i)
    # every one is still there, by name, and readable, while the kernel remembers them all
    for i in range(files):
        path = root / f"d{i % 8}" / f"f{i}"
        assert os.stat(path).st_size == len(b"%d\n" % i)
        assert path.read_bytes() == b"%d\n" % i
    assert sum(len(os.listdir(root / f"d{d}")) for d in range(8)) == files
    assert len(list((mount.backing / "many").rglob("f*"))) == files


def test_inode_handles_stay_under_max_handles(fuse_mount: Mount, tmp_path: Path) -> None:
    # The mount keeps one O_PATH handle per inode the kernel remembers. Past --max-handles it
    # asks the kernel to drop the least recently used names, which then forgets their
    # inodes: the daemon's descriptors stay bounded however many files are touched, and
    # every file is still reached (looked up again) by name.
    budget = 100
    mount = fuse_mount(tmp_path / "backing", tmp_path / "mnt", "--max-handles", str(budget))
    root = mount.mountpoint / "many"
    files = 1_000
    for d in range(8):
        (root / f"d{d}").mkdir(parents=True)
    for i in range(files):
        (root / f"d{i % 8}" / f"f{i}").write_bytes(b"%d\n" % i)

    def daemon_fds() -> int:
        return len(os.listdir(f"/proc/{mount.pid}/fd"))

    # Everything the kernel remembered beyond the budget was given back (asynchronously).
    # The slack is for what is not a handle: /dev/fuse, the root, stdio, sockets, libraries.
    wait_until(lambda: daemon_fds() <= budget + 40, timeout=20, message="handles under budget")
    for i in range(files):
        path = root / f"d{i % 8}" / f"f{i}"
        assert os.stat(path).st_size == len(b"%d\n" % i)
        assert path.read_bytes() == b"%d\n" % i
    wait_until(lambda: daemon_fds() <= budget + 40, timeout=20, message="handles under budget")
    assert sum(len(os.listdir(root / f"d{d}")) for d in range(8)) == files


# --------------------------------------------------------------------------- SQLite

ROWS = 5_000
BATCH = 50  # rows per transaction

# Counts the rows until it has seen ``total``, printing "ready" after its first count; then
# prints every count it saw, as JSON.
READER = r"""
import json, sqlite3, sys
path, total = sys.argv[1], int(sys.argv[2])
db = sqlite3.connect(path, timeout=30)
counts = []
while True:
    (n,) = db.execute("SELECT count(*) FROM t").fetchone()
    if not counts:
        print("ready", flush=True)
    counts.append(n)
    if n >= total:
        break
print(json.dumps(counts), flush=True)
"""


@pytest.mark.parametrize("journal", ["WAL", "DELETE"])
def test_sqlite_inserts_with_a_concurrent_reader(
    fuse_mount: Mount, tmp_path: Path, journal: str
) -> None:
    mount = fuse_mount(tmp_path / "backing", tmp_path / "mnt")
    path = mount.mountpoint / "test.db"
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    reader: subprocess.Popen[str] | None = None
    try:
        assert db.execute(f"PRAGMA journal_mode={journal}").fetchone()[0].upper() == journal
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT NOT NULL, v BLOB NOT NULL)")
        reader = subprocess.Popen(
            [sys.executable, "-c", READER, str(path), str(ROWS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert reader.stdout is not None
        assert reader.stdout.readline() == "ready\n", reader.stderr.read() if reader.stderr else ""
        rng = random.Random(5)
        rows = [(i, f"key-{i}", rng.randbytes(rng.randrange(10, 300))) for i in range(ROWS)]
        for start in range(0, ROWS, BATCH):
            db.execute("BEGIN")
            db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows[start : start + BATCH])
            db.execute("COMMIT")
        out, err = reader.communicate(timeout=60)
        assert reader.returncode == 0, err
    finally:
        if reader is not None and reader.poll() is None:
            reader.kill()  # by pid: the child this test started
            reader.communicate(timeout=10)
        db.close()

    counts = json.loads(out)
    assert counts[0] == 0 and counts[-1] == ROWS
    assert counts == sorted(counts), "the reader saw the row count go down"
    assert all(n % BATCH == 0 for n in counts), "the reader saw part of a transaction"
    assert len(set(counts)) > 2, "the reader never saw the table between two commits"
    for where in (path, mount.backing / "test.db"):
        with sqlite3.connect(where) as check:
            assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert check.execute("SELECT count(*), sum(id) FROM t").fetchone() == (
                ROWS,
                ROWS * (ROWS - 1) // 2,
            )
            digest = hashlib.sha256()
            for k, v in check.execute("SELECT k, v FROM t ORDER BY id"):
                digest.update(k.encode() + v)
        check.close()
        want = hashlib.sha256()
        for _, k, v in rows:
            want.update(k.encode() + v)
        assert digest.hexdigest() == want.hexdigest()


# --------------------------------------------------------------------------- O_APPEND

RECORD = 509  # bytes: not a divisor of any page or request size
APPENDS = 400  # records per writer
APPENDER = r"""
import os, sys, zlib
path, me, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
print("ready", flush=True)
if sys.stdin.readline() != "go\n":
    sys.exit(1)
for seq in range(n):
    body = f"{me}:{seq}:".encode().ljust(size - 9, b"abcdefghij"[me % 10 : me % 10 + 1])
    record = body + b"%08x" % zlib.crc32(body) + b"\n"
    assert len(record) == size
    if os.write(fd, record) != size:
        sys.exit(2)
os.close(fd)
"""


def test_concurrent_o_append_writers_lose_and_tear_nothing(
    fuse_mount: Mount, tmp_path: Path
) -> None:
    mount = fuse_mount(tmp_path / "backing", tmp_path / "mnt")
    path = mount.mountpoint / "log"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(path), str(me), str(APPENDS), str(RECORD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for me in range(4)
    ]
    try:
        for w in writers:
            assert w.stdout is not None and w.stdout.readline() == "ready\n"
        for w in writers:  # all four start appending together
            assert w.stdin is not None
            w.stdin.write("go\n")
            w.stdin.close()
        assert [w.wait(60) for w in writers] == [0, 0, 0, 0]
    finally:
        for w in writers:
            if w.poll() is None:
                w.kill()  # by pid: the children this test started
                w.wait(10)
            if w.stdout is not None:
                w.stdout.close()

    data = path.read_bytes()
    assert data == (mount.backing / "log").read_bytes()
    assert len(data) == 4 * APPENDS * RECORD
    seen: dict[int, list[int]] = {me: [] for me in range(4)}
    for start in range(0, len(data), RECORD):
        record = data[start : start + RECORD]
        body, crc = record[:-9], record[-9:-1]
        assert record.endswith(b"\n") and b"%08x" % zlib.crc32(body) == crc, (
            f"torn record at offset {start}: {record[:40]!r}"
        )
        me, seq = map(int, body.split(b":")[:2])
        seen[me].append(seq)
    # every record of every writer once, each writer's in its own order
    assert seen == {me: list(range(APPENDS)) for me in range(4)}


# --------------------------------------------------------------------------- shared mmap

MAP_SIZE = 1 << 20
# A process that maps the file shared and obeys commands on stdin:
#   write SEED      fills the mapping with randbytes(SEED) and msyncs it
#   digest          prints the SHA-256 of what the mapping shows now
MAPPER = r"""
import hashlib, mmap, os, random, sys
path, size = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDWR)
m = mmap.mmap(fd, size)
print("ready", flush=True)
for line in sys.stdin:
    cmd, *arg = line.split()
    if cmd == "write":
        m[:] = random.Random(int(arg[0])).randbytes(size)
        m.flush()
        print("written", flush=True)
    elif cmd == "digest":
        print(hashlib.sha256(m[:]).hexdigest(), flush=True)
m.close()
os.close(fd)
"""


def test_shared_mmap_and_read_write_see_each_other(fuse_mount: Mount, tmp_path: Path) -> None:
    mount = fuse_mount(tmp_path / "backing", tmp_path / "mnt")
    path = mount.mountpoint / "shared"
    path.write_bytes(bytes(MAP_SIZE))
    mapper = subprocess.Popen(
        [sys.executable, "-c", MAPPER, str(path), str(MAP_SIZE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert mapper.stdin is not None and mapper.stdout is not None

    def ask(command: str) -> str:
        assert mapper.stdin is not None and mapper.stdout is not None
        mapper.stdin.write(command + "\n")
        mapper.stdin.flush()
        return mapper.stdout.readline().strip()

    try:
        assert mapper.stdout.readline() == "ready\n"
        # another process writes through its shared mapping; this one reads with read(2)
        assert ask("write 1") == "written"
        one = random.Random(1).randbytes(MAP_SIZE)
        assert path.read_bytes() == one
        assert (mount.backing / "shared").read_bytes() == one
        # this one writes with write(2), at offsets that straddle pages; the mapping sees it
        two = bytearray(one)
        fd = os.open(path, os.O_WRONLY)
        try:
            rng = random.Random(2)
            for offset in (0, 4095, 200_001, MAP_SIZE - 5000):
                chunk = rng.randbytes(5000)
                assert os.pwrite(fd, chunk, offset) == len(chunk)
                two[offset : offset + len(chunk)] = chunk
        finally:
            os.close(fd)
        assert ask("digest") == hashlib.sha256(two).hexdigest()
        # and the other way again, over what write(2) left
        assert ask("write 3") == "written"
        three = random.Random(3).randbytes(MAP_SIZE)
        with open(path, "rb") as f:
            assert f.read() == three
    finally:
        mapper.stdin.close()
        try:
            assert mapper.wait(30) == 0
        finally:
            if mapper.poll() is None:
                mapper.kill()  # by pid: the child this test started
                mapper.wait(10)
            mapper.stdout.close()
