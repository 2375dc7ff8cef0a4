"""The burst buffer's capacity and the stage-out through the preload shim: the real library in
real programs (``burstctl exec``), a real node agent with ``--stage-out``, a real controller
with ``--bb-capacity`` and ``--pfs-bandwidth``.

- Several writers of closed files, more than S in all: every writer completes, the buffer
  (Σ st_blocks on the agent's directory, and the controller's books) never holds more than S
  plus one block per writer, every file ends byte-identical on the PFS, is evicted from the
  buffer, and reads back identical through the shim (served from the PFS copy); opened for
  writing through the shim, an evicted file is brought back first.
- A writer waiting for space waits (the controller hears the job waits) and dies within 1 s
  of SIGKILL or SIGTERM.

Every process is started here and stopped by pid; waits are conditions with deadlines.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from agent_process import CLEAN, AgentProcess, agent_args
from support import ControllerProcess, wait_until
from support.bb import WRITER, all_copied, digest, expected_digests, tree_bytes

from burstctl.node.stageout_marks import XATTR_EVICTED

pytestmark = pytest.mark.integration

MiB = 1 << 20
S = 32 * MiB
DRAIN = 40 * MiB
JOBS = ("agent-cap-a", "agent-cap-b", "agent-cap-c")
FILES, FILE_MIB = 4, 4
BLOCK = MiB

# Writes 1 MiB at a time for ever (until killed).
ENDLESS = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
block = b"x" * (1 << 20)
while True:
    os.write(fd, block)
"""


def exec_cmd(agent: AgentProcess, *command: str) -> list[str]:
    return [sys.executable, "-m", "burstctl", "exec", "--agent", str(agent.socket), "--", *command]


class Sampler(threading.Thread):
    """The buffer's allocated bytes and the controller's used space, every 100 ms."""

    def __init__(self, bb: Path, ctl: ControllerProcess) -> None:
        super().__init__(daemon=True)
        self.bb, self.ctl = bb, ctl
        self.blocks: list[int] = []
        self.used: list[int] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self.halt.wait(0.1):
                self.blocks.append(tree_bytes(self.bb, True))
                self.used.append(client.get(f"{self.ctl.url}/v1/capacity").json()["used"])


def capacity_controller(factory: Callable[..., ControllerProcess]) -> ControllerProcess:
    return factory(
        "--capacity",
        "1GiB/s",
        "--node-bandwidth",
        "1GiB/s",
        "--bb-capacity",
        f"{S // MiB}MiB",
        "--pfs-bandwidth",
        f"{DRAIN // MiB}MiB/s",
    )


