"""Fixtures of the preload shim's tests: a world directory every user can traverse, and node
agents started in it and stopped by pid."""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agent_process import AgentProcess


@pytest.fixture
def world() -> Iterator[Path]:
    """A directory every user can traverse (pytest's tmp_path is 0700), removed after."""
    path = Path(tempfile.mkdtemp(prefix="burstctl-agent-"))
    path.chmod(0o755)
    (path / "bb").mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agents(world: Path) -> Iterator[Callable[..., AgentProcess]]:
    """Starts agents (socket under ``world/run/burstctl``); all stopped by pid after."""
    started: list[AgentProcess] = []

    def start(*args: str, socket_path: Path | None = None) -> AgentProcess:
        agent = AgentProcess(
            socket_path or world / "run" / "burstctl" / "agent.sock", list(args), world / "state"
        )
        started.append(agent)
        return agent.wait_ready()

    yield start
    for agent in started:
        agent.stop(signal.SIGKILL)
