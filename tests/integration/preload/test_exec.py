"""``burstctl exec`` and the Slurm task prolog: the environment a command runs under the shim.

The C library is not built in this tree, so `library_path` is pointed (in the child only) at a
real, empty shared library compiled here with gcc: the exec'd command loads it for real. What
is checked is the environment the command sees and its exit code. The agent is a real
``burstctl agent`` (it answers PATHS without a controller).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_agent import CLEAN, AgentProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
# burstctl's CLI with `library_path` answering argv[1] (the library is another part's build).
WRAP = (
    "import sys; from pathlib import Path; import burstctl.preload_shim.library as lib; "
    "so = Path(sys.argv.pop(1)); lib.library_path = lambda: so; "
    "from burstctl.cli import main; sys.argv[0] = 'burstctl'; main()"
)
SHOW_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


@pytest.fixture
def library(tmp_path: Path) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build a stand-in shared library")
    source = tmp_path / "empty.c"
    source.write_text("int burstctl_stand_in = 1;\n")
    so = tmp_path / "_preload_stand_in.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(source)], check=True)
    return so


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[AgentProcess]:
    (tmp_path / "bb").mkdir()
    (tmp_path / "bb2").mkdir()
    paths = f"{tmp_path / 'bb'},{tmp_path / 'bb2'}"
    # Nothing listens on port 1: PATHS needs no controller, and no job attaches here.
    proc = AgentProcess(tmp_path / "agent.sock", ["--controller", "127.0.0.1:1", "--paths", paths])
    yield proc.wait_ready()
    proc.stop(signal.SIGTERM)


def burstctl_exec(library: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-c", WRAP, str(library), "exec", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**CLEAN, **(env or {})},
        check=False,
    )


def test_exec_sets_up_the_shim_and_keeps_the_commands_exit_code(
    library: Path, agent: AgentProcess, tmp_path: Path
) -> None:
    other = "/nonexistent/libother.so"
    done = burstctl_exec(
        library,
        "--agent",
        str(agent.socket),
        "--job",
        "exec-job",
        "--",
        sys.executable,
        "-c",
        SHOW_ENV,
        env={"LD_PRELOAD": other},
    )
    env = json.loads(done.stdout)
    assert done.returncode == 0
    assert env["LD_PRELOAD"] == f"{library}:{other}"  # first, the rest kept
    assert env["BURSTCTL_AGENT_SOCKET"] == str(agent.socket)
    assert env["BURSTCTL_PRELOAD_PATHS"] == f"{tmp_path / 'bb'}:{tmp_path / 'bb2'}"
    assert env["BURSTCTL_JOB_ID"] == "exec-job"
    assert "burstctl-preload" not in done.stderr
    # The exit code is the command's; options after -- are the command's.
    done = burstctl_exec(library, "--agent", str(agent.socket), "--", "sh", "-c", "exit 7")
    assert done.returncode == 7
    done = burstctl_exec(library, "--agent", str(agent.socket), "--", "sh", "-c", "echo $0", "-x")
    assert done.stdout.strip() == "-x"


def test_inside_slurm_the_job_comes_from_the_environment(
    library: Path, agent: AgentProcess
) -> None:
    done = burstctl_exec(
        library,
        "--",
        sys.executable,
        "-c",
        SHOW_ENV,
        env={"SLURM_JOB_ID": "31337", "BURSTCTL_AGENT_SOCKET": str(agent.socket)},
    )
    env = json.loads(done.stdout)
    assert env["SLURM_JOB_ID"] == "31337" and "BURSTCTL_JOB_ID" not in env
    assert env["LD_PRELOAD"] == str(library)


def test_an_unreachable_agent_is_one_warning_and_the_command_runs_unpaced(
    library: Path, tmp_path: Path
) -> None:
    done = burstctl_exec(
        library,
        "--agent",
        str(tmp_path / "nobody-listens.sock"),
        "--",
        sys.executable,
        "-c",
        SHOW_ENV,
    )
    assert done.returncode == 0
    env = json.loads(done.stdout)
    assert "LD_PRELOAD" not in env and "BURSTCTL_PRELOAD_PATHS" not in env
    warnings = done.stderr.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("burstctl-preload: ")
    assert "unpaced" in warnings[0]


def test_a_missing_command_is_127(library: Path, agent: AgentProcess) -> None:
    done = burstctl_exec(library, "--agent", str(agent.socket), "--", "/nonexistent/cmd")
    assert done.returncode == 127
    assert "/nonexistent/cmd" in done.stderr


def test_the_task_prolog_exports_the_shim_when_an_agent_listens(
    library: Path, agent: AgentProcess, tmp_path: Path
) -> None:
    wrapper = tmp_path / "burstctl"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -c "{WRAP}" {library} "$@"\n')
    wrapper.chmod(0o755)
    env = {
        "PATH": "/usr/bin:/bin",
        "SLURM_JOB_ID": "55",
        "BURSTCTL_BIN": str(wrapper),
        "BURSTCTL_AGENT_SOCKET": str(agent.socket),
        "BURSTCTL_URL": "http://127.0.0.1:1",  # no controller: no placement advice
        "BURSTCTL_SLURM_ENV": "/nonexistent/slurm.env",
        "BURSTCTL_SLURM_SYSLOG": "0",
    }
    script = ROOT / "deploy" / "slurm" / "burstctl-task-prolog"
    done = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"export LD_PRELOAD={library}",
        f"export BURSTCTL_AGENT_SOCKET={agent.socket}",
        f"export BURSTCTL_PRELOAD_PATHS={tmp_path / 'bb'}:{tmp_path / 'bb2'}",
    ]
    # No agent socket: nothing about the shim.
    env["BURSTCTL_AGENT_SOCKET"] = str(tmp_path / "none.sock")
    done = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout == ""


def test_export_prints_the_lines(library: Path, agent: AgentProcess) -> None:
    done = burstctl_exec(library, "--export", "--agent", str(agent.socket))
    assert done.returncode == 0
    assert done.stdout.splitlines()[0] == f"export LD_PRELOAD={library}"
    assert os.path.basename(done.stdout.splitlines()[1]) == "agent.sock"
