"""`PageSpace`: a job's space carried between a session (a fake with the real session's space
calls) and a real `JobPage`, the library's side played by writing the page's counters."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import pytest

from burstctl.preload_shim.page import (
    OFF_SPACE_CLAIMED,
    OFF_SPACE_LANDED,
    OFF_SPACE_WANT,
    SPACE_UNLIMITED,
    JobPage,
)
from burstctl.preload_shim.space import PageSpace

MiB = 1 << 20


class FakeSession:
    """The space calls of `burstctl.client.Session`, with a limit the test sets."""

    def __init__(self, limit: int | None, attached: bool = True) -> None:
        self.space_limit = limit
        self.buffer_added = 0
        self.landed = 0
        self.attached = attached
        self.closed = False
        self.events: list[str] = []

    def acquire_space(self, nbytes: int, landed: bool = True) -> None:
        assert not landed
        if self.space_limit is not None:
            assert self.buffer_added + nbytes <= self.space_limit, "a wait in the gate"
        self.buffer_added += nbytes

    def space_landed(self, nbytes: int) -> None:
        self.landed = min(self.buffer_added, self.landed + nbytes)
        self.events.append(f"landed {nbytes}")

    def wait_attached(self, timeout: float | None = None) -> bool:
        return self.attached


@pytest.fixture
def page() -> Iterator[JobPage]:
    made = JobPage("test-space")
    yield made
    made.close()


def library(page: JobPage, *, claimed: int, landed: int, want: int = 0) -> None:
    """What the library writes: its claims, what landed, what a waiter wants."""
    for off, value in ((OFF_SPACE_CLAIMED, claimed), (OFF_SPACE_LANDED, landed)):
        ctypes.c_int64.from_buffer(page._map, off).value = value
    ctypes.c_int64.from_buffer(page._map, OFF_SPACE_WANT).value = want


def test_a_new_page_is_unlimited_until_fed_then_gets_nothing_without_a_session(
    page: JobPage,
) -> None:
    assert page.space().limit == SPACE_UNLIMITED  # a page nobody feeds limits nothing
    space = PageSpace(page)
    assert page.space().limit == 0
    space.step(None, lambda: None)
    assert page.space().limit == 0


def test_the_grant_goes_to_the_page_while_writing_and_landed_bytes_after_the_measure(
    page: JobPage,
) -> None:
    session = FakeSession(limit=4 * MiB)
    space = PageSpace(page)
    library(page, claimed=0, landed=0, want=MiB)  # a writer waits for its first MiB
    space.step(session, lambda: session.events.append("measured"))
    assert page.space().limit == 4 * MiB and session.buffer_added == 4 * MiB
    library(page, claimed=3 * MiB, landed=2 * MiB, want=MiB)
    space.step(session, lambda: session.events.append("measured"))
    assert session.events[-2:] == ["measured", f"landed {2 * MiB}"]
    assert session.landed == 2 * MiB
    session.space_limit = 6 * MiB  # more granted, and the job still writes
    library(page, claimed=4 * MiB, landed=4 * MiB, want=MiB)
    space.step(session, lambda: None)
    assert page.space().limit == 6 * MiB and session.landed == 4 * MiB


def test_no_grant_is_taken_while_the_job_does_not_write(page: JobPage) -> None:
    session = FakeSession(limit=2 * MiB)
    space = PageSpace(page)
    library(page, claimed=0, landed=0, want=MiB)
    space.step(session, lambda: None)
    library(page, claimed=MiB, landed=MiB, want=MiB)
    space.step(session, lambda: None)
    session.space_limit = 8 * MiB  # granted to another writer of the job (a restore)
    space.step(session, lambda: None)  # no claim since: the page takes nothing
    assert page.space().limit == 2 * MiB and session.buffer_added == 2 * MiB


def test_a_waiter_wanting_more_than_the_grant_waits_in_the_gate(page: JobPage) -> None:
    session = FakeSession(limit=MiB)
    space = PageSpace(page)
    library(page, claimed=0, landed=0, want=3 * MiB)  # one write of 3 MiB
    with pytest.raises(AssertionError, match="a wait in the gate"):
        space.step(session, lambda: None)  # the fake's gate would block: the write waits too
    # what the session had is the page's at once (a smaller write may use it); 3 MiB waits
    assert page.space().limit == MiB


def test_no_capacity_means_unlimited_and_claims_still_booked(page: JobPage) -> None:
    session = FakeSession(limit=None)
    space = PageSpace(page)
    space.step(session, lambda: None)
    assert page.space().limit == SPACE_UNLIMITED
    library(page, claimed=5 * MiB, landed=5 * MiB)
    space.step(session, lambda: None)
    assert session.buffer_added == 5 * MiB and session.landed == 5 * MiB


def test_a_new_session_starts_from_the_claims_of_the_old(page: JobPage) -> None:
    old = FakeSession(limit=4 * MiB)
    space = PageSpace(page)
    library(page, claimed=0, landed=0, want=MiB)
    space.step(old, lambda: None)
    library(page, claimed=3 * MiB, landed=2 * MiB, want=MiB)  # 1 MiB in flight
    new = FakeSession(limit=MiB)
    space.step(new, lambda: None)
    # the old session's bytes in flight never land on the new one; the page gets its grant
    assert page.space().limit == 4 * MiB and new.buffer_added == MiB
    library(page, claimed=3 * MiB, landed=3 * MiB, want=MiB)
    space.step(new, lambda: None)
    assert new.landed == 0
