"""The advised replicas on a session's outbox (``StreamOutbox.offer_advice``, Allocation.advice)."""

from __future__ import annotations

from burstctl.controller.outbox import StreamOutbox


async def test_a_change_of_advice_is_a_copy_of_the_allocation_in_force() -> None:
    box = StreamOutbox("r1")
    box.offer_advice(("a:1",))  # before any allocation: carried by the first one
    assert box.take() is None
    box.offer(1e6, 1e5, 1, 2.0, "fair-share")
    first = box.take()
    assert first is not None and list(first.allocation.advice.replicas) == ["a:1"]

    box.offer_advice(("a:1",))  # the same: nothing to send
    assert box.take() is None
    box.offer_advice(("a:1", "b:2"))
    copy = box.take()
    assert copy is not None
    assert list(copy.allocation.advice.replicas) == ["a:1", "b:2"]
    assert (copy.allocation.epoch, copy.allocation.rate) == (1, 1e6)  # the one in force
    assert box.take() is None

    box.offer(2e6, 1e5, 2, 2.0, "fair-share")
    later = box.take()
    assert later is not None and list(later.allocation.advice.replicas) == ["a:1", "b:2"]


async def test_a_session_without_advice_gets_none() -> None:
    box = StreamOutbox("r1")
    box.offer(1e6, 1e5, 1, 2.0, "fair-share")
    message = box.take()
    assert message is not None and not message.allocation.HasField("advice")
