"""Files larger than the buffer written through the preload shim (``burstctl exec``): the node
agent drains them while they are open, holding the job's writes out for a moment at each
punch (docs/capacity.md, "Files larger than the buffer").

A controller with a small ``--bb-capacity`` S and ``--pfs-bandwidth``, an agent with
``--stage-out PFS --evict after-copy``, and ``dd bs=1M conv=fsync`` writers under the shim
whose files together (or one alone) are larger than S:

- every writer completes; the buffer (Σ st_blocks over the agent's directory, every 100 ms)
  never holds more than S plus 16 MiB;
- every file is byte-identical on the PFS and read back through the shim;
- a file opened for reading through the shim while its chunks drain is whole, and stays whole.

`bench/bb_large.py --shim exec` runs the same at the issue's sizes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from agent_process import CLEAN, AgentProcess, agent_args
from support import ControllerProcess, wait_until
from support.bb import (
    COUNTING_WRITER,
    Sampler,
    checkpoint_source,
    counted_block,
    digest,
    wait_checkpoints,
)

pytestmark = pytest.mark.integration

MiB = 1 << 20
SLACK = 16 * MiB


def exec_cmd(agent: AgentProcess, *command: str) -> list[str]:
    return [sys.executable, "-m", "burstctl", "exec", "--agent", str(agent.socket), "--", *command]


SHA_UNDER_SHIM = (
    "import hashlib,sys; print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())"
)


def run(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    world: Path,
    size_mib: int,
    files: list[int],
) -> None:
    ctl = controller_factory(
        "--capacity", "1GiB/s", "--node-bandwidth", "1GiB/s",
        "--bb-capacity", f"{size_mib}MiB", "--pfs-bandwidth", "80MiB/s",
    )  # fmt: skip
    bb, pfs, src = world / "bb", world / "pfs", world / "src"
    pfs.mkdir()
    src.mkdir()
    agent = agents(*agent_args(ctl, world, "--stage-out", str(pfs), "--evict", "after-copy"))
    wanted = [checkpoint_source(src / f"f{n}", mib, n) for n, mib in enumerate(files)]
    for n in range(len(files)):
        (bb / f"job{n}").mkdir()
    sampler = Sampler(bb)
    sampler.start()
    writers: list[subprocess.Popen[str]] = []
    try:
        for n in range(len(files)):
            writers.append(
                subprocess.Popen(
                    exec_cmd(agent, "dd", f"if={src / f'f{n}'}", f"of={bb / f'job{n}' / f'f{n}'}",
                             "bs=1M", "conv=fsync", "status=none"),
                    env={**CLEAN, "SLURM_JOB_ID": f"big-{n}", "SLURM_NNODES": "1"},
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )  # fmt: skip

        def why() -> str:  # what the buffer and the books held
            state = []
            for m in range(len(files)):
                f = bb / f"job{m}" / f"f{m}"
                try:
                    mark = os.getxattr(f, "user.burstctl.drained")[:200]
                except OSError:
                    mark = b"-"
                state.append((m, f.stat().st_size // MiB, f.stat().st_blocks // 2048, mark))
            cap = httpx.get(f"{ctl.url}/v1/capacity", timeout=5).json()
            return f"files {state}; capacity {cap}; the agent's log:\n{agent.log_text[-6000:]}"

        wait_checkpoints(writers, pfs, files, bb, why)
    finally:
        sampler.halt.set()
        sampler.join()
        for proc in writers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for n in range(len(files)):
        name = f"job{n}/f{n}"
        assert digest(pfs / name) == wanted[n], f"{name} on the PFS"
        shown = subprocess.run(
            exec_cmd(agent, sys.executable, "-c", SHA_UNDER_SHIM, str(bb / name)),
            env={**CLEAN, "SLURM_JOB_ID": f"big-{n}", "SLURM_NNODES": "1"},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        assert shown == wanted[n], f"{name} through the shim"
    assert not [p.name for p in pfs.rglob(".*") if "burstctl-" in p.name], "parts left"
    peak = max(sampler.used)
    assert peak <= size_mib * MiB + SLACK, f"the buffer held {peak / MiB:.1f} MiB > S + 16 MiB"


def test_open_files_larger_than_the_buffer_together_complete_through_the_agent(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    world: Path,
) -> None:
    run(controller_factory, agents, world, 48, [40, 40, 40])


def test_one_file_larger_than_the_buffer_completes_through_the_agent(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    world: Path,
) -> None:
    run(controller_factory, agents, world, 32, [128])


def test_a_kill_9_of_the_agent_mid_drain_loses_no_byte(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    world: Path,
) -> None:
    """The agent killed (SIGKILL) while an open file drains: the writer goes on (unpaced once
    the library finds the agent dead), a new agent finds the file still open in /proc and
    neither finishes nor evicts it under the writer; at its close the file drains whole, and
    no partial file ever has the final name."""
    ctl = controller_factory(
        "--capacity", "1GiB/s", "--node-bandwidth", "1GiB/s",
        "--bb-capacity", "32MiB", "--pfs-bandwidth", "80MiB/s",
    )  # fmt: skip
    bb, pfs = world / "bb", world / "pfs"
    pfs.mkdir()
    args = agent_args(ctl, world, "--stage-out", str(pfs), "--evict", "after-copy")
    agent = agents(*args)
    path = bb / "ckpt"
    writer = subprocess.Popen(
        exec_cmd(agent, sys.executable, "-u", "-c", COUNTING_WRITER, str(path), "96"),
        env={**CLEAN, "SLURM_JOB_ID": "crash", "SLURM_NNODES": "1"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None
        for line in writer.stdout:
            if int(line) == 56:  # more than S: chunks of the open file have left the buffer
                break
        assert [p for p in pfs.rglob(".*") if "burstctl-open-" in p.name], "no part yet"
        agent.stop(signal.SIGKILL)
        assert not (pfs / "ckpt").exists()  # never a partial file under the final name
        second = agents(*args)  # a new agent, on the same socket, while the writer writes
        wait_until(
            lambda: (
                "1 files under the paths are still open" in second.log_text
                and "resumed from the journal" in second.log_text
            ),
            20,
            message="the new agent to resume from its journal and find the file still open",
        )
        for _ in writer.stdout:
            pass
        assert writer.wait(60) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
        writer.stdout.close()  # type: ignore[union-attr]
    wait_until(
        lambda: (pfs / "ckpt").exists() and os.stat(path).st_size == 0,
        60,
        message="the file drained and evicted by the new agent",
    )
    data = (pfs / "ckpt").read_bytes()
    assert len(data) == 96 * MiB
    for n in range(96):
        assert data[n * MiB : (n + 1) * MiB] == counted_block(n), f"MiB {n}"
    assert not [p.name for p in pfs.rglob(".*") if "burstctl-" in p.name], "parts left"
