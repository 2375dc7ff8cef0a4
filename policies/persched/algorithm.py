"""PERSCHED and its insertion procedures ([PERSCHED] §3.1, Algorithms 1–3).

Pure computation: no I/O, no clock. Where the paper is ambiguous this follows the
authors' simulator ([PERSCHED-SIM] ``Simulator.cpp``, ``Pattern.cpp``); each such
choice is named where it is made and listed in docs/persched.md.

The pattern under construction is a timeline of event dates in ``[0, T)`` with the
total bandwidth in use on each interval between consecutive dates (a sorted list,
searched with ``bisect``), plus, per application, its instances' compute starts
(sorted) and I/O sub-intervals.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from burstctl.policies.persched.model import App, Platform, cap, time_io, upper_bound
from burstctl.policies.persched.pattern import AppPattern, Instance, Interval, Pattern

# [PERSCHED-SIM] Pattern.hpp: PRECISION. Two dates closer than this are one date; it
# is also the tolerance of the room-to-compute test, the slowdown comparison and the
# period-correction test.
TOL = 2e-5
# [PERSCHED-SIM] Simulator.cpp: Simulator::run: a period replaces the incumbent only
# if it improves the objective by more than this.
IMPROVE = 1e-6
# A transfer must last longer than this (the dates of a pattern are TOL apart).
MIN_TIME_IO = 1e-3
# Below this many GB/s an interval counts as saturated (float residue of B - Σ rates).
_BW_EPS = 1e-9

Objective = Literal["syseff", "dilation"]


class _Builder:
    """One pattern of period ``T`` under construction."""

    def __init__(self, apps: Sequence[App], platform: Platform, period: float) -> None:
        self.apps = list(apps)
        self.T = period
        self.B = platform.B
        self.caps = [cap(app, platform) for app in apps]
        # Data left below this counts as moved: [PERSCHED-SIM] compares the data left
        # to PRECISION in units where b = 1, i.e. PRECISION·b GB here.
        self.tol_data = TOL * platform.b
        self.dates: list[float] = [0.0]
        self.used: list[float] = [0.0]
        self.starts: list[list[float]] = [[] for _ in apps]
        # per application: compute start -> I/O sub-intervals, in [0, T] (end <= T)
        self.io: list[dict[float, list[Interval]]] = [{} for _ in apps]
        self.last: list[float] = [0.0] * len(apps)
        self.last_end: list[float] = [0.0] * len(apps)

    # -- the timeline ------------------------------------------------------------
    def _norm(self, t: float) -> float:
        """``t mod T`` in ``[0, T)``, a date within TOL of ``T`` being 0 (``myFmod``)."""
        t %= self.T
        return 0.0 if t > self.T - TOL else t

    def _find(self, t: float) -> int:
        """Index of the date equal to ``t`` within TOL, or -1."""
        dates = self.dates
        i = bisect_left(dates, t - TOL)
        if i < len(dates) and dates[i] <= t + TOL:
            return i
        return -1

    def _add_date(self, t: float) -> int:
        """Split the interval holding ``t`` at ``t`` (a no-op for an existing date)."""
        t = self._norm(t)
        i = self._find(t)
        if i >= 0:
            return i
        i = bisect_right(self.dates, t)
        self.dates.insert(i, t)
        self.used.insert(i, self.used[i - 1])
        return i

    def _end(self, j: int) -> float:
        return self.dates[j + 1] if j + 1 < len(self.dates) else self.T

    # -- insertion -----------------------------------------------------------------
    def insert(self, k: int) -> bool:
        """INSERT-IN-PATTERN (Algorithm 1); False when ``App^(k)`` is not schedulable."""
        if not self.starts[k]:
            return self._insert_first(k)
        return self._insert_next(k)

    def _insert_first(self, k: int) -> bool:
        """INSERT-FIRST-INSTANCE: water-filling over the whole period ([PERSCHED] §3.1).

        As [PERSCHED-SIM] ``splitSchedulable`` with no instance: the intervals are
        taken by non-increasing available bandwidth (ties: the earliest), each from
        its start, until ``vol_io`` is moved; rejected if the transfer time exceeds
        ``T - w``. In addition (the simulator only checks the total time), the chosen
        sub-intervals must leave a cyclic gap of ``w`` for the compute phase.
        """
        app = self.apps[k]
        limit = self.caps[k]
        dates, used, B = self.dates, self.used, self.B
        avail = [min(B - u, limit) for u in used]
        order = sorted(
            (j for j in range(len(dates)) if avail[j] > _BW_EPS), key=lambda j: -avail[j]
        )
        left = app.vol_io
        spent = 0.0
        chosen: list[Interval] = []
        for j in order:
            if left <= self.tol_data:
                break
            rate = avail[j]
            t = min(self._end(j) - dates[j], left / rate)
            chosen.append((dates[j], dates[j] + t, rate))
            left -= rate * t
            spent += t
        if not chosen or left > self.tol_data or spent > self.T - app.w + TOL:
            return False
        chosen.sort()
        if chosen[-1][1] - chosen[0][0] > self.T - app.w + TOL:
            # The simulator would start the compute phase w before the earliest
            # sub-interval and overlap the latest; take the widest cyclic gap instead.
            gaps = [chosen[i + 1][0] - chosen[i][1] for i in range(len(chosen) - 1)]
            gaps.append(chosen[0][0] + self.T - chosen[-1][1])
            widest = max(range(len(gaps)), key=gaps.__getitem__)
            if gaps[widest] < app.w - TOL:
                return False
            first = (widest + 1) % len(chosen)
            chosen = chosen[first:] + chosen[:first]
        return self._commit(k, chosen)

    def _insert_next(self, k: int) -> bool:
        """Algorithm 1 after the first instance: a forward fill after the last inserted.

        As [PERSCHED-SIM] ``splitSchedulableV2``: the new instance computes from the end
        of the last inserted instance's last transfer; its I/O takes the full available
        bandwidth (capped at min(β·b, B)) of each interval in time order, up to the
        compute start of the cyclically next instance.
        """
        app = self.apps[k]
        T = self.T
        begin = self.last_end[k]
        starts = self.starts[k]
        end = starts[bisect_right(starts, self.last[k]) % len(starts)]
        if end > begin + TOL:
            gap = end - begin
        elif end + TOL < begin:
            gap = end + T - begin
        else:
            gap = 0.0
        if gap < app.w - TOL:
            return False
        j = self._add_date(begin + app.w)
        stop = self._find(end)
        dates, used = self.dates, self.used
        n_dates = len(dates)
        limit, B = self.caps[k], self.B
        left = app.vol_io
        full: list[int] = []  # intervals used whole
        subs: list[Interval] = []
        partial = -1  # the interval used from its start only, if any
        while left > self.tol_data and j != stop:
            rate = B - used[j]
            if rate > limit:
                rate = limit
            if rate > _BW_EPS:
                start = dates[j]
                nxt = dates[j + 1] if j + 1 < n_dates else T
                t = nxt - start
                if left < rate * t and start + left / rate < nxt - TOL:
                    t = left / rate
                    if t > TOL:  # shorter, it would merge into its start ([PERSCHED-SIM] too)
                        partial = j
                        subs.append((start, start + t, rate))
                else:
                    full.append(j)
                    subs.append((start, nxt, rate))
                left -= rate * t
            j += 1
            if j == n_dates:
                j = 0
        if left > self.tol_data or not subs:
            return False
        # addInstance: the rates on the whole intervals, then split the partial one
        for (_, _, rate), i in zip(subs, full, strict=False):
            used[i] += rate
        if partial >= 0:
            _, stop_at, rate = subs[-1]
            dates.insert(partial + 1, stop_at)
            used.insert(partial + 1, used[partial])
            used[partial] += rate
        self._record(k, subs)
        return True

    def _record(self, k: int, subs: list[Interval]) -> None:
        """Add the instance whose I/O is ``subs`` (dates of the timeline, end ≤ T)."""
        init_w = self.dates[self._add_date(subs[0][0] - self.apps[k].w)]
        starts = self.starts[k]
        starts.insert(bisect_right(starts, init_w), init_w)
        self.io[k][init_w] = subs
        self.last[k] = init_w
        last_end = subs[-1][1]
        self.last_end[k] = 0.0 if last_end >= self.T - TOL else last_end

    def _commit(self, k: int, subs: list[Interval]) -> bool:
        """``addInstance`` for any sub-intervals: split at the new dates, add the rates.

        False (nothing added) if every sub-interval is shorter than TOL.
        """
        T = self.T
        for start, end, _ in subs:
            self._add_date(start)
            self._add_date(end)
        dates, used = self.dates, self.used
        n_dates = len(dates)
        kept: list[Interval] = []
        for start, end, rate in subs:
            i = self._find(self._norm(start))
            stop = self._find(self._norm(end))
            if i == stop:
                continue  # shorter than TOL: merged into one date
            j = i
            while j != stop:
                used[j] += rate
                j += 1
                if j == n_dates:
                    j = 0
            kept.append((dates[i], dates[stop] if stop > 0 else T, rate))
        if not kept:
            return False
        self._record(k, kept)
        return True

    # -- results -------------------------------------------------------------------
    def counts(self) -> list[int]:
        return [len(s) for s in self.starts]

    def pattern(self) -> Pattern:
        return Pattern(
            self.T,
            tuple(
                AppPattern(
                    app, tuple(self._instance(s, app.w, self.io[k][s]) for s in self.starts[k])
                )
                for k, app in enumerate(self.apps)
            ),
        )

    def _instance(self, init_w: float, w: float, subs: list[Interval]) -> Instance:
        """Sub-intervals unwrapped to follow the compute phase, contiguous ones merged."""
        T = self.T
        base = init_w + w - TOL
        kept: list[Interval] = []
        for start, end, rate in subs:
            shift = T * math.ceil((base - start) / T) if start < base else 0.0
            s, e = start + shift, end + shift
            if kept and abs(kept[-1][1] - s) <= TOL and kept[-1][2] == rate:
                kept[-1] = (kept[-1][0], e, rate)
            else:
                kept.append((s, e, rate))
        return Instance(init_w, tuple(kept))


def build_pattern(apps: Sequence[App], platform: Platform, period: float) -> _Builder:
    """Lines 10–15 of Algorithm 2 with Algorithm 3's heap: insert until nothing fits.

    The heap orders applications by (n_per·(w + time_io)/T, -w/time_io, index): the
    largest dilation first, then the most compute-intensive, then the file order
    ([PERSCHED] §3.1; [PERSCHED-SIM] ``insertInSchedule``). An application that does
    not fit is dropped for this period (Lemma 3).
    """
    builder = _Builder(apps, platform, period)
    lengths = [app.w + time_io(app, platform) for app in apps]
    ratios = [app.w * cap(app, platform) / app.vol_io for app in apps]
    heap = [(0.0, -ratios[k], k) for k in range(len(apps))]
    heapq.heapify(heap)
    starts = builder.starts
    while heap:
        _, neg_ratio, k = heapq.heappop(heap)
        if builder.insert(k):
            heapq.heappush(heap, (len(starts[k]) * lengths[k] / period, neg_ratio, k))
    return builder


@dataclass(frozen=True, slots=True)
class PerSchedResult:
    pattern: Pattern
    sys_eff: float
    dilation: float
    upper_bound: float
    period: float
    objective: Objective
    t_min: float
    t_max: float
    t_opt: float  # the best period of the first loop, before the correction
    periods_built: int
    periods_skipped: int  # skipped: their bound cannot beat the incumbent

    def to_json(self) -> dict[str, object]:
        return {
            "sys_eff": self.sys_eff,
            "dilation": None if math.isinf(self.dilation) else self.dilation,
            "upper_bound": self.upper_bound,
            "period": self.period,
            "objective": self.objective,
            "t_min": self.t_min,
            "t_max": self.t_max,
            "t_opt": self.t_opt,
            "periods_built": self.periods_built,
            "periods_skipped": self.periods_skipped,
            "counts": {e.app.name: e.n_per for e in self.pattern.apps},
            "pattern": self.pattern.to_json(),
        }


def _score(
    builder: _Builder, apps: Sequence[App], platform: Platform, objective: Objective
) -> float:
    """The objective, larger is better: SysEff, or min_k slowdown (1/Dilation)."""
    counts = builder.counts()
    T = builder.T
    if objective == "syseff":
        total = sum(a.beta * n * a.w for a, n in zip(apps, counts, strict=True))
        return total / T / platform.cores(apps)
    return min(n * (a.w + time_io(a, platform)) / T for a, n in zip(apps, counts, strict=True))


def _bound(apps: Sequence[App], platform: Platform, T: float, objective: Objective) -> float:
    """An upper bound of :func:`_score` at period ``T``, from n_per ≤ T/(w + time_io).

    An instance needs ``w`` of compute and at least ``time_io`` of transfer, disjoint
    within its application; 10 ms of slack per instance covers the tolerances.
    """
    best: list[float] = []
    for app in apps:
        length = app.w + time_io(app, platform)
        n = math.floor(T / max(length - 0.01 - 1e-6 * length, 1e-9))
        best.append(n * (app.w if objective == "syseff" else length) / T)
    if objective == "syseff":
        return sum(a.beta * x for a, x in zip(apps, best, strict=True)) / platform.cores(apps)
    return min(best)


def default_tmin(apps: Sequence[App], platform: Platform) -> float:
    """T_min = max_k (w + time_io) (Algorithm 2, line 3)."""
    return max(app.w + time_io(app, platform) for app in apps)


def persched(
    apps: Sequence[App],
    platform: Platform,
    *,
    kprime: float = 10.0,
    epsilon: float = 0.01,
    tmin: float | None = None,
    objective: Objective = "syseff",
    prune: bool = True,
) -> PerSchedResult:
    """PERSCHED (Algorithm 2): the best pattern over periods T_min … K'·T_min.

    ``objective="dilation"`` is the paper's "Min DILATION" variant (§4.3): the
    incumbent test compares dilations instead of SysEff. ``prune`` skips a period
    whose :func:`_bound` cannot beat the incumbent by the improvement threshold; the
    result is the same as building it.

    Following [PERSCHED-SIM] ``Simulator::run``: the first loop rounds each period to
    a millisecond (``T ← round(1000·T·(1+ε))/1000``); a period replaces the incumbent
    only if it improves by more than 1e-6; the second loop (period correction, lines
    21–31) shrinks T by (T_opt - T_opt/(1+ε))·ε per step while the objective scaled by
    T_opt/T is unchanged within 2e-5, i.e. while the same instances still fit.
    """
    if not apps:
        raise ValueError("apps: at least one application is needed")
    for i, app in enumerate(apps):
        if not (app.w > 0 and app.vol_io > 0 and app.beta > 0):
            raise ValueError(f"apps[{i}] ({app.name}): w, vol_io and beta must be > 0")
        if time_io(app, platform) < MIN_TIME_IO:
            raise ValueError(
                f"apps[{i}] ({app.name}): time_io = {time_io(app, platform):.3g} s is below"
                f" the {MIN_TIME_IO * 1000:g} ms resolution of a pattern"
            )
    if not (kprime >= 1.0 and math.isfinite(kprime)):
        raise ValueError(f"kprime: must be >= 1, got {kprime}")
    if not 0.0 < epsilon < 1.0:
        raise ValueError(f"epsilon: must be in (0, 1), got {epsilon}")
    t_min = default_tmin(apps, platform) if tmin is None else tmin
    if not (t_min > 0.0 and math.isfinite(t_min)):
        raise ValueError(f"tmin: must be > 0, got {t_min}")
    t_max = kprime * t_min
    best_score = -1.0
    best: _Builder | None = None
    built = skipped = 0
    period = t_min
    while period <= t_max:
        if (
            prune
            and best is not None
            and _bound(apps, platform, period, objective) <= best_score + IMPROVE
        ):
            skipped += 1
        else:
            builder = build_pattern(apps, platform, period)
            built += 1
            score = _score(builder, apps, platform, objective)
            if score > best_score + IMPROVE:
                best_score, best = score, builder
        period = round(period * (1.0 + epsilon) * 1000.0) / 1000.0
    if best is None:  # t_min > t_max cannot happen (K' >= 1); one period was built
        raise AssertionError("no period tried")
    t_opt = best.T
    step = (t_opt - t_opt / (1.0 + epsilon)) * epsilon
    final = best
    period = t_opt - step
    for _ in range(4 * math.ceil(1.0 / epsilon) + 4):
        if period <= 0.0:
            break
        builder = build_pattern(apps, platform, period)
        built += 1
        if abs(_score(builder, apps, platform, objective) - best_score * t_opt / period) >= TOL:
            break
        final = builder
        period -= step
    pattern = final.pattern()
    return PerSchedResult(
        pattern=pattern,
        sys_eff=pattern.sys_eff(platform),
        dilation=pattern.dilation(platform),
        upper_bound=upper_bound(apps, platform),
        period=final.T,
        objective=objective,
        t_min=t_min,
        t_max=t_max,
        t_opt=t_opt,
        periods_built=built,
        periods_skipped=skipped,
    )
