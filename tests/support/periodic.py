"""Periodic client jobs for the live PerSched tests: a loop "compute (sleep ``w``), then move
``vol`` bytes" on a real client session (or what a ``Plan`` says per iteration), what it did
(``Trace``), and whether a grant lies outside the windows it paced to (``outside``)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from support import async_wait_until

from burstctl.client import Session
from burstctl.client.bucket import Pattern
from burstctl.policies.persched.live import Installed, PerSchedLive, predicted_iteration

KiB = 1 << 10
CHUNK = 64 * KiB
# A chunk granted this long after its window's end still counts as inside: the thread's
# wake-up after the grant on two shared cores, plus the one-way delay of the Allocation.
LATE = 0.03

# Iteration i's compute seconds and bytes, for a job whose iterations vary.
Plan = Callable[[int], tuple[float, int]]


@dataclass
class Trace:
    """What one periodic client did: per iteration its start and end, per chunk its grant."""

    iterations: list[tuple[float, float]] = field(default_factory=list)
    grants: list[float] = field(default_factory=list)
    pattern: Pattern | None = None


def periodic_loop(
    session: Session,
    w: float,
    vol: int,
    stop: threading.Event,
    trace: Trace,
    chunk: int = CHUNK,
    plan: Plan | None = None,
) -> None:
    """Compute ``w`` then move ``vol`` in ``chunk``-byte acquires, until ``stop``; iteration i
    computes and moves ``plan(i)`` instead when given. A session closed once ``stop`` is set
    (how a test ends a client blocked in its window) ends the loop."""
    i = 0
    with _stopping(stop):
        while not stop.is_set():
            if plan is not None:
                w, vol = plan(i)
            i += 1
            start = time.monotonic()
            time.sleep(w)  # the application's compute phase
            with session.operation("write", vol):
                left = vol
                while left > 0:
                    n = min(chunk, left)
                    session.acquire(n)
                    trace.grants.append(time.monotonic())
                    left -= n
            trace.iterations.append((start, time.monotonic()))
            trace.pattern = session.pattern


def pump(session: Session, stop: threading.Event, grants: list[float]) -> None:
    with _stopping(stop), session.operation("write"):
        while not stop.is_set():
            session.acquire(CHUNK)
            grants.append(time.monotonic())


@contextlib.contextmanager
def _stopping(stop: threading.Event) -> Iterator[None]:
    """A session closed under a client loop after ``stop`` was set ends it quietly."""
    try:
        yield
    except RuntimeError:
        if not stop.is_set():
            raise


def outside(pattern: Pattern, t: float) -> bool:
    """``t`` lies outside every window of ``pattern``, by more than LATE."""
    return all(pattern.rate_at(t - d) <= 0.0 for d in (0.0, LATE / 2, LATE))


@dataclass
class Paced:
    """One periodic client against the pattern in force: its mean iteration over whole
    periods of steady iterations (end to end), the pattern's, and its grants in the window,
    of them how many outside its windows."""

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
    # From the end of one iteration to the end of another whole periods later: a job with
    # n_per instances may alternate lengths, and one whose compute varies starts its
    # iterations at different points, but ends them in its windows.
    n_per = installed.computed.instances(name)
    ends = [e for s, e in trace.iterations if s >= steady]
    ends = ends[: (len(ends) - 1) // n_per * n_per + 1]
    assert len(ends) > 1, f"{name}: no whole period of steady iterations"
    measured = (ends[-1] - ends[0]) / (len(ends) - 1)
    return Paced(name, measured, predicted_iteration(installed, name), len(grants), out)


async def installed_for(policy: PerSchedLive, names: set[str], timeout: float) -> Installed:
    """The pattern ``policy`` installs for the periodic jobs ``names``, once it has."""

    def ready() -> bool:
        installed = policy.installed
        return installed is not None and {j for j, *_ in installed.computed.key[0]} == names

    await async_wait_until(ready, timeout, message=f"the pattern of {sorted(names)}")
    installed = policy.installed
    assert installed is not None and installed.computed.result is not None
    assert installed.computed.error is None
    return installed


async def iterate(traces: list[Trace], steady: float, count: int, timeout: float) -> None:
    """Until every trace has ``count`` iterations started at ``steady`` or later."""
    await async_wait_until(
        lambda: all(sum(1 for s, _ in t.iterations if s >= steady) >= count for t in traces),
        timeout,
        message=f"{count} steady iterations of every periodic job",
    )


# Measurement windows of steady iterations a test may take: a loaded machine (CI's two cores)
# can wake a client late enough to miss one window of its pattern, and a job that misses one
# adds a period to the iteration that waited. A bound that a late wake-up can break (an
# iteration's length, a rate received) must then hold on a later window; what no load may
# break (grants outside the windows, Σ in force ≤ B) is asserted on every window taken.
WINDOWS = 2


@dataclass
class Steady:
    """One measurement window: from ``steady`` to ``end``, under ``installed``, each job's
    ``Paced`` in it, and what the test's ``misses`` found in it (at its end)."""

    installed: Installed
    steady: float
    end: float
    report: list[Paced]
    missed: list[str] = field(default_factory=list)


