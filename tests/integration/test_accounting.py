"""A job's counters: each byte under the kind of the acquire that moved it, and nothing
lost when the controller restarts (issue 15, finding 5; docs/protocol.md, Usage)."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support import ControllerProcess, async_wait_until, wait_until

from burstctl.client import JobInfo, Session
from burstctl.controller.app import Replica

pytestmark = pytest.mark.integration
MiB = 1 << 20


def job_counters(url: str, job_id: str) -> dict[str, int] | None:
    r = httpx.get(f"{url}/v1/jobs/{job_id}")
    return r.json() if r.status_code == 200 else None


async def test_each_byte_is_booked_under_the_kind_of_its_acquire(replica: Replica) -> None:
    # `cp` inside the mount: reads and writes of one job interleave while one operation is
    # open; a phase's first operation does not decide the kind of all its bytes.
    s = await asyncio.to_thread(Session, replica.grpc_address, JobInfo("cp", "ann", "bio"))
    try:

        def copy() -> None:
            with s.operation("read"):
                for _ in range(4):
                    s.acquire(256 << 10, "read")
                    s.acquire(512 << 10, "write")
            with s.operation("write"):
                s.acquire(1 * MiB, "read")
                s.acquire(128 << 10, "metadata")

        await asyncio.to_thread(copy)

        async def booked() -> dict[str, int] | None:
            j = await asyncio.to_thread(job_counters, replica.http_url, "cp")
            return (
                j
                if j is not None and j["bytes_moved"] == 4 * 768 * 1024 + MiB + (128 << 10)
                else None
            )

        j = await async_wait_until(booked, 5, message="usage booked")
        assert isinstance(j, dict)
        assert (j["bytes_read"], j["bytes_written"]) == (2 * MiB, 2 * MiB)
        assert j["metadata_ops"] == 1
    finally:
        await asyncio.to_thread(s.close)


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[ControllerProcess]:
    proc = ControllerProcess(tmp_path / "state", env={"BURSTCTL_LEDGER_INTERVAL": "0.2"})
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def test_counters_survive_a_crash_of_the_controller(
    controller: ControllerProcess, tmp_path: Path
) -> None:
    assert controller.url is not None and controller.address is not None
    info = JobInfo("j1", "ann", "bio")
    # A session that ends before the crash: only the ledger remembers it.
    with Session(controller.address, info, fallback="keep-last") as gone:
        gone.acquire(1 * MiB, "write")
    ledger = tmp_path / "state" / "ledger.json"

    def saved() -> bool:
        try:
            jobs = json.loads(ledger.read_text())["jobs"]
        except (OSError, ValueError, KeyError):
            return False
        return jobs.get("j1", {}).get("counters", {}).get("bytes") == 1 * MiB

    wait_until(saved, 10, message="ledger saved")
    live = Session(controller.address, info, fallback="keep-last")
    try:
        # One operation open across the crash, so the rate kept is the one in force (an
        # implicit operation would end after its quiet gap and keep-last would keep 0 B/s
        # for the 30 s before its floor: on a loaded machine the booking below outlasts
        # that gap).
        with live.operation("read"):
            live.acquire(2 * MiB, "read")
            url = controller.url
            wait_until(
                lambda: (job_counters(url, "j1") or {}).get("bytes_moved") == 3 * MiB,
                10,
                message="live session's bytes booked",
            )
            # Killed: whatever the live session reported after the last save is not on disk.
            address = controller.address
            controller.stop(signal.SIGKILL)
            live.acquire(1 * MiB, "read")  # moved while no controller runs
            controller.requested_address = address
            controller.start()
            new_url = controller.url
            assert new_url is not None

            def after_restart() -> dict[str, int] | None:
                j = job_counters(new_url, "j1")
                return j if j is not None and j["bytes_moved"] == 4 * MiB else None

            j = wait_until(after_restart, 15, message="counters carried over the restart")
            assert isinstance(j, dict)
            assert (j["bytes_written"], j["bytes_read"]) == (1 * MiB, 3 * MiB)
    finally:
        live.close()
