"""Test oracle: the reference simulator's nextEvLexMin (BestNextEvent), written out plainly.

A literal, test-only rendering of the behaviour of the authors' nextEvLexMin
([BWS-SIM] simu.cc): the main procedure ``computeNextEvLexMin`` (Σb test,
short-I/O shortcut, baseline, candidate horizons H, interval scan with
keepBest = ``keepBestSolution``), WaterLevel (``MinYield``), LexFill
(``LexMinYield``), Fix (``computeYields``), Interval
(``MinYieldAtAppEventInInterval``: cases A and B, with their singularity hacks
and recursion limit), FirstCross and SecondCross (``firstIntersection``,
``secondIntersection``). It shares no code with
``burstctl.policies.best_next_event``; it reproduces the *reference's*
semantics, bugs included:

- the window end T is used as a horizon length (baseline LexFill(T) and the
  upper end of H), quirk ``window_end_as_length``;
- application 0 is skipped in the short-I/O shortcut (it gets 0 unless it is
  k*), quirk ``skip_index_0``;
- the no-event LexFill records still-free applications again after every
  round, so the baseline vector can hold duplicate yields, quirk
  ``duplicate_yields``;
- Interval's upper bound U includes C_c(δmin) only when c is index 0, quirk
  ``own_bound_only_c0``.

Each quirk can be switched off (``QUIRKS[name] = False``) to find out which one
makes a difference on an instance; all are on by default. It is deliberately
slow and literal; it is not part of the product.

Arithmetic. Plain Python floats are IEEE doubles. ``numpy.longdouble`` (80-bit
x87 extended on x86-64 Linux) is used where simu.cc computes in long double: R
and its sums, WaterLevel's y*, LexFill's y* and its bandwidth formula, Fix's X,
y, sums and ratios, G's coefficients, FirstCross/SecondCross (√ included), L,
and the ρ-tests. Values stored in β, Y or δ* are rounded to double; y, C and M
are computed in double (and widened where a long-double expression uses them).
Where a C expression multiplies or subtracts two doubles before widening (e.g.
``(t + δ − τ)·b`` inside a long-double sum, ``δ·X`` with X double), the double
operation is done first, as C does.

Readings of ambiguous points (documented where they are used):

- Constants (as simu.cc defines them): ε = 1e-10, ρ = 1e-4, σ = 1e-3, recursion
  limit 10, short-I/O threshold 0.001 s. Every "·ρ" test is written as a division
  by 10000 (ρ = 1/10000), which is how the reference writes it; the two differ by
  at most one ulp.
- "the binary aborts" (recursion limit with L − δmin < σ, SecondCross without a
  real root at δmin, LexFill making no progress): raised as
  :class:`ReferenceAbort`, since the reference would print no result.
- SecondCross leaves hLarger unchanged when A = 0 and B′ ≠ 0: the caller's
  current value (initially false) is passed in and returned.
- Case A's singular branch re-checks "G increasing" (as the reference does); it
  was checked before with the same N, so it never triggers.
- Bandwidth of applications not in the I/O set is not touched here; the caller
  applies the returned β to the I/O applications only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

LD = np.longdouble
EPS = 1e-10  # ε
INV_PRECISION = 10000.0  # ρ = 1/INV_PRECISION = 1e-4
SIGMA = 1e-3  # σ, the singularity precision
SHORT = 0.001  # short-I/O shortcut threshold on d_k (seconds), and on V in Interval
DEPTH_LIMIT = 10

# The reference's bugs, reproduced by default (module docstring). Tests may flip them.
QUIRKS = {
    "window_end_as_length": True,
    "skip_index_0": True,
    "duplicate_yields": True,
    "own_bound_only_c0": True,
}

# (numLin, numCnt, denomLin, denomCnt): the function δ ↦ (aδ + b)/(cδ + e), long double
Frac = tuple[np.longdouble, np.longdouble, np.longdouble, np.longdouble]


class ReferenceAbort(RuntimeError):
    """The reference binary would abort (failed assert or explicit abort())."""


class _Problem:
    """One decision: the I/O applications in A order, normalised to B = 1 by the caller."""

    def __init__(
        self,
        t: float,
        b: Sequence[float],
        tau: Sequence[float],
        P: Sequence[float],
        V: Sequence[float],
        B: float,
    ) -> None:
        self.t = t
        self.b = list(b)
        self.tau = list(tau)
        self.P = list(P)
        self.V = list(V)
        self.B = B
        self.m = len(self.b)

    # -- yields (double) ---------------------------------------------------------------

    def y(self, k: int, delta: float, beta: float) -> float:
        """fYield: y_k(δ, β); 0 if δ = 0 and t ≤ τ_k + ε."""
        if delta == 0 and self.t <= self.tau[k] + EPS:
            return 0.0
        return (self.P[k] + beta * delta / self.b[k]) / (self.t + delta - self.tau[k])

    def C(self, k: int, delta: float) -> float:
        """fYieldAtCompletion: C_k(δ)."""
        return (self.P[k] + self.V[k] / self.b[k]) / (self.t + delta - self.tau[k])

    def M(self, k: int, delta: float) -> float:
        """fYieldMax: y_k(δ, b_k) if δ ≤ d_k, else C_k(δ)."""
        if delta <= self.V[k] / self.b[k]:
            return self.y(k, delta, self.b[k])
        return self.C(k, delta)

    # -- required bandwidth (long double) ----------------------------------------------

    def R(self, k: int, y: np.longdouble, delta: float) -> np.longdouble:
        """requiredBandwidth: (b_k/δ)(y(t + δ − τ_k) − P_k) if y − y_k(δ, 0) > ε, else 0."""
        if y - LD(self.y(k, delta, 0.0)) > EPS:
            return LD(self.b[k] / delta) * (y * LD(self.t + delta - self.tau[k]) - LD(self.P[k]))
        return LD(0.0)

    def R_sum(self, y: np.longdouble, delta: float, members: Sequence[int]) -> np.longdouble:
        total = LD(0.0)
        for k in members:
            total += self.R(k, y, delta)
        return total

    def common_level(self, delta: float, X: float | np.longdouble, N: Sequence[int]):
        """(δX + Σ_N P b)/Σ_N b(t + δ − τ), long double sums of double products."""
        num = LD(0.0)
        den = LD(0.0)
        for k in N:
            num += LD(self.P[k] * self.b[k])
            den += LD((self.t + delta - self.tau[k]) * self.b[k])
        # X double: double × double, then widened (as in C); X long double: long double product
        dx = LD(delta) * X if isinstance(X, np.longdouble) else LD(delta * X)
        return (dx + num) / den

    # -- WaterLevel (the reference's MinYield) -----------------------------------------

    def water_level(self, free: list[int], X: float, delta: float):
        """(y*, exhausted, tight) for the free applications with budget X at horizon δ."""
        maxima = [LD(self.M(k, delta)) for k in free]
        U = maxima[0]
        for v in maxima[1:]:
            if v < U:
                U = v
        if self.R_sum(U, delta, free) <= X + EPS:
            tight = {k for k, v in zip(free, maxima, strict=True) if v <= U + EPS}
            return U, False, tight
        z = sorted(self.y(k, delta, 0.0) for k in free)
        lo, hi = 0, len(z) - 1
        if self.R_sum(LD(z[hi]), delta, free) <= X + EPS:
            N = list(free)
        else:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self.R_sum(LD(z[mid]), delta, free) > X - EPS:
                    hi = mid
                else:
                    lo = mid
            N = [k for k in free if self.y(k, delta, 0.0) < z[lo] + EPS]
        return self.common_level(delta, X, N), True, set()

    # -- LexFill (the reference's LexMinYield) -----------------------------------------

    def lex_fill(self, delta: float, event: int | None) -> tuple[list[float], list[float]]:
        """(β, sorted record truncated to m) at horizon δ, optionally with event app e."""
        m = self.m
        beta = [0.0] * m
        record: list[float] = []
        free = [True] * m
        X = self.B
        if event is not None:
            beta[event] = self.V[event] / delta
            X -= beta[event]
            record.append(self.y(event, delta, beta[event]))
            free[event] = False
        while any(free) and X > EPS:
            before = sum(free)
            fl = [k for k in range(m) if free[k]]
            if len(fl) == 1:
                k = fl[0]
                beta[k] = X if self.b[k] > X else self.b[k]
                if event is not None and self.V[k] / beta[k] < delta:
                    beta[k] = self.V[k] / delta
                free[k] = False
                record.append(self.y(k, delta, beta[k]))
            else:
                y_star, exhausted, tight = self.water_level(fl, X, delta)
                # ρ_req: y* rounded to double, the long-double sum rounded to double
                req = float(self.R_sum(LD(float(y_star)), delta, fl))
                f = len(fl)
                if exhausted or req >= X - f * EPS or X - req < X / 10000:
                    with np.errstate(divide="ignore", invalid="ignore"):
                        scale = LD(X) / LD(req)  # X at round start
                    for k in fl:
                        if y_star > LD(self.y(k, delta, 0.0)):
                            with np.errstate(invalid="ignore", over="ignore"):
                                bk = float(
                                    LD(self.b[k] / delta)
                                    * (y_star * LD(self.t + delta - self.tau[k]) - LD(self.P[k]))
                                    * scale
                                )
                            if bk > self.b[k]:
                                bk = self.b[k]
                            if bk > X:
                                bk = X
                        else:
                            bk = 0.0
                        beta[k] = bk
                        X -= bk
                        free[k] = False
                        record.append(self.y(k, delta, bk))
                elif req == 0:
                    for k in fl:
                        beta[k] = X / f  # uncapped
                        free[k] = False
                        record.append(self.y(k, delta, beta[k]))
                    X = 0.0
                else:
                    for k in fl:
                        if y_star > LD(self.y(k, delta, 0.0)):
                            bk = float(
                                LD(self.b[k] / delta)
                                * (y_star * LD(self.t + delta - self.tau[k]) - LD(self.P[k]))
                            )
                            if bk > self.b[k]:
                                bk = self.b[k]
                            if bk > X:
                                bk = X
                        else:
                            bk = 0.0
                        if bk >= self.b[k] - EPS or bk * delta >= self.V[k] - EPS or k in tight:
                            beta[k] = bk
                            X -= bk
                            free[k] = False
                            record.append(self.y(k, delta, bk))
            if event is None and QUIRKS["duplicate_yields"]:
                # the no-event variant records every still-free app after every round
                for k in range(m):
                    if free[k]:
                        beta[k] = 0.0
                        record.append(self.y(k, delta, 0.0))
            after = sum(free)
            if not (before > after or after * EPS > X):
                raise ReferenceAbort("LexFill made no progress")
        if event is not None or not QUIRKS["duplicate_yields"]:
            for k in range(m):
                if free[k]:
                    beta[k] = 0.0
                    record.append(self.y(k, delta, 0.0))
        record.sort()
        return beta, record[:m]

    # -- Fix (the reference's computeYields) -------------------------------------------

    def fix(self, delta: float, N: set[int], c: int) -> tuple[list[float], list[float]]:
        m = self.m
        N = set(N)
        N.discard(c)
        beta = [0.0] * m
        Y = [0.0] * m
        beta[c] = self.V[c] / delta
        X = LD(self.B - beta[c])  # double subtraction, stored in a long double
        members = [k for k in range(m) if k in N]
        y = self.common_level(delta, X, members)
        count = 0
        last = -1
        total = LD(0.0)
        for k in range(m):
            if X > EPS and k in N:
                bk = float(self.R(k, y, delta))
                if bk > self.b[k]:
                    bk = self.b[k]
                beta[k] = bk
                total += LD(bk)
                Y[k] = float(y)
                count += 1
                last = k
            else:
                Y[k] = self.y(k, delta, beta[k])
        if X > EPS:
            if count == 0:
                raise ReferenceAbort("Fix with budget but no application")
            if count == 1:
                beta[last] = float(X)
                if beta[last] > self.b[last]:
                    beta[last] = self.b[last]
            elif total == 0:
                for k in members:
                    beta[k] = float(X / LD(count))
                    if beta[k] > self.b[k]:
                        beta[k] = self.b[k]
                    Y[k] = self.y(k, delta, beta[k])
            elif total > X or X - total > X / LD(INV_PRECISION):
                ratio = X / total
                for k in members:
                    beta[k] = float(LD(beta[k]) * ratio)
                    if beta[k] > self.b[k]:
                        beta[k] = self.b[k]
                    Y[k] = self.y(k, delta, beta[k])
        return beta, Y

    # -- G and the crossings -----------------------------------------------------------

    def increasing(self, N: set[int], c: int) -> bool:
        """Whether G increases: Σ_N b·Σ_N bP − Σ_N b(B(t − τ) + V_c) < 0."""
        first = LD(0.0)
        second = LD(0.0)
        third = LD(0.0)
        for k in range(self.m):
            if k in N and k != c:
                first += LD(self.b[k])
                second += LD(self.b[k] * self.P[k])
                third += LD(self.b[k] * (self.B * (self.t - self.tau[k]) + self.V[c]))
        return first * second - third < 0

    def G(self, N: set[int], c: int) -> Frac:
        num_cnt = LD(-self.V[c])
        den_lin = LD(0.0)
        den_cnt = LD(0.0)
        for k in range(self.m):
            if k in N:
                num_cnt += LD(self.P[k] * self.b[k])
                den_lin += LD(self.b[k])
                den_cnt += LD((self.t - self.tau[k]) * self.b[k])
        return (LD(self.B), num_cnt, den_lin, den_cnt)

    def H(self, k: int) -> Frac:
        """(δ + P_k)/(δ + t − τ_k): k's yield at full bandwidth."""
        return (LD(1.0), LD(self.P[k]), LD(1.0), LD(self.t - self.tau[k]))

    def Cf(self, k: int) -> Frac:
        """C_k as a fraction."""
        return (LD(0.0), LD(self.P[k] + self.V[k] / self.b[k]), LD(1.0), LD(self.t - self.tau[k]))

    def Z(self, k: int) -> Frac:
        """P_k/(δ + t − τ_k): k's yield without bandwidth."""
        return (LD(0.0), LD(self.P[k]), LD(1.0), LD(self.t - self.tau[k]))

    # -- Interval (the reference's MinYieldAtAppEventInInterval) ------------------------

    def interval(self, dmin: float, dmax: float, c: int, depth: int = 0):
        """(β, Y unsorted, δ*) for event c in [dmin, dmax]."""
        m = self.m
        others = [i for i in range(m) if i != c]
        X0 = self.B - self.V[c] / dmin
        if X0 < EPS:
            X0 = 0.0
        if self.V[c] < SHORT:
            return (*self.fix(dmin, set(others), c), dmin)

        z = sorted(self.y(i, dmin, 0.0) for i in others)
        # U (double), with the reference's loop quirk: C_c counts only when c = 0
        if QUIRKS["own_bound_only_c0"]:
            current = self.C(c, dmin)
            U = -1.0
            for i in range(m):
                if i != c:
                    current = self.M(i, dmin)
                if i == 0 or current < U:
                    U = current
        else:
            U = min([self.C(c, dmin)] + [self.M(i, dmin) for i in others])
        req = self.R_sum(LD(U), dmin, others)
        if req - LD(X0) > LD(X0 / INV_PRECISION):
            return self._case_a(dmin, dmax, c, depth, X0, z, others)
        return self._case_b(dmin, dmax, c, depth, U, others)

    def _next_app(self, N: set[int], c: int, mid: float) -> int | None:
        """First argmin of y_j(mid, 0) over j ∉ N, j ≠ c."""
        best = None
        best_y = LD(1.0)
        for j in range(self.m):
            if j != c and j not in N:
                yj = LD(self.y(j, mid, 0.0))
                if best is None or yj < best_y:
                    best, best_y = j, yj
        return best

    def _case_a(self, dmin, dmax, c, depth, X0, z, others):
        thr = LD(X0 / INV_PRECISION)
        if self.R_sum(LD(z[-1]), dmin, others) - LD(X0) <= thr:
            N = set(others)
        else:
            lo, hi = 0, len(z) - 1
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self.R_sum(LD(z[mid]), dmin, others) - LD(X0) > thr:
                    hi = mid
                else:
                    lo = mid
            ref = LD(z[lo])
            N = {i for i in others if LD(self.y(i, dmin, 0.0)) - ref <= ref / LD(INV_PRECISION)}
        if not self.increasing(N, c):
            return (*self.fix(dmin, N, c), dmin)

        G = self.G(N, c)
        found = False
        L = LD(dmax)
        F = False
        singular = False
        h_larger = False
        ok = False
        bounding = 0
        bounding_y = LD(0.0)
        half = (dmin + dmax) / 2
        # (i) G against each member's maximum-yield function
        for i in sorted(N):
            Hi = self.H(i) if not half > self.V[i] / self.b[i] else self.Cf(i)
            x = first_cross(dmin, dmax, G, Hi)
            if x is not None and (not found or x < L):
                if x - dmin < SIGMA and x - dmin < dmin / INV_PRECISION:
                    ym = LD(self.M(i, dmax))
                    if not singular or ym < bounding_y:
                        bounding_y = ym
                        bounding = i
                        singular = True
                        if not self.increasing(N, c):  # never: checked above
                            return (*self.fix(dmin, N, c), dmin)
                        ok, x2, h_larger = second_cross(dmin, dmax, Hi, G, h_larger)
                        if ok:
                            found = True
                            if x2 < L:
                                L = x2
                                F = False
                else:
                    L = x
                    found = True
                    F = False
        gamma = G if (not singular or h_larger) else self.H(bounding)
        # (ii) the first application without bandwidth
        found_ii = False
        j = self._next_app(N, c, half)
        if j is not None:
            x = first_cross(dmin, dmax, gamma, self.Z(j))
            found_ii = x is not None
            if x is not None and (not found or x < L):
                L, found, F = x, True, False
        # (iii) the event application's completion yield
        x = first_cross(dmin, dmax, gamma, self.Cf(c))
        found_iii = x is not None
        if x is not None and (not found or x < L + EPS):
            L, found, F = x, True, True
        if not found or (singular and not ok and not found_ii and not found_iii):
            return (*self.fix(dmax, N, c), dmax)
        if F:
            d = float(L)
            return (*self.fix(d, N, c), d)
        if depth > DEPTH_LIMIT and L - dmin < SIGMA:
            raise ReferenceAbort("Interval case A: recursion limit (POTENTIAL BUG (1))")
        return self.interval(float(L), dmax, c, depth + 1)

    def _case_b(self, dmin, dmax, c, depth, U, others):
        N = {i for i in others if LD(self.y(i, dmin, 0.0)) - LD(U) < LD(U / INV_PRECISION)}
        if LD(self.C(c, dmin)) < U + EPS:
            return (*self.lex_fill(dmin, c), dmin)
        bounding = None
        bounding_y = LD(-1.0)
        for i in others:
            if LD(self.M(i, dmin)) < U + EPS:
                yi = LD(self.M(i, dmax))
                if bounding is None or yi < bounding_y:
                    bounding, bounding_y = i, yi
        if bounding is None:
            raise ReferenceAbort("Interval case B: no bounding application")
        bb = bounding
        if self.R(bb, LD(U), dmin) > self.V[bb] / dmin - EPS:
            return (*self.lex_fill(dmin, c), dmin)
        Hb = self.H(bb)
        G = self.G(N, c)
        found = False
        L = LD(dmax)
        F = False
        if len(N) > 1:
            x = first_cross(dmin, dmax, Hb, G)
            if x is not None:
                found, L = True, x
        singular = False
        ok = False
        h_larger = False
        if found and L - dmin < SIGMA and L - dmin < dmin / INV_PRECISION:
            singular = True
            if not self.increasing(N, c):
                return (*self.fix(dmin, N, c), dmin)
            ok, x2, h_larger = second_cross(dmin, dmax, Hb, G, h_larger)
            if ok:
                found, L = True, x2
            else:
                found, L, F = False, LD(dmax), False
        gamma = G if (singular and h_larger) else Hb
        half = (dmin + dmax) / 2
        found_ii = False
        j = self._next_app(N, c, half)
        if j is not None:
            x = first_cross(dmin, dmax, gamma, self.Z(j))
            found_ii = x is not None
            if x is not None and (not found or x < L):
                L, found, F = x, True, False
        x = first_cross(dmin, dmax, gamma, self.Cf(c))
        found_iii = x is not None
        if x is not None and (not found or x < L + EPS):
            L, found, F = x, True, True
        if not found or (singular and not ok and not found_ii and not found_iii):
            return (*self.lex_fill(dmax, c), dmax)
        if F:
            d = float(L)
            return (*self.lex_fill(d, c), d)
        if depth > DEPTH_LIMIT and L - dmin < SIGMA:
            if self.V[bb] < SHORT:
                if self.b[c] + self.b[bb] >= self.B:
                    d = (self.V[c] + self.V[bb]) / self.B
                else:
                    d = dmin + self.V[bb] / self.b[bb]
                return (*self.lex_fill(d, c), d)
            raise ReferenceAbort("Interval case B: recursion limit (POTENTIAL BUG (2))")
        return self.interval(float(L), dmax, c, depth + 1)

    # -- the main procedure ------------------------------------------------------------

    def decide(self, T: float) -> list[float]:
        m = self.m
        b, V, P, tau, t = self.b, self.V, self.P, self.tau, self.t
        if m == 0:
            return []
        total = 0.0
        for k in range(m):
            total += b[k]
        # 1. Σb ≤ B + ε: everyone gets b_k
        if total <= self.B + EPS:
            return list(b)
        # 2. short-I/O shortcut
        shortest, star = V[0] / b[0], 0
        for i in range(1, m):
            d = V[i] / b[i]
            if shortest > d:
                shortest, star = d, i
        if shortest < SHORT:
            beta = [0.0] * m
            beta[star] = b[star]
            X = self.B - beta[star]
            rest = total - beta[star]
            for i in range(1 if QUIRKS["skip_index_0"] else 0, m):
                if i != star:
                    beta[i] = X * b[i] / rest
                    if beta[i] > b[i]:
                        beta[i] = b[i]
            return beta
        # 3. baseline: LexFill at the window end T, used as a horizon *length* (bug)
        horizon = T if QUIRKS["window_end_as_length"] else T - t
        beta0, Y0 = self.lex_fill(horizon, None)
        if Y0[0] > 0:
            best_beta, best_Y = list(beta0), list(Y0)
        else:
            best_beta, best_Y = [0.0] * m, [-1.0] * m
        # 4. candidate horizons
        d = [V[i] / b[i] for i in range(m)]
        H = [horizon]
        e = horizon
        none_ends = True
        for i in range(m):
            if d[i] < horizon:
                H.append(d[i])
                if none_ends or d[i] < e:
                    e = d[i]
                none_ends = False
        if none_ends:
            return best_beta
        D = [P[i] + d[i] for i in range(m)]
        for i in range(m - 1):  # (a)
            for j in range(i + 1, m):
                if D[i] - D[j] >= EPS or D[i] - D[j] <= -EPS:
                    x = (D[j] * (t - tau[i]) - D[i] * (t - tau[j])) / (D[i] - D[j])
                    if horizon >= x and x >= d[i] and x >= d[j]:
                        H.append(x)
        for i in range(m):  # (b)
            for j in range(m):
                if i != j:
                    pb = P[i] - P[j] + t - tau[j] - d[j]
                    pc = P[i] * (t - tau[j]) - (P[j] + d[j]) * (t - tau[i])
                    disc = pb * pb - 4 * pc
                    if disc >= 0:
                        r1 = (-pb - disc**0.5) / 2
                        if r1 >= 0 and r1 <= horizon and r1 >= d[j]:
                            H.append(r1)
                        r2 = (-pb + disc**0.5) / 2
                        if disc > 0 and r2 >= 0 and r2 <= horizon and r2 >= d[j]:
                            H.append(r2)
        for i in range(m):  # (c)
            for j in range(m):
                if i != j:
                    den = P[i] - P[j] + tau[i] - tau[j]
                    if den > EPS or den < -EPS:
                        x = (P[j] * (t - tau[i]) - P[i] * (t - tau[j])) / den
                        if x >= e and x <= horizon:
                            H.append(x)
        for i in range(m):  # (d)
            for j in range(m):
                if i != j:
                    den = P[i] - P[j] - d[j]
                    if den > EPS or den < -EPS:
                        x = ((P[j] + d[j]) * (t - tau[i]) - P[i] * (t - tau[j])) / den
                        if x >= d[j] and horizon >= x:
                            H.append(x)
        for i in range(m):  # (e)
            for j in range(m):
                if i != j:
                    den = P[j] - P[i]
                    if den > EPS or den < -EPS:
                        x = (P[i] * (t - tau[j]) - P[j] * (t - tau[i])) / den
                        if x >= e and horizon >= x:
                            H.append(x)
        H.sort()
        # 5. scan the consecutive pairs
        processed = [False] * m
        unprocessed = m
        stop = False
        for k in range(len(H) - 1):
            if unprocessed <= 0 or stop:
                break
            if H[k + 1] - H[k] < EPS:
                continue
            mid = (H[k] + H[k + 1]) / 2
            c = -1
            target = -1.0
            for i in range(m):
                if mid >= d[i]:
                    ci = (P[i] + V[i] / b[i]) / (t + mid - tau[i])
                    if c < 0 or ci < target:
                        c, target = i, ci
            assert c >= 0
            order = [c] + [i for i in range(m) if i != c]
            for i in order:
                if processed[i] or not mid >= d[i]:
                    continue
                beta, Y, dstar = self.interval(H[k], H[k + 1], i)
                Y = sorted(Y)
                if Y[0] >= self.y(i, dstar, V[i] / dstar) - EPS:
                    processed[i] = True
                    unprocessed -= 1
                    stop = True
                if _better(Y, best_Y):  # keepBest
                    best_beta, best_Y = list(beta), list(Y)
        # 6. apply β*
        return best_beta


