"""LD_PRELOAD shim overhead: fio under ``burstctl exec`` against fio directly and through the mount.

The same run as bench/fuse_throughput.py (one BACKING, laid out once; the same fio workloads on
the same files, interleaved per workload; the ``cached`` and ``device`` regimes), with one
more target:

- ``preload``: fio on BACKING itself under ``burstctl exec`` (the library from
  ``burstctl preload-path``), with a node agent (``burstctl agent --paths BACKING``) at a real
  controller whose capacity (1 TiB/s) never binds: every read and write is attributed to the
  job and draws from its shared page, but never waits. It reads BACKING's own pages, so a
  cached run keeps them warm, as ``direct`` does.

next to ``direct`` and ``fuse-controller`` (the mount at a controller of the same capacity).
``agent_cpu_s_per_gib`` is the agent process's CPU (psutil, all threads) per GiB fio moved.

Then the cost of one intercepted call, from a small C program (compiled here with gcc) that
times ``CALLS`` ``pwrite`` calls of 64 bytes at offset 0, run four ways, interleaved, medians
of ``--repeats``: a file outside the agent's paths without and with the library (the cost of
a call the library only looks at: ``unpaced_ns``) and a file under them without and with
the library (a paced call under its rate: count, reserve, no wait: ``paced_ns``).

Targets (issue 20): ``preload`` >= 90 % of ``direct`` for 1 MiB sequential in both regimes,
>= 80 % of ``direct`` IOPS for 4 KiB random. docs/benchmarks.md has figures.

    python bench/preload_throughput.py [--size 1G] [--rand-size 256M] [--seconds 3]
        [--repeats 1] [--dir DIR] [--targets direct preload fuse-controller] [--calls N]
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
from controller_events import start_controller
from fuse_throughput import arguments, run

CALLS = 2_000_000
TARGETS = ("direct", "preload", "fuse-controller", "fuse", "fuse-null")
DEFAULT_TARGETS = ("direct", "preload", "fuse-controller")
PER_CALL_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long calls = atol(argv[2]);
    char buf[64] = {0};
    int fd = open(argv[1], O_RDWR | O_CREAT, 0644);
    if (fd < 0) { perror("open"); return 1; }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < calls; i++)
        if (pwrite(fd, buf, sizeof buf, 0) != sizeof buf) { perror("pwrite"); return 1; }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.2f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / calls);
    return close(fd);
}
"""


def _burstctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "burstctl", *args]


# The controller of an agent whose allocations never bind.
UNLIMITED = ("--capacity", "1TiB/s", "--node-bandwidth", "1TiB/s", "--policy", "fair-share")


class Agent:
    """A controller (``controller_args``; by default 1 TiB/s) and ``burstctl agent --paths
    BACKING`` on it, as children stopped by pid; ``env`` is what ``burstctl exec`` adds to a
    command's environment."""

    shares_cache = True

    def __init__(
        self,
        root: Path,
        backing: Path,
        env: dict[str, str],
        controller_args: Sequence[str] = UNLIMITED,
    ) -> None:
        self.mountpoint = backing
        self.socket = root / "agent" / "agent.sock"
        self.controller, address, _ = start_controller(
            str(root / "agent-state"), list(controller_args)
        )
        self.log: list[str] = []
        self.proc = subprocess.Popen(
            _burstctl(
                "agent",
                *("--controller", address, "--paths", str(backing), "--socket", str(self.socket)),
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + 30
        while not _listening(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit("burstctl agent did not come up:\n" + "".join(self.log[-30:]))
            time.sleep(0.01)  # polling the socket with a deadline
        self.ps = psutil.Process(self.proc.pid)
        self.env = exec_env(self.socket, env)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def cpu_seconds(self) -> tuple[float, float]:
        times = self.ps.cpu_times()
        return times.user, times.system

    def stop(self) -> None:
        for proc in (self.proc, self.controller):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def exec_env(sock: Path, env: dict[str, str]) -> dict[str, str]:
    """The variables ``burstctl exec --agent SOCK`` sets (or changes) for its command."""
    out = subprocess.run(
        _burstctl("exec", "--agent", str(sock), "--", "env", "-0"),
        env=env,
        capture_output=True,
        check=True,
    ).stdout.decode()
    added = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    return {k: v for k, v in added.items() if env.get(k) != v}


def per_call(
    root: Path, agent: Agent, env: dict[str, str], calls: int, repeats: int
) -> dict[str, object]:
    """ns per 64-byte pwrite, outside and under the agent's paths, without and with the library
    (interleaved; medians), and the library's cost per call in each case."""
    program = root / "per_call"
    source = root / "per_call.c"
    source.write_text(PER_CALL_C)
    subprocess.run(["gcc", "-O2", "-o", str(program), str(source)], check=True)
    outside = root / "outside"
    outside.mkdir()
    files = {"outside": outside / "calls.dat", "paced": agent.mountpoint / "calls.dat"}
    times: dict[tuple[str, bool], list[float]] = {}
    for _ in range(repeats):
        for where, path in files.items():
            for preload in (False, True):
                run_env = {**env, **agent.env} if preload else env
                out = subprocess.run(
                    [str(program), str(path), str(calls)],
                    env=run_env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                times.setdefault((where, preload), []).append(float(out.stdout))
    med = {key: statistics.median(v) for key, v in times.items()}
    return {
        "calls": calls,
        "repeats": repeats,
        "ns_per_call": {
            f"{w}-{'preload' if p else 'plain'}": round(v, 1) for (w, p), v in med.items()
        },
        "unpaced_ns": round(med["outside", True] - med["outside", False], 1),
        "paced_ns": round(med["paced", True] - med["paced", False], 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = arguments(__doc__.splitlines()[0], TARGETS, DEFAULT_TARGETS)
    parser.add_argument("--calls", type=int, default=CALLS, help="pwrite calls per timing")
    args = parser.parse_args(argv)
    if "direct" not in args.targets:
        args.targets.insert(0, "direct")
    agents: list[Agent] = []

    def make_agent(root: Path, backing: Path, env: dict[str, str]) -> Agent:
        agents.append(Agent(root, backing, env))
        return agents[-1]

    result = run(args, {"preload": make_agent})
    result["benchmark"] = "preload_throughput"
    for row in result["results"]:  # type: ignore[union-attr]
        if row["target"] == "preload":
            for old, new in (("mount_cpu_s_per_gib", "agent_cpu_s_per_gib"),):
                if old in row:
                    row[new] = row.pop(old)
            row.pop("mount_sys_share", None)
    # The per-call costs, with an agent of their own (run() has stopped its targets).
    root = Path(tempfile.mkdtemp(prefix="preload-calls-", dir=args.dir))
    backing = root / "backing"
    backing.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BURSTCTL_", "SLURM_"))}
    env.update({"SLURM_JOB_ID": "bench", "SLURM_NNODES": "1"})
    agent = Agent(root, backing, env)
    try:
        result["per_call"] = per_call(root, agent, env, args.calls, max(3, args.repeats))
    finally:
        agent.stop()
        shutil.rmtree(root, ignore_errors=True)
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
