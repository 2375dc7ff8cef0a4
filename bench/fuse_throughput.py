"""FUSE shim overhead: fio through ``burstctl mount`` against fio directly on the backing store.

One backing directory, laid out once; the same fio workloads on the same files, run back to
back (interleaved per workload, so a slow spell of the machine hits every target alike):

- ``direct``: fio on BACKING itself;
- ``fuse``: fio on a mount of BACKING with no controller (every job unthrottled);
- ``fuse-controller``: fio on a mount at a real controller whose capacity is far above
  anything this machine can move (1 TiB/s), so the allocation never binds but every I/O still
  goes through the job's session and token bucket;
- ``fuse-null`` (``cached`` regime only): fio on a mount with the same options whose reads
  and writes move no data (bench/fuse_null_mount.py): the kernel's FUSE transport and the
  shim's request path alone, the ceiling for ``fuse`` on this machine.

Workloads (psync, one process, buffered ``direct=0``): sequential 1 MiB write and read of a
``--size`` file, and 4 KiB random read and write on a ``--rand-size`` file for ``--seconds``.

Page cache, two regimes, each applied the same way to every target (and every run starts with
no dirty pages: ``sync`` before it):

- ``cached``: the backing file's pages stay in the page cache (written data is not flushed;
  reads find it cached). Through the mount fio still invalidates the *mount's* pages of the
  file on open (``invalidate=1``), so every byte goes through the shim: this measures the
  shim's own cost against memory speed, the harshest comparison.
- ``device``: writes end with ``fsync`` (``end_fsync=1``) and, before each read run, the
  backing file is flushed and dropped from the page cache (``posix_fadvise(DONTNEED)``, this
  file only) as well as the mount's pages: every byte comes from or goes to the device.

For each run: MiB/s and IOPS as fio reports them, their ratio to ``direct``, and CPU seconds
per GiB moved, of fio's job process (its own usr/sys report) and of the mount process (psutil,
all its threads; ``mount_sys_share`` is the kernel's part of it). With ``--profile DIR``
each workload runs once more per mount (``cached``, for ``PROFILE_SECONDS``, not counted in
the figures) while py-spy samples the mount process (raw stacks in DIR; shares per category
and the top innermost frames in the JSON). ``--mount-args`` passes options to both mounts
(``--mount-args="-o direct_io"``); ``--launcher SCRIPT`` runs a script in place of
``python -m burstctl`` to measure an experimental variant of the shim without changing it.

Target: >= 80 % of direct for 1 MiB sequential. docs/benchmarks.md has figures.

    python bench/fuse_throughput.py [--size 1G] [--rand-size 256M] [--seconds 3]
        [--repeats 1] [--dir DIR] [--mount-args="..."] [--launcher SCRIPT] [--profile DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import psutil
from controller_events import start_controller
from fio_tools import FioRun, GiB, MiB, job_file, run_fio

TARGETS = ("direct", "fuse", "fuse-controller", "fuse-null")
NULL_MOUNT = Path(__file__).with_name("fuse_null_mount.py")
PROFILE_SECONDS = 8
REGIMES = ("cached", "device")
WORKLOADS = {
    # name: (rw, block size, direction fio reports, random?)
    "seq-write-1m": ("write", "1M", "write", False),
    "seq-read-1m": ("read", "1M", "read", False),
    "rand-read-4k": ("randread", "4k", "read", True),
    "rand-write-4k": ("randwrite", "4k", "write", True),
}


class Mount:
    """``burstctl mount BACKING MOUNTPOINT --foreground`` as a child process, stopped by pid."""

    def __init__(
        self,
        backing: Path,
        mountpoint: Path,
        args: Sequence[str],
        env: dict[str, str],
        launcher: Path | None = None,
    ):
        self.mountpoint = mountpoint
        mountpoint.mkdir(parents=True, exist_ok=True)
        self.log: list[str] = []
        entry = [str(launcher)] if launcher else ["-m", "burstctl"]
        cmd = [sys.executable, *entry, "mount", str(backing), str(mountpoint)]
        self.proc = subprocess.Popen(
            [*cmd, "--foreground", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + 30
        while not os.path.ismount(mountpoint):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit("burstctl mount did not come up:\n" + "".join(self.log[-30:]))
            time.sleep(0.01)  # polling the mount with a deadline
        self.ps = psutil.Process(self.proc.pid)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def cpu_seconds(self) -> tuple[float, float]:
        """(user, system) CPU seconds of the mount process so far, all its threads."""
        times = self.ps.cpu_times()
        return times.user, times.system

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if os.path.ismount(self.mountpoint) or _listed(self.mountpoint):
            subprocess.run(["fusermount", "-u", "-z", str(self.mountpoint)], check=False)


def _listed(path: Path) -> bool:
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
        return any(line.split()[1] == str(path) for line in f if len(line.split()) > 1)


@dataclass
class Result:
    workload: str
    regime: str
    target: str
    mib_s: list[float] = field(default_factory=list)
    iops: list[float] = field(default_factory=list)
    fio_cpu_s_per_gib: list[float] = field(default_factory=list)
    mount_cpu_s_per_gib: list[float] = field(default_factory=list)
    mount_sys_share: list[float] = field(default_factory=list)

    def summary(self, direct: Result | None) -> dict[str, object]:
        out: dict[str, object] = {
            "workload": self.workload,
            "regime": self.regime,
            "target": self.target,
            "mib_s": _median(self.mib_s),
            "iops": _median(self.iops, 0),
            "runs_mib_s": [round(x, 1) for x in self.mib_s],
            "fio_cpu_s_per_gib": _median(self.fio_cpu_s_per_gib, 3),
        }
        if self.mount_cpu_s_per_gib:
            out["mount_cpu_s_per_gib"] = _median(self.mount_cpu_s_per_gib, 3)
            out["mount_sys_share"] = _median(self.mount_sys_share, 2)
            out["total_cpu_s_per_gib"] = round(
                statistics.median(self.fio_cpu_s_per_gib)
                + statistics.median(self.mount_cpu_s_per_gib),
                3,
            )
        if direct is not None and direct.mib_s:
            out["of_direct"] = round(
                statistics.median(self.mib_s) / statistics.median(direct.mib_s), 3
            )
        return out


def _median(xs: list[float], digits: int = 1) -> float:
    return round(statistics.median(xs), digits)


def _evict(path: Path) -> None:
    """Flushes ``path`` and drops its pages from the page cache (this file only)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _warm(path: Path) -> None:
    """Reads ``path`` once so that its pages are cached."""
    with open(path, "rb", buffering=0) as f:
        while f.read(8 * MiB):
            pass