def _better(Y: Sequence[float], best: Sequence[float]) -> bool:
    """keepBest: the first rank differing by more than ε decides."""
    for a, c in zip(Y, best, strict=True):
        if a > c + EPS:
            return True
        if a < c - EPS:
            return False
    return False


def first_cross(dmin: float, dmax: float, f: Frac, g: Frac) -> np.longdouble | None:
    """The first δ in [dmin, dmax] where f = g (long double), or None."""
    a1, b1, c1, e1 = f
    a2, b2, c2, e2 = g
    A = a1 * c2 - c1 * a2
    Bp = a1 * e2 + b1 * c2 - c1 * b2 - e1 * a2
    C = b1 * e2 - e1 * b2
    if A != 0:
        disc = Bp * Bp - 4 * A * C
        if disc < 0:
            return None
        s = np.sqrt(disc)
        r1 = (-Bp - s) / (2 * A)
        r2 = (-Bp + s) / (2 * A)
        if r1 > r2:
            r1, r2 = r2, r1
        if dmin <= r1 <= dmax:
            return r1
        if dmin <= r2 <= dmax:
            return r2
        return None
    if Bp != 0:
        r = -C / Bp
        return r if dmin <= r <= dmax else None
    if C == 0:
        return LD(dmax)
    return None


def second_cross(
    dmin: float, dmax: float, f: Frac, g: Frac, f_larger: bool
) -> tuple[bool, np.longdouble, bool]:
    """(found, δ, fLarger): the other crossing of f and g, δmin being one (long double)."""
    a1, b1, c1, e1 = f
    a2, b2, c2, e2 = g
    A = a1 * c2 - c1 * a2
    Bp = a1 * e2 + b1 * c2 - c1 * b2 - e1 * a2
    C = b1 * e2 - e1 * b2
    if A != 0:
        disc = Bp * Bp - 4 * A * C
        if not disc >= 0:
            raise ReferenceAbort("SecondCross: negative discriminant")
        s = np.sqrt(disc)
        r1 = (-Bp - s) / (2 * A)
        r2 = (-Bp + s) / (2 * A)
        if r1 > r2:
            r1, r2 = r2, r1
        d1 = abs(float(r1 - dmin))  # stored in doubles
        d2 = abs(float(r2 - dmin))
        if not (d1 <= EPS or d1 <= SIGMA or d2 <= EPS or d2 <= SIGMA):
            raise ReferenceAbort("SecondCross: δmin is not a root")
        # two roots, δmin the first: f is above between them iff A < 0; otherwise A > 0
        f_larger = bool(A < 0) if disc > 0 and d1 < d2 else bool(A > 0)
        if d2 < d1:
            return False, LD(dmax), f_larger
        if dmin <= r2 <= dmax:
            return True, r2, f_larger
        return False, LD(dmax), f_larger
    if Bp != 0:
        return False, LD(dmax), f_larger
    if C != 0:
        raise ReferenceAbort("SecondCross: distinct parallel functions")
    return True, LD(dmax), True


def allocate(
    t: float,
    T: float,
    b: Sequence[float],
    tau: Sequence[float],
    P: Sequence[float],
    V: Sequence[float],
    B: float = 1.0,
) -> list[float]:
    """nextEvLexMin's β for the I/O applications (A order) at time t, window end T.

    b: normalised caps, tau: release times τ, P: progress, V: remaining normalised
    volumes, B: the normalised total bandwidth (1 in the reference's simulation).
    """
    return _Problem(t, b, tau, P, V, B).decide(T)
