"""Mount options and checks, without mounting."""

from __future__ import annotations

import ctypes.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from burstctl.fuse_shim import mount
from burstctl.fuse_shim.mount import (
    MountConfig,
    MountError,
    choose_libfuse,
    fuse_option_dict,
    validate,
)


@pytest.fixture(autouse=True)
def _restore_library_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    # validate() records its libfuse choice in FUSE_LIBRARY_PATH; put it back afterwards.
    monkeypatch.setenv("FUSE_LIBRARY_PATH", "")


def test_default_fuse_options(tmp_path: Path) -> None:
    from burstctl.fuse_shim._fuse import LIBFUSE_VERSION

    options = fuse_option_dict(MountConfig(tmp_path, tmp_path / "m"))
    assert options["default_permissions"] is True
    assert options["subtype"] == "burstctl"
    assert options["fsname"] == f"burstctl:{tmp_path}"
    if LIBFUSE_VERSION[0] == 2:
        assert options["max_write"] == 128 * 1024  # libfuse 2 caps it there
    else:
        assert "max_write" not in options  # libfuse 3 refuses it: set in init
    # Options of the path-based API, which the low-level mount does not use (caching is
    # given per reply, atomic_o_trunc and big_writes are asked for in init).
    for gone in ("use_ino", "hard_remove", "attr_timeout", "atomic_o_trunc", "big_writes"):
        assert gone not in options, gone
    assert "allow_other" not in options
    assert "writeback_cache" not in options
    assert "nonempty" not in options


def test_option_flags_reach_libfuse(tmp_path: Path) -> None:
    from burstctl.fuse_shim._fuse import LIBFUSE_VERSION

    config = MountConfig(
        tmp_path,
        tmp_path,
        allow_other=True,
        max_write=65536,
        big_writes=False,
        fuse_options=("max_read=65536,ro", "fsname=x"),
    )
    options = fuse_option_dict(config)
    assert options["allow_other"] is True
    assert "big_writes" not in options
    assert options["max_read"] == "65536" and options["ro"] is True
    assert options["fsname"] == "x"  # the user's last
    if LIBFUSE_VERSION[0] == 2:
        assert options["max_write"] == 65536
        assert options.get("nonempty") is True  # in place
    else:
        assert "max_write" not in options and "nonempty" not in options


@pytest.mark.parametrize(
    ("option", "instead"),
    [
        ("attr_timeout=5", "--attr-timeout"),
        ("entry_timeout=5", "--entry-timeout"),
        ("negative_timeout=0", "--negative-timeout"),
        ("direct_io", "--direct-io all"),
        ("kernel_cache", "--direct-io none"),
        ("use_ino", "inode numbers are always the backing files'"),
        ("hard_remove", "never renamed"),
        ("umask=022", "chmod on BACKING"),
    ],
)
def test_options_of_the_path_api_are_refused_naming_the_mounts_own(
    tmp_path: Path, option: str, instead: str
) -> None:
    name = option.split("=")[0]
    with pytest.raises(MountError, match=f"-o {name} is an option of libfuse's path-based API"):
        MountConfig(tmp_path, tmp_path, fuse_options=(f"ro,{option}",))
    with pytest.raises(
        MountError,
        match=re.escape(f"use {instead}") if instead.startswith("--") else re.escape(instead),
    ):
        MountConfig(tmp_path, tmp_path, fuse_options=(option,))


def test_commas_in_the_backing_path_are_escaped(tmp_path: Path) -> None:
    assert fuse_option_dict(MountConfig(Path("/a,b"), tmp_path))["fsname"] == "burstctl:/a\\,b"


@pytest.mark.parametrize("option", ["writeback_cache", "nothreads"])
def test_options_that_break_attribution_are_refused(tmp_path: Path, option: str) -> None:
    with pytest.raises(MountError, match=option):
        fuse_option_dict(MountConfig(tmp_path, tmp_path, fuse_options=(f"ro,{option}",)))


def test_validate_checks_the_directories(tmp_path: Path) -> None:
    backing, mnt = tmp_path / "b", tmp_path / "m"
    backing.mkdir()
    mnt.mkdir()
    (backing / "inner").mkdir()
    config = validate(MountConfig(tmp_path / "b" / ".." / "b", mnt))
    assert config.backing == backing and config.mountpoint == mnt
    assert validate(MountConfig(backing, backing)).mountpoint == backing  # in place
    with pytest.raises(MountError, match="inside BACKING"):
        validate(MountConfig(backing, backing / "inner"))
    with pytest.raises(MountError, match="BACKING"):
        validate(MountConfig(tmp_path / "missing", mnt))
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(MountError, match="MOUNTPOINT"):
        validate(MountConfig(backing, tmp_path / "file"))
    with pytest.raises(MountError, match="fallback"):
        validate(MountConfig(backing, mnt, controller="x:1", fallback="sometimes"))
    with pytest.raises(MountError, match="max-write"):
        validate(MountConfig(backing, mnt, max_write=0))
    for bad in (-4096, 1000, 128 << 20):
        with pytest.raises(MountError, match="read-ahead"):
            validate(MountConfig(backing, mnt, read_ahead=bad))
    assert validate(MountConfig(backing, mnt, read_ahead=0)).read_ahead == 0
    with pytest.raises(MountError, match="--direct-io must be one of writes, all, none"):
        validate(MountConfig(backing, mnt, direct_io="sometimes"))
    assert validate(MountConfig(backing, mnt)).direct_io == "writes"


