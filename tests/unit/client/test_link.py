"""What a node stream writes without its linger (client/link.py: urgent)."""

from __future__ import annotations

from burstctl.client.link import urgent
from burstctl.proto.burstctl.v1 import controller_pb2 as pb


def test_a_hello_and_the_acknowledgement_of_a_decrease_are_urgent() -> None:
    assert urgent(pb.ClientMessage(hello=pb.Hello(job_id="j")))
    assert urgent(pb.ClientMessage(usage=pb.Usage(applied_epoch=7)))


def test_reports_operations_and_goodbyes_wait_for_the_batch() -> None:
    report = pb.Usage(bytes=10, interval_seconds=0.25, applied_epoch=7, totals=pb.Counters())
    assert not urgent(pb.ClientMessage(usage=report))
    assert not urgent(pb.ClientMessage(usage=pb.Usage(interval_seconds=1.0, totals=pb.Counters())))
    assert not urgent(pb.ClientMessage(op_posted=pb.OpPosted(op_id=1, kind=pb.OP_KIND_WRITE)))
    assert not urgent(pb.ClientMessage(goodbye=pb.Goodbye()))
