"""Checkpoints larger than the burst buffer: writers through a shim, the buffer drained as they go.

Starts a controller with ``--bb-capacity`` S and ``--pfs-bandwidth`` B (loopback ports, a
temporary state directory), a mount of a fresh BACKING with ``--stage-out PFS --evict
after-copy`` (``--shim exec``: a node agent over BACKING with the same options, the writers
under ``burstctl exec``), and one ``dd if=SRC of=MNT/jobN/fN bs=1M conv=fsync`` per file of
``--files`` (MiB each), each as its own job, all at once. Samples every 100 ms the buffer's
used space (Σ st_blocks · 512 over BACKING) and every 0.5 s the controller's ``drained`` bytes
(GET /v1/capacity).

Prints one JSON object: whether every writer completed (``completed``; a writer still running
after ``--timeout`` seconds is reported with the bytes it had written, then killed), the
writers' seconds, the peak of the buffer's used space against S + 16 MiB, the drain's rate
while the writers were active (from the first drained byte to the last writer's exit) as a
fraction of B, and whether every file is byte-identical on the PFS and through the mount.
``--python`` runs the controller and the mount with another interpreter (e.g. the venv of an
older checkout) to compare two versions on the same machine. Everything it starts is stopped by
pid; the mount point is unmounted by path if it is left over.

    python bench/bb_large.py [--files 150,150,150] [--bb-capacity 200MiB]
        [--pfs-bandwidth 40MiB/s] [--timeout 120] [--shim mount|exec] [--python PYTHON]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from mount_sessions import _SERVING, Child, code_version, mounted, wait_for

MiB = 1 << 20
_HTTP = "serving REST on "


def make_source(path: Path, mib: int, seed: int) -> str:
    """``mib`` MiB of distinct seeded blocks; their sha256."""
    h = hashlib.sha256()
    base = hashlib.sha256(str(seed).encode()).digest() * (MiB // 32)
    with open(path, "wb") as f:
        for n in range(mib):
            block = n.to_bytes(8, "little") + base[8:]
            h.update(block)
            f.write(block)
    return h.hexdigest()


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


def shown_digest(prefix: list[str], path: Path, env: dict[str, str]) -> str:
    """The sha256 of ``path`` as a program under the shim reads it (the mount: directly)."""
    if not prefix:
        return digest(path)
    script = "import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())"
    return subprocess.run(
        [*prefix, sys.executable, "-c", script, str(path)],
        env=env, capture_output=True, text=True, check=True, timeout=120,
    ).stdout.strip()  # fmt: skip


def allocated(root: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


class Samples(threading.Thread):
    """The buffer's used space every 100 ms, the controller's drained bytes every 0.5 s."""

    def __init__(self, backing: Path, url: str) -> None:
        super().__init__(daemon=True)
        self.backing, self.url = backing, url
        self.used: list[int] = []
        self.drained: list[tuple[float, int]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        tick = 0
        while not self.halt.wait(0.1):
            self.used.append(allocated(self.backing))
            tick += 1
            if tick % 5 == 0:
                try:
                    jobs = httpx.get(f"{self.url}/v1/capacity", timeout=2).json()["jobs"]
                except (httpx.HTTPError, KeyError, ValueError):
                    continue
                self.drained.append((time.monotonic(), sum(j["drained"] for j in jobs)))


def kill_stuck(writers: list[subprocess.Popen[bytes]], mount: Child) -> bool | None:
    """SIGKILLs the writers still running after the timeout: whether they were all gone within
    1 s (None: none was left). Those that were not (stuck in the mount) are freed by killing
    the mount daemon."""
    stuck = [w for w in writers if w.poll() is None]
    if not stuck:
        return None
    for w in stuck:
        w.kill()  # by pid: only what this benchmark started
    deadline = time.monotonic() + 1.0
    while any(w.poll() is None for w in stuck) and time.monotonic() < deadline:
        time.sleep(0.02)  # polling the writers with the deadline above
    gone = all(w.poll() is not None for w in stuck)
    if not gone:
        mount.proc.kill()  # the daemon's death ends the requests its writers wait on
        for w in stuck:
            w.wait(30)
    return gone


def run(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BURSTCTL_", "SLURM_"))}
    backing, mnt, pfs, src = tmp / "backing", tmp / "mnt", tmp / "pfs", tmp / "src"
    for d in (backing, mnt, pfs, src):
        d.mkdir()
    files = [int(x) for x in args.files.split(",")]
    wanted = [make_source(src / f"f{n}", mib, n) for n, mib in enumerate(files)]
    loopback = ["--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]
    controller = Child(
        [args.python, "-m", "burstctl", "controller", *loopback, "--state-dir", str(tmp / "st"),
         "--capacity", "1GiB/s", "--node-bandwidth", "1GiB/s",
         "--bb-capacity", args.bb_capacity, "--pfs-bandwidth", args.pfs_bandwidth],
        stdout=subprocess.DEVNULL, env=env, cwd=tmp,
    )  # fmt: skip
    mount: Child | None = None
    writers: list[subprocess.Popen[bytes]] = []
    samples: Samples | None = None
    try:
        wait_for(lambda: _SERVING.search(controller.text), 30, "the controller", controller)
        address = _SERVING.search(controller.text).group(1)  # type: ignore[union-attr]
        wait_for(lambda: _HTTP in controller.text, 30, "the controller's HTTP", controller)
        url = controller.text.split(_HTTP, 1)[1].split()[0]
        drain = ["--controller", address, "--stage-out", str(pfs), "--evict", "after-copy"]
        if args.shim == "mount":
            mount = Child(
                [args.python, "-m", "burstctl", "mount", str(backing), str(mnt), "--foreground",
                 *drain],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env, cwd=tmp,
            )  # fmt: skip
            wait_for(lambda: mounted(mnt) and "mounted " in mount.text, 30, "the mount", mount)
            prefix: list[str] = []
        else:  # the node agent over BACKING itself; the writers under `burstctl exec`
            sock = tmp / "agent.sock"
            mount = Child(
                [args.python, "-m", "burstctl", "agent", "--socket", str(sock),
                 "--paths", str(backing), *drain],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env, cwd=tmp,
            )  # fmt: skip
            wait_for(lambda: "agent listening" in mount.text, 30, "the agent", mount)
            mnt = backing
            prefix = [args.python, "-m", "burstctl", "exec", "--agent", str(sock), "--"]
        for n in range(len(files)):
            (mnt / f"job{n}").mkdir()
        samples = Samples(backing, url)
        samples.start()
        started = time.monotonic()
        for n in range(len(files)):
            writers.append(
                subprocess.Popen(
                    [*prefix, "dd", f"if={src / f'f{n}'}", f"of={mnt / f'job{n}' / f'f{n}'}",
                     "bs=1M", "conv=fsync", "status=none"],
                    env={**env, "SLURM_JOB_ID": f"big-{n}", "SLURM_NNODES": "1"},
                )
            )  # fmt: skip
        deadline = started + args.timeout
        while any(w.poll() is None for w in writers) and time.monotonic() < deadline:
            time.sleep(0.1)  # polling the writers with the deadline above
        written = time.monotonic() - started
        completed = all(w.poll() == 0 for w in writers)
        progress = [
            (backing / f"job{n}" / f"f{n}").stat().st_size // MiB for n in range(len(files))
        ]
        killed = kill_stuck(writers, mount)
        identical = None
        if completed:
            wait_for(
                lambda: all(
                    (pfs / f"job{n}" / f"f{n}").is_file()
                    and (pfs / f"job{n}" / f"f{n}").stat().st_size == mib * MiB
                    for n, mib in enumerate(files)
                ),
                args.timeout,
                "every file on the PFS",
                mount,
            )
            identical = all(
                digest(pfs / f"job{n}" / f"f{n}") == wanted[n]
                and shown_digest(prefix, mnt / f"job{n}" / f"f{n}", env) == wanted[n]
                for n in range(len(files))
            )
        samples.halt.set()
        samples.join()
        end = started + written
        active = [(t, d) for t, d in samples.drained if d > 0 and t <= end]
        rate = None
        if len(active) >= 2:
            (t0, d0), (t1, d1) = active[0], active[-1]
            rate = (d1 - d0) / (t1 - t0) if t1 > t0 else None
        from burstctl.common.units import parse_rate, parse_size

        size, bandwidth = parse_size(args.bb_capacity), parse_rate(args.pfs_bandwidth)
        peak = max(samples.used, default=0)
        return {
            "benchmark": "bb_large",
            "code": code_version(args.python, tmp),
            "shim": args.shim,
            "files_mib": files,
            "bb_capacity_mib": size / MiB,
            "pfs_bandwidth_mib_s": bandwidth / MiB,
            "completed": completed,
            "written_mib_at_end": progress,
            "stuck_writers_killed_within_1s": killed,
            "writers_seconds": round(written, 2),
            "peak_used_mib": round(peak / MiB, 1),
            "bound_mib": (size + 16 * MiB) / MiB,
            "within_bound": peak <= size + 16 * MiB,
            "drain_mib_s_while_writing": None if rate is None else round(rate / MiB, 2),
            "drain_of_bandwidth": None if rate is None else round(rate / bandwidth, 3),
            "identical": identical,
        }
    finally:
        if samples is not None:
            samples.halt.set()
        for writer in writers:
            if writer.poll() is None:
                writer.kill()  # by pid: only what this benchmark started
                writer.wait(10)
        if mount is not None:
            mount.stop()
        if args.shim == "mount" and mounted(mnt):
            subprocess.run(["fusermount", "-u", "-z", str(mnt)], check=False)
        controller.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", default="150,150,150", help="MiB per file, one job each")
    parser.add_argument("--bb-capacity", default="200MiB")
    parser.add_argument("--pfs-bandwidth", default="40MiB/s")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument(
        "--shim", choices=("mount", "exec"), default="mount", help="the FUSE mount, or the agent"
    )
    parser.add_argument("--python", default=sys.executable, help="runs controller and mount")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="burstctl-bb-large-") as tmp:
        print(json.dumps(run(args, Path(tmp))))


if __name__ == "__main__":
    main()
