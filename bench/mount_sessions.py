"""Threads and memory of a mount daemon that speaks for many jobs at once.

Starts a controller (``burstctl controller`` on loopback ports, a temporary state directory, a
capacity far above what this machine moves, so allocations never bind) and a real mount at it,
then ``--jobs`` writer processes, each with its own ``BURSTCTL_JOB_ID``. Every writer opens its
file through the mount and writes one chunk (its job's session opens), says so, and waits; once
all of them have, they write ``--writes`` more chunks each, close and exit. The mount daemon's
thread count and RSS (psutil) are sampled all along.

Prints one JSON object: the daemon's threads and RSS (MiB) once mounted, with every job's
session open (``all_sessions_open``), the peak over the run, right after the writers exited
(sessions still open), and after every session was closed for idleness (``--session-idle``).

``--python`` runs the controller and the mount with another interpreter, e.g. the venv of an
older checkout, to compare two versions of the code with the same benchmark. Everything the
benchmark starts is stopped by pid; the mount point is unmounted by path if it is left over.

    python bench/mount_sessions.py [--jobs 200] [--writes 8] [--chunk 256KiB]
        [--session-idle 20] [--python PYTHON] [--mount-args="..."]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

MiB = 1 << 20
_SERVING = re.compile(r"serving gRPC on (\S+)")

# One job: opens its file, writes a chunk, says "ready", waits for "go", writes the rest.
WRITER = r"""
import os, sys
path, chunk, writes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = b"x" * chunk
fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
os.write(fd, data)
print("ready", flush=True)
if sys.stdin.readline() != "go\n":
    sys.exit(1)
for _ in range(writes):
    os.write(fd, data)
os.close(fd)
"""


class Child:
    """A child process whose stderr is collected; stopped by pid."""

    def __init__(self, cmd: list[str], **popen: object) -> None:
        self.log: list[str] = []
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, **popen)  # type: ignore[call-overload]
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    @property
    def text(self) -> str:
        return "".join(self.log)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self._drainer.join(timeout)
        return self.proc.returncode


def wait_for(predicate: object, timeout: float, what: str, child: Child | None = None) -> None:
    """Polls ``predicate`` until it holds; exits with the child's log after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline or (child is not None and child.proc.poll() is not None):
            log = "" if child is None else "".join(child.log[-30:])
            raise SystemExit(f"timed out waiting for {what}\n{log}")
        time.sleep(0.02)  # polling with the deadline above


def mounted(path: Path) -> bool:
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
        return any(len(fields) > 1 and fields[1] == str(path) for fields in map(str.split, f))


