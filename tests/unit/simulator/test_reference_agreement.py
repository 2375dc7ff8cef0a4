"""Per-instance agreement of the simulator with the reference semantics.

``tests/reference/simu.py`` renders the authors' simulator ([BWS-SIM] simu.cc)
literally and shares no code with ours. Both must give the same MinYield and
Efficiency on every instance, for every simple strategy, in v1 and v2 windows,
on synthetic instances ([BWS] §6.2) and on heterogeneous ones (b_i ≠ B,
pre-window age and progress, I/O-first phases, unknown wIter, windows shorter
than the shortest application). The required tolerance is ±0.02; the float
operations are the same, so we hold to 1e-9.
"""

from __future__ import annotations

import functools
import random

import pytest
from reference import next_ev_lexmin, simu

from burstctl.simulator.bws.generate import GeneratorParams, generate
from burstctl.simulator.bws.instance import format_instance, parse_instance, prepare_window
from burstctl.simulator.bws.runs import create_policy, simulate

# reference heuristic → our policy (Set10Learn is our set-10, which learns ω online)
POLICIES = {
    "fairShare": "fair-share",
    "FCFS": "fcfs",
    "greedyYield": "greedy-yield",
    "greedyCom": "greedy-com",
    "Set10Learn": "set-10",
    "fixedWindow": "periodic-greedy-yield",
    "lookAheadGreedyYield": "look-ahead-greedy-yield",
}
TIGHT = 1e-9


def heterogeneous(seed: int, m: int = 8) -> str:
    """A small instance in the line format exercising every field (bandwidth B = 4)."""
    rng = random.Random(seed)
    lines = []
    for i in range(m):
        age = rng.choice([0.0, rng.uniform(0.0, 50.0)])
        n = rng.randint(3, 12)
        lines.append(
            " ".join(
                [
                    f"A{i}",
                    repr(rng.choice([0.5, 1.0, 2.0, 4.0, 6.0])),  # some above B: clipped
                    repr(age),
                    repr(rng.uniform(0.0, age) if age else 0.0),  # progress
                    repr(rng.uniform(0.0, age) if age else 0.0),  # agePhase
                    str(n),
                    repr(rng.choice([0.0, 5.0])),  # wIter
                    rng.choice("WC"),
                    *(repr(rng.uniform(0.5, 20.0)) for _ in range(n)),
                ]
            )
        )
    return "\n".join(lines) + "\n"


def assert_agree(ours: object, ref: simu.Result) -> None:
    assert ours.horizon == pytest.approx(ref.horizon, rel=1e-12)  # type: ignore[attr-defined]
    assert abs(ours.min_yield - ref.min_yield) <= TIGHT  # type: ignore[attr-defined]
    assert abs(ours.efficiency - ref.efficiency) <= TIGHT  # type: ignore[attr-defined]
    assert ours.events == ref.events  # type: ignore[attr-defined]


@pytest.mark.parametrize("heuristic", list(POLICIES))
@pytest.mark.parametrize(("pressure", "seed"), [(0.5, 11), (0.8, 12), (1.1, 13)])
def test_synthetic_instances_agree(heuristic: str, pressure: float, seed: int) -> None:
    # h = 20,000 instead of 2,000,000 keeps each run to a few thousand events
    text = format_instance(generate(GeneratorParams(pressure=pressure, horizon=20_000), seed))
    ref = simu.simulate(text, heuristic)
    ours = simulate(prepare_window(parse_instance(text)), POLICIES[heuristic])
    assert_agree(ours, ref)


@pytest.mark.parametrize("heuristic", list(POLICIES))
@pytest.mark.parametrize("window", [1.0, 0.6])
def test_heterogeneous_instances_agree(heuristic: str, window: float) -> None:
    for seed in range(6):
        text = heterogeneous(seed)
        ref = simu.simulate(text, heuristic, win_len=window, B=4.0)
        ours = simulate(
            prepare_window(parse_instance(text), window=window, bandwidth=4.0), POLICIES[heuristic]
        )
        assert_agree(ours, ref)


@pytest.mark.parametrize("heuristic", ["FCFS", "greedyCom", "Set10Learn", "lookAheadGreedyYield"])
def test_v2_windows_agree(heuristic: str) -> None:
    text = format_instance(generate(GeneratorParams(pressure=1.1, horizon=20_000), 21))
    ref = simu.simulate(text, heuristic, v2=True)
    ours = simulate(prepare_window(parse_instance(text)), POLICIES[heuristic], windows="v2")
    assert_agree(ours, ref)


