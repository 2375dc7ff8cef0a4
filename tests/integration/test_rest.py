"""The REST admin API of a running replica (uvicorn on loopback, httpx as the client)."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from burstctl.controller.app import Service

pytestmark = pytest.mark.integration
Make = Callable[..., Awaitable[Service]]


def token_of(svc: Service) -> str:
    return (svc.config.state_dir / "admin-token").read_text().strip()


def auth(svc: Service) -> dict[str, str]:
    return {"Authorization": f"Bearer {token_of(svc)}"}


@pytest.fixture(autouse=True)
def _no_token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BURSTCTL_ADMIN_TOKEN", raising=False)


async def test_health_and_readiness(service: Service) -> None:
    async with httpx.AsyncClient(base_url=service.http_url) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = (await http.get("/readyz")).json()
        assert ready == {"status": "ready", "grpc": service.grpc_address}
        assert (await http.get("/docs")).status_code == 200
        assert "/v1/policy" in (await http.get("/openapi.json")).json()["paths"]


async def test_policies_lists_the_registry_with_parameter_schemas(service: Service) -> None:
    async with httpx.AsyncClient(base_url=service.http_url) as http:
        rows = {r["name"]: r for r in (await http.get("/v1/policies")).json()}
    assert set(rows) == set(service.registry.names())
    assert rows["size-fair"]["family"] == "statistical-tokens"
    assert rows["greedy-yield"]["family"] == "bandwidth-sharing"
    assert rows["periodic-greedy-yield"]["params_schema"]["properties"]["delta"]["type"] == (
        "number"
    )
    assert all(r["description"] for r in rows.values())


async def test_switch_is_applied_versioned_and_survives_a_restart(
    service_factory: Make, tmp_path: Path
) -> None:
    state = tmp_path / "st"
    svc = await service_factory(state_dir=state)
    token_file = state / "admin-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    async with httpx.AsyncClient(base_url=svc.http_url) as http:
        before = (await http.get("/v1/policy")).json()
        assert (before["name"], before["version"]) == ("fair-share", 0)
        r = await http.put(
            "/v1/policy",
            json={"name": "periodic-greedy-yield", "params": {"delta": 0.25}},
            headers=auth(svc),
        )
        assert r.status_code == 200, r.text
        assert (r.json()["name"], r.json()["params"], r.json()["version"]) == (
            "periodic-greedy-yield",
            {"delta": 0.25},
            1,
        )
    assert svc.policy.name == "periodic-greedy-yield" and svc.policy.params.delta == 0.25
    await svc.stop(grace=0)
    again = await service_factory(state_dir=state)  # same state dir, same token
    assert token_of(again) == token_file.read_text().strip()
    async with httpx.AsyncClient(base_url=again.http_url) as http:
        got = (await http.get("/v1/policy")).json()
    assert (got["name"], got["params"], got["version"]) == (
        "periodic-greedy-yield",
        {"delta": 0.25},
        1,
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "fastest"}, "name"),
        ({"name": "group>nobody"}, "name"),
        ({"name": "periodic-greedy-yield", "params": {"delta": "soon"}}, "params.delta"),
        ({"name": "periodic-greedy-yield", "params": {"delta": -1}}, "params.delta"),
        ({"name": "set-10", "params": {"speed": 3}}, "params.speed"),
        ({"name": "fcfs", "colour": "red"}, "colour"),
        ({"params": {}}, "name"),
        ({"name": 7}, "name"),
    ],
)
async def test_bad_switch_is_422_naming_the_field_and_changes_nothing(
    service: Service, body: dict[str, object], field: str
) -> None:
    async with httpx.AsyncClient(base_url=service.http_url) as http:
        r = await http.put("/v1/policy", json=body, headers=auth(service))
        assert r.status_code == 422, r.text
        locs = [".".join(str(p) for p in d["loc"][1:]) for d in r.json()["detail"]]
        assert field in locs, r.json()
        assert (await http.get("/v1/policy")).json()["version"] == 0
    assert service.policy.name == "fair-share" and service.policy_version == 0


async def test_malformed_json_is_422(service: Service) -> None:
    async with httpx.AsyncClient(base_url=service.http_url) as http:
        r = await http.put(
            "/v1/policy",
            content=b'{"name": "fcfs"',
            headers={**auth(service), "Content-Type": "application/json"},
        )
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    assert service.policy_version == 0


async def test_switch_needs_the_right_token(service: Service) -> None:
    async with httpx.AsyncClient(base_url=service.http_url) as http:
        r = await http.put("/v1/policy", json={"name": "fcfs"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        r = await http.put(
            "/v1/policy", json={"name": "fcfs"}, headers={"Authorization": "Bearer nope"}
        )
        assert r.status_code == 403
        r = await http.put(
            "/v1/policy", json={"name": "fcfs"}, headers={"Authorization": "Basic eDp5"}
        )
        assert r.status_code == 401
    assert service.policy.name == "fair-share"


async def test_token_from_environment_and_protected_reads(
    service_factory: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BURSTCTL_ADMIN_TOKEN", "s3cret")
    svc = await service_factory(protect_reads=True)
    assert not (svc.config.state_dir / "admin-token").exists()
    async with httpx.AsyncClient(base_url=svc.http_url) as http:
        assert (await http.get("/v1/policy")).status_code == 401
        assert (await http.get("/healthz")).status_code == 200  # probes stay open
        ok = {"Authorization": "Bearer s3cret"}
        assert (await http.get("/v1/policy", headers=ok)).status_code == 200
        r = await http.put("/v1/policy", json={"name": "fcfs"}, headers=ok)
        assert r.status_code == 200 and r.json()["version"] == 1


async def test_token_file_option(service_factory: Make, tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("from-file\n")
    svc = await service_factory(admin_token_file=path)
    async with httpx.AsyncClient(base_url=svc.http_url) as http:
        r = await http.put(
            "/v1/policy", json={"name": "fcfs"}, headers={"Authorization": "Bearer from-file"}
        )
    assert r.status_code == 200


async def test_replicas_without_peers(service: Service) -> None:
    async with httpx.AsyncClient(base_url=service.http_url) as http:
        got = (await http.get("/v1/replicas")).json()
    assert got["replica_id"] == service.config.replica_id
    assert got["capacity"] == service.config.capacity
    assert got["peers"] == [] and got["sync_interval_s"] is None


async def test_busy_rest_port_fails_start_clearly(service_factory: Make, service: Service) -> None:
    port = service.http_url.rsplit(":", 1)[1]
    with pytest.raises(OSError, match=rf"cannot listen on 127\.0\.0\.1:{port} \(REST\)"):
        await service_factory(http_listen=f"127.0.0.1:{port}")
    async with httpx.AsyncClient(base_url=service.http_url) as http:
        assert (await http.get("/healthz")).status_code == 200  # the first one is unharmed


def burstctl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BURSTCTL_")}
    return subprocess.run(
        [sys.executable, "-m", "burstctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


async def test_cli_lists_gets_and_sets(service: Service) -> None:
    url = ["--url", service.http_url]
    listed = await asyncio.to_thread(burstctl, "policy", "list", *url)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert set(rows) == set(service.registry.names())
    assert "params: delta" in rows["periodic-greedy-yield"]
    got = await asyncio.to_thread(burstctl, "policy", "get", *url)
    assert got.stdout.splitlines()[0] == "fair-share"
    assert f"version 0 on replica {service.config.replica_id}" in got.stdout
    token = ["--token", token_of(service)]
    bad = await asyncio.to_thread(
        burstctl, "policy", "set", "set-10", "--param", "learn=maybe", *url, *token
    )
    assert bad.returncode != 0 and "params.learn" in bad.stderr
    ok = await asyncio.to_thread(
        burstctl, "policy", "set", "set-10", "--param", "learn=false", *url, *token
    )
    assert ok.returncode == 0 and "set-10 active (version 1)" in ok.stdout
    assert service.policy.name == "set-10" and service.policy.params.learn is False
    down = await asyncio.to_thread(burstctl, "policy", "get", "--url", "http://127.0.0.1:9")
    assert down.returncode != 0 and "cannot reach the controller" in down.stderr
