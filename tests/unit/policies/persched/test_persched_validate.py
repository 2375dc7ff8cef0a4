"""The pattern validator catches broken patterns; every PERSCHED pattern passes it."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from burstctl.policies.persched import (
    App,
    AppPattern,
    Instance,
    Pattern,
    Platform,
    build_pattern,
    jupiter_set,
    persched,
    validate,
)

PLATFORM = Platform(B=3.0, b=0.01)


def _one(app: App, period: float, *instances: Instance) -> Pattern:
    return Pattern(period, (AppPattern(app, tuple(instances)),))


def test_a_hand_built_valid_pattern_passes() -> None:
    # 100 cores: cap 1 GB/s; compute 10 s, then 5 GB in 5 s, period 20 (wrapping I/O)
    app = App("a", 10.0, 5.0, 100.0)
    pattern = _one(app, 20.0, Instance(12.0, ((22.0, 27.0, 1.0),)))
    assert validate(pattern, PLATFORM) == []
    assert validate(pattern, PLATFORM, sys_eff=0.5, dilation=20 / 15) == []


def test_over_b() -> None:
    apps = [App(f"a{i}", 10.0, 10.0, 200.0) for i in range(2)]  # cap 2 each, B = 3
    pattern = Pattern(
        30.0,
        tuple(AppPattern(a, (Instance(0.0, ((10.0, 15.0, 2.0),)),)) for a in apps),
    )
    problems = validate(pattern, PLATFORM)
    assert any(p.startswith("bandwidth: 4 GB/s") for p in problems), problems


def test_rate_above_the_cap() -> None:
    app = App("a", 10.0, 5.0, 50.0)  # cap 0.5
    problems = validate(_one(app, 30.0, Instance(0.0, ((10.0, 15.0, 1.0),))), PLATFORM)
    assert any("> min(beta*b, B) = 0.5" in p for p in problems), problems


def test_compute_and_io_overlap() -> None:
    app = App("a", 10.0, 5.0, 100.0)
    # the I/O starts 2 s before the compute phase ends
    problems = validate(_one(app, 30.0, Instance(0.0, ((8.0, 13.0, 1.0),))), PLATFORM)
    assert any("overlap" in p for p in problems), problems
    assert any("outside the instance's window" in p for p in problems), problems


def test_io_running_into_the_next_instance() -> None:
    app = App("a", 10.0, 5.0, 100.0)
    pattern = _one(
        app,
        40.0,
        Instance(0.0, ((10.0, 15.0, 1.0),)),
        Instance(12.0, ((22.0, 27.0, 1.0),)),
    )
    problems = validate(pattern, PLATFORM)
    assert any("outside the instance's window" in p for p in problems), problems
    assert any("overlap" in p for p in problems), problems


def test_wrong_volume() -> None:
    app = App("a", 10.0, 5.0, 100.0)
    problems = validate(_one(app, 30.0, Instance(0.0, ((10.0, 14.0, 1.0),))), PLATFORM)
    assert problems == ["a instance 0 (compute at 0): moves 4 GB, vol_io is 5 GB"]


def test_reported_metrics_must_match() -> None:
    app = App("a", 10.0, 5.0, 100.0)
    pattern = _one(app, 20.0, Instance(0.0, ((10.0, 15.0, 1.0),)))
    problems = validate(pattern, PLATFORM, sys_eff=0.6, dilation=1.2)
    assert len(problems) == 2 and "sys_eff" in problems[0] and "dilation" in problems[1]


def test_a_persched_pattern_broken_by_hand_fails() -> None:
    s = jupiter_set(7)
    result = persched(s.apps, s.platform, tmin=4544.0)
    assert validate(result.pattern, s.platform) == []
    entry = result.pattern.apps[1]
    first = entry.instances[0]
    start, end, rate = first.io[0]
    broken = dataclasses.replace(first, io=((start, end, rate * 1.5), *first.io[1:]))
    apps = list(result.pattern.apps)
    apps[1] = dataclasses.replace(entry, instances=(broken, *entry.instances[1:]))
    problems = validate(dataclasses.replace(result.pattern, apps=tuple(apps)), s.platform)
    assert any("moves" in p for p in problems), problems


def test_pattern_json_round_trip() -> None:
    s = jupiter_set(10)
    result = persched(s.apps, s.platform, tmin=16000.0)
    data = json.loads(json.dumps(result.pattern.to_json()))
    assert set(data) == {"period", "apps"}
    assert set(data["apps"][0]) == {"name", "w", "vol_io", "beta", "instances"}
    assert Pattern.from_json(data) == result.pattern
    assert validate(Pattern.from_json(data), s.platform, sys_eff=result.sys_eff) == []


_apps = st.lists(
    st.builds(
        lambda w, vol, beta: (w, vol, beta),
        st.floats(1.0, 500.0),
        st.floats(0.5, 400.0),
        st.sampled_from([8.0, 16.0, 50.0, 64.0, 128.0, 300.0, 512.0]),
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(_apps, st.floats(1.0, 2.0), st.sampled_from([0.5, 1.0, 3.0]))
def test_every_pattern_validates(
    raw: list[tuple[float, float, float]], scale: float, B: float
) -> None:
    platform = Platform(B=B, b=0.01)
    apps = [App(f"a{i}", w, vol, beta) for i, (w, vol, beta) in enumerate(raw)]
    result = persched(apps, platform, kprime=3.0, epsilon=0.05, objective="syseff")
    assert (
        validate(result.pattern, platform, sys_eff=result.sys_eff, dilation=result.dilation) == []
    )
    assert result.sys_eff <= result.upper_bound + 1e-9
    # one period, any length: the pattern of the inner loop is valid too
    one = build_pattern(apps, platform, result.t_min * scale).pattern()
    assert validate(one, platform) == []


@settings(max_examples=30, deadline=None)
@given(_apps)
def test_every_min_dilation_pattern_validates(raw: list[tuple[float, float, float]]) -> None:
    apps = [App(f"a{i}", w, vol, beta) for i, (w, vol, beta) in enumerate(raw)]
    result = persched(apps, PLATFORM, kprime=3.0, epsilon=0.05, objective="dilation")
    assert validate(result.pattern, PLATFORM, dilation=result.dilation) == []


def test_first_instance_span_check_places_compute_in_the_widest_gap() -> None:
    """[PERSCHED-SIM] would start the compute phase w before the earliest chosen
    sub-interval (at 65) and overlap the I/O on [60, 70); the span check puts it in
    the gap [10, 60) instead."""
    from burstctl.policies.persched.algorithm import _Builder

    app = App("y", 35.0, 10.0, 100.0)  # cap 1 GB/s
    platform = Platform(B=1.0, b=0.01)
    builder = _Builder([app], platform, 100.0)
    # the others' load: half of B on [0, 10) and [60, 70), all of it elsewhere
    builder.dates[:] = [0.0, 10.0, 60.0, 70.0]
    builder.used[:] = [0.5, 1.0, 0.5, 1.0]
    assert builder.insert(0)
    pattern = builder.pattern()
    (inst,) = pattern.apps[0].instances
    assert inst.compute_start == 25.0
    assert inst.io == ((60.0, 70.0, 0.5), (100.0, 110.0, 0.5))
    assert validate(pattern, platform) == []
    # with w = 55 no gap is wide enough: rejected, not overlapped
    narrow = _Builder([App("y", 55.0, 10.0, 100.0)], platform, 100.0)
    narrow.dates[:] = [0.0, 10.0, 60.0, 70.0]
    narrow.used[:] = [0.5, 1.0, 0.5, 1.0]
    assert not narrow.insert(0)