# -- best-next-event against the reference's nextEvLexMin (computeNextEvLexMin) ---------------
#
# ``reference/next_ev_lexmin.py`` renders it literally, bugs included. Our policy deviates from
# it on purpose (policies/best_next_event.py, class docstring, differences 1–8), and several of
# those deviations move the metrics by more than the required ±0.04 on small, contended
# instances. The tests below therefore (a) compare against the literal reference, expected to
# fail for documented reasons only, and (b) switch the reference's four bugs off
# (``next_ev_lexmin.QUIRKS``) and check that what remains agrees within ±0.04, except where the
# reference leaves bandwidth idle (difference 8), which is detected and reported.

BNE_TOLERANCE = 0.04  # the required bound for best-next-event
BNE_SYNTHETIC_SEEDS = range(80)
BNE_HETEROGENEOUS_SEEDS = range(40)
BNE_WINDOWS = (1.0, 0.6)


def small_synthetic(seed: int) -> tuple[str, float]:
    """6–12 applications of a [BWS] §6.2 instance (h = 3,000) and the bandwidth B to use.

    B = k/60 keeps the I/O load per unit of bandwidth that of the 60-application instance
    (every b_i = B after clipping, as on the synthetic traces), so the drawn subset contends.
    """
    rng = random.Random(seed)
    k = 6 + seed % 7
    pressure = (0.5, 0.8, 1.1)[seed % 3]
    apps = generate(GeneratorParams(pressure=pressure, horizon=3_000), seed)
    return format_instance(rng.sample(apps, k)), k / 60


def _bne_case(kind: str, seed: int) -> tuple[str, float]:
    if kind == "synthetic":
        return small_synthetic(seed)
    return heterogeneous(seed, m=6 + seed % 7), 4.0


def _bne_cases(kind: str) -> list[tuple[str, int, float]]:
    if kind == "synthetic":
        return [(kind, seed, 1.0) for seed in BNE_SYNTHETIC_SEEDS]
    return [(kind, seed, w) for seed in BNE_HETEROGENEOUS_SEEDS for w in BNE_WINDOWS]


@functools.cache
def _bne_ours(kind: str, seed: int, window: float) -> tuple[float, float]:
    text, bandwidth = _bne_case(kind, seed)
    ours = simulate(
        prepare_window(parse_instance(text), window=window, bandwidth=bandwidth),
        "best-next-event",
    )
    return ours.min_yield, ours.efficiency


@functools.cache
def _bne_reference(kind: str, seed: int, window: float, bugs: bool) -> tuple[float, float, int]:
    """(MinYield, Efficiency, decisions leaving bandwidth idle) of the reference semantics."""
    text, bandwidth = _bne_case(kind, seed)
    saved = dict(next_ev_lexmin.QUIRKS)
    allocate = next_ev_lexmin.allocate
    idle = 0

    def counting(t, T, b, tau, P, V, B=1.0):  # type: ignore[no-untyped-def]
        nonlocal idle
        rates = allocate(t, T, b, tau, P, V, B)
        if sum(b) > B + 1e-9 and sum(rates) < B - 1e-6:
            idle += 1  # demand exceeds B, yet part of B stays unallocated
        return rates

    try:
        next_ev_lexmin.QUIRKS.update(dict.fromkeys(saved, bugs))
        next_ev_lexmin.allocate = counting
        ref = simu.simulate(text, "nextEvLexMin", win_len=window, B=bandwidth)
    finally:
        next_ev_lexmin.QUIRKS.update(saved)
        next_ev_lexmin.allocate = allocate
    return ref.min_yield, ref.efficiency, idle


def _bne_compare(kind: str, bugs: bool) -> tuple[list[tuple[str, float, float, int]], str]:
    """Per instance (name, ΔMinYield, ΔEfficiency, idle decisions), and a summary line."""
    rows = []
    for case in _bne_cases(kind):
        ours = _bne_ours(*case)
        ref = _bne_reference(*case, bugs)
        name = f"{case[0]} seed={case[1]} window={case[2]}"
        rows.append((name, ours[0] - ref[0], ours[1] - ref[1], ref[2]))
    worst_y = max(rows, key=lambda r: abs(r[1]))
    worst_e = max(rows, key=lambda r: abs(r[2]))
    summary = (
        f"{kind}, reference bugs {'on' if bugs else 'off'}, {len(rows)} instances: "
        f"max |ΔMinYield| = {abs(worst_y[1]):.3g} ({worst_y[0]}), "
        f"max |ΔEfficiency| = {abs(worst_e[2]):.3g} ({worst_e[0]})"
    )
    print(summary)
    return rows, summary


