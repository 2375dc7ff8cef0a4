"""Periods learned online: a job's compute time w and bytes per iteration vol_io, learned from
its observed I/O phases, with a confidence (docs/persched.md, "Learned periods").

A periodic application alternates compute (w seconds) and I/O (vol_io bytes) ([PERSCHED]).
What the controller sees of it is a train of I/O phases, each a start, an end and the bytes it
moved. Under a policy that paces I/O to windows (PerSched) the length of a phase and the time
from one phase's start to the next are set by the windows, not by the job; what stays the job's
own is the gap between a phase's end and the next phase's start (its compute, w) and the bytes of
a phase (vol_io). So each phase after the first gives one sample (the gap before it, its bytes),
and the estimate is robust statistics ([ROBUST]) over a window of the last ``WINDOW`` samples:
the median of each, and as spread the largest relative deviation from the median once the
farthest samples (one in ``OUTLIER_EVERY``; for a job already confident, one in
``OUTLIER_EVERY_KEPT``) are set aside. A missed or a stray phase is one
outlier, which moves neither; jitter widens the spread a little; a job that is not periodic has
a spread of the order of its median and is never confident. FTIO ([FTIO]) finds the period as
the dominant frequency of the sampled I/O signal; here the signal is already cut into phases,
and under pacing its cadence is the pattern's, not the job's, so the gap and the volume are
measured directly.

- confidence = (1 − d / ``SPREAD_SCALE``)⁺ · min(1, n / ``MIN_SAMPLES``)³, d the larger of the
  two spreads (the gap's taken against at least ``MIN_GAP``: a phase boundary is seen through
  the network, so a few milliseconds of a short compute are noise, not aperiodicity);
- ``confident`` once n ≥ ``MIN_SAMPLES``, confidence ≥ ``CONFIDENT`` and vol_io > 0;
- a change of period: when the older samples were periodic and the last ``CHANGE_RUN`` all lie
  more than ``CHANGE_TOLERANCE`` off their medians and agree among themselves, the older
  samples are dropped, so the job is learned again from the new ones (not confident meanwhile);
- the published w and vol_io move only when the medians move by more than
  ``PUBLISH_TOLERANCE``: a policy that recomputes on a change of period (PerSched) is not
  asked to at every phase for noise.

:class:`PhaseLog` is one job's observation of its phases (the one the controller keeps per job,
``controller/records.py``): it turns phase starts, ends and byte reports into :class:`Phase`
records and feeds each to the job's :class:`PeriodEstimator`. Pure: the caller passes every
time; memory per job is bounded by the window.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

# Samples (gap, bytes) an estimator keeps: the last WINDOW phases.
WINDOW = 16
# Samples needed before a job may be confident (its first phase gives none).
MIN_SAMPLES = 6
# One sample in this many may be an outlier (a missed or stray phase): set aside. A job
# already confident keeps its confidence with one in OUTLIER_EVERY_KEPT set aside: a few late
# phase boundaries (a loaded node) do not take its period from the policies.
OUTLIER_EVERY = 8
OUTLIER_EVERY_KEPT = 4
# Confidence from which the learned values are used.
CONFIDENT = 0.6
# Relative spread at which confidence reaches 0: CONFIDENT is reached at a spread of
# (1 − CONFIDENT)·SPREAD_SCALE = 0.15 (every sample but the outliers within 15 % of the median).
SPREAD_SCALE = 0.375
# Seconds: a gap's dispersion is taken relative to at least this (the controller sees phase
# boundaries a few milliseconds late or early).
MIN_GAP = 0.01
# A change of period: the last CHANGE_RUN samples all off the medians by more than this.
CHANGE_RUN = 4
CHANGE_TOLERANCE = 0.2
# The published values move when the medians move by more than this (relative).
PUBLISH_TOLERANCE = 0.02


@dataclass(frozen=True, slots=True)
class Phase:
    """One observed I/O phase: ``start`` and ``end`` on the caller's clock, the bytes it moved,
    and the gap since the previous phase's end (None: the first phase seen)."""

    start: float
    end: float
    volume: float
    gap: float | None

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Estimate:
    """What is learned of one job: w (s), vol_io (bytes), the confidence in [0, 1], the samples
    it rests on, and whether the policies may use it."""

    w: float
    vol_io: float
    confidence: float
    samples: int
    confident: bool

    def transfer(self, cap: float) -> float:
        """vol_io / b_i: the I/O phase at full speed (cap b_i, bytes/s)."""
        return self.vol_io / cap if cap > 0.0 else 0.0

    def period(self, cap: float) -> float:
        """T = w + vol_io / b_i: the iteration of the job running alone."""
        return self.w + self.transfer(cap)

    def io_fraction(self, cap: float) -> float:
        """(vol_io / b_i) / T: the share of an iteration the job spends in I/O alone."""
        period = self.period(cap)
        return self.transfer(cap) / period if period > 0.0 else 0.0


def _off(value: float, median: float, floor: float) -> float:
    """|value − median| / max(median, floor): how far off the median, relatively."""
    scale = max(median, floor)
    if scale > 0.0:
        return abs(value - median) / scale
    return 0.0 if value == median else float("inf")