class Sampler:
    """Samples a process's thread count and RSS every ``interval`` seconds in a thread."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.ps = psutil.Process(pid)
        self.interval = interval
        self.peak_threads = 0
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self) -> dict[str, float]:
        threads, rss = self.ps.num_threads(), self.ps.memory_info().rss
        self.peak_threads = max(self.peak_threads, threads)
        self.peak_rss = max(self.peak_rss, rss)
        return {"threads": threads, "rss_mib": round(rss / MiB, 1)}

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.now()
            except psutil.Error:
                return

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        return {"threads": self.peak_threads, "rss_mib": round(self.peak_rss / MiB, 1)}


def code_version(python: str, cwd: Path) -> str:
    """The commit of the burstctl that ``python`` imports (or where it lives)."""
    where = subprocess.run(
        [python, "-c", "import burstctl, os; print(os.path.dirname(burstctl.__file__))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
    ).stdout.strip()
    head = subprocess.run(
        ["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    dirty = subprocess.run(
        ["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    )
    if head.returncode != 0:
        return where
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def run(args: argparse.Namespace, tmp: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BURSTCTL_", "SLURM_"))}
    backing, mnt = tmp / "backing", tmp / "mnt"
    backing.mkdir()
    mnt.mkdir()
    loopback = ["--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]
    state = ["--state-dir", str(tmp / "state")]
    big = ["--capacity", "1TiB/s", "--node-bandwidth", "1TiB/s"]
    controller = Child(
        [args.python, "-m", "burstctl", "controller", *loopback, *state, *big],
        stdout=subprocess.DEVNULL,
        env=env,
        cwd=tmp,  # not a checkout: ``-m burstctl`` must import what ``--python`` has installed
    )
    mount: Child | None = None
    writers: list[subprocess.Popen[str]] = []
    try:
        wait_for(lambda: _SERVING.search(controller.text), 30, "the controller", controller)
        address = _SERVING.search(controller.text).group(1)  # type: ignore[union-attr]
        command = [args.python, "-m", "burstctl", "mount", str(backing), str(mnt), "--foreground"]
        options = ["--controller", address, "--session-idle", str(args.session_idle)]
        mount = Child(
            [*command, *options, *shlex.split(args.mount_args)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            cwd=tmp,
        )
        wait_for(lambda: mounted(mnt) and "mounted " in mount.text, 30, "the mount", mount)
        sampler = Sampler(mount.proc.pid)
        figures: dict[str, dict[str, float]] = {"mounted": sampler.now()}

        started = time.monotonic()
        sizes = [str(args.chunk), str(args.writes)]
        for i in range(args.jobs):
            writers.append(
                subprocess.Popen(
                    [sys.executable, "-c", WRITER, str(mnt / f"job{i}"), *sizes],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env={**env, "BURSTCTL_JOB_ID": f"job{i}"},
                )
            )
        for writer in writers:
            assert writer.stdout is not None
            if writer.stdout.readline() != "ready\n":
                raise SystemExit("a writer failed before its first write:\n" + mount.text[-3000:])
        opened = time.monotonic() - started
        wait_for(
            lambda: mount.text.count("session opened") >= args.jobs, 60, "every session", mount
        )
        figures["all_sessions_open"] = sampler.now()
        open_then = mount.text.count("session opened") - mount.text.count("session closed")
        closed_before = mount.text.count("session closed (quiet)")
        for writer in writers:
            assert writer.stdin is not None
            writer.stdin.write("go\n")
            writer.stdin.close()
        failed = sum(writer.wait(120) != 0 for writer in writers)
        wrote = time.monotonic() - started
        figures["after_writers"] = sampler.now()
        # Every job wrote after "go", so every job has a session to close now.
        wait_for(
            lambda: mount.text.count("session closed (quiet)") - closed_before >= args.jobs,
            args.session_idle + 60,
            "every session to close for idleness",
            mount,
        )
        figures["after_idle_close"] = sampler.now()
        figures["peak"] = sampler.stop()
        size = sum(p.stat().st_size for p in backing.iterdir())
        libfuse = re.search(r"libfuse (\d+\.\d+)", mount.text)
        return {
            "benchmark": "mount_sessions",
            "code": code_version(args.python, tmp),
            "libfuse": libfuse.group(1) if libfuse else None,
            "jobs": args.jobs,
            "writes_per_job": args.writes + 1,
            "chunk_bytes": args.chunk,
            "bytes_ok": size == args.jobs * (args.writes + 1) * args.chunk and failed == 0,
            "sessions_open_at_all_sessions_open": open_then,
            "seconds_to_all_ready": round(opened, 2),
            "seconds_to_all_written": round(wrote, 2),
            "daemon": figures,
        }
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()  # by pid: only what this benchmark started
                writer.wait(10)
            for pipe in (writer.stdin, writer.stdout):
                if pipe is not None and not pipe.closed:
                    pipe.close()
        if mount is not None:
            mount.stop()
        if mounted(mnt):
            subprocess.run(["fusermount", "-u", "-z", str(mnt)], check=False)
        controller.stop()


def main() -> None:
    from burstctl.common.units import parse_size

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--writes", type=int, default=8, help="chunks per job after the first")
    parser.add_argument("--chunk", type=parse_size, default=256 << 10)
    parser.add_argument(
        "--session-idle", type=float, default=20.0, help="longer than starting every writer"
    )
    parser.add_argument("--python", default=sys.executable, help="runs controller and mount")
    parser.add_argument("--mount-args", default="", help="more options for burstctl mount")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temporary dir")
    args = parser.parse_args()
    found = shutil.which(args.python)  # the children run elsewhere: an absolute path
    if found is None:
        parser.error(f"--python {args.python}: not found")
    args.python = os.path.abspath(found)
    with tempfile.TemporaryDirectory(prefix="burstctl-mount-sessions-", dir=args.dir) as tmp:
        print(json.dumps(run(args, Path(tmp)), indent=2))


if __name__ == "__main__":
    main()
