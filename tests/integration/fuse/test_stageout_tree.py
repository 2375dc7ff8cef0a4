"""``burstctl mount --stage-out PFS_DIR`` reproduces the tree written through the mount on the
PFS: nested directories (an empty one too), relative and absolute symlinks, xattrs on files and
directories, modes and owners, a hard link as one PFS file, a 1 GiB sparse file with 1 MiB of
data kept sparse; and a change of metadata alone reaches the PFS copy without its data. With
``--evict after-copy`` and ``--evict keep``; real mounts (libfuse 2 and 3)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from support import MountProcess, wait_until

from burstctl.node.stageout_marks import MARK_PREFIX, XATTR_COPIED

pytestmark = pytest.mark.integration

MiB = 1 << 20
GiB = 1 << 30
ROOT = os.geteuid() == 0
OTHER = 4242  # an owner that is not the caller's


def xattrs(path: Path) -> dict[str, bytes]:
    """A node's extended attributes (the stage-out's own marks left out)."""
    return {
        n: os.getxattr(path, n, follow_symlinks=False)
        for n in os.listxattr(path, follow_symlinks=False)
        if not n.startswith(MARK_PREFIX)
    }


def tree(top: Path) -> dict[str, os.stat_result]:
    """Every node under ``top``, by relative path, as lstat sees it."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            found[str(path.relative_to(top))] = os.lstat(path)
    return found


def staged(backing: Path, rel: str, evict: str) -> bool:
    """The backing file is copied as it is (and, evicting, its blocks gone)."""
    st = os.stat(backing / rel)
    try:
        mark = os.getxattr(backing / rel, XATTR_COPIED)
    except OSError:
        return False
    if evict == "after-copy":
        return st.st_size == 0
    return mark == f"{st.st_mtime_ns}:{st.st_size}".encode()


def build(mnt: Path) -> dict[str, bytes]:
    """The tree, written through the mount; the regular files' contents by relative path."""
    (mnt / "run" / "ckpt" / "step1").mkdir(parents=True)
    (mnt / "run" / "empty").mkdir(mode=0o700)
    os.chmod(mnt / "run" / "empty", 0o700)
    os.chmod(mnt / "run" / "ckpt", 0o751)
    os.setxattr(mnt / "run" / "ckpt", "user.dir", b"checkpoints")
    contents = {
        "run/ckpt/step1/a": os.urandom(300_000),
        "run/ckpt/secret": os.urandom(5000),
        "run/tool": b"#!/bin/sh\necho hi\n",
        "run/suid": os.urandom(777),
    }
    for rel, data in contents.items():
        (mnt / rel).write_bytes(data)
    os.chmod(mnt / "run/ckpt/secret", 0o600)
    os.chmod(mnt / "run/tool", 0o755)
    if ROOT:
        os.setxattr(mnt / "run/tool", "trusted.origin", b"x")  # root's own namespace
        os.setxattr(mnt / "run" / "empty", "trusted.origin", b"y")
        os.chown(mnt / "run/suid", OTHER, OTHER)
        os.chown(mnt / "run" / "ckpt" / "step1", OTHER, OTHER + 1)
    os.chmod(mnt / "run/suid", 0o4755)  # after the chown, which clears set-id bits
    os.setxattr(mnt / "run/ckpt/step1/a", "user.checksum", b"abc123")
    os.setxattr(mnt / "run/ckpt/step1/a", "user.empty", b"")
    # A hard link: one file under two names.
    os.link(mnt / "run/ckpt/step1/a", mnt / "run/latest")
    # Symlinks, relative and absolute; one owned by another user.
    os.symlink("ckpt/step1/a", mnt / "run" / "rel")
    os.symlink("/etc/hostname", mnt / "run" / "abs")
    if ROOT:
        os.chown(mnt / "run" / "abs", OTHER, OTHER, follow_symlinks=False)
    # 1 GiB with 1 MiB of data in its middle.
    data = os.urandom(MiB)
    fd = os.open(mnt / "run" / "sparse", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, GiB)
        os.pwrite(fd, data, 512 * MiB)
    finally:
        os.close(fd)
    contents["run/sparse"] = data  # the data extent (the rest is zeros)
    return contents


def differences(seen: dict[str, os.stat_result], mnt: Path, pfs: Path) -> list[str]:
    """What differs between the tree as ``seen`` through the mount and on the PFS."""
    copied = tree(pfs)
    if sorted(copied) != sorted(seen):
        return [f"names: {sorted(copied)} != {sorted(seen)}"]
    found = []
    for rel, st in seen.items():
        mine = copied[rel]
        want = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid]
        have = [stat.S_IFMT(mine.st_mode), stat.S_IMODE(mine.st_mode), mine.st_uid, mine.st_gid]
        want.append(st.st_mtime_ns)  # a directory's too: set after its content
        have.append(mine.st_mtime_ns)
        if not stat.S_ISDIR(st.st_mode):
            want.append(st.st_size)
            have.append(mine.st_size)
        if have != want or xattrs(pfs / rel) != xattrs(mnt / rel):
            found.append(rel)
    return found