def _beyond(rows: list[tuple[str, float, float, int]]) -> list[tuple[str, float, float, int]]:
    return [r for r in rows if abs(r[1]) > BNE_TOLERANCE or abs(r[2]) > BNE_TOLERANCE]


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason="documented deviations of best-next-event from the reference (class docstring): "
    "4 (C_c bounds φ_c for every c; the reference's Interval uses it only for c = 0) on seeds "
    "4, 16, 41, 42, 52, 77 and 1 (horizon T − t; the reference uses T) on seed 53",
)
def test_best_next_event_agrees_with_reference_synthetic() -> None:
    rows, summary = _bne_compare("synthetic", bugs=True)
    assert not _beyond(rows), f"{summary}; beyond ±{BNE_TOLERANCE}: {_beyond(rows)}"


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason="documented deviation 8 of best-next-event (class docstring): only work-conserving "
    "candidates, while the reference leaves part of B idle when b_i < B (seeds 1, 9 and 28: "
    "Efficiency up to +0.11); 4 and 3 can also show on other seeds",
)
def test_best_next_event_agrees_with_reference_heterogeneous() -> None:
    rows, summary = _bne_compare("heterogeneous", bugs=True)
    assert not _beyond(rows), f"{summary}; beyond ±{BNE_TOLERANCE}: {_beyond(rows)}"


def test_best_next_event_agrees_with_debugged_reference_synthetic() -> None:
    # every b_i = B: difference 8 never binds, so without the reference's bugs (differences
    # 1–4) only float64 (5), the exact δ search (6) and ties (7) remain
    rows, summary = _bne_compare("synthetic", bugs=False)
    assert not _beyond(rows), f"{summary}; beyond ±{BNE_TOLERANCE}: {_beyond(rows)}"


def test_best_next_event_agrees_with_debugged_reference_heterogeneous() -> None:
    # b_i < B: where the reference leaves bandwidth idle (difference 8) we are more efficient
    # by design; everywhere else the metrics must agree
    rows, summary = _bne_compare("heterogeneous", bugs=False)
    unexplained = [r for r in _beyond(rows) if r[3] == 0]
    conserving = [r for r in rows if r[3] == 0]
    assert len(conserving) >= len(rows) // 3, summary  # the check keeps some power
    assert not unexplained, f"{summary}; beyond ±{BNE_TOLERANCE}, no idle decision: {unexplained}"


# The reference's Set10 (ω known from the instance's wIter when > 0, learned otherwise) is our
# set-10 with known_omega filled from the instance (`burstctl sim run --known-omega`).
@pytest.mark.parametrize(("pressure", "seed"), [(0.5, 21), (0.8, 22), (1.1, 23)])
def test_set10_with_known_omega_agrees_on_synthetic_instances(pressure: float, seed: int) -> None:
    text = format_instance(generate(GeneratorParams(pressure=pressure, horizon=20_000), seed))
    window = prepare_window(parse_instance(text))
    ours = simulate(window, create_policy("set-10", window, known_omega=True))
    assert ours.known_omega
    assert_agree(ours, simu.simulate(text, "Set10"))
    learned = simulate(window, "set-10")
    assert not learned.known_omega
    assert_agree(learned, simu.simulate(text, "Set10Learn"))


@pytest.mark.parametrize("window", [1.0, 0.6])
def test_set10_with_known_omega_agrees_on_heterogeneous_instances(window: float) -> None:
    # wIter is 0 (unknown: learned) for some applications and 5 s for the others
    differ = 0
    for seed in range(6):
        text = heterogeneous(seed)
        win = prepare_window(parse_instance(text), window=window, bandwidth=4.0)
        ours = simulate(win, create_policy("set-10", win, known_omega=True))
        assert_agree(ours, simu.simulate(text, "Set10", win_len=window, B=4.0))
        learned = simu.simulate(text, "Set10Learn", win_len=window, B=4.0)
        differ += ours.min_yield != learned.min_yield
    assert differ > 0  # knowing ω changes the outcome somewhere: the test can tell them apart
