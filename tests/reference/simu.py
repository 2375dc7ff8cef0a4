"""Test oracle: the reference simulator's semantics, written out plainly.

A direct, loop-by-loop rendering of the behaviour of the authors' simulator
([BWS-SIM] simu.cc: ``addApps2``, ``addApps``, ``simulate`` with its v1/v2
windows and metrics, ``compute`` and the ``compute*`` heuristics) for the eight
simple heuristics, in float64, plus nextEvLexMin (``computeNextEvLexMin``, in
``next_ev_lexmin.py``). It shares no code with ``burstctl.simulator`` or
``burstctl.policies`` (it parses the line format itself, truncates, loops and
allocates on its own), so comparing the two per instance checks our fluid loop
*and* our policy objects against the reference semantics. It is deliberately
slow and literal; it is not part of the product.

Left out: the integer-truncated Utilization (``simulate``'s ``setUtilGopi``
credit, which our simulator reports separately as ``utilization_reference``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import next_ev_lexmin

EPS = 1e-10  # ε
EPS2 = 1e-9  # ε₂
DONE = 1e-7  # a phase completes when its remaining full-speed time is below this
HEURISTICS = (
    "fairShare",
    "FCFS",
    "greedyYield",
    "greedyCom",
    "Set10",
    "Set10Learn",
    "fixedWindow",
    "lookAheadGreedyYield",
    "nextEvLexMin",
)


@dataclass
class App:
    b: float
    tau: float
    P: float
    R: float
    w_iter: float
    io: bool  # current phase type: True = I/O (C), False = work
    values: list[float]  # kept phases, normalised (work seconds, I/O volume at B = 1)
    phase: int = 0
    Q: float = 0.0
    beta: float = 0.0
    omega: float = 0.0
    c: int = 0
    new: bool = True
    known_omega: bool = False
    history: list[float] = field(default_factory=list)


@dataclass
class Result:
    min_yield: float
    efficiency: float
    horizon: float
    delta: float
    events: int


def c_round(x: float) -> int:
    """C ``round``: half away from zero."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def parse(text: str, B: float) -> list[tuple[float, float, float, float, float, bool, list[float]]]:
    """Lines → (bw, age, progress, agePhase, wIter, io_first, values), as ``addApps``."""
    rows = []
    for line in text.splitlines():
        tok = line.split()
        if not tok or tok[0].startswith("#"):
            continue
        n = int(tok[5])
        values = [float(x) for x in tok[8 : 8 + n]]
        rows.append(
            (
                float(tok[1]),
                float(tok[2]),
                float(tok[3]),
                float(tok[4]),
                float(tok[6]),
                tok[7] == "C",
                values,
            )
        )
    return rows


def simulate(
    text: str,
    heuristic: str,
    win_len: float = 1.0,
    B: float = 1.0,
    v2: bool = False,
    trace: list[float] | None = None,
) -> Result:
    if heuristic not in HEURISTICS:
        raise ValueError(heuristic)
    rows = parse(text, B)
    # window (addApps2): T = winLen × minᵢ Sᵢ over the full-speed durations of all phases
    solo = []
    for bw, _age, _p, _a, _w, io_first, values in rows:
        cap = min(bw, B)
        io, s = io_first, 0.0
        for v in values:
            s += v / cap if io else v
            io = not io
        solo.append(s)
    T = win_len * min(solo)
    apps: list[App] = []
    K = 0
    kept_total = 0.0
    for bw, age, p0, age_phase, w_iter, io_first, values in rows:
        b = min(bw, B) / B
        io = io_first
        kept: list[float] = []
        D = 0.0
        whole_later = 0
        for j, v in enumerate(values):
            vol = v / B if io else v  # normalised volume (I/O) or seconds (work)
            dur = vol / b if io else vol
            if j == 0:
                if dur > T:
                    kept.append(b * T if io else T)
                    D = T
                    break
                kept.append(vol)
                D = dur
            elif D + dur > T:
                cut = T - D
                kept.append(b * cut if io else cut)
                D = T
                break
            else:
                kept.append(vol)
                D += dur
                whole_later += 1
            io = not io
        assert abs(D - T) <= 1e-3 * T, "kept total not within 0.1 % of T"
        K += 1 + whole_later
        kept_total += D
        app = App(
            b=b,
            tau=-age,
            P=p0,
            R=-age_phase,
            w_iter=w_iter,
            io=io_first,
            values=kept,
        )
        app.Q = kept[0]
        app.omega = w_iter
        app.known_omega = w_iter > 0 and heuristic != "Set10Learn"
        apps.append(app)
    n = len(apps)
    delta = kept_total / (K * n)

    t, s = 0.0, 0.0
    t_c = T / 2 if v2 else 0.0
    switched = not v2
    E0 = sum(a.P * a.b for a in apps)
    counter = 0
    events = 0
    while t < T - EPS:
        if not switched and t > t_c - EPS:
            switched = True
            s = t
            E0 = sum(a.P * a.b for a in apps)
        A = [k for k, a in enumerate(apps) if a.io]
        active = heuristic if switched else "fairShare"
        t_d = _allocate(active, apps, A, t, T, delta)
        events += 1
        if trace is not None:
            trace.append(t)
        t_next = min(T, t_d)
        for a in apps:
            if a.io:
                if a.beta > 0:
                    t_next = min(t_next, t + a.Q / a.beta)
            else:
                t_next = min(t_next, t + a.Q)
        if v2 and t < t_c - EPS2 and t_next > t_c + EPS2:
            t_next = t_c
        dt = t_next - t
        for a in apps:
            if a.io:
                a.Q -= dt * a.beta
                a.P += dt * a.beta / a.b
                q = a.Q / a.b
            else:
                a.Q -= dt
                a.P += dt
                q = a.Q
            assert q >= -1e-7, "negative remaining"
            if q < DONE:
                a.phase += 1
                # past the last kept phase: computes until T (never observed in the reference)
                a.Q = a.values[a.phase] if a.phase < len(a.values) else math.inf
                a.R = t_next
                a.new = True
                a.io = not a.io
        if t_next == t:
            counter += 1
            if t + EPS2 > T:
                break
            assert counter <= 10, "time does not advance"
        else:
            t = t_next
            counter = 0
    min_yield = min(1.0, min(a.P / (T - a.tau) for a in apps))
    efficiency = (sum(a.b * a.P for a in apps) - E0) / ((T - s) * sum(a.b for a in apps))
    return Result(min_yield, efficiency, T, delta, events)


