"""The REST admin API of a running replica (uvicorn on loopback, httpx as the client)."""

from __future__ import annotations

import asyncio
import re
import stat
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import Pump, async_wait_until, clean_env, run_burstctl

from burstctl.client import JobInfo, Session
from burstctl.controller.app import Replica

pytestmark = pytest.mark.integration
Make = Callable[..., Awaitable[Replica]]


def token_of(svc: Replica) -> str:
    return (svc.config.state_dir / "admin-token").read_text().strip()


def auth(svc: Replica) -> dict[str, str]:
    return {"Authorization": f"Bearer {token_of(svc)}"}


@pytest.fixture(autouse=True)
def _no_token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BURSTCTL_ADMIN_TOKEN", raising=False)


async def test_health_and_readiness(replica: Replica) -> None:
    async with httpx.AsyncClient(base_url=replica.http_url) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = (await http.get("/readyz")).json()
        assert ready == {"status": "ready", "grpc": replica.grpc_address}
        assert (await http.get("/docs")).status_code == 200
        assert "/v1/policy" in (await http.get("/openapi.json")).json()["paths"]


async def test_policies_lists_the_registry_with_parameter_schemas(replica: Replica) -> None:
    async with httpx.AsyncClient(base_url=replica.http_url) as http:
        rows = {r["name"]: r for r in (await http.get("/v1/policies")).json()}
    assert set(rows) == set(replica.slot.registry.names())
    assert rows["size-fair"]["family"] == "statistical-tokens"
    assert rows["greedy-yield"]["family"] == "bandwidth-sharing"
    assert rows["periodic-greedy-yield"]["params_schema"]["properties"]["delta"]["type"] == (
        "number"
    )
    assert all(r["description"] for r in rows.values())


async def test_switch_is_applied_versioned_and_survives_a_restart(
    replica_factory: Make, tmp_path: Path
) -> None:
    state = tmp_path / "st"
    svc = await replica_factory(state_dir=state)
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
    assert svc.slot.name == "periodic-greedy-yield" and svc.slot.policy.params.delta == 0.25
    await svc.stop(grace=0)
    again = await replica_factory(state_dir=state)  # same state dir, same token
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
    replica: Replica, body: dict[str, object], field: str
) -> None:
    async with httpx.AsyncClient(base_url=replica.http_url) as http:
        r = await http.put("/v1/policy", json=body, headers=auth(replica))
        assert r.status_code == 422, r.text
        locs = [".".join(str(p) for p in d["loc"][1:]) for d in r.json()["detail"]]
        assert field in locs, r.json()
        assert (await http.get("/v1/policy")).json()["version"] == 0
    assert replica.slot.name == "fair-share" and replica.slot.version == 0


async def test_malformed_json_is_422(replica: Replica) -> None:
    async with httpx.AsyncClient(base_url=replica.http_url) as http:
        r = await http.put(
            "/v1/policy",
            content=b'{"name": "fcfs"',
            headers={**auth(replica), "Content-Type": "application/json"},
        )
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    assert replica.slot.version == 0


async def test_switch_needs_the_right_token(replica: Replica) -> None:
    async with httpx.AsyncClient(base_url=replica.http_url) as http:
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
    assert replica.slot.name == "fair-share"


