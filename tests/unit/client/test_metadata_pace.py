"""A session's metadata bucket (client/metadata.py): unpaced at 0, one token per operation at
its rate with a small burst, a wait that a thread's cancellation ends, kept until told."""

from __future__ import annotations

import errno
import threading
import time
from typing import Any

import pytest
from support import wait_until

from burstctl.client.metadata import MetadataPace, metadata_burst
from burstctl.client.waits import Cancellation, Interrupted


def test_unpaced_until_a_rate_comes_and_again_at_zero() -> None:
    seen: list[float] = []
    pace = MetadataPace(on_rate=seen.append)
    for _ in range(10_000):
        pace.acquire()  # no rate: never waits
    pace.set_rate(50.0)
    pace.set_rate(50.0)  # unchanged: not told again
    pace.set_rate(0.0)
    for _ in range(1000):
        pace.acquire()
    assert seen == [50.0, 0.0]
    assert pace.wait_seconds == 0.0


def test_operations_go_at_the_rate_after_a_small_burst() -> None:
    rate = 100.0
    assert metadata_burst(rate) == pytest.approx(10.0)
    assert metadata_burst(2.0) == 1.0  # at least one operation
    pace = MetadataPace()
    pace.set_rate(rate)
    start = time.monotonic()
    for _ in range(40):
        pace.acquire()
    elapsed = time.monotonic() - start
    # The bucket starts empty: 40 operations take at least 40 / rate less rounding (a loaded
    # machine only makes them slower: no upper bound here).
    assert elapsed >= 0.9 * 40 / rate
    assert pace.wait_seconds > 0.0


def test_a_bad_rate_is_ignored_and_the_last_one_kept() -> None:
    pace = MetadataPace()
    pace.set_rate(20.0)
    for bad in (float("nan"), float("inf"), -1.0):
        pace.set_rate(bad)
        assert pace.rate == 20.0


def waiting_storm(pace: MetadataPace, cancellation: Cancellation) -> tuple[list[Exception], Any]:
    """Three operations at 0.5 ops/s in a thread under ``cancellation``, once the second
    waits: (what they raised, the thread)."""
    pace.set_rate(0.5)  # one operation per 2 s, burst 1
    outcome: list[Exception] = []

    def run() -> None:
        with cancellation:
            try:
                for _ in range(3):
                    pace.acquire()
            except Exception as err:  # checked by the caller
                outcome.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_until(lambda: pace.waiting, message="an operation to wait")
    return outcome, thread


def test_a_fired_cancellation_ends_the_wait() -> None:
    pace, cancellation = MetadataPace(), Cancellation()
    outcome, thread = waiting_storm(pace, cancellation)
    cancellation.fire()
    thread.join(5)
    assert isinstance(outcome[0], Interrupted) and outcome[0].errno == errno.EINTR
    assert not pace.waiting


def test_closing_lets_the_waiters_go() -> None:
    pace = MetadataPace()
    outcome, thread = waiting_storm(pace, Cancellation())
    pace.close()
    thread.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], RuntimeError)
