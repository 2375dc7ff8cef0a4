"""The fluid event loop of the bandwidth-sharing simulator: one policy on one window.

Owns the event loop of the authors' reference simulator ([BWS-SIM], its main
loop and the v2 windows) and the metrics at T ([BWS] eqs. 8–10); ``runs`` is
its entry point (``simulate``). Between two
decisions every rate is constant, so the next event is the first phase
completion, the policy's own period (PeriodicGreedyYield's δ) or T. At each
decision the loop takes a ``SystemView`` of the applications in I/O over its own
lists (``SystemView.of_columns``: the columns are the per-application state
below, read in place) and the controller's decision path,
``policies.decision.decide``, with the very policy objects the controller uses;
it never imports the controller.

Units are normalised: B = 1, b_i = min(bw, B)/B, I/O volumes are volume/B and
a phase's full-speed duration is volume/b_i. Progress P grows at rate 1 in
work and β/b_i in I/O (eq. 6's numerator).
"""

from __future__ import annotations

import math
from bisect import insort
from heapq import heapify, heappop, heappush
from math import ulp
from typing import Any

from burstctl.policies.base import Policy
from burstctl.policies.decision import Fixes, decide
from burstctl.policies.view import SystemView
from burstctl.simulator.bws.columns import MeanVolume, Moved, SimColumns
from burstctl.simulator.bws.instance import Window

# Constants of the reference ([BWS-SIM] simu.cc: ERROR, ERROR2 and the literals of simulate).
EPS = 1e-10  # ε: rate tolerance, loop end
EPS2 = 1e-9  # ε₂: same-time steps at T, forced switch in v2
DONE = 1e-7  # a phase with q < 1e-7 completes; q < −1e-7 is an error
MAX_REPEATS = 10  # decisions allowed at one instant before giving up
END_TOLERANCE = 1e-8

SIM_USER = "sim"  # user and group of every application


class SimulationError(Exception):
    """The run cannot go on: a policy broke a rate bound or time stopped advancing."""


def app_ids(m: int) -> list[str]:
    """The job ids of a window's m applications, in index order: zero-padded indices, so
    that policies, which break ties by job id, break them as the reference does, by index."""
    width = len(str(max(m - 1, 0)))
    return [f"{i:0{width}d}" for i in range(m)]


