"""POSIX behaviour through a real mount matches the same operations on a plain directory.

Each scenario runs the same steps on a directory inside the mount and on a reference directory
on the backing file system, and records each step's result or errno. The test asserts that
the two records are equal, that the resulting trees are equal (names, types, modes, owners,
sizes, link counts, contents, symlink targets), and that the tree seen through the mount equals
the backing directory's own view, times and inode numbers included.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import random
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import MountProcess, is_mounted, run_as

pytestmark = pytest.mark.integration

Outcome = tuple[str, Any]


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Outcome:
    """``("ok", value)`` or ``("err", "ENOENT")``: what a call did."""
    try:
        return ("ok", fn(*args, **kwargs))
    except OSError as err:
        return ("err", errno.errorcode.get(err.errno or 0, str(err.errno)))


def snapshot(root: Path, *, exact: bool = False) -> dict[str, tuple[Any, ...]]:
    """What a tree holds; ``exact`` adds inode numbers and the three times."""
    tree: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath, name)
            st = os.lstat(path)
            kind = stat.S_IFMT(st.st_mode)
            entry: tuple[Any, ...] = (kind, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            if stat.S_ISREG(st.st_mode):
                entry += (st.st_size, st.st_nlink, hashlib.sha256(path.read_bytes()).hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                entry += (os.readlink(path),)
            elif stat.S_ISDIR(st.st_mode):
                entry += (st.st_nlink,)
            if exact:
                entry += (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
                if not stat.S_ISREG(st.st_mode):
                    entry += (st.st_atime_ns,)  # reading a file's contents above moves atime
            tree[str(path.relative_to(root))] = entry
    return tree


# ------------------------------------------------------------------------ the scenarios


def sc_files(d: Path) -> list[Outcome]:
    out = [attempt(Path(d, "a").write_bytes, b"hello")]
    out.append(attempt(Path(d, "a").read_bytes))
    fd = os.open(d / "b", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640)
    os.close(fd)
    out.append(attempt(os.open, d / "b", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    out.append(attempt(os.open, d / "missing", os.O_RDONLY))
    out.append(attempt(os.stat, d / "missing"))
    out.append(attempt(os.unlink, d / "missing"))
    out.append(attempt(os.open, d / "a" / "x", os.O_RDONLY))  # ENOTDIR
    out.append(attempt(os.open, d / "a", os.O_RDONLY | os.O_DIRECTORY))  # ENOTDIR
    out.append(attempt(lambda: os.stat(d / "a").st_size))
    out.append(attempt(os.access, d / "a", os.R_OK | os.W_OK))
    out.append(attempt(os.access, d / "missing", os.F_OK))
    return out


def sc_directories(d: Path) -> list[Outcome]:
    out = [attempt(os.mkdir, d / "x", 0o750)]
    out.append(attempt(os.mkdir, d / "x"))  # EEXIST
    Path(d, "x", "f").write_bytes(b"1")
    os.mkdir(d / "x" / "sub")
    out.append(attempt(os.rmdir, d / "x"))  # ENOTEMPTY
    out.append(attempt(os.unlink, d / "x"))  # EISDIR
    out.append(attempt(os.open, d / "x", os.O_WRONLY))  # EISDIR
    out.append(attempt(os.rmdir, d / "x" / "f"))  # ENOTDIR
    out.append(attempt(os.mkdir, d / "x" / "f"))  # EEXIST
    out.append(attempt(os.rmdir, d / "missing"))  # ENOENT
    out.append(attempt(os.mkdir, d / "missing" / "y"))  # ENOENT
    out.append(attempt(lambda: sorted(os.listdir(d / "x"))))
    out.append(attempt(os.listdir, d / "x" / "f"))  # ENOTDIR
    out.append(attempt(os.rmdir, d / "x" / "sub"))
    with os.scandir(d / "x") as it:
        out.append(("ok", sorted((e.name, e.is_dir(), e.is_file()) for e in it)))
    out.append(attempt(lambda: os.stat(d / "x").st_nlink))
    return out


def sc_rename(d: Path) -> list[Outcome]:
    Path(d, "a").write_bytes(b"A")
    Path(d, "b").write_bytes(b"BB")
    out = [attempt(os.rename, d / "a", d / "b")]  # overwrite
    out.append(attempt(Path(d, "b").read_bytes))
    out.append(attempt(os.rename, d / "a", d / "c"))  # ENOENT
    for name in ("d1", "d2", "d3"):
        os.mkdir(d / name)
    Path(d, "d2", "f").write_bytes(b"f")
    out.append(attempt(os.rename, d / "d1", d / "d2"))  # ENOTEMPTY
    out.append(attempt(os.rename, d / "d1", d / "d3"))  # onto an empty directory
    out.append(attempt(os.rename, d / "b", d / "d2"))  # EISDIR
    out.append(attempt(os.rename, d / "d2", d / "b"))  # ENOTDIR
    out.append(attempt(os.rename, d / "d2", d / "d2" / "inside"))  # EINVAL
    out.append(attempt(os.rename, d / "b", d / "b"))  # to itself
    out.append(attempt(os.rename, d / "b", d / "d3" / "moved"))  # across directories
    out.append(attempt(os.replace, d / "d3" / "moved", d / "d2" / "f"))
    out.append(attempt(lambda: sorted(os.listdir(d))))
    return out


def sc_links(d: Path) -> list[Outcome]:
    Path(d, "f").write_bytes(b"data")
    out = [attempt(os.link, d / "f", d / "hard")]
    out.append(attempt(os.link, d / "f", d / "hard"))  # EEXIST
    out.append(attempt(lambda: (os.stat(d / "f").st_nlink, os.stat(d / "hard").st_nlink)))
    Path(d, "hard").write_bytes(b"changed")
    out.append(attempt(Path(d, "f").read_bytes))
    out.append(attempt(lambda: os.stat(d / "f").st_ino == os.stat(d / "hard").st_ino))
    out.append(attempt(os.symlink, "f", d / "sym"))
    out.append(attempt(os.symlink, "nowhere/../x", d / "dangling"))
    out.append(attempt(os.symlink, "f", d / "sym"))  # EEXIST
    out.append(attempt(os.readlink, d / "sym"))
    out.append(attempt(os.readlink, d / "dangling"))
    out.append(attempt(os.readlink, d / "f"))  # EINVAL
    out.append(attempt(Path(d, "sym").read_bytes))
    out.append(attempt(os.open, d / "dangling", os.O_RDONLY))  # ENOENT
    out.append(attempt(os.open, d / "sym", os.O_RDONLY | os.O_NOFOLLOW))  # ELOOP
    os.mkdir(d / "dir")
    Path(d, "dir", "inner").write_bytes(b"in")
    out.append(attempt(os.symlink, "dir", d / "dirlink"))
    out.append(attempt(Path(d, "dirlink", "inner").read_bytes))
    out.append(attempt(lambda: stat.S_ISLNK(os.lstat(d / "sym").st_mode)))
    out.append(attempt(os.unlink, d / "f"))
    out.append(attempt(Path(d, "hard").read_bytes))
    out.append(attempt(lambda: os.stat(d / "hard").st_nlink))
    out.append(attempt(os.link, d / "dir", d / "dirhard"))  # EPERM
    return out


def sc_modes_owners(d: Path) -> list[Outcome]:
    old = os.umask(0o027)
    try:
        fd = os.open(d / "masked", os.O_CREAT | os.O_WRONLY, 0o777)
        os.close(fd)
        os.mkdir(d / "maskdir", 0o777)
    finally:
        os.umask(old)
    out = [attempt(lambda: stat.S_IMODE(os.stat(d / "masked").st_mode))]
    out.append(attempt(lambda: stat.S_IMODE(os.stat(d / "maskdir").st_mode)))
    for mode in (0o600, 0o4755, 0o2711, 0o1777, 0o000):
        out.append(attempt(os.chmod, d / "masked", mode))
        out.append(attempt(lambda: stat.S_IMODE(os.stat(d / "masked").st_mode)))
    out.append(attempt(os.chmod, d / "maskdir", 0o2775))
    out.append(attempt(os.chown, d / "masked", 65534, 65534))
    out.append(attempt(lambda: (os.stat(d / "masked").st_uid, os.stat(d / "masked").st_gid)))
    out.append(attempt(os.chown, d / "masked", -1, 0))
    out.append(attempt(lambda: (os.stat(d / "masked").st_uid, os.stat(d / "masked").st_gid)))
    os.symlink("masked", d / "link")
    out.append(attempt(os.lchown, d / "link", 65534, 65534))
    out.append(attempt(lambda: os.lstat(d / "link").st_uid))
    out.append(attempt(os.chmod, d / "missing", 0o644))  # ENOENT
    os.mkfifo(d / "fifo", 0o640)
    out.append(attempt(lambda: stat.S_ISFIFO(os.stat(d / "fifo").st_mode)))
    return out


def sc_truncate_append(d: Path) -> list[Outcome]:
    p = d / "t"
    p.write_bytes(b"0123456789")
    out = [attempt(os.truncate, p, 4), attempt(p.read_bytes)]
    out += [attempt(os.truncate, p, 20), attempt(p.read_bytes)]
    fd = os.open(p, os.O_RDWR)
    try:
        out.append(attempt(os.ftruncate, fd, 2))
        out.append(attempt(lambda: os.fstat(fd).st_size))
        out.append(attempt(os.pwrite, fd, b"xyz", 6))
        out.append(attempt(os.pread, fd, 100, 0))
    finally:
        os.close(fd)
    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
    os.close(fd)
    out.append(attempt(lambda: os.stat(p).st_size))
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"one")
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, b"two")  # O_APPEND: still at the end
        out.append(attempt(os.pwrite, fd, b"!", 0))
    finally:
        os.close(fd)
    out.append(attempt(p.read_bytes))
    out.append(attempt(os.truncate, d / "missing", 0))  # ENOENT
    fd = os.open(d / "sparse", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, b"end", 3 * 1024 * 1024)
        out.append(attempt(lambda: os.fstat(fd).st_size))
        out.append(attempt(lambda: os.pread(fd, 8, 1024 * 1024) == bytes(8)))
        out.append(attempt(os.fsync, fd))
        out.append(attempt(os.fdatasync, fd))
        out.append(attempt(os.posix_fallocate, fd, 0, 8 * 1024 * 1024))
        out.append(attempt(lambda: os.fstat(fd).st_size))
    finally:
        os.close(fd)
    return out


def sc_big_io(d: Path) -> list[Outcome]:
    data = random.Random(7).randbytes(5 * 1024 * 1024 + 17)
    p = d / "big"
    with open(p, "wb") as f:
        for start in range(0, len(data), 300_001):  # chunks that straddle request sizes
            f.write(data[start : start + 300_001])
    out = [attempt(lambda: hashlib.sha256(p.read_bytes()).hexdigest())]
    with open(p, "rb") as f:
        f.seek(1_234_567)
        out.append(attempt(lambda: f.read(777_777) == data[1_234_567 : 1_234_567 + 777_777]))
    with open(p, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        out.append(attempt(lambda: m[4096:4200] == data[4096:4200]))
        m[0:5] = b"MMAP!"
        m.flush()
    out.append(attempt(lambda: p.read_bytes()[:8]))
    return out


def sc_times(d: Path) -> list[Outcome]:
    p = d / "f"
    p.write_bytes(b"x")
    os.mkdir(d / "dir")
    out = [attempt(os.utime, p, ns=(1_000_000_001, 2_000_000_002))]
    out.append(attempt(lambda: (os.stat(p).st_atime_ns, os.stat(p).st_mtime_ns)))
    out.append(attempt(os.utime, d / "dir", ns=(3_000_000_003, 4_000_000_004)))
    out.append(attempt(lambda: os.stat(d / "dir").st_mtime_ns))
    # touch -a / -m set one time and leave the other (UTIME_OMIT), -d a given one.
    subprocess.run(["touch", "-a", "-d", "@1500000000.25", str(p)], check=True)
    out.append(attempt(lambda: (os.stat(p).st_atime_ns, os.stat(p).st_mtime_ns)))
    subprocess.run(["touch", "-m", "-d", "@1600000000.5", str(p)], check=True)
    out.append(attempt(lambda: (os.stat(p).st_atime_ns, os.stat(p).st_mtime_ns)))
    os.symlink("f", d / "link")
    out.append(
        attempt(os.utime, d / "link", ns=(5_000_000_000, 6_000_000_000), follow_symlinks=False)
    )
    out.append(attempt(lambda: os.lstat(d / "link").st_mtime_ns))
    out.append(attempt(lambda: os.stat(d / "link").st_mtime_ns))
    before = os.stat(p).st_mtime_ns
    os.utime(p)  # now
    out.append(attempt(lambda: os.stat(p).st_mtime_ns > before))
    # A write moves mtime forward. From an old explicit mtime, not from "now": the
    # mount's attribute cache and the clocks' granularity (coarse vs fine-grained
    # timestamps) can order two "now"s within one tick differently (seen once in CI).
    os.utime(p, ns=(7_000_000_000, 7_000_000_000))
    with open(p, "ab") as f:
        f.write(b"more")
    out.append(attempt(lambda: os.stat(p).st_mtime_ns > 7_000_000_000))
    out.append(attempt(os.utime, d / "missing", ns=(1, 1)))  # ENOENT
    return out


def sc_xattrs(d: Path) -> list[Outcome]:
    p = d / "f"
    p.write_bytes(b"x")
    out = [attempt(os.setxattr, p, "user.burst", b"value")]
    out.append(attempt(os.getxattr, p, "user.burst"))
    out.append(attempt(os.listxattr, p))
    out.append(attempt(os.setxattr, p, "user.burst", b"v2", os.XATTR_CREATE))  # EEXIST
    out.append(attempt(os.setxattr, p, "user.other", b"v", os.XATTR_REPLACE))  # ENODATA
    out.append(attempt(os.getxattr, p, "user.absent"))  # ENODATA
    out.append(attempt(os.setxattr, p, "user.big", b"z" * 3000))
    out.append(attempt(os.getxattr, p, "user.big"))
    out.append(attempt(os.removexattr, p, "user.burst"))
    out.append(attempt(os.removexattr, p, "user.burst"))  # ENODATA
    out.append(attempt(lambda: sorted(os.listxattr(p))))
    out.append(attempt(os.getxattr, d / "missing", "user.burst"))  # ENOENT
    return out


def sc_open_unlinked(d: Path) -> list[Outcome]:
    p = d / "gone"
    p.write_bytes(b"still here")
    fd = os.open(p, os.O_RDWR)
    try:
        out = [attempt(os.unlink, p)]
        out.append(attempt(os.pread, fd, 100, 0))
        out.append(attempt(os.pwrite, fd, b"!", 10))
        out.append(attempt(os.pread, fd, 100, 0))
        # (fstat is left out: see "Limits" in docs/fuse.md.)
        out.append(attempt(os.ftruncate, fd, 5))
        out.append(attempt(os.pread, fd, 100, 0))
        out.append(attempt(lambda: os.listdir(d)))  # no .fuse_hidden* left behind
    finally:
        os.close(fd)
    out.append(attempt(lambda: os.listdir(d)))
    return out


def sc_statfs(d: Path) -> list[Outcome]:
    st = os.statvfs(d)
    return [("ok", (st.f_bsize, st.f_blocks, st.f_files, st.f_namemax))]


SCENARIOS = [
    sc_files,
    sc_directories,
    sc_rename,
    sc_links,
    sc_modes_owners,
    sc_truncate_append,
    sc_big_io,
    sc_times,
    sc_xattrs,
    sc_open_unlinked,
    sc_statfs,
]


# ------------------------------------------------------------------------ fixtures and tests


@pytest.fixture(scope="module")
def shared_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MountProcess]:
    """One mount for the scenarios (each works in its own directory); stopped and checked."""
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing")
    root = tmp_path_factory.mktemp("posix")
    backing, mountpoint = root / "backing", root / "mnt"
    backing.mkdir()
    mountpoint.mkdir()
    mount = MountProcess(backing, mountpoint).start()
    try:
        yield mount
    finally:
        mount.stop()
        assert not is_mounted(mountpoint)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__.removeprefix("sc_"))
def test_scenario_matches_plain_directory(
    scenario: Callable[[Path], list[Outcome]], shared_mount: MountProcess, tmp_path: Path
) -> None:
    name = scenario.__name__
    through_mount = shared_mount.mountpoint / name
    in_backing = shared_mount.backing / name
    reference = tmp_path / "reference"
    through_mount.mkdir()
    reference.mkdir()

    got = scenario(through_mount)
    expected = scenario(reference)

    assert got == expected
    assert snapshot(through_mount) == snapshot(reference)
    assert snapshot(through_mount, exact=True) == snapshot(in_backing, exact=True)


def test_statfs_is_the_backing_file_systems(shared_mount: MountProcess) -> None:
    mine, theirs = os.statvfs(shared_mount.mountpoint), os.statvfs(shared_mount.backing)
    assert (mine.f_bsize, mine.f_blocks, mine.f_files) == (
        theirs.f_bsize,
        theirs.f_blocks,
        theirs.f_files,
    )


def test_mount_is_listed_as_burstctl(shared_mount: MountProcess) -> None:
    with open("/proc/self/mounts", encoding="utf-8") as f:
        line = next(entry for entry in f if f" {shared_mount.mountpoint} " in entry)
    source, _, fstype, options = line.split()[:4]
    assert source == f"burstctl:{shared_mount.backing}"
    assert fstype == "fuse.burstctl"
    assert "default_permissions" in options.split(",")


def test_directory_entries_carry_the_backing_inodes(shared_mount: MountProcess) -> None:
    d = shared_mount.mountpoint / "inodes"
    d.mkdir()
    for i in range(20):
        Path(d, f"f{i}").write_bytes(b"x")
    Path(d, "sub").mkdir()
    listing = subprocess.run(
        ["ls", "-ai", str(d)], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    names = {line.split()[1]: int(line.split()[0]) for line in listing if line.strip()}
    assert {".", ".."} <= set(names)
    for name in [f"f{i}" for i in range(20)] + ["sub"]:
        assert names[name] == os.stat(shared_mount.backing / "inodes" / name).st_ino


# ------------------------------------------------------------------------ another user


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A directory every user can reach (tmp_path's parents are root-only)."""
    path = Path(tempfile.mkdtemp(prefix="burstctl-posix-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        if is_mounted(path / "mnt"):
            subprocess.run(["fusermount", "-u", "-z", str(path / "mnt")], check=False)
        shutil.rmtree(path)


def _prepare_for_nobody(d: Path) -> None:
    d.chmod(0o755)
    Path(d, "secret").write_bytes(b"root only")
    Path(d, "secret").chmod(0o600)
    Path(d, "public").write_bytes(b"everyone")
    Path(d, "public").chmod(0o644)
    os.mkdir(d / "closed", 0o700)
    Path(d, "closed", "inner").write_bytes(b"x")
    os.mkdir(d / "open", 0o777)
    os.chmod(d / "open", 0o777)
    os.mkdir(d / "sticky", 0o777)
    os.chmod(d / "sticky", 0o1777)
    Path(d, "sticky", "roots").write_bytes(b"r")


def _as_nobody(d: str) -> list[Any]:
    # Runs in a child process as nobody (see support.run_as): os and errno only.
    def attempt_(fn: Callable[..., Any], *args: Any) -> list[Any]:
        try:
            value = fn(*args)
            return ["ok", value if isinstance(value, int | str | list) else None]
        except OSError as err:
            return ["err", errno.errorcode.get(err.errno or 0, str(err.errno))]

    def read(path: str) -> str:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, 100).decode()
        finally:
            os.close(fd)

    def create(path: str) -> list[int]:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o644)
        os.close(fd)
        st = os.stat(path)
        return [st.st_uid, st.st_gid]

    def mkdir(path: str) -> list[int]:
        os.mkdir(path, 0o755)
        st = os.stat(path)
        return [st.st_uid, st.st_gid]

    return [
        attempt_(read, f"{d}/secret"),
        attempt_(read, f"{d}/public"),
        attempt_(os.open, f"{d}/public", os.O_WRONLY),
        attempt_(create, f"{d}/new"),
        attempt_(create, f"{d}/open/mine"),
        attempt_(mkdir, f"{d}/open/mydir"),
        attempt_(os.listdir, f"{d}/closed"),
        attempt_(os.stat, f"{d}/closed/inner"),
        attempt_(os.chmod, f"{d}/public", 0o666),
        attempt_(os.unlink, f"{d}/sticky/roots"),
        attempt_(os.unlink, f"{d}/public"),
        attempt_(os.rename, f"{d}/open/mine", f"{d}/open/renamed"),
        attempt_(os.chmod, f"{d}/open/renamed", 0o600),
        attempt_(os.access, f"{d}/secret", os.R_OK),
        attempt_(os.access, f"{d}/public", os.R_OK),
        attempt_(os.utime, f"{d}/public", (1, 1)),
        attempt_(os.utime, f"{d}/open/renamed", (1, 1)),
    ]


