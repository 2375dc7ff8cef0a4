"""The replica exchange: the Peer service, links and the exchange loop on real gRPC
servers on loopback, the policy slot's part in it, and the scheduler's blend of
this replica's share of the global split with its local decision."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from digests import FULL_DIGEST
from support import async_wait_until, views
from support.replicas import replica_pair

from burstctl.controller.digest import Digest, JobDigest
from burstctl.controller.digest_wire import to_proto
from burstctl.controller.jobs import JobTable
from burstctl.controller.membership import Membership
from burstctl.controller.peer_link import REPLICA_ID_KEY, Outgoing, PeerLink
from burstctl.controller.peers import EARLY_GAP, PeerServicer, PeerSync, _decode_digest
from burstctl.controller.records import JobMeta, OpKind
from burstctl.controller.state import PolicySlot, StateStore
from burstctl.policies.decision import Share, blend
from burstctl.policies.registry import default_registry
from burstctl.policies.view import SystemView
from burstctl.proto.burstctl.v1 import peer_pb2 as pb

REGISTRY = default_registry()

DIGEST = FULL_DIGEST


def table() -> JobTable:
    return JobTable(time.monotonic, heartbeat_timeout=30.0, job_retention=60.0, demand_headroom=1.1)


def slot(state_dir: Path, replica_id: str, policy: str = "size-fair") -> PolicySlot:
    return PolicySlot(REGISTRY, StateStore(state_dir), (policy, {}), replica_id=replica_id)


def changes(of: PolicySlot) -> list[tuple[str, int]]:
    """(name, version) at every ``changed`` signal of ``of`` from now on."""
    seen: list[tuple[str, int]] = []
    of.changed.connect(lambda: seen.append((of.name, of.version)))
    return seen


def peer_digest(rid: str, sequence: int, policy: str, version: int, **kw: Any) -> bytes:
    fields: dict[str, Any] = {"incarnation": 1, "capacity": 100.0, "node_bandwidth": 10.0}
    fields.update(kw)
    d = Digest(rid, sequence=sequence, policy=policy, policy_version=version, **fields)
    return to_proto(d).SerializeToString()


@contextlib.asynccontextmanager
async def running(sync: PeerSync) -> AsyncIterator[None]:
    task = asyncio.create_task(sync.run(), name=f"peer-sync-{sync.replica_id}")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await sync.close()


def raw(wire: bytes) -> Outgoing:
    """An exchange's digest that is ``wire`` as it is (a malformed one, say) for every peer."""
    outgoing = Outgoing(DIGEST, None)
    outgoing._full_wire = wire
    return outgoing


async def _peer_server(handler: Callable[..., Any]) -> tuple[grpc.aio.Server, int]:
    """A real gRPC server on loopback whose Peer/Sync is ``handler``."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "burstctl.v1.Peer",
                {
                    "Sync": grpc.stream_stream_rpc_method_handler(
                        handler,
                        request_deserializer=_decode_digest,
                        response_serializer=pb.ExchangeReply.SerializeToString,
                    )
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def _servicer(servicer: PeerServicer) -> tuple[grpc.aio.Server, str]:
    """A real gRPC server on loopback with ``servicer``'s handlers; its address."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((servicer.rpc_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


# -- the scheduler's blend of the share with the local decision ---------------------------


def _rows(capacity: float = 100.0, **jobs: tuple[int, float]) -> SystemView:
    """A local view: job id -> (nodes, demand), cap 100, index in keyword order."""
    rows = [
        views.job(j, 100.0, demand, nodes=nodes, index=i)
        for i, (j, (nodes, demand)) in enumerate(jobs.items())
    ]
    return views.view(*rows, capacity=capacity, node_bandwidth=100.0)


SIZE_FAIR = REGISTRY.create("size-fair", {})


def test_newer_jobs_get_their_local_fair_share_and_the_share_makes_room() -> None:
    view = _rows(a=(1, 100.0), b=(1, 100.0), c=(3, 100.0))
    rates = blend(SIZE_FAIR, view, {"a": 40.0, "gone": 10.0})
    assert "gone" not in rates
    # b and c arrived after the exchange: size-fair on the whole local view gives
    # 1:1:3 of 100 = 20/20/60; a's share (40) shrinks to the 20 left.
    assert rates == pytest.approx({"a": 20.0, "b": 20.0, "c": 60.0})


