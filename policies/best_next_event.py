"""BestNextEvent: the lexicographic max-min of yields at the best predictable next event.

The bandwidth-sharing paper gives the idea ([BWS] §4.3; details in [BWS-RR] §4.3
and Appendix A); the authors' reference simulator gives the exact objective
([BWS-SIM] simu.cc: ``computeNextEvLexMin`` and the functions it calls, named
below as there). At an event at time t, over the jobs of S(t):

- a *predictable next event* is either the completion of one pending
  operation c at t + δ, with β_c = V_c/δ and d_c = V_c/r_c ≤ δ, while nobody
  else completes earlier (β_k ≤ V_k/δ), or no completion before the window
  end (δ = T − t);
- its value is the vector of the yields at t + δ, sorted ascending,
  y_k(δ) = (P_k + β_k·δ/b_k)/(t + δ − τ_k) (eq. 6 with β_k held over the
  horizon, the reference's ``fYield``);

b_k is the cap (eq. 1) and r_k ≤ b_k the job's demand, which bounds its rate
(the simulator sets r_k = b_k). Rates and volumes are divided by B inside, so
the tolerances are the reference's whatever the unit (bytes live).
- the policy applies the allocation of the lexicographically largest vector
  (compared with ε = 1e-10, the reference's ``keepBestSolution``).

For a fixed event and δ the best allocation is a capped water-filling on
yield levels (the reference's ``LexMinYield``): every other job gets
β_k = clamp(b_k(y(t + δ − τ_k) − P_k)/δ, 0, min(r_k, V_k/δ)) for one level y
with Σ β_k = B − V_c/δ. What remains is to choose c and δ.

How δ is chosen (this replaces the reference's interval scan and its
``MinYieldAtAppEventInInterval`` / ``firstIntersection`` / ``secondIntersection``
recursion). For event c and horizon δ the largest achievable minimum yield is
exactly

    φ_c(δ) = min( C_c(δ), min_{k≠c} M_k(δ), W_c(δ) )

- C_k(δ) = (P_k + V_k/b_k)/(t + δ − τ_k): k's yield had it completed by t + δ
  (c's yield at its own event);
- M_k(δ) = min((P_k + r_k δ/b_k)/(t + δ − τ_k), C_k(δ)): the largest yield
  k can reach at t + δ (at full demand, or done);
- W_c(δ): the uncapped water level, Σ_{k≠c} b_k·max(0, W(t + δ − τ_k) − P_k)
  = Bδ − V_c, i.e. min over sets N of G_N(δ) = (Bδ − V_c + Σ_N b_k P_k) /
  Σ_N b_k(t + δ − τ_k) (the common yield whose trend the reference's
  ``isYieldIncreasing`` tests).

Every term is a minimum of functions (αδ + p)/(δ + q), each monotone in δ, so
φ_c is quasi-concave and its maximum over [d_c, T − t] is where the lowest
increasing piece meets the lowest decreasing one. It is found exactly by a
cutting-plane loop: maximise the minimum of the pieces seen so far (pairwise
crossings, a quadratic each), evaluate φ_c there, add the piece that binds,
until the model and φ_c agree. On a plateau the earliest δ is taken. The
capped water-fill then runs once at the chosen δ.

Pruning (the early stop of the reference's interval scan, generalised): past
d_k every job's yield is at most C_k, so no horizon beyond δ can beat a minimum
above min_k C_k(δ); candidates are tried by increasing d_c and the scan stops
at the first whose bound min_k C_k(d_c) is below the incumbent's minimum.

The class docstring lists every difference from the reference and every
choice made where the paper is silent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from burstctl.policies.base import Policy
from burstctl.policies.greedy import by_yield, known_remaining
from burstctl.policies.sharing import greedy_fill, water_fill
from burstctl.policies.view import Columns, RowRates, SystemView

EPS = 1e-10  # ε of the reference's keepBestSolution and Σb ≤ B test
SHORT_IO = 1e-3  # seconds: the reference's short-I/O shortcut threshold on d_k
CUT_TOLERANCE = 1e-12  # φ_c agrees with the cutting-plane model: optimum found
MAX_CUTS = 64  # pieces one candidate may add; never reached in practice

INF = math.inf

# f(δ) = (αδ + p)/(δ + q) with q ≥ 0: monotone on δ > 0, increasing iff αq > p.
Piece = tuple[float, float, float]


def _value(f: Piece, x: float) -> float:
    return (f[0] * x + f[1]) / (x + f[2])


def _increasing(f: Piece) -> bool:
    return f[0] * f[2] > f[1]


def _cross(f: Piece, g: Piece, lo: float, hi: float) -> float:
    """The first δ in [lo, hi] with f(δ) ≥ g(δ), for f increasing and g not; hi if none."""
    if _value(f, lo) >= _value(g, lo):
        return lo
    if _value(f, hi) < _value(g, hi):
        return hi
    # (f − g)(δ)·(δ + q_f)(δ + q_g) = Aδ² + Bδ + C changes sign from − to + once
    # in (lo, hi]: the root where its derivative 2Aδ + B = +√disc ≥ 0.
    a = f[0] - g[0]
    b = f[0] * g[2] + f[1] - g[0] * f[2] - g[1]
    c = f[1] * g[2] - g[1] * f[2]
    s = math.sqrt(max(b * b - 4.0 * a * c, 0.0))
    if b > 0.0:
        x = -2.0 * c / (b + s)
    elif a != 0.0:
        x = (s - b) / (2.0 * a)
    else:  # degenerate: cannot change sign; rounding only
        x = 0.5 * (lo + hi)
    return min(hi, max(lo, x))


def _model_argmax(
    rising: Sequence[Piece], falling: Sequence[Piece], lo: float, hi: float
) -> tuple[float, float]:
    """(δ, value) maximising the minimum of the pieces on [lo, hi]; the earliest such δ.

    With u the lowest increasing piece and v the lowest other one,
    {u ≥ v} = [max_f min_g cross(f, g), hi], whose left end is the maximum.
    """
    if not rising:
        x = lo
    elif not falling:
        x = hi
    else:
        x = lo
        for f in rising:
            first = hi
            for g in falling:
                y = _cross(f, g, lo, hi)
                if y < first:
                    first = y
            if first > x:
                x = first
    value = INF
    for f in rising:
        y = (f[0] * x + f[1]) / (x + f[2])
        if y < value:
            value = y
    for f in falling:
        y = (f[0] * x + f[1]) / (x + f[2])
        if y < value:
            value = y
    return x, value


def _lex_compare(a: Sequence[float], b: Sequence[float]) -> int:
    """Sign of a − b at the first component differing by more than ε (keepBestSolution)."""
    for x, y in zip(a, b, strict=True):
        if abs(x - y) > EPS:
            return 1 if x > y else -1
    return 0


@dataclass(slots=True)
class _Choice:
    """A candidate next event: job ``event`` (None: no event) completing at t + δ."""

    phi: float  # its minimum yield at t + δ
    delta: float
    event: int | None
    vector: list[float] | None = None  # sorted yields, computed when needed
    rates: list[float] | None = None  # β per job (normalised), event included
    yields: list[float] | None = None  # per job, unsorted

    def key(self, n: int) -> tuple[float, int]:
        """Tie order: earlier event first, then lower index, "no event" last."""
        return (self.delta, n if self.event is None else self.event)


class _Decision:
    """One decision, in units normalised to B = 1 (rates and volumes divided by B)."""

    def __init__(self, columns: Columns, rows: Sequence[int], now: float, capacity: float) -> None:
        self.n = len(rows)
        self.cap: list[float] = []  # b_k
        self.rate: list[float] = []  # r_k = demand_k ≤ b_k: the rate bound
        self.slope: list[float] = []  # r_k/b_k: yield gained per second at full demand
        self.progress: list[float] = []  # P_k
        self.age: list[float] = []  # t − τ_k
        self.volume: list[float] = []  # V_k; INF = unknown
        self.done: list[float] = []  # P_k + V_k/b_k, the progress once done
        self.earliest: list[float] = []  # d_k = V_k/min(r_k, B): earliest completion
        breakpoints = []  # (V_k/r_k, k): where k's cap turns from r_k to V_k/δ
        for k, row in enumerate(rows):
            rate = columns.demand[row] / capacity
            cap = columns.cap[row] / capacity if columns.cap[row] > 0.0 else rate
            v = columns.remaining[row]
            if v is None:  # live, volume not posted: estimate from past operations
                v = known_remaining(columns, row)
                if v is not None and v <= 0.0:
                    v = None  # the estimate is used up: no prediction
            progress = columns.progress[row]
            self.cap.append(cap)
            self.rate.append(rate)
            self.slope.append(rate / cap)
            self.progress.append(progress)
            self.age.append(max(now - columns.released_at[row], 0.0))
            if v is None:
                self.volume.append(INF)
                self.done.append(INF)
                self.earliest.append(INF)
                continue
            v = max(v, 0.0) / capacity
            self.volume.append(v)
            self.done.append(progress + v / cap)
            self.earliest.append(v / min(rate, 1.0))
            breakpoints.append((v / rate, k))
        breakpoints.sort()
        self.by_breakpoint = breakpoints

    # -- the minimum yield φ_c(δ) ----------------------------------------------------

    def _phi(self, c: int, others: Sequence[int], x: float) -> tuple[float, Piece]:
        """φ_c(x) and a piece that attains it (module docstring)."""
        age, prog, done, slope, cap = self.age, self.progress, self.done, self.slope, self.cap
        best = done[c] / (x + age[c])  # C_c
        arg, full = c, False  # the binding job, and whether its piece is "at full demand"
        zero = []  # (P_k/(x + t − τ_k), k): k's yield at t + x without bandwidth
        for k in others:
            den = x + age[k]
            y = (slope[k] * x + prog[k]) / den  # k at full demand
            if y < best:
                best, arg, full = y, k, True
            y = done[k] / den  # C_k (inf when unknown)
            if y < best:
                best, arg, full = y, k, False
            zero.append((prog[k] / den, k))
        # Water level W: Σ_N b_k(W(x + t − τ_k) − P_k) = x − V_c over the prefix N of
        # the jobs by zero-bandwidth yield that stay below it (budget x − V_c ≥ 0).
        zero.sort()
        budget = x - self.volume[c]
        sb = sp = sa = 0.0
        level = INF
        for z, k in zero:
            if level <= z:
                break
            b = cap[k]
            sb += b
            sp += b * prog[k]
            sa += b * age[k]
            level = (budget + sp) / (sb * x + sa)  # G_N(x)
        if level < best:
            # G_N(δ) = (δ − V_c + Σ_N b P)/(δΣ_N b + Σ_N b(t − τ)), as (αδ + p)/(δ + q)
            return level, (1.0 / sb, (sp - self.volume[c]) / sb, sa / sb)
        if full:
            return best, (slope[arg], prog[arg], age[arg])
        return best, (0.0, done[arg], age[arg])

    def best_horizon(
        self, c: int, others: Sequence[int], lo: float, hi: float, floor: float
    ) -> tuple[float, float] | None:
        """(max φ_c, earliest δ attaining it) on [lo, hi]; None if it stays below ``floor``.

        Cutting planes: every piece is an upper bound of φ_c, so the maximum of
        the pieces seen so far bounds max φ_c; once φ_c reaches that bound at
        the model's maximiser, it is the optimum. Each round adds the piece
        binding there, which the model did not have, so the loop ends.
        """
        own: Piece = (0.0, self.done[c], self.age[c])  # C_c, decreasing
        rising: list[Piece] = []
        falling: list[Piece] = [own]
        x, bound = lo, _value(own, lo)
        seen: set[float] = set()
        best_phi, best_x = -INF, lo
        for _ in range(MAX_CUTS):
            phi, piece = self._phi(c, others, x)
            seen.add(x)
            if phi > best_phi:
                best_phi, best_x = phi, x
            if phi >= bound - CUT_TOLERANCE:
                break
            (rising if _increasing(piece) else falling).append(piece)
            x, bound = _model_argmax(rising, falling, lo, hi)
            if bound < floor:
                return None
            if x in seen:  # rounding: the model cannot move any more
                break
        return best_phi, best_x

    # -- the allocation at a fixed horizon -------------------------------------------

    def fill(self, delta: float, budget: float, members: Sequence[int]) -> list[float]:
        """Capped water-filling on yield levels at t + δ (LexMinYield): β per member.

        β_k = clamp(b_k(y(t + δ − τ_k) − P_k)/δ, 0, min(demand_k, V_k/δ)), Σ β_k = budget.
        """
        caps = [min(self.rate[k], self.volume[k] / delta) for k in members]
        if budget <= 0.0:
            return [0.0] * len(members)
        if sum(caps) <= budget:
            return caps
        cap, prog, age = self.cap, self.progress, self.age
        per_level = [cap[k] * (delta + age[k]) / delta for k in members]  # dβ/dy
        zero = [prog[k] / (delta + age[k]) for k in members]  # yield without bandwidth
        points = []
        for i in range(len(members)):
            points.append((zero[i], 0, i))  # starts taking bandwidth
            points.append((zero[i] + caps[i] / per_level[i], 1, i))  # capped: M_k(δ)
        points.sort()
        slope = const = 0.0  # Σ β(y) = slope·y + const between breakpoints
        level = points[-1][0]
        for y, kind, i in points:
            if slope * y + const >= budget:
                level = (budget - const) / slope if slope > 0.0 else y
                break
            if kind == 0:
                slope += per_level[i]
                const -= per_level[i] * zero[i]
            else:
                slope -= per_level[i]
                const += per_level[i] * zero[i] + caps[i]
        return [
            min(caps[i], max(0.0, per_level[i] * (level - zero[i]))) for i in range(len(members))
        ]

    def evaluate(self, choice: _Choice) -> None:
        """Fills ``choice``'s rates, yields and sorted vector at its horizon."""
        delta, c = choice.delta, choice.event
        members = [k for k in range(self.n) if k != c]
        budget = 1.0 if c is None else 1.0 - self.volume[c] / delta
        rates = [0.0] * self.n
        for k, beta in zip(members, self.fill(delta, budget, members), strict=True):
            rates[k] = beta
        if c is not None:
            rates[c] = self.volume[c] / delta
        yields = [
            (self.progress[k] + rates[k] * delta / self.cap[k]) / (delta + self.age[k])
            for k in range(self.n)
        ]
        if c is not None:
            yields[c] = self.done[c] / (delta + self.age[c])  # exactly done at t + δ
        choice.rates, choice.yields, choice.vector = rates, yields, sorted(yields)

    def conserving_limit(self, c: int | None) -> float:
        """The largest δ at which event c (None: no event) still uses all of B.

        Nobody may complete before t + δ, so job k takes at most min(demand_k, V_k/δ);
        with c taking V_c/δ, the allocation can be work-conserving iff
        V_c/δ + Σ_{k≠c} min(demand_k, V_k/δ) ≥ B, which decreases in δ.
        """
        carried = 0.0 if c is None else self.volume[c]  # Σ V of jobs capped by volume
        open_rate = 0.0  # Σ demand of jobs not yet capped by volume
        for k in range(self.n):
            if k != c:
                open_rate += self.rate[k]
        for bp, k in self.by_breakpoint:  # δ where k's cap turns from demand to V_k/δ
            if k == c:
                continue
            if open_rate < 1.0 and carried < (1.0 - open_rate) * bp:
                return carried / (1.0 - open_rate)  # the root lies before bp
            open_rate -= self.rate[k]
            carried += self.volume[k]
        return INF if open_rate >= 1.0 else carried / (1.0 - open_rate)

    def completion_bound(self, delta: float) -> float:
        """min_k C_k(δ): no horizon ≥ δ gives a minimum yield above it."""
        bound = INF
        for k, a in zip(self.done, self.age, strict=True):
            y = k / (delta + a)
            if y < bound:
                bound = y
        return bound


