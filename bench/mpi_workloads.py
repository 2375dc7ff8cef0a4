"""MPI-IO and HDF5 through both shims: the workloads of bench/workloads/ under ``mpirun``.

Per target: ``plain`` (a directory, no burstctl), ``mount`` (``burstctl mount`` at a controller
of 1 TiB/s, which never binds) and ``exec`` (``burstctl exec -- mpirun ...``, the library in
every rank, a node agent at such a controller), the IOR-like workload (N-1 and N-N files,
collective and independent MPI-IO, ``--block`` x ``--segments`` per rank and run) and the
per-rank h5py checkpoint (``--h5-size`` per rank): per run the seconds and MiB/s of each phase
and the checksum of the data read back, and whether every checksum equals the plain
directory's (``same_as_plain``).

Then, per shim, the pair (`mpi_tools.measure_pair`): two jobs of 3 and 1 nodes writing at once
for about ``--phase`` seconds through it, at a controller with ``size-fair`` and B =
``--capacity``: their rates while both wrote, the ratio A : B (``size-fair``: 3) and the
aggregate as a fraction of B. The tests (tests/integration/*/test_mpi_*.py) run the same at
small sizes and a 5 s phase.

    python bench/mpi_workloads.py [--ranks 4] [--block 4MiB] [--segments 8] [--h5-size 16MiB]
        [--capacity 40MiB/s] [--phase 20] [--targets plain mount exec] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from controller_events import start_controller
from fio_tools import MiB, clean_env
from fuse_throughput import Mount
from mpi_tools import IDENTITY, MpiJob, measure_pair, under_exec
from preload_throughput import UNLIMITED, Agent

from burstctl.common.units import parse_rate

TARGETS = ("plain", "mount", "exec")
# A target: where the workloads write, and how a job is started there
# (``start(workload, directory, args, job, nodes) -> MpiJob``).
Target = tuple[Path, Callable[[str, Path, list[str], str, int], MpiJob]]


def identity(job: str, nodes: int) -> dict[str, str]:
    return {"BURSTCTL_JOB_ID": job, "SLURM_NNODES": str(nodes)}


@contextmanager
def target(name: str, root: Path, controller_args: Sequence[str], ranks: int) -> Iterator[Target]:
    """A target's directory and job starter; its controller, mount or agent stopped after."""
    backing = root / name / "backing"
    backing.mkdir(parents=True)
    env = clean_env()
    stop: list[Callable[[], object]] = []
    try:
        if name == "plain":

            def start(workload: str, d: Path, args: list[str], job: str, nodes: int) -> MpiJob:
                return MpiJob(workload, [str(d), *args], env, ranks)

            yield backing, start
        elif name == "mount":
            proc, address, _ = start_controller(str(root / name / "state"), list(controller_args))
            stop.append(proc.kill)
            mount = Mount(backing, root / name / "mnt", ["--controller", address], env)
            stop.insert(0, mount.stop)

            def start(workload: str, d: Path, args: list[str], job: str, nodes: int) -> MpiJob:
                job_env = {**env, **identity(job, nodes)}
                return MpiJob(workload, [str(d), *args], job_env, ranks, passed=IDENTITY)

            yield mount.mountpoint, start
        else:
            agent = Agent(root / name, backing, env, controller_args)
            stop.append(agent.stop)

            def start(workload: str, d: Path, args: list[str], job: str, nodes: int) -> MpiJob:
                spec = under_exec(agent.socket, job)
                job_env = {**env, "SLURM_NNODES": str(nodes)}
                return MpiJob(workload, [str(d), *args], job_env, ranks, **spec)

            yield backing, start
    finally:
        for step in stop:
            step()


def rates(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per run: its layout and API, each phase's seconds and MiB/s, its checksum."""
    runs = report.get("runs", [report])
    out = []
    for run in runs:
        row: dict[str, Any] = {k: run[k] for k in ("layout", "api") if k in run}
        for phase in ("write", "read"):
            seconds = run[phase]["seconds"]
            row[f"{phase}_s"] = seconds
            row[f"{phase}_mib_s"] = round(run[phase]["bytes"] / MiB / seconds, 1)
        row["checksum"] = run["checksum"]
        out.append(row)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--block", default="4MiB")
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--h5-size", default="16MiB")
    parser.add_argument("--capacity", default="40MiB/s", help="B of the pair's controller")
    parser.add_argument("--phase", type=float, default=20.0, help="the pair's seconds")
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--dir", type=Path, help="where to work (default: the temp dir)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mpi-workloads-", dir=args.dir))
    workloads = {
        "ior_like": ["--block", args.block, "--segments", str(args.segments)],
        "h5_checkpoint": ["--size", args.h5_size],
    }
    result: dict[str, Any] = {"benchmark": "mpi_workloads", "ranks": args.ranks, "runs": {}}
    try:
        for name in args.targets:
            with target(name, root / "runs", UNLIMITED, args.ranks) as (directory, start):
                for workload, options in workloads.items():
                    (directory / workload).mkdir()
                    job = start(workload, directory / workload, options, f"{name}-{workload}", 1)
                    try:
                        report = job.wait(timeout=600)
                    finally:
                        job.stop()
                    result["runs"].setdefault(workload, {})[name] = rates(report)
        for workload, by_target in result["runs"].items():
            if "plain" in by_target:
                plain = [run["checksum"] for run in by_target["plain"]]
                same = all([r["checksum"] for r in runs] == plain for runs in by_target.values())
                result.setdefault("same_as_plain", {})[workload] = same
        capacity = parse_rate(args.capacity)
        pair_controller = ("--policy", "size-fair", "--capacity", args.capacity)
        pair_controller += ("--node-bandwidth", "1TiB/s")
        for name in (t for t in args.targets if t != "plain"):
            with target(name, root / "pair", pair_controller, args.ranks) as (directory, start):

                def pair_job(job: str, nodes: int, options: list[str]) -> MpiJob:
                    (directory / job).mkdir()
                    return start("ior_like", directory / job, options, job, nodes)

                result.setdefault("pair", {})[name] = measure_pair(
                    pair_job, capacity, args.phase, args.ranks
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
