"""The period estimator (policies/periods.py) on synthetic phase trains: exact, jittered, with a
missed phase, with a change of period, aperiodic, and its bounded memory; and ``PhaseLog``."""

from __future__ import annotations

import random

import pytest

from burstctl.policies.periods import (
    MIN_SAMPLES,
    WINDOW,
    Estimate,
    PeriodEstimator,
    PhaseLog,
)

MiB = float(1 << 20)
CAP = 16 * MiB  # b_i, bytes/s


def train(log: PhaseLog, w: float, vol: float, n: int, t: float = 0.0, io: float = 0.1) -> float:
    """``n`` iterations "compute w, then a phase of vol bytes lasting io s" from ``t``; the
    time after the last one."""
    total = 0
    for _ in range(n):
        t += w
        log.start(t, total)
        total += int(vol)
        t += io
        log.moved(t)
        log.end(t, total)
    return t


def near(value: float, truth: float, rel: float = 0.05) -> bool:
    return abs(value - truth) <= rel * truth


def test_an_exact_train_is_learned_at_its_first_samples() -> None:
    log = PhaseLog()
    t = train(log, 0.2, 3 * MiB, MIN_SAMPLES)  # the first phase gives no sample
    est = log.estimate
    assert est is not None and not est.confident and est.samples == MIN_SAMPLES - 1
    train(log, 0.2, 3 * MiB, 1, t=t)
    est = log.estimate
    assert est is not None and est.confident and est.confidence == pytest.approx(1.0)
    assert est.samples == MIN_SAMPLES
    assert est.w == pytest.approx(0.2) and est.vol_io == 3 * MiB
    assert est.period(CAP) == pytest.approx(0.2 + 3 / 16)
    assert est.io_fraction(CAP) == pytest.approx((3 / 16) / (0.2 + 3 / 16))


@pytest.mark.parametrize("seed", range(20))
def test_jitter_of_five_percent_is_learned_within_five_percent_in_ten_iterations(
    seed: int,
) -> None:
    rng = random.Random(seed)
    est = PeriodEstimator()
    first_confident = None
    for k in range(1, 40):
        gap = 0.3 * rng.uniform(0.95, 1.05)
        vol = 4 * MiB * rng.uniform(0.95, 1.05)
        e = est.observe(gap, vol)
        if e.confident and first_confident is None:
            first_confident = k
        if first_confident is not None:
            assert e.confident, k  # stays confident
            assert near(e.w, 0.3) and near(e.vol_io, 4 * MiB)
            assert near(e.period(CAP), 0.3 + 4 / 16)
    assert first_confident is not None and first_confident + 1 <= 10  # + the first phase
    assert 0.6 <= est.estimate.confidence < 1.0  # type: ignore[union-attr]


def test_a_missed_phase_moves_nothing() -> None:
    est = PeriodEstimator()
    for _ in range(8):
        est.observe(0.25, MiB)
    # a phase the controller did not see: one gap spans two iterations and the next phase
    # carries the bytes of one
    e = est.observe(0.25 + 0.25 + 1 / 16, MiB)
    assert e.confident and e.w == 0.25 and e.vol_io == MiB
    for _ in range(3):
        e = est.observe(0.25, MiB)
        assert e.confident and e.w == 0.25
    # one phase that moved twice (two iterations' bytes in one phase)
    e = est.observe(0.25, 2 * MiB)
    assert e.confident and e.vol_io == MiB


def test_a_change_of_period_is_relearned_and_confidence_drops_meanwhile() -> None:
    est = PeriodEstimator()
    for _ in range(WINDOW):
        est.observe(0.2, 3 * MiB)
    seen: list[Estimate] = []
    for _ in range(10):
        seen.append(est.observe(0.5, 6 * MiB))
    # not confident for a while after the change, then confident on the new values
    assert any(not e.confident for e in seen)
    dropped = next(k for k, e in enumerate(seen) if not e.confident)
    assert all(e.w == 0.2 for e in seen[:dropped])  # the old values until the change is seen
    back = next(k for k, e in enumerate(seen) if k > dropped and e.confident)
    assert back <= 6
    assert all(e.confident and e.w == 0.5 and e.vol_io == 6 * MiB for e in seen[back:])
    assert min(e.confidence for e in seen) < 0.6


