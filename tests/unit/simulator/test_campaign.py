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
    Row,
    RowFile,
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