def test_share_is_kept_when_the_newer_jobs_fit_beside_it() -> None:
    view = _rows(a=(1, 100.0), b=(3, 100.0), c=(1, 100.0))
    # local size-fair gives c 20; the share (a 30, b 50) fits in the 80 left
    rates = blend(SIZE_FAIR, view, {"a": 30.0, "b": 50.0})
    assert rates == pytest.approx({"a": 30.0, "b": 50.0, "c": 20.0})


def test_capacity_the_share_leaves_goes_to_unmet_demand() -> None:
    # a's demand fell to 10 since the exchange; b can use the rest at once
    view = _rows(a=(1, 10.0), b=(1, 100.0))
    rates = blend(SIZE_FAIR, view, {"a": 10.0, "b": 50.0})
    assert rates == pytest.approx({"a": 10.0, "b": 90.0})
    assert sum(rates.values()) == pytest.approx(view.capacity)


def test_share_rates_never_exceed_the_job_cap() -> None:
    view = _rows(a=(1, 100.0))
    assert blend(SIZE_FAIR, view, {"a": 250.0}) == {"a": 100.0}


def test_share_rates_are_topped_up_only_to_their_ceiling() -> None:
    # a's demand fell to 10 since the exchange; b may take only 20 of the 60 freed: its
    # ceiling is its rate plus this replica's part of its global headroom (b_j minus
    # what all replicas give it), so the rest stays idle rather than pass b's cap
    view = _rows(a=(1, 10.0), b=(1, 100.0))
    rates = blend(SIZE_FAIR, view, Share({"a": 10.0, "b": 30.0}, {"a": 10.0, "b": 50.0}))
    assert rates == pytest.approx({"a": 10.0, "b": 50.0})
    # a job without a ceiling keeps its rate; a plain mapping has no ceilings (b_i here)
    assert blend(SIZE_FAIR, view, Share({"a": 10.0, "b": 30.0}, {})) == {"a": 10.0, "b": 30.0}
    assert blend(SIZE_FAIR, view, {"a": 10.0, "b": 30.0}) == pytest.approx({"a": 10.0, "b": 90.0})


def test_a_dead_peers_column_is_held_until_its_leases_expire(tmp_path: Path) -> None:
    # r1 (40) holds B; r2 (40) held A's 40. r2 goes silent: after k·λ it leaves the
    # view, but A's 40 stays counted on r2 until λ + lease + λ after its last digest;
    # only then does r1 split for itself (A nothing here until then, B its 40).
    now = [100.0]
    jobs = JobTable(lambda: now[0], heartbeat_timeout=60.0, job_retention=60.0, demand_headroom=1.1)
    for job_id, nodes in (("A", 10), ("B", 20)):
        s = jobs.open_session(JobMeta(job_id, "u" + job_id, "g", nodes, 1.0), "c" + job_id, "h")
        jobs.post(s, 1, OpKind.WRITE, 0)
    sync = PeerSync(
        jobs,
        slot(tmp_path, "r1", "fair-share"),
        replica_id="r1",
        addresses=[],
        interval=0.2,
        missed=3,
        capacity=40.0,
        node_bandwidth=4.0,
        lease=3.0,
        clock=lambda: now[0],
    )
    sync._allowed = lambda: None  # type: ignore[method-assign]  # no links: r2 is let in below
    sync.membership.peers = None
    r2 = Digest(
        "r2",
        incarnation=1,
        sequence=1,
        capacity=40.0,
        node_bandwidth=4.0,
        policy="fair-share",
        jobs=(JobDigest("A", "uA", "g", 10, 1.0, 40.0, 0.0, 0.0, -1.0, -1.0, None, True),),
    )
    assert sync.membership.receive(r2, now[0]).accepted
    asyncio.run(sync.exchange_once())
    assert sync.local_targets is not None
    assert dict(sync.local_targets) == pytest.approx({"A": 0.0, "B": 40.0})
    heard = now[0]
    now[0] = heard + 0.7  # past k·λ: r2 leaves the view, its column is held
    asyncio.run(sync.exchange_once())
    assert sync.membership.live_peers() == []
    assert sorted(sync.held_back) == ["r2"]
    assert dict(sync.local_targets or {}) == pytest.approx({"A": 0.0, "B": 40.0})
    assert sync.stats()["held_back"][0]["replica_id"] == "r2"
    now[0] = heard + 0.2 + 3.0 + 0.2 - 0.01  # just before λ + lease + λ
    asyncio.run(sync.exchange_once())
    assert dict(sync.local_targets or {}) == pytest.approx({"A": 0.0, "B": 40.0})
    now[0] = heard + 0.2 + 3.0 + 0.2  # the leases r2 pushed have surely expired
    asyncio.run(sync.exchange_once())
    assert sync.held_back == {} and sync.local_targets is None  # r1 decides alone
    # r2 back (a new incarnation): live again, nothing held
    assert sync.membership.receive(dataclasses.replace(r2, incarnation=2), now[0]).accepted
    asyncio.run(sync.exchange_once())
    assert sync.held_back == {} and sync.membership.live_peers() == ["r2"]


