"""Digest deltas: what a sender sends of its jobs (changed, arrived, left), what the
receiver makes of it (the sender's sent view, bit for bit), and what it refuses (a
delta on a digest it does not hold, a stale one, a malformed one, naming the field)."""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from digests import REGISTRY, digest, job
from support.replicas import Replica, replica_pair

from burstctl.controller.delta import (
    DEMAND_TOLERANCE,
    FULL_EVERY,
    PROGRESS_TOLERANCE,
    advance,
    apply,
)
from burstctl.controller.digest import (
    JOB_ARRAY_FIELDS,
    JOB_TEXT_FIELDS,
    Digest,
    DigestError,
    DigestJobs,
    JobDigest,
    same_columns,
)
from burstctl.controller.digest_wire import from_proto, to_proto
from burstctl.controller.membership import Membership, Status
from burstctl.controller.merge import columns_read
from burstctl.controller.records import JobMeta, OpKind
from burstctl.proto.burstctl.v1 import peer_pb2 as pb


def at(sequence: int, rows: Any, sent_at: float = 100.0, **kw: Any) -> Digest:
    """R2's digest ``sequence`` of ``rows``, built at ``sent_at`` on its clock."""
    return digest("R2", rows, sequence=sequence, sent_at=sent_at, **kw)


def wire(d: Digest) -> Digest:
    """``d`` through the wire: what a receiver decodes (and validates)."""
    return from_proto(pb.Digest.FromString(to_proto(d).SerializeToString()))


def bits(jobs: DigestJobs) -> dict[str, object]:
    """Every column as exact bits: text as is, arrays as dtype and raw bytes."""
    out: dict[str, object] = {name: getattr(jobs, name) for name in JOB_TEXT_FIELDS}
    for name in JOB_ARRAY_FIELDS:
        column = getattr(jobs, name)
        out[name] = (column.dtype.str, column.tobytes())
    return out


def receiver(first: Digest) -> Membership:
    m = Membership("R1")
    assert m.receive(wire(first), 0.0, validated=True).accepted
    return m


def held(m: Membership) -> Digest:
    (d,) = m.digests()
    return d


ROWS = (
    job("a", released_at=10.0, posted_at=50.0),
    job("b", released_at=20.0, posted_at=60.0),
    job("c", released_at=30.0, posted_at=70.0),
)


# -- what a delta carries -----------------------------------------------------------------


def test_a_changed_job_an_arrived_one_and_one_that_left() -> None:
    sent, _ = advance(None, at(1, ROWS))
    rows = (ROWS[0], dataclasses.replace(ROWS[1], demand=5.0), job("d", released_at=99.0))
    view, delta = advance(sent, at(2, rows, sent_at=101.0))
    assert delta is not None
    assert (delta.base_sequence, delta.sequence, delta.sent_at) == (1, 2, 101.0)
    assert delta.jobs.job_id == ("b", "d") and delta.left == ("c",)
    assert delta.jobs[0].demand == 5.0
    assert view.jobs == at(2, rows).jobs  # nothing within a tolerance here: the digest as built
    m = receiver(sent)
    assert m.receive(wire(delta), 1.0, validated=True).accepted
    got = held(m)
    assert (got.sequence, got.base_sequence, got.left, got.sent_at) == (2, 0, (), 101.0)
    assert bits(got.jobs) == bits(view.jobs)


def test_time_passing_alone_sends_no_job_and_keeps_one_jobs_object() -> None:
    sent, _ = advance(None, at(1, ROWS))
    view, delta = advance(sent, at(2, ROWS, sent_at=160.0))
    assert delta is not None and len(delta.jobs) == 0 and delta.left == ()
    assert view.jobs is sent.jobs and same_columns(view, sent, ())
    m = receiver(sent)
    before = held(m).jobs
    assert m.receive(wire(delta), 1.0, validated=True).accepted
    got = held(m)
    assert got.jobs is before and got.sent_at == 160.0  # the offsets grew by 60 s
    # a full digest with the same jobs is held with the same object too
    assert m.receive(wire(at(3, ROWS, sent_at=170.0)), 2.0, validated=True).accepted
    assert held(m).jobs is before


