"""The campaign runner's output file (simulator/campaign.py): rows appended as cases
finish, rewritten in case order, read back by --resume. In-process (``workers=1``); the
Dask paths run in tests/integration/test_sim_campaigns.py."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from burstctl.simulator.campaign import (
    CampaignError,
    Cluster,
    Format,
    ParamsMismatch,
    Row,
    RowFile,
    meta_path,
    run_campaign,
)

FIELDS = ("case", "part", "value", "note")
CASES = list(range(6))
INLINE = Cluster(workers=1)


def rows(case: int) -> list[Row]:
    """Two rows per case; one note needs CSV quoting (a comma and a newline)."""
    return [
        {
            "case": case,
            "part": part,
            "value": case / 7 + part,
            "note": "a,b\nc" if case == 3 else "",
        }
        for part in (0, 1)
    ]


def row_file(path: Path, fmt: Format) -> RowFile[int]:
    return RowFile(path, fmt, FIELDS, lambda c: c, lambda r: int(r["case"]), lambda c: 2)


def full_text(tmp_path: Path, fmt: Format) -> str:
    path = tmp_path / f"full.{fmt}"
    assert run_campaign(rows, CASES, INLINE, out=row_file(path, fmt)) is None
    return path.read_text()


def cases_in(text: str, fmt: Format) -> list[int]:
    if fmt == "json":
        return [json.loads(line)["case"] for line in text.splitlines()]
    return [int(r["case"]) for r in csv.DictReader(io.StringIO(text))]


def test_without_a_file_the_rows_come_back_in_case_order() -> None:
    assert run_campaign(rows, CASES, INLINE) == [rows(c) for c in CASES]


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_rows_are_appended_as_cases_finish_then_put_in_case_order(
    tmp_path: Path, fmt: Format
) -> None:
    path = tmp_path / f"out.{fmt}"
    out = row_file(path, fmt)
    assert out.open(CASES, resume=False) == CASES
    for case in (4, 0, 2):  # completion order
        out.add(case, rows(case))
        assert cases_in(path.read_text(), fmt)[-2:] == [case, case]  # on disk at once
    assert cases_in(path.read_text(), fmt) == [4, 4, 0, 0, 2, 2]
    for case in (5, 3, 1):
        out.add(case, rows(case))
    out.finish()
    assert path.read_text() == full_text(tmp_path, fmt)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, f"full.{fmt}"])


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_resume_keeps_finished_cases_and_computes_only_the_others(
    tmp_path: Path, fmt: Format
) -> None:
    full = full_text(tmp_path, fmt)
    path = tmp_path / f"out.{fmt}"
    out = row_file(path, fmt)
    # A killed run: cases 5, 3 (a quoted newline) and 1 finished, case 2 half written,
    # case 0's last line torn.
    killed = out.header() + "".join(
        out.render(rows(5))
        + out.render(rows(3))
        + out.render(rows(1))
        + out.render(rows(2))[:1]
        + out.render(rows(0))
    )
    path.write_text(killed[:-7])

    ran: list[int] = []

    def counted(case: int) -> list[Row]:
        ran.append(case)
        return rows(case)

    said: list[str] = []
    run_campaign(counted, CASES, INLINE, out=out, resume=True, progress=said.append)
    assert ran == [0, 2, 4]
    assert f"3 already in {path}, 3 to compute" in said[0]
    assert path.read_text() == full


def test_resume_of_a_missing_file_runs_everything(tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    run_campaign(rows, CASES, INLINE, out=row_file(path, "csv"), resume=True)
    assert path.read_text() == full_text(tmp_path, "csv")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("case,part,other,note\n", "columns"),
        ("case,part,value,note\n9,0,1.0,\n", "another campaign"),
        ("case,part,value,note\nx,0,1.0,\n", "keys"),
    ],
)
def test_resume_refuses_the_file_of_another_campaign(
    tmp_path: Path, text: str, reason: str
) -> None:
    path = tmp_path / "out.csv"
    path.write_text(text)
    with pytest.raises(CampaignError, match=reason):
        run_campaign(rows, CASES, INLINE, out=row_file(path, "csv"), resume=True)
    assert path.read_text() == text  # left as it was


def test_resume_refuses_a_file_that_is_not_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_text("case,part\n")
    with pytest.raises(CampaignError, match="not JSON lines"):
        run_campaign(rows, CASES, INLINE, out=row_file(path, "json"), resume=True)


PARAMS = {"command": "test", "--horizon": 20000.0, "--policy": ("greedy-yield", "fair-share")}


def recorded_file(path: Path, params: dict[str, object]) -> RowFile[int]:
    return RowFile(path, "json", FIELDS, lambda c: c, lambda r: int(r["case"]), lambda c: 2, params)


def killed_after(path: Path, params: dict[str, object], finished: list[int]) -> None:
    """A campaign with ``params`` stopped once ``finished`` were written."""
    out = recorded_file(path, params)
    out.open(CASES, resume=False)
    for case in finished:
        out.add(case, rows(case))
    out.finish()


def test_the_record_is_written_beside_the_file_as_json(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    run_campaign(rows, CASES, INLINE, out=recorded_file(path, PARAMS))
    assert json.loads(meta_path(path).read_text()) == {
        "command": "test",
        "--horizon": 20000.0,
        "--policy": ["greedy-yield", "fair-share"],
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "out.json.meta.json"]


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ({**PARAMS, "--horizon": 30000.0}, "--horizon 30000.0 (the file has 20000.0)"),
        ({**PARAMS, "--policy": ("fair-share",)}, '--policy ["fair-share"]'),
        ({**PARAMS, "--sigma": 0.4}, "--sigma 0.4 (the file has none)"),
        ({"command": "test"}, "--horizon none (the file has 20000.0)"),
    ],
)
def test_resume_with_other_params_is_refused_and_leaves_the_file(
    tmp_path: Path, changed: dict[str, object], named: str
) -> None:
    path = tmp_path / "out.json"
    killed_after(path, PARAMS, [4, 1])
    before = path.read_bytes(), meta_path(path).read_bytes()
    ran: list[int] = []

    def counted(case: int) -> list[Row]:
        ran.append(case)
        return rows(case)

    out = recorded_file(path, changed)
    with pytest.raises(ParamsMismatch) as caught:
        run_campaign(counted, CASES, INLINE, out=out, resume=True)
    assert named in str(caught.value)
    assert str(path) in str(caught.value)
    assert ran == []
    assert (path.read_bytes(), meta_path(path).read_bytes()) == before
    # the same flags again (a tuple or its list alike) resume
    said: list[str] = []
    same = {**PARAMS, "--policy": ["greedy-yield", "fair-share"]}
    run_campaign(counted, CASES, INLINE, out=recorded_file(path, same), progress=said.append,
                 resume=True)  # fmt: skip
    assert ran == [0, 2, 3, 5]
    assert "2 already in" in said[0]
    assert not any("warning" in line for line in said)


def test_a_file_without_a_record_resumes_with_a_warning_then_gets_one(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    killed_after(path, PARAMS, [0, 5])
    meta_path(path).unlink()  # written before campaigns recorded their flags
    said: list[str] = []
    run_campaign(rows, CASES, INLINE, out=recorded_file(path, PARAMS), resume=True,
                 progress=said.append)  # fmt: skip
    assert said[0].startswith(f"warning: {path} has no out.json.meta.json")
    assert "cannot be checked" in said[0]
    assert "2 already in" in said[1]
    assert path.read_text() == full_text(tmp_path, "json")
    assert json.loads(meta_path(path).read_text())["--horizon"] == 20000.0


def test_a_record_that_is_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    killed_after(path, PARAMS, [0])
    meta_path(path).write_text("{torn")
    with pytest.raises(CampaignError, match="not JSON"):
        run_campaign(rows, CASES, INLINE, out=recorded_file(path, PARAMS), resume=True)


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_case_rows_gives_each_case_its_rows_in_case_order(tmp_path: Path, fmt: Format) -> None:
    out = row_file(tmp_path / f"out.{fmt}", fmt)
    out.open(CASES, resume=False)
    for case in (3, 0, 5, 1, 4, 2):
        out.add(case, rows(case))
    out.finish()
    got = out.case_rows()
    if fmt == "json":
        assert got == [rows(c) for c in CASES]
    else:  # strings, as csv gives them back
        assert got == [[{k: str(v) for k, v in r.items()} for r in rows(c)] for c in CASES]