# -- what makes the exchange run early ---------------------------------------------------------


def test_table_signals_only_when_a_job_enters_or_leaves_io() -> None:
    jobs = JobTable(lambda: 0.0, heartbeat_timeout=3.0, job_retention=60.0, demand_headroom=1.1)
    flips: list[int] = []
    jobs.io_changed.connect(lambda job, in_io, now: flips.append(1))
    s = jobs.open_session(JobMeta("j", "u", "g", 1, 1.0), "c", "h")
    assert flips == []
    jobs.post(s, 1, OpKind.WRITE, 0)
    assert len(flips) == 1  # j entered S(t)
    jobs.post(s, 2, OpKind.READ, 0)
    jobs.usage(s, 4096, 1, 0.0, 0.25, False)
    assert jobs.complete(s, 1)
    assert len(flips) == 1  # still in I/O: no signal
    assert jobs.complete(s, 2)
    assert len(flips) == 2  # left S(t)
    jobs.post(s, 3, OpKind.WRITE, 0)
    jobs.close_session(s)
    assert len(flips) == 4  # in, then out with the session


async def test_a_poke_brings_the_next_exchange_forward(tmp_path: Path) -> None:
    sync = PeerSync(
        table(),
        slot(tmp_path, "r1"),
        replica_id="r1",
        addresses=[],
        interval=1.0,
        missed=3,
        capacity=100.0,
        node_bandwidth=10.0,
    )
    async with running(sync):
        await async_wait_until(lambda: sync.exchanges == 1, 1.0, message="first exchange")
        sync.poke()
        # well before λ = 1 s (at EARLY_GAP·λ = 0.25 s after the first exchange)
        await async_wait_until(lambda: sync.exchanges == 2, 0.8, message="early exchange")
        sync.poke()
        sync.poke()  # pokes coalesce into one early exchange ...
        await async_wait_until(lambda: sync.exchanges == 3, 0.8, message="second early exchange")
        t0 = time.monotonic()
        # ... so the next one comes at the end of the interval, not EARLY_GAP·λ later
        await async_wait_until(lambda: sync.exchanges == 4, 2.0, message="periodic exchange")
        assert time.monotonic() - t0 > 1.0 * (1 - EARLY_GAP)
    assert sync.sequence == 4  # one digest per exchange


async def test_a_job_entering_io_pokes_the_exchange(tmp_path: Path) -> None:
    jobs = table()
    sync = PeerSync(
        jobs,
        slot(tmp_path, "r1"),
        replica_id="r1",
        addresses=[],
        interval=4.0,
        missed=3,
        capacity=100.0,
        node_bandwidth=10.0,
    )
    async with running(sync):
        await async_wait_until(lambda: sync.exchanges == 1, 1.0, message="first exchange")
        s = jobs.open_session(JobMeta("j", "u", "g", 1, 1.0), "c", "h")
        jobs.post(s, 1, OpKind.WRITE, 0)
        # at EARLY_GAP·λ = 1 s after the first exchange, well before λ = 4 s
        await async_wait_until(lambda: sync.exchanges == 2, 2.5, message="poked exchange")


async def test_a_policy_switch_is_sent_at_once(tmp_path: Path) -> None:
    # λ = 30 s and EARLY_GAP·λ = 7.5 s: an exchange within 5 s of the switch can only
    # be send_now's, and the peer hears of the switch with it.
    peer_slot = slot(tmp_path / "r2", "r2")
    peer = PeerServicer(Membership("r2", registry=REGISTRY), peer_slot, "r2")
    server, address = await _servicer(peer)
    own = slot(tmp_path / "r1", "r1")
    sync = PeerSync(
        table(),
        own,
        replica_id="r1",
        addresses=[address],
        interval=30.0,
        missed=3,
        capacity=100.0,
        node_bandwidth=10.0,
    )

    def heard() -> tuple[str, int] | None:
        states = peer.membership.peer_states(time.monotonic())
        return (states[0].policy, states[0].policy_version) if states else None

    try:
        async with running(sync):
            await async_wait_until(
                lambda: sync.exchanges == 1 and heard() is not None, 5.0, message="first exchange"
            )
            assert heard() == ("size-fair", 0)
            switched = time.monotonic()
            own.switch("job-fair")
            await async_wait_until(
                lambda: heard() == ("job-fair", 1) and sync.exchanges == 2,
                5.0,
                message="the switch at the peer",
            )
            assert time.monotonic() - switched < EARLY_GAP * sync.interval
            assert (peer_slot.name, peer_slot.version) == ("job-fair", 1)  # adopted there
    finally:
        await server.stop(None)