def _spread(values: deque[float], median: float, floor: float, every: int) -> float:
    """The largest relative deviation from the median once the ``len // every`` farthest
    samples are set aside."""
    offs = sorted(_off(v, median, floor) for v in values)
    return offs[len(offs) - 1 - len(offs) // every]


class PeriodEstimator:
    """One job's learned period from its samples (module docstring). ``estimate`` is None
    until a sample was observed."""

    __slots__ = ("_gaps", "_volumes", "estimate")

    def __init__(self, window: int = WINDOW) -> None:
        if window < MIN_SAMPLES:
            raise ValueError(f"window must be >= {MIN_SAMPLES}, got {window}")
        self._gaps: deque[float] = deque(maxlen=window)
        self._volumes: deque[float] = deque(maxlen=window)
        self.estimate: Estimate | None = None

    def __len__(self) -> int:
        return len(self._gaps)

    def observe(self, gap: float, volume: float) -> Estimate:
        """One iteration: ``gap`` seconds of compute before a phase of ``volume`` bytes."""
        gaps, volumes = self._gaps, self._volumes
        gaps.append(max(0.0, gap))
        volumes.append(max(0.0, volume))
        if len(gaps) >= CHANGE_RUN + MIN_SAMPLES and self._changed():
            for _ in range(len(gaps) - CHANGE_RUN):
                gaps.popleft()
                volumes.popleft()
        w = statistics.median(gaps)
        vol = statistics.median(volumes)
        n = len(gaps)
        before = self.estimate
        every = OUTLIER_EVERY_KEPT if before is not None and before.confident else OUTLIER_EVERY
        spread = max(_spread(gaps, w, MIN_GAP, every), _spread(volumes, vol, 0.0, every))
        # (n / MIN_SAMPLES)³: fewer than MIN_SAMPLES samples never reach CONFIDENT
        confidence = max(0.0, 1.0 - spread / SPREAD_SCALE) * min(1.0, n / MIN_SAMPLES) ** 3
        confident = n >= MIN_SAMPLES and confidence >= CONFIDENT and vol > 0.0
        if (
            before is not None
            and before.confident == confident
            and _off(w, before.w, MIN_GAP) <= PUBLISH_TOLERANCE
            and _off(vol, before.vol_io, 0.0) <= PUBLISH_TOLERANCE
        ):
            w, vol = before.w, before.vol_io  # noise: the published values stand
        self.estimate = Estimate(w, vol, confidence, n, confident)
        return self.estimate

    def _changed(self) -> bool:
        """The older samples were periodic, and the last CHANGE_RUN all lie off their medians
        and agree among themselves (noise that happens to agree a few times is no change)."""
        older_gaps = deque(list(self._gaps)[:-CHANGE_RUN])
        older_volumes = deque(list(self._volumes)[:-CHANGE_RUN])
        w, vol = statistics.median(older_gaps), statistics.median(older_volumes)
        settled = (1.0 - CONFIDENT) * SPREAD_SCALE
        spreads = (
            _spread(older_gaps, w, MIN_GAP, OUTLIER_EVERY),
            _spread(older_volumes, vol, 0.0, OUTLIER_EVERY),
        )
        if max(spreads) > settled:
            return False
        recent = list(zip(self._gaps, self._volumes, strict=True))[-CHANGE_RUN:]
        if not all(
            _off(g, w, MIN_GAP) > CHANGE_TOLERANCE or _off(v, vol, 0.0) > CHANGE_TOLERANCE
            for g, v in recent
        ):
            return False
        new_w = statistics.median(g for g, _ in recent)
        new_vol = statistics.median(v for _, v in recent)
        agree = CHANGE_TOLERANCE / 2
        return all(
            _off(g, new_w, MIN_GAP) <= agree and _off(v, new_vol, 0.0) <= agree for g, v in recent
        )


@dataclass(slots=True)
class PhaseLog:
    """One job's I/O phases as observed, and the period learned from them (module docstring).

    The caller says when a phase starts and ends (with the job's byte total then, so a phase's
    bytes are the difference), when bytes were reported during one (``moved``) and when a
    client says its last byte was (``last_byte``). A phase's end is its last byte when that
    came before the end was seen: an implicit operation of the client ends only a quiet gap
    after its last byte (docs/client.md), and says so when it completes; without that, the
    report that carried the byte is the closest the controller knows to it.
    """

    estimator: PeriodEstimator = field(default_factory=PeriodEstimator)
    started: float | None = None
    bytes_at_start: int = 0
    last_bytes_at: float | None = None
    last_end: float | None = None

    def start(self, now: float, total_bytes: int) -> None:
        self.started = now
        self.bytes_at_start = total_bytes
        self.last_bytes_at = None

    def moved(self, now: float) -> None:
        """Bytes of the current phase were reported at ``now``."""
        if self.started is not None:
            self.last_bytes_at = now

    def last_byte(self, at: float) -> None:
        """The client says its last byte was at ``at`` (an operation that completed a quiet
        gap after it): closer than the report that carried it."""
        if self.started is not None:
            self.last_bytes_at = at

    def end(self, now: float, total_bytes: int) -> Phase | None:
        """The current phase ends at ``now`` (None: no phase was open); feeds the estimator."""
        start = self.started
        if start is None:
            return None
        end = now if self.last_bytes_at is None else max(start, min(now, self.last_bytes_at))
        gap = start - self.last_end if self.last_end is not None else None
        phase = Phase(start, end, float(max(0, total_bytes - self.bytes_at_start)), gap)
        self.started = None
        self.last_bytes_at = None
        self.last_end = end
        if gap is not None:
            self.estimator.observe(gap, phase.volume)
        return phase

    @property
    def estimate(self) -> Estimate | None:
        return self.estimator.estimate
