"""The ``burstctl`` command line and the durable state of a replica."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from support import ControllerProcess
from support import run_burstctl as burstctl

from burstctl.controller.app import Replica, build_replica
from burstctl.controller.config import load_config
from burstctl.controller.records import Counters, JobMeta

pytestmark = pytest.mark.integration


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


async def test_policy_switch_is_persisted_and_resumed(tmp_path: Path, caplog) -> None:
    config = load_config(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0", state_dir=tmp_path)
    svc = build_replica(config)
    await svc.start()
    try:
        svc.slot.switch("fcfs")
        with pytest.raises(ValueError, match="bogus"):
            svc.slot.switch("fcfs", {"bogus": 1})
        assert svc.slot.name == "fcfs"  # a failed switch changes nothing
    finally:
        await svc.stop(grace=0)
    saved = json.loads((tmp_path / "state.json").read_text())
    assert saved["policy"] == {
        "name": "fcfs",
        "params": {},
        "version": 1,
        "origin": config.replica_id,
    }
    assert saved["configured"] == {"name": "fair-share", "params": {}}

    again = build_replica(config)
    await again.start()
    try:
        assert again.slot.name == "fcfs" and again.slot.version == 1
    finally:
        await again.stop(grace=0)
    # the same configured policy, now named explicitly: the switch still holds
    explicit = build_replica(
        load_config(
            grpc_listen="127.0.0.1:0",
            http_listen="127.0.0.1:0",
            state_dir=tmp_path,
            policy="fair-share",
        )
    )
    await explicit.start()
    try:
        assert explicit.slot.name == "fcfs"
    finally:
        await explicit.stop(grace=0)
    # an edited configured policy wins over the saved switch, and says so
    edited = build_replica(
        load_config(
            grpc_listen="127.0.0.1:0",
            http_listen="127.0.0.1:0",
            state_dir=tmp_path,
            policy="greedy-yield",
        )
    )
    caplog.clear()
    await edited.start()
    try:
        assert (edited.slot.name, edited.slot.version) == ("greedy-yield", 2)
        assert "configured policy changed from fair-share" in caplog.text
    finally:
        await edited.stop(grace=0)
    saved = json.loads((tmp_path / "state.json").read_text())
    assert saved["configured"] == {"name": "greedy-yield", "params": {}}


async def test_corrupt_state_file_is_reported_and_kept(tmp_path: Path, caplog) -> None:
    (tmp_path / "state.json").write_text("{not json")
    svc = build_replica(
        load_config(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0", state_dir=tmp_path)
    )
    await svc.start()
    try:
        assert svc.slot.name == "fair-share"
        kept = tmp_path / "state.json.unreadable-1"
        assert str(tmp_path / "state.json") in caplog.text
        assert f"kept aside as {kept}" in caplog.text
    finally:
        await svc.stop(grace=0)
    assert kept.read_text() == "{not json"


@pytest.mark.parametrize("corrupt", ["state.json", "ledger.json", "profiles.json"])
async def test_an_unreadable_store_is_kept_aside_and_the_others_are_resumed(
    tmp_path: Path, caplog, corrupt: str
) -> None:
    """The one rule of the durable files (docs/controller.md, "Durable state"): whichever
    of the three cannot be parsed is kept aside with a warning naming both paths, its store
    starts empty, the replica starts, and the two others are resumed as they were."""

    def replica() -> Replica:
        return build_replica(
            load_config(grpc_listen="127.0.0.1:0", http_listen="127.0.0.1:0", state_dir=tmp_path)
        )

    first = replica()
    await first.start()
    try:
        first.slot.switch("fcfs")
        first.registrations.register(JobMeta("j1", "ann", "bio", 2, 1.0, app="wrf"))
        session = first.table.open_session(JobMeta("j1", "ann", "bio", 2, 1.0), "c1", "h")
        first.table.usage(session, 10, 1, 0.0, 0.25, False, Counters(10, 0, 10, 1, 0, 0.0))
        first.profiles.observe(("wrf", 2), 1e6, 1.0, None, 1)
    finally:
        await first.stop(grace=0)  # saves the ledger and the profiles
    assert {p.name for p in tmp_path.iterdir()} >= {"state.json", "ledger.json", "profiles.json"}
    (tmp_path / corrupt).write_text('{"not": "what it should be"')
    caplog.clear()

    second = replica()
    await second.start()
    try:
        assert second.ready
        kept = tmp_path / f"{corrupt}.unreadable-1"
        assert kept.read_text() == '{"not": "what it should be"'
        assert f"{tmp_path / corrupt}" in caplog.text and f"kept aside as {kept}" in caplog.text
        state = (second.slot.name, "j1" in second.table.registered)
        carried = second.ledger.carried.get("j1")
        profile = second.profiles.get(("wrf", 2))
        if corrupt == "state.json":
            assert state == ("fair-share", False)
        else:
            assert state == ("fcfs", True)
        if corrupt == "ledger.json":
            assert carried is None
        else:
            assert carried is not None and carried[0] == Counters(10, 0, 10, 1, 0, 0.0)
        if corrupt == "profiles.json":
            assert profile is None
        else:
            assert profile is not None and profile.phases == 1
    finally:
        await second.stop(grace=0)
    assert kept.exists()  # never overwritten by the stores that start without it


EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "controller.toml"


def test_restarts_with_the_example_configuration(
    controller_factory: type[ControllerProcess], tmp_path: Path
) -> None:
    """What the systemd unit does: the same configuration file at every restart. A switch
    through the API and a registered job survive it; an edit of the file's policy wins,
    and the log says so."""
    text = EXAMPLE_CONFIG.read_text()
    assert 'policy = "fair-share"' in text
    config = tmp_path / "controller.toml"
    config.write_text(text)
    state = tmp_path / "state"
    proc = controller_factory("--config", str(config), state_dir=state)  # flags: loopback ports
    auth = {"Authorization": "Bearer " + (state / "admin-token").read_text().strip()}

    def policy() -> tuple[str, int]:
        assert proc.url is not None
        body = httpx.get(proc.url + "/v1/policy", timeout=10).json()
        return body["name"], body["version"]

    def restart() -> None:
        assert proc.stop() == 0
        proc.log.clear()
        proc.start()

    assert policy() == ("fair-share", 0)
    assert proc.url is not None
    switched = httpx.put(proc.url + "/v1/policy", json={"name": "fcfs"}, headers=auth, timeout=10)
    assert switched.status_code == 200, switched.text
    job = {"job_id": "77", "user": "ann", "group": "chem", "nodes": 4}
    assert httpx.post(proc.url + "/v1/jobs", json=job, headers=auth, timeout=10).status_code == 201

    restart()
    assert policy() == ("fcfs", 1)
    assert proc.url is not None
    registered = httpx.get(proc.url + "/v1/jobs/77", timeout=10).json()
    assert (registered["user"], registered["nodes"], registered["registered"]) == ("ann", 4, True)
    assert not any("configured policy changed" in line for line in proc.log)

    config.write_text(text.replace('policy = "fair-share"', 'policy = "greedy-yield"'))
    restart()
    assert policy() == ("greedy-yield", 2)
    changed = [line for line in proc.log if "configured policy changed" in line]
    assert len(changed) == 1 and "fair-share" in changed[0] and "greedy-yield" in changed[0]

    restart()  # the edited file again: its policy stays, nothing to say
    assert policy() == ("greedy-yield", 2)
    assert not any("configured policy changed" in line for line in proc.log)
