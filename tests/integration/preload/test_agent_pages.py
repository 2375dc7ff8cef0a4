"""The agent's pages in-process: a pattern's windows published at their edges, and the
page's counters booked with bounds (the page is writable by the job's own processes).

The agent runs on this test's loop with a recording stand-in for its pacer where the
bookings are checked; no controller is needed (nothing here opens a session).
"""

from __future__ import annotations

import asyncio
import ctypes
import math
import mmap
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support import async_wait_until

from burstctl.client.bucket import Pattern
from burstctl.client.job import JobInfo
from burstctl.preload_shim import page as layout
from burstctl.preload_shim.agent import MAX_TICK_BYTES, Agent
from burstctl.preload_shim.config import AgentConfig

pytestmark = pytest.mark.integration

JOB = JobInfo("pages", "root", "root")


class Books:
    """Stands in for the agent's `Pacer`: records what the agent books."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, int]] = []
        self.waits: list[bool] = []

    def record(self, job: JobInfo, kind: str, nbytes: int, calls: int = 1) -> None:
        self.records.append((job.job_id, kind, nbytes))

    def waiting(self, job: JobInfo, waiting: bool) -> None:
        self.waits.append(waiting)

    def session_of(self, job: JobInfo) -> Any:
        return None

    def released(self, conn_id: int) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    config = AgentConfig(controller="127.0.0.1:1", paths=str(tmp_path), socket=tmp_path / "s")
    real = Agent(config, socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET))
    real._loop = asyncio.get_running_loop()
    real.pacer = Books()  # type: ignore[assignment]
    yield real
    await real.close()


def poke(page: layout.JobPage, off: int, value: int) -> None:
    """Writes a counter as a process of the job may (through its own mapping)."""
    view = mmap.mmap(page.fd, layout.PAGE_SIZE, mmap.MAP_SHARED)
    ctypes.c_int64.from_buffer(view, off).value = value
    del view


async def test_a_patterns_windows_reach_the_page_at_their_edges(agent: Agent) -> None:
    slot = agent._slot(JOB)
    page = agent._page_of(slot)
    assert page.rate == 0.0  # nothing before the first allocation
    # Period 1 s from now: [0, 0.5) at 1000 B/s, nothing in [0.5, 1).
    pattern = Pattern(1.0, time.monotonic(), [(0.0, 0.5, 1000.0)])
    agent._apply_bucket(slot.key, JOB, (500.0, 100.0, pattern))
    assert page.rate == 1000.0 and page.burst == 100
    await async_wait_until(lambda: page.rate == 0.0, timeout=3, message="the window's end")
    # What the window earned and nobody reserved is gone: nothing flows between windows.
    assert page.filled(layout.monotonic_ns()) <= page.counters().taken
    await async_wait_until(lambda: page.rate == 1000.0, timeout=3, message="the next window")
    # A plain allocation replaces the pattern: its edges stop.
    agent._apply_bucket(slot.key, JOB, (math.inf, 0.0, None))
    assert page.rate == math.inf and slot.edge is None


async def test_counters_are_booked_as_deltas_within_bounds(agent: Agent) -> None:
    books = agent.pacer
    assert isinstance(books, Books)
    slot = agent._slot(JOB)
    page = agent._page_of(slot)

    async def booked(n: int) -> None:
        await async_wait_until(lambda: len(books.records) >= n, timeout=3)

    poke(page, layout.OFF_REQ_WRITE, 100)
    poke(page, layout.OFF_REQ_READ, 7)
    agent.tick()
    await booked(2)
    assert sorted(books.records) == [("pages", "read", 7), ("pages", "write", 100)]
    poke(page, layout.OFF_REQ_WRITE, 40)  # back: books nothing, counts on from 40
    agent.tick()
    poke(page, layout.OFF_REQ_WRITE, 45)
    agent.tick()
    await booked(3)
    assert books.records[2] == ("pages", "write", 5)
    poke(page, layout.OFF_REQ_WRITE, 45 + (1 << 60))  # absurd: capped
    agent.tick()
    await booked(4)
    assert books.records[3] == ("pages", "write", MAX_TICK_BYTES)
    # Waiters: one notice per change, at once on the eventfd (no tick needed).
    poke(page, layout.OFF_WAITERS, 2)
    poke(page, layout.OFF_WAIT_BEAT, layout.monotonic_ns())
    os.eventfd_write(page.eventfd, 1)
    await async_wait_until(lambda: books.waits == [True], timeout=3)
    poke(page, layout.OFF_WAITERS, 0)
    agent.tick()
    await async_wait_until(lambda: books.waits == [True, False], timeout=3)
    assert page.counters().waiters == 0
    # A count whose beat went stale (its waiters were killed mid-wait) is nobody.
    poke(page, layout.OFF_WAITERS, 1)
    poke(page, layout.OFF_WAIT_BEAT, layout.monotonic_ns() - layout.WAIT_STALE_NS)
    agent.tick()
    assert not page.counters().waiting(layout.monotonic_ns())
    assert books.waits == [True, False]