def test_writers_through_the_agent_share_a_small_buffer_that_drains_to_the_pfs(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    world: Path,
) -> None:
    ctl = capacity_controller(controller_factory)
    bb, pfs = world / "bb", world / "pfs"
    pfs.mkdir()
    agent = agents(*agent_args(ctl, world, "--stage-out", str(pfs), "--evict", "after-copy"))
    for job in JOBS:
        (bb / job).mkdir()
    sampler = Sampler(bb, ctl)
    sampler.start()
    writers: dict[str, subprocess.Popen[str]] = {}
    try:
        for seed, job in enumerate(JOBS):
            writers[job] = subprocess.Popen(
                exec_cmd(
                    agent,
                    sys.executable,
                    "-c",
                    WRITER,
                    str(bb / job),
                    str(seed),
                    str(FILES),
                    str(FILE_MIB),
                ),
                env={**CLEAN, "SLURM_JOB_ID": job, "SLURM_NNODES": "1"},
                stderr=subprocess.PIPE,
                text=True,
            )
        for job, proc in writers.items():
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, f"writer {job} failed: {err}"
            assert "burstctl-preload" not in err, err  # attached and paced throughout
        names = [(seed, job, n) for seed, job in enumerate(JOBS) for n in range(FILES)]
        rels = [f"{job}/f{n:02d}" for _, job, n in names]
        wait_until(
            lambda: all_copied(pfs, rels, FILE_MIB * MiB), 60, message="every file on the PFS"
        )
        wait_until(lambda: tree_bytes(bb, True) < MiB, 30, message="the buffer to empty (evicted)")
    finally:
        sampler.halt.set()
        sampler.join()
        for proc in writers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    bound = S + len(JOBS) * BLOCK
    assert max(sampler.blocks) <= bound, f"buffer held {max(sampler.blocks) / MiB:.1f} MiB"
    assert max(sampler.used) <= bound, f"the books said {max(sampler.used) / MiB:.1f} MiB"
    # S was what held the writers back (an unused grant is reserved too, so the blocks may
    # stay below S while the books are full)
    assert max(sampler.used) >= S - 4 * MiB, "the books never filled: nothing was tested"
    wanted = {seed: expected_digests(seed, FILES, FILE_MIB) for seed in range(len(JOBS))}
    for seed, job, n in names:
        name = f"{job}/f{n:02d}"
        assert digest(pfs / name) == wanted[seed][n], f"{name} on the PFS"
        assert os.getxattr(bb / name, XATTR_EVICTED), f"{name} not marked evicted"
        assert (bb / name).stat().st_size == 0
    # Read back through the shim: served from the PFS copy.
    for seed, job, n in names[:: FILES - 1]:
        name = f"{job}/f{n:02d}"
        out = subprocess.run(
            exec_cmd(agent, "sha256sum", str(bb / name)),
            env={**CLEAN, "SLURM_JOB_ID": job},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert out.stdout.split()[0] == wanted[seed][n], f"{name} through the shim"
    # Opened for writing (appending) through the shim: restored first, then appended to.
    seed, job, n = names[0]
    name = f"{job}/f{n:02d}"
    subprocess.run(
        exec_cmd(agent, "sh", "-c", f"printf tail >> {bb / name}"),
        env={**CLEAN, "SLURM_JOB_ID": job},
        check=True,
        timeout=60,
    )
    rng = random.Random(seed)
    body = b"".join(rng.randbytes(MiB) for _ in range(FILE_MIB))
    assert (bb / name).read_bytes() == body + b"tail", "restored, then appended"
    wait_until(
        lambda: digest(pfs / name) == hashlib.sha256(body + b"tail").hexdigest(),
        30,
        message="the appended file copied again",
    )


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_writer_waiting_for_space_waits_and_dies_at_once(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    world: Path,
    sig: int,
) -> None:
    ctl = capacity_controller(controller_factory)
    agent = agents(*agent_args(ctl, world))  # no --stage-out: nothing leaves the buffer
    job = "agent-cap-wait"
    writer = subprocess.Popen(
        exec_cmd(agent, sys.executable, "-u", "-c", ENDLESS, str(world / "bb" / "endless")),
        env={**CLEAN, "SLURM_JOB_ID": job},
        stdout=subprocess.DEVNULL,
    )
    try:
        path = world / "bb" / "endless"

        def full_and_waiting() -> bool:
            capacity = httpx.get(f"{ctl.url}/v1/capacity", timeout=5).json()
            # Full for good: with nothing drained, no further block fits (the file's own
            # xattr block is on the books too), and the writer waits.
            if job not in capacity["waiting"] or path.stat().st_size < S - MiB:
                return False
            entry = agent.job(job)  # and the agent counts it among the page's waiters
            return entry is not None and entry["counters"]["waiters"] >= 1

        wait_until(full_and_waiting, 60, message="the writer to fill S and wait for space")
        # It stays there: the buffer holds at most S (+ the write in flight), no more.
        size = path.stat().st_size
        assert size <= S + BLOCK, size
        start = time.monotonic()
        writer.send_signal(sig)
        writer.wait(timeout=5)
        assert time.monotonic() - start < 1.0, "the waiting writer outlived its signal by 1 s"
        assert writer.returncode == -sig
        assert path.stat().st_size == size  # nothing more written
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