@pytest.mark.parametrize("seed", range(60))
def test_aperiodic_phases_are_never_confident(seed: int) -> None:
    rng = random.Random(1000 + seed)
    est = PeriodEstimator()
    for _ in range(300):
        if seed % 3 == 0:  # random gaps and volumes
            gap, vol = rng.uniform(0.01, 2.0), rng.uniform(0.1, 20) * MiB
        elif seed % 3 == 1:  # exponential gaps, fixed volume
            gap, vol = rng.expovariate(2.0), 4 * MiB
        else:  # fixed gap, log-normal volumes (σ = 0.5: a third either way is common)
            gap, vol = 0.5, rng.lognormvariate(0.0, 0.5) * MiB
        assert not est.observe(gap, vol).confident


def test_memory_is_bounded_by_the_window() -> None:
    est = PeriodEstimator()
    for k in range(10 * WINDOW):
        est.observe(0.1 + (k % 2) * 1e-4, MiB)
    assert len(est) == WINDOW
    e = est.estimate
    assert e is not None and e.samples == WINDOW and e.confident
    with pytest.raises(ValueError):
        PeriodEstimator(window=MIN_SAMPLES - 1)


def test_jitter_below_the_publish_tolerance_keeps_the_published_values() -> None:
    est = PeriodEstimator()
    for _ in range(MIN_SAMPLES):
        est.observe(0.2, MiB)
    published = est.estimate
    assert published is not None and published.confident
    for k in range(20):
        e = est.observe(0.2 * (1.01 if k % 2 else 0.99), MiB * (1.005 if k % 3 else 0.995))
        assert (e.w, e.vol_io) == (published.w, published.vol_io)


def test_zero_volume_phases_are_never_confident() -> None:
    est = PeriodEstimator()
    for _ in range(2 * WINDOW):
        assert not est.observe(0.2, 0.0).confident


def test_the_phase_log_ends_a_phase_at_its_last_byte_and_gives_the_gap() -> None:
    log = PhaseLog()
    assert log.end(1.0, 0) is None  # no phase open
    log.start(1.0, 100)
    log.moved(1.2)
    first = log.end(1.3, 600)  # an implicit operation: completed a quiet gap after its bytes
    assert first is not None
    assert (first.start, first.end, first.volume, first.gap) == (1.0, 1.2, 500.0, None)
    assert first.seconds == pytest.approx(0.2)
    log.start(1.7, 600)
    second = log.end(1.9, 1600)  # no byte reported during it: ends when seen to end
    assert second is not None and second.gap == pytest.approx(0.5) and second.end == 1.9
    assert len(log.estimator) == 1  # the first phase gives no sample


def test_a_confident_job_keeps_its_period_through_a_few_late_phase_boundaries() -> None:
    """A loaded node sees some phase boundaries late: up to one sample in four off the
    median does not take the period of a job already confident away."""
    est = PeriodEstimator()
    for _ in range(WINDOW):
        est.observe(0.25, MiB)
    for k in range(WINDOW):
        late = k % 5 == 0  # 4 of the last 16 gaps, up to 80 % long, apart
        e = est.observe(0.25 * (1.8 if late else 1.0), MiB)
        assert e.confident and e.w == 0.25, k
    # a job not yet confident is held to one in eight
    fresh = PeriodEstimator()
    for k in range(WINDOW):
        fresh.observe(0.25 * (1.8 if k % 5 == 0 else 1.0), MiB)
    assert not fresh.estimate.confident  # type: ignore[union-attr]
