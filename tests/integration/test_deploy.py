"""deploy/: the Slurm prolog and epilog against running controllers, the systemd units, compose.

The scripts run for real under bash against ``burstctl controller`` child processes, with
the project's ``.venv/bin`` first on PATH. Slurm itself is not here: its environment is
set by hand, and ``scontrol`` is a small script only where the node-count fallback is tested.
"""

from __future__ import annotations

import configparser
import grp
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from support import ControllerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SLURM = ROOT / "deploy" / "slurm"
SYSTEMD = ROOT / "deploy" / "systemd"
CONTAINER = ROOT / "deploy" / "container"
VENV_BIN = Path(sys.executable).parent
GROUP = grp.getgrgid(os.getgid()).gr_name

Factory = Callable[..., ControllerProcess]


def run_script(name: str, env: dict[str, str], timeout: float = 30) -> tuple[int, str, float]:
    """Runs deploy/slurm/<name> under bash in exactly ``env`` (plus PATH); (rc, stderr, s)."""
    full = {
        "PATH": f"{VENV_BIN}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "BURSTCTL_SLURM_ENV": "/nonexistent/slurm.env",
        "BURSTCTL_SLURM_SYSLOG": "0",
        **env,
    }
    t0 = time.monotonic()
    done = subprocess.run(
        ["bash", str(SLURM / name)],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done.returncode, done.stderr, time.monotonic() - t0


def api_env(ctl: ControllerProcess) -> dict[str, str]:
    assert ctl.url is not None
    return {
        "BURSTCTL_URL": ctl.url,
        "BURSTCTL_ADMIN_TOKEN_FILE": str(ctl.state_dir / "admin-token"),
    }


def get_job(ctl: ControllerProcess, job_id: str) -> httpx.Response:
    return httpx.get(f"{ctl.url}/v1/jobs/{job_id}", timeout=5)


def job_env(job_id: str, **extra: str) -> dict[str, str]:
    return {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_GID": str(os.getgid()),
        "SLURM_JOB_ACCOUNT": "physics",
        # One call's bound: the 5 s default kills a `burstctl job` still starting up on a
        # loaded machine, and the script then (rightly) goes on without that replica. The
        # test of the bound itself sets its own.
        "BURSTCTL_SLURM_TIMEOUT": "60",
        **extra,
    }


@pytest.fixture
def closed_url() -> str:
    """A loopback REST URL on a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A loopback port that accepts connections (kernel backlog) but never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_prolog_registers_and_epilog_retires(controller_factory: Factory) -> None:
    ctl = controller_factory()
    env = {**api_env(ctl), **job_env("4242", SLURM_JOB_NUM_NODES="3", SLURM_NNODES="3")}

    rc, err, _ = run_script("burstctl-prolog", env)
    assert rc == 0, err
    r = get_job(ctl, "4242")
    assert r.status_code == 200, r.text
    job = r.json()
    assert (job["user"], job["group"], job["nodes"], job["priority"]) == ("alice", GROUP, 3, 1.0)
    assert job["registered"] is True
    assert "job 4242 registered" in err

    rc, err, _ = run_script("burstctl-epilog", env)
    assert rc == 0, err
    assert get_job(ctl, "4242").status_code == 404
    assert "job 4242 retired" in err

    # A second epilog (or one after a prolog that could not register) is not an error.
    rc, err, _ = run_script("burstctl-epilog", env)
    assert rc == 0
    assert "not registered" in err


def test_env_file_node_count_from_scontrol_and_account(
    controller_factory: Factory, tmp_path: Path, closed_url: str
) -> None:
    ctl = controller_factory()
    assert ctl.url is not None
    env_file = tmp_path / "slurm.env"
    env_file.write_text(
        "# burstctl for the Slurm scripts\n"
        f"BURSTCTL_URL={closed_url}\n"  # the environment's BURSTCTL_URL wins over this
        f'BURSTCTL_ADMIN_TOKEN_FILE="{ctl.state_dir / "admin-token"}"\n'
        "export BURSTCTL_SLURM_GROUP=account\n"
        "NOT_OURS=ignored\n"
    )
    # Slurm is not installed here: a stand-in for `scontrol show hostnames n[1-4]`.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    scontrol = fake_bin / "scontrol"
    scontrol.write_text(
        '#!/bin/sh\n[ "$1 $2 $3" = "show hostnames n[1-4]" ] && printf "n1\\nn2\\nn3\\nn4\\n"\n'
    )
    scontrol.chmod(0o755)
    env = {
        **job_env("77", SLURM_JOB_NODELIST="n[1-4]"),
        "BURSTCTL_SLURM_ENV": str(env_file),
        "BURSTCTL_URL": ctl.url,
        "PATH": f"{VENV_BIN}:{fake_bin}:/usr/bin:/bin",
    }

    rc, err, _ = run_script("burstctl-prolog", env)
    assert rc == 0, err
    job = get_job(ctl, "77").json()
    assert (job["user"], job["group"], job["nodes"]) == ("alice", "physics", 4)


def test_missing_node_count_registers_one_node(controller_factory: Factory) -> None:
    ctl = controller_factory()
    env = {**api_env(ctl), **job_env("78")}  # no SLURM_JOB_NUM_NODES, SLURM_NNODES, NODELIST

    rc, err, _ = run_script("burstctl-prolog", env)
    assert rc == 0, err
    assert get_job(ctl, "78").json()["nodes"] == 1
    assert "registering 1 node" in err


def test_every_replica_in_burstctl_urls_gets_the_job(controller_factory: Factory) -> None:
    token = "shared-token-for-both-replicas"
    ctls = [controller_factory(env={"BURSTCTL_ADMIN_TOKEN": token}) for _ in range(2)]
    env = {
        **job_env("90", SLURM_JOB_NUM_NODES="2"),
        "BURSTCTL_URLS": ",".join(c.url or "" for c in ctls),
        "BURSTCTL_ADMIN_TOKEN": token,
    }

    rc, err, _ = run_script("burstctl-prolog", env)
    assert rc == 0, err
    for ctl in ctls:
        assert get_job(ctl, "90").json()["nodes"] == 2

    rc, err, _ = run_script("burstctl-epilog", env)
    assert rc == 0, err
    for ctl in ctls:
        assert get_job(ctl, "90").status_code == 404


@pytest.mark.parametrize("script", ["burstctl-prolog", "burstctl-epilog"])
def test_controller_down_never_fails_the_job(script: str, closed_url: str) -> None:
    env = {**job_env("5", SLURM_JOB_NUM_NODES="1"), "BURSTCTL_URL": closed_url}
    rc, err, elapsed = run_script(script, env)
    assert rc == 0
    assert "cannot reach the controller" in err
    assert elapsed < 5  # loose: connection refused is immediate


@pytest.mark.parametrize("script", ["burstctl-prolog", "burstctl-epilog"])
def test_hung_controller_is_cut_off_by_the_timeout(script: str, silent_url: str) -> None:
    env = {
        **job_env("6", SLURM_JOB_NUM_NODES="1"),
        "BURSTCTL_URL": silent_url,
        "BURSTCTL_ADMIN_TOKEN": "x",
        "BURSTCTL_SLURM_TIMEOUT": "1",
    }
    rc, err, elapsed = run_script(script, env)
    assert rc == 0
    assert "timed out after 1s" in err
    assert elapsed < 5  # the CLI alone would wait 10 s


def test_no_job_id_or_no_burstctl_is_logged_not_fatal(closed_url: str) -> None:
    rc, err, _ = run_script("burstctl-prolog", {"BURSTCTL_URL": closed_url})
    assert rc == 0
    assert "SLURM_JOB_ID is not set" in err
    env = {**job_env("7"), "BURSTCTL_BIN": "/nonexistent/burstctl"}
    rc, err, _ = run_script("burstctl-epilog", env)
    assert rc == 0
    assert "burstctl not found" in err


def read_unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((SYSTEMD / name).read_text())
    return unit


def test_controller_unit() -> None:
    unit = read_unit("burstctl-controller.service")
    assert unit.sections() == ["Unit", "Service", "Install"]
    service = unit["Service"]
    assert service["Type"] == "simple"
    assert service["ExecStart"].split()[1:2] == ["controller"]
    assert service["Restart"] == "on-failure"
    assert "network-online.target" in unit["Unit"]["After"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_mount_template_unit() -> None:
    unit = read_unit("burstctl-mount@.service")
    assert unit.sections() == ["Unit", "Service", "Install"]
    service = unit["Service"]
    exec_start = service["ExecStart"].split()
    assert (
        exec_start[0] == read_unit("burstctl-controller.service")["Service"]["ExecStart"].split()[0]
    )
    assert exec_start[1:3] == ["mount", "--foreground"]
    assert exec_start[-2:] == ["${BURSTCTL_BACKING}", "%f"]  # the unescaped mount point
    assert service["Type"] == "simple"
    assert service["EnvironmentFile"] == "/etc/burstctl/mount-%i.env"
    assert service["Restart"] == "on-failure"
    assert "ExecStop" not in service  # SIGTERM unmounts
    assert "network-online.target" in unit["Unit"]["After"].split()
    assert "burstctl-controller.service" in unit["Unit"]["After"].split()
    assert unit["Unit"]["Wants"] == "network-online.target"


def test_agent_unit() -> None:
    unit = read_unit("burstctl-agent.service")
    assert unit.sections() == ["Unit", "Service", "Install"]
    service = unit["Service"]
    exec_start = service["ExecStart"].split()
    assert (
        exec_start[0] == read_unit("burstctl-controller.service")["Service"]["ExecStart"].split()[0]
    )
    assert exec_start[1] == "agent"
    # The socket where `burstctl exec` and the task prolog look by default.
    assert exec_start[exec_start.index("--socket") + 1] == "/run/burstctl/agent.sock"
    assert service["RuntimeDirectoryMode"] == "0755"
    assert service["EnvironmentFile"] == "/etc/burstctl/agent.env"
    assert service["Restart"] == "on-failure"
    assert "slurmd.service" in unit["Unit"]["Before"].split()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    # ExecStart must exist for verify: point it at this venv's burstctl instead of /opt.
    for unit in SYSTEMD.glob("*.service"):
        text = unit.read_text().replace("/opt/burstctl/.venv/bin", str(VENV_BIN))
        (tmp_path / unit.name).write_text(text)
    done = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            "--man=no",
            str(tmp_path / "burstctl-controller.service"),
            str(tmp_path / "burstctl-mount@local-bb.service"),
            str(tmp_path / "burstctl-agent.service"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="no shellcheck")
def test_scripts_pass_shellcheck() -> None:
    scripts = [*sorted(SLURM.iterdir()), CONTAINER / "demo.sh"]
    done = subprocess.run(
        ["shellcheck", "-x", *map(str, scripts)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_compose_two_peer_replicas_and_a_privileged_mount() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((CONTAINER / "compose.yaml").read_text())
    services = compose["services"]
    controllers = {
        name: s["command"]
        for name, s in services.items()
        if s["command"][:2] == ["burstctl", "controller"]
    }
    assert sorted(controllers) == ["r1", "r2"]
    grpc_port = {
        name: flag(cmd, "--grpc-listen").rsplit(":", 1)[1] for name, cmd in controllers.items()
    }
    for name, cmd in controllers.items():
        (other,) = set(controllers) - {name}
        assert flag(cmd, "--peers") == f"{other}:{grpc_port[other]}"
        assert flag(cmd, "--replica-id") == name
        http_port = flag(cmd, "--http-listen").rsplit(":", 1)[1]
        assert services[name]["ports"] == [f"127.0.0.1:{http_port}:{http_port}"]
    capacities = {flag(cmd, "--capacity") for cmd in controllers.values()}
    assert len(capacities) == 2

    mount = services["mount"]
    assert mount["privileged"] is True
    assert any(d.startswith("/dev/fuse") for d in mount["devices"])
    assert mount["cap_add"] == ["SYS_ADMIN"]
    assert "apparmor:unconfined" in mount["security_opt"]
    assert set(mount["depends_on"]) == {"r1", "r2"}
    assert mount["environment"]["BURSTCTL_CONTROLLER"] == f"r1:{grpc_port['r1']}"
    dockerfile = (CONTAINER / "Dockerfile").read_text()
    assert "apt-get install" in dockerfile and "fuse libfuse2 libfuse3-3 fio" in dockerfile