def test_the_progress_of_a_job_between_io_phases_is_resent_past_the_tolerance() -> None:
    idle = job("w", demand=0.0, released_at=0.0, progress=100.0)
    sent, _ = advance(None, at(1, (idle,)))
    grown = dataclasses.replace(idle, progress=100.0 * (1 + PROGRESS_TOLERANCE / 2))
    view, delta = advance(sent, at(2, (grown,)))
    assert delta is not None and len(delta.jobs) == 0
    assert view.jobs is sent.jobs  # the peers keep the sent value, and so does the sender
    more = dataclasses.replace(idle, progress=100.0 * (1 + 2 * PROGRESS_TOLERANCE))
    view, delta = advance(view, at(3, (more,)))
    assert delta is not None and delta.jobs.job_id == ("w",)
    # within an I/O phase P_i stands still: any change is a change
    busy = job("b", progress=100.0)
    sent, _ = advance(None, at(1, (busy,)))
    _, delta = advance(sent, at(2, (dataclasses.replace(busy, progress=100.0001),)))
    assert delta is not None and delta.jobs.job_id == ("b",)


def test_a_full_digest_on_a_new_incarnation_and_every_full_every_sequences() -> None:
    sent, delta = advance(None, at(1, ROWS))
    assert delta is None and sent.jobs == at(1, ROWS).jobs
    assert advance(sent, at(2, ROWS, incarnation=2))[1] is None
    view = sent
    for sequence in range(2, FULL_EVERY + 1):
        view, delta = advance(view, at(sequence, ROWS))
        assert (delta is None) == (sequence % FULL_EVERY == 0)


# -- what the receiver refuses ---------------------------------------------------------------


def test_a_lost_delta_is_answered_unknown_base_and_the_view_is_kept() -> None:
    first, _ = advance(None, at(1, ROWS))
    second, lost = advance(first, at(2, ROWS[:2]))
    third, delta = advance(second, at(3, (*ROWS[:2], job("d", released_at=1.0))))
    assert lost is not None and delta is not None
    m = receiver(first)
    outcome = m.receive(wire(delta), 1.0, validated=True)
    assert outcome.status is Status.UNKNOWN_BASE
    assert held(m).sequence == 1 and held(m).jobs == first.jobs
    assert m.receive(wire(third), 2.0, validated=True).accepted  # the full one repairs it
    assert bits(held(m).jobs) == bits(third.jobs)


def test_a_stale_delta_is_refused() -> None:
    first, _ = advance(None, at(1, ROWS))
    second, delta = advance(first, at(2, ROWS[1:]))
    m = receiver(first)
    assert m.receive(wire(delta), 1.0, validated=True).accepted  # type: ignore[arg-type]
    again = m.receive(wire(delta), 2.0, validated=True)  # type: ignore[arg-type]
    assert again.status is Status.STALE and held(m).jobs == second.jobs
    assert m.receive(wire(at(1, ROWS)), 3.0, validated=True).status is Status.STALE


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"jobs": (job("b", nodes=0),)}, "jobs[0].nodes"),
        ({"jobs": (job("b", released_at=200.0),)}, "jobs[0].released_at"),
        ({"left": ("zz",)}, "left[0]"),
        ({"left": ("a", "a")}, "left[1]"),
        ({"left": ("b",), "jobs": (job("b"),)}, "left[0]"),
        ({"left": ("",)}, "left[0]"),
        ({"base_sequence": 2}, "base_sequence"),
        ({"sent_at": 50.0}, "sent_at"),
    ],
)
def test_a_malformed_delta_is_rejected_naming_the_field_and_changes_nothing(
    change: dict[str, Any], field: str
) -> None:
    first, _ = advance(None, at(1, ROWS))
    good = dataclasses.replace(at(2, ()), base_sequence=1)
    bad = dataclasses.replace(good, **change)
    m = receiver(first)
    before = held(m)
    try:  # what the servicer does: the wire's check, then the membership's
        outcome = m.receive(wire(bad), 1.0, validated=True)
    except DigestError as exc:
        assert exc.field == field
    else:
        assert outcome.status is Status.REJECTED and outcome.field == field
    assert held(m) is before and bits(before.jobs) == bits(first.jobs)
    assert m.receive(wire(good), 2.0, validated=True).accepted