def test_read_ahead_goes_to_the_mounts_own_device(tmp_path: Path) -> None:
    # mountinfo and /sys/class/bdi as the kernel lays them out, in a temporary directory
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 252:1 / / rw,relatime - ext4 /dev/vda rw\n"
        "40 22 0:38 / /mnt/bb\\040one rw - fuse.burstctl burstctl:/b rw\n"
        "41 22 0:39 / /mnt/bb rw - fuse.burstctl burstctl:/b rw\n"
        "42 41 0:40 / /mnt/bb rw - fuse.burstctl burstctl:/c rw\n"  # stacked: the last wins
    )
    bdi = tmp_path / "bdi"
    for device in ("0:38", "0:39", "0:40"):
        (bdi / device).mkdir(parents=True)
        (bdi / device / "read_ahead_kb").write_text("128\n")

    def window(device: str) -> str:
        return (bdi / device / "read_ahead_kb").read_text()

    mount.set_read_ahead(Path("/mnt/bb"), 1 << 20, mountinfo=mountinfo, bdi=bdi)
    assert (window("0:40"), window("0:39")) == ("1024\n", "128\n")
    mount.set_read_ahead(Path("/mnt/bb one"), 4 << 20, mountinfo=mountinfo, bdi=bdi)
    assert window("0:38") == "4096\n"  # the escaped space of mountinfo
    with pytest.raises(FileNotFoundError, match="/mnt/other"):
        mount.set_read_ahead(Path("/mnt/other"), 1 << 20, mountinfo=mountinfo, bdi=bdi)


# libfuse's loop ending with an error cannot be provoked on demand (the kernel must close the
# connection while a worker is reading a request off /dev/fuse), so a child process runs the
# real mount lifecycle with the binding's `serve` replaced by one that fails that way.
_FAILING_LOOP = """
import sys
from pathlib import Path
import burstctl.fuse_shim._fuse as binding
from burstctl.fuse_shim import mount

backing, mountpoint, case = sys.argv[1:]

class Conn:  # libfuse 2's struct fuse_conn_info, as far as init reads it
    capable = want = 0
    max_write = max_readahead = 128 << 10

def serve(fs, path, options, notifier, *, interruptible=True):
    if case == "mount-failed":
        raise binding.MountFailed(f"cannot mount {path}")
    if case != "never-served":
        fs.init(Conn(), False, 0)  # as the binding calls it on libfuse 2
    raise binding.ConnectionAborted("libfuse's loop ended with -1")

binding.serve = serve
if case == "still-mounted":
    mount._is_fuse_mount = lambda path: True
sys.exit(mount.run_mount(mount.MountConfig(Path(backing), Path(mountpoint), foreground=True)))
"""