class Run:
    """State of one run; per-application state lives in parallel lists (speed).

    The reference's ``simulate`` (its STEP C) advances every application at every
    step. Done literally, that is
    O(m) Python work per decision, mostly on applications the decision does not
    touch; here only what can change is touched, with bit for bit the
    reference's arithmetic (so the metrics and event counts do not move):

    - An application in I/O moves only while it is served (β > 0). The served
      ones get Q −= Δβ and P += Δβ/b at each step, as in the reference; only
      they, and those whose phase just began (it may begin below the completion
      threshold), can complete.
    - An application in work runs at rate 1 whatever the policy does. Once
      ``_closed_form_is_exact`` holds (from the start of most phases, or later
      in early long ones) the phase is kept in closed form from a base time s:
      Q = Q_s − (t − s) and P = P_s + (t − s) are then exactly what the
      reference's per-step Q −= Δ, P += Δ give. A heap of ends s + Q_s gives
      the next work completion (the reference's t + Q), and a heap of the
      times P reaches its next power of two gives the one step where the
      reference's P += Δ rounds, where the phase is rebased (``_rebase``).
      Until the test holds, a work phase is ``stepped`` like the reference.
    """

    def __init__(self, window: Window, policy: Policy, warmup: Policy | None, seed: int) -> None:
        apps = window.apps
        m = len(apps)
        self.window = window
        self.horizon = window.horizon  # T
        self.policy = policy
        self.warmup = warmup  # v2: FairShare until t_c
        self.seed = seed
        self.ids = app_ids(m)
        self.cap = [a.cap for a in apps]  # b_i
        self.tau = [a.released_at for a in apps]  # τ_i
        self.values = [[p.value for p in a.phases] for a in apps]
        self.io = [a.phases[0].io for a in apps]
        self.phase = [0] * m
        # Q and P; in a closed-form work phase, Q_s and P_s at its base time s
        self.remaining = [v[0] for v in self.values]  # Q
        self.progress = [a.progress for a in apps]  # P
        self.closed = [False] * m  # the work phase is in closed form
        self.base = [0.0] * m  # s of a closed-form work phase
        self.work_end = [math.inf] * m  # s + Q_s of a closed-form work phase
        self.posted = [a.posted_at for a in apps]  # R
        self.work_done = [0.0] * m  # W^(done) of completed work, from t = 0 (or s)
        self.work_began = [0.0] * m  # start of the current work phase (valid in work)
        self.last_work = [0.0] * m
        self.first_io = self.io[:]  # phases alternate from the first: I/O or work
        self.credit = [0] * m  # U of the reference (setUtilGopi), an integer
        self.in_io = [i for i in range(m) if self.io[i]]  # the set A, in index order
        # I/O phases that began below DONE in the last step: they complete at the next
        # step whether served or not (the reference checks every application)
        self.tiny_io = [i for i in self.in_io if self.remaining[i] / self.cap[i] < DONE]
        # demand = b_i > 0 for every job of the views, which list A in index order
        self.all_active = all(b > 0.0 for b in self.cap)
        # the full volume of each I/O phase under way
        self.volume = [v[0] if self.io[i] else 0.0 for i, v in enumerate(self.values)]
        # The views' columns: the lists above, read in place (row i is application i,
        # whose id sorts like i: the stable order). demand = b_i; the volume moved and
        # the mean past volume are computed when read (rarely: a policy that reads
        # JobView rows, or a fallback for an unknown volume).
        self.columns = SimColumns(
            job_id=self.ids,
            user=[SIM_USER] * m,
            group=[SIM_USER] * m,
            nodes=[1] * m,
            priority=[1.0] * m,
            cap=self.cap,
            demand=self.cap,
            posted_at=self.posted,
            volume=self.volume,
            remaining=self.remaining,
            moved=Moved(self.volume, self.remaining),
            released_at=self.tau,
            progress=self.progress,
            last_work=self.last_work,
            mean_volume=MeanVolume(self.values, self.phase, self.first_io),
            index=range(m),
        )
        self.stepped = [i for i in range(m) if not self.io[i]]  # work phases not closed
        # (s + Q_s, i), one per closed-form phase, and (the time P reaches its next
        # power of two, s, i); crossings of phases ended or rebased are skipped. Each
        # holds a sentinel at +inf, never due: the loop reads the first entry of each at
        # every step, without testing for an empty heap first.
        self.work_ends: list[tuple[float, int]] = [(math.inf, -1)]
        self.crossings: list[tuple[float, float, int]] = [(math.inf, math.inf, -1)]
        # slack for the heaps' rounded keys before the exact tests: ends stay below ~2T
        self.slack = DONE + math.ulp(2 * self.horizon)
        self.events = 0
        self.t = 0.0
        # v1: s = 0, t_c = 0; v2: t_c = T/2, s = the switch time (simulate)
        self.switch_at = self.horizon / 2 if warmup is not None else 0.0  # t_c
        self.start = 0.0  # s
        self.switched = warmup is None
        self.base_efficiency = self._weighted_progress()  # E₀

    def _progress_now(self, i: int) -> float:
        """P_i at the current time."""
        if self.closed[i]:
            return self.progress[i] + (self.t - self.base[i])
        return self.progress[i]

    def _remaining_now(self, i: int) -> float:
        """Q_i at the current time."""
        if self.closed[i]:
            return self.remaining[i] - (self.t - self.base[i])
        return self.remaining[i]

    def io_completed(self) -> list[int]:
        """Per application, the number of I/O phases it completed."""
        return [
            (k + 1 if first else k) // 2 for first, k in zip(self.first_io, self.phase, strict=True)
        ]

    def _weighted_progress(self) -> float:
        return math.fsum(self.cap[i] * self._progress_now(i) for i in range(len(self.cap)))

    def _check(self, policy: Policy, view: SystemView, fixes: Fixes) -> None:
        """Stops the run at a proposal beyond rounding of its bounds: a policy bug."""
        for job_id, proposed in fixes:
            i = view.row_of[job_id]
            if not (-EPS <= proposed <= self.cap[i] + EPS):  # also rejects NaN
                raise self._out_of_bounds(policy, i, proposed)

    def _out_of_bounds(self, policy: Policy, i: int, rate: float) -> SimulationError:
        return SimulationError(
            f"{policy.name} gave application {i} rate {rate} outside"
            f" [0, b_i = {self.cap[i]}] at t = {self.t}"
        )

    def loop(self) -> None:
        T = self.horizon
        q_left = self.remaining
        prog = self.progress
        cap = self.cap
        work_ends = self.work_ends
        crossings = self.crossings
        slack = self.slack
        base = self.base
        end_io = self._end_io
        end_work = self._end_work
        columns = self.columns
        in_io = self.in_io  # A, kept in place: the rows of every view
        # S(t): A itself when every b_i > 0 (demand = b_i), else A's rows with b_i > 0
        active = in_io if self.all_active else [i for i in in_io if cap[i] > 0.0]
        # one view for the run, over A and the columns, moved to each decision's t
        view = SystemView.of_columns(self.t, 1.0, 1.0, columns, in_io, active, self.seed, T)
        counter = 0
        t = self.t
        switched = self.switched
        policy = self.policy if switched else self.warmup
        assert policy is not None
        events = 0
        t_end = T - EPS  # the loop's end
        while t < t_end:
            if not switched and t > self.switch_at - EPS:
                self.t = t  # (the loop keeps t; the methods it calls read self.t)
                self._switch()
                switched = True
                policy = self.policy
            # simulate STEP B: t′ = min(T, t_d, t + Q/β over I/O, t + Q over work)
            view.now = t
            if active is not in_io:
                active[:] = [i for i in in_io if cap[i] > 0.0]
            decision = decide(policy, view)
            events += 1
            if decision.fixes:
                self.t = t
                self._check(policy, view, decision.fixes)
            serving = decision.served  # (i, β > 0): an application without one stands still
            period = decision.period
            if period is None:
                t_next = T
            else:
                if not period > 0.0:
                    raise SimulationError(
                        f"{policy.name} asked for a period {period} <= 0 at t = {t}"
                    )
                t_next = t + period  # min(T, t + δ)
                if t_next > T:
                    t_next = T
            stepped = self.stepped
            if stepped:  # t + Q over stepped work = t + min Q (rounding is monotonic)
                t_next = min(t_next, t + min(map(q_left.__getitem__, stepped)))
            if (end := work_ends[0][0]) < t_next:
                t_next = end  # t + Q = s + Q_s in closed form
            for i, b in serving:  # β = 0 never completes: only the served count
                c = t + q_left[i] / b
                if c < t_next:
                    t_next = c
            if not switched and t < self.switch_at - EPS2 and t_next > self.switch_at + EPS2:
                t_next = self.switch_at  # v2: an event is forced at t_c
            # simulate STEP C over [t, t_next]: moves what moves, then completes every
            # phase with q < DONE. A phase that begins here is first checked at the
            # next step.
            now = t_next
            dt = now - t
            tiny = self.tiny_io  # (those that begin here wait a step)
            if tiny:
                self.tiny_io = []
            # An I/O phase's Q moves only while it is served: the others cannot cross
            # DONE, unless their phase began below it (``tiny_io``). The served ones
            # that do complete after the work phases (in the order served), as in the
            # reference.
            done = None
            for i, b in serving:
                moved = dt * b  # Δβ
                q = q_left[i] - moved
                q_left[i] = q
                prog[i] += moved / cap[i]
                if q / cap[i] < DONE:
                    if done is None:
                        done = [i]
                    else:
                        done.append(i)
            if columns.used:  # the served rows moved: their JobViews are stale
                views = columns.views
                for i, _ in serving:
                    views[i] = None
            if stepped:
                self._advance_stepped(t, now)
            if crossings[0][0] - now < slack:
                self._rebase_due(t, now)
            if work_ends[0][0] - now < slack:
                # the closed-form work phases that end at now
                due = [heappop(work_ends)]
                while work_ends[0][0] - now < slack:
                    due.append(heappop(work_ends))
                for end, i in due:
                    q = q_left[i] - (now - base[i])  # Q_s − (now − s), exact
                    if q < DONE:
                        if q < -DONE:
                            self._check_done(i, q, now)
                        end_work(i, t, now)
                    else:
                        heappush(work_ends, (end, i))
            if done is not None:
                for i in done:
                    q = q_left[i] / cap[i]
                    if q < -DONE:
                        self._check_done(i, q, now)
                    end_io(i, now)
            if tiny:
                for i in tiny:
                    if self.io[i]:  # (not completed above, served)
                        self._check_done(i, q_left[i] / cap[i], now)
                        end_io(i, now)
            if now == t:
                counter += 1
                if t + EPS2 > T:
                    break
                if counter > MAX_REPEATS:
                    raise SimulationError(f"time does not advance at t = {t}")
            else:
                t = now
                counter = 0
        self.t = t
        self.events += events
        if abs(self.t - T) > END_TOLERANCE:
            raise SimulationError(f"the run ended at {self.t}, not at T = {T}")

    def _rebase_due(self, t: float, now: float) -> None:
        """The closed-form phases whose P may reach a power of two in [t, now]."""
        for _, s, i in _pop_due(self.crossings, now, self.slack):
            if self.closed[i] and self.base[i] == s:  # (else stale)
                self._rebase(i, t, now)

    def _advance_stepped(self, t: float, now: float) -> None:
        """The stepped work phases: Q −= Δ, P += Δ, as the reference does."""
        dt = now - t
        q_left = self.remaining
        prog = self.progress
        stepped, self.stepped = self.stepped, []
        for i in stepped:
            q = q_left[i] - dt
            q_left[i] = q
            prog[i] += dt
            if q < DONE:
                self._check_done(i, q, now)
                self._end_work(i, t, now)  # into I/O, or computing until T (stepped)
            elif not (q <= now and self._close(i, now)):  # (q <= now: a cheap pre-test)
                self.stepped.append(i)

    @staticmethod
    def _check_done(i: int, q: float, now: float) -> None:
        if q < -DONE:
            raise SimulationError(f"application {i} overshot its phase by {-q} at t = {now}")

    def _close(self, i: int, now: float) -> bool:
        """Puts work phase ``i`` (Q and P as of ``now``) in closed form from ``now`` if
        that is exact; False (left as it is) if not."""
        q = self.remaining[i]
        p = self.progress[i]
        # _closed_form_is_exact(now, q, p) and _next_power_of_two(p), inline
        u = ulp(now)
        ulp_p = ulp(p)
        if not (u <= q <= now and ulp_p <= u):
            return False
        self.closed[i] = True
        self.base[i] = now
        self.work_end[i] = end = now + q  # the reference's next candidate t + Q
        heappush(self.work_ends, (end, i))
        crossing = now + (ulp_p * 2.0**53 - p)
        if crossing < end + self.slack:
            heappush(self.crossings, (crossing, now, i))
        return True

    def _rebase(self, i: int, t: float, now: float) -> None:
        """Closed-form phase ``i``'s P may have reached its next power of two in the
        step [t, now]. There the reference's P += Δ rounds (to P_s + (now − s), the
        one rounding the closed form also makes), and the later steps add to that
        rounded P on the coarser grid: restart the closed form from ``now``, or
        step the phase like the reference if that is no longer exact."""
        s = self.base[i]
        p = self.progress[i]
        limit = _next_power_of_two(p)
        if p + (now - s) < limit:  # not yet (the heap key is rounded)
            heappush(self.crossings, (s + (limit - p), s, i))
            return
        self.work_ends.remove((self.work_end[i], i))
        heapify(self.work_ends)
        self.closed[i] = False
        self.progress[i] = p + (now - s)
        self.remaining[i] -= now - s  # Q at now, exact
        if self._close(i, now):  # (same end: s + Q_s = now + Q_now)
            return
        q = self.remaining[i]
        if q < DONE:  # (the stepped pass of this step is over)
            self._check_done(i, q, now)
            self._end_work(i, t, now)
        else:
            self.stepped.append(i)

    def _switch(self) -> None:
        self.switched = True
        self.start = self.t  # s
        self.base_efficiency = self._weighted_progress()  # E₀ at the switch
        # eq. (9) counts W^(done)(T) − W^(done)(s): restart the count at s
        self.work_done = [0.0] * len(self.work_done)
        self.work_began = [self.t] * len(self.work_began)

    def _end_io(self, i: int, now: float) -> None:
        """I/O phase completion at ``now`` (STEP C): a work phase begins, in closed form
        if exact, else stepped."""
        k = self.phase[i] + 1
        self.phase[i] = k
        self.posted[i] = now  # R
        self.in_io.remove(i)
        self.work_began[i] = now
        values = self.values[i]
        if k >= len(values):
            self._out_of_phases(i)
            return
        self.io[i] = False
        self.remaining[i] = values[k]
        if not self._close(i, now):
            self.stepped.append(i)

    def _end_work(self, i: int, step_start: float, now: float) -> None:
        """Work phase completion at ``now`` in the step that began at ``step_start``
        (STEP C): an I/O phase begins."""
        k = self.phase[i]
        values = self.values[i]
        n = len(values)
        length = values[k] if k < n else 0.0  # ℓ, the kept length
        self.last_work[i] = length
        self.work_done[i] += now - self.work_began[i]
        closed = self.closed
        if closed[i]:  # P_s + (now − s), exact
            self.progress[i] += now - self.base[i]
            closed[i] = False
        t_c = self.switch_at
        if step_start > t_c:  # the credit U (setUtilGopi); nothing before t_c
            if step_start - length > t_c:
                self.credit[i] = int(self.credit[i] + length)
            else:
                self.credit[i] = int(self.credit[i] + step_start - t_c)
        k += 1
        self.phase[i] = k
        self.posted[i] = now  # R
        if k >= n:
            self.work_began[i] = now
            self._out_of_phases(i)
            return
        self.io[i] = True
        self.remaining[i] = self.volume[i] = values[k]
        self.columns.views[i] = None  # (a JobView of its last I/O phase is stale)
        insort(self.in_io, i)
        if values[k] / self.cap[i] < DONE:
            self.tiny_io.append(i)

    def _out_of_phases(self, i: int) -> None:
        # Kept phases sum to T only up to rounding, so an application can run out of
        # phases a few ulps before T (seen: 9e-10 s at T = 1.8e6). The reference would
        # read a missing value as 0 and loop on zero-length phases; here the application
        # computes until T instead, which no metric can tell apart.
        self.io[i] = False
        self.remaining[i] = math.inf
        self.stepped.append(i)

    def yields(self) -> list[float]:
        """Per application, in index order, its yield at the current time (T once the loop
        ended): eq. (8), y_i = P_i/(T − τ_i), not capped."""
        T = self.horizon
        return [self._progress_now(i) / (T - self.tau[i]) for i in range(len(self.cap))]

    def metrics(self) -> tuple[float, float, float, float]:
        """(MinYield, Efficiency, Utilization, reference Utilization) at T, as the
        reference's ``simulate`` computes them."""
        T = self.horizon
        s = self.start
        m = len(self.cap)
        # eq. (8), capped at 1 as in the reference
        min_yield = min(1.0, min(self.yields()))
        span = T - s
        # eq. (10), weighted by b_i (as the reference does; = p_i on synthetic traces)
        efficiency = (self._weighted_progress() - self.base_efficiency) / (span * sum(self.cap))
        # eq. (9) with p_i = 1: work done in [s, T] over (T − s)·m
        work = math.fsum(
            w if self.io[i] else w + T - self.work_began[i] for i, w in enumerate(self.work_done)
        )
        utilization = work / (span * m)
        credit = 0
        for i in range(m):
            u = self.credit[i]
            k = self.phase[i]
            if not self.io[i] and k < len(self.values[i]):  # in work at T: ℓ − Q of it done
                length = self.values[i][k]
                q = self._remaining_now(i)
                u = int(T - s) if T - length + q < s else int(u + length - q)
            credit += u
        return min_yield, efficiency, utilization, credit / (span * m)


