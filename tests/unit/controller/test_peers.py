"""Digests on the wire and from the job table; the scheduler's use of the global column."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import grpc
import pytest

from burstctl.controller.global_view import (
    Digest,
    DigestError,
    GlobalView,
    JobColumns,
    JobDigest,
)
from burstctl.controller.jobs import JobMeta, JobTable, OpKind
from burstctl.controller.peers import (
    EARLY_GAP,
    PeerLink,
    PeerServicer,
    PeerSync,
    _decode_digest,
    build_digest,
    digest_from_proto,
    digest_to_proto,
)
from burstctl.controller.scheduler import Scheduler
from burstctl.policies.registry import default_registry
from burstctl.policies.view import JobView, SystemView
from burstctl.proto.burstctl.v1 import peer_pb2 as pb

DIGEST = Digest(
    replica_id="r1",
    incarnation=7,
    epoch=3,
    capacity=100.0,
    node_bandwidth=10.0,
    policy="size-fair",
    policy_params={"x": [1, 2]},
    policy_version=2,
    jobs=(
        JobDigest("a", "u", "g", 4, 1.5, 40.0, 10.0, 2.0, -3.0, -1.0, 500.0, True, 77.0),
        JobDigest("b", "u", "g", 1, 1.0, 0.0, 0.0, 0.0, -1.0),
    ),
)


def test_round_trip_keeps_every_field_including_absent_optionals() -> None:
    wire = digest_to_proto(DIGEST).SerializeToString()
    assert digest_from_proto(pb.Digest.FromString(wire)) == DIGEST


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda m: m.jobs.nodes.__setitem__(1, 0), "jobs[1].nodes"),
        (lambda m: m.jobs.user.__setitem__(1, "a\x00b"), "jobs[1].user"),
        (lambda m: m.jobs.job_id.__setitem__(1, "a"), "jobs[1].job_id"),  # a duplicate
        (lambda m: m.jobs.posted_at.__setitem__(0, float("inf")), "jobs[0].posted_at"),
        (lambda m: m.jobs.progress.__setitem__(1, float("nan")), "jobs[1].progress"),
        (lambda m: m.jobs.demand.pop(), "jobs.demand"),  # columns of different lengths
        (lambda m: m.jobs.job_id.append("c"), "jobs.user"),
        (lambda m: setattr(m, "capacity", float("nan")), "capacity"),
        (lambda m: setattr(m, "policy_params_json", "{"), "policy_params_json"),
        (lambda m: setattr(m, "policy_params_json", "[1]"), "policy_params_json"),
        (lambda m: setattr(m, "epoch", -1), "epoch"),
        (
            lambda m: m.jobs.demand.__setitem__(1, 5.0),  # demand without an open operation
            "jobs[1].demand",
        ),
    ],
)
def test_malformed_proto_names_the_field(edit, field: str) -> None:
    msg = digest_to_proto(DIGEST)
    edit(msg)
    with pytest.raises(DigestError) as err:
        digest_from_proto(msg)
    assert err.value.field == field


def test_jobs_travel_as_columns_and_absent_values_as_nan() -> None:
    msg = digest_to_proto(DIGEST)
    assert list(msg.jobs.job_id) == ["a", "b"]
    assert list(msg.jobs.nodes) == [4, 1]
    assert msg.jobs.posted_at[0] == -1.0 and math.isnan(msg.jobs.posted_at[1])
    assert msg.jobs.remaining[0] == 500.0 and math.isnan(msg.jobs.remaining[1])
    got = digest_from_proto(pb.Digest.FromString(msg.SerializeToString()))
    assert isinstance(got.jobs, JobColumns)
    assert got.jobs[1] == DIGEST.jobs[1]  # NaN comes back as None
    assert tuple(got.jobs) == DIGEST.jobs


def test_digest_of_the_job_table() -> None:
    now = [100.0]
    table = JobTable(lambda: now[0], heartbeat_timeout=3, job_retention=10, demand_headroom=1.1)
    s = table.open_session(JobMeta("j", "u", "g", 2, 1.0), "c", "h")
    table.open_session(JobMeta("idle", "u", "g", 1, 1.0), "c", "h")
    now[0] = 101.0
    table.post(s, 1, OpKind.WRITE, 1000)
    table.usage(s, 300, 1, 0.0, 0.25, False)
    now[0] = 102.0
    seen: dict[str, int] = {}
    kwargs = dict(
        replica_id="r1",
        incarnation=1,
        capacity=100.0,
        node_bandwidth=10.0,
        policy="fair-share",
        policy_params={},
        policy_version=0,
        usage_seen=seen,
    )
    d = build_digest(table, epoch=1, now=now[0], **kwargs)  # type: ignore[arg-type]
    idle, j = d.jobs
    assert (j.job_id, j.open_op, j.released_at, j.posted_at, j.remaining) == (
        "j",
        True,
        -2.0,
        -1.0,
        700.0,
    )
    assert j.usage_bytes == 300 and j.demand > 0
    assert (idle.open_op, idle.demand, idle.posted_at) == (False, 0.0, None)
    d2 = build_digest(table, epoch=2, now=now[0], **kwargs)  # type: ignore[arg-type]
    assert d2.jobs[1].usage_bytes == 0  # only what moved since the previous digest


def _rows(capacity: float = 100.0, **jobs: tuple[int, float]) -> SystemView:
    """A local view: job id -> (nodes, demand), cap 100, index in keyword order."""
    rows = {
        j: JobView(j, "u", "g", nodes, 1.0, cap=100.0, demand=demand, index=i)
        for i, (j, (nodes, demand)) in enumerate(jobs.items())
    }
    return SystemView(now=0.0, capacity=capacity, node_bandwidth=100.0, jobs=rows)


SIZE_FAIR = default_registry().create("size-fair", {})


def test_newer_jobs_get_their_local_fair_share_and_the_column_makes_room() -> None:
    view = _rows(a=(1, 100.0), b=(1, 100.0), c=(3, 100.0))
    rates = Scheduler._global(view, SIZE_FAIR, {"a": 40.0, "gone": 10.0})
    assert "gone" not in rates
    # b and c arrived after the exchange: size-fair on the whole local view gives
    # 1:1:3 of 100 = 20/20/60; a's column (40) shrinks to the 20 left.
    assert rates == pytest.approx({"a": 20.0, "b": 20.0, "c": 60.0})


def test_column_is_kept_when_the_newer_jobs_fit_beside_it() -> None:
    view = _rows(a=(1, 100.0), b=(3, 100.0), c=(1, 100.0))
    # local size-fair gives c 20; the column (a 30, b 50) fits in the 80 left
    rates = Scheduler._global(view, SIZE_FAIR, {"a": 30.0, "b": 50.0})
    assert rates == pytest.approx({"a": 30.0, "b": 50.0, "c": 20.0})


def test_capacity_the_column_leaves_goes_to_unmet_demand() -> None:
    # a's demand fell to 10 since the exchange; b can use the rest at once
    view = _rows(a=(1, 10.0), b=(1, 100.0))
    rates = Scheduler._global(view, SIZE_FAIR, {"a": 10.0, "b": 50.0})
    assert rates == pytest.approx({"a": 10.0, "b": 90.0})
    assert sum(rates.values()) == pytest.approx(view.capacity)


def test_column_rates_never_exceed_the_job_cap() -> None:
    view = _rows(a=(1, 100.0))
    assert Scheduler._global(view, SIZE_FAIR, {"a": 250.0}) == {"a": 100.0}


def test_table_signals_only_when_a_job_enters_or_leaves_io() -> None:
    table = JobTable(lambda: 0.0, heartbeat_timeout=3.0, job_retention=60.0, demand_headroom=1.1)
    flips: list[int] = []
    table.on_io_change = lambda: flips.append(1)
    s = table.open_session(JobMeta("j", "u", "g", 1, 1.0), "c", "h")
    assert flips == []
    table.post(s, 1, OpKind.WRITE, 0)
    assert len(flips) == 1  # j entered S(t)
    table.post(s, 2, OpKind.READ, 0)
    table.usage(s, 4096, 1, 0.0, 0.25, False)
    assert table.complete(s, 1)
    assert len(flips) == 1  # still in I/O: no signal
    assert table.complete(s, 2)
    assert len(flips) == 2  # left S(t)
    table.post(s, 3, OpKind.WRITE, 0)
    table.close_session(s)
    assert len(flips) == 4  # in, then out with the session


async def test_a_poke_brings_the_next_exchange_forward() -> None:
    from support import async_wait_until

    sync = PeerSync(
        replica_id="r1",
        addresses=[],
        interval=1.0,
        missed=3,
        registry=default_registry(),
        make_digest=lambda epoch: Digest("r1", 1, epoch, 100.0, 10.0, "size-fair"),
        on_update=lambda: None,
    )
    task = asyncio.create_task(sync.run())
    try:
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
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await sync.close()


async def _peer_server(handler) -> tuple[grpc.aio.Server, int]:  # type: ignore[no-untyped-def]
    """A real gRPC server on loopback whose Peer/Stream is ``handler``."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "burstctl.v1.Peer",
                {
                    "Stream": grpc.stream_stream_rpc_method_handler(
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


async def test_the_peer_names_itself_once_and_answers_only_what_it_does_not_accept() -> None:
    from support import async_wait_until

    peer = PeerServicer(GlobalView("r2"), "r2")
    server, port = await _peer_server(peer.stream)
    link = PeerLink(f"127.0.0.1:{port}", interval=0.5)
    good = digest_to_proto(DIGEST).SerializeToString()
    try:
        assert await link.send(good, timeout=2.0)  # accepted: no reply
        assert link.replica_id == "r2"  # from the stream's initial metadata
        assert await link.send(b"\xff\xff", timeout=2.0)  # malformed: a rejected reply
        assert await link.send(good, timeout=2.0)  # the same epoch again: a duplicate
        await async_wait_until(lambda: link.refused == 2, 2.0, message="two replies")
        assert (peer.received, peer.rejected) == (3, 1)
        assert peer.view.live_peers() == ["r1"]
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
    wire = digest_to_proto(DIGEST).SerializeToString()
    try:
        assert not await link.send(wire, timeout=0.2)
        assert not await link.send(wire, timeout=0.2)
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
        await context.send_initial_metadata((("burstctl-replica-id", "brief"),))
        async for _ in requests:
            return
        yield pb.ExchangeReply()  # an async generator, like PeerServicer.stream

    server, port = await _peer_server(once)
    link = PeerLink(f"127.0.0.1:{port}", interval=0.5)
    wire = digest_to_proto(DIGEST).SerializeToString()
    from support import async_wait_until

    try:
        sent = [await link.send(wire, timeout=2.0)]
        # once the peer has ended the first stream, the next send opens another
        call = link._call
        assert call is not None
        await async_wait_until(call.done, 2.0, message="the peer to end the stream")
        sent += [await link.send(wire, timeout=2.0) for _ in range(7)]  # fast: races
    finally:
        await link.close()
        await server.stop(None)
    assert link.replica_id == "brief"
    assert link.failures == sent.count(False)  # every send written or counted as failed
    assert link.streams_opened >= 2  # an ended stream is replaced by a later send