def test_permissions_for_another_user_match(
    fuse_mount: Callable[..., MountProcess], world_dir: Path
) -> None:
    backing, mountpoint, reference = world_dir / "backing", world_dir / "mnt", world_dir / "ref"
    mount = fuse_mount(backing, mountpoint, "--allow-other")
    backing.chmod(0o755)
    reference.mkdir(mode=0o755)
    for d in (mountpoint / "d", reference / "d"):
        d.mkdir()
        _prepare_for_nobody(d)

    got = run_as(65534, 65534, _as_nobody, str(mountpoint / "d"))
    expected = run_as(65534, 65534, _as_nobody, str(reference / "d"))

    assert got == expected
    assert ["err", "EACCES"] in got  # the point of the exercise: EACCES did happen
    assert got[4] == ["ok", [65534, 65534]]  # what nobody creates is nobody's
    assert snapshot(mountpoint / "d") == snapshot(reference / "d")
    assert snapshot(mountpoint / "d", exact=True) == snapshot(backing / "d", exact=True)
    assert mount.returncode is None


# ------------------------------------------------------------------------ mount in place


def test_mount_over_the_backing_directory_itself(
    fuse_mount: Callable[..., MountProcess], tmp_path: Path
) -> None:
    place = tmp_path / "in-place"
    place.mkdir()
    Path(place, "before").write_bytes(b"was here")
    mount = fuse_mount(place, place)
    assert Path(place, "before").read_bytes() == b"was here"
    Path(place, "during").write_bytes(b"written through the mount")
    os.mkdir(place / "dir")
    os.rename(place / "before", place / "dir" / "moved")
    mount.stop()
    assert not is_mounted(place)
    assert sorted(os.listdir(place)) == ["dir", "during"]
    assert Path(place, "dir", "moved").read_bytes() == b"was here"
    assert Path(place, "during").read_bytes() == b"written through the mount"