class BestNextEvent(Policy):
    """Lexicographic max-min of the yields at the best predictable next event ([BWS] §4.3).

    The module docstring gives the objective and the exact search over δ.

    Differences from the reference ([BWS-SIM] simu.cc: ``computeNextEvLexMin``),
    all deliberate:

    1. The horizon of the "no event" candidate, and the upper end of every
       search, is the window's remaining length T − t; the reference uses the
       window end T itself as a length (bug), so late in a window it also weighs
       events after T. Events are only candidates if d_c ≤ T − t.
    2. Short-I/O shortcut (d_k* < 1e-3 s, the reference's second step): kept,
       but every other job, index 0 included, shares B − demand_k* in
       proportion to its demand (the reference's loop skips application 0,
       which gets 0: bug).
    3. Every vector holds exactly one yield per job of S(t); the reference's
       no-event ``LexMinYield`` records still-free jobs again after every
       round, so its baseline vector can hold duplicate yields (bug).
    4. The upper bound C_c(δ) of the event job enters φ_c for every candidate c;
       the reference's ``MinYieldAtAppEventInInterval`` includes it only when c
       is index 0 (bug).
    5. Plain float64 everywhere; the reference computes R, the water levels, G,
       the crossings and L in 80-bit long double.
    6. The maximum over δ is exact (crossing points of the pieces above); the
       reference approximates it (its candidate horizons, recursion limit
       10 with its ρ = 1e-4 / σ = 1e-3 "singular" hacks, ``computeYields``'
       proportional rescaling when a water level misses the budget by up to ρ).
    7. Ties: vectors equal within ε go to the earlier event (smaller δ), then to
       the lower index, and the "no event" candidate loses ties; on a plateau
       of one candidate's minimum yield the earliest δ is taken. The reference
       keeps its baseline (the no-event candidate) on ties and otherwise the
       first found in its interval scan.
    8. Work conservation (every policy here is work-conserving when demand
       exceeds B): only allocations that use all of B are candidates. Event c at
       δ needs V_c/δ + Σ_{k≠c} min(demand_k, V_k/δ) ≥ B, which bounds δ above;
       "no event" needs Σ_k min(demand_k, V_k/(T − t)) ≥ B. The reference may
       instead pick a horizon at which every job is capped and leave the rest of
       B idle. Never binds when every b_k = B, as on the synthetic traces (there
       a shorter δ is then strictly better). Any rounding residue goes to the
       jobs with the lowest yields at the horizon, up to their demand.

    Choices where the paper and the reference are silent:

    - b_i in the reference is ``demand`` here where it bounds a rate (≤ b_i);
      progress still counts volume over the cap b_i (eq. 6), as in the greedy
      policies. d_k = V_k/min(demand_k, B).
    - Zero-volume operations (V = 0, or anything finishing within 1e-3 s at full
      demand) take the short-I/O shortcut: the job gets its demand and the rest
      is shared in proportion to demand; it completes at once.
    - Unknown volume (live, the client posted 0): V_i is estimated from the job's
      past operations, ``greedy.known_remaining`` = mean past volume − moved. A
      job with no history, or whose estimate is used up (≤ 0, overdue), is
      *unknown*: it defines no event, is never capped by a volume, and takes part
      in the water-filling up to its demand (its yield counts like any other).
    - Live (``view.horizon`` None) the horizon T − t is max(Σ V_k/B, max d_k)
      over the jobs with a known or estimated volume: were they alone to share B
      without idling, one of them would complete by Σ V_k/B; and every one of
      them can define an event. With no volume known at all nothing is
      predictable and the allocation is GreedyYield's (the limit of this
      objective as δ → 0).
    - A job released after t counts t − τ_k as 0.
    """

    name = "best-next-event"

    def allocate(self, view: SystemView) -> RowRates:
        active = view.active
        capacity = view.capacity
        if capacity <= 0.0:
            return []
        demand = view.columns.demand
        if len(active) <= 1 or sum(demand[r] for r in active) <= capacity * (1.0 + EPS):
            # Σb ≤ B (first step)
            return [(r, min(demand[r], capacity)) for r in active]
        return _decide(view)


