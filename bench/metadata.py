"""Metadata and small-I/O workloads through ``burstctl mount`` against BACKING, in the same run.

One temporary directory holds BACKING (a plain directory) and the mount points, so both sides
are on the same file system. Each item runs on BACKING, then through a mount of BACKING (no
controller: unthrottled), and with ``--controller`` also through a second mount of the same
BACKING that paces every request at a real controller (``burstctl controller`` on a loopback
port, 1 TiB/s of capacity and node bandwidth: an allocation nothing here reaches, so the
pacing never binds but every request still goes through the job's session). Every target
works in its own fresh directory; what an item builds beforehand (files to stat or unlink,
the 2,000 files of the git repository) is built through the same target and not timed; the
entries of ``readdir_10k`` are made directly in BACKING, so the mount has never seen them.

Items (``--scale full``; ``small`` is about 1/20 of each, for a quick run):

- ``stat``: ``os.stat`` of one existing file, 20,000 calls (µs per call);
- ``create_close``: ``open(O_CREAT | O_EXCL)`` + ``close`` of 5,000 new files (µs per file);
- ``unlink``: unlink of 5,000 files (µs per file);
- ``pwrite_4k``: 20,000 ``os.pwrite`` of 4 KiB into one open file (µs per call);
- ``readdir_10k``: ``os.listdir`` of a 10,000-entry directory, mean of 5 (ms per listdir);
- ``git``: 2,000 small files in a tree of directories: ``git init``, ``add -A``, ``commit``,
  ``status``, ``clone`` (local, next to the repository), each step timed, and their total;
- ``tar_x``: ``tar -xf`` of a 20,500-entry tree (2,000 directories × 9 files of 0–16 KiB,
  40 parent directories, 460 symbolic links), the archive built once outside the mount;
- ``sqlite_wal``, ``sqlite_rollback``: 50,000 inserts with Python's sqlite3 in transactions
  of 100 rows, ``journal_mode=WAL`` / ``DELETE``, ``synchronous=NORMAL``.

Each item runs in rounds, the targets interleaved within a round (a slow spell of this shared
machine then hits every target alike): ``--repeat`` rounds (3) of the five calls above,
``--repeat-workloads`` rounds (1) of git, tar and SQLite; the figure is the median of the rounds
(every round is in the JSON when there are several).

Prints one JSON document on stdout (progress on stderr): for each item the time on BACKING,
through the mount and their ratio (mount / BACKING), plus the environment (libfuse version as
the mount logged it, kernel, CPUs, Python). All I/O belongs to whichever job this process's
environment names (``BURSTCTL_JOB_ID``, ``SLURM_JOB_ID``), else root's default job. The mounts
and the controller are stopped by pid, the mount points checked unmounted, the temporary
directory removed. Only the mount's command line is used, so any version of the shim runs it.

    python bench/metadata.py [--libfuse 2|3] [--scale small|full] [--only ITEM,...]
        [--controller] [--repeat 3] [--repeat-workloads 1] [--out FILE] [--dir DIR]
        [--mount-args="..."]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import ControllerProcess, MountProcess, is_mounted

ITEMS = (
    "stat",
    "create_close",
    "unlink",
    "pwrite_4k",
    "readdir_10k",
    "git",
    "tar_x",
    "sqlite_wal",
    "sqlite_rollback",
)
SQLITE_BATCH = 100  # rows per transaction


@dataclass(frozen=True)
class Scale:
    stat_calls: int
    create_files: int
    unlink_files: int
    pwrite_calls: int
    readdir_entries: int
    readdir_repeats: int
    git_files: int
    tar_dirs: int  # leaf directories, 9 files each
    tar_symlinks: int
    sqlite_rows: int


SCALES = {
    "full": Scale(20_000, 5_000, 5_000, 20_000, 10_000, 5, 2_000, 2_000, 460, 50_000),
    "small": Scale(1_000, 250, 250, 1_000, 500, 5, 100, 100, 23, 2_500),
}


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@dataclass
class Target:
    """Where an item runs: ``path`` is the directory applications use, ``backing`` the same
    directory seen directly in BACKING (setup that must not go through the mount, cleanup)."""

    name: str
    path: Path
    backing: Path


# --------------------------------------------------------------------------- items
# Each item function gets a fresh, empty directory (as the target shows it) and returns
# its figures; only the timed part is inside the clock.


def item_stat(d: Path, scale: Scale, ctx: Context) -> float:
    path = d / "file"
    path.write_bytes(b"x" * 4096)
    os.stat(path)  # the first lookup is not what is measured
    n = scale.stat_calls
    t0 = time.perf_counter()
    for _ in range(n):
        os.stat(path)
    return (time.perf_counter() - t0) / n * 1e6


def item_create_close(d: Path, scale: Scale, ctx: Context) -> float:
    names = [str(d / f"c{i}") for i in range(scale.create_files)]
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY
    t0 = time.perf_counter()
    for name in names:
        os.close(os.open(name, flags, 0o644))
    elapsed = time.perf_counter() - t0
    assert len(os.listdir(d)) == len(names)
    return elapsed / len(names) * 1e6


def item_unlink(d: Path, scale: Scale, ctx: Context) -> float:
    names = [str(d / f"u{i}") for i in range(scale.unlink_files)]
    for name in names:  # made through the same target, not timed
        with open(name, "wb") as f:
            f.write(b"u")
    t0 = time.perf_counter()
    for name in names:
        os.unlink(name)
    elapsed = time.perf_counter() - t0
    assert os.listdir(d) == []
    return elapsed / len(names) * 1e6


def item_pwrite_4k(d: Path, scale: Scale, ctx: Context) -> float:
    block = random.Random(4).randbytes(4096)
    slots = 4096  # a 16 MiB file, written over and over
    fd = os.open(d / "data", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, block, 0)
        n = scale.pwrite_calls
        t0 = time.perf_counter()
        for i in range(n):
            os.pwrite(fd, block, (i % slots) * 4096)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
    return elapsed / n * 1e6


def item_readdir(d: Path, scale: Scale, ctx: Context) -> float:
    # The entries are made directly in BACKING (a directory the mount has never seen): only
    # reading the directory is measured.
    raw = ctx.backing_of(d)
    for i in range(scale.readdir_entries):
        os.close(os.open(raw / f"entry-{i:05}", os.O_CREAT | os.O_WRONLY, 0o644))
    t0 = time.perf_counter()
    for _ in range(scale.readdir_repeats):
        names = os.listdir(d)
    elapsed = time.perf_counter() - t0
    assert len(names) == scale.readdir_entries
    return elapsed / scale.readdir_repeats * 1e3


def git_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        {
            "HOME": str(home),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "bench",
            "GIT_AUTHOR_EMAIL": "bench@example.invalid",
            "GIT_COMMITTER_NAME": "bench",
            "GIT_COMMITTER_EMAIL": "bench@example.invalid",
            "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
            "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
        }
    )
    return env


GIT = ["git", "-c", "init.defaultBranch=main", "-c", "gc.auto=0", "-c", "maintenance.auto=0"]


def write_source_tree(root: Path, files: int, seed: int = 16) -> None:
    """``files`` small text files in a tree of directories (25 × 8 leaves)."""
    rng = random.Random(seed)
    for i in range(files):
        path = root / f"d{i % 25:02}" / f"e{(i // 25) % 8}" / f"f{i:05}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = rng.randrange(2, 60)
        path.write_text(
            "".join(f"line {j} of file {i}: {rng.random():.12f}\n" for j in range(lines))
        )


def item_git(d: Path, scale: Scale, ctx: Context) -> dict[str, float]:
    env = git_env(ctx.home)
    repo = d / "repo"
    t0 = time.perf_counter()
    write_source_tree(repo, scale.git_files)
    steps = {"write_files": time.perf_counter() - t0}

    def step(name: str, *args: str, cwd: Path = repo) -> str:
        t = time.perf_counter()
        out = subprocess.run(
            [*GIT, *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
        )
        steps[name] = time.perf_counter() - t
        if out.returncode != 0:
            raise SystemExit(f"git {' '.join(args)} failed in {cwd}:\n{out.stderr}")
        return out.stdout

    step("init", "init", "-q")
    step("add", "add", "-A")
    step("commit", "commit", "-q", "-m", "2,000 small files")
    if step("status", "status", "--porcelain") != "":
        raise SystemExit("git status after the commit is not clean")
    step("clone", "clone", "-q", str(repo), str(d / "clone"), cwd=d)
    return steps


GIT_TIMED = ("init", "add", "commit", "status", "clone")


def build_tarball(dest: Path, scale: Scale, seed: int = 20) -> int:
    """The archive of the ``tar_x`` item, built in a scratch directory; returns its entries."""
    rng = random.Random(seed)
    src = dest.with_suffix(".src")
    src.mkdir()
    files: list[Path] = []
    entries = 0
    parents = max(1, scale.tar_dirs // 50)
    for p in range(parents):
        (src / f"p{p:03}").mkdir()
        entries += 1
    for i in range(scale.tar_dirs):
        leaf = src / f"p{i % parents:03}" / f"d{i:04}"
        leaf.mkdir()
        entries += 1
        for j in range(9):
            path = leaf / f"f{j}.dat"
            path.write_bytes(rng.randbytes(rng.randrange(0, 16 * 1024 + 1)))
            files.append(path)
            entries += 1
    for k in range(scale.tar_symlinks):
        target = rng.choice(files)
        link = src / f"p{k % parents:03}" / f"link{k:04}"
        link.symlink_to(os.path.relpath(target, link.parent))
        entries += 1
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for child in sorted(src.iterdir()):
            tar.add(child, arcname=child.name)
    shutil.rmtree(src)
    return entries


def count_entries(root: Path) -> int:
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(root))


def item_tar_x(d: Path, scale: Scale, ctx: Context) -> float:
    tarball, entries = ctx.tarball(scale)
    t0 = time.perf_counter()
    subprocess.run(["tar", "-xf", str(tarball), "-C", str(d)], check=True)
    elapsed = time.perf_counter() - t0
    found = count_entries(ctx.backing_of(d))
    if found != entries:
        raise SystemExit(f"tar -xf into {d}: {found} entries, expected {entries}")
    return elapsed


def sqlite_item(mode: str) -> Callable[[Path, Scale, Context], float]:
    def run(d: Path, scale: Scale, ctx: Context) -> float:
        rng = random.Random(50)
        rows = [(i, f"key-{i}", rng.randbytes(100)) for i in range(scale.sqlite_rows)]
        t0 = time.perf_counter()
        db = sqlite3.connect(d / "bench.db", isolation_level=None)
        try:
            db.execute(f"PRAGMA journal_mode={mode}")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT, v BLOB)")
            for start in range(0, len(rows), SQLITE_BATCH):
                db.execute("BEGIN")
                db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows[start : start + SQLITE_BATCH])
                db.execute("COMMIT")
        finally:
            db.close()
        elapsed = time.perf_counter() - t0
        with sqlite3.connect(d / "bench.db") as check:
            (count,) = check.execute("SELECT count(*) FROM t").fetchone()
        check.close()
        if count != scale.sqlite_rows:
            raise SystemExit(f"sqlite {mode}: {count} rows, expected {scale.sqlite_rows}")
        return elapsed

    return run


# name: (function, unit of its figure)
ITEM_SPECS: dict[str, tuple[Callable[..., object], str]] = {
    "stat": (item_stat, "us"),
    "create_close": (item_create_close, "us"),
    "unlink": (item_unlink, "us"),
    "pwrite_4k": (item_pwrite_4k, "us"),
    "readdir_10k": (item_readdir, "ms"),
    "git": (item_git, "s"),
    "tar_x": (item_tar_x, "s"),
    "sqlite_wal": (sqlite_item("WAL"), "s"),
    "sqlite_rollback": (sqlite_item("DELETE"), "s"),
}


def describe(name: str, scale: Scale) -> dict[str, object]:
    """What an item did, for the JSON."""
    described: dict[str, dict[str, object]] = {
        "stat": {"calls": scale.stat_calls},
        "create_close": {"files": scale.create_files},
        "unlink": {"files": scale.unlink_files},
        "pwrite_4k": {"calls": scale.pwrite_calls, "file_bytes": 16 << 20},
        "readdir_10k": {"entries": scale.readdir_entries, "listdirs": scale.readdir_repeats},
        "git": {"files": scale.git_files, "total_is": "+".join(GIT_TIMED)},
        "tar_x": {
            "directories": scale.tar_dirs + max(1, scale.tar_dirs // 50),
            "files": scale.tar_dirs * 9,
            "file_bytes": "0-16KiB",
            "symlinks": scale.tar_symlinks,
        },
        "sqlite_wal": {
            "inserts": scale.sqlite_rows,
            "rows_per_transaction": SQLITE_BATCH,
            "journal_mode": "WAL",
            "synchronous": "NORMAL",
        },
        "sqlite_rollback": {
            "inserts": scale.sqlite_rows,
            "rows_per_transaction": SQLITE_BATCH,
            "journal_mode": "DELETE",
            "synchronous": "NORMAL",
        },
    }
    return described[name]


# --------------------------------------------------------------------------- the run


class Context:
    def __init__(self, root: Path, backing: Path, targets: list[Target]) -> None:
        self.root = root
        self.backing = backing
        self.targets = targets
        self.home = root / "home"
        self.home.mkdir()
        self._tarball: tuple[Path, int] | None = None

    def backing_of(self, d: Path) -> Path:
        for t in self.targets:
            if d == t.path or t.path in d.parents:
                return t.backing / d.relative_to(t.path)
        raise ValueError(d)

    def tarball(self, scale: Scale) -> tuple[Path, int]:
        if self._tarball is None:
            path = self.root / "scratch" / "tree.tar"
            path.parent.mkdir()
            progress(f"building the tar archive ({scale.tar_dirs * 9} files)")
            self._tarball = (path, build_tarball(path, scale))
        return self._tarball


def ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b > 0 else float("nan")


def figures(unit: str, by_target: dict[str, float]) -> dict[str, float]:
    digits = 3 if unit == "s" else 1 if unit == "us" else 2
    out = {f"{t.replace('-', '_')}_{unit}": round(v, digits) for t, v in by_target.items()}
    base = by_target["backing"]
    if "mount" in by_target:
        out["ratio"] = ratio(by_target["mount"], base)
    if "mount-controller" in by_target:
        out["ratio_controller"] = ratio(by_target["mount-controller"], base)
        if "mount" in by_target:
            out["controller_over_mount"] = ratio(by_target["mount-controller"], by_target["mount"])
    return out


WORKLOADS = ("git", "tar_x", "sqlite_wal", "sqlite_rollback")


def run_item(name: str, scale: Scale, ctx: Context, repeats: int) -> dict[str, object]:
    """Runs ``name`` ``repeats`` times on every target, the targets interleaved in each round
    (a slow spell of the machine hits them alike); the figure is the median of the rounds."""
    fn, unit = ITEM_SPECS[name]
    runs: dict[str, list[Any]] = {t.name: [] for t in ctx.targets}
    for r in range(repeats):
        for target in ctx.targets:
            d = target.path / f"{name}-{r}"
            d.mkdir()
            progress(f"{name} on {target.name}" + (f" ({r + 1}/{repeats})" if repeats > 1 else ""))
            runs[target.name].append(fn(d, scale, ctx))
            shutil.rmtree(target.backing / d.name)  # behind the mount's back: no name is reused
    out: dict[str, object] = dict(describe(name, scale))
    out["rounds"] = repeats
    if name == "git":
        steps = {}
        for step_name in ("write_files", *GIT_TIMED):
            steps[step_name] = figures(
                "s", {t: median(s[step_name] for s in rs) for t, rs in runs.items()}
            )
        out["steps"] = steps
        totals = {t: [sum(s[k] for k in GIT_TIMED) for s in rs] for t, rs in runs.items()}
    else:
        totals = runs
    out.update(figures(unit, {t: median(v) for t, v in totals.items()}))
    if repeats > 1:
        digits = 3 if unit == "s" else 1 if unit == "us" else 2
        for t, v in totals.items():
            out[f"{t.replace('-', '_')}_{unit}_rounds"] = [round(x, digits) for x in v]
    progress(f"{name}: {json.dumps({k: v for k, v in out.items() if k != 'steps'})}")
    return out


def tool_version(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=10)
    except OSError:
        return None
    return out.stdout.splitlines()[0].strip() if out.stdout else None


def code_version() -> str | None:
    here = Path(__file__).resolve().parents[1]
    head = subprocess.run(
        ["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:
        return None
    dirty = subprocess.run(
        ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    )
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def environment(mount_log: str) -> dict[str, object]:
    found = re.search(r"libfuse (\d+\.\d+(?:\.\d+)?)", mount_log)
    return {
        "libfuse": found.group(1) if found else None,
        "kernel": platform.release(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "git": tool_version(["git", "--version"]),
        "tar": tool_version(["tar", "--version"]),
    }


def run(args: argparse.Namespace, root: Path) -> dict[str, object]:
    scale = SCALES[args.scale]
    backing = root / "backing"
    backing.mkdir()
    mount_args = ["--libfuse", args.libfuse, *shlex.split(args.mount_args)]
    mounts: list[MountProcess] = []
    controller: ControllerProcess | None = None
    started = time.monotonic()
    code = code_version()  # before anything runs: the tree may change during a long run
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    try:
        plain = MountProcess(backing, root / "mnt", mount_args)
        (root / "mnt").mkdir()
        mounts.append(plain.start(30))
        targets = [
            Target("backing", backing / "on-backing", backing / "on-backing"),
            Target("mount", plain.mountpoint / "on-mount", backing / "on-mount"),
        ]
        if args.controller:
            big = ["--capacity", "1TiB/s", "--node-bandwidth", "1TiB/s", "--policy", "fair-share"]
            controller = ControllerProcess(root / "state", big).start(30)
            assert controller.address is not None
            (root / "mnt-ctl").mkdir()
            paced = MountProcess(
                backing,
                root / "mnt-ctl",
                [*mount_args, "--controller", controller.address, "--session-idle", "3600"],
            )
            mounts.append(paced.start(30))
            targets.append(
                Target("mount-controller", paced.mountpoint / "on-ctl", backing / "on-ctl")
            )
        for t in targets:
            t.path.mkdir()
            warm = t.path / "warm-up"  # opens the job's session before anything is timed
            warm.write_bytes(b"w" * 4096)
            warm.read_bytes()
            warm.unlink()
        ctx = Context(root, backing, targets)
        items = {
            name: run_item(
                name, scale, ctx, args.repeat_workloads if name in WORKLOADS else args.repeat
            )
            for name in args.only
        }
        env = environment(plain.log_text)
        env["load_average_at_start"] = load_at_start
        return {
            "benchmark": "metadata",
            "code": code,
            "scale": args.scale,
            "controller": bool(args.controller),
            "mount_args": mount_args,
            "environment": env,
            "ratio_is": "mount / backing (ratio_controller: mount-controller / backing)",
            "items": items,
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        for mount in reversed(mounts):
            mount.stop(check=False)
        if controller is not None:
            controller.stop()
        left = [str(m.mountpoint) for m in mounts if is_mounted(m.mountpoint)]
        if left:
            raise SystemExit(f"mount points left mounted: {left}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="items: " + ", ".join(ITEMS),
    )
    parser.add_argument("--libfuse", choices=("2", "3"), default="3", help="default: 3")
    parser.add_argument(
        "--scale",
        choices=tuple(SCALES),
        default="full",
        help="full: the sizes above; small: ~1/20 of each, a quick run (default: full)",
    )
    parser.add_argument(
        "--only",
        metavar="ITEM,...",
        default=",".join(ITEMS),
        help="the items to run, comma-separated (default: all)",
    )
    parser.add_argument(
        "--controller",
        action="store_true",
        help="also run every item through a mount paced by a controller at 1 TiB/s",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="rounds of stat, create_close, unlink, pwrite_4k and readdir_10k; the figure is "
        "the median (default: 3)",
    )
    parser.add_argument(
        "--repeat-workloads",
        type=int,
        default=1,
        help="rounds of git, tar_x and the sqlite items (default: 1)",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON document to this file")
    parser.add_argument("--dir", type=Path, help="parent of the temporary directory")
    parser.add_argument("--mount-args", default="", help="more options for burstctl mount")
    args = parser.parse_args()
    args.only = [item.strip() for item in args.only.split(",") if item.strip()]
    unknown = [item for item in args.only if item not in ITEMS]
    if args.repeat < 1 or args.repeat_workloads < 1:
        parser.error("--repeat and --repeat-workloads must be at least 1")
    if unknown or not args.only:
        parser.error(f"--only: unknown item(s) {unknown}; choose from {', '.join(ITEMS)}")
    with tempfile.TemporaryDirectory(prefix="burstctl-metadata-", dir=args.dir) as tmp:
        result = run(args, Path(tmp))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
