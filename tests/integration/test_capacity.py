"""The burst buffer's capacity tier, live (docs/capacity.md): a real controller process on
loopback with ``--bb-capacity`` / ``--pfs-bandwidth``, real client Sessions, no FUSE.

- Three writers each add 12 MiB in 256 KiB steps to an 8 MiB buffer while a drain thread
  evicts what they wrote: what is on the buffer never exceeds S (+ one step per writer),
  every writer completes, and /v1/capacity shows the residents and who waits.
- Drain streams of two jobs under ``--pfs-bandwidth 4MiB/s`` get about 2 MiB/s each; their
  bytes are the jobs' ``drained``, not their ``bytes_written``.
- Bad flags are refused at start.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest
from support import Pump, measure, wait_until

from burstctl.client import JobInfo, Session

pytestmark = pytest.mark.integration

MiB = 1 << 20
KiB = 1 << 10
S = 8 * MiB
STEP = 256 * KiB
PER_WRITER = 12 * MiB


def job(name: str) -> JobInfo:
    return JobInfo(name, "alice", "physics", 1)


class Buffer:
    """The buffer the writers fill and the drain empties: each writer's true resident."""

    def __init__(self, writers: int) -> None:
        self.lock = threading.Lock()
        self.resident = [0] * writers
        self.peak = 0  # the largest Σ resident seen

    def add(self, i: int, n: int) -> int:
        with self.lock:
            self.resident[i] += n
            self.peak = max(self.peak, sum(self.resident))
            return self.resident[i]

    def take(self, i: int, n: int) -> int:
        with self.lock:
            self.resident[i] -= min(n, self.resident[i])
            return self.resident[i]


def capacity(url: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/v1/capacity", timeout=5)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_writers_wait_for_space_and_the_buffer_never_overflows(controller_factory: Any) -> None:
    ctl = controller_factory("--bb-capacity", "8MiB", "--capacity", "400MiB/s")
    names = ["ckpt-a", "ckpt-b", "ckpt-c"]
    buffer = Buffer(len(names))
    sessions = [
        Session(ctl.address, job(n), buffer=True, report_interval=0.05, client_id=f"mount-{n}")
        for n in names
    ]
    errors: list[BaseException] = []
    done = [0] * len(names)
    stop = threading.Event()

    def writer(i: int) -> None:
        try:
            for _ in range(PER_WRITER // STEP):
                sessions[i].acquire_space(STEP)
                resident = buffer.add(i, STEP)
                sessions[i].report_buffer(resident, resident)
                done[i] += STEP
        except BaseException as exc:  # asserted on below
            errors.append(exc)

    def drain() -> None:
        # The mount's drain: evicts at about 12 MiB/s in all, round robin over the writers.
        rate, last = 12 * MiB, time.monotonic()
        while not stop.is_set():
            stop.wait(0.01)  # the drain's own pace (a workload), not synchronisation
            now = time.monotonic()
            budget, last = int(rate * (now - last) / len(names)), now
            for i, session in enumerate(sessions):
                resident = buffer.take(i, budget)
                session.report_buffer(resident, resident)

    try:
        assert all(s.wait_attached(10) for s in sessions)
        threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(3)]
        drainer = threading.Thread(target=drain, daemon=True)
        for t in threads:
            t.start()
        assert ctl.url is not None
        # While they write, the controller knows the residents and who waits for space.
        seen = wait_until(
            lambda: (c := capacity(ctl.url))["waiting"] and c["resident"] > 0 and c,
            10,
            message="a writer waiting for space, in /v1/capacity",
        )
        assert isinstance(seen, dict)
        assert seen["size"] == S and seen["used"] <= S
        assert {j["job_id"] for j in seen["jobs"]} <= set(names)
        assert sum(j["resident"] for j in seen["jobs"]) > 0
        assert set(seen["waiting"]) <= set(names)
        metrics = httpx.get(f"{ctl.url}/metrics", timeout=5).text
        assert 'burstctl_bb_capacity_bytes{replica="' in metrics
        assert any(
            line.startswith("burstctl_bb_resident_bytes{") and 'job="ckpt-' in line
            for line in metrics.splitlines()
        ), metrics
        drainer.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), f"writers stuck at {done}"
        assert not errors, errors
        assert done == [PER_WRITER] * 3
        # 36 MiB went through an 8 MiB buffer, never more than S (+ a step per writer) on it.
        assert buffer.peak <= S + 3 * STEP, buffer.peak
        assert buffer.peak > S // 2  # the bound was approached: it is what held them back
        assert all(s.total_wait_seconds > 0 for s in sessions)
        assert all(s.buffer_added == PER_WRITER for s in sessions)
    finally:
        stop.set()
        for s in sessions:
            s.close()
    print(f"buffer peak {buffer.peak / MiB:.2f} MiB of {S / MiB:.0f} MiB")


