"""Live placement advice (issue 19; docs/placement-live.md): three replica processes with
different capacities and five registered jobs, the advice of GET/POST /v1/placement, a job
that follows it, a replica that dies, bad input.

Real ``burstctl controller`` processes on loopback with peers, each stopped by pid; the
profiles the advice reads are written to a replica's state directory before it starts (the
store it loads), so the jobs have information level 2.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import ControllerProcess, Pump, wait_until
from test_replicas import free_port

from burstctl.client import JobInfo, Session
from burstctl.controller.profiles import PROFILES_FILE
from burstctl.policies.placement.model import App, Profile, io_load, n_sys

pytestmark = pytest.mark.integration
LAMBDA = 0.2
MISSED = 3
MiB = 1 << 20
Factory = Callable[..., ControllerProcess]
CAPACITIES = [40, 120, 80]  # r1, r2, r3 (MiB/s)
ALLOCATORS = ["random", "static", "best-bdw", "nsys-allocator", "tcpu-allocator", "mckp"]
PLACEMENTS = ["random", "greedy-non-clairvoyant", "greedy-clairvoyant"]

# Five applications: (job id, app, nodes, bytes per phase, compute s, b_j at 1, 2, 3 replicas)
JOBS = [
    ("J1", "ior", 16, 4e9, 20.0, {1: 1e9, 2: 1.9e9, 3: 2.6e9}),
    ("J2", "wrf", 8, 1e9, 60.0, {1: 8e8, 2: 9e8, 3: 9.2e8}),
    ("J3", "hacc", 4, 2e9, 5.0, {1: 5e8, 2: 1e9, 3: 8e8}),
    ("J4", "lammps", 2, 5e8, 30.0, {1: 4e8, 2: 4e8, 3: 4e8}),
    ("J5", "nek", 2, 3e9, 10.0, {1: 6e8, 2: 1.1e9, 3: 1.5e9}),
]
PHASES = 4


def write_profiles(state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    entries = [
        {
            "app": app,
            "nodes": nodes,
            "volume_per_phase": vol,
            "compute_seconds": cpu,
            "phases": PHASES,
            "gaps": PHASES - 1,
            "bandwidth": {str(n): b for n, b in bw.items()},
        }
        for _, app, nodes, vol, cpu, bw in JOBS
    ]
    (state_dir / PROFILES_FILE).write_text(json.dumps({"profiles": entries}))


def model_apps() -> list[App]:
    return [
        App(job_id, nodes, t_cpu=cpu * PHASES, v_io=vol * PHASES, phases=PHASES,
            profile=Profile.from_points(bw))
        for job_id, _, nodes, vol, cpu, bw in JOBS
    ]  # fmt: skip


def start_cluster(make: Factory, tmp_path: Path, env: dict[str, str]) -> list[ControllerProcess]:
    """Three replicas, each naming the others' ports. The ports are chosen before any
    replica starts, so one may be taken meanwhile (by another process's ephemeral port):
    a replica that exits at start (no REST URL) means a new attempt with new ports, at
    most three."""
    failed: list[str] = []
    for attempt in range(3):
        ports = [free_port() for _ in CAPACITIES]
        out = []
        for i, cap in enumerate(CAPACITIES):
            state = tmp_path / f"attempt{attempt}" / f"r{i + 1}"
            write_profiles(state)
            peers = ",".join(f"127.0.0.1:{p}" for j, p in enumerate(ports) if j != i)
            out.append(
                make(
                    "--replica-id", f"r{i + 1}",
                    "--peers", peers,
                    "--sync-interval", str(LAMBDA),
                    "--missed-exchanges", str(MISSED),
                    "--capacity", f"{cap}MiB/s",
                    address=f"127.0.0.1:{ports[i]}",
                    env=env,
                    state_dir=state,
                )
            )  # fmt: skip
        exited = [r for r in out if r.url is None]
        if not exited:
            return out
        failed.extend(exited[0].log[-30:])
        for r in out:
            r.stop()
    raise AssertionError("a replica exited at start, three times:\n" + "".join(failed))


TOKEN = "placement-test-token"


@pytest.fixture
def cluster(controller_factory: Factory, tmp_path: Path) -> Iterator[list[ControllerProcess]]:
    env = {"BURSTCTL_ADMIN_TOKEN": TOKEN, "BURSTCTL_PLACEMENT_COMPUTE_NODES": "48"}
    replicas = start_cluster(controller_factory, tmp_path, env)
    r1 = replicas[0]
    for job_id, app, nodes, *_ in JOBS:
        r = httpx.post(
            f"{r1.url}/v1/jobs",
            json={"job_id": job_id, "user": "u", "group": "g", "nodes": nodes, "app": app},
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=5,
        )
        assert r.status_code == 201, r.text
    wait_until(lambda: len(advice(r1)["replicas"]) == 3, 15, message="r1 sees both peers")
    yield replicas


def advice(r: ControllerProcess, **query: str) -> Any:
    resp = httpx.get(f"{r.url}/v1/placement", params=query, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_advice_satisfies_each_allocators_constraints(cluster: list[ControllerProcess]) -> None:
    r1 = cluster[0]
    apps = model_apps()
    pi_sys = [n_sys(a, 3) for a in apps]
    sys_load = io_load(apps, pi_sys, 3)
    for allocator in ALLOCATORS:
        for placement in PLACEMENTS:
            got = advice(r1, allocator=allocator, placement=placement)
            # capacity first, then id: the replicas as resources
            assert got["replicas"] == ["r2", "r3", "r1"]
            assert [j["job_id"] for j in got["jobs"]] == [j[0] for j in JOBS]
            counts = [j["count"] for j in got["jobs"]]
            for j in got["jobs"]:
                assert 1 <= j["count"] <= 3
                assert len(j["replicas"]) == j["count"] == len(set(j["replicas"]))
                assert set(j["replicas"]) <= set(got["replicas"])
                assert j["level"] == 2 and j["fallback"] is None
                assert j["allocator_used"] == allocator
            # the I/O-load reported is the model's of the advised allocation
            assert got["io_load"] == pytest.approx(io_load(apps, counts, 3))
            assert got["io_load"] >= sys_load - 1e-9  # π_sys minimises it
            if allocator == "nsys-allocator":
                assert counts == pi_sys
            if allocator == "tcpu-allocator" and sys_load <= 1:
                assert got["io_load"] <= 1 + 1e-9
    # by default (level 2 everywhere): TCPU-Allocator and Greedy-Clairvoyant
    default = advice(r1)
    assert {j["allocator_used"] for j in default["jobs"]} == {"tcpu-allocator"}
    assert default["placement_used"] == "greedy-clairvoyant"
    # the CLI prints the same advice
    done = subprocess.run(
        [sys.executable, "-m", "burstctl", "placement", "--url", str(r1.url), "--json",
         "--allocator", "static"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == advice(r1, allocator="static")


def jobs_on(r: ControllerProcess) -> dict[str, dict[str, Any]]:
    rows = httpx.get(f"{r.url}/v1/jobs?limit=1000", timeout=5).json()
    return {row["job_id"]: row for row in rows}


def test_a_job_that_follows_the_advice_runs_only_on_the_advised_replicas(
    cluster: list[ControllerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    r1 = cluster[0]
    by_id = {f"r{i + 1}": r for i, r in enumerate(cluster)}
    # Static: round(Q_j·N/Q^cpu) = round(32·3/48) = 2 of the 3 replicas.
    body = {"job_id": "J6", "user": "u", "group": "g", "nodes": 32, "allocator": "static"}
    resp = httpx.post(f"{r1.url}/v1/placement", json=body, timeout=10)
    assert resp.status_code == 200, resp.text
    mine = resp.json()["jobs"][0]
    assert mine["count"] == 2 and mine["allocator_used"] == "static" and mine["level"] == 0
    advised = set(mine["replicas"])
    assert advised == {"r2", "r3"}  # the replicas holding fewest jobs, capacity first
    assert mine["addresses"] == [by_id[r].address for r in mine["replicas"]]
    # the task prolog's environment: BURSTCTL_REPLICAS, followed on request
    monkeypatch.setenv("BURSTCTL_REPLICAS", ",".join(mine["addresses"]))
    monkeypatch.setenv("BURSTCTL_FOLLOW_ADVICE", "1")
    with ExitStack() as stack:
        s = Session(r1.address, JobInfo("J6", "u", "g", nodes=32))
        stack.callback(s.close)
        assert sorted(s.targets) == sorted(mine["addresses"])
        pump = Pump(s).start()
        stack.callback(pump.stop)

        def striped() -> bool:
            rows = {rid: jobs_on(r).get("J6") for rid, r in by_id.items()}
            return all(
                (row is not None and row["sessions"] >= 1 and row["bytes_moved"] > 0)
                == (rid in advised)
                for rid, row in rows.items()
            )

        wait_until(striped, 15, message="J6 on the advised replicas only, moving bytes")
        assert not pump.errors
    # without advice to follow the session uses the first controller only
    monkeypatch.delenv("BURSTCTL_FOLLOW_ADVICE")
    with Session([str(r1.address), str(cluster[1].address)], JobInfo("J7", "u", "g")) as one:
        assert one.targets == [r1.address]


def test_a_dead_replica_leaves_new_advice_within_k_lambda(
    cluster: list[ControllerProcess],
) -> None:
    r1, _, r3 = cluster
    assert "r3" in advice(r1)["replicas"]
    r3.stop(signal.SIGKILL)  # by pid
    t0 = time.monotonic()
    wait_until(lambda: "r3" not in advice(r1)["replicas"], 10, message="r3 out of the advice")
    left = time.monotonic() - t0
    assert left <= (MISSED + 1) * LAMBDA + 0.5, left
    after = advice(r1, allocator="best-bdw")
    assert after["replicas"] == ["r2", "r1"]
    assert all(set(j["replicas"]) <= {"r1", "r2"} and j["count"] <= 2 for j in after["jobs"])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"nodes": -1}, "nodes"),
        ({"nodes": 0}, "nodes"),
        ({"volume_per_phase": 0}, "volume_per_phase"),
        ({"compute_seconds": -1}, "compute_seconds"),
        ({"allocator": "tcp-allocator"}, "allocator"),
        ({"placement": "greedy"}, "placement"),
        ({"bandwidth": {"0": 1e9}}, "bandwidth"),
    ],
)
def test_bad_job_descriptions_are_refused_naming_the_field(
    controller_factory: Factory, change: dict[str, Any], field: str
) -> None:
    ctl = controller_factory()
    body = {"job_id": "J1", "user": "u", "group": "g", "nodes": 2, **change}
    resp = httpx.post(f"{ctl.url}/v1/placement", json=body, timeout=5)
    assert resp.status_code == 422, resp.text
    locs = [d["loc"] for d in resp.json()["detail"]]
    named = [[str(p) for p in d["loc"]] + [d["msg"]] for d in resp.json()["detail"]]
    assert any(field in loc or any(field in part for part in loc) for loc in named), locs
    for query in ({"allocator": "best"}, {"placement": "roundrobin"}):
        resp = httpx.get(f"{ctl.url}/v1/placement", params=query, timeout=5)
        assert resp.status_code == 422
        assert resp.json()["detail"][0]["loc"] == ["query", next(iter(query))]


SLURM = Path(__file__).resolve().parents[2] / "deploy" / "slurm"


def run_slurm(name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A Slurm script as Slurm runs it: no search path but the venv's, a clean environment."""
    full = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "BURSTCTL_SLURM_ENV": "/nonexistent/slurm.env",
        "BURSTCTL_SLURM_SYSLOG": "0",
        **env,
    }
    return subprocess.run(
        ["bash", str(SLURM / name)], env=full, capture_output=True, text=True, timeout=60
    )


