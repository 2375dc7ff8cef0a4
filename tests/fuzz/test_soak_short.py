"""bench/soak.py for 30 s, in the suite: the same code as the 10-minute benchmark.

1,000 session slots open, post, acquire and close against a real controller process for
30 s. No session may get stuck (an acquire not back within ``--stuck-after``), nothing may
be raised into the application, the controller stays up, and its RSS stays within 50 MiB
of its level after the warm-up.
"""

from __future__ import annotations

import pytest
import soak

pytestmark = pytest.mark.integration

MiB = 1 << 20


# 1,000 sessions against one controller: the machine's cores are the controller's, not
# shared with other tests (a controller starved of CPU leaves sessions waiting).
@pytest.mark.serial
@pytest.mark.timeout(90)
def test_soak_30s() -> None:
    args = soak.parse_args(["--duration", "30", "--sessions", "1000", "--sample", "5"])
    report = soak.soak(args)
    assert report["stuck_sessions"] == 0, report["samples"]
    assert report["error_count"] == 0, report["errors"]
    # Every slot opened sessions, and they churned: open, acquire, close, again.
    assert report["sessions_opened"] > args.sessions, report["sessions_opened"]
    assert report["sessions_closed"] == report["sessions_opened"]
    assert report["acquires"] >= report["sessions_opened"]
    rss = report["rss_mib"]
    assert rss["max"] - rss["after_warmup"] < 50, rss
    # The decision-latency histogram was read from /metrics in every window with decisions.
    assert any(s["decision_p99_ms"] is not None for s in report["samples"]), report["samples"]
