"""MPI-IO and HDF5 under ``burstctl exec``: the real library in every rank of ``burstctl exec --
mpirun -np 4 -x LD_PRELOAD -x ... python WORKLOAD`` (bench/workloads/, tests/support/mpi.py), a
real node agent, a real controller.

- The IOR-like workload (N-1 and N-N, collective and independent MPI-IO, Open MPI's default
  OMPIO) and the per-rank h5py checkpoint: each run's data, read back and checked by the
  workload, has the same checksums and its files the same bytes as without burstctl, and the
  controller books all four ranks' bytes to the run's one job, exactly (OMPIO and HDF5 move
  them with ``pwrite``/``pread``/``pwritev``/``preadv``, which the library paces), to no other.
- What docs/preload.md says of nonblocking MPI-IO: OMPIO's ``Iwrite_at``/``Iread_at`` go
  through POSIX AIO (``aio_write``/``aio_read``, glibc's helper threads move the bytes), which
  the library paces and counts at submission; ROMIO's (``--mca io romio321``) are
  ``pwrite``/``pread`` of the calling thread, which it paces: both count every byte.
- Two such jobs at once, of 3 and 1 nodes under ``size-fair`` at a small B: their write rates
  3 : 1 within 7 %, together at least 90 % of B.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agent_process import CLEAN, AgentProcess, agent_args
from mpi_tools import MpiJob, checksums, measure_pair, under_exec
from support import ControllerProcess
from support.mpi import (  # noqa: F401 (mpi_jobs: a fixture)
    H5,
    IOR,
    bounds,
    expect_booked,
    mpi_jobs,
    run_against_plain,
)

pytestmark = pytest.mark.integration

MiB = 1 << 20
WARNING = "burstctl-preload:"


def exec_spec(agent: AgentProcess, job: str, nodes: int = 1) -> dict[str, Any]:
    """`MpiJob`'s arguments for ``burstctl exec --agent SOCKET --job JOB -- mpirun ...``."""
    return {**under_exec(agent.socket, job), "env": {**CLEAN, "SLURM_NNODES": str(nodes)}}


@pytest.fixture
def unbound(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    world: Path,
) -> tuple[ControllerProcess, AgentProcess]:
    """A controller whose B never binds here (fair-share, 1 GiB/s) and an agent on it."""
    ctl = controller_factory(
        "--policy", "fair-share", "--capacity", "1GiB/s", "--node-bandwidth", "1GiB/s"
    )
    return ctl, agents(*agent_args(ctl, world))


def test_ior_like_and_hdf5_checkpoint_under_exec(
    unbound: tuple[ControllerProcess, AgentProcess],
    world: Path,
    mpi_jobs: Callable[..., MpiJob],  # noqa: F811
) -> None:
    ctl, agent = unbound

    def start(workload: str, args: tuple[str, ...]) -> tuple[MpiJob, Path]:
        directory = world / "bb" / workload
        directory.mkdir()
        spec = exec_spec(agent, f"mpi-{workload}")
        return mpi_jobs(workload, [str(directory), *args], **spec), directory

    done = run_against_plain((IOR, H5), start)
    for _, job in done.values():
        assert WARNING not in job.stderr, job.stderr  # attached: paced, not the unpaced fallback
    reports = {w: report for w, (report, _) in done.items()}
    # the library paces what each call asks for: the IOR-like writes and reads exactly
    now = expect_booked(ctl, bounds(reports["ior_like"], reports["h5_checkpoint"], 0))
    print(json.dumps({"booked": now, "checksums": {w: checksums(r) for w, r in reports.items()}}))


def test_nonblocking_mpi_io_is_counted_under_romio_and_under_ompio(
    unbound: tuple[ControllerProcess, AgentProcess],
    world: Path,
    mpi_jobs: Callable[..., MpiJob],  # noqa: F811
) -> None:
    _, agent = unbound
    args = ("--layouts", "nn", "--apis", "nonblocking", "--segments", "2")
    counted = {}
    for io in ("ompio", "romio321"):
        directory = world / "bb" / io
        directory.mkdir()
        spec = exec_spec(agent, f"nb-{io}")
        report = mpi_jobs(
            "ior_like", [str(directory), *args], ranks=2, options=("--mca", "io", io), **spec
        ).wait()
        assert report["verified"]
        # The processes have exited: what their pages counted is final.
        counters = (agent.job(f"nb-{io}") or {}).get("counters", {})
        counted[io] = (counters.get("req_write"), counters.get("req_read"))
    moved = report["runs"][0]["write"]["bytes"]
    print(json.dumps({"counted": counted, "moved": moved}))
    # OMPIO's bytes go through glibc's POSIX AIO threads: counted when each rank submits them
    assert counted["ompio"] == (moved, moved)
    assert counted["romio321"] == (moved, moved)


@pytest.mark.serial  # shares measured over a window: alone, not beside other tests
def test_two_mpi_jobs_under_exec_share_in_proportion_to_their_nodes(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    world: Path,
    mpi_jobs: Callable[..., MpiJob],  # noqa: F811
) -> None:
    capacity = 40 * MiB
    ctl = controller_factory(
        "--policy", "size-fair", "--capacity", "40MiB/s", "--node-bandwidth", "1GiB/s"
    )
    agent = agents(*agent_args(ctl, world))

    def start(job: str, nodes: int, args: list[str]) -> MpiJob:
        directory = world / "bb" / job
        directory.mkdir()
        return mpi_jobs("ior_like", [str(directory), *args], **exec_spec(agent, job, nodes))

    summary = measure_pair(start, capacity)
    print(json.dumps(summary))
    assert summary["ratio"] == pytest.approx(3.0, rel=0.07), summary
    assert summary["aggregate_of_B"] >= 0.90, summary
