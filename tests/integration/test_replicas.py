"""Several controller replicas on loopback enforce one policy globally (docs/replicas.md).

ThemisIO's Figure 5: J1 (16 nodes) is present on both replicas, J2 (8) only on
R1, J3 (8) only on R2; size-fair, B = 40 MiB/s each. Deciding locally gives J1
2/3 of each replica; with the digest exchange every λ the replicas split the
global targets (J1 1/2, J2 1/4, J3 1/4 of 80 MiB/s).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack

import grpc
import pytest
from support import Pump, async_wait_until, measure

from burstctl.client import JobInfo, Session
from burstctl.controller.app import Service
from burstctl.controller.global_view import Digest, JobDigest
from burstctl.controller.peers import digest_to_proto
from burstctl.proto.burstctl.v1 import peer_pb2 as pb

MiB = 1 << 20
pytestmark = pytest.mark.integration
LAMBDA = 0.2
POLICY = {"policy": "size-fair", "capacity": "40MiB/s", "node_bandwidth": "8MiB/s"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job(job_id: str, nodes: int) -> JobInfo:
    return JobInfo(job_id, "tester", "testers", nodes=nodes)


async def two_replicas(make: Callable[..., Awaitable[Service]], sync: bool) -> list[Service]:
    ports = [free_port(), free_port()]
    out = []
    for i, (mine, theirs) in enumerate([ports, ports[::-1]]):
        peers = {"peers": [f"127.0.0.1:{theirs}"], "sync_interval": LAMBDA} if sync else {}
        out.append(
            await make(**POLICY, grpc_listen=f"127.0.0.1:{mine}", replica_id=f"r{i + 1}", **peers)
        )
    return out


async def run_figure5(
    make: Callable[..., Awaitable[Service]], sync: bool, expected: dict[str, float]
) -> tuple[dict[str, float], float]:
    r1, r2 = await two_replicas(make, sync)
    t0 = time.monotonic()
    with ExitStack() as stack:
        placed = [
            ("J1@r1", r1, job("J1", 16)),
            ("J1@r2", r2, job("J1", 16)),
            ("J2", r1, job("J2", 8)),
            ("J3", r2, job("J3", 8)),
        ]
        sessions = {}
        for name, svc, info in placed:
            s = await asyncio.to_thread(Session, svc.grpc_address, info)
            stack.callback(s.close)
            sessions[name] = s
        pumps = {name: Pump(s).start() for name, s in sessions.items()}
        try:

            def converged() -> bool:
                return all(
                    s.attached and s.rate == pytest.approx(expected[n] * 80 * MiB, rel=0.02)
                    for n, s in sessions.items()
                )

            try:
                await async_wait_until(converged, 15, interval=0.02, message="rates converged")
            except AssertionError:
                state = {n: (s.attached, s.rate / MiB) for n, s in sessions.items()}
                cols = [svc.peer_sync and svc.peer_sync.column for svc in (r1, r2)]
                raise AssertionError(f"not converged: {state}; columns {cols}") from None
            took = time.monotonic() - t0
            rates = await asyncio.to_thread(measure, list(pumps.values()), 3.0)
        finally:
            await asyncio.to_thread(lambda: [p.stop() for p in pumps.values()])
        assert not any(p.errors for p in pumps.values())
        await asyncio.to_thread(stack.close)
    return dict(zip(pumps, rates, strict=True)), took


def report(label: str, got: dict[str, float], took: float) -> None:
    per_job = {"J1": got["J1@r1"] + got["J1@r2"], "J2": got["J2"], "J3": got["J3"]}
    shares = {j: f"{r / (80 * MiB):.3f}" for j, r in per_job.items()}
    print(f"{label}: converged in {took:.2f}s; shares of 80 MiB/s {shares}")


async def test_two_replicas_split_the_global_targets(service_factory) -> None:
    expected = {"J1@r1": 0.25, "J1@r2": 0.25, "J2": 0.25, "J3": 0.25}
    got, took = await run_figure5(service_factory, True, expected)
    report("synced", got, took)
    total = 80 * MiB
    assert (got["J1@r1"] + got["J1@r2"]) / total == pytest.approx(0.50, abs=0.03)
    assert got["J2"] / total == pytest.approx(0.25, abs=0.03)
    assert got["J3"] / total == pytest.approx(0.25, abs=0.03)
    assert got["J1@r1"] + got["J2"] <= 40 * MiB * 1.03  # R1 within its capacity
    assert got["J1@r2"] + got["J3"] <= 40 * MiB * 1.03  # R2 within its capacity


async def test_without_peers_each_replica_decides_alone(service_factory) -> None:
    # J1 has 16 of the 24 nodes on each replica: 2/3 of each (ThemisIO Figure 5, local).
    expected = {"J1@r1": 1 / 3, "J1@r2": 1 / 3, "J2": 1 / 6, "J3": 1 / 6}
    got, took = await run_figure5(service_factory, False, expected)
    report("local", got, took)
    for name in ("J1@r1", "J1@r2"):
        assert got[name] / (40 * MiB) == pytest.approx(2 / 3, abs=0.03)
    assert got["J2"] / (40 * MiB) == pytest.approx(1 / 3, abs=0.03)
    assert got["J3"] / (40 * MiB) == pytest.approx(1 / 3, abs=0.03)


async def test_malformed_digest_is_invalid_argument_and_ignored(service_factory) -> None:
    r1, _ = await two_replicas(service_factory, True)
    sync = r1.peer_sync
    assert sync is not None
    await async_wait_until(lambda: sync.view.live_peers() == ["r2"], 5, message="r2 live")
    bad = Digest(
        replica_id="r2",
        incarnation=2**62,
        epoch=1,
        capacity=1.0,
        node_bandwidth=1.0,
        policy="size-fair",
        jobs=(
            JobDigest("J9", "u", "g", 4, 1.0, 0.0, 0.0, 0.0, 0.0),
            JobDigest("J8", "u", "g", 0, 1.0, 0.0, 0.0, 0.0, 0.0),  # nodes < 1
        ),
    )
    async with grpc.aio.insecure_channel(r1.grpc_address) as channel:
        exchange = channel.unary_unary(
            "/burstctl.v1.Peer/Exchange",
            request_serializer=pb.Digest.SerializeToString,
            response_deserializer=pb.ExchangeReply.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await exchange(digest_to_proto(bad), timeout=5)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "jobs[1].nodes" in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await channel.unary_unary("/burstctl.v1.Peer/Exchange")(b"\xff\xff", timeout=5)
        assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    # the view still holds r2's real digest, not the impostor's incarnation
    held = sync.view.digests()
    assert [d.replica_id for d in held] == ["r2"]
    assert held[0].incarnation != 2**62
    assert all(j.job_id != "J9" for j in held[0].jobs)