def test_prolog_registers_the_app_and_the_task_prolog_exports_the_advice(
    cluster: list[ControllerProcess],
) -> None:
    r1 = cluster[0]
    env = {
        "BURSTCTL_URLS": f"{r1.url}",
        "BURSTCTL_ADMIN_TOKEN": TOKEN,
        "SLURM_JOB_ID": "8001",
        "SLURM_JOB_NAME": "ior",  # the application of J1's profile, at J1's 16 nodes
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_GID": "0",
        "SLURM_JOB_NUM_NODES": "16",
        "BURSTCTL_ALLOCATOR": "best-bdw",
    }
    done = run_slurm("burstctl-prolog", env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""  # a prolog's stdout is not the job's environment
    assert "placement advice" in done.stderr, done.stderr
    job = httpx.get(f"{r1.url}/v1/jobs/8001", timeout=5).json()
    assert job["registered"] and job["nodes"] == 16 and job["app"] == "ior"
    # The task prolog prints exactly one export line: the advised replicas' addresses.
    done = run_slurm("burstctl-task-prolog", env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("export BURSTCTL_REPLICAS="), done.stdout
    addresses = lines[0].split("=", 1)[1].split(",")
    body = {"job_id": "8001", "user": "alice", "group": "root", "nodes": 16,
            "allocator": "best-bdw"}  # fmt: skip
    mine = httpx.post(f"{r1.url}/v1/placement", json=body, timeout=5).json()["jobs"][0]
    assert addresses == mine["addresses"]
    # J1's profile (app ior, 16 nodes) has its best bandwidth at 3 replicas: level 2
    assert mine["level"] == 2 and mine["count"] == 3
    by_address = {r.address for r in cluster}
    assert set(addresses) == by_address


def test_task_prolog_prints_nothing_when_no_replica_answers(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {"BURSTCTL_URL": url, "SLURM_JOB_ID": "9", "SLURM_JOB_USER": "a",
           "SLURM_JOB_GID": "0", "SLURM_JOB_NUM_NODES": "1"}  # fmt: skip
    done = run_slurm("burstctl-task-prolog", env)
    assert done.returncode == 0
    assert done.stdout == ""
    assert "no placement advice" in done.stderr