def _yield(a: App, t: float) -> float:
    return a.P / (t - a.tau) if t > a.tau else 0.0


def _greedy(apps: list[App], order: list[int], X: float) -> None:
    """The greedy fill of computeFIFOCom and the others: walk the order while budget is left."""
    for k in order:
        a = apps[k]
        if X <= 0:
            a.beta = 0.0
        elif a.b <= X:
            a.beta = a.b
            X -= a.b
        else:
            a.beta = X
            X = 0.0


def _allocate(h: str, apps: list[App], A: list[int], t: float, T: float, delta: float) -> float:
    for k in A:
        apps[k].beta = 0.0
    if not A:  # nothing to allocate; fixedWindow still ticks δ later
        return t + delta if h == "fixedWindow" else T
    if h == "fairShare":
        r = min(1.0, 1.0 / sum(apps[k].b for k in A))
        for k in A:
            apps[k].beta = apps[k].b * r
    elif h == "FCFS":
        _greedy(apps, sorted(A, key=lambda k: (apps[k].R, k)), 1.0)
    elif h in ("greedyYield", "fixedWindow"):
        _greedy(apps, sorted(A, key=lambda k: (_yield(apps[k], t), k)), 1.0)
        if h == "fixedWindow":
            return t + delta
    elif h == "greedyCom":
        _greedy(apps, sorted(A, key=lambda k: (apps[k].Q / apps[k].b, k)), 1.0)
    elif h in ("Set10", "Set10Learn"):
        _set10(apps, A)
    elif h == "lookAheadGreedyYield":
        _look_ahead(apps, A, t, T)
    elif h == "nextEvLexMin":
        rates = next_ev_lexmin.allocate(
            t, T, *([getattr(apps[k], f) for k in A] for f in ("b", "tau", "P", "Q"))
        )
        for k, beta in zip(A, rates, strict=True):
            apps[k].beta = beta
    return T


def _look_ahead(apps: list[App], A: list[int], t: float, T: float) -> None:
    if len(A) == 1:
        a = apps[A[0]]
        a.beta = a.b if a.b < 1.0 else 1.0
        return
    best, best_z = A[0], 0.0
    for i in A:
        _look_ahead_candidate(apps, A, i, t)
        h = T
        for k in A:
            if apps[k].beta > 0:
                h = min(h, t + apps[k].Q / apps[k].beta)
        z = 1.0
        for k in A:
            a = apps[k]
            z = min(z, (a.P + (h - t) * a.beta / a.b) / (h - a.tau))
        if z > best_z:
            best, best_z = i, z
    _look_ahead_candidate(apps, A, best, t)


def _look_ahead_candidate(apps: list[App], A: list[int], i: int, t: float) -> None:
    a = apps[i]
    beta = a.b if a.b < 1.0 else 1.0
    others = sorted((k for k in A if k != i), key=lambda k: (_yield(apps[k], t), k))
    _greedy(apps, others, 1.0 - beta)
    a.beta = beta


def _set10(apps: list[App], A: list[int]) -> None:
    """computeSet10, with learning as Set10Learn when ω is not known."""
    for k in A:
        a = apps[k]
        if not a.known_omega and a.new:
            a.new = False
            if a.c == 0:
                a.omega = 0.01
            else:
                w = a.values[a.phase - 1] if a.phase > 0 else 0.0
                a.omega = (a.omega * (a.c - 1) + w + a.values[a.phase] / a.b) / a.c
            a.c += 1
    sets: dict[int, list[int]] = {}
    for k in A:
        sets.setdefault(c_round(math.log10(apps[k].omega)), []).append(k)
    order = list(sets)
    weight = {g: 10.0 ** (-g) for g in order}
    demand = {g: sum(apps[k].b for k in sets[g]) for g in order}
    q_tot = sum(weight.values())
    X = 1.0
    saturated: set[int] = set()
    while len(saturated) < len(order):
        restarted = False
        for g in order:
            if g in saturated:
                continue
            share = weight[g] * X / q_tot
            if share > demand[g]:
                for k in sets[g]:
                    apps[k].beta = apps[k].b
                    X -= apps[k].b
                q_tot -= weight[g]
                saturated.add(g)
                restarted = True
                break
            _greedy(apps, sorted(sets[g], key=lambda k: (apps[k].R, k)), share)
        if not restarted:
            break
