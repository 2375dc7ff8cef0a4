"""The instance line format and the window: T, truncation, δ/K, load ([BWS-SIM] addApps)."""

from __future__ import annotations

import pytest

from burstctl.simulator.bws.instance import (
    Application,
    InstanceError,
    Phase,
    format_instance,
    parse_instance,
    prepare_window,
    read_instance,
    write_instance,
)

TEXT = """\
# a comment, then a blank line

App0 1 0 0 0 3 1232.4886884488724 W 10.5 0.1 3.3333333333333335
fast 2.5 7 1.25 0.5 2 0 C 1e-3 42
"""


def test_parse_fields() -> None:
    a, b = parse_instance(TEXT)
    assert a == Application(
        name="App0",
        bandwidth=1.0,
        age=0.0,
        progress=0.0,
        age_phase=0.0,
        w_iter=1232.4886884488724,
        initial_type="W",
        values=(10.5, 0.1, 3.3333333333333335),
        line=3,
    )
    assert not a.io_first
    assert b.io_first and b.line == 4
    assert (b.bandwidth, b.age, b.progress, b.age_phase, b.values) == (
        2.5,
        7,
        1.25,
        0.5,
        (1e-3, 42),
    )


def test_round_trip(tmp_path) -> None:
    apps = parse_instance(TEXT)
    path = tmp_path / "inst.txt"
    write_instance(path, apps)
    again = read_instance(path)
    strip = [
        (a.name, a.bandwidth, a.age, a.progress, a.age_phase, a.w_iter, a.initial_type, a.values)
        for a in apps
    ]
    assert strip == [
        (a.name, a.bandwidth, a.age, a.progress, a.age_phase, a.w_iter, a.initial_type, a.values)
        for a in again
    ]
    # integral header fields are written as the reference generator writes them
    assert path.read_text().splitlines()[0].startswith("App0 1 0 0 0 3 1232.4886884488724 W ")
    assert format_instance(again) == path.read_text()


def test_any_initial_type_but_c_is_work() -> None:
    (app,) = parse_instance("x 1 0 0 0 1 0 Q 5")
    assert not app.io_first and app.initial_type == "Q"


@pytest.mark.parametrize(
    ("line", "field", "words"),
    [
        ("x 1 0 0 0 1 0", "fields", "at least 8"),
        ("x one 0 0 0 1 0 W 1", "bandwidth", "not a number"),
        ("x 0 0 0 0 1 0 W 1", "bandwidth", "> 0"),
        ("x 1 -1 0 0 1 0 W 1", "age", ">= 0"),
        ("x 1 0 0 nan 1 0 W 1", "agePhase", "not finite"),
        ("x 1 0 0 0 2.5 0 W 1 1", "n", "not an integer"),
        ("x 1 0 0 0 3 0 W 1 1", "n", "says 3 values but the line has 2"),
        ("x 1 0 0 0 1 0 W 1 1", "n", "says 1 values"),
        ("x 1 0 0 0 2 0 W 1 -2", "x_2 (volume)", ">= 0"),
        ("x 1 0 0 0 2 0 C 1 -2", "x_2 (duration)", ">= 0"),
        ("x 1 0 0 0 2 0 C 1 2e", "x_2 (duration)", "not a number"),
    ],
)
def test_errors_name_line_and_field(line: str, field: str, words: str) -> None:
    text = "ok 1 0 0 0 1 0 W 1\n\n# comment\n" + line + "\n"
    with pytest.raises(InstanceError) as info:
        parse_instance(text)
    assert info.value.line == 4
    assert info.value.field == field
    assert str(info.value).startswith(f"line 4: {field}: ")
    assert words in str(info.value)
    assert isinstance(info.value, ValueError)


def test_window_truncation_delta_and_load() -> None:
    # S_0 = 2 + 3 + 4 = 9, S_1 = 1 + 1 + 1 = 3 → T = 3
    win = prepare_window(parse_instance("a 1 0 0 0 3 0 W 2 3 4\nb 1 0 0 0 3 0 C 1 1 1\n"))
    assert win.horizon == 3.0
    a, b = win.apps
    # a: work 2 kept whole; I/O 3 cut to T − D = 1; the work 4 is dropped
    assert a.phases == (Phase(False, 2.0, False), Phase(True, 1.0, True))
    assert b.phases == (Phase(True, 1.0, False), Phase(False, 1.0, False), Phase(True, 1.0, False))
    # K = (1 + 0) + (1 + 2): a cut later phase does not count
    assert (a.solo_phases, b.solo_phases, win.solo_phases) == (1, 3, 4)
    assert win.delta == pytest.approx((3 + 3) / (4 * 2))  # δ = ΣD/(K·n)
    assert win.load == pytest.approx((1 + 2) / 3)  # L = Σ kept I/O volume / T


def test_first_phase_longer_than_t_is_cut_and_caps_scale_volumes() -> None:
    # bw 0.5 of B = 1: the I/O 1 takes 2 s alone. S_a = 10, S_b = 2 + 1 = 3, window 0.5 → T = 1.5
    win = prepare_window(parse_instance("a 1 0 0 0 1 0 W 10\nb 0.5 0 0 0 2 0 C 1 1\n"), window=0.5)
    assert win.horizon == 1.5
    a, b = win.apps
    assert a.phases == (Phase(False, 1.5, True),)
    assert b.cap == 0.5
    assert b.phases == (Phase(True, 0.75, True),)  # volume b_i·T
    assert (a.solo_phases, b.solo_phases) == (1, 1)  # a cut first phase counts


def test_bandwidth_normalises_to_b_equals_1() -> None:
    # B = 10: caps min(bw, B)/B, volumes / B
    win = prepare_window(
        parse_instance("a 20 3 1 2 2 7 C 5 1\nb 5 0 0 0 2 0 C 5 1\n"), bandwidth=10
    )
    a, b = win.apps
    assert (a.cap, b.cap) == (1.0, 0.5)
    assert a.phases[0].value == 0.5 and b.phases[0].value == 0.5
    assert (a.released_at, a.progress, a.posted_at, a.w_iter) == (-3.0, 1.0, -2.0, 7.0)
    assert win.horizon == 1.5  # min(0.5 + 1, 1 + 1)


def test_window_errors() -> None:
    apps = parse_instance("a 1 0 0 0 2 0 C 1 1\n")
    for bad in (0.0, -1.0, 1.5):
        with pytest.raises(ValueError, match="window"):
            prepare_window(apps, window=bad)
    with pytest.raises(ValueError, match="no applications"):
        prepare_window([])
    # a zero phase inside the window is rejected with its line (the reference asserts)
    with pytest.raises(InstanceError, match="line 2: x_2"):
        prepare_window(parse_instance("a 1 0 0 0 2 0 C 1 2\nb 1 0 0 0 3 0 C 1 0 2\n"))
