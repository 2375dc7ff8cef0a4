"""Periodic client jobs for the live PerSched tests: a loop "compute (sleep ``w``), then move
``vol`` bytes" on a real client session, what it did (``Trace``), and whether a grant lies
outside the windows it paced to (``outside``)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from burstctl.client import Session
from burstctl.client.bucket import Pattern
from burstctl.policies.persched.live import Installed, predicted_iteration

KiB = 1 << 10
CHUNK = 64 * KiB
# A chunk granted this long after its window's end still counts as inside: the thread's
# wake-up after the grant on two shared cores, plus the one-way delay of the Allocation.
LATE = 0.03


@dataclass
class Trace:
    """What one periodic client did: per iteration its start and end, per chunk its grant."""

    iterations: list[tuple[float, float]] = field(default_factory=list)
    grants: list[float] = field(default_factory=list)
    pattern: Pattern | None = None


def periodic_loop(
    session: Session, w: float, vol: int, stop: threading.Event, trace: Trace
) -> None:
    while not stop.is_set():
        start = time.monotonic()
        time.sleep(w)  # the application's compute phase
        with session.operation("write", vol):
            left = vol
            while left > 0:
                n = min(CHUNK, left)
                session.acquire(n)
                trace.grants.append(time.monotonic())
                left -= n
        trace.iterations.append((start, time.monotonic()))
        trace.pattern = session.pattern


def pump(session: Session, stop: threading.Event, grants: list[float]) -> None:
    with session.operation("write"):
        while not stop.is_set():
            session.acquire(CHUNK)
            grants.append(time.monotonic())


def outside(pattern: Pattern, t: float) -> bool:
    """``t`` lies outside every window of ``pattern``, by more than LATE."""
    return all(pattern.rate_at(t - d) <= 0.0 for d in (0.0, LATE / 2, LATE))


@dataclass
class Paced:
    """One periodic client against the pattern in force: its mean iteration over whole
    periods of steady iterations, the pattern's, and its grants in the window, of them how
    many outside its windows."""

    name: str
    measured: float
    predicted: float
    grants: int
    outside: int


def paced(installed: Installed, name: str, trace: Trace, steady: float, end: float) -> Paced:
    """How ``trace`` (job ``name``) kept to ``installed`` between ``steady`` and ``end``."""
    pattern = trace.pattern
    assert pattern is not None, f"{name} never paced to windows"
    result = installed.computed.result
    assert result is not None and pattern.period == pytest.approx(result.pattern.period)
    grants = [t for t in trace.grants if steady <= t <= end]
    out = sum(1 for t in grants if outside(pattern, t))
    # Whole periods of iterations: a job with n_per instances may alternate lengths.
    n_per = installed.computed.instances(name)
    its = [(s, e) for s, e in trace.iterations if s >= steady]
    its = its[: len(its) // n_per * n_per]
    assert its, f"{name}: no whole period of steady iterations"
    measured = (its[-1][1] - its[0][0]) / len(its)
    return Paced(name, measured, predicted_iteration(installed, name), len(grants), out)
