"""``bench/scale.py`` runs end to end and prints the fields its readers compare.

Two replica processes, ~50 sessions of the client runtime in one generator, a few seconds:
the JSON has every field per replica, generator and in total, with values that are sane
whatever the machine's load (counts add up, ratios and indices in range). How fast anything
was is the benchmark's business, not this test's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCALE = Path(__file__).resolve().parents[2] / "bench" / "scale.py"
SECONDS = 3
ARGS = ("--replicas", "2", "--sessions", "50", "--generators", "1", "--ramp", "1")


def test_scale_bench_prints_every_field() -> None:
    done = subprocess.run(
        [sys.executable, str(SCALE), *ARGS, "--seconds", str(SECONDS)],
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)

    assert out["benchmark"] == "scale"
    assert out["sessions"] >= 50
    assert 0 < out["multi_replica_jobs"] < out["jobs"]
    assert len(out["replicas"]) == 2
    assert sum(r["sessions"] for r in out["replicas"]) == out["sessions"]
    for r in out["replicas"]:
        windows = r["ratio"]["windows"]
        assert len(windows) == 2 * (SECONDS - 1) + 1  # 1 s windows every 0.5 s
        assert all(x >= 0 for x in windows)
        assert r["ratio"]["max"] == max(windows)
        assert r["ratio"]["over_1_05"] == sum(x > 1.05 for x in windows)
        assert 0 < r["demand"] < 1  # 25 sessions want a fraction of a replica
        assert r["attached_end"] + r["never_attached"] >= 0
        assert 0 <= r["never_attached"] <= r["sessions"]
        assert r["attached_end"] <= r["sessions"]
        assert r["jain"] is None or 0 < r["jain"] <= 1
        assert r["cpu_cores"] >= 0 and r["rss_mib"] > 0
        assert r["decisions"] > 0 and r["messages"] > 0
        assert r["decision_p99_s"] >= r["decision_p50_s"] > 0
        assert r["messages_per_session_s"] > 0
        assert r["sync"]["exchanges"] > 0  # the two replicas are each other's peer
        assert r["profile"] is None
    assert len(out["generators"]) == 1
    assert out["generators"][0]["sessions"] == out["sessions"]
    assert out["generators"][0]["cpu_cores"] > 0
    total = out["total"]
    assert total["attached_end"] == sum(r["attached_end"] for r in out["replicas"])
    assert total["never_attached"] == sum(r["never_attached"] for r in out["replicas"])
    assert total["over_1_05"] == 0  # demand is a fraction of capacity
    assert set(total["multi_vs_single_per_node"]) == {"mean", "max"}
    assert 2 <= total["demand_multi_vs_single"] <= 3
    for key in ("lease_expiries", "attach_timeouts", "refusals", "stream_ends"):
        assert key in total