def same_bytes(path: Path, rel: str, contents: dict[str, bytes]) -> bool:
    if rel != "run/sparse":
        return path.read_bytes() == contents[rel]
    with open(path, "rb") as f:
        f.seek(512 * MiB - 4096)
        around = f.read(MiB + 8192)
    return around == bytes(4096) + contents[rel] + bytes(4096) and os.stat(path).st_size == GiB


@pytest.mark.parametrize("evict", ["after-copy", "keep"])
def test_the_tree_written_through_the_mount_is_reproduced_on_the_pfs(
    fuse_mount: Callable[..., MountProcess], tmp_path: Path, evict: str
) -> None:
    backing, mnt, pfs = tmp_path / "backing", tmp_path / "mnt", tmp_path / "pfs"
    pfs.mkdir()
    fuse_mount(backing, mnt, "--stage-out", str(pfs), "--evict", evict)
    contents = build(mnt)
    files = [*contents, "run/latest"]
    wait_until(lambda: all(staged(backing, rel, evict) for rel in files), 60, message="the drain")
    # The same tree: every node, its kind, mode, owner, mtime, xattrs, size (not a directory's).
    # (Directories and symlinks are reproduced by a thread of their own: waited for.)
    seen = tree(mnt)
    try:
        wait_until(lambda: not differences(seen, mnt, pfs), 30, message="the same tree")
    except AssertionError:
        raise AssertionError(f"not the same tree: {differences(seen, mnt, pfs)}") from None
    copied = tree(pfs)
    assert stat.S_IMODE(copied["run/suid"].st_mode) == 0o4755
    assert stat.S_IMODE(copied["run/ckpt/secret"].st_mode) == 0o600
    assert stat.S_IMODE(copied["run/empty"].st_mode) == 0o700
    assert os.getxattr(pfs / "run" / "ckpt", "user.dir") == b"checkpoints"
    assert os.getxattr(pfs / "run/ckpt/step1/a", "user.checksum") == b"abc123"
    if ROOT:
        assert os.getxattr(pfs / "run/tool", "trusted.origin") == b"x"
        assert os.getxattr(pfs / "run" / "empty", "trusted.origin") == b"y"
        assert copied["run/suid"].st_uid == OTHER
        assert copied["run/abs"].st_uid == OTHER
        assert (copied["run/ckpt/step1"].st_uid, copied["run/ckpt/step1"].st_gid) == (
            OTHER,
            OTHER + 1,
        )
    assert os.readlink(pfs / "run" / "rel") == "ckpt/step1/a"
    assert os.readlink(pfs / "run" / "abs") == "/etc/hostname"
    # One file under two names.
    assert copied["run/latest"].st_ino == copied["run/ckpt/step1/a"].st_ino
    assert copied["run/latest"].st_nlink == 2
    # Sparse stays sparse.
    assert copied["run/sparse"].st_blocks * 512 <= 2 * MiB
    # Identical bytes on the PFS and through the mount.
    for rel in contents:
        assert same_bytes(pfs / rel, rel, contents), rel
        assert same_bytes(mnt / rel, rel, contents), rel

    # A change of metadata alone: the PFS copy takes it, its data not copied again (the same
    # PFS file: a copy would have replaced it).
    inode = copied["run/tool"].st_ino
    os.chmod(mnt / "run/tool", 0o750)
    os.setxattr(mnt / "run/tool", "user.after", b"1")
    os.utime(mnt / "run/tool", ns=(1_000_000_000, 2_000_000_000))
    os.chmod(mnt / "run" / "ckpt", 0o755)
    os.removexattr(mnt / "run" / "ckpt", "user.dir")
    st = os.stat(pfs / "run/tool")  # a file's: at once, by the request
    assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (0o750, 2_000_000_000)
    assert os.getxattr(pfs / "run/tool", "user.after") == b"1" and st.st_ino == inode
    wait_until(
        lambda: (
            stat.S_IMODE(os.stat(pfs / "run" / "ckpt").st_mode) == 0o755
            and "user.dir" not in os.listxattr(pfs / "run" / "ckpt")
        ),
        30,
        message="the directory's change",
    )
    assert os.stat(mnt / "run/tool").st_mtime_ns == 2_000_000_000
    assert (mnt / "run/tool").read_bytes() == contents["run/tool"]
    # Unlinking one name of the linked file keeps the other, on the buffer and the PFS.
    os.unlink(mnt / "run/latest")
    assert (mnt / "run/ckpt/step1/a").read_bytes() == contents["run/ckpt/step1/a"]
    assert (pfs / "run/ckpt/step1/a").read_bytes() == contents["run/ckpt/step1/a"]