async def test_token_from_environment_and_protected_reads(
    replica_factory: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BURSTCTL_ADMIN_TOKEN", "s3cret")
    svc = await replica_factory(protect_reads=True)
    assert not (svc.config.state_dir / "admin-token").exists()
    async with httpx.AsyncClient(base_url=svc.http_url) as http:
        assert (await http.get("/v1/policy")).status_code == 401
        assert (await http.get("/healthz")).status_code == 200  # probes stay open
        ok = {"Authorization": "Bearer s3cret"}
        assert (await http.get("/v1/policy", headers=ok)).status_code == 200
        r = await http.put("/v1/policy", json={"name": "fcfs"}, headers=ok)
        assert r.status_code == 200 and r.json()["version"] == 1


# Every status each route answers, as /openapi.json must document it (issue 15 REST schema).
TOKEN_CHECK = {"401", "403"}
STATUSES = {
    ("get", "/healthz"): {"200"},
    ("get", "/readyz"): {"200", "503"},
    ("get", "/v1/policies"): {"200"},
    ("get", "/v1/policy"): {"200"},
    ("put", "/v1/policy"): {"200", "422", "503"} | TOKEN_CHECK,
    ("get", "/v1/replicas"): {"200"},
    ("get", "/v1/jobs"): {"200", "422"},
    ("post", "/v1/jobs"): {"200", "201", "422", "503"} | TOKEN_CHECK,
    ("get", "/v1/jobs/{job_id}"): {"200", "404", "422"},
    ("get", "/v1/schedules"): {"200"},
    ("get", "/v1/capacity"): {"200"},
    ("get", "/v1/placement"): {"200", "422"},
    ("post", "/v1/placement"): {"200", "422"},
    ("delete", "/v1/jobs/{job_id}"): {"204", "404", "422", "503"} | TOKEN_CHECK,
    ("delete", "/v1/capacity/parked/{job_id}"): {"204", "404", "422"} | TOKEN_CHECK,
    ("get", "/metrics"): {"200"},
    ("get", "/v1/rules"): {"200"},
    ("get", "/v1/rules/{name}"): {"200", "404", "422"},
    ("post", "/v1/rules"): {"201", "409", "422", "503"} | TOKEN_CHECK,
    ("put", "/v1/rules/{name}"): {"200", "201", "409", "422", "503"} | TOKEN_CHECK,
    ("delete", "/v1/rules/{name}"): {"204", "404", "422", "503"} | TOKEN_CHECK,
}
MUTATIONS = {
    ("put", "/v1/policy"),
    ("post", "/v1/jobs"),
    ("delete", "/v1/jobs/{job_id}"),
    ("delete", "/v1/capacity/parked/{job_id}"),
    ("post", "/v1/rules"),
    ("put", "/v1/rules/{name}"),
    ("delete", "/v1/rules/{name}"),
}
HEALTH = {("get", "/healthz"), ("get", "/readyz")}


@pytest.mark.parametrize("protect_reads", [False, True])
async def test_schema_documents_every_status_and_where_the_token_is_needed(
    replica_factory: Make, protect_reads: bool
) -> None:
    svc = await replica_factory(protect_reads=protect_reads)
    async with httpx.AsyncClient(base_url=svc.http_url, headers=auth(svc)) as http:
        schema = (await http.get("/openapi.json")).json()
    ops = {(m, p): op for p, item in schema["paths"].items() for m, op in item.items()}
    assert set(ops) == set(STATUSES)
    for key, op in ops.items():
        guarded = key in MUTATIONS or (protect_reads and key not in HEALTH)
        want = STATUSES[key] | (TOKEN_CHECK if guarded else set())
        assert set(op["responses"]) == want, key
        assert bool(op.get("security")) == guarded, key
        for status in want - {"200", "201", "204", "422"}:  # {"detail": "..."}, as answered
            content = op["responses"][status]["content"]
            assert list(content) == ["application/json"], (key, status)
    assert "WWW-Authenticate" in ops[("put", "/v1/policy")]["responses"]["401"]["headers"]
    assert "X-Total-Count" in ops[("get", "/v1/jobs")]["responses"]["200"]["headers"]


async def test_token_file_option(replica_factory: Make, tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("from-file\n")
    svc = await replica_factory(admin_token_file=path)
    async with httpx.AsyncClient(base_url=svc.http_url) as http:
        r = await http.put(
            "/v1/policy", json={"name": "fcfs"}, headers={"Authorization": "Bearer from-file"}
        )
    assert r.status_code == 200


async def test_replicas_without_peers(replica: Replica) -> None:
    async with httpx.AsyncClient(base_url=replica.http_url) as http:
        got = (await http.get("/v1/replicas")).json()
    assert got["replica_id"] == replica.config.replica_id
    assert got["capacity"] == replica.config.capacity
    assert got["peers"] == [] and got["sync_interval_s"] is None


async def test_busy_rest_port_fails_start_clearly(replica_factory: Make, replica: Replica) -> None:
    port = replica.http_url.rsplit(":", 1)[1]
    with pytest.raises(OSError, match=rf"cannot listen on 127\.0\.0\.1:{port} \(REST\)"):
        await replica_factory(http_listen=f"127.0.0.1:{port}")
    async with httpx.AsyncClient(base_url=replica.http_url) as http:
        assert (await http.get("/healthz")).status_code == 200  # the first one is unharmed


def burstctl(*args: str) -> subprocess.CompletedProcess[str]:
    return run_burstctl(*args, env=clean_env())


async def test_cli_lists_gets_and_sets(replica: Replica) -> None:
    url = ["--url", replica.http_url]
    listed = await asyncio.to_thread(burstctl, "policy", "list", *url)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()}
    assert set(rows) == set(replica.slot.registry.names())
    assert "params: delta" in rows["periodic-greedy-yield"]
    got = await asyncio.to_thread(burstctl, "policy", "get", *url)
    assert got.stdout.splitlines()[0] == "fair-share"
    assert f"version 0 on replica {replica.config.replica_id}" in got.stdout
    token = ["--token", token_of(replica)]
    bad = await asyncio.to_thread(
        burstctl, "policy", "set", "set-10", "--param", "learn=maybe", *url, *token
    )
    assert bad.returncode != 0 and "params.learn" in bad.stderr
    ok = await asyncio.to_thread(
        burstctl, "policy", "set", "set-10", "--param", "learn=false", *url, *token
    )
    assert ok.returncode == 0 and "set-10 active (version 1)" in ok.stdout
    assert replica.slot.name == "set-10" and replica.slot.policy.params.learn is False
    down = await asyncio.to_thread(burstctl, "policy", "get", "--url", "http://127.0.0.1:9")
    assert down.returncode != 0 and "cannot reach the controller" in down.stderr


def move(session: Session, kind: str, nbytes: int, chunks: int = 4) -> None:
    with session.operation(kind):
        for _ in range(chunks):
            session.acquire(nbytes // chunks, kind)


async def test_jobs_report_metadata_bytes_by_kind_and_sessions(replica: Replica) -> None:
    s = await asyncio.to_thread(Session, replica.grpc_address, JobInfo("7", "ann", "bio", nodes=2))
    try:
        await asyncio.to_thread(move, s, "write", 3 << 20)
        await asyncio.to_thread(move, s, "read", 1 << 20)
        async with httpx.AsyncClient(base_url=replica.http_url) as http:

            async def reported() -> dict[str, object] | None:
                j = (await http.get("/v1/jobs/7")).json()
                return j if j["bytes_moved"] == 4 << 20 else None

            j = await async_wait_until(reported, 5, message="usage reported")
            assert isinstance(j, dict)
            assert (j["bytes_written"], j["bytes_read"]) == (3 << 20, 1 << 20)
            assert (j["user"], j["group"], j["nodes"], j["registered"]) == ("ann", "bio", 2, False)
            assert j["active"] and j["sessions"] == 1
            assert j["replicas"] == [replica.config.replica_id]
            assert 0 < j["yield"] <= 1.0 + 1e-9
            assert [x["job_id"] for x in (await http.get("/v1/jobs")).json()] == ["7"]
            assert (await http.get("/v1/jobs/8")).status_code == 404
    finally:
        await asyncio.to_thread(s.close)


async def test_registered_metadata_wins_and_survives_a_restart(
    replica_factory: Make, tmp_path: Path
) -> None:
    state = tmp_path / "st"
    svc = await replica_factory(state_dir=state)
    body = {"job_id": "42", "user": "alice", "group": "phys", "nodes": 4, "priority": 2.0}
    async with httpx.AsyncClient(base_url=svc.http_url, headers=auth(svc)) as http:
        r = await http.post("/v1/jobs", json=body)
        assert r.status_code == 201 and r.json()["registered"] and not r.json()["active"]
        r = await http.post("/v1/jobs", json={**body, "nodes": 8})
        assert r.status_code == 200 and r.json()["nodes"] == 8  # an update
    # the owner's client claiming other metadata for job 42 gets the registered one (another
    # user's is refused: tests/integration/test_trust.py)
    claim = JobInfo("42", "alice", "evil", nodes=64)
    s = await asyncio.to_thread(Session, svc.grpc_address, claim)
    try:
        await async_wait_until(lambda: "42" in svc.table.jobs, 5, message="session open")
        meta = svc.table.jobs["42"].meta
        assert (meta.user, meta.group, meta.nodes, meta.priority) == ("alice", "phys", 8, 2.0)
    finally:
        await asyncio.to_thread(s.close)
    await svc.stop(grace=0)
    again = await replica_factory(state_dir=state)
    async with httpx.AsyncClient(base_url=again.http_url, headers=auth(again)) as http:
        j = (await http.get("/v1/jobs/42")).json()
        assert (j["user"], j["nodes"], j["registered"]) == ("alice", 8, True)
        assert (await http.delete("/v1/jobs/42")).status_code == 204
        r = await http.delete("/v1/jobs/42")
        assert r.status_code == 404 and "not registered" in r.json()["detail"]
        assert (await http.get("/v1/jobs")).json() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"user": "a", "group": "g", "nodes": 1}, "job_id"),
        ({"job_id": "", "user": "a", "group": "g", "nodes": 1}, "job_id"),
        ({"job_id": "1", "user": "a", "group": "g", "nodes": 0}, "nodes"),
        ({"job_id": "1", "user": "a", "group": "g", "nodes": "four"}, "nodes"),
        ({"job_id": "1", "user": "a", "group": "g", "nodes": 1, "priority": -1}, "priority"),
        ({"job_id": "1", "user": "a", "nodes": 1}, "group"),
        ({"job_id": "1", "user": "a", "group": "g", "nodes": 1, "queue": "x"}, "queue"),
        # what a client's Hello and a peer's digest would refuse (common/limits.py)
        ({"job_id": "1\n2", "user": "a", "group": "g", "nodes": 1}, "job_id"),
        ({"job_id": "1", "user": "a", "group": "g", "nodes": (1 << 20) + 1}, "nodes"),
    ],
)
async def test_bad_registration_is_422_naming_the_field(
    replica: Replica, body: dict[str, object], field: str
) -> None:
    async with httpx.AsyncClient(base_url=replica.http_url, headers=auth(replica)) as http:
        r = await http.post("/v1/jobs", json=body)
        assert r.status_code == 422
        assert field in [d["loc"][-1] for d in r.json()["detail"]], r.json()
        assert (await http.get("/v1/jobs")).json() == []


