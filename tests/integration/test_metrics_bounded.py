"""A large job table (issue 15, finding 4): ``/metrics`` stays bounded in size and is
rendered off the event loop; ``/v1/jobs`` is paginated.

20,000 junk jobs are put straight into a real replica's job table (what unauthenticated
Hellos of 20,000 job ids leave behind: inactive jobs retained for ``job_retention``),
plus a few jobs whose sessions hold known rates (sessions opened through the table have
no stream, so the scheduler never overwrites the rate the test gives them). The
scrapes, the ``/healthz`` probes and the honest client are real HTTP and gRPC clients on
loopback, in threads of their own, so the replica's loop only runs the replica.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import statistics
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import Pump, async_wait_until

from burstctl.client import JobInfo, Session
from burstctl.controller.app import Replica
from burstctl.controller.config import split_host_port
from burstctl.controller.records import JobMeta, SessionRecord

pytestmark = pytest.mark.integration
Make = Callable[..., Awaitable[Replica]]

JUNK = 20_000
TOP = 50  # the default of metrics_top_jobs
MiB = 1 << 20
PER_JOB = (
    "burstctl_job_rate_bytes_per_second",
    "burstctl_job_read_bytes",
    "burstctl_job_written_bytes",
    "burstctl_job_moved_bytes",
    "burstctl_job_ops",
    "burstctl_job_metadata_ops",
    "burstctl_job_token_wait_seconds",
    "burstctl_job_active",
)


def sync_client(url: str) -> httpx.Client:
    # httpx's sync client sends a request in more than one write: without TCP_NODELAY,
    # Nagle and the server's delayed ACK add ~40 ms to each request on loopback.
    nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
    return httpx.Client(
        base_url=url, timeout=60, transport=httpx.HTTPTransport(socket_options=nodelay)
    )


def junk_id(i: int) -> str:
    # long ids, as a hostile client would pick them (each label costs its length per series)
    return f"junk-{i:05d}-" + "x" * 100


def add_junk(svc: Replica, n: int = JUNK) -> None:
    """``n`` inactive jobs, as ``n`` Hellos of made-up job ids leave them."""
    table = svc.table
    for i in range(n):
        s = table.open_session(JobMeta(junk_id(i), "nobody", "nogroup", 1, 1.0), "junk", "h")
        table.close_session(s)


def add_rated(svc: Replica, rates: dict[str, float]) -> dict[str, SessionRecord]:
    """Jobs with a live session holding ``rate`` (no stream: the scheduler leaves it)."""
    out = {}
    for job_id, rate in rates.items():
        s = svc.table.open_session(JobMeta(job_id, "ann", "bio", 2, 1.0), "rated", "h")
        s.rate = rate
        out[job_id] = s
    return out


def families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {
        f.name: [(s.labels, s.value) for s in f.samples if not s.name.endswith("_created")]
        for f in text_string_to_metric_families(text)
    }


def value(fams: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    found = [v for lab, v in fams[name] if all(lab.get(k) == x for k, x in labels.items())]
    assert len(found) == 1, (name, labels, fams.get(name))
    return found[0]


def per_job(fams: dict[str, list[tuple[dict[str, str], float]]], name: str) -> set[str]:
    return {lab["job"] for lab, _ in fams.get(name, [])}


async def test_metrics_has_series_for_exactly_the_top_jobs_by_rate(
    replica_factory: Make,
) -> None:
    svc = await replica_factory(heartbeat_timeout=600.0)
    add_junk(svc)
    # 60 rated jobs, rates 1..60 KiB/s: the top 50 are r10..r59
    rated = add_rated(svc, {f"r{i:02d}": (i + 1) * 1024.0 for i in range(60)})
    top = {f"r{i:02d}" for i in range(10, 60)}
    async with httpx.AsyncClient(base_url=svc.http_url, timeout=30) as http:
        r = await http.get("/metrics")
        assert r.status_code == 200
        assert len(r.content) < 200_000, len(r.content)
        fams = families(r.text)
        for name in PER_JOB:
            assert per_job(fams, name) == top, name
            assert len(fams[name]) == TOP, name
        rid = svc.config.replica_id
        # the aggregates cover every job, shown or not
        assert value(fams, "burstctl_jobs", replica=rid) == JUNK + 60
        assert value(fams, "burstctl_jobs_by_status", replica=rid, status="active") == 60
        assert value(fams, "burstctl_jobs_by_status", replica=rid, status="inactive") == JUNK
        assert value(fams, "burstctl_jobs_shown", replica=rid) == TOP
        total = sum((i + 1) * 1024.0 for i in range(60))
        assert value(fams, "burstctl_jobs_rate_bytes_per_second", replica=rid) == total
        others = sum((i + 1) * 1024.0 for i in range(10))
        assert value(fams, "burstctl_other_jobs_rate_bytes_per_second", replica=rid) == others
        assert value(fams, "burstctl_other_jobs", replica=rid) == JUNK + 10

        # the top job stops: its series are gone, the 51st job's appear
        rated["r59"].rate = 0.0

        async def r59_gone() -> bool:  # a render is reused for up to a second
            nonlocal fams
            fams = families((await http.get("/metrics")).text)
            return "r59" not in per_job(fams, PER_JOB[0])

        await async_wait_until(r59_gone, 5, interval=0.1, message="a new render")
        expected = (top - {"r59"}) | {"r09"}
        for name in PER_JOB:
            assert per_job(fams, name) == expected, name


async def test_metrics_top_jobs_is_configurable(replica_factory: Make) -> None:
    svc = await replica_factory(heartbeat_timeout=600.0, metrics_top_jobs=3)
    add_junk(svc, 100)
    add_rated(svc, {"a": 5.0, "b": 4.0, "c": 3.0, "d": 2.0})
    async with httpx.AsyncClient(base_url=svc.http_url) as http:
        fams = families((await http.get("/metrics")).text)
    assert per_job(fams, "burstctl_job_rate_bytes_per_second") == {"a", "b", "c"}
    assert value(fams, "burstctl_jobs_shown", replica=svc.config.replica_id) == 3


async def test_jobs_listing_is_paginated(replica_factory: Make) -> None:
    svc = await replica_factory(heartbeat_timeout=600.0)
    add_junk(svc)
    add_rated(svc, {"r1": 10.0, "r2": 30.0, "r3": 20.0})
    ids = sorted([junk_id(i) for i in range(JUNK)] + ["r1", "r2", "r3"])
    async with httpx.AsyncClient(base_url=svc.http_url, timeout=30) as http:
        r = await http.get("/v1/jobs")
        assert r.status_code == 200
        assert [j["job_id"] for j in r.json()] == ids[:100]  # the bounded default page
        assert r.headers["x-total-count"] == str(JUNK + 3)
        r = await http.get("/v1/jobs", params={"offset": 19_950, "limit": 1000})
        assert [j["job_id"] for j in r.json()] == ids[19_950:]
        r = await http.get("/v1/jobs", params={"order": "rate", "limit": 4})
        got = r.json()
        assert [j["job_id"] for j in got[:3]] == ["r2", "r3", "r1"]
        assert [j["rate"] for j in got[:3]] == [30.0, 20.0, 10.0]
        assert got[3]["job_id"] == ids[0]  # then the others, by job id
        for params, field in (
            ({"limit": 1001}, "limit"),
            ({"limit": 0}, "limit"),
            ({"offset": -1}, "offset"),
            ({"order": "bogus"}, "order"),
        ):
            r = await http.get("/v1/jobs", params=params)
            assert r.status_code == 422, params
            assert r.json()["detail"][0]["loc"] == ["query", field]


async def test_keep_alive_answers_are_not_delayed_by_nagle(replica: Replica) -> None:
    # One connection, many requests (what a probe or Prometheus does). Without
    # TCP_NODELAY on the server's sockets, each answer waited ~40 ms for the client's
    # delayed ACK: /healthz could never answer under 50 ms.
    def probe() -> list[float]:
        out = []
        with socket.create_connection(split_host_port(replica.http_url[7:])) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(20):
                t0 = time.perf_counter()
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n")
                data = b""
                while not data.endswith(b'{"status":"ok"}'):
                    chunk = sock.recv(4096)
                    assert chunk, data
                    data += chunk
                out.append(time.perf_counter() - t0)
        return out

    latencies = await asyncio.to_thread(probe)
    assert statistics.median(latencies) < 0.02, sorted(latencies)


async def test_loop_stays_responsive_while_metrics_is_scraped_four_times_at_once(
    replica_factory: Make, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="burstctl.client")
    svc = await replica_factory()  # lease 1 s: renewed at 0.5 s, so a 0.5 s stall expires it
    add_junk(svc)
    # The jobs were just made: collect and freeze them now, so that the collector's
    # first full passes over a large new heap (a cost of any big table, not of
    # /metrics) do not land in the measurement.
    gc.collect()
    gc.freeze()
    honest = await asyncio.to_thread(
        Session, svc.grpc_address, JobInfo("honest", "ann", "bio", nodes=1)
    )
    pump = Pump(honest, pace=2 * MiB).start()
    clients = ThreadPoolExecutor(max_workers=5, thread_name_prefix="test-client")
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    health: list[float] = []
    sizes: list[int] = []
    done = threading.Event()
    try:
        await async_wait_until(lambda: pump.moved > 0, 10, message="the honest job moving")

        async def probe() -> None:
            # the loop's lag: how late a 5 ms sleep wakes up
            while not done.is_set():
                t0 = time.perf_counter()
                await asyncio.sleep(0.005)
                lags.append(time.perf_counter() - t0 - 0.005)

        def healthz() -> None:
            with sync_client(svc.http_url) as http:
                while not done.is_set():
                    t0 = time.perf_counter()
                    assert http.get("/healthz").status_code == 200
                    health.append(time.perf_counter() - t0)
                    done.wait(0.01)  # the probe's own period

        def scrape() -> None:
            # back to back for 3 s: renders (at most about one a second) and scrapes
            # served from the last one, all while the probes run
            deadline = time.monotonic() + 3.0
            with sync_client(svc.http_url) as http:
                while time.monotonic() < deadline:
                    r = http.get("/metrics")
                    assert r.status_code == 200
                    sizes.append(len(r.content))

        prober = asyncio.create_task(probe())
        checker = loop.run_in_executor(clients, healthz)
        await asyncio.gather(*(loop.run_in_executor(clients, scrape) for _ in range(4)))
        done.set()
        await checker
        await prober
    finally:
        gc.unfreeze()
        done.set()
        clients.shutdown(wait=True)
        await asyncio.to_thread(pump.stop)
        await asyncio.to_thread(honest.close)
    assert health and lags
    # On-loop rendering of 20,000 jobs stalls the loop for seconds (4.3 to 10 s seen
    # on a 2-core box). The bounds leave room for a loaded machine (spikes of 50 to
    # 400 ms seen at a load average of 6 to 12 on 2 cores, none from a render): the
    # clients run in threads of this process and share its GIL with the loop.
    # bench/metrics_scrape.py measures against the 50 ms target, the controller in
    # a process of its own.
    assert max(lags) < 0.5, f"max loop lag {max(lags) * 1e3:.0f} ms"
    assert statistics.median(health) < 0.05 and max(health) < 1.0, sorted(health)
    assert len(sizes) >= 4 and max(sizes) < 200_000, sizes
    # several renders happened during the window, and scrapes shared them
    assert 2 <= svc.metrics.renders < len(sizes), (svc.metrics.renders, len(sizes))
    assert not pump.errors
    expired = [r.getMessage() for r in caplog.records if "lease expired" in r.getMessage()]
    assert not expired, expired
