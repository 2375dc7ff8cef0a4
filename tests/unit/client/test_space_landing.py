"""Space in flight (docs/capacity.md, "The space contract"): bytes acquired with
``landed=False`` are reported as granted, not as added, until the caller says they are on the
buffer and in its resident report. A report taken between a write's grant and its resident
report would otherwise tell the controller about less than the buffer is about to hold, and it
would grant that space again (the overflow a stage-out test caught on CI)."""

from __future__ import annotations

from burstctl.client.space import SpaceGate


def test_bytes_in_flight_are_reported_as_granted_until_they_land() -> None:
    gate = SpaceGate()
    gate.set_limit(10)
    gate.acquire(4, landed=False)
    assert gate.added == 4  # counted against the limit at once
    assert gate.snapshot().buffer.added == 0  # reported: still granted space, unused
    gate.report(4, 4, "")
    gate.land(4)
    assert gate.snapshot().buffer.added == 4
    gate.acquire(3)  # landed=True: a caller whose report already counts them
    assert gate.snapshot().buffer.added == 7
    gate.land(100)  # never past what was acquired
    assert gate.snapshot().buffer.added == 7