async def test_job_mutations_need_the_token(replica: Replica) -> None:
    body = {"job_id": "1", "user": "a", "group": "g", "nodes": 1}
    async with httpx.AsyncClient(base_url=replica.http_url) as http:
        assert (await http.post("/v1/jobs", json=body)).status_code == 401
        assert (await http.delete("/v1/jobs/1")).status_code == 401
        wrong = {"Authorization": "Bearer x"}
        assert (await http.post("/v1/jobs", json=body, headers=wrong)).status_code == 403
    assert replica.table.registered == {}


async def test_cli_registers_lists_and_retires_jobs(replica: Replica) -> None:
    url = ["--url", replica.http_url, "--token", token_of(replica)]
    reg = await asyncio.to_thread(
        burstctl, "job", "register", "99", "--user", "bob", "--group", "chem", "--nodes", "3", *url
    )
    assert reg.returncode == 0 and "job 99 registered (bob/chem, 3 nodes)" in reg.stdout
    listed = await asyncio.to_thread(burstctl, "jobs", *url)
    header, row = listed.stdout.splitlines()
    assert header.split()[:5] == ["job", "user", "group", "nodes", "state"]
    assert row.split()[:5] == ["99", "bob", "chem", "3", "inactive*"]
    gone = await asyncio.to_thread(burstctl, "job", "retire", "99", *url)
    assert gone.returncode == 0 and "job 99 retired" in gone.stdout
    again = await asyncio.to_thread(burstctl, "job", "retire", "99", *url)
    assert again.returncode != 0 and "not registered" in again.stderr


