"""A renewal of the pattern in force keeps the client's phase (issue 17, live PerSched).

The controller renews a session's allocation every half lease; the origin of its windows is
"seconds from the receipt", so each renewal moved the client's phase by the jitter of the
message's delay. A phase that moves mid-window loses that window's tokens, and the job's last
bytes then wait a whole period: the live ``persched`` test saw one iteration in three take
1.5 periods."""

from __future__ import annotations

from support.clock import FakeClock

from burstctl.client.bucket import Throttle
from burstctl.client.job import JobInfo
from burstctl.client.options import SessionOptions
from burstctl.client.stream import SessionStream
from burstctl.client.windows import PHASE_SLACK
from burstctl.proto.burstctl.v1 import controller_pb2 as pb


def stream(clock: FakeClock) -> SessionStream:
    options = SessionOptions.build(
        "127.0.0.1:1",
        JobInfo("j", "ann", "phys"),
        "keep-last",
        report_interval=1.0,
        quiet_gap=0.0,
        attach_timeout=1.0,
        client_id="c",
    )
    return SessionStream(options, Throttle(clock), clock)


def allocation(epoch: int, origin: float, start: float = 0.1) -> pb.Allocation:
    windows = pb.Windows(
        period_seconds=1.0,
        origin_seconds=origin,
        window=[pb.Window(start_seconds=start, end_seconds=start + 0.3, rate=1e6)],
    )
    return pb.Allocation(rate=3e5, burst=5e4, epoch=epoch, lease_seconds=1.0, windows=windows)


def test_a_renewal_whose_origin_moved_by_a_delay_jitter_keeps_the_phase() -> None:
    clock = FakeClock()
    s = stream(clock)
    s._on_allocation(allocation(1, 0.5))
    first = s._fallback.last_pattern
    assert first is not None and first.origin == 100.5
    clock.now = 100.5  # half a period later, the renewal arrives 3 ms later than the first did
    s._on_allocation(allocation(2, 0.997))
    assert s._fallback.last_pattern is first
    assert PHASE_SLACK >= 0.003


def test_a_new_phase_or_new_windows_are_taken() -> None:
    clock = FakeClock()
    s = stream(clock)
    s._on_allocation(allocation(1, 0.5))
    clock.now = 100.5
    s._on_allocation(allocation(2, 0.8))  # the phase moved by 0.2 s: a new origin
    moved = s._fallback.last_pattern
    assert moved is not None and abs(moved.origin - 101.3) < 1e-9
    s._on_allocation(allocation(3, 0.8, start=0.2))  # other windows
    assert s._fallback.last_pattern is not moved
