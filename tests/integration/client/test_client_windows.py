"""Allocations with a periodic pattern of windows (issue 17), client side: the session takes
a well-formed pattern, ignores a malformed one with a logged error (the stream goes on), and
keep-last keeps the last pattern when the lease runs out.

Real gRPC servers on loopback (the scripted `FakeController`); the session is the real one.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import pytest

from burstctl.client import JobInfo, Session
from burstctl.common.limits import MAX_WINDOWS
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

pytestmark = pytest.mark.integration

MiB = 1 << 20
JOB = JobInfo("job-17", "ann", "phys")


def windows(period: float, origin: float, spans: list[tuple[float, float, float]]) -> pb.Windows:
    return pb.Windows(
        period_seconds=period,
        origin_seconds=origin,
        window=[pb.Window(start_seconds=s, end_seconds=e, rate=r) for s, e, r in spans],
    )


def test_a_pattern_is_anchored_at_its_receipt(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    controller = make_controller(initial_rate=MiB)
    with Session(controller.address, JOB) as session:
        assert session.wait_attached(5)
        before = time.monotonic()
        controller.push(0.3 * 4 * MiB, windows=windows(1.0, 0.25, [(0.0, 0.3, 4 * MiB)]))
        pattern = wait_until(lambda: session.pattern, message="the pattern in force")
        after = time.monotonic()
        assert pattern.period == 1.0
        assert before + 0.25 <= pattern.origin <= after + 0.25
        assert pattern.mean_rate() == pytest.approx(0.3 * 4 * MiB)
        assert session.rate == pytest.approx(0.3 * 4 * MiB)
        # a plain allocation afterwards drops it
        controller.push(2 * MiB)
        wait_until(lambda: session.pattern is None, message="the plain rate in force")
        assert session.rate == 2 * MiB


MALFORMED = {
    "period 0": windows(0.0, 0.0, []),
    "negative period": windows(-1.0, 0.0, [(0.0, 0.1, MiB)]),
    "NaN period": windows(math.nan, 0.0, [(0.0, 0.1, MiB)]),
    "negative start": windows(1.0, 0.0, [(-0.1, 0.1, MiB)]),
    "NaN start": windows(1.0, 0.0, [(math.nan, 0.1, MiB)]),
    "end before start": windows(1.0, 0.0, [(0.5, 0.4, MiB)]),
    "end = start": windows(1.0, 0.0, [(0.5, 0.5, MiB)]),
    "longer than the period": windows(1.0, 0.0, [(0.5, 1.6, MiB)]),
    "negative rate": windows(1.0, 0.0, [(0.0, 0.1, -MiB)]),
    "infinite rate": windows(1.0, 0.0, [(0.0, 0.1, math.inf)]),
    "overlapping": windows(1.0, 0.0, [(0.0, 0.3, MiB), (0.2, 0.4, MiB)]),
    "too many windows": windows(
        1.0, 0.0, [(i / 100, i / 100 + 0.005, MiB) for i in range(MAX_WINDOWS + 1)]
    ),
    "origin past the period": windows(1.0, 1.5, [(0.0, 0.1, MiB)]),
    "negative origin": windows(1.0, -0.1, [(0.0, 0.1, MiB)]),
    "NaN origin": windows(1.0, math.nan, [(0.0, 0.1, MiB)]),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_pattern_is_ignored_with_a_logged_error(
    name: str,
    make_controller: Callable[..., Any],
    wait_until: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    controller = make_controller(initial_rate=MiB)
    rates: list[float] = []
    with Session(controller.address, JOB, rate_observer=rates.append) as session:
        assert session.wait_attached(5)
        with caplog.at_level(logging.ERROR, logger="burstctl.client.stream"):
            controller.push(3 * MiB, windows=MALFORMED[name])
            controller.push(2 * MiB)  # handled after the malformed one, on the same stream
            wait_until(lambda: session.rate == 2 * MiB, message="the next allocation")
        assert 3 * MiB not in rates, "the malformed allocation was applied"
        assert session.pattern is None
        assert any("malformed windows" in r.getMessage() for r in caplog.records)
        session.acquire(1024)  # the session goes on
        assert len(controller.received("hello")) == 1, "the stream was torn down"


def test_keep_last_keeps_the_pattern_when_the_lease_runs_out(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    controller = make_controller(initial_rate=MiB)
    with Session(controller.address, JOB, fallback_grace=math.inf) as session:
        assert session.wait_attached(5)
        controller.push(0.3 * 4 * MiB, lease=0.3, windows=windows(1.0, 0.0, [(0.0, 0.3, 4 * MiB)]))
        pattern = wait_until(lambda: session.pattern, message="the pattern in force")
        wait_until(lambda: not session.attached, message="the lease to run out")
        assert session.pattern is pattern
        assert session.rate == pytest.approx(0.3 * 4 * MiB)


def test_a_fixed_fallback_paces_at_its_rate_without_the_pattern(
    make_controller: Callable[..., Any], wait_until: Callable[..., None]
) -> None:
    controller = make_controller(initial_rate=MiB)
    with Session(controller.address, JOB, fallback="fixed:5MiB/s") as session:
        assert session.wait_attached(5)
        controller.push(0.3 * 4 * MiB, lease=0.3, windows=windows(1.0, 0.0, [(0.0, 0.3, 4 * MiB)]))
        wait_until(lambda: session.pattern, message="the pattern in force")
        wait_until(lambda: not session.attached, message="the lease to run out")
        assert session.pattern is None
        assert session.rate == 5 * MiB