def _workload_job(
    directory: Path,
    name: str,
    regime: str,
    own_cache: bool,
    args: argparse.Namespace,
    profiling: bool = False,
) -> str:
    """fio's job for one cell; ``own_cache``: the target reads BACKING's own pages (direct),
    so a cached run keeps them instead of invalidating them on open."""
    rw, bs, _, random_io = WORKLOADS[name]
    filename = "rand.dat" if random_io else "seq.dat"
    options: dict[str, object] = {
        "ioengine": "psync",
        "direct": 0,
        "filename": str(directory / filename),
        "rw": rw,
        "bs": bs,
        "size": args.rand_size if random_io else args.size,
        "fallocate": "none",
        # direct in the cached regime keeps the warm backing pages; anything through the mount
        # drops the mount's own pages on open so the shim serves every byte
        "invalidate": 0 if (own_cache and regime == "cached") else 1,
    }
    if random_io:
        options.update({"time_based": 1, "runtime": args.seconds, "randrepeat": 1})
    if profiling:  # long enough for a few thousand samples
        options.update({"time_based": 1, "runtime": PROFILE_SECONDS})
    if rw in ("write", "randwrite") and regime == "device":
        options["end_fsync"] = 1
    return job_file(options, [(name, {})])


class Profiler:
    """py-spy sampling the mount process's Python threads while one fio run lasts.

    Idle samples are kept (a thread inside ``os.pwrite`` counts as idle to py-spy) and the
    process is not stopped to sample (no ``--native``: stopping it at every sample slowed a 4 KiB
    random-write run 5×). Only threads with a Python frame are seen: a libfuse worker waiting on
    ``/dev/fuse`` between requests is not, so shares are of the time spent serving requests.
    """

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        self.proc = subprocess.Popen(
            [
                *(py_spy, "record", "--pid", str(pid), "--rate", "500", "--format", "raw"),
                *("--idle", "--nonblocking", "--output", str(out)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> dict[str, object]:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        summary = summarize_profile(self.out)
        if "error" in summary and self.proc.stderr is not None:
            summary["error"] = f"{summary['error']}: {self.proc.stderr.read().strip()[-500:]}"
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return summary


# Where a sample inside a FUSE callback goes: the first category any frame of the callback's
# stack matches, else by its innermost frame, else "Python dispatch".
CATEGORIES = (
    ("getxattr (security.capability, once per write call)", ("getxattr",)),
    ("pacing (session, token bucket)", ("node/pacer.py", "node/sessions.py", "client/")),
    ("attribution (pid -> job)", ("node/attribution.py", "._caller (")),
)
LEAVES = (
    # PassthroughFS.read/write spend their time in os.preadv/os.pwrite (the rest is a test)
    ("pread/pwrite on BACKING", ("PassthroughFS.read (", "PassthroughFS.write (", "pwrite64")),
    # copies of data between Python and libfuse's buffers
    ("ctypes copies of the data", ("string_at (", "memmove")),
)
DISPATCH = "Python dispatch (the binding's callbacks, errno barrier, the rest)"
# The frames of the binding's C-callable callbacks: a sample is inside a FUSE request from the
# first of them on.
CALLBACKS = "fuse_shim/_fuse/callbacks.py"


def summarize_profile(path: Path, top: int = 10) -> dict[str, object]:
    """Shares of the samples taken inside FUSE callbacks (`CATEGORIES`, `LEAVES`), and the top
    innermost frames, from py-spy's collapsed stacks."""
    categories: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    samples = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {"error": f"no profile at {path}"}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if CALLBACKS not in stack or not count.isdigit():
            continue  # the signal watcher, the main thread parked in libfuse's loop
        n = int(count)
        samples += n
        callback = stack[stack.rfind(";", 0, stack.index(CALLBACKS)) + 1 :]
        leaf = callback.rsplit(";", 1)[-1]
        leaves[leaf] += n
        name = next((c for c, keys in CATEGORIES if any(k in callback for k in keys)), None)
        name = name or next((c for c, keys in LEAVES if any(k in leaf for k in keys)), DISPATCH)
        categories[name] += n

    def shares(counter: collections.Counter[str], k: int | None = None) -> list[list[object]]:
        return [[f, round(c / samples, 3)] for f, c in counter.most_common(k)]

    return {"samples": samples, "categories": shares(categories), "leaves": shares(leaves, top)}


class ExtraTarget(Protocol):
    """A target another benchmark adds to the same run (bench/preload_throughput.py): fio runs
    in ``mountpoint`` with ``env`` on top of the run's; ``cpu_seconds`` is its daemon's CPU;
    ``shares_cache``: it reads BACKING's own pages (a cached run keeps them warm, as direct)."""

    mountpoint: Path
    env: dict[str, str]
    shares_cache: bool

    def cpu_seconds(self) -> tuple[float, float]: ...

    def stop(self) -> None: ...


# Builds an extra target from (root, backing, the run's environment); stopped by `run`.
ExtraFactory = Callable[[Path, Path, dict[str, str]], ExtraTarget]


def run(
    args: argparse.Namespace, extra_targets: Mapping[str, ExtraFactory] | None = None
) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="fuse-bench-", dir=args.dir))
    backing = root / "backing"
    backing.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BURSTCTL_", "SLURM_"))}
    env.update({"SLURM_JOB_ID": "bench", "SLURM_NNODES": "1"})
    controller = mounts = None
    extras: dict[str, ExtraTarget] = {}
    results: dict[tuple[str, str, str], Result] = {}
    profiles: dict[str, object] = {}
    try:
        # lay the files out once, directly
        for name, size in (("seq.dat", args.size), ("rand.dat", args.rand_size)):
            layout = {"filename": str(backing / name), "rw": "write", "bs": "1M", "size": size}
            _check(run_fio(root / f"layout-{name}", job_file(layout, [("layout", {})])))
        extra = shlex.split(args.mount_args)
        mounts = {}
        if "fuse" in args.targets:
            mounts["fuse"] = Mount(backing, root / "mnt-fuse", extra, env, args.launcher)
        if "fuse-null" in args.targets:
            mounts["fuse-null"] = Mount(backing, root / "mnt-null", extra, env, NULL_MOUNT)
        if "fuse-controller" in args.targets:
            controller, address, _ = start_controller(
                str(root / "state"),
                ["--capacity", "1TiB/s", "--node-bandwidth", "1TiB/s", "--policy", "fair-share"],
            )
            mounts["fuse-controller"] = Mount(
                backing, root / "mnt-ctl", ["--controller", address, *extra], env, args.launcher
            )
        for name, factory in (extra_targets or {}).items():
            if name in args.targets:
                extras[name] = factory(root, backing, env)
        daemons: dict[str, Mount | ExtraTarget] = {**mounts, **extras}
        dirs = {"direct": backing} | {t: m.mountpoint for t, m in daemons.items()}
        for repeat in range(args.repeats):
            for regime in args.regimes:
                for name in args.workloads:
                    _, _, ddir, random_io = WORKLOADS[name]
                    data = backing / ("rand.dat" if random_io else "seq.dat")
                    for target in args.targets:
                        if target == "fuse-null" and regime != "cached":
                            continue  # its writes never reach the device
                        if ddir == "read":
                            _warm(data) if regime == "cached" else _evict(data)
                        # Every run starts with no dirty pages, so none pays for the write-back
                        # of the one before it (writes that hit the kernel's dirty limits).
                        os.sync()
                        mount = daemons.get(target)
                        cpu0 = mount.cpu_seconds() if mount else (0.0, 0.0)
                        tag = f"{name}-{regime}-{target}"
                        extra_target = extras.get(target)
                        own_cache = target == "direct" or bool(
                            extra_target and extra_target.shares_cache
                        )
                        fio = run_fio(
                            root / f"run-{repeat}-{tag}",
                            _workload_job(dirs[target], name, regime, own_cache, args),
                            env={**env, **(extra_target.env if extra_target else {})},
                        )
                        _check(fio)
                        moved = fio.moved(ddir) / GiB
                        r = results.setdefault((name, regime, target), Result(name, regime, target))
                        r.mib_s.append(fio.bandwidth(ddir) / MiB)
                        r.iops.append(fio.iops(ddir))
                        r.fio_cpu_s_per_gib.append(fio.job_cpu_seconds() / moved)
                        if mount:
                            cpu1 = mount.cpu_seconds()
                            user, system = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
                            r.mount_cpu_s_per_gib.append((user + system) / moved)
                            r.mount_sys_share.append(system / max(user + system, 1e-9))
                        print(f"{tag}: {r.mib_s[-1]:.0f} MiB/s", file=sys.stderr)
        if args.profile:
            # Extra runs, not counted above: py-spy pauses the mount at every sample.
            args.profile.mkdir(parents=True, exist_ok=True)
            for name in args.workloads:
                _, _, ddir, random_io = WORKLOADS[name]
                for target, mount in mounts.items():
                    if target == "fuse-null":
                        continue
                    if ddir == "read":
                        _warm(backing / ("rand.dat" if random_io else "seq.dat"))
                    tag = f"{name}-cached-{target}"
                    profiler = Profiler(mount.proc.pid, args.profile / f"{tag}.txt")
                    job = _workload_job(dirs[target], name, "cached", False, args, profiling=True)
                    fio = run_fio(root / f"profile-{tag}", job, env=env)
                    profiles[tag] = {"mib_s_while_sampled": round(fio.bandwidth(ddir) / MiB, 1)}
                    profiles[tag].update(profiler.stop())
                    _check(fio)
    finally:
        for mount in [*(mounts or {}).values(), *extras.values()]:
            mount.stop()
        if controller is not None:
            controller.terminate()
            controller.wait(10)
        shutil.rmtree(root, ignore_errors=True)
    rows = [
        r.summary(results.get((r.workload, r.regime, "direct")) if r.target != "direct" else None)
        for r in results.values()
    ]
    return {
        "benchmark": "fuse_throughput",
        "size": args.size,
        "rand_size": args.rand_size,
        "seconds": args.seconds,
        "repeats": args.repeats,
        "mount_args": args.mount_args,
        "launcher": str(args.launcher) if args.launcher else None,
        "load_average": os.getloadavg(),
        "results": rows,
        "profiles": profiles,
    }


def _check(fio: FioRun) -> None:
    if fio.errors():
        raise SystemExit(f"fio failed in {fio.workdir}: {fio.errors()}")


def arguments(
    description: str, targets: Sequence[str], default_targets: Sequence[str]
) -> argparse.ArgumentParser:
    """The command line of this benchmark, with ``targets`` to choose from."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--size", default="1G", help="sequential file size (fio syntax)")
    parser.add_argument("--rand-size", default="256M", help="random-I/O file size (fio syntax)")
    parser.add_argument("--seconds", type=float, default=3.0, help="random-I/O run length")
    parser.add_argument("--repeats", type=int, default=1, help="runs per cell; medians reported")
    parser.add_argument("--dir", type=Path, help="where to make BACKING (default: the temp dir)")
    parser.add_argument(
        "--mount-args", default="", help='more arguments for both mounts, e.g. "-o direct_io"'
    )
    parser.add_argument(
        "--launcher",
        type=Path,
        help="a Python script run instead of `-m burstctl` for the mounts (same arguments): "
        "to measure an experimental variant of the shim without changing it",
    )
    parser.add_argument("--profile", type=Path, help="write py-spy profiles of the mount here")
    parser.add_argument("--targets", nargs="+", choices=targets, default=list(default_targets))
    parser.add_argument("--regimes", nargs="+", choices=REGIMES, default=list(REGIMES))
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = arguments(__doc__.splitlines()[0], TARGETS, TARGETS).parse_args(argv)
    if "direct" not in args.targets:
        args.targets.insert(0, "direct")
    json.dump(run(args), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
