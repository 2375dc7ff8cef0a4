"""The replicated catalog on in-process replicas on loopback (docs/replicas.md, "The catalog").

A job registered through one replica's REST API holds on the others (the trust rule of
docs/security.md included), a retirement on one reaches the others, a replica restarted with
its state directory has the registration before any peer is up, and a profile measured on one
replica is what another advises from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
import httpx
import pytest
from support import async_wait_until, free_port
from support.grpc import RawSession, hello, post
from test_replicas import cluster
from test_rest import auth
from test_trust import register

from burstctl.client import JobInfo, Session
from burstctl.controller.app import Replica
from burstctl.controller.catalog import RETIRED
from burstctl.controller.profiles import app_key
from burstctl.controller.records import JobMeta
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

pytestmark = pytest.mark.integration
Make = Callable[..., Awaitable[Replica]]


async def retire(replica: Replica, job: str) -> None:
    async with httpx.AsyncClient(base_url=replica.http_url, headers=auth(replica)) as http:
        r = await http.delete(f"/v1/jobs/{job}")
        assert r.status_code == 204, r.text


async def test_a_registration_on_one_replica_holds_on_the_other(
    replica_factory: Make,
) -> None:
    r1, r2 = await cluster(replica_factory, [40, 40])
    await register(r1, "900", "ann", 16)
    await async_wait_until(lambda: "900" in r2.table.registered, message="r2 has the job")
    assert r2.table.registered["900"] == JobMeta("900", "ann", "g", 16, 1.0)

    async with grpc.aio.insecure_channel(r2.grpc_address) as ch:
        intruder = RawSession(ch)
        await intruder.send(hello("900", user="bob"))
        err = await intruder.status()
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "registered to another user" in (err.details() or "")

        owner = RawSession(ch)
        await owner.send(hello("900", user="ann"))
        await owner.send(post(1))
        await owner.rate_becomes(lambda r: r > 0)
        assert r2.table.jobs["900"].meta.nodes == 16  # the registration's, not the claim's
        owner.call.cancel()

    # Persisted on the replica that adopted it, with its version and origin.
    saved = {j.job_id: j for j in r2.store.load().jobs}
    assert (saved["900"].user, saved["900"].origin) == ("ann", "r1")

    # A retirement on r2 reaches r1.
    await retire(r2, "900")
    await async_wait_until(lambda: "900" not in r1.table.registered, message="r1 retires it")
    assert r1.catalog.registrations["900"].kind == RETIRED
    assert r1.catalog.registrations["900"].origin == "r2"
    assert r1.metrics.stats()["sync"]["catalog"]["retirements"] == 1


async def test_concurrent_registrations_of_one_job_resolve_alike_everywhere(
    replica_factory: Make,
) -> None:
    r1, r2 = await cluster(replica_factory, [40, 40])
    await asyncio.gather(register(r1, "906", "ann", 4), register(r2, "906", "bob", 8))

    def agreed() -> bool:
        a, b = r1.catalog.registrations.get("906"), r2.catalog.registrations.get("906")
        return a is not None and a == b

    await async_wait_until(agreed, message="one winner on both")
    winner = r1.catalog.registrations["906"]
    assert r1.table.registered["906"] == r2.table.registered["906"]
    assert r1.table.registered["906"].user == winner.user
    for replica in (r1, r2):
        saved = {j.job_id: j for j in replica.store.load().jobs}["906"]
        assert (saved.user, saved.version, saved.origin) == (
            winner.user,
            winner.version,
            winner.origin,
        )


async def test_a_registration_ends_another_users_sessions_on_every_replica(
    replica_factory: Make,
) -> None:
    r1, r2 = await cluster(replica_factory, [40, 40])
    async with grpc.aio.insecure_channel(r2.grpc_address) as ch:
        early = RawSession(ch)
        await early.send(hello("901", user="bob"))
        await early.send(post(1))
        await early.rate_becomes(lambda r: r > 0)
        await register(r1, "901", "ann", 8)
        err = await early.status(timeout=10.0)
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED
        assert r2.table.jobs["901"].meta.user == "ann"


async def test_a_restarted_replica_has_its_registrations_before_any_peer(
    replica_factory: Make,
) -> None:
    r1, r2 = await cluster(replica_factory, [40, 40])
    await register(r1, "902", "ann", 4)
    await async_wait_until(lambda: "902" in r2.table.registered, message="r2 has the job")
    state_dir, address = r2.config.state_dir, r2.grpc_address
    peers = list(r2.config.peers)
    await r1.stop(grace=0)
    await r2.stop(grace=0)
    again = await replica_factory(
        replica_id="r2", state_dir=state_dir, grpc_listen=address, peers=peers, sync_interval=0.2
    )
    # No peer is up: what it holds comes from its own state.json.
    assert again.table.registered["902"].user == "ann"
    assert again.catalog.registrations["902"].origin == "r1"
    async with grpc.aio.insecure_channel(again.grpc_address) as ch:
        intruder = RawSession(ch)
        await intruder.send(hello("902", user="bob"))
        assert (await intruder.status()).code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_replica_started_later_learns_the_registrations_from_its_peers(
    replica_factory: Make,
) -> None:
    r1, r2 = await cluster(replica_factory, [40, 40])
    await register(r1, "903", "ann", 4)
    state_dir = r2.config.state_dir
    await r2.stop(grace=0)
    (state_dir / "state.json").unlink(missing_ok=True)  # as if started for the first time
    again = await replica_factory(
        replica_id="r2",
        state_dir=state_dir,
        grpc_listen=r2.grpc_address,
        peers=list(r2.config.peers),
        sync_interval=0.2,
    )
    await async_wait_until(lambda: "903" in again.table.registered, message="r2 learns it")
    assert r1.table.registered["903"] == again.table.registered["903"]


async def test_a_profile_measured_on_one_replica_is_advised_from_on_the_other(
    replica_factory: Make,
) -> None:
    r1, r2 = await cluster(replica_factory, [40, 40])
    await register(r1, "904", "ann", 2)
    await async_wait_until(lambda: "904" in r2.table.registered, message="r2 has the job")
    meta = r2.table.registered["904"]
    assert r2.placement.job_input(meta).volume_per_phase is None  # nothing measured yet
    async with grpc.aio.insecure_channel(r1.grpc_address) as ch:
        s = RawSession(ch)
        await s.send(hello("904", user="ann"))
        await s.send(post(1))
        await s.rate_becomes(lambda r: r > 0)
        moved = pb.Usage(bytes=4 << 20, totals=pb.Counters(bytes=4 << 20))
        await s.send(pb.ClientMessage(usage=moved))
        await s.send(pb.ClientMessage(op_completed=pb.OpCompleted(op_id=1)))
        await async_wait_until(
            lambda: r1.profiles.get(app_key(meta)) is not None, message="r1 measured a phase"
        )
        s.call.cancel()
    await async_wait_until(
        lambda: r2.profiles.get(app_key(meta)) is not None, message="r2 holds r1's profile"
    )
    measured = r1.profiles.get(app_key(meta))
    assert measured is not None and measured.origin == "r1"
    advised = r2.placement.job_input(meta)
    assert advised.phases == measured.phases == 1
    assert advised.volume_per_phase == measured.volume_per_phase


async def test_a_session_follows_changed_advice_at_its_next_phase_start(
    replica_factory: Make,
) -> None:
    ports = [free_port() for _ in range(3)]
    addresses = [f"127.0.0.1:{p}" for p in ports]

    def settings(i: int) -> dict[str, object]:
        others = [a for j, a in enumerate(addresses) if j != i]
        return {
            "replica_id": f"r{i + 1}",
            "grpc_listen": addresses[i],
            "peers": others,
            "sync_interval": 0.2,
            "capacity": "40MiB/s",
        }

    r1 = await replica_factory(**settings(0))
    r2 = await replica_factory(**settings(1))
    await async_wait_until(lambda: len(r1.placement.resources()) == 2, message="r2 live")
    session = await asyncio.to_thread(
        Session,
        addresses[0],
        JobInfo("905", "ann", "g", nodes=4),
        replicas=[addresses[0]],
        quiet_gap=3600.0,  # the phase ends only with end_phase
    )
    try:
        # Two live replicas: the advice is both; the first phase start moves to them.
        await async_wait_until(lambda: len(session.advice) == 2, message="advice arrives")
        assert session.targets == addresses[:1]
        await asyncio.to_thread(session.acquire, 1 << 20)
        assert session.targets == addresses[:2] and session.restriped == 1
        await async_wait_until(lambda: _sessions(r2, "905"), message="a stream on r2")

        # r3 comes up: the advice changes mid-phase, and the striping waits for the phase.
        r3 = await replica_factory(**settings(2))
        await async_wait_until(lambda: len(session.advice) == 3, timeout=10.0)
        await asyncio.to_thread(session.acquire, 1 << 20)
        assert session.targets == addresses[:2] and session.restriped == 1
        assert not _sessions(r3, "905")

        session.end_phase()  # the phase ends; the next acquire starts one, on the new advice
        await asyncio.to_thread(session.acquire, 1 << 20)
        assert session.targets == addresses and session.restriped == 2
        await async_wait_until(lambda: _sessions(r3, "905"), message="a stream on r3")
        assert _sessions(r1, "905") and _sessions(r2, "905")
    finally:
        await asyncio.to_thread(session.close)


def _sessions(replica: Replica, job_id: str) -> int:
    job = replica.table.jobs.get(job_id)
    return len(job.sessions) if job is not None else 0