async def steady_windows(
    policy: PerSchedLive,
    installed: Installed,
    traces: dict[str, Trace],
    count: int,
    timeout: float,
    misses: Callable[[Steady], list[str]],
    relearn: int = 0,
) -> list[Steady]:
    """Windows of ``count`` steady iterations of every job, each after the last, until one
    that ``misses`` finds nothing in (or ``WINDOWS`` were taken): every window's jobs kept to
    their windows. ``relearn``: how many times a pattern on learned periods may be computed
    again (a job's learned period moved by more than the estimator's step on a loaded
    machine); the next window then starts two periods into the new pattern."""
    taken: list[Steady] = []
    steady = time.monotonic() + 2 * _period(installed)
    changes = 0
    while len(taken) < WINDOWS:
        await iterate(list(traces.values()), steady, count, timeout)
        if policy.installed is not installed:
            changes += 1
            assert changes <= relearn, f"the pattern changed while the jobs ran ({changes}x)"
            installed = await installed_for(policy, set(traces), 10)
            steady = time.monotonic() + 2 * _period(installed)
            continue
        end = time.monotonic()
        report = [paced(installed, name, trace, steady, end) for name, trace in traces.items()]
        taken.append(Steady(installed, steady, end, report))
        for got in report:
            assert got.outside <= 0.01 * got.grants, (len(taken), report)
        taken[-1].missed = misses(taken[-1])
        if not taken[-1].missed:
            break
        steady = end
    return taken


def late(window: Steady, names: set[str] | None = None, rel: float = 0.05) -> list[str]:
    """The jobs (of ``names``, default all) whose iterations in ``window`` were not the
    pattern's within ``rel``."""
    return [
        f"{got.name}: {got.measured:.4f} s for {got.predicted:.4f} s"
        for got in window.report
        if (names is None or got.name in names)
        and abs(got.measured - got.predicted) > rel * got.predicted
    ]


def pumped(window: Steady, grants: list[float]) -> float:
    """Bytes/s a ``pump`` moved in ``window``, from its ``grants``."""
    got = sum(1 for t in grants if window.steady <= t <= window.end)
    return got * CHUNK / (window.end - window.steady)


def short_of(window: Steady, grants: list[float], reserve: float, rel: float = 0.15) -> list[str]:
    """The pump of ``grants`` if it did not get ``reserve`` (bytes/s) in ``window``, within
    ``rel``."""
    rate = pumped(window, grants)
    return [] if abs(rate - reserve) <= rel * reserve else [f"the reserve's job: {rate:.0f} B/s"]


def _period(installed: Installed) -> float:
    result = installed.computed.result
    assert result is not None
    return result.period
