"""An allocation's pattern of windows, on this client's clock (docs/client.md, "Windows").

The period's origin is ``origin_seconds`` from the receipt: the controller computed it just
before writing, so the phase is late by the message's one-way delay (docs/protocol.md,
"Windows"). A renewal of the pattern in force whose origin moved only by the jitter of that
delay (`PHASE_SLACK`) keeps the phase in force: a phase shifted mid-window loses its tokens,
which the job then finds only in its next window.
"""

from __future__ import annotations

from burstctl.client.bucket import Pattern
from burstctl.common.limits import windows_problem
from burstctl.proto.burstctl.v1 import controller_pb2 as pb

# A renewal of the same windows whose origin is within this many seconds of the one in force
# keeps the phase in force (one-way delays vary by about a millisecond on a LAN).
PHASE_SLACK = 0.01


class MalformedWindows(ValueError):
    """Windows that break the protocol: ``field`` (of ``windows``) and what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"windows.{field}: {problem}")
        self.field = field
        self.problem = problem


def pattern_of(windows: pb.Windows, received: float, last: Pattern | None) -> Pattern:
    """The pattern of ``windows`` received at ``received`` (this client's clock), or ``last``
    (the pattern in force) when it is a renewal of it; `MalformedWindows` if malformed."""
    period, origin = windows.period_seconds, windows.origin_seconds
    spans = [(w.start_seconds, w.end_seconds, w.rate) for w in windows.window]
    problem = windows_problem(period, spans)
    if problem is None and not (0.0 <= origin < period):
        problem = ("origin_seconds", f"must be in [0, period), got {origin!r}")
    if problem is not None:
        raise MalformedWindows(*problem)
    pattern = Pattern(period, received + origin, spans)
    if last is not None and last.same_windows(pattern):
        drift = (pattern.origin - last.origin) % period
        if min(drift, period - drift) <= PHASE_SLACK:
            return last
    return pattern
