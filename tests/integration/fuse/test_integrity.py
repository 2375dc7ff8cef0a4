"""Data integrity through a real mount: long random workloads mirrored on a shadow directory,
and tar archives in and out of the mount.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
import signal
import stat
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import ControllerProcess, MountProcess, wait_until

pytestmark = pytest.mark.integration

KiB = 1024
WORKERS = 4
OPS_PER_WORKER = 1500  # 6,000 operations in all


def tree(root: Path, *, exact: bool = False) -> dict[str, tuple[Any, ...]]:
    """Names, types, modes, sizes, link counts, contents and link targets under ``root``."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = os.lstat(path)
            entry: tuple[Any, ...] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode))
            if stat.S_ISREG(st.st_mode):
                entry += (st.st_size, st.st_nlink, hashlib.sha256(path.read_bytes()).hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                entry += (os.readlink(path),)
            if exact:
                entry += (st.st_ino, st.st_mtime_ns, st.st_uid, st.st_gid)
            out[str(path.relative_to(root))] = entry
    return out


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return ("ok", fn(*args))
    except OSError as err:
        return ("err", errno.errorcode.get(err.errno or 0, str(err.errno)))


@dataclass
class Twin:
    """The same file open on both sides: through the mount and in the shadow directory."""

    mount_fd: int
    shadow_fd: int
    append: bool


@dataclass
class Worker:
    """One writer: random operations on its own files, each done on both sides and compared."""

    index: int
    mount_dir: Path
    shadow_dir: Path
    rng: random.Random
    open_files: dict[str, list[Twin]] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    next_name: int = 0

    def both(self, op: str, fn: Callable[[Path], Any]) -> tuple[str, Any]:
        return self._same(op, outcome(fn, self.mount_dir), outcome(fn, self.shadow_dir))

    def both_fds(self, op: str, twin: Twin, fn: Callable[[int], Any]) -> tuple[str, Any]:
        return self._same(op, outcome(fn, twin.mount_fd), outcome(fn, twin.shadow_fd))

    def _same(self, op: str, got: tuple[str, Any], expected: tuple[str, Any]) -> tuple[str, Any]:
        """Logs ``op`` and fails unless the mount and the shadow had the same outcome."""
        self.log.append(op)
        self.counts[op.split()[0]] = self.counts.get(op.split()[0], 0) + 1
        if got != expected:
            raise AssertionError(
                f"worker {self.index}, op #{len(self.log)} {op}: mount {got} != shadow {expected}"
                f"\nlast ops: {self.log[-10:]}"
            )
        return got

    def pick_name(self) -> str:
        if self.names and self.rng.random() < 0.8:
            return self.rng.choice(self.names)
        self.next_name += 1
        sub = self.rng.choice(["", "", "sub/", "sub/deeper/"])
        return f"{sub}f{self.next_name}"

    def pick_twin(self) -> tuple[str, Twin] | None:
        candidates = [(name, t) for name, ts in self.open_files.items() for t in ts]
        return self.rng.choice(candidates) if candidates else None

    def open_twin(self, name: str, flags: int) -> None:
        mode = 0o640
        m = outcome(os.open, str(self.mount_dir / name), flags, mode)
        s = outcome(os.open, str(self.shadow_dir / name), flags, mode)
        self.log.append(f"open {name} {flags:#o}")
        self.counts["open"] = self.counts.get("open", 0) + 1
        if (m[0], s[0]) == ("ok", "ok"):
            twin = Twin(m[1], s[1], bool(flags & os.O_APPEND))
            self.open_files.setdefault(name, []).append(twin)
            if name not in self.names:
                self.names.append(name)
        else:
            for side in (m, s):
                if side[0] == "ok":
                    os.close(side[1])
            assert m[0] == s[0] and m[1 if m[0] == "err" else 0] == s[1 if s[0] == "err" else 0], (
                f"worker {self.index}: open {name}: mount {m} != shadow {s}"
            )

    def close_twin(self, name: str, twin: Twin) -> None:
        self.open_files[name].remove(twin)
        if not self.open_files[name]:
            del self.open_files[name]
        os.close(twin.mount_fd)
        os.close(twin.shadow_fd)

    def step(self) -> None:
        rng = self.rng
        roll = rng.random()
        picked = self.pick_twin()
        if picked is None or roll < 0.12:
            name = self.pick_name()
            flags = rng.choice(
                [
                    os.O_CREAT | os.O_RDWR,
                    os.O_CREAT | os.O_RDWR | os.O_APPEND,
                    os.O_CREAT | os.O_WRONLY | os.O_TRUNC,
                    os.O_RDWR,
                    os.O_CREAT | os.O_EXCL | os.O_RDWR,
                ]
            )
            self.open_twin(name, flags)
            return
        name, twin = picked
        if roll < 0.45:
            data = rng.randbytes(rng.choice([1, 100, 4 * KiB, 64 * KiB, 130 * KiB, 200 * KiB]))
            if twin.append:
                self.both_fds(f"append {name} {len(data)}", twin, lambda fd: os.write(fd, data))
            else:
                offset = rng.randrange(0, 512 * KiB)
                self.both_fds(
                    f"pwrite {name} {len(data)}@{offset}",
                    twin,
                    lambda fd: os.pwrite(fd, data, offset),
                )
        elif roll < 0.58:
            offset, size = rng.randrange(0, 600 * KiB), rng.choice([10, 4 * KiB, 128 * KiB])
            self.both_fds(
                f"pread {name} {size}@{offset}", twin, lambda fd: os.pread(fd, size, offset)
            )
        elif roll < 0.66:
            length = rng.randrange(0, 400 * KiB)
            if rng.random() < 0.5:
                self.both_fds(
                    f"ftruncate {name} {length}", twin, lambda fd: os.ftruncate(fd, length)
                )
            else:
                self.both(f"truncate {name} {length}", lambda d: os.truncate(d / name, length))
        elif roll < 0.74:
            new = self.pick_name()  # may overwrite another file, open or not
            renamed = self.both(f"rename {name} {new}", lambda d: os.rename(d / name, d / new))
            if renamed[0] == "ok" and new != name:
                moved = self.open_files.pop(name, [])
                if moved:
                    self.open_files.setdefault(new, []).extend(moved)
                if name in self.names:
                    self.names.remove(name)
                if new not in self.names:
                    self.names.append(new)
        elif roll < 0.78:
            if self.both(f"unlink {name}", lambda d: os.unlink(d / name))[0] == "ok":
                # The open handles stay usable (and keep being compared) under no name.
                self.names.remove(name)
                self.open_files[f"<unlinked {name} {len(self.log)}>"] = self.open_files.pop(
                    name, []
                )
        elif roll < 0.80:
            sub = rng.choice(["sub", "sub/deeper", "other"])
            self.both(f"mkdir {sub}", lambda d: os.mkdir(d / sub))
        elif roll < 0.83:
            self.both(f"stat-size {name}", lambda d: os.stat(d / name).st_size)
        elif roll < 0.86:
            self.both_fds(f"fsync {name}", twin, os.fsync)
        else:
            self.close_twin(name, twin)

    def run(self, ops: int, until: threading.Event | None = None) -> None:
        """At least ``ops`` operations, and on until ``until`` is set if given."""
        for sub in ("sub", "sub/deeper"):
            os.makedirs(self.mount_dir / sub)
            os.makedirs(self.shadow_dir / sub)
        while len(self.log) < ops or (until is not None and not until.is_set()):
            self.step()
        for name, twins in list(self.open_files.items()):
            for twin in list(twins):
                self.close_twin(name, twin)


def start_workers(
    mountpoint: Path, shadow: Path, until: threading.Event | None = None
) -> tuple[list[Worker], Callable[[], None]]:
    """Starts WORKERS random workers on ``mountpoint`` mirrored on ``shadow`` (each running
    ``Worker.run``); the returned function joins them and fails on any mismatch or hang."""
    workers = []
    for i in range(WORKERS):
        (mountpoint / f"w{i}").mkdir()
        (shadow / f"w{i}").mkdir(parents=True)
        workers.append(Worker(i, mountpoint / f"w{i}", shadow / f"w{i}", random.Random(1000 + i)))
    errors: list[BaseException] = []

    def run(worker: Worker) -> None:
        try:
            worker.run(OPS_PER_WORKER, until)
        except BaseException as exc:  # reported by the test thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()

    def join() -> None:
        for t in threads:
            t.join(100)
        assert not any(t.is_alive() for t in threads), "a worker hung"
        assert not errors, errors[0]

    return workers, join


def check_workers(workers: list[Worker], mount: MountProcess, shadow: Path) -> None:
    total = sum(len(w.log) for w in workers)
    assert total >= 5000
    kinds: dict[str, int] = {}
    for w in workers:
        for kind, n in w.counts.items():
            kinds[kind] = kinds.get(kind, 0) + n
    for kind in ("open", "pwrite", "append", "pread", "truncate", "ftruncate", "rename", "unlink"):
        assert kinds.get(kind, 0) > 20, f"too few {kind} operations: {kinds}"

    assert tree(mount.mountpoint) == tree(shadow)
    assert tree(mount.mountpoint, exact=True) == tree(mount.backing, exact=True)
    assert "Traceback" not in mount.log_text


def test_random_operations_mirror_a_shadow_directory(mounted: MountProcess, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"
    workers, join = start_workers(mounted.mountpoint, shadow)
    join()
    check_workers(workers, mounted, shadow)


CHURN_POLICIES = ["fair-share", "greedy-yield", "fcfs", "set-10", "group>user>size"]


def test_random_operations_survive_controller_restarts_and_policy_switches(
    controller_factory: Callable[..., ControllerProcess],
    fuse_mount: Callable[..., MountProcess],
    fuse_dirs: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    """Issue 15: the same random workload while the controller is restarted twice (killed,
    then stopped) and the policy is switched every 100 ms: not one mismatch."""
    controller = controller_factory("--capacity", "4GiB/s", "--node-bandwidth", "4GiB/s")
    address = controller.address
    assert address is not None
    backing, mountpoint = fuse_dirs
    mount = fuse_mount(backing, mountpoint, "--controller", address, "--fallback", "keep-last")
    token = (controller.state_dir / "admin-token").read_text().strip()
    switched: list[str] = []
    done = threading.Event()

    def switch_policies() -> None:
        i = 0
        while not done.wait(0.1):  # the churn's own period, not a synchronisation
            url = controller.url
            i += 1
            if url is None:
                continue
            try:
                r = httpx.put(
                    f"{url}/v1/policy",
                    json={"name": CHURN_POLICIES[i % len(CHURN_POLICIES)]},
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=2,
                )
            except httpx.HTTPError:
                continue  # restarting
            if r.status_code == 200:
                switched.append(url)

    shadow = tmp_path / "shadow"
    switcher = threading.Thread(target=switch_policies)
    enough = threading.Event()  # the workers go on until the churn is over
    switcher.start()
    try:
        workers, join = start_workers(mountpoint, shadow, enough)

        def churned(n: int) -> bool:
            # this incarnation took 3 switches and the workload moved on meanwhile
            return (
                len([u for u in switched if u == controller.url]) >= 3
                and sum(len(w.log) for w in workers) >= n * WORKERS * 200
            )

        for n, sig in ((1, signal.SIGKILL), (2, signal.SIGTERM)):
            wait_until(lambda n=n: churned(n), 60, message=f"churn of incarnation {n}")
            controller.stop(sig)
            controller.requested_address = address
            controller.start()
        url = controller.url
        assert url is not None

        def mount_attached() -> bool:
            jobs = httpx.get(f"{url}/v1/jobs", timeout=2).json()
            return any(j["sessions"] > 0 for j in jobs)

        wait_until(mount_attached, 20, message="the mount attached to the restarted controller")
        wait_until(lambda: churned(3), 60, message="churn of incarnation 3")
        enough.set()
        join()
    finally:
        enough.set()
        done.set()
        switcher.join(10)
    assert len(set(switched)) == 3, "policies were switched on every incarnation"
    check_workers(workers, mount, shadow)


def make_source_tree(root: Path, rng: random.Random) -> None:
    """A small source tree: nested directories, files of many sizes, links and modes."""
    dirs = [root]
    for i in range(25):
        d = rng.choice(dirs) / f"dir{i}"
        d.mkdir()
        dirs.append(d)
    files = []
    for i in range(250):
        path = rng.choice(dirs) / f"file{i}.{rng.choice(['c', 'h', 'py', 'dat', 'txt'])}"
        size = rng.choice([0, 1, 100, 4095, 4096, 4097, 65_536, 131_073, 200_000])
        path.write_bytes(rng.randbytes(size))
        path.chmod(rng.choice([0o644, 0o600, 0o755, 0o640, 0o444]))
        os.utime(path, ns=(rng.randrange(10**18), rng.randrange(10**18)))
        files.append(path)
    (root / "large.bin").write_bytes(rng.randbytes(6 * 1024 * 1024 + 3))
    for i in range(20):
        target = rng.choice(files)
        link = rng.choice(dirs) / f"link{i}"
        os.symlink(os.path.relpath(target, link.parent), link)
    os.symlink("does/not/exist", root / "dangling")
    for i in range(10):
        os.link(rng.choice(files), rng.choice(dirs) / f"hard{i}")
    (root / "dir0" / "empty").mkdir()
    for d in dirs[1:]:
        d.chmod(rng.choice([0o755, 0o750, 0o700]))


def tar_copy(src: Path, dst: Path) -> None:
    """``tar -C src -cf - . | tar -C dst -xpf -`` (POSIX format, so times keep their ns)."""
    dst.mkdir(parents=True, exist_ok=True)
    pack = subprocess.Popen(
        ["tar", "--format=posix", "-C", str(src), "-cf", "-", "."], stdout=subprocess.PIPE
    )
    unpack = subprocess.run(["tar", "-C", str(dst), "-xpf", "-"], stdin=pack.stdout, check=False)
    assert pack.stdout is not None
    pack.stdout.close()
    assert pack.wait(60) == 0
    assert unpack.returncode == 0


def test_tar_in_and_out_is_identical(mounted: MountProcess, tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    make_source_tree(src, random.Random(42))
    inside = mounted.mountpoint / "copy"

    tar_copy(src, inside)
    tar_copy(inside, out)

    expected = tree(src)
    assert tree(inside) == expected
    assert tree(out) == expected
    assert tree(inside, exact=True) == tree(mounted.backing / "copy", exact=True)
    # mtimes survive both trips (tar's POSIX format keeps them to the nanosecond here)
    for rel in expected:
        if not os.path.islink(src / rel) and not os.path.isdir(src / rel):
            assert os.stat(out / rel).st_mtime_ns == os.stat(src / rel).st_mtime_ns, rel
    shutil.rmtree(inside)
    assert os.listdir(mounted.backing) == []
