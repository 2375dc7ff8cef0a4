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
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_process import CLEAN, AgentProcess, agent_args
from support import ControllerProcess, wait_until
from support.killing import WRITER, assert_written, kill_within_a_second

pytestmark = pytest.mark.integration

JOB = "intr-preload"


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
        assert_written(path, kill_within_a_second(writer, sig))
        # The dead waiter leaves the page's count, but stops beating: not waiting any more.
        wait_until(lambda: not waiting(), 10, message="the job no longer waiting")
    # The next small write goes through (its tokens at the job's rate, not behind the dead).
    done = under_exec(agent, "dd", "if=/dev/zero", f"of={world / 'bb' / 'c'}", "bs=4096", "count=1")
    assert done.wait(60) == 0
    assert (world / "bb" / "c").stat().st_size == 4096