def _decide(view: SystemView) -> list[tuple[int, float]]:
    """(row, rate) for every job of S(t), in the stable order."""
    capacity = view.capacity
    active = view.active
    demand = view.columns.demand
    d = _Decision(view.columns, active, view.now, capacity)
    n = d.n
    known = [k for k in range(n) if d.volume[k] < INF]
    if not known:  # nothing predictable: the δ → 0 limit of the objective
        return greedy_fill(by_yield(view), demand, capacity)

    # Short-I/O shortcut (the reference's second step): an operation done within SHORT_IO.
    first = min(known, key=lambda k: (d.earliest[k], k))
    if d.earliest[first] < SHORT_IO:
        lead = active[first]
        rates = [(lead, min(demand[lead], capacity))]
        rest = {r: demand[r] for r in active if r != lead}
        rates.extend(water_fill(rest, rest, capacity - rates[0][1]).items())
        return rates

    if view.horizon is not None:
        span = view.horizon - view.now  # T − t
    else:
        span = max(sum(d.volume[k] for k in known), max(d.earliest[k] for k in known))
    if not span > 0.0:
        return greedy_fill(by_yield(view), demand, capacity)

    best: _Choice | None = None
    floor = -INF  # candidates whose minimum cannot reach this are skipped
    everyone = list(range(n))
    for c in sorted(known, key=d.earliest.__getitem__):  # stable: ties by index
        lo = d.earliest[c]
        if lo > span or (best is not None and d.completion_bound(lo) < floor):
            break  # sorted by d_c: every later candidate is bounded as well
        hi = min(span, d.conserving_limit(c))
        if lo > hi:
            continue  # c cannot complete first without leaving bandwidth idle
        others = everyone[:c] + everyone[c + 1 :]
        found = d.best_horizon(c, others, lo, hi, floor)
        if found is None:
            continue
        choice = _Choice(found[0], found[1], c)
        best = _better(d, best, choice)
        floor = best.phi - EPS
    if best is None or (d.completion_bound(span) >= floor and d.conserving_limit(None) >= span):
        no_event = _Choice(0.0, span, None)
        d.evaluate(no_event)
        assert no_event.vector is not None
        no_event.phi = no_event.vector[0]
        best = _better(d, best, no_event)

    if best.rates is None:
        d.evaluate(best)
    assert best.rates is not None and best.yields is not None
    return _to_rates(active, d, best.rates, best.yields, capacity)


