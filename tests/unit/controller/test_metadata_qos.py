"""Metadata QoS on one replica (controller/metadata_qos.py): a job's metadata limit shared
equally by its live sessions, offered on their outboxes (``Allocation.metadata_rate``) as a
copy of the allocation in force, re-shared as sessions open and close."""

from __future__ import annotations

from burstctl.controller.jobs import JobTable
from burstctl.controller.metadata_qos import MetadataQos, session_share
from burstctl.controller.outbox import StreamOutbox
from burstctl.controller.records import JobMeta


def meta(job_id: str) -> JobMeta:
    return JobMeta(job_id=job_id, user="u", group="g", nodes=1, priority=1.0)


async def test_a_change_of_metadata_rate_is_a_copy_of_the_allocation_in_force() -> None:
    box = StreamOutbox("r1")
    box.offer_metadata(50.0)  # before any allocation: carried by the first one
    assert box.take() is None
    box.offer(1e6, 1e5, 1, 2.0, "fair-share")
    first = box.take()
    assert first is not None and first.allocation.metadata_rate == 50.0
    box.offer_metadata(50.0)  # the same: nothing to send
    assert box.take() is None
    box.offer_metadata(0.0)  # lifted
    copy = box.take()
    assert copy is not None and copy.allocation.metadata_rate == 0.0
    assert (copy.allocation.epoch, copy.allocation.rate) == (1, 1e6)  # the one in force
    assert box.take() is None


async def test_each_live_session_gets_an_equal_share_and_the_shares_follow_the_sessions() -> None:
    table = JobTable(lambda: 0.0, heartbeat_timeout=1.0, job_retention=1.0, demand_headroom=1.1)
    limits: dict[str, float] = {}
    qos = MetadataQos(table, lambda job_id: limits.get(job_id, 0.0))
    boxes = [StreamOutbox("r1") for _ in range(3)]
    first = table.open_session(meta("j"), "c1", "h", outbox=boxes[0])
    other = table.open_session(meta("k"), "c3", "h", outbox=boxes[2])
    for box in boxes[::2]:
        box.offer(1e6, 1e5, 1, 2.0, "fair-share")
        assert box.take() is not None
    limits["j"] = 200.0
    qos.rules_changed()
    in_force = boxes[0].take()
    assert in_force is not None and in_force.allocation.metadata_rate == 200.0
    assert boxes[2].take() is None  # another job: untouched
    assert first.job.metadata_limit == 200.0 and other.job.metadata_limit == 0.0

    second = table.open_session(meta("j"), "c2", "h", outbox=boxes[1])
    qos.job_changed("j")  # what the servicer calls as a session opens
    boxes[1].offer(1e6, 1e5, 1, 2.0, "fair-share")
    shares = [box.take() for box in boxes[:2]]
    assert [s.allocation.metadata_rate for s in shares if s is not None] == [100.0, 100.0]

    table.close_session(second)
    qos.job_changed("j")
    again = boxes[0].take()
    assert again is not None and again.allocation.metadata_rate == 200.0
    assert session_share(table.jobs["k"]) == 0.0
    limits.pop("j")  # the rule removed: unpaced
    qos.rules_changed()
    lifted = boxes[0].take()
    assert lifted is not None and lifted.allocation.metadata_rate == 0.0


async def test_a_job_on_two_replicas_gets_half_its_limit_on_each() -> None:
    table = JobTable(lambda: 0.0, heartbeat_timeout=1.0, job_retention=1.0, demand_headroom=1.1)
    peers: dict[str, list[str]] = {}
    qos = MetadataQos(
        table, lambda job_id: 200.0, lambda wanted: {j: peers[j] for j in wanted & set(peers)}
    )
    box = StreamOutbox("r1")
    table.open_session(meta("j"), "c1", "h", outbox=box)
    box.offer(1e6, 1e5, 1, 2.0, "fair-share")
    qos.job_changed("j")
    first = box.take()
    assert first is not None and first.allocation.metadata_rate == 200.0
    peers["j"] = ["r2"]  # a peer's digest lists the job: the limit is split over both
    qos.peers_changed()
    half = box.take()
    assert half is not None and half.allocation.metadata_rate == 100.0