def test_a_full_digest_may_not_list_jobs_that_left() -> None:
    with pytest.raises(DigestError) as exc:
        wire(dataclasses.replace(at(1, ROWS), left=("a",)))
    assert exc.value.field == "left"


def test_a_delta_never_applies_onto_a_base_of_another_incarnation() -> None:
    first, _ = advance(None, at(1, ROWS))
    m = receiver(first)
    other = dataclasses.replace(at(2, (), incarnation=2), base_sequence=1)
    assert m.receive(wire(other), 1.0, validated=True).status is Status.UNKNOWN_BASE
    with pytest.raises(DigestError):  # apply itself checks its inputs' send instants
        apply(first, dataclasses.replace(other, sent_at=1.0))


# -- the reconstruction is the sender's sent view, bit for bit ---------------------------------


def _step(rng: random.Random, rows: dict[str, JobDigest], t: float) -> None:
    """One λ of a replica's table: a few jobs change, arrive or leave."""
    for _ in range(rng.randint(0, 4)):
        kind = rng.choice(["change", "arrive", "leave", "idle"])
        if kind == "arrive" or not rows:
            job_id = f"j{rng.randrange(10_000)}"
            rows[job_id] = job(job_id, nodes=rng.choice([1, 2, 8]), released_at=t)
        elif kind == "leave":
            del rows[rng.choice(sorted(rows))]
        elif kind == "idle":
            job_id = rng.choice(sorted(rows))
            rows[job_id] = job(job_id, demand=0.0, released_at=0.0, progress=rng.random() * t)
        else:
            job_id = rng.choice(sorted(rows))
            rows[job_id] = dataclasses.replace(
                rows[job_id],
                usage_bytes=float(rng.randrange(3)),
                transferred=rows[job_id].transferred + rng.randrange(3),
                remaining=rng.choice([None, 1e9 * rng.random()]),
            )


@pytest.mark.parametrize("seed", range(4))
def test_the_receiver_holds_the_senders_sent_view_bit_for_bit(seed: int) -> None:
    rng = random.Random(seed)
    rows = {f"j{i}": job(f"j{i}", released_at=1.0 * i) for i in range(20)}
    m = Membership("R1")
    sent: Digest | None = None
    deltas = 0
    for sequence in range(1, 3 * FULL_EVERY):
        t = 100.0 + sequence
        _step(rng, rows, t)
        built = at(sequence, tuple(rows[j] for j in sorted(rows)), sent_at=t)
        sent, delta = advance(sent, built)
        outgoing = sent if delta is None else delta
        deltas += delta is not None
        assert m.receive(wire(outgoing), t, validated=True).accepted
        got = held(m)
        assert bits(got.jobs) == bits(sent.jobs) and got == sent
        if all(built.jobs.open_op) or delta is None:  # no P_i within a tolerance
            assert got.jobs == built.jobs
    assert deltas > 2 * FULL_EVERY


def test_an_unchanged_view_is_equal_to_the_full_digest_as_arrays() -> None:
    sent, _ = advance(None, at(1, ROWS))
    _, delta = advance(sent, at(2, ROWS, sent_at=101.0))
    assert delta is not None
    got = apply(sent, delta)
    full = at(2, ROWS, sent_at=101.0)
    assert got == full
    for name in JOB_ARRAY_FIELDS:
        assert np.array_equal(getattr(got.jobs, name), getattr(full.jobs, name), equal_nan=True)


# -- two replicas on loopback --------------------------------------------------------------