async def test_metrics_parse_and_carry_the_series(replica: Replica) -> None:
    s = await asyncio.to_thread(Session, replica.grpc_address, JobInfo("m1", "ann", "bio", nodes=2))
    try:
        await asyncio.to_thread(move, s, "write", 2 << 20)
        async with httpx.AsyncClient(base_url=replica.http_url, headers=auth(replica)) as http:
            r = await http.put("/v1/policy", json={"name": "fcfs"})
            assert r.status_code == 200
            await async_wait_until(
                lambda: replica.table.jobs["m1"].bytes_moved == 2 << 20, 5, message="usage"
            )
            r = await http.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        families = {f.name: f for f in text_string_to_metric_families(r.text)}
        replica = replica.config.replica_id

        def value(name: str, **labels: str) -> float:
            samples = [
                s
                for s in families[name].samples
                if all(s.labels.get(k) == v for k, v in labels.items())
            ]
            assert len(samples) == 1, (name, labels, families[name].samples)
            return samples[0].value

        job = {"job": "m1", "user": "ann", "group": "bio"}
        assert value("burstctl_job_written_bytes", **job) == 2 << 20
        assert value("burstctl_job_read_bytes", **job) == 0
        assert value("burstctl_job_moved_bytes", **job) == 2 << 20
        assert value("burstctl_job_ops", **job) >= 4
        assert value("burstctl_job_active", **job) == 1
        assert 0 < value("burstctl_job_yield", **job) <= 1 + 1e-9
        assert "burstctl_job_rate_bytes_per_second" in families
        assert "burstctl_job_token_wait_seconds" in families
        assert "burstctl_job_metadata_ops" in families
        assert value("burstctl_capacity_bytes_per_second", replica=replica) == 40 * 2**20
        assert 0 <= value("burstctl_utilisation", replica=replica) <= 1
        assert value("burstctl_decisions", replica=replica) >= 1
        assert value("burstctl_sessions", replica=replica) == 1
        assert value("burstctl_policy_switches", replica=replica) == 1
        assert value("burstctl_policy_info", replica=replica, policy="fcfs", version="1") == 1
        latency = families["burstctl_decision_latency_seconds"]
        count = [s.value for s in latency.samples if s.name.endswith("_count")]
        assert count == [value("burstctl_decisions", replica=replica)]
    finally:
        await asyncio.to_thread(s.close)