# -- the Peer service --------------------------------------------------------------------------


async def test_the_servicer_adopts_a_newer_policy_and_ignores_an_older_one(
    tmp_path: Path,
) -> None:
    own = slot(tmp_path, "r2")
    seen = changes(own)
    peer = PeerServicer(Membership("r2", registry=REGISTRY), own, "r2")
    server, address = await _servicer(peer)
    link = PeerLink(address, interval=0.5)

    async def send(wire: bytes) -> None:
        sent = peer.received
        assert await link.send(raw(wire), timeout=2.0)
        await async_wait_until(lambda: peer.received == sent + 1, 2.0, message="the digest")

    try:
        await send(peer_digest("r1", 1, "job-fair", 2))
        assert (own.name, own.version) == ("job-fair", 2) and seen == [("job-fair", 2)]
        # accepted (a newer sequence), but its policy is older: ignored
        await send(peer_digest("r1", 2, "user-fair", 1))
        assert peer.membership.peer_states(0.0)[0].sequence == 2
        # not accepted: an impostor's and a policy this replica cannot build
        await send(peer_digest("r1", 3, "user-fair", 9, incarnation=0))
        await send(peer_digest("r3", 1, "no-such-policy", 9))
        assert peer.rejected == 2
        assert (own.name, own.version) == ("job-fair", 2) and len(seen) == 1
        assert own.active().version == 2
        # the same version from a higher replica id wins the tie
        await send(peer_digest("r3", 2, "user-fair", 2))
        assert (own.name, own.version) == ("user-fair", 2)
        assert seen == [("job-fair", 2), ("user-fair", 2)]
        # the policy held, announced again (by its replica or a higher one): nothing new
        await send(peer_digest("r3", 3, "user-fair", 2))
        await send(peer_digest("r4", 1, "user-fair", 2))
        assert seen == [("job-fair", 2), ("user-fair", 2)]
        saved = StateStore(tmp_path).load().policy
        assert saved is not None and (saved.name, saved.version) == ("user-fair", 2)
    finally:
        await link.close()
        await server.stop(None)


def test_a_peer_announcing_the_policy_held_changes_nothing(tmp_path: Path) -> None:
    # What PeerServicer and PeerSync._share hand the slot for every digest of a peer with
    # a higher id once the replicas agree; a change here would be a state write, a new
    # decision and an immediate exchange (send_now), every time: a busy exchange loop.
    own = slot(tmp_path, "r1")
    seen = changes(own)
    assert not own.adopt("size-fair", {}, 0, "r2")
    assert seen == []


def test_an_adopted_policy_is_kept_against_a_lower_origin_with_the_same_version(
    tmp_path: Path,
) -> None:
    own = slot(tmp_path, "r1")
    assert own.adopt("job-fair", {}, 4, "r3")
    # (4, r2) < (4, r3): Membership.elected keeps r3's policy, so must the slot
    assert not own.adopt("user-fair", {}, 4, "r2")
    assert own.name == "job-fair"


async def test_the_peer_names_itself_once_and_answers_only_what_it_does_not_accept() -> None:
    peer = PeerServicer(Membership("r2"), None, "r2")
    server, port = await _peer_server(peer.stream)
    link = PeerLink(f"127.0.0.1:{port}", interval=0.5)
    good = to_proto(DIGEST).SerializeToString()
    try:
        assert await link.send(raw(good), timeout=2.0)  # accepted: no reply
        assert link.replica_id == "r2"  # from the stream's initial metadata
        assert await link.send(raw(b"\xff\xff"), timeout=2.0)  # malformed: a rejected reply
        assert await link.send(raw(good), timeout=2.0)  # the same sequence again: a duplicate
        await async_wait_until(lambda: link.refused == 2, 2.0, message="two replies")
        assert (peer.received, peer.rejected) == (3, 1)
        assert peer.membership.live_peers() == ["r1"]
        assert (link.streams_opened, link.failures) == (1, 0)
    finally:
        await link.close()
        await server.stop(None)


