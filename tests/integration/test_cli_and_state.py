"""The ``burstctl`` command line and the durable state of a replica."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import ControllerProcess

from burstctl.controller.app import build_service
from burstctl.controller.config import load_config

pytestmark = pytest.mark.integration


def burstctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "burstctl", *args], capture_output=True, text=True, timeout=60
    )


def test_help_lists_contract_flags() -> None:
    out = burstctl("controller", "--help").stdout
    for flag in (
        "--config",
        "--grpc-listen",
        "--http-listen",
        "--capacity",
        "--node-bandwidth",
        "--policy",
        "--state-dir",
        "--replica-id",
    ):
        assert flag in out


def test_bad_flag_value_is_a_clear_error(tmp_path: Path) -> None:
    r = burstctl("controller", "--capacity", "lots", "--state-dir", str(tmp_path))
    assert r.returncode != 0
    assert "capacity" in r.stderr and "not a rate" in r.stderr


def test_unknown_policy_is_a_clear_error(tmp_path: Path) -> None:
    r = burstctl("controller", "--policy", "fastest", "--state-dir", str(tmp_path))
    assert r.returncode != 0 and "unknown policy 'fastest'" in r.stderr


def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with ControllerProcess(tmp_path / "a") as first:
        r = burstctl(
            "controller",
            "--grpc-listen",
            first.address,
            "--http-listen",
            "127.0.0.1:0",
            "--state-dir",
            str(tmp_path),
        )
    assert r.returncode != 0 and "cannot listen" in r.stderr


def test_config_file_and_sigterm_shutdown(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('policy = "fcfs"\ncapacity = "40MiB/s"\nreplica_id = "r7"\n')
    proc = ControllerProcess(tmp_path / "st", ["--config", str(cfg)]).start()
    assert proc.stop() == 0  # SIGTERM: graceful, exit 0
    log = "".join(proc.log)
    assert "controller r7 serving gRPC" in log and "policy fcfs" in log
    stats = json.loads(log.split("stats: ", 1)[1].splitlines()[0])
    assert stats["sessions"] == 0


def test_policies_command() -> None:
    out = burstctl("policies").stdout.split()
    assert "fcfs" in out and "fair-share" in out


async def test_policy_switch_is_persisted_and_resumed(tmp_path: Path) -> None:
    config = load_config(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0", state_dir=tmp_path)
    svc = build_service(config)
    await svc.start()
    try:
        svc.set_policy("fcfs")
        with pytest.raises(ValueError, match="bogus"):
            svc.set_policy("fcfs", {"bogus": 1})
        assert svc.policy.name == "fcfs"  # a failed switch changes nothing
    finally:
        await svc.stop(grace=0)
    saved = json.loads((tmp_path / "state.json").read_text())
    assert saved["policy"] == {"name": "fcfs", "params": {}, "version": 1}

    again = build_service(config)
    await again.start()
    try:
        assert again.policy.name == "fcfs" and again.policy_version == 1
    finally:
        await again.stop(grace=0)
    # an explicitly configured policy wins over the saved one
    explicit = build_service(
        load_config(
            grpc_listen="127.0.0.1:0",
            http_listen="127.0.0.1:0",
            state_dir=tmp_path,
            policy="fair-share",
        )
    )
    await explicit.start()
    try:
        assert explicit.policy.name == "fair-share"
    finally:
        await explicit.stop(grace=0)


async def test_corrupt_state_file_is_reported_and_kept(tmp_path: Path, caplog) -> None:
    (tmp_path / "state.json").write_text("{not json")
    svc = build_service(
        load_config(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0", state_dir=tmp_path)
    )
    await svc.start()
    try:
        assert svc.policy.name == "fair-share"
        assert "not valid burstctl state" in caplog.text
    finally:
        await svc.stop(grace=0)
    assert (tmp_path / "state.json").read_text() == "{not json"
