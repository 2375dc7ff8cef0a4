"""Set files (strict loading) and ``burstctl sim persched``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import invoke

from burstctl.policies.persched import (
    JUPITER_TMIN,
    Pattern,
    SetFileError,
    jupiter_set,
    load_set_file,
    parse_set,
    validate,
)

GOOD = {
    "B": 3,
    "b": 0.01,
    "apps": [
        {"name": "T1", "w": 4480, "vol_io": 128.2, "beta": 512},
        {"name": "AP", "w": 15360, "vol_io": 423.4, "beta": 128},
    ],
}


def _with(path: tuple[object, ...], value: object, *, delete: bool = False) -> str:
    data = json.loads(json.dumps(GOOD))
    target = data
    for key in path[:-1]:
        target = target[key]
    if delete:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(data)


MALFORMED = {
    "missing field": (_with(("apps", 1, "vol_io"), None, delete=True), "apps[1].vol_io: missing"),
    "missing B": (_with(("B",), None, delete=True), "B: missing"),
    "negative w": (_with(("apps", 0, "w"), -5), "apps[0].w: must be > 0, got -5"),
    "zero beta": (_with(("apps", 1, "beta"), 0), "apps[1].beta: must be > 0, got 0"),
    "negative beta": (_with(("apps", 1, "beta"), -1.5), "apps[1].beta: must be > 0, got -1.5"),
    "negative vol_io": (_with(("apps", 0, "vol_io"), -1), "apps[0].vol_io: must be > 0, got -1"),
    "unknown key": (
        _with(("apps", 0, "phase"), 3),
        "apps[0].phase: unknown key (expected name, w, vol_io, beta)",
    ),
    "unknown top key": (_with(("N",), 640), "N: unknown key (expected B, b, apps)"),
    "wrong type": (_with(("apps", 0, "w"), "70"), "apps[0].w: must be a number, got a string '70'"),
    "boolean": (_with(("b",), True), "b: must be a number, got a boolean"),
    "duplicate name": (_with(("apps", 1, "name"), "T1"), "apps[1].name: duplicate name 'T1'"),
    "no apps": (_with(("apps",), []), "apps: must not be empty"),
    "truncated JSON": (
        '{\n  "B": 3,\n  "b": 0.01,\n  "apps": [\n    {"name": "T1", "w": 4480',
        "invalid JSON at line 5 column 29: Expecting ',' delimiter",
    ),
    "not JSON": ("B = 3\n", "invalid JSON at line 1 column 1: Expecting value"),
}


def test_a_good_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "set.json"
    path.write_text(json.dumps(GOOD))
    loaded = load_set_file(path)
    assert (loaded.platform.B, loaded.platform.b) == (3.0, 0.01)
    assert [a.name for a in loaded.apps] == ["T1", "AP"]
    assert loaded == jupiter_set(10).__class__(loaded.platform, loaded.apps)
    assert parse_set(json.dumps(jupiter_set(10).to_json())) == jupiter_set(10)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_files_name_the_problem(case: str) -> None:
    text, message = MALFORMED[case]
    with pytest.raises(SetFileError) as info:
        parse_set(text)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def _run(*args: str) -> tuple[int, str, str]:
    result = invoke("sim", "persched", *args)
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize(
    "case", ["missing field", "negative w", "zero beta", "unknown key", "truncated JSON"]
)
def test_cli_malformed_file_exits_2_with_one_line(case: str, tmp_path: Path) -> None:
    text, message = MALFORMED[case]
    path = tmp_path / "bad.json"
    path.write_text(text)
    code, out, err = _run("--set-file", str(path))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"Error: {path}: {message}")


def test_cli_unreadable_file(tmp_path: Path) -> None:
    code, _, err = _run("--set-file", str(tmp_path / "absent.json"))
    assert code == 2 and err.startswith("Error: ") and "cannot read" in err


@pytest.mark.parametrize("args", [[], ["--set", "1", "--set-file", "x.json"]])
def test_cli_needs_exactly_one_source(args: list[str]) -> None:
    code, _, err = _run(*args)
    assert code == 2 and "exactly one of --set and --set-file" in err


def test_cli_json_shape_set_10() -> None:
    code, out, _ = _run("--set", "10", "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert {"sys_eff", "dilation", "upper_bound", "period", "pattern"} <= set(data)
    assert round(data["upper_bound"], 3) == 0.988
    assert data["sys_eff"] == pytest.approx(0.986171, rel=1e-5)
    assert data["t_min"] == JUPITER_TMIN[10]
    pattern = Pattern.from_json(data["pattern"])
    assert pattern.period == data["period"]
    for entry in data["pattern"]["apps"]:
        assert set(entry) == {"name", "w", "vol_io", "beta", "instances"}
        for inst in entry["instances"]:
            assert set(inst) == {"compute_start", "io"}
            assert all(len(triple) == 3 for triple in inst["io"])
    s = jupiter_set(10)
    assert validate(pattern, s.platform, sys_eff=data["sys_eff"], dilation=data["dilation"]) == []


def test_cli_set_file_and_options(tmp_path: Path) -> None:
    path = tmp_path / "set.json"
    path.write_text(json.dumps(GOOD))
    code, out, _ = _run(
        "--set-file", str(path), "--kprime", "3", "--epsilon", "0.05", "--format", "json"
    )
    assert code == 0
    data = json.loads(out)
    assert data["t_min"] == pytest.approx(15360 + 423.4 / 1.28)  # max(w + time_io)
    assert data["t_max"] == pytest.approx(3 * data["t_min"])
    code, out, _ = _run("--set-file", str(path), "--tmin", "20000", "--objective", "dilation")
    assert code == 0
    assert "T_min 20000 s" in out and "Dilation" in out and "T1" in out and "AP" in out


@pytest.mark.parametrize("args", [["--kprime", "0.5"], ["--epsilon", "0"], ["--tmin", "-1"]])
def test_cli_bad_parameters(args: list[str]) -> None:
    code, _, err = _run("--set", "10", *args)
    assert code == 2 and args[0] in err


def test_cli_table() -> None:
    code, out, _ = _run("--set", "9")
    assert code == 0
    assert "SysEff 0.978893" in out and "upper bound (eq. 5) 0.97" in out
    assert out.count("AP-") == 5


def test_cli_transfer_below_the_resolution(tmp_path: Path) -> None:
    path = tmp_path / "tiny.json"
    tiny = {"name": "tiny", "w": 10, "vol_io": 1e-7, "beta": 64}
    path.write_text(json.dumps({**GOOD, "apps": [GOOD["apps"][0], tiny]}))
    code, out, err = _run("--set-file", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"Error: {path}: apps[1] (tiny): time_io = 1.56e-07 s is below")