async def test_a_peer_that_does_not_name_itself_costs_a_failure_and_a_new_stream() -> None:
    opened: list[int] = []

    async def mute(requests, context):  # type: ignore[no-untyped-def]
        opened.append(1)
        await asyncio.sleep(30)  # never names itself; ended by server.stop below
        yield pb.ExchangeReply()

    server, port = await _peer_server(mute)
    link = PeerLink(f"127.0.0.1:{port}", interval=0.1)
    wire = to_proto(DIGEST).SerializeToString()
    try:
        assert not await link.send(raw(wire), timeout=0.2)
        assert not await link.send(raw(wire), timeout=0.2)
        assert (link.failures, link.streams_opened, link.replica_id) == (2, 2, None)
        assert len(opened) == 2
    finally:
        await link.close()
        await server.stop(None)


async def test_a_peer_ending_its_streams_costs_failed_sends_never_an_exception() -> None:
    # A peer (stopping, restarting) that ends each stream after one digest: the
    # link's next write may find the call finished (InvalidStateError), fail, or
    # see it done and open a new stream.
    async def once(requests, context):  # type: ignore[no-untyped-def]
        await context.send_initial_metadata(((REPLICA_ID_KEY, "brief"),))
        async for _ in requests:
            return
        yield pb.ExchangeReply()  # an async generator, like PeerServicer.stream

    server, port = await _peer_server(once)
    link = PeerLink(f"127.0.0.1:{port}", interval=0.5)
    wire = to_proto(DIGEST).SerializeToString()
    try:
        sent = [await link.send(raw(wire), timeout=2.0)]
        # once the peer has ended the first stream, the next send opens another
        call = link._call
        assert call is not None
        await async_wait_until(call.done, 2.0, message="the peer to end the stream")
        sent += [await link.send(raw(wire), timeout=2.0) for _ in range(7)]  # fast: races
    finally:
        await link.close()
        await server.stop(None)
    assert link.replica_id == "brief"
    assert link.failures == sent.count(False)  # every send written or counted as failed
    assert link.streams_opened >= 2  # an ended stream is replaced by a later send


# -- two replicas --------------------------------------------------------------------------------


async def test_two_replicas_share_the_global_split_and_log_each_conflict_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # J1 runs on both replicas, with metadata that disagrees: r1 (the lower id) says
    # 16 nodes of alice, r2 says 2 nodes of mallory. Each replica reports the conflict
    # once, however many exchanges see it.
    metas = {
        "r1": JobMeta("J1", "alice", "g", 16, 1.0),
        "r2": JobMeta("J1", "mallory", "g", 2, 1.0),
    }
    async with replica_pair(tmp_path, metas) as replicas:
        syncs = {rid: r.sync for rid, r in replicas.items()}

        async def exchange(rid: str) -> None:
            await replicas[rid].exchange(replicas["r2" if rid == "r1" else "r1"])

        def conflicts() -> int:
            return sum("mallory" in r.getMessage() for r in caplog.records)

        with caplog.at_level(logging.WARNING, logger="burstctl.controller"):
            # r1 speaks first: r2 has not reached r1 yet, so does not know it as a peer
            await exchange("r1")
            # r2's refusal has reached r1 (its next digest goes in full, not as a delta on
            # one r2 does not hold): the replies are read by a task of their own
            await async_wait_until(
                lambda: syncs["r1"].links[0].refused >= 1, 5, message="r2's refusal at r1"
            )
            await exchange("r2")
            assert syncs["r1"].local_targets is None  # it has not heard from r2 yet
            await exchange("r1")
            assert syncs["r1"].membership.live_peers() == ["r2"]
            assert conflicts() == 1
            await exchange("r2")
            assert syncs["r2"].membership.live_peers() == ["r1"]
            assert conflicts() == 2
            for _ in range(2):
                await exchange("r1")
                await exchange("r2")
            assert conflicts() == 2
        # b_i = 16 · 10 (the lowest id's metadata), split over the replicas' local
        # demand: r2 runs J1 on 2 nodes, so at most 20 there, the rest on r1.
        shares = {rid: s.local_targets for rid, s in syncs.items()}
        assert shares["r1"] is not None and shares["r2"] is not None
        assert set(shares["r1"]) == set(shares["r2"]) == {"J1"}
        assert 0.0 < shares["r2"]["J1"] <= 20.0
        assert 0.0 < shares["r1"]["J1"] <= 100.0
        assert all(s.stats()["in_global_view"] for s in syncs.values())
