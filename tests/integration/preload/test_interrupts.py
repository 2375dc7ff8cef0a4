"""A process waiting for tokens in the preload library can be killed, and leaves no waiter.

A real controller at a very low rate, a real node agent, and a writer under ``burstctl exec``
(the real library) writing 1 MiB blocks under the agent's paths: once the agent reports the
job waiting (its page's waiters, beating), the writer gets SIGKILL, a second one SIGTERM (the
default action), each gone within 1 s with one core kept busy by another process. Every block
the writer was told was written is in the file; the agent stops counting the dead as waiting
(the job is not held waiting at the controller); the next small write goes through.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agent_process import CLEAN, AgentProcess, agent_args
from support import ControllerProcess, wait_until

pytestmark = pytest.mark.integration

MiB = 1 << 20
JOB = "intr-preload"

# Writes 1 MiB blocks (block i all bytes i % 251) to argv[1] until killed, printing the count
# of blocks acknowledged after each.
WRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
i = 0
while True:
    os.write(fd, bytes([i % 251]) * (1 << 20))
    i += 1
    print(i, flush=True)
"""


@pytest.fixture
def busy_core() -> Iterator[None]:
    """One core kept busy by another process for the whole test (stopped by its pid)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def under_exec(agent: AgentProcess, *command: str, **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "burstctl", "exec", "--agent", str(agent.socket), "--", *command],
        env={**CLEAN, "SLURM_JOB_ID": JOB, "SLURM_NNODES": "1"},
        text=True,
        **kw,  # type: ignore[call-overload]
    )


def test_a_process_waiting_for_tokens_dies_of_sigkill_and_sigterm(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    world: Path,
    busy_core: None,
) -> None:
    # 16 KiB/s: a 1 MiB write waits about a minute for its tokens.
    ctl = controller_factory("--capacity", "16KiB/s", "--node-bandwidth", "1GiB/s")
    agent = agents(*agent_args(ctl, world))

    def waiting() -> bool:
        job = agent.job(JOB)
        return job is not None and bool(job["waiting"])

    for name, sig in (("a", signal.SIGKILL), ("b", signal.SIGTERM)):
        path = world / "bb" / name
        writer = under_exec(agent, sys.executable, "-c", WRITER, str(path), stdout=subprocess.PIPE)
        wait_until(
            lambda: waiting() or writer.poll() is not None,  # noqa: B023
            60,
            message="the writer to wait for tokens",
        )
        assert writer.poll() is None, "the writer ended before it waited"
        sent = time.monotonic()
        writer.send_signal(sig)
        try:
            writer.wait(5)
        except subprocess.TimeoutExpired:
            writer.kill()
            writer.wait()
            raise AssertionError(f"the writer outlived signal {sig} by 5 s") from None
        took = time.monotonic() - sent
        assert writer.returncode == -sig
        assert took < 1.0, f"the writer took {took:.2f} s to die of signal {sig}"
        assert writer.stdout is not None
        with writer.stdout:
            lines = writer.stdout.read().split()
        blocks = int(lines[-1]) if lines else 0
        with open(path, "rb") as f:
            for i in range(blocks):
                assert f.read(MiB) == bytes([i % 251]) * MiB, f"block {i} of {path}"
        # The dead waiter leaves the page's count, but stops beating: not waiting any more.
        wait_until(lambda: not waiting(), 10, message="the job no longer waiting")
    # The next small write goes through (its tokens at the job's rate, not behind the dead).
    done = under_exec(agent, "dd", "if=/dev/zero", f"of={world / 'bb' / 'c'}", "bs=4096", "count=1")
    assert done.wait(60) == 0
    assert (world / "bb" / "c").stat().st_size == 4096