@contextlib.asynccontextmanager
async def pair(tmp_path: Path, policy: str) -> AsyncIterator[dict[str, Replica]]:
    """Replicas r1 (J1) and r2 (J2), once each holds the other's digest."""
    metas = {"r1": JobMeta("J1", "u", "g", 4, 1.0), "r2": JobMeta("J2", "u", "g", 4, 1.0)}
    async with replica_pair(tmp_path, metas, policy) as replicas:
        r1, r2 = replicas["r1"], replicas["r2"]
        # a replica's digests are refused until the receiver has reached it once
        for _ in range(5):
            await r1.exchange(r2)
            await r2.exchange(r1)
            if r1.sync.local_targets is not None and r2.sync.local_targets is not None:
                break
        assert r1.sync.membership.live_peers() == ["r2"]
        assert r2.sync.membership.live_peers() == ["r1"]
        yield replicas


async def test_replicas_send_deltas_and_keep_their_share_until_a_digest_changes(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path, "size-fair") as replicas:
        r1, r2 = replicas["r1"], replicas["r2"]
        await r1.exchange(r2)
        await r2.exchange(r1)
        (link,) = r1.sync.links
        refused, reused = link.refused, r1.sync.reused
        first = r1.sync.local_targets
        assert first is not None and set(first) == {"J1"}
        for _ in range(3):  # nothing changes but time
            await r1.exchange(r2)
            await r2.exchange(r1)
        assert r1.sync.local_targets is first and r1.sync.reused == reused + 3
        assert link.deltas >= 3 and link.delta_bytes < link.full_bytes
        # r2 holds r1's sent view, bit for bit
        (held_r1,) = r2.sync.membership.digests()
        assert r1.sync.sent is not None and bits(held_r1.jobs) == bits(r1.sync.sent.jobs)
        # a new job on r2 (4 nodes of 10 B/s: 40 B/s) changes r2's digest: both recompute
        session = r2.jobs.open_session(JobMeta("J3", "u", "g", 4, 1.0), "c", "h")
        r2.jobs.post(session, 1, OpKind.WRITE, 0)
        await r2.exchange(r1)
        await r1.exchange(r2)
        assert r1.sync.local_targets is not first and r1.sync.reused == reused + 3
        (held_r2,) = r1.sync.membership.digests()
        assert "J3" in held_r2.jobs.job_id and "J3" in (r2.sync.local_targets or {})
        assert (link.refused, link.failures) == (refused, 0)


async def test_a_policy_that_reads_time_decides_again_at_every_exchange(tmp_path: Path) -> None:
    async with pair(tmp_path, "fcfs") as replicas:
        r1, r2 = replicas["r1"], replicas["r2"]
        for _ in range(3):
            await r1.exchange(r2)
            await r2.exchange(r1)
        assert r1.sync.local_targets is not None and r1.sync.links[0].deltas >= 2
        assert r1.sync.reused == r2.sync.reused == 0


async def test_a_malformed_delta_on_the_stream_gets_a_rejected_reply_naming_the_field(
    tmp_path: Path,
) -> None:
    async with pair(tmp_path, "size-fair") as replicas:
        r1, r2 = replicas["r1"], replicas["r2"]
        (link,) = r1.sync.links
        sent = r1.sync.sent
        assert sent is not None
        bad = dataclasses.replace(
            sent, sequence=sent.sequence + 1, base_sequence=sent.sequence, left=("nope",)
        )
        replies: list[pb.ExchangeReply] = []
        channel = grpc.aio.insecure_channel(link.address)
        try:
            call = channel.stream_stream(
                "/burstctl.v1.Peer/Sync",
                request_serializer=pb.Digest.SerializeToString,
                response_deserializer=pb.ExchangeReply.FromString,
            )()
            await call.write(to_proto(bad))
            replies.append(await call.read())
            call.cancel()
        finally:
            await channel.close()
        (reply,) = replies
        assert (reply.status, reply.field) == ("rejected", "left[0]")
        (held_r1,) = r2.sync.membership.digests()
        assert held_r1.sequence == sent.sequence and bits(held_r1.jobs) == bits(sent.jobs)