async def test_peer_series_in_metrics(replica_factory: Make) -> None:
    from test_replicas import cluster

    r1, _ = await cluster(replica_factory, [40, 40])
    assert r1.peer_sync is not None
    await async_wait_until(
        lambda: r1.peer_sync.membership.live_peers() == ["r2"], 5, message="r2 live"
    )
    async with httpx.AsyncClient(base_url=r1.http_url) as http:
        text = (await http.get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (live,) = families["burstctl_peer_live"].samples
    assert (live.labels, live.value) == ({"replica": "r1", "peer": "r2"}, 1.0)
    (age,) = families["burstctl_peer_exchange_age_seconds"].samples
    assert 0 <= age.value < 5


async def test_top_shows_jobs_and_their_throughput(
    replica: Replica, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "160")  # rich wraps cells at 80 columns without a terminal
    s = await asyncio.to_thread(Session, replica.grpc_address, JobInfo("t1", "ann", "bio", nodes=2))
    pump = Pump(s).start()
    try:
        out = await asyncio.to_thread(
            burstctl, "top", "--url", replica.http_url, "--iterations", "3", "--interval", "0.3"
        )
    finally:
        await asyncio.to_thread(pump.stop)
        await asyncio.to_thread(s.close)
    assert out.returncode == 0, out.stderr
    assert "policy fair-share (version 0)" in out.stdout
    rows = [line for line in out.stdout.splitlines() if " t1 " in f" {line} "]
    assert rows, out.stdout
    # the last refresh measured the job moving: a non-zero throughput in MiB/s
    assert any(float(x) > 0 for x in re.findall(r"([\d.]+) MiB/s", rows[-1])), rows[-1]
    assert not pump.errors


async def test_switch_under_load_keeps_bytes_moving_within_capacity(replica: Replica) -> None:
    jobs = [JobInfo(f"L{i}", f"u{i % 2}", "g", nodes=i + 1) for i in range(3)]
    sessions = [await asyncio.to_thread(Session, replica.grpc_address, j) for j in jobs]
    pumps = [Pump(s).start() for s in sessions]
    bound = replica.config.capacity * (1 + replica.config.push_tolerance)
    worst = 0.0

    def after_decision(latency: float) -> None:
        # the rates in force once the decision has pushed: never above B (+ push tolerance)
        nonlocal worst
        worst = max(worst, sum(s.rate or 0.0 for s in replica.table.sessions.values()))

    replica.scheduler._observe_latency = after_decision  # called after every decision
    policies = ["fcfs", "size-fair", "greedy-yield", "group>user>size", "fair-share"] * 4
    try:
        await async_wait_until(lambda: all(s.rate > 0 for s in sessions), 5, message="rates")
        before = [p.moved for p in pumps]
        t0 = time.monotonic()
        async with httpx.AsyncClient(base_url=replica.http_url, headers=auth(replica)) as http:
            for name in policies:
                r = await http.put("/v1/policy", json={"name": name})
                assert r.status_code == 200
                # let the clients run under each policy for a moment (load, not sync)
                await asyncio.sleep(0.05)
        elapsed = time.monotonic() - t0
        moved = [p.moved - b for p, b in zip(pumps, before, strict=True)]
    finally:
        await asyncio.to_thread(lambda: [p.stop() for p in pumps])
        await asyncio.to_thread(lambda: [s.close() for s in sessions])
    assert not any(p.errors for p in pumps)
    assert replica.slot.version == len(policies)
    assert replica.scheduler.stats.clamped == 0
    print(f"20 switches in {elapsed:.2f}s: {sum(moved) / elapsed / 2**20:.1f} MiB/s moved")
    assert 0 < worst <= bound, (worst, bound)
    # bytes kept moving through 20 switches: the aggregate stays near B
    assert sum(moved) / elapsed >= 0.8 * replica.config.capacity, (sum(moved) / elapsed, moved)


async def test_replicas_lists_live_peers_with_their_policy(replica_factory: Make) -> None:
    from test_replicas import cluster

    r1, r2 = await cluster(replica_factory, [40, 20])
    assert r1.peer_sync is not None
    await async_wait_until(
        lambda: r1.peer_sync.membership.live_peers() == ["r2"], 5, message="r2 live"
    )
    async with httpx.AsyncClient(base_url=r1.http_url) as http:
        got = (await http.get("/v1/replicas")).json()
    assert (got["replica_id"], got["capacity"], got["sync_interval_s"]) == ("r1", 40 * 2**20, 0.2)
    (peer,) = got["peers"]
    assert (peer["replica_id"], peer["live"], peer["capacity"]) == ("r2", True, 20 * 2**20)
    assert (peer["policy"], peer["policy_version"], peer["jobs"]) == ("size-fair", 0, 0)
    assert 0 <= peer["last_exchange_age_s"] < 5
    await r2.stop(grace=0)  # r2 goes away: after k·λ it is listed as not live
    async with httpx.AsyncClient(base_url=r1.http_url) as http:

        async def dropped() -> bool:
            peers = (await http.get("/v1/replicas")).json()["peers"]
            return peers[0]["live"] is False

        await async_wait_until(dropped, 5, interval=0.02, message="r2 dropped")


async def test_unwritable_state_is_503_and_changes_nothing(
    replica: Replica, tmp_path: Path
) -> None:
    s = await asyncio.to_thread(Session, replica.grpc_address, JobInfo("5", "ann", "bio", nodes=2))
    try:
        await async_wait_until(lambda: "5" in replica.table.jobs, 5, message="session open")
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("")
        replica.store.file.path = blocker / "state" / "state.json"  # mkdir: NotADirectoryError
        async with httpx.AsyncClient(base_url=replica.http_url, headers=auth(replica)) as http:
            r = await http.put("/v1/policy", json={"name": "fcfs"})
            assert r.status_code == 503 and "nothing changed" in r.json()["detail"]
            body = {"job_id": "5", "user": "boss", "group": "ops", "nodes": 9}
            r = await http.post("/v1/jobs", json=body)
            assert r.status_code == 503
            j = (await http.get("/v1/jobs/5")).json()
        assert (replica.slot.name, replica.slot.version) == ("fair-share", 0)
        assert replica.table.registered == {}
        assert (j["user"], j["nodes"], j["registered"]) == ("ann", 2, False)
    finally:
        await asyncio.to_thread(s.close)


async def test_jobs_list_the_replicas_holding_them(replica_factory: Make) -> None:
    from test_replicas import cluster

    r1, r2 = await cluster(replica_factory, [40, 40])
    info = JobInfo("both", "ann", "bio", nodes=2)
    sessions = [await asyncio.to_thread(Session, r.grpc_address, info) for r in (r1, r2)]
    sessions.append(
        await asyncio.to_thread(Session, r2.grpc_address, JobInfo("there", "bob", "bio"))
    )
    try:
        async with httpx.AsyncClient(base_url=r1.http_url) as http:

            async def listed() -> bool:
                jobs = {j["job_id"]: j["replicas"] for j in (await http.get("/v1/jobs")).json()}
                return jobs.get("both") == ["r1", "r2"]

            await async_wait_until(listed, 5, interval=0.02, message="r2's digest seen")
            # a job only on the peer is not in this replica's table
            assert (await http.get("/v1/jobs/there")).status_code == 404
            assert (await http.get("/v1/jobs/both")).json()["replicas"] == ["r1", "r2"]
    finally:
        await asyncio.to_thread(lambda: [s.close() for s in sessions])
