"""DPSAC decision time per tick, and the mount's drain engine against ``cp``.

**Decisions.** For 10, 100 and 1,000 applications (``--apps``), the live ``dpsac`` policy
(`policies/dpsac/live.py`) decides on views with a burst buffer (S = 300 GB, B = 100 GB/s as
in [DPSAC] §5.1, scaled to the job count), the applications drawn from the mix of [DPSAC]
Table 1 (I/O-phase lengths 20–280 s, caps 80–160 GB/s, declared periods), half of them in
an I/O phase at each tick and the buffer's resident bytes random. Reported per size and
updater: the first decision (clustering, partition, Dist built), the steady decision per
tick (p50, p99, max over ``--ticks`` ticks), and a decision after one join and one exit.
[DPSAC] §5.3 attributes DPSAC's dilation to the scheduler's own time; this is that time here.

**Drain.** With ``--drain``: a controller (``--pfs-bandwidth`` unset: drains unpaced, so the
engine's own speed is measured) and real mounts; the files (``--drain-files`` ×
``--drain-mib``) are written through a mount without stage-out, then a mount with
``--stage-out --evict keep`` drains them from its start (`drain`), and the time until the
last copy is on the PFS directory is compared with ``cp`` + ``sync -f`` of the same files
between the same two directories, same run. Needs /dev/fuse and libfuse.

Prints JSON.

    python bench/dpsac_speed.py [--apps 10 100 1000] [--ticks 200] [--drain]
                                [--drain-files 8] [--drain-mib 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from burstctl.policies.dpsac.live import DpsacParams, DpsacPolicy
from burstctl.policies.view import BufferView, JobView, Periodic, SystemView

GB = 1e9
# [DPSAC] Table 1 (and the ×5/×10 variants of §5.2): (cap B_i, checkpoint seconds, period s)
MIX = [
    (160 * GB, 20.0, 5671.0),
    (80 * GB, 25.0, 12682.0),
    (160 * GB, 280.0, 15005.0),
    (160 * GB, 23.4, 4483.0),
    (160 * GB, 100.0, 5671.0),
    (80 * GB, 125.0, 12682.0),
    (160 * GB, 200.0, 5671.0),
]


def _apps(n: int, rng: random.Random) -> list[tuple[str, float, float, float]]:
    return [(f"app{i:04d}", *rng.choice(MIX)) for i in range(n)]


def _view(
    apps: list[tuple[str, float, float, float]], now: float, rng: random.Random
) -> SystemView:
    scale = max(1.0, len(apps) / 10)  # the paper's platform per ten applications
    capacity = 100 * GB * scale
    jobs: dict[str, JobView] = {}
    periodic: dict[str, Periodic] = {}
    resident: dict[str, float] = {}
    for index, (job_id, cap, length, period) in enumerate(apps):
        active = rng.random() < 0.5
        jobs[job_id] = JobView(
            job_id,
            "user",
            "group",
            nodes=int(cap / GB),
            priority=1.0,
            cap=cap,
            demand=cap if active else 0.0,
            posted_at=now - 1.0 if active else None,
            released_at=0.0,
            progress=now * 0.9,
            index=index,
        )
        periodic[job_id] = Periodic(int(cap / GB), period - length, cap * length)
        if rng.random() < 0.3:
            resident[job_id] = rng.uniform(0, 2 * GB)
    size = 300 * GB * scale
    used = min(size, sum(resident.values()))
    buffer = BufferView(size, used, 100 * GB * scale, resident, resident)
    return SystemView(now, capacity, GB, jobs, seed=7, periodic=periodic, buffer=buffer)


def decisions(n: int, ticks: int, updater: str, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    apps = _apps(n, rng)
    policy = DpsacPolicy(DpsacParams(updater=updater))  # type: ignore[arg-type]
    now = 1000.0
    t0 = time.perf_counter()
    policy.allocate(_view(apps, now, rng))
    first = time.perf_counter() - t0
    steady = []
    for _ in range(ticks):
        now += 1.0
        view = _view(apps, now, rng)
        t0 = time.perf_counter()
        policy.allocate(view)
        steady.append(time.perf_counter() - t0)
    churn = []
    for k in range(max(10, ticks // 10)):
        apps.pop(rng.randrange(len(apps)))
        apps.append((f"new{k:04d}", *rng.choice(MIX)))
        now += 1.0
        view = _view(apps, now, rng)
        t0 = time.perf_counter()
        policy.allocate(view)
        churn.append(time.perf_counter() - t0)
    steady.sort()
    return {
        "apps": n,
        "updater": updater,
        "first_ms": round(first * 1e3, 3),
        "tick_p50_ms": round(statistics.median(steady) * 1e3, 3),
        "tick_p99_ms": round(steady[min(len(steady) - 1, int(0.99 * len(steady)))] * 1e3, 3),
        "tick_max_ms": round(steady[-1] * 1e3, 3),
        "join_exit_mean_ms": round(statistics.mean(churn) * 1e3, 3),
        "clusters": len(policy.clustering),
    }


def _wait(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.01)


def drain(files: int, mib: int) -> dict[str, object]:
    """The drain engine's copy throughput against ``cp`` of the same files.

    The files are written through a first mount without ``--stage-out`` (each tagged with its
    job); a second mount with ``--stage-out --evict keep`` finds them at its start (the scan
    that resumes copies after a restart) and drains them: the time from its start to the last
    file complete on the PFS is the engine's alone, not shared with the writes. ``cp`` then
    copies the same files between the same two directories, followed by ``sync -f`` (the
    engine fsyncs every copy)."""
    from support import ControllerProcess, MountProcess  # tests/support.py

    base = Path(tempfile.mkdtemp(prefix="burstctl-drain-"))
    backing, mnt, pfs, cp_dst = base / "bb", base / "mnt", base / "pfs", base / "cp"
    for d in (backing, mnt, pfs, cp_dst):
        d.mkdir()
    controller = ControllerProcess(base / "state", ("--bb-capacity", "64GiB"), "127.0.0.1:0")
    controller.start()
    names = [f"f{i}" for i in range(files)]
    total = files * mib * (1 << 20)
    try:
        writer = MountProcess(backing, mnt, ("--controller", str(controller.address)), {})
        writer.start()
        try:
            block = os.urandom(1 << 20)
            for name in names:
                with open(mnt / name, "wb") as f:
                    for _ in range(mib):
                        f.write(block)
        finally:
            writer.stop()
        subprocess.run(["sync", "-f", str(backing)], check=True)
        t0 = time.monotonic()
        drainer = MountProcess(
            backing,
            mnt,
            ("--controller", str(controller.address), "--stage-out", str(pfs), "--evict", "keep"),
            {},
        )
        drainer.start()
        mounted_s = time.monotonic() - t0
        try:
            _wait(
                lambda: all(
                    (pfs / n).exists() and (pfs / n).stat().st_size == mib << 20 for n in names
                ),
                600,
                "drain",
            )
            drain_s = time.monotonic() - t0
        finally:
            drainer.stop()
        t0 = time.monotonic()
        subprocess.run(["cp", *[str(backing / n) for n in names], str(cp_dst)], check=True)
        subprocess.run(["sync", "-f", str(cp_dst)], check=True)
        cp_s = time.monotonic() - t0
        return {
            "files": files,
            "mib_each": mib,
            "drain_s_with_mount_start": round(drain_s, 3),
            "mount_start_s": round(mounted_s, 3),
            "drain_mib_s": round(total / drain_s / (1 << 20), 1),
            "drain_mib_s_after_mount": round(total / (drain_s - mounted_s) / (1 << 20), 1),
            "cp_and_sync_s": round(cp_s, 3),
            "cp_mib_s": round(total / cp_s / (1 << 20), 1),
            "drain_of_cp": round(cp_s / drain_s, 3),
        }
    finally:
        controller.stop()
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--ticks", type=int, default=200)
    parser.add_argument("--updater", nargs="+", default=["st", "dt", "ok"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--drain", action="store_true", help="also time the drain engine")
    parser.add_argument("--drain-files", type=int, default=8)
    parser.add_argument("--drain-mib", type=int, default=64)
    args = parser.parse_args()
    out: dict[str, object] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "decisions": [
            decisions(n, args.ticks, u, args.seed) for n in args.apps for u in args.updater
        ],
    }
    if args.drain:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        out["drain"] = drain(args.drain_files, args.drain_mib)
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
