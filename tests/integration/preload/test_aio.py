"""POSIX AIO through the preload library (docs/preload.md, "POSIX AIO"): requests are paced and
counted at their submission, in the submitting thread.

A C program (probe.c, mode ``aio``) writes a file with ``aio_write`` and
``lio_listio(LIO_NOWAIT)`` and reads it back with ``lio_listio(LIO_WAIT)``, checking the data,
then does the same to a file outside the paths.

- Under ``burstctl exec`` (the real library, a real node agent, a real controller): the first
  file's bytes are the job's, exactly, the second's nobody's; at a job rate of R its N MiB of AIO
  writes take at least 0.8 N / R.
- Against the fake agent (test_library.py): a submission waiting for its tokens is one of the
  page's waiters, and SIGKILL ends it within 1 s; while the agent stages out, every AIO write
  is done when its submission returns, and none is left counted in flight.

Open MPI's nonblocking MPI-IO, which goes through POSIX AIO: test_mpi_exec.py.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_process import CLEAN, AgentProcess, agent_args
from fake_agent import FakeAgent
from support import ControllerProcess, wait_until
from test_library import (  # noqa: F401 (agent, bb, probe, sock_dir: fixtures)
    INF,
    Background,
    agent,
    bb,
    probe,
    run,
    shim_env,
    sock_dir,
)
from test_metadata_exec import exec_prefix

pytestmark = pytest.mark.integration

MiB = 1 << 20
RATE = 4  # MiB/s
N = 8  # MiB written, then read
JOB = "aio-job"


def outcome(stdout: str) -> dict[str, str]:
    """The probe's ``name=value`` words."""
    return dict(word.split("=", 1) for word in stdout.split() if "=" in word)


def test_posix_aio_under_exec_is_paced_and_counted_on_the_job(
    controller_factory: Callable[..., ControllerProcess],
    agents: Callable[..., AgentProcess],
    world: Path,
    probe: Path,  # noqa: F811
) -> None:
    ctl = controller_factory("--capacity", f"{RATE}MiB/s", "--node-bandwidth", "1GiB/s")
    node_agent = agents(*agent_args(ctl, world))
    (world / "outside").mkdir()
    inside, outside = world / "bb" / "aio.bin", world / "outside" / "aio.bin"
    command = [str(probe), "aio", str(inside), str(N), str(outside)]
    out = subprocess.run(
        [*exec_prefix(node_agent), *command],
        env={**CLEAN, "BURSTCTL_JOB_ID": JOB},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "burstctl-preload" not in out.stderr  # attached: paced, not the unpaced fallback
    assert inside.stat().st_size == outside.stat().st_size == N * MiB
    # The process has exited: what its page counted is final.
    counters = (node_agent.job(JOB) or {}).get("counters", {})
    assert (counters.get("req_write"), counters.get("req_read")) == (N * MiB, N * MiB)
    # Load only slows the writes down: a lower bound holds on a busy machine.
    write_s = float(outcome(out.stdout)["write_s"])
    print(json.dumps({"counters": counters, "write_s": write_s}))
    assert write_s >= 0.8 * N / RATE, out.stdout


def test_an_aio_submission_waits_for_its_tokens_as_a_write_and_dies_of_sigkill(
    agent: FakeAgent,  # noqa: F811
    bb: Path,  # noqa: F811
    probe: Path,  # noqa: F811
) -> None:
    agent.publish(0.0, burst=0)
    with Background([str(probe), "aio", f"{bb}/k", "1"], shim_env(agent.socket_path, str(bb))) as p:
        wait_until(lambda: agent.page.counters().waiters == 1, timeout=10, message="a waiter")
        counters = agent.page.counters()
        assert (counters.req_write, counters.moved_write) == (MiB, 0)
        sent = time.monotonic()
        p.send_signal(signal.SIGKILL)
        assert p.wait(timeout=5) == -signal.SIGKILL
        assert time.monotonic() - sent < 1.0


def test_while_the_agent_stages_out_aio_writes_are_done_when_submitted(
    agent: FakeAgent,  # noqa: F811
    bb: Path,  # noqa: F811
    probe: Path,  # noqa: F811
) -> None:
    agent.publish(INF)
    agent.page.mark_staging()
    out = run([str(probe), "aio", f"{bb}/s", str(N)], shim_env(agent.socket_path, str(bb)))
    assert out.returncode == 0, out.stderr
    # Each AIO write stayed counted in flight (`writing`) until it was done: the agent's hold
    # on the job's writes could never punch under one.
    assert outcome(out.stdout)["done_at_return"] == f"{N}/{N}", out.stdout
    counters = agent.page.counters()
    assert (counters.moved_write, counters.moved_read) == (N * MiB, N * MiB)
    with agent.page.hold_writes(timeout=0) as none_in_flight:
        assert none_in_flight