def test_drain_streams_share_the_pfs_bandwidth_and_are_booked_as_drained(
    controller_factory: Any,
) -> None:
    ctl = controller_factory(
        "--pfs-bandwidth", "4MiB/s", "--capacity", "400MiB/s", "--node-bandwidth", "400MiB/s"
    )
    with (
        Session(ctl.address, job("drain-a"), purpose="drain") as a,
        Session(ctl.address, job("drain-b"), purpose="drain") as b,
    ):
        pumps = [Pump(a).start(), Pump(b).start()]
        assert ctl.url is not None
        try:
            wait_until(lambda: a.rate > 0 and b.rate > 0, 10, message="both drains flowing")
            rate_a, rate_b = measure(pumps, 4.0)
            # while they still drain: the books, /v1/capacity and /metrics show it
            wait_until(
                lambda: (
                    all(j["drained"] > 0 for j in capacity(ctl.url)["jobs"])
                    and len(capacity(ctl.url)["jobs"]) == 2
                ),
                10,
                message="drained bytes booked",
            )
            body = capacity(ctl.url)
            metrics = {
                line.split("{")[0]: float(line.rsplit(" ", 1)[1])
                for line in httpx.get(f"{ctl.url}/metrics", timeout=5).text.splitlines()
                if line.startswith(("burstctl_drained_bytes_total", "burstctl_drain_rate"))
            }
        finally:
            for p in pumps:
                p.stop()
        assert not pumps[0].errors and not pumps[1].errors
        assert body["size"] is None and body["drain_bandwidth"] == 4 * MiB
        assert body["drain_rate"] == pytest.approx(4 * MiB, rel=0.05)
        assert metrics["burstctl_drained_bytes_total"] > 0
        assert metrics["burstctl_drain_rate_bytes_per_second"] == pytest.approx(4 * MiB, rel=0.05)
        assert "burstctl_bb_capacity_bytes" not in metrics  # no capacity set
        jobs = httpx.get(f"{ctl.url}/v1/jobs", timeout=5).json()
        for row in jobs:  # a drain's bytes are not the job's own I/O
            assert row["bytes_written"] == 0 and row["bytes_moved"] == 0, row
    print(f"drains: {rate_a / MiB:.2f} and {rate_b / MiB:.2f} MiB/s of 4 MiB/s")
    assert rate_a == pytest.approx(2 * MiB, rel=0.10)
    assert rate_b == pytest.approx(2 * MiB, rel=0.10)


def test_drains_do_not_take_from_the_applications(controller_factory: Any) -> None:
    """An APP job alone gets the whole B while another job drains: drains are no rows."""
    ctl = controller_factory(
        "--pfs-bandwidth", "4MiB/s", "--capacity", "16MiB/s", "--node-bandwidth", "400MiB/s"
    )
    with (
        Session(ctl.address, job("app")) as app,
        Session(ctl.address, job("other"), purpose="drain") as drain,
    ):
        pumps = [Pump(app).start(), Pump(drain).start()]
        try:
            wait_until(lambda: app.rate > 0 and drain.rate > 0, 10, message="both flowing")
            wait_until(lambda: app.rate >= 15 * MiB, 10, message="the app at B")
            assert drain.rate == pytest.approx(4 * MiB, rel=0.02)
        finally:
            for p in pumps:
                p.stop()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--bb-capacity", "0"),
        ("--bb-capacity", "-1"),
        ("--bb-capacity", "lots"),
        ("--pfs-bandwidth", "0"),
        ("--pfs-bandwidth", "fast"),
    ],
)
def test_bad_capacity_flags_are_refused_at_start(flag: str, value: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "burstctl", "controller", flag, value,
         "--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode != 0
    assert flag.removeprefix("--").replace("-", "_") in result.stderr, result.stderr