def test_the_columns_a_share_depends_on() -> None:
    assert columns_read(REGISTRY.create("size-fair", {}).reads) == {
        "job_id",
        "open_op",
        "nodes",
        "demand",
        "user",
        "group",
        "priority",
    }
    assert columns_read(REGISTRY.create("fair-share", {}).reads) == {
        "job_id",
        "open_op",
        "nodes",
        "demand",
    }
    for name in ("fcfs", "greedy-yield", "best-next-event"):  # they read time or say nothing
        assert columns_read(REGISTRY.create(name, {}).reads) is None
    assert columns_read(frozenset({"demand", "released_at"})) is None


async def test_a_job_that_only_moves_bytes_is_sent_but_changes_no_share(tmp_path: Path) -> None:
    async with pair(tmp_path, "size-fair") as replicas:
        r1, r2 = replicas["r1"], replicas["r2"]
        await r1.exchange(r2)
        await r2.exchange(r1)
        first, kept = r2.sync.local_targets, r2.sync.reused
        (session,) = r1.jobs.jobs["J1"].sessions.values()
        r1.jobs.usage(session, 1 << 20, 0, 0.0, 0.5, True)  # waiting: its demand stays b_i
        await r1.exchange(r2)
        (held_r1,) = r2.sync.membership.digests()
        assert held_r1.jobs[0].transferred == 1 << 20  # sent in the delta
        await r2.exchange(r1)
        assert r2.sync.local_targets is first and r2.sync.reused == kept + 1


def test_a_demand_is_resent_past_its_tolerance_and_from_or_to_zero() -> None:
    sent, _ = advance(None, at(1, (job("a", demand=100.0),)))
    near = at(2, (job("a", demand=100.0 * (1 + DEMAND_TOLERANCE / 2)),))
    view, delta = advance(sent, near)
    assert delta is not None and len(delta.jobs) == 0 and view.jobs[0].demand == 100.0
    # compared with the value sent, not the last one built: no drift past the tolerance
    nearer = at(3, (job("a", demand=100.0 * (1 + 1.5 * DEMAND_TOLERANCE)),))
    view, delta = advance(view, nearer)
    assert delta is not None and delta.jobs.job_id == ("a",)
    zero = dataclasses.replace(job("a", demand=0.0), released_at=-10.0)
    sent, _ = advance(None, at(1, (zero,)))
    _, delta = advance(sent, at(2, (job("a", demand=1e-9),)))
    assert delta is not None and delta.jobs.job_id == ("a",)


def test_a_digest_that_moves_its_senders_s_t_is_signalled_and_one_that_moves_bytes_is_not() -> None:
    m = Membership("R1")
    seen: list[int] = []
    m.io_changed.connect(lambda: seen.append(1))
    first, _ = advance(None, at(1, ROWS))
    assert m.receive(wire(first), 0.0, validated=True).accepted and seen == [1]  # news
    moved = (dataclasses.replace(ROWS[0], transferred=5.0), *ROWS[1:])
    sent, delta = advance(first, at(2, moved))
    assert m.receive(wire(delta), 1.0, validated=True).accepted and seen == [1]  # type: ignore[arg-type]
    idle = (job("a", demand=0.0, released_at=10.0), *ROWS[1:])  # a ends its I/O phase
    sent, delta = advance(sent, at(3, idle))
    assert m.receive(wire(delta), 2.0, validated=True).accepted and seen == [1, 1]  # type: ignore[arg-type]
    sent, delta = advance(sent, at(4, (*idle, job("d", released_at=99.0))))  # d arrives in I/O
    assert m.receive(wire(delta), 3.0, validated=True).accepted and len(seen) == 3  # type: ignore[arg-type]
    assert m.receive(wire(at(5, sent.jobs)), 4.0, validated=True).accepted and len(seen) == 3