def _pop_due(heap: list[Any], now: float, slack: float) -> list[Any]:
    """Pops the entries whose key is within ``slack`` of ``now`` or before it."""
    due = []
    while heap and heap[0][0] - now < slack:
        due.append(heappop(heap))
    return due


def _next_power_of_two(p: float) -> float:
    """2⁵³·ulp(p): the first value above p ≥ 0 where the grid of doubles coarsens."""
    return math.ulp(p) * 2.0**53


def _closed_form_is_exact(s: float, q: float, p: float) -> bool:
    """Whether a work phase with Q = ``q`` and P = ``p`` at time ``s`` can be kept in
    closed form from s: whether Q − (t − s) and P + (t − s), at every later step t
    of the phase, are bit for bit what the reference's per-step Q −= Δ, P += Δ give
    (as long as P stays below its next power of two, where ``_rebase`` takes over).

    - q ≤ s: every step [t, t′] of the phase has s ≤ t < t′ ≤ s + q ≤ 2t, so
      Δ = t′ − t is exact (Sterbenz) and a multiple of ulp(t) ≥ ulp(s); ΣΔ = t − s,
      itself exact.
    - ulp(q) ≤ ulp(s) (implied) and q ≥ ulp(s): each Q on the way, down to the
      completion residue (|r| ≤ ulp(s)), is a multiple of ulp(q) below 2⁵³·ulp(q),
      so Q −= Δ never rounds.
    - ulp(p) ≤ ulp(s): each P is a multiple of ulp(p), so P += Δ cannot round
      before P reaches 2⁵³·ulp(p), its next power of two.
    Early phases (long against the time elapsed) fail it until they have run
    down to Q ≤ t; until then they are stepped like the reference.
    """
    u = math.ulp(s)
    return u <= q <= s and math.ulp(p) <= u