def _better(d: _Decision, best: _Choice | None, new: _Choice) -> _Choice:
    """As keepBestSolution: the lexicographically larger sorted yields (ε), then the tie order."""
    if best is None or new.phi > best.phi + EPS:
        return new
    if new.phi < best.phi - EPS:
        return best
    for choice in (best, new):
        if choice.vector is None:
            d.evaluate(choice)
    assert best.vector is not None and new.vector is not None
    order = _lex_compare(new.vector, best.vector)
    if order > 0 or (order == 0 and new.key(d.n) < best.key(d.n)):
        return new
    return best


def _to_rates(
    rows: Sequence[int],
    d: _Decision,
    rates: list[float],
    yields: list[float],
    capacity: float,
) -> list[tuple[int, float]]:
    """Normalised β → bytes/s, within [0, demand], Σ ≤ B; residues to the lowest yields."""
    beta = [min(max(r, 0.0), d.rate[k]) for k, r in enumerate(rates)]
    left = 1.0 - sum(beta)
    if left > EPS:  # rounding, or the fallback "no event" (difference 8)
        for k in sorted(range(d.n), key=lambda k: (yields[k], k)):
            give = min(d.rate[k] - beta[k], left)
            if give > 0.0:
                beta[k] += give
                left -= give
    total = sum(beta)
    scale = capacity / total if total > 1.0 else capacity
    return [(row, beta[k] * scale) for k, row in enumerate(rows) if beta[k] != 0.0]
