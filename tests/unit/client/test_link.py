"""What a node stream writes without its linger (client/link.py: is_urgent)."""

from __future__ import annotations

from burstctl.client.link import is_urgent
from burstctl.proto.burstctl.v1 import controller_pb2 as pb


def test_what_someone_waits_on_is_urgent() -> None:
    assert is_urgent(pb.ClientMessage(hello=pb.Hello(job_id="j")))
    assert is_urgent(pb.ClientMessage(usage=pb.Usage(applied_epoch=7)))
    assert is_urgent(pb.ClientMessage(op_posted=pb.OpPosted(op_id=1, kind=pb.OP_KIND_WRITE)))
    assert is_urgent(pb.ClientMessage(op_completed=pb.OpCompleted(op_id=1)))
    assert is_urgent(pb.ClientMessage(leave=pb.Leave(pacing_rate=1.0)))


def test_reports_and_goodbyes_wait_for_the_batch() -> None:
    # (a report that a wait starts is urgent by its writer's word, not by its kind)
    waits = pb.Usage(bytes=10, interval_seconds=0.25, waiting=True, totals=pb.Counters())
    assert not is_urgent(pb.ClientMessage(usage=waits))
    report = pb.Usage(bytes=10, interval_seconds=0.25, applied_epoch=7, totals=pb.Counters())
    assert not is_urgent(pb.ClientMessage(usage=report))
    assert not is_urgent(
        pb.ClientMessage(usage=pb.Usage(interval_seconds=1.0, totals=pb.Counters()))
    )
    assert not is_urgent(pb.ClientMessage(goodbye=pb.Goodbye()))