@pytest.mark.parametrize(
    ("case", "code", "says"),
    [
        ("unmounted", 0, "it had been unmounted"),
        ("never-served", 1, "failed"),
        ("still-mounted", 1, "failed"),
        ("mount-failed", 1, "failed (libfuse said why above): cannot mount"),
    ],
)
def test_a_loop_error_is_a_normal_end_only_once_served_and_unmounted(
    tmp_path: Path, case: str, code: int, says: str
) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "m").mkdir()
    child = subprocess.run(
        [sys.executable, "-c", _FAILING_LOOP, str(tmp_path / "b"), str(tmp_path / "m"), case],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == code, child.stderr
    assert says in child.stderr


_RAISE_LIMIT = """
import resource, sys
from burstctl.fuse_shim.mount import raise_open_file_limit

soft, hard = (int(v) for v in sys.argv[1:])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
print(raise_open_file_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))
"""


@pytest.mark.parametrize(("soft", "hard"), [(256, 1024), (1024, 1024)])
def test_the_open_file_limit_is_raised_to_the_hard_one(soft: int, hard: int) -> None:
    # In a child: the limit is the process's own.
    child = subprocess.run(
        [sys.executable, "-c", _RAISE_LIMIT, str(soft), str(hard)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == [str(hard), str(hard), str(hard)]  # the hard one is kept


class _Loaded:
    """Stands in for the binding module once loaded, with its libfuse version."""

    def __init__(self, major: int) -> None:
        self.LIBFUSE_VERSION = (major, 9 if major == 2 else 14)


@pytest.fixture
def libraries(monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    """Which libfuse "is installed" (find_library), none loaded yet; edit to change."""
    found: dict[str, str | None] = {"fuse": "libfuse.so.2", "fuse3": "libfuse3.so.3"}
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: found.get(name))
    monkeypatch.delitem(sys.modules, "burstctl.fuse_shim._fuse", raising=False)
    monkeypatch.setattr(mount, "_chosen", None)
    return found


@pytest.mark.parametrize(
    ("root", "fusermount3", "installed", "chosen"),
    [
        (True, False, ("fuse", "fuse3"), "libfuse3.so.3"),  # root mounts with mount(2)
        (False, True, ("fuse", "fuse3"), "libfuse3.so.3"),
        (False, False, ("fuse", "fuse3"), "libfuse.so.2"),  # 3 could not mount
        (False, False, ("fuse3",), "libfuse3.so.3"),  # the only one: its error says why
        (True, False, ("fuse",), "libfuse.so.2"),
    ],
)
def test_auto_takes_libfuse_3_where_it_can_mount(
    libraries: dict[str, str | None],
    monkeypatch: pytest.MonkeyPatch,
    root: bool,
    fusermount3: bool,
    installed: tuple[str, ...],
    chosen: str,
) -> None:
    for name in list(libraries):
        if name not in installed:
            libraries[name] = None
    monkeypatch.setattr(os, "geteuid", lambda: 0 if root else 1000)
    monkeypatch.setattr(
        shutil, "which", lambda tool: "/usr/bin/fusermount3" if fusermount3 else None
    )
    assert choose_libfuse("auto") == chosen
    assert os.environ["FUSE_LIBRARY_PATH"] == chosen


def test_an_explicit_choice_is_loaded(libraries: dict[str, str | None]) -> None:
    assert choose_libfuse("2") == "libfuse.so.2"
    assert os.environ["FUSE_LIBRARY_PATH"] == "libfuse.so.2"
    assert choose_libfuse("3") == "libfuse3.so.3"  # nothing loaded yet: may change its mind
    assert os.environ["FUSE_LIBRARY_PATH"] == "libfuse3.so.3"


def test_a_missing_or_unknown_library_is_an_error(libraries: dict[str, str | None]) -> None:
    libraries["fuse3"] = None
    with pytest.raises(MountError, match=r"libfuse 3 is not installed.*libfuse3-3"):
        choose_libfuse("3")
    with pytest.raises(MountError, match="--libfuse must be one of auto, 2, 3"):
        choose_libfuse("4")
    assert os.environ["FUSE_LIBRARY_PATH"] == ""  # nothing chosen


def test_the_users_library_path_wins(
    libraries: dict[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FUSE_LIBRARY_PATH", "/opt/fuse/libfuse3.so.3")
    assert choose_libfuse("2") is None
    assert os.environ["FUSE_LIBRARY_PATH"] == "/opt/fuse/libfuse3.so.3"


def test_a_process_cannot_switch_library_once_one_is_loaded(
    libraries: dict[str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "burstctl.fuse_shim._fuse", _Loaded(2))
    assert choose_libfuse("2") == "libfuse.so.2"
    assert choose_libfuse("auto") is None  # whatever is loaded
    with pytest.raises(MountError, match="libfuse 2 is already loaded"):
        choose_libfuse("3")
    with pytest.raises(MountError, match="libfuse 2 is already loaded"):
        validate(MountConfig(Path("/"), Path("/"), libfuse="3"))


def test_validate_checks_the_stage_out_directory(tmp_path: Path) -> None:
    backing, mnt, pfs = tmp_path / "b", tmp_path / "m", tmp_path / "pfs"
    for d in (backing, mnt, pfs, backing / "inner", mnt / "inner"):
        d.mkdir()
    config = validate(MountConfig(backing, mnt, stage_out=tmp_path / "pfs" / ".." / "pfs"))
    assert config.stage_out == pfs and config.evict_mode == "after-copy"
    kept = validate(MountConfig(backing, mnt, stage_out=pfs, evict="keep"))
    assert kept.evict_mode == "keep"
    assert validate(MountConfig(backing, mnt)).evict_mode is None
    for bad, message in (
        (tmp_path / "missing", "--stage-out .*missing: no such directory"),
        (backing / "inner", "--stage-out .* is inside BACKING"),
        (backing, "--stage-out .* is BACKING"),
        (mnt / "inner", "--stage-out .* is inside MOUNTPOINT"),
        (tmp_path, "--stage-out .* contains BACKING .*: the PFS copies would land on the buffer"),
    ):
        with pytest.raises(MountError, match=message):
            validate(MountConfig(backing, mnt, stage_out=bad))
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(MountError, match=r"--stage-out .*file is not a directory"):
        validate(MountConfig(backing, mnt, stage_out=tmp_path / "file"))
    with pytest.raises(MountError, match="--evict needs --stage-out PFS_DIR"):
        MountConfig(backing, mnt, evict="keep")
    with pytest.raises(MountError, match="--evict must be one of after-copy, keep"):
        MountConfig(backing, mnt, stage_out=pfs, evict="never")
