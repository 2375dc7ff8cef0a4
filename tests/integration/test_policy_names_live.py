"""Policy names are registry names (issue 15, finding 2), on running replicas.

``PUT /v1/policy`` with a name that is no registered name and no sharing spec is a 422
naming ``name``: nothing imported, nothing persisted, nothing switched. A parameter
out of its range is a 422 naming the parameter. A ``state.json`` whose saved policy
cannot be built never stops a start (the crash loop of the issue): the replica starts
with its configured policy and says why in a warning.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import async_wait_until, wait_until
from test_rest import auth

from burstctl.client import JobInfo, Session
from burstctl.controller.app import Replica
from burstctl.policies.greedy import MIN_DELTA

pytestmark = pytest.mark.integration
Make = Callable[..., Awaitable[Replica]]
MiB = 1 << 20

HOSTILE = [
    "burstctl.policies.base:Policy",
    "burstctl.policies.fcfs:Fcfs",
    "this:x",
    "..:x",
    ".:x",
    ":x",
    "os:system",
    "this",
    "x" * 300,
]


@pytest.fixture(autouse=True)
def _no_token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BURSTCTL_ADMIN_TOKEN", raising=False)


def only_loc(response: httpx.Response) -> list[list[Any]]:
    """The ``loc`` of each error of a FastAPI validation 422."""
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list), detail  # the shape of every other 422
    assert all(d["msg"] for d in detail), detail
    return [d["loc"] for d in detail]


@pytest.mark.parametrize("name", [*HOSTILE, "probe"])
async def test_a_name_that_is_no_registry_name_is_422_naming_name_and_changes_nothing(
    replica_factory: Make, probe: str, name: str
) -> None:
    name = f"{probe}:Probe" if name == "probe" else name
    had_this = "this" in sys.modules
    svc = await replica_factory()
    state = svc.store.path
    async with httpx.AsyncClient(base_url=svc.http_url, headers=auth(svc)) as http:
        assert only_loc(await http.put("/v1/policy", json={"name": name})) == [["body", "name"]]
        assert not state.exists()  # nothing persisted
        r = await http.put("/v1/policy", json={"name": "size-fair"})
        assert r.status_code == 200, r.text
        before = state.read_bytes()
        r = await http.put("/v1/policy", json={"name": name, "params": {}})
        assert only_loc(r) == [["body", "name"]]
        if len(name) < 100:
            assert repr(name) in r.json()["detail"][0]["msg"]
        got = (await http.get("/v1/policy")).json()
    assert (got["name"], got["version"]) == ("size-fair", 1)
    assert (svc.slot.name, svc.slot.version, svc.slot.policy.name) == ("size-fair", 1, "size")
    assert state.read_bytes() == before
    assert ("this" in sys.modules) == had_this and probe not in sys.modules  # nothing imported


@pytest.mark.parametrize("delta", [1e-300, MIN_DELTA / 10, 1e9])
async def test_delta_out_of_range_is_422_naming_delta(replica: Replica, delta: float) -> None:
    async with httpx.AsyncClient(base_url=replica.http_url, headers=auth(replica)) as http:
        r = await http.put(
            "/v1/policy", json={"name": "periodic-greedy-yield", "params": {"delta": delta}}
        )
        assert only_loc(r) == [["body", "params", "delta"]]
        assert (await http.get("/v1/policy")).json()["version"] == 0
    assert not replica.store.path.exists()
    assert (replica.slot.name, replica.slot.version) == ("fair-share", 0)


# -- start-up with a saved policy that cannot be built -------------------------------------

UNUSABLE: list[tuple[str, dict[str, Any], str]] = [
    ("burstctl.policies.base:Policy", {}, "unknown policy"),
    ("this:x", {}, "unknown policy"),
    ("..:x", {}, "unknown policy"),
    (":x", {}, "unknown policy"),
    ("gone-policy", {}, "unknown policy"),
    ("periodic-greedy-yield", {"delta": 1e-300}, "delta"),
    ("fcfs", {"bogus": 1}, "bogus"),
]


def save(state_dir: Path, name: str, params: dict[str, Any], configured: str) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "state.json"
    path.write_text(
        json.dumps(
            {
                "policy": {"name": name, "params": params, "version": 7, "origin": "r9"},
                "configured": {"name": configured, "params": {}},
                "jobs": [],
            }
        )
    )
    return path


@pytest.mark.parametrize(("name", "params", "why"), UNUSABLE)
async def test_an_unusable_saved_policy_never_stops_a_start(
    replica_factory: Make,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    name: str,
    params: dict[str, Any],
    why: str,
) -> None:
    had_this = "this" in sys.modules
    state_dir = tmp_path / "st"
    save(state_dir, name, params, configured="size-fair")
    caplog.set_level(logging.INFO)
    svc = await replica_factory(state_dir=state_dir, policy="size-fair")
    assert (svc.slot.name, svc.slot.version, svc.slot.policy.name) == ("size-fair", 0, "size")
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "burstctl.controller.state"
    ]
    assert len(warnings) == 1, caplog.text
    assert repr(name) in warnings[0] and "unusable" in warnings[0] and why in warnings[0]
    assert ("this" in sys.modules) == had_this
    # and it decides: a job gets its rate, b_i = 2 nodes × 8 MiB/s
    s = await asyncio.to_thread(Session, svc.grpc_address, JobInfo("j1", "ann", "bio", nodes=2))
    try:
        await asyncio.to_thread(s.acquire, 1 * MiB)
        await async_wait_until(lambda: s.rate > 0, 5, message="a rate")
        assert s.rate == pytest.approx(16 * MiB)
    finally:
        await asyncio.to_thread(s.close)


def test_a_controller_process_restarts_with_an_unusable_saved_policy(
    controller_factory: Any, tmp_path: Path
) -> None:
    """The crash loop of the issue, as systemd would see it: every start must come up."""
    state_dir = tmp_path / "st"
    save(state_dir, "burstctl.policies.base:Policy", {}, configured="fair-share")
    for _ in range(2):  # and again: a start leaves nothing that stops the next one
        proc = controller_factory(state_dir=state_dir)
        assert proc.url is not None, "".join(proc.log)
        got = httpx.get(f"{proc.url}/v1/policy", timeout=5).json()
        assert (got["name"], got["version"]) == ("fair-share", 0)
        assert wait_until(
            lambda p=proc: any("WARNING" in line and "unusable" in line for line in p.log),
            5,
            message="the warning",
        )
        # and it decides (the unusable policy failed every decision): 1 node × 256 MiB/s
        assert proc.address is not None
        with Session(proc.address, JobInfo("j1", "ann", "bio", nodes=1)) as s:
            s.acquire(64 * 1024)
            wait_until(lambda s=s: s.rate > 0, 5, message="a rate")
            assert s.rate == pytest.approx(256 * MiB)
        assert proc.stop() == 0, "".join(proc.log)


def test_a_configured_parameter_out_of_range_is_a_configuration_error(
    controller_factory: Any, tmp_path: Path
) -> None:
    config = tmp_path / "controller.toml"
    config.write_text('policy = "periodic-greedy-yield"\n[policy_params]\ndelta = 1e-300\n')
    proc = controller_factory("--config", str(config))
    assert proc.url is None
    assert proc.stop() not in (0, None)
    log = "".join(proc.log)
    assert "delta" in log and "greater than or equal to 0.001" in log, log


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An installed distribution (dist-info on sys.path) with two ``burstctl.policies``
    entry points: a policy, and one whose module does not exist."""
    module = f"thirdparty_{uuid.uuid4().hex}"
    (tmp_path / f"{module}.py").write_text(
        "from burstctl.policies.fcfs import Fcfs\n\n\n"
        "class ThirdParty(Fcfs):\n    '''First come, from elsewhere.'''\n\n"
        "    name = 'third-party'\n"
    )
    dist = tmp_path / "burstctl_thirdparty-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: burstctl-thirdparty\nVersion: 1.0\n"
    )
    (dist / "entry_points.txt").write_text(
        f"[burstctl.policies]\nthird-party = {module}:ThirdParty\nbroken = {module}_gone:X\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield module
    sys.modules.pop(module, None)


async def test_an_entry_point_policy_is_listed_and_switched_to_by_name(
    replica_factory: Make, third_party: str
) -> None:
    svc = await replica_factory()
    async with httpx.AsyncClient(base_url=svc.http_url, headers=auth(svc)) as http:
        listed = await http.get("/v1/policies")
        assert listed.status_code == 200, listed.text
        rows = {r["name"]: r for r in listed.json()}
        assert rows["third-party"]["family"] == "external" and "broken" not in rows
        assert only_loc(await http.put("/v1/policy", json={"name": "broken"})) == [["body", "name"]]
        assert only_loc(
            await http.put("/v1/policy", json={"name": f"{third_party}:ThirdParty"})
        ) == [["body", "name"]]
        r = await http.put("/v1/policy", json={"name": "third-party"})
        assert r.status_code == 200, r.text
    assert (svc.slot.name, svc.slot.version) == ("third-party", 1)
    assert type(svc.slot.policy).__module__ == third_party
